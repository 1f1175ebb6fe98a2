// SPDX-License-Identifier: MIT
/*
 * config.c - the YAML configuration (libyaml event parser).
 *
 *   protocol: rdma            # rdma | tcp | anything else (refused by gate)
 *   nics: [rxe0, rxe1]        # verbs device names (or one name)
 *   drain_timeout_s: 480      # > 0, may be fractional
 *   module: auto              # auto | require | off
 *   cuda_library: /path/libcuda.so.1
 *   cuda_dmabuf_mapping: auto # auto | pcie | default (CUDA dma-buf flags)
 *   transport: ucx            # the engine's transfer library (gate.c)
 *   host_on_demand: auto      # auto | on | off: ODP for host memory
 *                             # released at sleep where every NIC has it
 *   registrations: library    # library | engine: under libkvdmabuf-preload.so
 *                             # the engine's own MRs only (proxy-only)
 *   prefetch_at_wake: off     # off | on: ibv_advise_mr() prefetch of the
 *                             # MRs that follow (FOLLOW, ODP) at each wake
 *   kv_regions: [0x7e0000000000+0x40000000:kv_cache]
 *                             # KV memory by address, ADDR+LEN[:TAG] (a list
 *                             # or one): for libkvdmabuf-preload.so
 *
 * Malformed YAML and unknown keys are errors with file:line:column.
 *
 * Each key but kv_regions may also come from the environment,
 * KVDMABUF_<KEY> in upper case (KVDMABUF_NICS=mlx5_3), holding what the
 * file would after "key: ", with the same checks; it wins over the file.
 * For what differs per worker (a rank's NIC) without a file per worker.
 */
#include <ctype.h>
#include <errno.h>
#include <locale.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <yaml.h>

#include "internal.h"

/* The largest configuration read, file or text. */
#define CONFIG_MAX (1u << 20)

/* libyaml's parser, loaded at first use (syslib.c). */
struct yaml_api {
	int (*parser_initialize)(yaml_parser_t *parser);
	void (*parser_set_input_string)(yaml_parser_t *parser,
					const unsigned char *input,
					size_t size);
	int (*parser_parse)(yaml_parser_t *parser, yaml_event_t *event);
	void (*event_delete)(yaml_event_t *event);
	void (*parser_delete)(yaml_parser_t *parser);
};

struct parse {
	const struct yaml_api *y;
	yaml_parser_t parser;
	const char *name;
	char *err;
	size_t errlen;
	unsigned int seen;
	bool overlay;		/* one key over a whole configuration */
};

enum { SEEN_PROTOCOL = 1, SEEN_NICS = 2, SEEN_DRAIN = 4, SEEN_MODULE = 8,
       SEEN_CUDA = 16, SEEN_CUDA_MAPPING = 32, SEEN_TRANSPORT = 64,
       SEEN_KV_REGIONS = 128, SEEN_HOST_ODP = 256,
       SEEN_REGISTRATIONS = 512, SEEN_PREFETCH = 1024 };

static int perr(struct parse *p, const yaml_mark_t *m, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static int perr(struct parse *p, const yaml_mark_t *m, const char *fmt, ...)
{
	char msg[256];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	if (p->err && p->errlen)
		snprintf(p->err, p->errlen, "%s:%zu:%zu: %s", p->name,
			 (size_t)m->line + 1, (size_t)m->column + 1, msg);
	return -EINVAL;
}

static int next(struct parse *p, yaml_event_t *ev)
{
	if (!p->y->parser_parse(&p->parser, ev)) {
		const yaml_mark_t *m = &p->parser.problem_mark;

		return perr(p, m, "malformed YAML: %s%s%s",
			    p->parser.problem ? p->parser.problem : "error",
			    p->parser.context ? " " : "",
			    p->parser.context ? p->parser.context : "");
	}
	return 0;
}

static int scalar_copy(struct parse *p, yaml_event_t *ev, const char *key,
		       char *dst, size_t dstlen)
{
	size_t n = ev->data.scalar.length;

	if (ev->type != YAML_SCALAR_EVENT)
		return perr(p, &ev->start_mark, "'%s' must be a scalar", key);
	if (n == 0)
		return perr(p, &ev->start_mark, "'%s' must not be empty", key);
	if (n >= dstlen)
		return perr(p, &ev->start_mark, "'%s' is too long (max %zu)",
			    key, dstlen - 1);
	memcpy(dst, ev->data.scalar.value, n);
	dst[n] = '\0';
	return 0;
}

typedef int (*item_fn)(struct parse *p, yaml_event_t *ev,
		       struct kvd_config *c);

/* @fn on each item of a sequence, or on @ev itself when it is not one. */
static int each_item(struct parse *p, yaml_event_t *ev, struct kvd_config *c,
		     item_fn fn)
{
	yaml_event_t item;
	int rc;

	if (ev->type != YAML_SEQUENCE_START_EVENT)
		return fn(p, ev, c);
	for (;;) {
		rc = next(p, &item);
		if (rc)
			return rc;
		if (item.type == YAML_SEQUENCE_END_EVENT) {
			p->y->event_delete(&item);
			return 0;
		}
		rc = fn(p, &item, c);
		p->y->event_delete(&item);
		if (rc)
			return rc;
	}
}

static int nic_add(struct parse *p, yaml_event_t *ev, struct kvd_config *c)
{
	if (ev->type != YAML_SCALAR_EVENT)
		return perr(p, &ev->start_mark,
			    "'nics' must be a device name or a list of them");
	if (c->nr_nics == KVDMABUF_MAX_NICS)
		return perr(p, &ev->start_mark, "more than %d nics",
			    KVDMABUF_MAX_NICS);
	return scalar_copy(p, ev, "nics", c->nics[c->nr_nics++], KVD_NAMEMAX);
}

int kvd_kv_range_parse(const char *s, size_t n, struct kvd_kv_range *r)
{
	char buf[256], *end, *tag;
	unsigned long long a, l;

	if (n >= sizeof(buf))
		return -EINVAL;
	memcpy(buf, s, n);
	buf[n] = '\0';
	tag = strchr(buf, ':');
	if (tag)
		*tag++ = '\0';
	errno = 0;
	a = strtoull(buf, &end, 0);
	if (errno || end == buf || *end != '+' || buf[0] == '-')
		return -EINVAL;
	s = end + 1;
	l = strtoull(s, &end, 0);
	if (errno || end == s || *end || *s == '-' || !a || !l ||
	    a + l < a)
		return -EINVAL;
	if (tag && (!*tag || strlen(tag) >= sizeof(r->tag)))
		return -EINVAL;
	r->addr = a;
	r->len = l;
	snprintf(r->tag, sizeof(r->tag), "%s", tag ? tag : "");
	return 0;
}

static int kv_region_add(struct parse *p, yaml_event_t *ev,
			 struct kvd_config *c)
{
	struct kvd_kv_range *r = &c->kv_regions[c->nr_kv_regions];
	unsigned int i;

	if (ev->type != YAML_SCALAR_EVENT)
		return perr(p, &ev->start_mark, "'kv_regions' entries must be "
			    "ADDR+LEN[:TAG] strings");
	if (c->nr_kv_regions == KVD_MAX_KV_REGIONS)
		return perr(p, &ev->start_mark, "more than %d kv_regions",
			    KVD_MAX_KV_REGIONS);
	if (kvd_kv_range_parse((const char *)ev->data.scalar.value,
			       ev->data.scalar.length, r))
		return perr(p, &ev->start_mark, "'kv_regions' entry '%.*s' is "
			    "not ADDR+LEN[:TAG] (non-zero, not wrapping, "
			    "numbers in C syntax)",
			    (int)(ev->data.scalar.length > 80 ? 80 :
				  ev->data.scalar.length),
			    (const char *)ev->data.scalar.value);
	for (i = 0; i < c->nr_kv_regions; i++)
		if (r->addr < c->kv_regions[i].addr + c->kv_regions[i].len &&
		    c->kv_regions[i].addr < r->addr + r->len)
			return perr(p, &ev->start_mark, "'kv_regions' entry "
				    "%#llx+%#llx overlaps entry %u",
				    (unsigned long long)r->addr,
				    (unsigned long long)r->len, i + 1);
	c->nr_kv_regions++;
	return 0;
}

/* A YAML number is written with a '.', whatever the process's locale. */
static double parse_double(const char *s, char **end)
{
	locale_t c = newlocale(LC_NUMERIC_MASK, "C", (locale_t)0);
	double d;

	if (!c) {
		*end = (char *)s;       /* no locale object: reject */
		return 0;
	}
	errno = 0;
	d = strtod_l(s, end, c);
	if (errno)
		*end = (char *)s;
	freelocale(c);
	return d;
}

/* A key whose value is one of a few words, each standing for a number. */
struct word {
	const char *name;
	int value;
};

/* @ev's scalar is one of @words (@n): its value in *@out; else an error
 * naming them ("'KEY' must be a, b or c, not 'x'"). */
static int one_of(struct parse *p, yaml_event_t *ev, const char *key,
		  const struct word *words, unsigned int n, int *out)
{
	char buf[256], list[128] = "";
	unsigned int i;
	int rc;

	rc = scalar_copy(p, ev, key, buf, sizeof(buf));
	if (rc)
		return rc;
	for (i = 0; i < n; i++) {
		if (!strcmp(buf, words[i].name)) {
			*out = words[i].value;
			return 0;
		}
		snprintf(list + strlen(list), sizeof(list) - strlen(list),
			 "%s%s", i ? (i + 1 < n ? ", " : " or ") : "",
			 words[i].name);
	}
	return perr(p, &ev->start_mark, "'%s' must be %s, not '%s'", key,
		    list, buf);
}

#define ONE_OF(p, ev, key, words, out) \
	one_of(p, ev, key, words, sizeof(words) / sizeof(words[0]), out)

static const struct word module_words[] = {
	{ "auto", KVDMABUF_MODULE_AUTO }, { "require", KVDMABUF_MODULE_REQUIRE },
	{ "off", KVDMABUF_MODULE_OFF },
};
static const struct word mapping_words[] = {
	{ "auto", KVD_CUDA_MAPPING_AUTO }, { "pcie", KVD_CUDA_MAPPING_PCIE },
	{ "default", KVD_CUDA_MAPPING_DEFAULT },
};
static const struct word host_odp_words[] = {
	{ "auto", KVD_HOST_ODP_AUTO }, { "on", KVD_HOST_ODP_ON },
	{ "off", KVD_HOST_ODP_OFF },
};
static const struct word registrations_words[] = {
	{ "library", KVD_REGISTRATIONS_LIBRARY },
	{ "engine", KVD_REGISTRATIONS_ENGINE },
};
static const struct word prefetch_words[] = {
	{ "off", 0 }, { "on", 1 },
};

static int parse_value(struct parse *p, const char *key, yaml_mark_t *kmark,
		       yaml_event_t *ev, struct kvd_config *c)
{
	char buf[256];
	char *end;
	double d;
	unsigned int bit;
	int rc;

	if (!strcmp(key, "protocol"))
		bit = SEEN_PROTOCOL;
	else if (!strcmp(key, "nics"))
		bit = SEEN_NICS;
	else if (!strcmp(key, "drain_timeout_s"))
		bit = SEEN_DRAIN;
	else if (!strcmp(key, "module"))
		bit = SEEN_MODULE;
	else if (!strcmp(key, "cuda_library"))
		bit = SEEN_CUDA;
	else if (!strcmp(key, "cuda_dmabuf_mapping"))
		bit = SEEN_CUDA_MAPPING;
	else if (!strcmp(key, "transport"))
		bit = SEEN_TRANSPORT;
	else if (!strcmp(key, "kv_regions"))
		bit = SEEN_KV_REGIONS;
	else if (!strcmp(key, "host_on_demand"))
		bit = SEEN_HOST_ODP;
	else if (!strcmp(key, "registrations"))
		bit = SEEN_REGISTRATIONS;
	else if (!strcmp(key, "prefetch_at_wake"))
		bit = SEEN_PREFETCH;
	else
		return perr(p, kmark, "unknown key '%s' (known: protocol, nics, "
			    "drain_timeout_s, module, cuda_library, "
			    "cuda_dmabuf_mapping, transport, kv_regions, "
			    "host_on_demand, registrations, "
			    "prefetch_at_wake)", key);
	if (p->seen & bit)
		return perr(p, kmark, "duplicate key '%s'", key);
	p->seen |= bit;

	switch (bit) {
	case SEEN_PROTOCOL:
		rc = scalar_copy(p, ev, key, c->protocol, sizeof(c->protocol));
		if (rc)
			return rc;
		if (!strcasecmp(c->protocol, "rdma"))
			c->proto = KVD_PROTO_RDMA;
		else if (!strcasecmp(c->protocol, "tcp"))
			c->proto = KVD_PROTO_TCP;
		else
			c->proto = KVD_PROTO_OTHER;
		return 0;
	case SEEN_NICS:
		return each_item(p, ev, c, nic_add);
	case SEEN_DRAIN:
		rc = scalar_copy(p, ev, key, buf, sizeof(buf));
		if (rc)
			return rc;
		d = parse_double(buf, &end);
		if (end == buf || *end || !isfinite(d) || d <= 0 ||
		    d > 86400.0)
			return perr(p, &ev->start_mark,
				    "'drain_timeout_s' must be a number of "
				    "seconds in (0, 86400], not '%s'", buf);
		c->drain_timeout_ms = (unsigned int)ceil(d * 1000.0);
		return 0;
	case SEEN_MODULE:
		return ONE_OF(p, ev, key, module_words, &c->module);
	case SEEN_CUDA_MAPPING:
		return ONE_OF(p, ev, key, mapping_words, &c->cuda_mapping);
	case SEEN_TRANSPORT:
		return scalar_copy(p, ev, key, c->transport,
				   sizeof(c->transport));
	case SEEN_KV_REGIONS:
		return each_item(p, ev, c, kv_region_add);
	case SEEN_HOST_ODP:
		return ONE_OF(p, ev, key, host_odp_words, &c->host_odp);
	case SEEN_REGISTRATIONS:
		return ONE_OF(p, ev, key, registrations_words,
			      &c->registrations);
	case SEEN_PREFETCH:
		return ONE_OF(p, ev, key, prefetch_words,
			      &c->prefetch_at_wake);
	default:
		return scalar_copy(p, ev, key, c->cuda_library,
				   sizeof(c->cuda_library));
	}
}

static int parse_doc(struct parse *p, struct kvd_config *c)
{
	yaml_event_t ev, val;
	yaml_mark_t kmark;
	char key[64];
	int rc;

	/* stream start, document start, mapping start */
	rc = next(p, &ev);
	if (rc)
		return rc;
	p->y->event_delete(&ev);
	rc = next(p, &ev);
	if (rc)
		return rc;
	if (ev.type != YAML_DOCUMENT_START_EVENT) {
		rc = perr(p, &ev.start_mark, "empty config");
		p->y->event_delete(&ev);
		return rc;
	}
	p->y->event_delete(&ev);
	rc = next(p, &ev);
	if (rc)
		return rc;
	if (ev.type != YAML_MAPPING_START_EVENT) {
		rc = perr(p, &ev.start_mark,
			  "top level must be a mapping of key: value");
		p->y->event_delete(&ev);
		return rc;
	}
	p->y->event_delete(&ev);

	for (;;) {
		rc = next(p, &ev);
		if (rc)
			return rc;
		if (ev.type == YAML_MAPPING_END_EVENT) {
			p->y->event_delete(&ev);
			break;
		}
		if (ev.type != YAML_SCALAR_EVENT) {
			rc = perr(p, &ev.start_mark, "keys must be scalars");
			p->y->event_delete(&ev);
			return rc;
		}
		snprintf(key, sizeof(key), "%.*s",
			 (int)ev.data.scalar.length,
			 (const char *)ev.data.scalar.value);
		kmark = ev.start_mark;
		p->y->event_delete(&ev);
		rc = next(p, &val);
		if (rc)
			return rc;
		rc = parse_value(p, key, &kmark, &val, c);
		p->y->event_delete(&val);
		if (rc)
			return rc;
	}
	/* document end; then no second document */
	rc = next(p, &ev);
	if (rc)
		return rc;
	p->y->event_delete(&ev);
	rc = next(p, &ev);
	if (rc)
		return rc;
	if (ev.type != YAML_STREAM_END_EVENT)
		rc = perr(p, &ev.start_mark, "only one YAML document allowed");
	p->y->event_delete(&ev);
	if (rc)
		return rc;
	if (!p->overlay && !(p->seen & SEEN_PROTOCOL)) {
		if (p->err && p->errlen)
			snprintf(p->err, p->errlen,
				 "%s: missing key 'protocol'", p->name);
		return -EINVAL;
	}
	return 0;
}

/* The settings of an empty configuration. */
static void config_defaults(struct kvd_config *c)
{
	memset(c, 0, sizeof(*c));
	c->drain_timeout_ms = KVDMABUF_DRAIN_TIMEOUT_S_DEFAULT * 1000u;
	c->module = KVDMABUF_MODULE_AUTO;
}

/* What is used when no configuration is named: protocol rdma, no YAML. */
static void config_builtin(struct kvd_config *c)
{
	config_defaults(c);
	snprintf(c->path, sizeof(c->path), "built-in defaults (no %s)",
		 KVDMABUF_CONFIG_ENV);
	snprintf(c->protocol, sizeof(c->protocol), "rdma");
	c->proto = KVD_PROTO_RDMA;
}

static int yaml_api_get(struct yaml_api *y, const char *name, char *err,
			size_t errlen)
{
	char use[160];

	snprintf(use, sizeof(use), "reading %s", name);
#define SYM(field)							\
	if (!(*(void **)&y->field = kvd_syslib_sym(KVD_SYSLIB_YAML,	\
						   "yaml_" #field, use,	\
						   err, errlen)))	\
		return -ELIBACC;
	SYM(parser_initialize)
	SYM(parser_set_input_string)
	SYM(parser_parse)
	SYM(event_delete)
	SYM(parser_delete)
#undef SYM
	return 0;
}

/*
 * @text parsed over what @cfg holds (the defaults, or a file's keys); an
 * @overlay need not say the protocol.
 */
static int parse_over(const char *text, size_t len, const char *name,
		      bool overlay, struct kvd_config *cfg, char *err,
		      size_t errlen)
{
	struct parse p = { .name = name, .err = err, .errlen = errlen,
			   .overlay = overlay };
	struct yaml_api y;
	int rc;

	rc = yaml_api_get(&y, name, err, errlen);
	if (rc)
		return rc;
	p.y = &y;
	if (!y.parser_initialize(&p.parser)) {
		snprintf(err, errlen, "%s: out of memory", name);
		return -ENOMEM;
	}
	y.parser_set_input_string(&p.parser, (const unsigned char *)text,
				  len);
	rc = parse_doc(&p, cfg);
	y.parser_delete(&p.parser);
	return rc;
}

int kvd_config_parse(const char *text, size_t len, const char *name,
		     struct kvd_config *cfg, char *err, size_t errlen)
{
	config_defaults(cfg);
	snprintf(cfg->path, sizeof(cfg->path), "%s", name);
	return parse_over(text, len, name, false, cfg, err, errlen);
}

/* The keys the environment may set, KVDMABUF_<KEY>. */
static const char *const env_keys[] = {
	"protocol", "nics", "drain_timeout_s", "module", "cuda_library",
	"cuda_dmabuf_mapping", "transport", "host_on_demand", "registrations",
	"prefetch_at_wake",
};

/* The environment's keys over @cfg; @cfg->path says which came from it. */
static int config_env(struct kvd_config *cfg, char *err, size_t errlen)
{
	static const char prefix[] = "KVDMABUF_";
	char var[48], text[1100], from[sizeof(cfg->path)] = "";
	const char *v;
	unsigned int i, j;
	int rc;

	for (i = 0; i < sizeof(env_keys) / sizeof(env_keys[0]); i++) {
		snprintf(var, sizeof(var), "%s%s", prefix, env_keys[i]);
		for (j = sizeof(prefix) - 1; var[j]; j++)
			var[j] = (char)toupper((unsigned char)var[j]);
		v = getenv(var);
		if (!v)
			continue;
		if (strlen(v) > 1024) {
			snprintf(err, errlen, "$%s: longer than 1024 bytes", var);
			return -EINVAL;
		}
		snprintf(text, sizeof(text), "%s: %s\n", env_keys[i], v);
		if (!strcmp(env_keys[i], "nics"))
			cfg->nr_nics = 0;	/* replaced, not added to */
		rc = parse_over(text, strlen(text), var, true, cfg, err,
				errlen);
		if (rc)
			return rc;
		snprintf(from + strlen(from), sizeof(from) - strlen(from),
			 "%s%s", from[0] ? ", " : "", var);
	}
	if (from[0]) {
		j = strlen(cfg->path);
		snprintf(cfg->path + j, sizeof(cfg->path) - j, " + $%s", from);
	}
	return 0;
}

static int config_load_file(const char *path, struct kvd_config *cfg,
			    char *err, size_t errlen)
{
	const char *from = "the caller";
	char *text = NULL;
	size_t len = 0, cap = 0, n;
	FILE *f;
	int rc;

	if (!path) {
		path = getenv(KVDMABUF_CONFIG_ENV);
		from = KVDMABUF_CONFIG_ENV;
		/* No file is needed to start: the defaults are those of an
		 * empty config but for the protocol, rdma (the gate still
		 * reads the environment). A file only changes them. */
		if (!path || !*path) {
			config_builtin(cfg);
			return 0;
		}
	}
	f = fopen(path, "re");
	if (!f) {
		rc = -errno;
		snprintf(err, errlen, "configuration %s (from %s) cannot be "
			 "opened: %s", path, from, strerror(-rc));
		return rc;
	}
	for (;;) {
		if (len + 4096 > cap) {
			char *t;

			cap = cap ? cap * 2 : 8192;
			if (cap > CONFIG_MAX) {
				free(text);
				fclose(f);
				snprintf(err, errlen, "%s: larger than 1 MiB",
					 path);
				return -EFBIG;
			}
			t = realloc(text, cap);
			if (!t) {
				free(text);
				fclose(f);
				snprintf(err, errlen, "%s: out of memory",
					 path);
				return -ENOMEM;
			}
			text = t;
		}
		n = fread(text + len, 1, cap - len, f);
		len += n;
		if (n == 0)
			break;
	}
	if (ferror(f)) {
		free(text);
		fclose(f);
		snprintf(err, errlen, "%s: read error", path);
		return -EIO;
	}
	fclose(f);
	rc = kvd_config_parse(text, len, path, cfg, err, errlen);
	free(text);
	return rc;
}

int kvd_config_load_yaml(const char *text, struct kvd_config *cfg,
			 char *err, size_t errlen)
{
	size_t len = strnlen(text, CONFIG_MAX + 1);
	int rc;

	if (len > CONFIG_MAX) {
		snprintf(err, errlen, "options.config_yaml: larger than 1 MiB");
		return -EINVAL;
	}
	rc = kvd_config_parse(text, len, "options.config_yaml", cfg, err,
			      errlen);
	return rc ? rc : config_env(cfg, err, errlen);
}

int kvd_config_load(const char *path, struct kvd_config *cfg, char *err,
		    size_t errlen)
{
	int rc = config_load_file(path, cfg, err, errlen);

	return rc ? rc : config_env(cfg, err, errlen);
}
