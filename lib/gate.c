// SPDX-License-Identifier: MIT
/*
 * gate.c - is sleep supported with this transport? Loads no CUDA library
 * and opens no device: it reads the config and the environment only.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include "internal.h"

/*
 * Set to any value (also "0" or ""), these make transfer engines hand peers
 * NVLink / multi-node NVLink handles to our GPU memory; re-registering
 * locally cannot reach a peer's import of such a handle.
 */
static const char *const nvlink_env[] = {
	"MC_FORCE_MNNVL",
	"MC_INTRANODE_NVLINK",
	"MC_INTRA_NVLINK",
};

int kvd_gate_check(const struct kvd_config *cfg, char *reason, size_t len)
{
	size_t i;

	for (i = 0; i < sizeof(nvlink_env) / sizeof(nvlink_env[0]); i++) {
		if (getenv(nvlink_env[i])) {
			snprintf(reason, len, "refused: %s is set (transfer "
				 "engines then hand peers GPU memory handles, "
				 "which re-registering cannot follow)",
				 nvlink_env[i]);
			return 0;
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
		snprintf(reason, len, "refused: protocol '%s' (only rdma and "
			 "tcp are supported; peers may hold handles to our "
			 "memory)", cfg->protocol);
		return 0;
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
