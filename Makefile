# SPDX-License-Identifier: GPL-2.0
# kvdmabuf: helper module, user library and tests.
#
#   make                      library (shared + static), module(s), tests
#   make check                everything: host unit tests + VM suite on every kernel lane
#   make check-unit           host-only tests, no VM
#   make mutants              breakages the tests must catch (tests/mutants)
#   make mutants-random       mechanical breakages of lib/ nobody chose
#   make update-counts        tests/vm/expected-counts from build/logs
#   make check-vm KERNEL=6.1  VM suite on one lane (6.1 = Debian 12, 6.12 = Debian 13,
#                             7.3 = Debian 13 + trixie-backports kernel, debug)
#   make demo / make bench    the demonstration and the benchmarks
#   make modules KDIR=...     only the kernel modules, against a kernel build tree
#   make install / uninstall  library, command, Python package, man pages, udev rule
#
# V=1 shows the commands.

# The version is the public header's (KVDMABUF_VERSION_*).
VERSION := $(shell awk '/define KVDMABUF_VERSION_(MAJOR|MINOR|PATCH) / \
	{ v = v (v == "" ? "" : ".") $$3 } END { print v }' lib/kvdmabuf.h)
VERSION_MAJOR := $(firstword $(subst ., ,$(VERSION)))

ifeq ($(V),1)
Q :=
else
Q := @
endif

# The kernel the modules are built for: the running kernel when its build tree
# is installed (a real GPU node), otherwise the newest Debian 12 (6.1) headers
# (a machine whose running kernel cannot load modules, like the CI machines).
KDIR ?= $(firstword $(wildcard /lib/modules/$(shell uname -r)/build) \
	  $(lastword $(sort $(wildcard /lib/modules/6.1.*-amd64/build))))

CC ?= cc
AR ?= ar
KERNEL ?= 6.1

CFLAGS ?= -O2 -g
override CFLAGS += -std=c11 -Wall -Wextra -Werror -fPIC
# -Ilib first: <kvdmabuf.h> is the library's public header, as installed;
# the uapi header is included by path (installed as <linux/kvdmabuf.h>).
override CPPFLAGS += -D_GNU_SOURCE -Ilib -Iuapi -Itests -I/usr/include/libdrm
# The library needs libibverbs; libyaml (configuration text) and libdrm
# (DRM regions) are loaded at first use (lib/syslib.c). The tests' vgem
# helpers call libdrm themselves.
LIB_LDLIBS := -libverbs -lpthread -ldl
LDLIBS := $(LIB_LDLIBS) -ldrm

# The CUDA toolkit, where one is installed (nvcc on PATH, or CUDA_HOME):
# tests/lib/cuda_abi checks lib/cuda_api.h against its cuda.h, the fake libcuda
# and tests/hw are built against that cuda.h, and the tests load its stub
# libcuda.so. Without it (or with CUDA_HOME= empty) they use the project's
# declarations and the toolkit's tests skip; the library never needs it.
NVCC_PATH := $(shell command -v nvcc 2>/dev/null)
CUDA_HOME ?= $(if $(NVCC_PATH),$(patsubst %/bin/,%,$(dir $(realpath $(NVCC_PATH)))),/usr/local/cuda)
CUDA_H := $(if $(CUDA_HOME),$(firstword $(wildcard $(CUDA_HOME)/include/cuda.h \
	$(CUDA_HOME)/targets/*/include/cuda.h)))
CUDA_STUB := $(if $(CUDA_H),$(firstword $(wildcard $(CUDA_HOME)/lib64/stubs/libcuda.so \
	$(CUDA_HOME)/lib/stubs/libcuda.so $(CUDA_HOME)/targets/*/lib/stubs/libcuda.so)))
CUDA_CPPFLAGS := $(if $(CUDA_H),-DKVD_HAVE_CUDA_H -I$(patsubst %/,%,$(dir $(CUDA_H)))) \
	$(if $(CUDA_STUB),-DKVD_CUDA_STUB='"$(CUDA_STUB)"')
# What is built with CUDA_CPPFLAGS depends on them: rebuilt when a toolkit
# comes or goes.
CUDA_STAMP := tests/cuda.flags
ifneq ($(wildcard $(CUDA_STAMP))-$(file <$(CUDA_STAMP)),$(CUDA_STAMP)-$(strip $(CUDA_CPPFLAGS)))
$(file >$(CUDA_STAMP),$(strip $(CUDA_CPPFLAGS)))
endif

LIB_SRCS := $(sort $(wildcard lib/*.c))
LIB_OBJS := $(LIB_SRCS:.c=.o)
LIB_HDRS := $(wildcard lib/*.h uapi/*.h)
LIB_A := lib/libkvdmabuf.a
LIB_SO := lib/libkvdmabuf.so.$(VERSION)
LIB_SONAME := libkvdmabuf.so.$(VERSION_MAJOR)
LIB_MAP := $(wildcard lib/libkvdmabuf.map)
PRELOAD_SO := lib/libkvdmabuf-preload.so
PRELOAD_MAP := lib/preload/libkvdmabuf-preload.map
# The toolkit's CUDA runtime, where there is one (tests/preload/cudart_probe).
CUDART := $(if $(CUDA_H),$(firstword $(wildcard $(CUDA_HOME)/lib64/libcudart.so \
	$(CUDA_HOME)/targets/*/lib/libcudart.so)))
PRELOAD_TESTS := tests/preload/symver tests/preload/fake/libibverbs.so.1 \
	tests/preload/fake/libmlx5.so.1 \
	tests/preload/dlopen_engine tests/preload/verbs_ext.so \
	$(if $(wildcard tests/fake_cuda/*.c),tests/preload/two_interposers) \
	tests/preload/other_interposer.so \
	tests/preload/other_dlsym.so tests/preload/other_dlsym_glibc.so \
	tests/preload/nodlsym/libkvdmabuf-preload.so \
	$(if $(wildcard tests/fake_cuda/*.c),tests/preload/cuda_engine) \
	$(if $(wildcard tests/fake_cuda/*.c),tests/preload/tms_engine tests/preload/tms_standin.so) \
	tests/preload/local_cuda \
	$(if $(CUDART),tests/preload/cudart_probe)

# The test programs, one folder per part under test (README.md, Layout):
# every .c of module/, rxe/, lib/, harness/ and vm/; in preload/ and demo/,
# whose other .c are the helpers' and the demo's own, the preload_* and
# demo_* ones.
TEST_PARTS := module rxe lib harness vm
TEST_SRCS := $(sort $(wildcard $(TEST_PARTS:%=tests/%/*.c) tests/preload/preload_*.c \
	tests/demo/demo_*.c))
TEST_BINS := $(TEST_SRCS:.c=)
# Hardware tests (tests/hw): built with the tests, run by hand on a GPU node.
HW_SRCS := $(sort $(wildcard tests/hw/*.c))
HW_BINS := $(HW_SRCS:.c=)
# Built with the toolkit's cuda.h where there is one (CUDA_CPPFLAGS above).
CUDA_TESTS := tests/lib/cuda_abi tests/lib/lib_cuda
$(CUDA_TESTS) $(HW_BINS) $(CUDA_TESTS:tests/%=tests/asan/%): override CPPFLAGS += $(CUDA_CPPFLAGS)
FAKE_CUDA_SRCS := $(wildcard tests/fake_cuda/*.c)
FAKE_CUDA := $(if $(FAKE_CUDA_SRCS),tests/fake_cuda/libcuda.so.1)
# The same as a driver before CUDA 11.7 (no cuMemGetHandleForAddressRange).
FAKE_CUDA_OLD := $(if $(FAKE_CUDA_SRCS),tests/fake_cuda/old/libcuda.so.1)
DEMO_SRCS := $(sort $(filter-out $(TEST_SRCS),$(wildcard tests/demo/*.c)))
DEMO := $(if $(DEMO_SRCS),tests/demo/kvdmabuf-demo)
# The two-node demo (make demo NODES=2): one program, engine A or B.
TWONODE_SRCS := $(sort $(wildcard tests/twonode/*.c))
TWONODE := $(if $(TWONODE_SRCS),tests/twonode/kvdmabuf-twonode)
BENCH_SRCS := $(wildcard tests/bench/kvdmabuf-bench.c)
BENCH := $(if $(BENCH_SRCS),tests/bench/kvdmabuf-bench)
# What libkvdmabuf-preload.so adds per call (host, stand-ins; make bench).
PRELOAD_BENCH := $(if $(wildcard tests/bench/preload-bench.c),tests/bench/preload-bench)
# What a batch of range changes of an elastic pool costs (VM; make bench).
RANGES_BENCH := $(if $(wildcard tests/bench/ranges-bench.c),tests/bench/ranges-bench)
CYCLES ?= 3

.PHONY: all lib cli tests asan modules rxe dkms-src deb clean check check-unit check-vm demo demo-2node demo-mooncake bench deps fuzz \
	install uninstall modules_install mutants mutants-random mutant-modules mutant-trees update-counts

all: lib cli tests modules rxe $(if $(MUTANT_TREES),mutant-modules mutant-trees)

lib: $(LIB_A) $(LIB_SO) $(PRELOAD_SO)

# The interposer an unmodified transfer engine runs under
# (LD_PRELOAD=libkvdmabuf-preload.so, lib/README.md): standalone, no
# libkvdmabuf or libibverbs linked in (it forwards with dlvsym).
# preload_cuda.c: the CUDA driver's cuMemUnmap/cuMemMap/cuMemSetAccess and
# cuGetProcAddress (declared by lib/cuda_api.h; libcuda is never linked).
# lib/config.c: the library's own YAML parser, for kv_regions and
# cuda_dmabuf_mapping of $KVDMABUF_CONFIG (libyaml is the preload's one
# dependency); lib/cuda_export.c: the library's CUDA export, the same code;
# lib/proc_start.c: a process's start time (its state file).
PRELOAD_SRCS := $(sort $(wildcard lib/preload/*.c)) lib/config.c lib/cuda_export.c \
	lib/proc_start.c lib/syslib.c
$(PRELOAD_SO): $(PRELOAD_SRCS) $(wildcard lib/preload/*.h) lib/kvdmabuf_preload.h \
		lib/cuda_api.h lib/cuda_export.h lib/internal.h lib/kvdmabuf.h $(PRELOAD_MAP)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(CPPFLAGS) $(CFLAGS) -shared -Wl,-z,defs \
		-Wl,--version-script=$(PRELOAD_MAP) -o $@ $(PRELOAD_SRCS) \
		-lpthread -lm -ldl

# The preload as built for other architectures than x86-64 (dlsym and
# dlvsym not interposed), for tests/preload/preload_cuda on this one.
tests/preload/nodlsym/libkvdmabuf-preload.so: $(PRELOAD_SRCS) $(wildcard lib/preload/*.h) \
		lib/kvdmabuf_preload.h lib/cuda_api.h lib/cuda_export.h lib/internal.h lib/kvdmabuf.h $(PRELOAD_MAP)
	@$(if $(Q),echo "  LD      $@")
	$(Q)mkdir -p $(@D)
	$(Q)$(CC) $(CPPFLAGS) -DKVD_PRELOAD_NO_DLSYM $(CFLAGS) -shared -Wl,-z,defs \
		-Wl,--version-script=$(PRELOAD_MAP) -o $@ $(PRELOAD_SRCS) \
		-lpthread -lm -ldl

# The admin's command, built from lib/ and installed with the library.
CLI_SRCS := $(sort $(wildcard lib/cli/*.c))
CLI := lib/cli/kvdmabuf
cli: $(CLI)

$(CLI): $(CLI_SRCS) $(wildcard lib/cli/*.h) $(LIB_A) $(LIB_HDRS)
	@$(if $(Q),echo "  CC      $@")
	$(Q)$(CC) $(CPPFLAGS) $(CFLAGS) -o $@ $(CLI_SRCS) $(LIB_A) $(LDLIBS)

# lib_cuda runs the command (kvdmabuf check).
tests: $(TEST_BINS) $(HW_BINS) $(FAKE_CUDA) $(FAKE_CUDA_OLD) $(DEMO) $(TWONODE) $(BENCH) $(PRELOAD_BENCH) $(RANGES_BENCH) $(CLI) \
	$(PRELOAD_TESTS)

# tests/preload/preload_symver.py: a program built against the real libibverbs,
# run under the preload with a stand-in libibverbs (the same versions).
tests/preload/symver: tests/preload/symver.c lib/kvdmabuf_preload.h
	@$(if $(Q),echo "  CC      $@")
	$(Q)$(CC) $(CPPFLAGS) $(CFLAGS) -o $@ $< -libverbs -ldl
tests/preload/verbs_ext.so: tests/preload/verbs_ext.c
	@$(if $(Q),echo "  CC      $@")
	$(Q)$(CC) $(CPPFLAGS) $(CFLAGS) -fPIC -shared -o $@ $< -libverbs
# Another cuMemUnmap interposer, and an engine that runs under both.
tests/preload/other_interposer.so: tests/preload/other_interposer.c
	@$(if $(Q),echo "  CC      $@")
	$(Q)$(CC) $(CFLAGS) -fPIC -shared -o $@ $< -ldl
# Another dlsym interposer: one that hands lookups on, one that goes to glibc.
tests/preload/other_dlsym.so: tests/preload/other_dlsym.c
	@$(if $(Q),echo "  CC      $@")
	$(Q)$(CC) $(CFLAGS) -fPIC -shared -o $@ $< -ldl
tests/preload/other_dlsym_glibc.so: tests/preload/other_dlsym.c
	@$(if $(Q),echo "  CC      $@")
	$(Q)$(CC) $(CFLAGS) -DTO_GLIBC -fPIC -shared -o $@ $< -ldl
tests/preload/two_interposers: tests/preload/two_interposers.c $(FAKE_CUDA)
	@$(if $(Q),echo "  CC      $@")
	$(Q)$(CC) $(CPPFLAGS) $(CFLAGS) -o $@ $< -Ltests/fake_cuda -l:libcuda.so.1 -ldl
# An engine that loads libibverbs itself (RTLD_LOCAL) and looks it up on its handle.
tests/preload/dlopen_engine: tests/preload/dlopen_engine.c lib/kvdmabuf_preload.h
	@$(if $(Q),echo "  CC      $@")
	$(Q)$(CC) $(CPPFLAGS) $(CFLAGS) -o $@ $< -ldl
# tests/preload/preload_cuda runs it under LD_PRELOAD: an engine linked with -lcuda
# (the fake libcuda's soname), against the toolkit's cuda.h where found.
# torch_memory_saver's stand-in (an LD_PRELOAD of its own, linked with
# -lcuda) and an SGLang-shaped engine run under it and the preload.
tests/preload/tms_standin.so: tests/preload/tms_standin.c $(FAKE_CUDA) tests/cuda_compat.h $(CUDA_STAMP)
	@$(if $(Q),echo "  CC      $@")
	$(Q)$(CC) $(CPPFLAGS) $(CUDA_CPPFLAGS) $(CFLAGS) -fPIC -shared -o $@ $< \
		-Ltests/fake_cuda -l:libcuda.so.1
tests/preload/tms_engine: tests/preload/tms_engine.c $(FAKE_CUDA) lib/kvdmabuf_preload.h \
		tests/cuda_compat.h $(CUDA_STAMP)
	@$(if $(Q),echo "  CC      $@")
	$(Q)$(CC) $(CPPFLAGS) $(CUDA_CPPFLAGS) $(CFLAGS) -o $@ $< \
		-Ltests/fake_cuda -l:libcuda.so.1 -ldl
tests/preload/cuda_engine: tests/preload/cuda_engine.c $(FAKE_CUDA) lib/kvdmabuf_preload.h \
		lib/cuda_api.h tests/cuda_compat.h $(CUDA_STAMP)
	@$(if $(Q),echo "  CC      $@")
	$(Q)$(CC) $(CPPFLAGS) $(CUDA_CPPFLAGS) $(CFLAGS) -o $@ $< \
		-Ltests/fake_cuda -l:libcuda.so.1 -ldl
tests/preload/local_cuda: tests/preload/local_cuda.c
	@$(if $(Q),echo "  CC      $@")
	$(Q)$(CC) $(CPPFLAGS) $(CFLAGS) -o $@ $< -ldl
tests/preload/cudart_probe: tests/preload/cudart_probe.c $(CUDA_STAMP)
	@$(if $(Q),echo "  CC      $@")
	$(Q)$(CC) $(CPPFLAGS) $(CUDA_CPPFLAGS) $(CFLAGS) -o $@ $< -L$(dir $(CUDART)) \
		-lcudart -Wl,-rpath,$(patsubst %/,%,$(dir $(CUDART))) -ldl
tests/preload/fake/libibverbs.so.1: tests/preload/fake_ibverbs.c tests/preload/fake_ibverbs.map
	@$(if $(Q),echo "  CC      $@")
	$(Q)mkdir -p $(@D)
	$(Q)$(CC) $(CFLAGS) -shared -Wl,-soname,libibverbs.so.1 \
		-Wl,--version-script=tests/preload/fake_ibverbs.map -o $@ $<
# A stand-in libmlx5 (mlx5dv_reg_dmabuf_mr), on the stand-in libibverbs.
tests/preload/fake/libmlx5.so.1: tests/preload/fake_mlx5.c tests/preload/fake_mlx5.map \
		tests/preload/fake/libibverbs.so.1
	@$(if $(Q),echo "  CC      $@")
	$(Q)$(CC) $(CFLAGS) -shared -Wl,-soname,libmlx5.so.1 \
		-Wl,--version-script=tests/preload/fake_mlx5.map -o $@ $< \
		-Ltests/preload/fake -l:libibverbs.so.1

# tests/preload/preload_cuda dlopen()s the preload, the fake libcuda and the fake
# libibverbs, in that order: linked with neither libkvdmabuf nor libibverbs
# (a real libibverbs loaded first would take the preload's forwarding).
# What it runs is built with it (order-only), so that it runs when built alone.
PRELOAD_CUDA_DEPS := tests/harness.h lib/kvdmabuf_preload.h lib/cuda_api.h \
	| $(PRELOAD_SO) $(FAKE_CUDA) $(PRELOAD_TESTS)
tests/preload/preload_cuda: tests/preload/preload_cuda.c $(PRELOAD_CUDA_DEPS)
	@$(if $(Q),echo "  CC      $@")
	$(Q)$(CC) $(CPPFLAGS) $(CFLAGS) -o $@ $< -ldl -lpthread
tests/asan/preload/preload_cuda: tests/preload/preload_cuda.c $(PRELOAD_CUDA_DEPS) \
		tests/asan/libkvdmabuf-preload.so
	@$(if $(Q),echo "  CC      $@ (asan)")
	$(Q)mkdir -p $(@D)
	$(Q)$(CC) $(CPPFLAGS) $(CFLAGS) $(ASAN_FLAGS) \
		-DKVD_PRELOAD_UNDER_TEST='"tests/asan/libkvdmabuf-preload.so"' \
		-o $@ $< -ldl -lpthread
tests/tsan/preload/preload_cuda: tests/preload/preload_cuda.c $(PRELOAD_CUDA_DEPS) \
		tests/tsan/libkvdmabuf-preload.so
	@$(if $(Q),echo "  CC      $@ (tsan)")
	$(Q)mkdir -p $(@D)
	$(Q)$(CC) $(CPPFLAGS) $(CFLAGS) $(TSAN_FLAGS) \
		-DKVD_PRELOAD_UNDER_TEST='"tests/tsan/libkvdmabuf-preload.so"' \
		-o $@ $< -ldl -lpthread

# The preload itself under AddressSanitizer + UBSan and under
# ThreadSanitizer, for the twins of preload_cuda above (dlopen()ed in their
# process: a sanitizer's runtime must be loaded first, so they are never
# LD_PRELOADed into plain programs).
tests/asan/libkvdmabuf-preload.so tests/tsan/libkvdmabuf-preload.so: \
		$(PRELOAD_SRCS) $(wildcard lib/preload/*.h) lib/kvdmabuf_preload.h \
		lib/cuda_api.h lib/cuda_export.h lib/internal.h lib/kvdmabuf.h $(PRELOAD_MAP)
	@$(if $(Q),echo "  LD      $@")
	$(Q)mkdir -p $(@D)
	$(Q)$(CC) $(CPPFLAGS) $(CFLAGS) $(if $(findstring tsan,$@),$(TSAN_FLAGS),$(ASAN_FLAGS)) \
		-shared -Wl,--version-script=$(PRELOAD_MAP) -o $@ $(PRELOAD_SRCS) \
		-lpthread -lm -ldl

# tests/preload/preload_lib: the library (linked) under the preload and the fake
# libcuda (dlopen()ed): built with what it loads.
tests/preload/preload_lib tests/asan/preload/preload_lib: | $(PRELOAD_SO) $(FAKE_CUDA)

lib/%.o: lib/%.c $(LIB_HDRS)
	@$(if $(Q),echo "  CC      $@")
	$(Q)$(CC) $(CPPFLAGS) $(CFLAGS) -fvisibility=default -c -o $@ $<

$(LIB_A): $(LIB_OBJS)
	@$(if $(Q),echo "  AR      $@")
	$(Q)rm -f $@ && $(AR) rcs $@ $^

$(LIB_SO): $(LIB_OBJS) $(LIB_MAP)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) -shared -Wl,-soname,$(LIB_SONAME) -Wl,-z,defs \
		$(if $(LIB_MAP),-Wl$(comma)--version-script=$(LIB_MAP)) \
		-o $@ $(LIB_OBJS) $(LIB_LDLIBS)
	$(Q)ln -sf $(notdir $@) lib/$(LIB_SONAME)
	$(Q)ln -sf $(LIB_SONAME) lib/libkvdmabuf.so

comma := ,

tests/%: tests/%.c tests/harness.h $(LIB_A) $(LIB_HDRS) \
		$(wildcard tests/*.h tests/kmod/*.h tests/preload/*.h)
	@$(if $(Q),echo "  CC      $@")
	$(Q)$(CC) $(CPPFLAGS) $(CFLAGS) -o $@ $< $(LIB_A) $(LDLIBS)

# demo_verdict includes the demo's report.c (its verdict on made-up results).
tests/demo/demo_verdict tests/asan/demo/demo_verdict: tests/demo/report.c tests/demo/demo.h

# The *_umem programs are their base program's .c with another importer.
UMEM_VARIANTS := $(foreach t,$(filter tests/%_umem,$(TEST_BINS)),$(if \
	$(wildcard $(t:_umem=).c),$(t)))
$(UMEM_VARIANTS): tests/%_umem: tests/%.c

# Host tests again with the library compiled in under AddressSanitizer and
# UBSan (make check-unit runs them): use-after-free, leaks, overflows.
# Every C program of tests/unit.list, and harness_sample, which
# harness_selftest runs; each test's child runs LeakSanitizer before it
# ends (tests/harness.h). The programs find what they run (the fake
# libcuda, the VM judge, the command) from the top of the build tree
# (kvd_build_path(), tests/harness.h), as the plain ones do.
UNIT_C_TESTS := $(filter-out asan/% tsan/% %.py %.sh,$(shell sed 's/\#.*//' tests/unit.list))
ASAN_TESTS := $(addprefix tests/asan/,$(UNIT_C_TESTS) harness/harness_sample)
ASAN_FLAGS := -fsanitize=address,undefined -fno-sanitize-recover=all \
	-fno-omit-frame-pointer
# ThreadSanitizer: the preload's locking, from engine threads at once
# (tests/preload/preload_cuda's stress test, in its tsan twin).
TSAN_FLAGS := -fsanitize=thread -fno-omit-frame-pointer
TSAN_TESTS := tests/tsan/preload/preload_cuda
asan: $(ASAN_TESTS) $(TSAN_TESTS) $(FAKE_CUDA)

tests/asan/%: tests/%.c $(LIB_SRCS) $(LIB_HDRS) $(wildcard tests/*.h)
	@$(if $(Q),echo "  CC      $@ (asan)")
	$(Q)mkdir -p $(@D)
	$(Q)$(CC) $(CPPFLAGS) $(CFLAGS) $(ASAN_FLAGS) -o $@ $< $(LIB_SRCS) $(LDLIBS)

$(CUDA_TESTS) $(HW_BINS) $(CUDA_TESTS:tests/%=tests/asan/%): $(CUDA_STAMP) \
	lib/cuda_api.h tests/cuda_compat.h

# As the driver's, its own calls and the entry points its cuGetProcAddress
# hands out are its own functions, never an interposer's of the same name.
FAKE_CUDA_LDFLAGS := -Wl,-Bsymbolic-functions
$(FAKE_CUDA): $(FAKE_CUDA_SRCS) $(wildcard tests/fake_cuda/*.h) tests/cuda_compat.h \
		lib/cuda_api.h $(CUDA_STAMP)
	@$(if $(Q),echo "  CC      $@")
	$(Q)$(CC) $(CPPFLAGS) $(CUDA_CPPFLAGS) $(CFLAGS) -shared -Wl,-soname,libcuda.so.1 \
		$(FAKE_CUDA_LDFLAGS) -o $@ $(FAKE_CUDA_SRCS) -ldrm -lpthread

$(FAKE_CUDA_OLD): $(FAKE_CUDA_SRCS) $(wildcard tests/fake_cuda/*.h) tests/cuda_compat.h \
		lib/cuda_api.h $(CUDA_STAMP)
	@$(if $(Q),echo "  CC      $@")
	$(Q)mkdir -p $(@D)
	$(Q)$(CC) $(CPPFLAGS) $(CUDA_CPPFLAGS) -DFAKE_CUDA_OLD $(CFLAGS) -shared \
		-Wl,-soname,libcuda.so.1 $(FAKE_CUDA_LDFLAGS) -o $@ $(FAKE_CUDA_SRCS) \
		-ldrm -lpthread

$(DEMO): $(DEMO_SRCS) $(wildcard tests/demo/*.h tests/*.h) $(LIB_A) $(LIB_HDRS)
	@$(if $(Q),echo "  CC      $@")
	$(Q)$(CC) $(CPPFLAGS) $(CFLAGS) -o $@ $(DEMO_SRCS) $(LIB_A) $(LDLIBS)

$(TWONODE): $(TWONODE_SRCS) $(wildcard tests/*.h tests/kmod/*.h) $(LIB_A) $(LIB_HDRS)
	@$(if $(Q),echo "  CC      $@")
	$(Q)$(CC) $(CPPFLAGS) $(CFLAGS) -o $@ $(TWONODE_SRCS) $(LIB_A) $(LDLIBS)

$(PRELOAD_BENCH): tests/bench/preload-bench.c tests/bench/bench_stats.h $(FAKE_CUDA) tests/cuda_compat.h $(CUDA_STAMP)
	@$(if $(Q),echo "  CC      $@")
	$(Q)$(CC) $(CPPFLAGS) $(CUDA_CPPFLAGS) $(CFLAGS) -o $@ $< \
		-Ltests/fake_cuda -l:libcuda.so.1 -Wl,-rpath,'$$ORIGIN/../fake_cuda' -libverbs -ldl

$(BENCH): $(BENCH_SRCS) $(wildcard tests/bench/*.h tests/*.h) $(LIB_A) $(LIB_HDRS)
	@$(if $(Q),echo "  CC      $@")
	$(Q)$(CC) $(CPPFLAGS) $(CFLAGS) -o $@ $(BENCH_SRCS) $(LIB_A) $(LDLIBS) -lm

$(RANGES_BENCH): tests/bench/ranges-bench.c tests/bench/bench_stats.h $(wildcard tests/*.h tests/kmod/*.h) uapi/kvdmabuf.h
	@$(if $(Q),echo "  CC      $@")
	$(Q)$(CC) $(CPPFLAGS) $(CFLAGS) -o $@ $< -ldrm

modules:
	@test -n "$(KDIR)" -a -d "$(KDIR)" || { \
		echo "kvdmabuf: no kernel build tree; install linux-headers-\$$(uname -r) or pass KDIR=" >&2; \
		exit 1; }
	$(Q)$(MAKE) -C $(KDIR) M=$(CURDIR) W=1 $(if $(Q),,V=1) modules

# make mutants' batches (tests/mutants/run.py), with the rest of the tree:
# a module breakage's copy of the module (MUTANT_TREES/NAME/Kbuild and
# module/) built for KDIR; any other's edited files (MUTANT_TREES/NAME/overlay)
# laid over a copy of this built tree, which is built again
# (tests/mutants/build_tree.sh). One that does not build is left without its
# .ko or its tree (the guest says so) and stops nothing else.
MUTANT_TREES ?=
mutant-modules: $(addprefix mutant-module/,$(patsubst %/Kbuild,%,$(wildcard $(MUTANT_TREES)/*/Kbuild)))
mutant-module/%: modules
	$(Q)$(MAKE) -C $(KDIR) M=$(CURDIR)/$* modules || \
		echo "kvdmabuf: $* does not build" >&2
mutant-trees: $(addprefix mutant-tree/,$(patsubst %/overlay,%,$(wildcard $(MUTANT_TREES)/*/overlay)))
mutant-tree/%: lib cli tests modules rxe
	+$(Q)tests/mutants/build_tree.sh $* "$(KDIR)" || \
		echo "kvdmabuf: $* does not build" >&2

# Soft-RoCE with dma-buf MRs for the VM lanes, from KDIR's own rxe source
# and tests/rxe/patches (tests/rxe/README.md); says why where it is not built.
rxe:
	$(Q)tests/rxe/build.sh "$(KDIR)" tests/rxe/build

deps:
	$(Q)tests/vm/deps.sh host

check-unit: lib tests asan
	$(Q)tests/vm/check.sh unit

check-vm:
	$(Q)tests/vm/check.sh vm $(KERNEL)

check:
	$(Q)tests/vm/check.sh all

# tests/vm/expected-counts (the number of tests per program and lane,
# checked by every lane) from the logs of the last run in build/logs:
# after adding or removing tests, run the lanes (make check), then this.
update-counts:
	$(Q)tests/vm/counts.sh update

# Each breakage of tests/mutants/mutants.list on HEAD's files, against the
# tests that must catch it; a table (build/mutants/table.md). VM breakages
# run in batches, one guest per lane, each against the lane's whole list.
# Not part of make check. MUTANTS_ARGS: --only NAME, --lane LANE,
# --baseline, --single.
mutants:
	$(Q)tests/mutants/run.py $(MUTANTS_ARGS)

# Breakages nobody chose for their test: COUNT mechanical mutations of
# lib/, lib/preload/ and module/ from SEED, each against its part's host
# programs or, for the module, lane KERNEL's whole list
# (build/mutants/random-table.md). Not part of make check.
SEED ?= 1
COUNT ?= 40
mutants-random:
	$(Q)tests/mutants/random_pass.py --seed $(SEED) --count $(COUNT) --lane $(KERNEL)

# The demonstration runs in a VM of lane DEMO_KERNEL: 6.12, whose
# soft-RoCE has dma-buf MRs (tests/rxe), unless KERNEL is given (6.1: the
# move-capable NIC is kvd_umem there); DEMO_ARGS=--stress adds concurrent
# transfers up to each sleep.
# NODES=2: engines A and B in two guests of lane TWO_NODE_KERNEL (6.12 or
# 7.3: soft-RoCE with dma-buf MRs) on a socket network of the host's
# loopback, RDMA between them (tests/twonode, tests/vm/two-node.sh).
DEMO_KERNEL ?= $(if $(filter command line environment,$(origin KERNEL)),$(KERNEL),6.12)
NODES ?= 1
TWO_NODE_KERNEL ?= 6.12
demo:
ifeq ($(NODES),2)
	$(Q)$(MAKE) --no-print-directory demo-2node
else
	$(Q)tests/vm/check.sh run $(DEMO_KERNEL) tests/demo/kvdmabuf-demo \
		--cycles $(CYCLES) $(DEMO_ARGS)
endif

demo-2node:
	$(Q)tests/vm/check.sh run2 $(TWO_NODE_KERNEL) \
		tests/twonode/kvdmabuf-twonode --cycles $(CYCLES)

# The seed with the real Mooncake store (tests/mooncake/mooncake_store.py, its
# tables): baseline, kvdmabuf's hooks (REREGISTER) and Mooncake unmodified
# under the preload (FOLLOW, on soft-RoCE with dma-buf MRs: 6.12 and 7.3).
MOONCAKE_KERNEL ?= 6.12
demo-mooncake:
	$(Q)tests/vm/check.sh run $(MOONCAKE_KERNEL) tests/mooncake/mooncake_store.py

# The ioctl fuzzer alone, on the debug kernel (FUZZ_KERNEL=6.1|6.12 for
# another lane), for SECONDS with SEED alone (default: the fixed seeds, then
# one from the clock, each for an equal share; every seed is printed).
# ROUNDS=N: instead, each fixed seed N times in a row for SECONDS each (a
# race the lanes hit now and then: ROUNDS=20 SECONDS=5).
SECONDS ?= 600
FUZZ_KERNEL ?= debug
fuzz:
ifdef ROUNDS
	$(Q)tests/vm/check.sh run $(FUZZ_KERNEL) \
		tests/module/fuzz_rounds.sh $(ROUNDS) $(SECONDS)
else
	$(Q)tests/vm/check.sh run $(FUZZ_KERNEL) \
		tests/module/proxy_fuzz --seconds $(SECONDS) $(if $(SEED),--seed $(SEED))
endif

# Benchmarks: the pure user-space figures on this machine, then the rest in
# a VM of lane BENCH_KERNEL (a kernel with the module and the test
# importer). 6.12 by default, not KERNEL's 6.1: figures 1r and 7r need
# soft-RoCE with dma-buf MRs (tests/rxe), which 6.12 and 7.3 have and 6.1
# has not; KERNEL=6.1 (or BENCH_KERNEL=) on the command line still picks the
# lane, where they are NOT MEASURED. BENCH_ARGS go to both (e.g. --sizes
# 64,256 --reps 9); a target left NOT MEASURED (a size not in --sizes, rxe
# absent) fails unless --allow-unmeasured. The guest gets 6 GiB
# (KVDMABUF_VM_MEM, MiB), enough for the 4 GiB figure.
BENCH_VM_MEM ?= 6144
BENCH_KERNEL ?= $(if $(filter command line,$(origin KERNEL)),$(KERNEL),6.12)
bench: $(BENCH) $(PRELOAD_BENCH) $(RANGES_BENCH) $(PRELOAD_SO) $(PRELOAD_TESTS)
	$(Q)$(BENCH) --host-only $(BENCH_ARGS)
	$(Q)$(PRELOAD_BENCH)
	$(Q)tests/vm/check.sh run $(BENCH_KERNEL) $(PRELOAD_BENCH)
	$(Q)KVDMABUF_VM_MEM=$${KVDMABUF_VM_MEM:-$(BENCH_VM_MEM)} \
		tests/vm/check.sh run $(BENCH_KERNEL) tests/bench/kvdmabuf-bench $(BENCH_ARGS)
	$(Q)KVDMABUF_VM_MEM=$${KVDMABUF_VM_MEM:-$(BENCH_VM_MEM)} \
		tests/vm/check.sh run $(BENCH_KERNEL) tests/bench/ranges-bench

# Installation: the library, its headers (<kvdmabuf.h>, <linux/kvdmabuf.h>)
# and pkg-config file, the kvdmabuf command, the Python package, the man
# pages, the udev rule, the tmpfiles.d entry for the preload's state
# folder, and the self-test programs (with the test modules
# built for KDIR) under LIBEXECDIR/kvdmabuf/selftests for `kvdmabuf
# selftest`. modules_install puts the helper module under /lib/modules.
PREFIX ?= /usr/local
BINDIR ?= $(PREFIX)/bin
LIBDIR ?= $(PREFIX)/lib
LIBEXECDIR ?= $(PREFIX)/libexec
INCLUDEDIR ?= $(PREFIX)/include
MANDIR ?= $(PREFIX)/share/man
UDEVRULESDIR ?= /lib/udev/rules.d
TMPFILESDIR ?= /usr/lib/tmpfiles.d
# Where Debian's python3 looks: /usr/lib/python3/dist-packages for
# PREFIX=/usr, PREFIX/lib/python3.N/dist-packages otherwise.
PYTHON3 ?= /usr/bin/python3
PYTHONDIR ?= $(if $(filter /usr,$(PREFIX)),/usr/lib/python3/dist-packages,$(PREFIX)/lib/python$(shell \
	$(PYTHON3) -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)/dist-packages)
SELFTESTDIR = $(LIBEXECDIR)/kvdmabuf/selftests
# A folder below PREFIX as ${prefix}/..., so that pkg-config's
# --define-variable=prefix= moves the whole installation.
under_prefix = $(patsubst $(PREFIX)/%,$${prefix}/%,$(1))
# What `kvdmabuf selftest` runs: the hardware tests, safe on a serving
# node (selftest.list); with --vm-suite, the VM suite's C programs, which
# load test modules and set up soft-RoCE (selftest-vm.list). The Python
# tests need this tree.
SELFTESTS_NODE = $(HW_BINS:tests/%=%)
SELFTESTS_VM = $(filter-out %.py,$(shell sed -e 's/[[:space:]].*//' -e 's/\#.*//' tests/vm.list))
SELFTESTS = $(SELFTESTS_NODE) $(SELFTESTS_VM)

install: lib cli tests
	install -d $(DESTDIR)$(LIBDIR)/pkgconfig $(DESTDIR)$(INCLUDEDIR)/linux \
		$(DESTDIR)$(BINDIR) $(DESTDIR)$(SELFTESTDIR)/hw \
		$(DESTDIR)$(PYTHONDIR)/kvdmabuf $(DESTDIR)$(UDEVRULESDIR) \
		$(DESTDIR)$(TMPFILESDIR) $(addprefix $(DESTDIR)$(MANDIR)/man,1 3 7)
	install -m 0755 $(LIB_SO) $(DESTDIR)$(LIBDIR)/
	ln -sf $(notdir $(LIB_SO)) $(DESTDIR)$(LIBDIR)/$(LIB_SONAME)
	ln -sf $(LIB_SONAME) $(DESTDIR)$(LIBDIR)/libkvdmabuf.so
	install -m 0644 $(LIB_A) $(DESTDIR)$(LIBDIR)/
	install -m 0755 $(PRELOAD_SO) $(DESTDIR)$(LIBDIR)/
	install -m 0644 lib/kvdmabuf.h lib/kvdmabuf_preload.h $(DESTDIR)$(INCLUDEDIR)/
	install -m 0644 uapi/kvdmabuf.h $(DESTDIR)$(INCLUDEDIR)/linux/kvdmabuf.h
	sed -e 's|@PREFIX@|$(PREFIX)|; s|@LIBDIR@|$(call under_prefix,$(LIBDIR))|' \
	    -e 's|@INCLUDEDIR@|$(call under_prefix,$(INCLUDEDIR))|' \
	    -e 's|@VERSION@|$(VERSION)|' \
	    lib/kvdmabuf.pc.in >$(DESTDIR)$(LIBDIR)/pkgconfig/kvdmabuf.pc
	install -m 0755 $(CLI) $(DESTDIR)$(BINDIR)/kvdmabuf
	install -m 0644 lib/python/kvdmabuf/*.py $(DESTDIR)$(PYTHONDIR)/kvdmabuf/
	# where the package finds its library: LIBDIR, relative to itself
	printf '# written by make install\nLIBDIR_FROM_PACKAGE = "%s"\n' \
		"$$(realpath -m --relative-to=$(PYTHONDIR)/kvdmabuf $(LIBDIR))" \
		>$(DESTDIR)$(PYTHONDIR)/kvdmabuf/_libdir.py
	install -m 0644 lib/man/*.1 $(DESTDIR)$(MANDIR)/man1/
	install -m 0644 lib/man/*.3 $(DESTDIR)$(MANDIR)/man3/
	# one name per public function (man kvdmabuf_wake): a link to the
	# page whose NAME section lists it
	for p in lib/man/*.3; do \
		for n in $$(sed -n 's/^\.Nm \(kvdmabuf_[a-z_]*\).*/\1/p' $$p); do \
			[ "$$n.3" = "$${p##*/}" ] || \
			ln -sf "$${p##*/}" $(DESTDIR)$(MANDIR)/man3/$$n.3 || exit 1; \
		done; \
	done
	install -m 0644 lib/man/*.7 $(DESTDIR)$(MANDIR)/man7/
	install -m 0644 module/70-kvdmabuf.rules $(DESTDIR)$(UDEVRULESDIR)/
	install -m 0644 lib/preload/kvdmabuf-tmpfiles.conf \
		$(DESTDIR)$(TMPFILESDIR)/kvdmabuf.conf
	for t in $(SELFTESTS); do \
		install -D -m 0755 tests/$$t $(DESTDIR)$(SELFTESTDIR)/$$t || exit 1; \
	done
	printf '%s\n' $(SELFTESTS_NODE) >$(DESTDIR)$(SELFTESTDIR)/selftest.list
	printf '%s\n' $(SELFTESTS_VM) >$(DESTDIR)$(SELFTESTDIR)/selftest-vm.list
	$(if $(wildcard tests/kmod/*.ko),install -m 0644 $(wildcard tests/kmod/*.ko) \
		$(DESTDIR)$(SELFTESTDIR)/)

# Debian packages (lib/deb.sh: dpkg-deb over a staged install) in DEBDIR.
DEBDIR ?= build/deb
deb: lib cli tests
	CC="$(CC)" ./lib/deb.sh "$(CURDIR)" "$(abspath $(DEBDIR))" "$(VERSION)"

# What install put there, removed, with the same variables (the module:
# rm /lib/modules/*/extra/kvdmabuf.ko and depmod, or dkms remove).
uninstall:
	rm -f $(DESTDIR)$(LIBDIR)/$(notdir $(LIB_SO)) \
		$(DESTDIR)$(LIBDIR)/$(LIB_SONAME) $(DESTDIR)$(LIBDIR)/libkvdmabuf.so \
		$(DESTDIR)$(LIBDIR)/$(notdir $(LIB_A)) \
		$(DESTDIR)$(LIBDIR)/$(notdir $(PRELOAD_SO)) \
		$(DESTDIR)$(LIBDIR)/pkgconfig/kvdmabuf.pc \
		$(DESTDIR)$(INCLUDEDIR)/kvdmabuf.h \
		$(DESTDIR)$(INCLUDEDIR)/kvdmabuf_preload.h \
		$(DESTDIR)$(INCLUDEDIR)/linux/kvdmabuf.h \
		$(DESTDIR)$(BINDIR)/kvdmabuf \
		$(DESTDIR)$(UDEVRULESDIR)/70-kvdmabuf.rules \
		$(DESTDIR)$(TMPFILESDIR)/kvdmabuf.conf \
		$(addprefix $(DESTDIR)$(MANDIR)/man1/,$(notdir $(wildcard lib/man/*.1))) \
		$(addprefix $(DESTDIR)$(MANDIR)/man3/,$(notdir $(wildcard lib/man/*.3))) \
		$(addprefix $(DESTDIR)$(MANDIR)/man7/,$(notdir $(wildcard lib/man/*.7)))
	for p in lib/man/*.3; do \
		for n in $$(sed -n 's/^\.Nm \(kvdmabuf_[a-z_]*\).*/\1/p' $$p); do \
			rm -f $(DESTDIR)$(MANDIR)/man3/$$n.3; \
		done; \
	done
	rm -rf $(DESTDIR)$(PYTHONDIR)/kvdmabuf $(DESTDIR)$(LIBEXECDIR)/kvdmabuf

# DKMS: the helper module's sources and dkms.conf under /usr/src, then
# `dkms install kvdmabuf/$(VERSION)` builds it for every kernel.
DKMS_SRC = $(DESTDIR)/usr/src/kvdmabuf-$(VERSION)
dkms-src:
	install -d $(DKMS_SRC)/module $(DKMS_SRC)/uapi
	install -m 0644 module/*.c module/*.h module/Kbuild \
		module/Kbuild.probes $(DKMS_SRC)/module/
	install -m 0644 uapi/kvdmabuf.h $(DKMS_SRC)/uapi/
	sed 's/@VERSION@/$(VERSION)/' module/dkms.conf >$(DKMS_SRC)/dkms.conf

# The release the modules are for: /lib/modules/RELEASE/build names it
# (Debian's header trees report a shorter kernel.release of their own).
KERNELRELEASE_OF_KDIR = $(if $(filter /lib/modules/%/build,$(KDIR)),$(patsubst \
	/lib/modules/%/build,%,$(KDIR)),$(shell cat $(KDIR)/include/config/kernel.release))
modules_install: modules
	install -D -m 0644 module/kvdmabuf.ko \
		$(DESTDIR)/lib/modules/$(KERNELRELEASE_OF_KDIR)/extra/kvdmabuf.ko
	$(if $(DESTDIR),,depmod -a $(KERNELRELEASE_OF_KDIR))
	test -n "$(DESTDIR)" || depmod -a $(KERNELRELEASE_OF_KDIR)

clean:
	$(Q)rm -f $(LIB_OBJS) $(LIB_A) lib/libkvdmabuf.so* $(PRELOAD_SO) $(PRELOAD_TESTS) $(CLI) $(TEST_BINS) $(HW_BINS) \
		$(FAKE_CUDA) $(FAKE_CUDA_OLD) $(DEMO) $(TWONODE) $(BENCH) $(CUDA_STAMP)
	$(Q)rm -rf tests/asan tests/tsan tests/rxe/build
	$(Q)test -z "$(KDIR)" -o ! -d "$(KDIR)" || \
		$(MAKE) -C $(KDIR) M=$(CURDIR) clean >/dev/null
	$(Q)rm -rf build
