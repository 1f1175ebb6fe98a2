/* SPDX-License-Identifier: MIT */
/*
 * preload_state.h - the state of libkvdmabuf-preload.so's verbs
 * interposer, shared by preload.c (regions, environment, state file, the
 * API) and registration.c (the registration entry points): one struct, `kp`,
 * under one mutex (preload.c's head comment).
 */
#ifndef KVDMABUF_PRELOAD_STATE_H
#define KVDMABUF_PRELOAD_STATE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvdmabuf_preload.h"
#include "dmabuf_origin.h"
#include "mr_table.h"
#include "preload_internal.h"
#include "state_file.h"

#define KP_TAGMAX 64

enum kp_entry {
	E_REG_MR_1_0, E_REG_MR_1_1, E_REG_MR_IOVA, E_REG_MR_IOVA2,
	E_REG_DMABUF, E_DEREG_1_0, E_DEREG_1_1, E_REREG_1_1, E_REG_MR_EX,
	E_MLX5_DMABUF, E_NR
};

struct kp_region {
	uintptr_t addr;
	size_t len;
	char tag[KP_TAGMAX];
	int proxy_fd;                   /* -1: none */
	uint64_t proxy_off;
	bool asleep;
	bool has_ops;                   /* set by the proxy's owner */
	struct kvdmabuf_preload_proxy_ops ops; /* preload_cuda.c */
	kvdmabuf_preload_ranges_fn *ranges; /* with ops.arg; NULL: none */
	unsigned int held;              /* ops running (kp_region_hold) */
};

/* Each interposed entry point: name, version, and the library that
 * defines it where that is not libibverbs.so.1. */
struct kp_entry_name {
	const char *name, *version, *lib;
};
KP_HIDDEN extern const struct kp_entry_name kp_entries[E_NR];

/* The interposer's whole state (see the head comment). */
struct kp_state {
	pthread_mutex_t lock;
	pthread_once_t env_once;
	struct kp_region *regions;
	unsigned int nr_regions, cap_regions;
	struct kp_mr_table mrs;
	struct kp_origin_table origins; /* the engine's dma-bufs of GPU memory */
	int env_error;
	char env_msg[256];
	int cuda_mapping;               /* cuda_dmabuf_mapping of the config */
	void *_Atomic next[E_NR];
	_Atomic long long calls[E_NR];
	/* the state file (kvdmabuf_preload.h, "State file"), written once
	 * the process has something of its own to show (file_wanted) */
	struct kp_state_file file;      /* under file_lock */
	pthread_mutex_t file_lock;
	uint64_t file_gen;              /* the body in the file (file_lock) */
	bool file_closed;               /* at exit (file_lock) */
	char *body;                     /* made, not written yet (lock) */
	uint64_t body_gen, gen;
	bool file_wanted;
	uint64_t last_pending_id;
	/* Registrations inside the provider now: not recorded yet, but a
	 * sleep check must see them (reg_core()). */
	struct kp_pending {
		uint64_t id;
		uintptr_t addr;
		size_t len;
	} *pending;
	unsigned int nr_pending, cap_pending;
};
KP_HIDDEN extern struct kp_state kp;

/* Calls of this thread that are not the engine's: nested in our own
 * forwarding, or libkvdmabuf's. */
KP_HIDDEN extern _Thread_local int kp_depth;
/* This thread's last failed registration in a KV region (registration.c). */
KP_HIDDEN extern _Thread_local char kp_reg_err[KP_WHYMAX + 160];

/* preload.c */
KP_HIDDEN void kp_msg(char *buf, size_t len, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
/* The real entry point @e (libibverbs' or libmlx5's), or NULL. */
KP_HIDDEN void *kp_next_fn(enum kp_entry e);
/* The configuration and KVDMABUF_KV_REGIONS, once (kp.env_once). */
KP_HIDDEN void kp_env_load(void);
/* kp.lock held: */
KP_HIDDEN struct kp_region *kp_region_containing(uintptr_t a, size_t len);
KP_HIDDEN struct kp_region *kp_region_overlapping(uintptr_t a, size_t len);
KP_HIDDEN void kp_nic_name(struct ibv_pd *pd, char *buf, size_t len);
KP_HIDDEN uint64_t kp_pending_add(uintptr_t a, size_t len);
KP_HIDDEN void kp_pending_done(uint64_t id);
KP_HIDDEN void kp_publish_locked(void);
/* Lets kp.lock go, then writes what kp_publish_locked() made meanwhile
 * (every unlock of kp.lock but the fork handlers'). */
KP_HIDDEN void kp_unlock(void);

/* registration.c: whether @f is one of the interposer's entry points. */
KP_HIDDEN bool kp_is_own_entry(const void *f);

#endif
