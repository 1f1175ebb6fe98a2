// SPDX-License-Identifier: MIT
/*
 * gate.c - is sleep supported with this transport? Loads no CUDA library
 * and opens no device: it reads the config and the environment only.
 *
 * Sleep can carry what a peer reaches through *our* keys (RDMA) or through
 * nothing at all (TCP). It cannot reach a peer that imported a handle to
 * our GPU memory (CUDA IPC, NVLink, multi-node NVLink): that import keeps
 * the old memory alive and reading it after a wake is silently wrong. The
 * gate refuses every configuration in which a transfer engine hands peers
 * such a handle.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "internal.h"

/*
 * Set to any value (also "0" or ""), these make Mooncake's transfer engine
 * hand peers NVLink / multi-node NVLink handles to our GPU memory
 * (MC_ENABLE_MNNVL: its TENT engine exports cuMemCreate memory to peers).
 * The gate knows these variables and the ones kvd_gate_check() reads, no
 * others: a transport it has not heard of passes.
 */
static const char *const nvlink_env[] = {
	"MC_FORCE_MNNVL",
	"MC_INTRANODE_NVLINK",
	"MC_INTRA_NVLINK",
	"MC_ENABLE_MNNVL",
};

static int refuse(char *reason, size_t len, const char *why)
{
	snprintf(reason, len, "refused: %s", why);
	return 0;
}

/* Is @name one of the comma-separated words of @list (any case)? */
static bool list_has(const char *list, const char *name)
{
	size_t n = strlen(name);
	const char *p = list;

	while (*p) {
		size_t w = strcspn(p, ",");

		if (w == n && !strncasecmp(p, name, n))
			return true;
		p += w;
		p += *p == ',';
	}
	return false;
}

/*
 * UCX picks transports from UCX_TLS: unset means every available one,
 * cuda_ipc included; "cuda" and "all" include it; "^a,b" means all but
 * a and b.
 */
static bool ucx_uses_cuda_ipc(const char *tls)
{
	if (!tls)
		return true;
	if (*tls == '^')
		return !list_has(tls + 1, "cuda_ipc") &&
		       !list_has(tls + 1, "cuda");
	return list_has(tls, "cuda_ipc") || list_has(tls, "cuda") ||
	       list_has(tls, "all");
}

int kvd_gate_check(const struct kvd_config *cfg, char *reason, size_t len)
{
	const char *v;
	char why[KVD_ERRMAX];
	size_t i;

	for (i = 0; i < sizeof(nvlink_env) / sizeof(nvlink_env[0]); i++) {
		if (getenv(nvlink_env[i])) {
			snprintf(why, sizeof(why), "%s is set (transfer engines "
				 "then hand peers GPU memory handles, which "
				 "re-registering cannot follow)", nvlink_env[i]);
			return refuse(reason, len, why);
		}
	}
	/* Mooncake's protocol by environment: nvlink, nvlink_intra. */
	v = getenv("MOONCAKE_PROTOCOL");
	if (v && strcasestr(v, "nvlink")) {
		snprintf(why, sizeof(why), "MOONCAKE_PROTOCOL=%s (Mooncake then "
			 "hands peers NVLink handles to our GPU memory)", v);
		return refuse(reason, len, why);
	}
	/* SGLang names its pool (NVLINK, INTRA_NODE_NVLINK, BAREX); its
	 * older boolean form, true or 1, meant the NVLink pool. */
	v = getenv("SGLANG_MOONCAKE_CUSTOM_MEM_POOL");
	if (v && (strcasestr(v, "nvlink") || !strcasecmp(v, "true") ||
		  !strcmp(v, "1"))) {
		snprintf(why, sizeof(why), "SGLANG_MOONCAKE_CUSTOM_MEM_POOL=%s "
			 "(SGLang's Mooncake pool then shares GPU memory with "
			 "peers over NVLink%s)", v,
			 strcasestr(v, "nvlink") ? "" :
			 "; the boolean form means the NVLink pool");
		return refuse(reason, len, why);
	}
	if (!strcasecmp(cfg->transport, "ucx") ||
	    !strcasecmp(cfg->transport, "nixl")) {
		v = getenv("UCX_TLS");
		if (ucx_uses_cuda_ipc(v)) {
			snprintf(why, sizeof(why), "transport %s with UCX_TLS%s%s "
				 "includes cuda_ipc (peers then map our GPU "
				 "memory by IPC handle); set UCX_TLS without "
				 "it, e.g. rc,cuda_copy", cfg->transport,
				 v ? "=" : " unset: the default set ",
				 v ? v : "");
			return refuse(reason, len, why);
		}
	}
	switch (cfg->proto) {
	case KVD_PROTO_RDMA:
		snprintf(reason, len, "accepted: protocol rdma (peers only use "
			 "our keys)");
		return 1;
	case KVD_PROTO_TCP:
		snprintf(reason, len, "accepted: protocol tcp (nothing pinned)");
		return 1;
	default:
		snprintf(why, sizeof(why), "protocol '%s' (only rdma and tcp "
			 "are supported; peers may hold handles to our memory)",
			 cfg->protocol);
		return refuse(reason, len, why);
	}
}

int kvdmabuf_gate(const char *config_path, char *reason, size_t reason_len)
{
	struct kvd_config cfg;
	char dummy[1];
	int rc;

	if (!reason || !reason_len) {
		reason = dummy;
		reason_len = sizeof(dummy);
	}
	rc = kvd_config_load(config_path, &cfg, reason, reason_len);
	if (rc)
		return rc;
	return kvd_gate_check(&cfg, reason, reason_len);
}
