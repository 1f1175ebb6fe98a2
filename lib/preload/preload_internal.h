/* SPDX-License-Identifier: MIT */
/*
 * preload_internal.h - what preload_cuda.c (the CUDA driver interposer)
 * reads and changes of preload.c's region table. Hidden: the version
 * script exports none of it.
 */
#ifndef KVDMABUF_PRELOAD_INTERNAL_H
#define KVDMABUF_PRELOAD_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvdmabuf_preload.h"

#define KP_HIDDEN __attribute__((visibility("hidden")))

/* A copy of one declared region, taken under the table's lock. */
struct kp_region_view {
	uintptr_t addr;
	size_t len;
	char tag[64];
	int proxy_fd;                   /* -1: none */
	uint64_t proxy_off;
	bool asleep;
	bool has_ops;                   /* kvdmabuf_preload_set_proxy_ops() */
	struct kvdmabuf_preload_proxy_ops ops;
	kvdmabuf_preload_ranges_fn *ranges;
};

/* The declared regions overlapping [a, a+len), at most @max of them
 * copied to @v, in the table's order. Return: how many overlap. */
KP_HIDDEN unsigned int kp_regions_overlapping(uintptr_t a, size_t len,
					      struct kp_region_view *v,
					      unsigned int max);

/*
 * Mark the region that starts at @addr asleep (checked as
 * kvdmabuf_preload_check() does, in the same critical section: -EBUSY or
 * -EINVAL with the reason in @err, nothing changed) or awake.
 * -ENOENT: no region starts there.
 */
KP_HIDDEN int kp_region_set_asleep(uintptr_t addr, bool asleep, char *err,
				   size_t err_len);

/* Set (@ops non-NULL) or clear the proxy operations of the region that
 * starts at @addr (clearing drops its ranges operation too); -ENOENT: none
 * starts there; -EBUSY: held. The same for its ranges operation (-ENOENT
 * also where it has no proxy operations). */
KP_HIDDEN int kp_region_set_ops(uintptr_t addr,
				const struct kvdmabuf_preload_proxy_ops *ops);
KP_HIDDEN int kp_region_set_ranges(uintptr_t addr,
				   kvdmabuf_preload_ranges_fn *ranges);

/*
 * The proxy operations of the region that starts at @addr, copied to @ops
 * (and its ranges operation to *@ranges where not NULL) and held: until kp_region_unhold(), the region cannot be undeclared nor
 * its operations changed (-EBUSY), so that their owner never sees a call
 * after it took them back. -ENOENT: no region there, or it has none.
 */
KP_HIDDEN int kp_region_hold(uintptr_t addr,
			     struct kvdmabuf_preload_proxy_ops *ops,
			     kvdmabuf_preload_ranges_fn **ranges);
KP_HIDDEN void kp_region_unhold(uintptr_t addr);

/* cuda_dmabuf_mapping of $KVDMABUF_CONFIG (enum kvd_cuda_mapping of
 * lib/internal.h; auto without a configuration), for the wake's export. */
KP_HIDDEN int kp_cuda_mapping(void);

/* KVDMABUF_PRELOAD_NO_DLSYM (the CUDA runtime's lookups bypass the
 * preload: not x86-64, or another dlsym interposer ahead that goes to
 * glibc's) and KVDMABUF_PRELOAD_OTHER_DLSYM (another object defines
 * dlsym), with what to do in @why; 0 when the preload answers them. */
KP_HIDDEN uint32_t kp_dlsym_flags(char *why, size_t len);
/* bypass.c: an object whose registrations reach libibverbs or libmlx5
 * past the preload (RTLD_DEEPBIND), named in @why. */
KP_HIDDEN bool kp_bypass_find(char *why, size_t len);

/* kvdmabuf_preload_calls() for the CUDA entry points; -ENOENT: not one. */
KP_HIDDEN long long kp_cuda_calls(const char *symbol);

/*
 * dlsym/dlvsym of @name (@version: dlvsym's, NULL for dlsym) on a handle
 * that answered @real: the interposer's entry point where @name is one of
 * the verbs registration calls it interposes (NCCL's ibvwrap, engines
 * that dlopen libibverbs RTLD_LOCAL), with @real as the next one; NULL
 * for any other name.
 */
KP_HIDDEN void *kp_verbs_dlsym(const char *name, const char *version,
			       void *real);

/* The engine exported [@va, @va + @len) as the dma-buf @fd (preload_cuda.c):
 * its ibv_reg_dmabuf_mr of @fd covers that memory, whatever its iova. */
KP_HIDDEN void kp_dmabuf_exported(int fd, uintptr_t va, size_t len);

/* fork(): kp.lock held across it; the child forgets its parent's MRs. */
KP_HIDDEN void kp_fork_prepare(void);
KP_HIDDEN void kp_fork_parent(void);
KP_HIDDEN void kp_fork_child(void);

#endif /* KVDMABUF_PRELOAD_INTERNAL_H */
