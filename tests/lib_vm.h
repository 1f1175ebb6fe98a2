/* SPDX-License-Identifier: MIT */
/*
 * lib_vm.h - the set-up the lib_vm_* programs share: two verbs devices
 * (soft-RoCE rxe0/rxe1 in the VM, or KVDMABUF_IBDEV_A/B) connected, a
 * buffer of the peer (b) registered for its side of the transfers, and a
 * library context on our side's (a) protection domain, as a transfer
 * engine opens it, with a configuration of protocol rdma, our NIC and
 * the caller's further keys.
 */
#ifndef KVDMABUF_TESTS_LIB_VM_H
#define KVDMABUF_TESTS_LIB_VM_H

#include "lib_fake.h"
#include "verbs_pair.h"

struct lib_vm {
	struct vp_end a, b;         /* a: our side (rxe0), b: the peer */
	struct kvdmabuf_ctx *ctx;
	char *peerbuf;
	struct ibv_mr *peer_mr;
	char cfg[64];               /* the configuration file, removed at close */
};

/*
 * Opens @v with a peer buffer of @peer_len bytes and the configuration
 * keys @yaml (lines, may be ""). 0; 1 when the two devices are not both
 * there (a skip); or -errno, with the library's message in @err.
 */
static inline int lib_vm_open(struct lib_vm *v, size_t peer_len,
			      const char *yaml, char *err, size_t errlen)
{
	struct kvdmabuf_options o = { 0 };
	struct ibv_pd *pds[1];
	char text[512];
	const char *path;
	int rc;

	memset(v, 0, sizeof(*v));
	if (vp_open(&v->a, vp_dev_name(0)) || vp_open(&v->b, vp_dev_name(1)))
		return 1;
	rc = vp_connect(&v->a, &v->b);
	if (rc)
		return snprintf(err, errlen, "vp_connect failed"), rc;
	v->peerbuf = region_mem(peer_len);
	if (!v->peerbuf)
		return snprintf(err, errlen, "no peer buffer"), -ENOMEM;
	v->peer_mr = ibv_reg_mr(v->b.pd, v->peerbuf, peer_len,
				IBV_ACCESS_LOCAL_WRITE);
	if (!v->peer_mr)
		return snprintf(err, errlen, "ibv_reg_mr of the peer failed"),
		       -EIO;
	snprintf(text, sizeof(text), "protocol: rdma\nnics: [%s]\n%s",
		 vp_dev_name(0), yaml);
	path = write_config(text);
	if (!path)
		return snprintf(err, errlen, "no configuration file"), -EIO;
	snprintf(v->cfg, sizeof(v->cfg), "%s", path);
	o.config_path = v->cfg;
	pds[0] = v->a.pd;           /* the transfer engine's own PD */
	o.pds = pds;
	o.nr_pds = 1;
	return kvdmabuf_open(&o, &v->ctx, err, errlen);
}

static inline void lib_vm_close(struct lib_vm *v)
{
	if (v->ctx)
		kvdmabuf_close(v->ctx);
	if (v->peer_mr)
		ibv_dereg_mr(v->peer_mr);
	vp_close(&v->b);
	vp_close(&v->a);
	if (v->cfg[0])
		unlink(v->cfg);
	memset(v, 0, sizeof(*v));
}

/* Fixture step: lib_vm_open() or skip or fail the test with its reason. */
#define LIB_VM_OPEN(v, peer_len, yaml)					\
	do {								\
		char __err[512];					\
		int __rc = lib_vm_open(v, peer_len, yaml, __err,	\
				       sizeof(__err));			\
		if (__rc == 1)						\
			SKIP(return, "verbs devices %s and %s not both present", \
			     vp_dev_name(0), vp_dev_name(1));		\
		if (__rc)						\
			TH_LOG("%s", __err);				\
		ASSERT_EQ(0, __rc);					\
	} while (0)

#endif /* KVDMABUF_TESTS_LIB_VM_H */
