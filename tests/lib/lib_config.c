// SPDX-License-Identifier: MIT
/*
 * lib_config - the YAML config (every key, malformed YAML and unknown keys
 * reported with line and column) and the sleep gate as a table: rdma and
 * tcp accepted, any other protocol refused, MC_FORCE_MNNVL /
 * MC_INTRANODE_NVLINK / MC_INTRA_NVLINK set to any value refused, no
 * config named the built-in defaults, a named config missing an error
 * naming the variable and the path; the gate loads no CUDA library and
 * opens no device. Host-only.
 */
#include <locale.h>

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
	{ "protocol: rdma\nprefetch_at_wake: yes\n", -EINVAL,
	  "t.yaml:2:19: 'prefetch_at_wake' must be off or on" },
	{ "drain_timeout_s: 3\n", -EINVAL, "missing key 'protocol'" },
	{ "protocol: rdma\nnics: {a: b}\n", -EINVAL, "'nics' must be" },
	{ "protocol: rdma\n---\nprotocol: tcp\n", -EINVAL,
	  "only one YAML document" },
	{ "protocol: rdma\nnics: [n0, n1, n2, n3, n4, n5, n6, n7, n8, n9, n10, n11, n12, n13, n14, n15, n16, n17, n18, n19, n20, n21, n22, n23, n24, n25, n26, n27, n28, n29, n30, n31, n32, n33, n34, n35, n36, n37, n38, n39, n40, n41, n42, n43, n44, n45, n46, n47, n48, n49, n50, n51, n52, n53, n54, n55, n56, n57, n58, n59, n60, n61, n62, n63, n64]\n",
	  -EINVAL, "more than 64 nics" },
	{ "protocol:\n", -EINVAL, "'protocol' must not be empty" },
	{ "protocol: [rdma]\n", -EINVAL, "t.yaml:1:11: 'protocol' must be a "
	  "scalar" },
	{ "protocol: rdma\nkv_regions: 0x1000+0x1000\n", 0, NULL },
	{ "protocol: rdma\nkv_regions: [0x1000+x]\n", -EINVAL,
	  "t.yaml:2:14: 'kv_regions' entry '0x1000+x' is not ADDR+LEN[:TAG]" },
	{ "protocol: rdma\nkv_regions: [0x1000+0]\n", -EINVAL,
	  "'kv_regions' entry '0x1000+0' is not" },
	{ "protocol: rdma\nkv_regions: [0xfffffffffffff000+0x2000]\n", -EINVAL,
	  "is not ADDR+LEN[:TAG]" },
	{ "protocol: rdma\nkv_regions: ['0x1000+0x1000:']\n", -EINVAL,
	  "is not ADDR+LEN[:TAG]" },
	{ "protocol: rdma\nkv_regions: [0x1000+0x2000, 0x2000+0x1000]\n",
	  -EINVAL, "t.yaml:2:29: 'kv_regions' entry 0x2000+0x1000 overlaps "
	  "entry 1" },
	{ "protocol: rdma\nkv_regions: {a: b}\n", -EINVAL,
	  "'kv_regions' entries must be ADDR+LEN[:TAG] strings" },
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
		"prefetch_at_wake: on\n"
		"cuda_library: /opt/x/libcuda.so.1\n"
		"kv_regions:\n"
		"  - 0x7e0000000000+0x40000000:kv_cache\n"
		"  - 4096+8192\n";
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
	EXPECT_EQ(1, c.prefetch_at_wake);
	EXPECT_EQ(0, strcmp(c.cuda_library, "/opt/x/libcuda.so.1"));
	ASSERT_EQ(2u, c.nr_kv_regions);
	EXPECT_EQ(0x7e0000000000ull, c.kv_regions[0].addr);
	EXPECT_EQ(0x40000000ull, c.kv_regions[0].len);
	EXPECT_EQ(0, strcmp(c.kv_regions[0].tag, "kv_cache"));
	EXPECT_EQ(4096ull, c.kv_regions[1].addr);
	EXPECT_EQ(8192ull, c.kv_regions[1].len);
	EXPECT_EQ(0, strcmp(c.kv_regions[1].tag, ""));
}

TEST(config_defaults)
{
	struct kvd_config c;
	char err[256];

	ASSERT_EQ(0, kvd_config_parse("protocol: tcp\n", 14, "t.yaml", &c,
				      err, sizeof(err)));
	EXPECT_EQ(KVDMABUF_DRAIN_TIMEOUT_S_DEFAULT * 1000u, c.drain_timeout_ms);
	EXPECT_EQ(KVDMABUF_MODULE_AUTO, c.module);
	EXPECT_EQ(0, c.prefetch_at_wake);
	EXPECT_EQ(0u, c.nr_nics);
	EXPECT_EQ('\0', c.cuda_library[0]);
}

/* Every variable the gate reads; cleared before each case. */
static const char *const gate_env[] = {
	"MC_FORCE_MNNVL", "MC_INTRANODE_NVLINK", "MC_INTRA_NVLINK",
	"MC_FORCE_MNNVL_X", "SGLANG_MOONCAKE_CUSTOM_MEM_POOL", "UCX_TLS",
	"MC_ENABLE_MNNVL", "MOONCAKE_PROTOCOL",
};

struct gate_case {
	const char *protocol;
	const char *transport; /* config key, or NULL */
	const char *env;       /* variable set for this case, or NULL */
	const char *value;
	int verdict;
};

static const struct gate_case gates[] = {
	{ "rdma", NULL, NULL, NULL, 1 },
	{ "tcp", NULL, NULL, NULL, 1 },
	{ "nvlink", NULL, NULL, NULL, 0 },
	{ "nvlink_intra", NULL, NULL, NULL, 0 },
	{ "RDMA", NULL, NULL, NULL, 1 },       /* names in any case */
	{ "Tcp", NULL, NULL, NULL, 1 },
	{ "efa", NULL, NULL, NULL, 0 },
	{ "rdma", NULL, "MC_FORCE_MNNVL", "1", 0 },
	{ "rdma", NULL, "MC_FORCE_MNNVL", "0", 0 },
	{ "rdma", NULL, "MC_INTRANODE_NVLINK", "", 0 },
	{ "rdma", NULL, "MC_INTRA_NVLINK", "false", 0 },
	{ "tcp", NULL, "MC_INTRA_NVLINK", "0", 0 },
	{ "tcp", NULL, "MC_FORCE_MNNVL_X", "1", 1 },  /* only the exact names */
	{ "rdma", NULL, "SGLANG_MOONCAKE_CUSTOM_MEM_POOL", "NVLINK", 0 },
	{ "rdma", NULL, "SGLANG_MOONCAKE_CUSTOM_MEM_POOL", "intra_node_nvlink",
	  0 },
	{ "rdma", NULL, "SGLANG_MOONCAKE_CUSTOM_MEM_POOL", "BAREX", 1 },
	/* the older boolean form meant the NVLink pool */
	{ "rdma", NULL, "SGLANG_MOONCAKE_CUSTOM_MEM_POOL", "True", 0 },
	{ "rdma", NULL, "SGLANG_MOONCAKE_CUSTOM_MEM_POOL", "1", 0 },
	{ "rdma", NULL, "SGLANG_MOONCAKE_CUSTOM_MEM_POOL", "false", 1 },
	/* Mooncake's TENT engine exports cuMemCreate memory to peers */
	{ "rdma", NULL, "MC_ENABLE_MNNVL", "1", 0 },
	{ "tcp", NULL, "MC_ENABLE_MNNVL", "0", 0 },
	{ "rdma", NULL, "MOONCAKE_PROTOCOL", "nvlink", 0 },
	{ "rdma", NULL, "MOONCAKE_PROTOCOL", "NVLINK_INTRA", 0 },
	{ "rdma", NULL, "MOONCAKE_PROTOCOL", "rdma", 1 },
	/* UCX: unset UCX_TLS means every transport, cuda_ipc included */
	{ "rdma", "ucx", NULL, NULL, 0 },
	{ "rdma", "nixl", NULL, NULL, 0 },
	{ "rdma", "UCX", "UCX_TLS", "rc,cuda_copy", 1 },
	{ "rdma", "ucx", "UCX_TLS", "rc,cuda_ipc", 0 },
	{ "rdma", "ucx", "UCX_TLS", "rc,CUDA", 0 },
	{ "rdma", "ucx", "UCX_TLS", "all", 0 },
	{ "rdma", "ucx", "UCX_TLS", "^cuda_ipc", 1 },
	{ "rdma", "ucx", "UCX_TLS", "^tcp", 0 },
	{ "rdma", "ucx", "UCX_TLS", "rc,cuda_ipcx", 1 },
	{ "rdma", "mooncake", "UCX_TLS", "cuda_ipc", 1 }, /* not UCX */
};

TEST(gate_table)
{
	char yaml[256], reason[512];
	const char *path;
	size_t i, j;
	int v;

	for (i = 0; i < sizeof(gates) / sizeof(gates[0]); i++) {
		for (j = 0; j < sizeof(gate_env) / sizeof(gate_env[0]); j++)
			unsetenv(gate_env[j]);
		if (gates[i].env)
			setenv(gates[i].env, gates[i].value, 1);
		snprintf(yaml, sizeof(yaml), "protocol: %s\n%s%s%s",
			 gates[i].protocol,
			 gates[i].transport ? "transport: " : "",
			 gates[i].transport ?: "",
			 gates[i].transport ? "\n" : "");
		path = write_config(yaml);
		ASSERT_NE(NULL, path);
		v = kvdmabuf_gate(path, reason, sizeof(reason));
		TH_LOG("protocol %s, transport %s, %s=%s: %d %s",
		       gates[i].protocol, gates[i].transport ?: "-",
		       gates[i].env ?: "-", gates[i].value ?: "-", v, reason);
		EXPECT_EQ(gates[i].verdict, v);
		if (gates[i].env && !v)
			EXPECT_NE(NULL, strstr(reason, gates[i].env));
		unlink(path);
	}
	for (j = 0; j < sizeof(gate_env) / sizeof(gate_env[0]); j++)
		unsetenv(gate_env[j]);
}

/*
 * Numbers in the config are read the same in every locale: a German
 * LC_NUMERIC (decimal comma) must not turn 2.5 s into an error. The
 * locale is compiled here (localedef) from the `locales` package.
 */
TEST(numbers_ignore_the_locale)
{
	static const char y[] = "protocol: rdma\ndrain_timeout_s: 2.5\n";
	char dir[] = "/tmp/kvd-locale.XXXXXX", cmd[256];
	struct kvd_config c;
	char err[256];

	ASSERT_NE(NULL, mkdtemp(dir));
	snprintf(cmd, sizeof(cmd), "localedef -i de_DE -f UTF-8 "
		 "%s/de_DE.UTF-8 2>/dev/null", dir);
	ASSERT_EQ(0, system(cmd));
	setenv("LOCPATH", dir, 1);
	ASSERT_NE(NULL, setlocale(LC_NUMERIC, "de_DE.UTF-8"));
	ASSERT_EQ(2.5, strtod("2,5", NULL));   /* the locale is in effect */
	EXPECT_EQ(0, kvd_config_parse(y, strlen(y), "t.yaml", &c, err,
				      sizeof(err)));
	TH_LOG("%s", err);
	EXPECT_EQ(2500u, c.drain_timeout_ms);
	setlocale(LC_NUMERIC, "C");
	snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
	EXPECT_EQ(0, system(cmd));
}

/* No file named at all: the built-in defaults, no file needed. */
TEST(no_config_named_means_the_defaults)
{
	struct kvd_config c;
	char reason[512];

	unsetenv(KVDMABUF_CONFIG_ENV);
	ASSERT_EQ(0, kvd_config_load(NULL, &c, reason, sizeof(reason)));
	EXPECT_EQ(KVD_PROTO_RDMA, c.proto);
	EXPECT_EQ(KVDMABUF_MODULE_AUTO, c.module);
	EXPECT_EQ(KVDMABUF_DRAIN_TIMEOUT_S_DEFAULT * 1000u, c.drain_timeout_ms);
	EXPECT_EQ(0u, c.nr_nics);
	EXPECT_NE(NULL, strstr(c.path, "built-in defaults"));
	EXPECT_EQ(1, kvdmabuf_gate(NULL, reason, sizeof(reason)));
	TH_LOG("%s", reason);
	setenv(KVDMABUF_CONFIG_ENV, "", 1);
	EXPECT_EQ(1, kvdmabuf_gate(NULL, reason, sizeof(reason)));
	/* the gate still reads the environment */
	setenv("MC_FORCE_MNNVL", "1", 1);
	EXPECT_EQ(0, kvdmabuf_gate(NULL, reason, sizeof(reason)));
	unsetenv("MC_FORCE_MNNVL");
	unsetenv(KVDMABUF_CONFIG_ENV);
}

/* A file named but missing is an error naming where the name came from. */
TEST(gate_missing_config_names_variable_and_path)
{
	char reason[512];

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

/*
 * KVDMABUF_<KEY> over the file: a rank's NIC without a file per rank. The
 * variable wins, a list replaces the file's, values are checked as in a
 * file (an error names the variable), and the path says which keys came
 * from the environment; with no file, over the defaults.
 */
TEST(environment_over_the_file)
{
	const char *f = write_config("protocol: rdma\nnics: [a0, a1]\n"
				     "module: require\n");
	struct kvd_config c;
	char err[512];

	setenv(KVDMABUF_CONFIG_ENV, f, 1);
	setenv("KVDMABUF_NICS", "mlx5_3", 1);
	setenv("KVDMABUF_DRAIN_TIMEOUT_S", "2.5", 1);
	ASSERT_EQ(0, kvd_config_load(NULL, &c, err, sizeof(err)));
	EXPECT_EQ(1u, c.nr_nics);
	EXPECT_EQ(0, strcmp("mlx5_3", c.nics[0]));
	EXPECT_EQ(2500u, c.drain_timeout_ms);
	EXPECT_EQ(KVDMABUF_MODULE_REQUIRE, c.module);
	TH_LOG("%s", c.path);
	EXPECT_NE(NULL, strstr(c.path, f));
	EXPECT_NE(NULL, strstr(c.path,
			       "$KVDMABUF_NICS, KVDMABUF_DRAIN_TIMEOUT_S"));

	setenv("KVDMABUF_NICS", "[mlx5_2, mlx5_3]", 1);
	ASSERT_EQ(0, kvd_config_load(NULL, &c, err, sizeof(err)));
	EXPECT_EQ(2u, c.nr_nics);
	EXPECT_EQ(0, strcmp("mlx5_3", c.nics[1]));

	setenv("KVDMABUF_MODULE", "sometimes", 1);
	EXPECT_EQ(-EINVAL, kvd_config_load(NULL, &c, err, sizeof(err)));
	TH_LOG("%s", err);
	EXPECT_NE(NULL, strstr(err, "KVDMABUF_MODULE:1:"));
	EXPECT_NE(NULL, strstr(err, "'module' must be auto, require or off"));
	unsetenv("KVDMABUF_MODULE");
	unsetenv("KVDMABUF_NICS");
	unsetenv("KVDMABUF_DRAIN_TIMEOUT_S");
	unlink(f);

	unsetenv(KVDMABUF_CONFIG_ENV);
	setenv("KVDMABUF_PROTOCOL", "tcp", 1);
	ASSERT_EQ(0, kvd_config_load(NULL, &c, err, sizeof(err)));
	EXPECT_EQ(KVD_PROTO_TCP, c.proto);
	EXPECT_NE(NULL, strstr(c.path, "built-in defaults"));
	EXPECT_NE(NULL, strstr(c.path, "$KVDMABUF_PROTOCOL"));
	EXPECT_EQ(1, kvdmabuf_gate(NULL, NULL, 0));
	unsetenv("KVDMABUF_PROTOCOL");
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
