// SPDX-License-Identifier: MIT
/*
 * context.c - the top floor: open and close a context (options, config,
 * NICs, module), queries. Who may change it now is busy.c's, messages
 * are msg.c's.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <infiniband/verbs.h>

#include "internal.h"

const struct kvd_ops kvd_default_ops = {
	.nics_open = kvd_verbs_nics_open,
	.nics_close = kvd_verbs_nics_close,
	.nic_add = kvd_verbs_nic_add,
	.nic_remove = kvd_verbs_nic_remove,
	.export_dmabuf = kvd_export_dmabuf,
	.reg_dmabuf = kvd_verbs_reg_dmabuf,
	.reg_addr = kvd_verbs_reg_addr,
	.dereg = kvd_verbs_dereg,
	.prefetch = kvd_verbs_prefetch,
	.proxy_open = kvd_proxy_dev_open,
	.proxy_create = kvd_proxy_dev_create,
	.proxy_attach = kvd_proxy_dev_attach,
	.proxy_revoke = kvd_proxy_dev_revoke,
	.proxy_query = kvd_proxy_dev_query,
	.proxy_label = kvd_proxy_dev_label,
	.proxy_ranges = kvd_proxy_dev_ranges,
};

/* Serials of contexts, never 0 (a context on the stack, zeroed, has 0). */
static _Atomic uint64_t ctx_serials;

unsigned int kvdmabuf_version(void)
{
	return KVDMABUF_VERSION;
}

static void set_err(char *err, size_t errlen, const char *msg)
{
	if (err && errlen)
		snprintf(err, errlen, "%s", msg);
}

/* The engine's PDs and the config's `nics` must name the same devices. */
static int pds_match_config(struct kvdmabuf_ctx *ctx,
			    const struct kvdmabuf_options *opts)
{
	unsigned int i, j;

	if (!opts->nr_pds || !ctx->cfg.nr_nics)
		return 0;
	for (i = 0; i < ctx->nr_nics; i++) {
		for (j = 0; j < ctx->cfg.nr_nics; j++)
			if (!strcmp(ctx->nics[i].name, ctx->cfg.nics[j]))
				break;
		if (j == ctx->cfg.nr_nics)
			return kvd_err(ctx, -EINVAL, "options: pds[%u] is on "
				       "%s, which %s does not list under "
				       "nics", i, ctx->nics[i].name,
				       ctx->cfg.path);
	}
	for (j = 0; j < ctx->cfg.nr_nics; j++) {
		for (i = 0; i < ctx->nr_nics; i++)
			if (!strcmp(ctx->nics[i].name, ctx->cfg.nics[j]))
				break;
		if (i == ctx->nr_nics)
			return kvd_err(ctx, -EINVAL, "%s lists NIC %s under "
				       "nics, but no PD given in the options is "
				       "on it", ctx->cfg.path,
				       ctx->cfg.nics[j]);
	}
	return 0;
}

/*
 * registrations: engine (proxy-only): the library opens no NIC and makes
 * no MR; the engine registers, under libkvdmabuf-preload.so, on the
 * proxies. Without the preload its MRs would stay on the memory a sleep
 * releases; NICs or PDs handed to the library would never be used.
 */
static int engine_registrations_check(struct kvdmabuf_ctx *ctx,
				      const struct kvdmabuf_options *opts)
{
	if (opts->nr_pds || ctx->cfg.nr_nics)
		return kvd_err(ctx, -EINVAL, "%s: registrations: engine: the "
			       "library makes no MR, so it takes no %s",
			       ctx->cfg.path, opts->nr_pds ? "PDs (options."
			       "pds)" : "NICs (nics:)");
	if (!kvd_preload_present())
		return kvd_err(ctx, -EOPNOTSUPP, "%s: registrations: engine: "
			       "libkvdmabuf-preload.so is not loaded in this "
			       "process (LD_PRELOAD): the engine's own MRs "
			       "would not be made on the proxies and would "
			       "keep the memory a sleep releases",
			       ctx->cfg.path);
	return 0;
}

int kvd_open_ops(const struct kvdmabuf_options *opts,
		 const struct kvd_ops *ops, void *ops_arg,
		 struct kvdmabuf_ctx **ctxp, char *err, size_t errlen)
{
	struct kvdmabuf_ctx *ctx;
	pthread_mutexattr_t ma;
	char reason[KVD_ERRMAX];
	unsigned int i;
	int module, rc;

	if (!opts || !ctxp || !ops) {
		set_err(err, errlen, "kvdmabuf_open: NULL argument");
		return -EINVAL;
	}
	for (i = 0; i < sizeof(opts->reserved) / sizeof(opts->reserved[0]); i++)
		if (opts->reserved[i]) {
			set_err(err, errlen, "kvdmabuf_open: reserved option "
				"fields must be zero");
			return -EINVAL;
		}
	if (opts->module < 0 || opts->module > KVDMABUF_MODULE_OFF ||
	    opts->nr_pds > KVDMABUF_MAX_NICS || (opts->nr_pds && !opts->pds)) {
		set_err(err, errlen, "kvdmabuf_open: bad module or pds option");
		return -EINVAL;
	}
	ctx = calloc(1, sizeof(*ctx));
	if (!ctx) {
		set_err(err, errlen, "out of memory");
		return -ENOMEM;
	}
	ctx->serial = atomic_fetch_add(&ctx_serials, 1) + 1;
	ctx->module_fd = -1;
	ctx->pid = getpid();
	ctx->ops = ops;
	ctx->ops_arg = ops_arg;
	ctx->engine_ops = &kvd_engine_ops;
	ctx->engine_ranges = kvd_engine_ranges;
	pthread_mutexattr_init(&ma);
	pthread_mutexattr_settype(&ma, PTHREAD_MUTEX_RECURSIVE);
	pthread_mutex_init(&ctx->lock, &ma);
	pthread_mutexattr_destroy(&ma);

	if (opts->config_yaml && opts->config_path)
		rc = kvd_err(ctx, -EINVAL, "kvdmabuf_open: config_path or "
			     "config_yaml, not both");
	else if (opts->config_yaml)
		rc = kvd_config_load_yaml(opts->config_yaml, &ctx->cfg,
					  kvd_msg(ctx), KVD_ERRMAX);
	else
		rc = kvd_config_load(opts->config_path, &ctx->cfg,
				     kvd_msg(ctx), KVD_ERRMAX);
	if (rc)
		goto fail;
	if (kvd_gate_check(&ctx->cfg, reason, sizeof(reason)) != 1) {
		rc = kvd_err(ctx, -EPROTONOSUPPORT, "%s: sleep not supported: "
			     "%s", ctx->cfg.path, reason);
		goto fail;
	}
	ctx->drain_timeout_ms = opts->drain_timeout_ms ?
				opts->drain_timeout_ms :
				ctx->cfg.drain_timeout_ms;
	ctx->revoke_timeout_ms = ctx->drain_timeout_ms < 10000 ?
				 ctx->drain_timeout_ms : 10000;
	ctx->access = opts->access ? opts->access :
		      (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
		       IBV_ACCESS_REMOTE_READ);
	ctx->drain = opts->drain;
	ctx->drain_arg = opts->drain_arg;
	ctx->key_change = opts->key_change;
	ctx->key_change_arg = opts->key_change_arg;
	ctx->sleep_begin = opts->sleep_begin;
	ctx->sleep_begin_arg = opts->sleep_begin_arg;
	snprintf(ctx->cuda_library, sizeof(ctx->cuda_library), "%s",
		 opts->cuda_library ? opts->cuda_library :
		 ctx->cfg.cuda_library);

	if (ctx->cfg.proto == KVD_PROTO_RDMA &&
	    ctx->cfg.registrations == KVD_REGISTRATIONS_ENGINE) {
		rc = engine_registrations_check(ctx, opts);
		if (rc)
			goto fail;
	} else if (ctx->cfg.proto == KVD_PROTO_RDMA) {
		rc = ops->nics_open(ctx, opts);
		if (rc)
			goto fail;
		if (!ctx->nr_nics) {
			rc = kvd_err(ctx, -ENODEV, "protocol rdma but no NIC");
			goto fail_nics;
		}
		rc = pds_match_config(ctx, opts);
		if (rc)
			goto fail_nics;
	}

	module = opts->module ? opts->module : ctx->cfg.module;
	/* proxy-only: the proxies are all there is */
	if (ctx->cfg.proto == KVD_PROTO_RDMA &&
	    ctx->cfg.registrations == KVD_REGISTRATIONS_ENGINE) {
		if (module == KVDMABUF_MODULE_OFF) {
			rc = kvd_err(ctx, -EINVAL, "%s: registrations: engine "
				     "with module: off: the engine's MRs are "
				     "made on the module's proxies",
				     ctx->cfg.path);
			goto fail;
		}
		module = KVDMABUF_MODULE_REQUIRE;
	}
	if (module != KVDMABUF_MODULE_OFF && ctx->cfg.proto == KVD_PROTO_RDMA) {
		rc = ops->proxy_open(ctx, &ctx->module_fd);
		if (rc && module == KVDMABUF_MODULE_REQUIRE) {
			if (rc == -ENOENT)
				rc = -ENODEV;
			kvd_err_prefix(ctx, rc, "module: require");
			goto fail_nics;
		}
		if (rc)
			ctx->module_fd = -1;   /* auto: go without it */
	}
	*ctxp = ctx;
	return 0;

fail_nics:
	if (ctx->nr_nics)
		ops->nics_close(ctx);
fail:
	set_err(err, errlen, kvd_msg(ctx));
	kvd_msg(NULL);          /* forget the freed context */
	pthread_mutex_destroy(&ctx->lock);
	free(ctx);
	return rc;
}

int kvdmabuf_open(const struct kvdmabuf_options *opts,
		  struct kvdmabuf_ctx **ctxp, char *err, size_t errlen)
{
	return kvd_open_ops(opts, &kvd_default_ops, NULL, ctxp, err, errlen);
}

int kvdmabuf_close(struct kvdmabuf_ctx *ctx)
{
	unsigned int i;
	int rc;

	if (!ctx)
		return -EINVAL;
	rc = kvd_not_forked(ctx, "close");
	if (rc)
		return rc;
	pthread_mutex_lock(&ctx->lock);
	rc = kvd_may_change(ctx, "close");
	/* All or nothing: a region with a transfer in flight keeps the
	 * whole context open (and every region as it was). */
	for (i = 0; !rc && i < ctx->nr_regions; i++) {
		rc = kvd_region_retire(ctx->regions[i]);
		if (rc)
			while (i--)
				kvd_region_unretire(ctx->regions[i]);
	}
	if (rc) {
		pthread_mutex_unlock(&ctx->lock);
		return rc;
	}
	/* A region whose MR the NIC does not let go stays, broken, with the
	 * context open around it: the others are gone. */
	for (i = ctx->nr_regions; i-- > 0;) {
		struct kvdmabuf_region *r = ctx->regions[i];
		int rc2 = kvd_region_release(r, "close");

		if (!rc2)
			kvd_region_destroy(r);
		else if (!rc)
			rc = rc2;
	}
	if (rc) {
		kvd_err_prefix(ctx, rc, "close: %u region(s) left, the context "
			       "stays open (close it again)", ctx->nr_regions);
		pthread_mutex_unlock(&ctx->lock);
		return rc;
	}
	free(ctx->regions);
	if (ctx->module_fd >= 0)
		close(ctx->module_fd);
	if (ctx->nr_nics)
		ctx->ops->nics_close(ctx);
	kvd_cuda_unload(ctx);
	kvd_msg(NULL);          /* no message names a freed context */
	pthread_mutex_unlock(&ctx->lock);
	pthread_mutex_destroy(&ctx->lock);
	free(ctx);
	return 0;
}

/* The first @size bytes of the context's state into @out. */
static int query(struct kvdmabuf_ctx *ctx, void *out, size_t size)
{
	struct kvdmabuf_state state, *st = &state;
	unsigned int i;

	if (!ctx || !out)
		return -EINVAL;
	memset(st, 0, sizeof(*st));
	pthread_mutex_lock(&ctx->lock);
	st->nr_regions = ctx->nr_regions;
	st->nr_nics = ctx->nr_nics;
	st->module = ctx->module_fd >= 0;
	st->protocol_rdma = ctx->cfg.proto == KVD_PROTO_RDMA;
	st->sleeps = ctx->sleeps;
	st->wakes = ctx->wakes;
	st->prefetches = ctx->prefetches;
	st->prefetch_failures = ctx->prefetch_failures;
	st->unbalanced_io_end = ctx->unbalanced_removed;
	for (i = 0; i < ctx->nr_regions; i++) {
		struct kvdmabuf_region *r = ctx->regions[i];

		st->nr_asleep += r->asleep;
		st->nr_broken += r->broken != 0;
		/* keys never change: a proxy, or on-demand paging */
		st->nr_follow += r->mode == KVDMABUF_MODE_FOLLOW ||
				 r->mode == KVDMABUF_MODE_ODP;
		st->nr_reregister += r->mode == KVDMABUF_MODE_REREGISTER;
		st->nr_host += r->mode == KVDMABUF_MODE_HOST;
		st->nr_noreg += r->mode == KVDMABUF_MODE_NOREG;
		st->inflight += kvd_io_count(&r->io);
		st->unbalanced_io_end += atomic_load(&r->io.unbalanced);
	}
	pthread_mutex_unlock(&ctx->lock);
	memcpy(out, st, size);
	return 0;
}

KVD_SYMVER_DEFAULT(kvdmabuf_query, "KVDMABUF_0.5")
int kvd_query_0_5(struct kvdmabuf_ctx *ctx, struct kvdmabuf_state *st)
{
	return query(ctx, st, sizeof(*st));
}

KVD_SYMVER_OLD(kvdmabuf_query, "KVDMABUF_0.2")
int kvd_query_0_2(struct kvdmabuf_ctx *ctx, struct kvdmabuf_state *st)
{
	return query(ctx, st, KVD_STATE_SIZE_0_2);
}

/* Under the lock: NICs join and leave (kvdmabuf_nic_add/remove). */
struct ibv_pd *kvdmabuf_pd(struct kvdmabuf_ctx *ctx, unsigned int nic)
{
	struct ibv_pd *pd = NULL;

	if (!ctx)
		return NULL;
	pthread_mutex_lock(&ctx->lock);
	if (nic < ctx->nr_nics)
		pd = ctx->nics[nic].pd;
	pthread_mutex_unlock(&ctx->lock);
	return pd;
}
