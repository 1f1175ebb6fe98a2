// SPDX-License-Identifier: MIT
/*
 * lib_config - the YAML config (every key, malformed YAML and unknown keys
 * reported with line and column) and the sleep gate as a table: rdma and
 * tcp accepted, any other protocol refused, MC_FORCE_MNNVL /
 * MC_INTRANODE_NVLINK / MC_INTRA_NVLINK set to any value refused, missing
 * config an error naming the variable and the path; the gate loads no
 * CUDA library and opens no device. Host-only.
 */
#include "harness.h"
#include "lib_fake.h"

struct cfg_case {
	const char *yaml;
	int rc;
	const char *msg;       /* substring of the error, NULL for success */
};

static const struct cfg_case cases[] = {
	{ "protocol: rdma\n", 0, NULL },
	{ "nics: rxe0\nprotocol: tcp\n", 0, NULL },
	{ "protocol: rdma\nbogus: 1\n", -EINVAL,
	  "t.yaml:2:1: unknown key 'bogus'" },
	{ "protocol: rdma\nnics: [rxe0,\n", -EINVAL,
	  "malformed YAML" },
	{ "protocol: rdma\n  nics: x\n", -EINVAL,
	  "t.yaml:2:7: malformed YAML" },
	{ "protocol: rdma\nprotocol: tcp\n", -EINVAL,
	  "t.yaml:2:1: duplicate key 'protocol'" },
	{ "", -EINVAL, "empty config" },
	{ "- a\n- b\n", -EINVAL, "t.yaml:1:1: top level must be a mapping" },
	{ "protocol: rdma\ndrain_timeout_s: 0\n", -EINVAL,
	  "t.yaml:2:18: 'drain_timeout_s' must be" },
	{ "protocol: rdma\ndrain_timeout_s: soon\n", -EINVAL,
	  "'drain_timeout_s' must be" },
	{ "protocol: rdma\nmodule: maybe\n", -EINVAL,
	  "t.yaml:2:9: 'module' must be auto, require or off" },
	{ "drain_timeout_s: 3\n", -EINVAL, "missing key 'protocol'" },
	{ "protocol: rdma\nnics: {a: b}\n", -EINVAL, "'nics' must be" },
	{ "protocol: rdma\n---\nprotocol: tcp\n", -EINVAL,
	  "only one YAML document" },
	{ "protocol: rdma\nnics: [a, b, c, d, e, f, g, h, i]\n", -EINVAL,
	  "more than 8 nics" },
	{ "protocol:\n", -EINVAL, "'protocol' must not be empty" },
	{ "protocol: [rdma]\n", -EINVAL, "t.yaml:1:11: 'protocol' must be a "
	  "scalar" },
};

TEST(config_table)
{
	struct kvd_config c;
	char err[512];
	size_t i;
	int rc;

	for (i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		err[0] = '\0';
		rc = kvd_config_parse(cases[i].yaml, strlen(cases[i].yaml),
				      "t.yaml", &c, err, sizeof(err));
		TH_LOG("case %zu: rc %d: %s", i, rc, err);
		EXPECT_EQ(cases[i].rc, rc);
		if (cases[i].msg)
			EXPECT_NE(NULL, strstr(err, cases[i].msg));
	}
}

TEST(config_every_key)
{
	static const char y[] =
		"# kvdmabuf\n"
		"protocol: rdma\n"
		"nics: [rxe0, rxe1]\n"
		"drain_timeout_s: 2.5\n"
		"module: require\n"
		"cuda_library: /opt/x/libcuda.so.1\n";
	struct kvd_config c;
	char err[256];

	ASSERT_EQ(0, kvd_config_parse(y, strlen(y), "t.yaml", &c, err,
				      sizeof(err)));
	EXPECT_EQ(KVD_PROTO_RDMA, c.proto);
	EXPECT_EQ(2u, c.nr_nics);
	EXPECT_EQ(0, strcmp(c.nics[0], "rxe0"));
	EXPECT_EQ(0, strcmp(c.nics[1], "rxe1"));
	EXPECT_EQ(2500u, c.drain_timeout_ms);
	EXPECT_EQ(KVDMABUF_MODULE_REQUIRE, c.module);
	EXPECT_EQ(0, strcmp(c.cuda_library, "/opt/x/libcuda.so.1"));
}

TEST(config_defaults)
{
	struct kvd_config c;
	char err[256];

	ASSERT_EQ(0, kvd_config_parse("protocol: tcp\n", 14, "t.yaml", &c,
				      err, sizeof(err)));
	EXPECT_EQ(KVDMABUF_DRAIN_TIMEOUT_S_DEFAULT * 1000u, c.drain_timeout_ms);
	EXPECT_EQ(KVDMABUF_MODULE_AUTO, c.module);
	EXPECT_EQ(0u, c.nr_nics);
	EXPECT_EQ('\0', c.cuda_library[0]);
}

static const char *const nv_env[] = { "MC_FORCE_MNNVL", "MC_INTRANODE_NVLINK",
				      "MC_INTRA_NVLINK" };

struct gate_case {
	const char *protocol;
	const char *env;       /* variable set for this case, or NULL */
	const char *value;
	int verdict;
};

static const struct gate_case gates[] = {
	{ "rdma", NULL, NULL, 1 },
	{ "tcp", NULL, NULL, 1 },
	{ "nvlink", NULL, NULL, 0 },
	{ "nvlink_intra", NULL, NULL, 0 },
	{ "RDMA", NULL, NULL, 0 },
	{ "efa", NULL, NULL, 0 },
	{ "rdma", "MC_FORCE_MNNVL", "1", 0 },
	{ "rdma", "MC_FORCE_MNNVL", "0", 0 },
	{ "rdma", "MC_INTRANODE_NVLINK", "", 0 },
	{ "rdma", "MC_INTRA_NVLINK", "false", 0 },
	{ "tcp", "MC_INTRA_NVLINK", "0", 0 },
	{ "tcp", "MC_FORCE_MNNVL_X", "1", 1 },  /* only the exact names */
};

TEST(gate_table)
{
	char yaml[128], reason[512];
	const char *path;
	size_t i, j;
	int v;

	for (i = 0; i < sizeof(gates) / sizeof(gates[0]); i++) {
		for (j = 0; j < 3; j++)
			unsetenv(nv_env[j]);
		unsetenv("MC_FORCE_MNNVL_X");
		if (gates[i].env)
			setenv(gates[i].env, gates[i].value, 1);
		snprintf(yaml, sizeof(yaml), "protocol: %s\n",
			 gates[i].protocol);
		path = write_config(yaml);
		ASSERT_NE(NULL, path);
		v = kvdmabuf_gate(path, reason, sizeof(reason));
		TH_LOG("protocol %s, %s=%s: %d %s", gates[i].protocol,
		       gates[i].env ?: "-", gates[i].value ?: "-", v, reason);
		EXPECT_EQ(gates[i].verdict, v);
		if (gates[i].env && !v)
			EXPECT_NE(NULL, strstr(reason, gates[i].env));
		unlink(path);
	}
}

TEST(gate_missing_config_names_variable_and_path)
{
	char reason[512];

	unsetenv(KVDMABUF_CONFIG_ENV);
	EXPECT_EQ(-ENOENT, kvdmabuf_gate(NULL, reason, sizeof(reason)));
	TH_LOG("%s", reason);
	EXPECT_NE(NULL, strstr(reason, "KVDMABUF_CONFIG"));
	setenv(KVDMABUF_CONFIG_ENV, "/nonexistent/kvdmabuf.yaml", 1);
	EXPECT_EQ(-ENOENT, kvdmabuf_gate(NULL, reason, sizeof(reason)));
	TH_LOG("%s", reason);
	EXPECT_NE(NULL, strstr(reason, "KVDMABUF_CONFIG"));
	EXPECT_NE(NULL, strstr(reason, "/nonexistent/kvdmabuf.yaml"));
	EXPECT_EQ(-ENOENT, kvdmabuf_gate("/nonexistent/b.yaml", reason,
					 sizeof(reason)));
	EXPECT_NE(NULL, strstr(reason, "/nonexistent/b.yaml"));
	/* an invalid config is an error, not a verdict */
	setenv(KVDMABUF_CONFIG_ENV, write_config("protocol: rdma\nx: 1\n"), 1);
	EXPECT_EQ(-EINVAL, kvdmabuf_gate(NULL, reason, sizeof(reason)));
	EXPECT_NE(NULL, strstr(reason, ":2:1: unknown key 'x'"));
	/* and through the variable, a good one */
	setenv(KVDMABUF_CONFIG_ENV, write_config("protocol: tcp\n"), 1);
	EXPECT_EQ(1, kvdmabuf_gate(NULL, NULL, 0));
	unlink(getenv(KVDMABUF_CONFIG_ENV));
}

static int maps_contain(const char *what)
{
	char line[512];
	FILE *f = fopen("/proc/self/maps", "re");
	int found = 0;

	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f))
		if (strstr(line, what))
			found = 1;
	fclose(f);
	return found;
}

TEST(gate_loads_no_cuda_opens_no_device)
{
	char yaml[256], reason[256];
	const char *path;
	int fds, devs, maps;

	snprintf(yaml, sizeof(yaml), "protocol: rdma\nnics: [rxe0]\n"
		 "module: require\ncuda_library: %s\n",
		 "/nonexistent/libcuda.so.1");
	path = write_config(yaml);
	ASSERT_NE(NULL, path);
	fds = fds_open();
	devs = fds_named("/dev/");
	maps = maps_contain("/dev/");
	EXPECT_EQ(1, kvdmabuf_gate(path, reason, sizeof(reason)));
	EXPECT_EQ(fds, fds_open());
	EXPECT_EQ(devs, fds_named("/dev/"));
	EXPECT_EQ(maps, maps_contain("/dev/"));
	EXPECT_EQ(0, maps_contain("libcuda"));
	EXPECT_EQ(0, fds_named("/dev/infiniband"));
	EXPECT_EQ(0, fds_named("/dev/kvdmabuf"));
	unlink(path);
}

TEST_HARNESS_MAIN
