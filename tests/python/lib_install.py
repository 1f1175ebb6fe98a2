#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""lib_install - `make install` into a staging root (DESTDIR, PREFIX=/usr)
gives a usable kvdmabuf: a C program builds against it with pkg-config
alone and runs; the Python package imports and loads the installed library
without LD_LIBRARY_PATH, and `pip install` of lib/python into a fresh
virtual environment works offline (Debian's setuptools) and loads the
library it carries;
the command runs and finds its installed self-tests; the man pages are
clean under mandoc -T lint (warnings and errors) and every cross reference
names an installed page; the udev rule and the tmpfiles.d entry of the
preload's state folder are there; `make uninstall` with the same
variables leaves no file behind."""
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))  # ktap
import ktap
from ktap import check

TOP = ktap.use_build_tree()
STAGE = None
VENV = None
VENV_ENV = {}


def run(cmd, env=None, **kw):
    p = subprocess.run(cmd, shell=True, capture_output=True, text=True,
                       env=env, timeout=600, **kw)
    for line in (p.stdout + p.stderr).splitlines()[-20:]:
        print("# " + line)
    return p


def staged():
    global STAGE
    if STAGE is None:
        STAGE = tempfile.mkdtemp(prefix="kvd-stage.")
        p = run("make -s -C %s install DESTDIR=%s PREFIX=/usr "
                "UDEVRULESDIR=/usr/lib/udev/rules.d" % (TOP, STAGE))
        check(p.returncode == 0, "make install failed")
    return STAGE


def env_for(stage):
    e = dict(os.environ)
    e.pop("KVDMABUF_LIBRARY", None)
    e["LD_LIBRARY_PATH"] = stage + "/usr/lib"
    return e


def c_program_builds_with_pkg_config():
    s = staged()
    e = env_for(s)
    e["PKG_CONFIG_PATH"] = s + "/usr/lib/pkgconfig"
    exe = os.path.join(s, "hello")
    p = run("cc -Wall -Werror -o %s %s/tests/install/hello.c $(pkg-config "
            "--define-variable=prefix=%s/usr --cflags --libs kvdmabuf)"
            % (exe, TOP, s), env=e)
    check(p.returncode == 0, "build against the staging root failed")
    p = run(exe, env=e)
    check(p.returncode == 0, "installed library disagrees with its header")


def python_package_imports_the_installed_library():
    s = staged()
    e = env_for(s)
    # the library it was installed with, without LD_LIBRARY_PATH
    e.pop("LD_LIBRARY_PATH")
    e["PYTHONPATH"] = s + "/usr/lib/python3/dist-packages"
    p = run("/usr/bin/python3 -c 'import kvdmabuf, kvdmabuf.hooks; "
            "print(kvdmabuf.__file__, kvdmabuf._lib._name, "
            "kvdmabuf.version())'", env=e, cwd="/")
    check(p.returncode == 0 and p.stdout.startswith(s), p.stdout)
    check(p.stdout.split()[1] == s + "/usr/lib/libkvdmabuf.so.0", p.stdout)


def venv():
    """A fresh virtual environment with lib/python installed by pip,
    offline (made once): (its folder, the environment to run it in)."""
    global VENV
    if VENV is None:
        d = tempfile.mkdtemp(prefix="kvd-venv.")
        VENV = d
        # a copy of the package's folder: the build writes beside it
        shutil.copytree(os.path.join(TOP, "lib", "python"), d + "/src",
                        ignore=shutil.ignore_patterns("build", "*.egg-info",
                                                      "__pycache__"))
        p = run("/usr/bin/python3 -m venv --system-site-packages %s/v" % d)
        check(p.returncode == 0, "python3 -m venv failed")
        e = dict(os.environ, PIP_NO_INDEX="1",
                 PIP_DISABLE_PIP_VERSION_CHECK="1",
                 KVDMABUF_LIBRARY_FILE=os.path.join(TOP, "lib",
                                                    "libkvdmabuf.so.0"),
                 KVDMABUF_PRELOAD_FILE=os.path.join(
                     TOP, "lib", "libkvdmabuf-preload.so"))
        e.pop("KVDMABUF_LIBRARY", None)
        e.pop("PYTHONPATH", None)
        p = run("%s/v/bin/pip install --no-index --no-build-isolation %s/src"
                % (d, d), env=e)
        check(p.returncode == 0, "pip install failed")
        for k in ("KVDMABUF_LIBRARY_FILE", "KVDMABUF_PRELOAD_FILE",
                  "LD_LIBRARY_PATH"):
            e.pop(k, None)
        VENV_ENV.update(e)
    check(VENV_ENV, "making the virtual environment failed (see the first "
          "test that used it)")
    return VENV, dict(VENV_ENV)


def pip_install_into_a_venv_offline():
    d, e = venv()
    p = run("%s/v/bin/python -c 'import kvdmabuf, kvdmabuf.hooks; "
            "print(kvdmabuf._lib._name, kvdmabuf.version())'" % d, env=e,
            cwd="/")
    check(p.returncode == 0 and p.stdout.startswith(d + "/v/"), p.stdout)
    # it carries a compiled library: its wheel is this platform's
    p = run("%s/v/bin/python -c 'import importlib.metadata as m; "
            "print(m.distribution(\"kvdmabuf\").read_text(\"WHEEL\"))'" % d,
            env=e, cwd="/")
    print("# " + " | ".join(p.stdout.split("\n")))
    check("Root-Is-Purelib: false" in p.stdout and "Tag: py3-none-linux_"
          in p.stdout, "the wheel is not tagged for the platform: %r" %
          p.stdout)
    # the licence, in the form this setuptools writes (setup.py's choice)
    p = run("%s/v/bin/python -c 'import importlib.metadata as m; "
            "md = m.metadata(\"kvdmabuf\"); "
            "print(md.get(\"License-Expression\") or md.get(\"License\"))'"
            % d, env=e, cwd="/")
    check(p.stdout.strip() == "MIT", "licence in the metadata: %r" % p.stdout)


def wheel_carries_a_working_preload():
    """The installed package has its libkvdmabuf-preload.so, named by
    `python -m kvdmabuf preload-path`; a process started with it in
    LD_PRELOAD runs under it (the library and the binding find it by its
    symbol versions), one without does not."""
    d, e = venv()
    p = run("%s/v/bin/python -m kvdmabuf preload-path" % d, env=e, cwd="/")
    path = p.stdout.strip()
    check(p.returncode == 0 and path.startswith(d + "/v/") and
          os.path.isfile(path), "preload-path: %d %r %r" %
          (p.returncode, p.stdout, p.stderr))
    ask = ("%s/v/bin/python -c 'import kvdmabuf; "
           "print(kvdmabuf.preload_loaded())'" % d)
    p = run(ask, env=dict(e, LD_PRELOAD=path), cwd="/")
    check(p.returncode == 0 and p.stdout.strip() == "True",
          "under the wheel's preload: %r %r" % (p.stdout, p.stderr))
    p = run(ask, env=e, cwd="/")
    check(p.stdout.strip() == "False", "without it: %r" % p.stdout)
    p = run("%s/v/bin/python -m kvdmabuf preload-pth" % d, env=e, cwd="/")
    check(p.returncode == 2 and "usage" in p.stderr, p.stderr)


def vllm_plugin_hooks_run_in_vllms_order():
    """The vLLM plugin example (lib/python/examples/vllm_plugin), installed
    by pip into the venv, is found by the stand-in's plugin loader through
    its entry point (vllm.general_plugins), subscribes to vLLM's tag hooks
    where they exist (register_tag_hooks) and wraps the allocator where
    not, and, with sleep and wake in
    vLLM's order (tests/python/vllm_standin/serve.py): every allocation is
    unmapped only after kvdmabuf put its tag to sleep, mapped and made
    accessible before kvdmabuf wakes it, the KV-only release puts the KV
    cache alone to sleep, and each step leaves the tags asleep that vLLM's
    own allocator leaves unmapped; the same with a vLLM from before the
    KV-only release (an allocator without discard). The KV cache's
    allocations are regions by the plugin alone before the KV connector
    is handed them, and after a re-initialisation only the new ones are."""
    d, e = venv()
    p = run("%s/v/bin/pip install --no-index --no-build-isolation %s/src/"
            "examples/vllm_plugin" % (d, d), env=e)
    check(p.returncode == 0, "pip install of the plugin failed")
    # nothing pip would resolve by name on a public index (issue 36)
    p = run("%s/v/bin/python -c 'import importlib.metadata as m; "
            "print(m.requires(\"kvdmabuf-vllm\"))'" % d, env=e, cwd="/")
    check(p.returncode == 0 and p.stdout.strip() == "None",
          "the plugin declares dependencies: %r" % p.stdout)
    conf = os.path.join(d, "kvdmabuf.yaml")
    with open(conf, "w") as f:
        f.write("protocol: tcp\n")
    e["PYTHONPATH"] = "%s/tests/python/vllm_standin:%s/lib/python/examples" % (
        TOP, TOP)
    after = {"sleep(1)": ["kv_cache", "weights"],
             "wake_up(weights)": ["kv_cache"], "wake_up(kv_cache)": [],
             "release_kv_cache_memory": ["kv_cache"], "sleep(2)":
             ["kv_cache", "weights"], "wake_up()": []}
    # today's vLLM (tag hooks: the plugin subscribes, one sleep and wake
    # per tag), one before the tag hooks (the plugin wraps the allocator),
    # and one from before the KV-only release (no discard)
    for old, sleeps, wakes, nsteps in (("hooks", 5, 5, 7), ("", 3, 4, 7),
                                       ("old", 2, 3, 5)):
        p = run("%s/v/bin/python %s/tests/python/vllm_standin/serve.py %s %s"
                % (d, TOP, conf, old), env=e, cwd="/")
        check(p.returncode == 0, "serve.py %s exited %d" % (old,
                                                            p.returncode))
        out = json.loads(p.stdout)
        check(out["plugins"] == ["kvdmabuf"], "plugins loaded: %s"
              % out["plugins"])
        check(len(out["steps"]) == nsteps, str(out["steps"]))
        for s in out["steps"]:
            print("# %s%s: %s, after: %s" % (old and old + " vLLM: ", s["step"],
                                             s["driver"], s["after"]))
            check(s["driver"], "%s: the allocator did nothing" % s["step"])
            for what, tag, asleep in s["driver"]:
                # unmap: the tag asleep before; map, set_access: not woken
                check(tag in asleep, "%s: %s of %s while kvdmabuf had it "
                      "awake" % (s["step"], what, tag))
            check(s["after"] == after[s["step"]], "%s left %s asleep" % (
                s["step"], s["after"]))
        check(out["wrapped"] == (old != "hooks"), "allocator wrapped: %s"
              % out["wrapped"])
        # the KV cache: regions made by the plugin before the connector
        # saw it, again after a re-initialisation, the old ones gone
        check(out["connector_saw"] == [True, True] and
              out["reinit_saw"] == [True] * 3, "connector saw %s, then %s"
              % (out["connector_saw"], out["reinit_saw"]))
        check(out["kv_regions"] == out["kv_after"] and
              out["nr_regions"] == 2 + 3, "KV regions %s for KV %s, %d "
              "regions" % (out["kv_regions"], out["kv_after"],
                           out["nr_regions"]))
        # tag hooks: one sleep per tag; after_map after every wake-up for
        # every mapped tag, a wake of an awake tag doing nothing
        check(out["sleeps"] == sleeps and out["wakes"] == wakes,
              "sleeps %d, wakes %d" % (out["sleeps"], out["wakes"]))


def command_runs_and_finds_its_selftests():
    s = staged()
    e = env_for(s)
    e.pop("KVDMABUF_SELFTEST_DIR", None)
    cli = s + "/usr/bin/kvdmabuf"
    check(run(cli + " --help", env=e).returncode == 0)
    check(run(cli + " bogus", env=e).returncode == 2)
    p = run(cli + " selftest --list", env=e)
    node = p.stdout.split()
    # a serving node's list: the hardware tests, nothing that loads test
    # modules or sets up soft-RoCE
    check(p.returncode == 0 and node == ["hw/cuda_vmm"], str(node))
    p = run(cli + " selftest --vm-suite --list", env=e)
    vm = p.stdout.split()
    check(p.returncode == 0 and "module/proxy_follow" in vm and
          "module/proxy_fuzz" in vm and "hw/cuda_vmm" not in vm, str(vm))
    for name in node + vm:
        check(os.access(s + "/usr/libexec/kvdmabuf/selftests/" + name,
                        os.X_OK), name + " not installed")


def every_function_has_its_man_page():
    man3 = staged() + "/usr/share/man/man3/"
    names = re.findall(r"^\s+(kvdmabuf_\w+);", open(
        os.path.join(TOP, "lib", "libkvdmabuf.map")).read(), re.M)
    check(len(names) > 20, str(names))
    for name in names:
        check(os.path.exists(man3 + name + ".3"), name + ".3 not installed")
        if shutil.which("man"):     # man-db, where installed
            p = run("man -M %s/usr/share/man -w 3 %s" % (staged(), name))
            check(p.returncode == 0, "man %s: %s" % (name, p.stderr))


def selftest_runs_the_node_list_unless_asked_for_the_vm_suite():
    d = tempfile.mkdtemp()
    for name in ("node_prog", "vm_prog"):
        with open(os.path.join(d, name), "w") as f:
            f.write("#!/bin/sh\necho 'TAP version 13'\necho 1..1\n"
                    "echo \"ok 1 %s_mib_$KVDMABUF_HW_MIB\"\n" % name)
        os.chmod(os.path.join(d, name), 0o755)
    with open(os.path.join(d, "selftest.list"), "w") as f:
        f.write("node_prog\n")
    with open(os.path.join(d, "selftest-vm.list"), "w") as f:
        f.write("vm_prog\n")
    e = dict(env_for(staged()), KVDMABUF_SELFTEST_DIR=d)
    e.pop("KVDMABUF_HW_MIB", None)
    cli = staged() + "/usr/bin/kvdmabuf selftest"
    p = run(cli, env=e)
    check(p.returncode == 0 and "ok 1 node_prog_mib_256" in p.stdout and
          "vm_prog" not in p.stdout, "selftest: %d %s" % (p.returncode,
                                                         p.stdout))
    p = run(cli + " --vm-suite", env=dict(e, KVDMABUF_HW_MIB="64"))
    check(p.returncode == 0 and "ok 1 vm_prog_mib_64" in p.stdout and
          "node_prog" not in p.stdout, "--vm-suite: %d %s" %
          (p.returncode, p.stdout))
    shutil.rmtree(d)


def selftest_that_tests_nothing_fails():
    d = tempfile.mkdtemp()
    with open(os.path.join(d, "skipper"), "w") as f:
        f.write("#!/bin/sh\necho 'TAP version 13'\necho 1..1\n"
                "echo 'ok 1 needs_a_gpu # SKIP no GPU'\nexit 4\n")
    os.chmod(os.path.join(d, "skipper"), 0o755)
    with open(os.path.join(d, "selftest.list"), "w") as f:
        f.write("skipper\n")
    e = dict(env_for(staged()), KVDMABUF_SELFTEST_DIR=d)
    p = run(staged() + "/usr/bin/kvdmabuf selftest", env=e)
    check(p.returncode == 2 and "nothing was tested" in p.stdout,
          "exit %d" % p.returncode)
    with open(os.path.join(d, "selftest.list"), "w") as f:
        f.write("# no program\n")
    p = run(staged() + "/usr/bin/kvdmabuf selftest", env=e)
    check(p.returncode == 2, "empty list: exit %d" % p.returncode)
    shutil.rmtree(d)


def check_says_how_to_install_the_module():
    if os.path.exists("/dev/kvdmabuf"):
        raise ktap.Skip("the module is loaded here")
    # module: require, so that its absence is a FAIL (under the default,
    # auto, the library goes on without it: a WARN, cli_kvdmabuf.py)
    e = dict(env_for(staged()), KVDMABUF_MODULE="require")
    p = run(staged() + "/usr/bin/kvdmabuf check --json", env=e)
    items = {i["item"]: i for i in json.loads(p.stdout)["items"]}
    detail = items["module"]["detail"]
    check(p.returncode == 1 and items["module"]["verdict"] == "FAIL" and
          "modprobe kvdmabuf" in detail and "module: require" in detail,
          detail)
    installed = glob.glob("/lib/modules/%s/*/kvdmabuf.ko*" % os.uname().release) + \
        glob.glob("/lib/modules/%s/*/*/kvdmabuf.ko*" % os.uname().release)
    if not installed:
        check("make modules_install" in detail and
              "dkms install kvdmabuf/" in detail, detail)


def status_json_is_json_without_the_module():
    if os.path.exists("/dev/kvdmabuf"):
        raise ktap.Skip("the module is loaded here")
    cli = staged() + "/usr/bin/kvdmabuf"
    p = run(cli + " status --json", env=env_for(staged()))
    doc = json.loads(p.stdout)
    check(p.returncode == 2 and doc["proxies"] == [] and
          "/dev/kvdmabuf" in doc["error"], p.stdout)


def man_pages_lint_clean_and_cross_referenced():
    s = staged()
    pages = glob.glob(s + "/usr/share/man/man*/*")
    names = {os.path.basename(p) for p in pages}
    check({"kvdmabuf.1", "kvdmabuf.7", "kvdmabuf_open.3",
           "kvdmabuf_sleep.3"} <= names, str(names))
    for page in pages:
        p = run("mandoc -T lint -W warning %s" % page)
        check(p.returncode == 0 and not p.stdout and not p.stderr,
              "%s: %s" % (page, p.stdout + p.stderr))
        for name, sec in re.findall(r"^\.Xr (\S+) (\d)", open(page).read(),
                                    re.M):
            check("%s.%s" % (name, sec) in names,
                  "%s refers to %s(%s), not installed" % (page, name, sec))


def debian_packages_hold_the_tree_and_work_from_their_files():
    """make deb: six packages, each file of the install in exactly one;
    unpacked into an empty root, the Python package loads the packaged
    library and names the packaged preload, a C program builds against the
    -dev package and runs on the library package, the command runs; apt
    resolves their dependencies (simulated where apt-get is)."""
    out = tempfile.mkdtemp(prefix="kvd-deb.")
    p = run("make -s -C %s deb DEBDIR=%s" % (TOP, out))
    check(p.returncode == 0, "make deb failed")
    debs = sorted(f for f in os.listdir(out) if f.endswith(".deb"))
    names = [d.split("_")[0] for d in debs]
    check(names == ["kvdmabuf-dkms", "kvdmabuf-tools", "libkvdmabuf-dev",
                    "libkvdmabuf-preload", "libkvdmabuf0",
                    "python3-kvdmabuf"], str(debs))
    owner = {}
    for d in debs:
        listing = subprocess.run(["dpkg-deb", "-c", os.path.join(out, d)],
                                 capture_output=True, text=True,
                                 check=True).stdout
        for line in listing.splitlines():
            if line.startswith("d"):
                continue
            path = line.split()[5]
            check(path not in owner, "%s in %s and %s" % (path, owner.get(
                path), d))
            owner[path] = d
    for want, pkg in (("libkvdmabuf.so.0", "libkvdmabuf0"),
                      ("libkvdmabuf-preload.so", "libkvdmabuf-preload"),
                      ("include/kvdmabuf.h", "libkvdmabuf-dev"),
                      ("bin/kvdmabuf", "kvdmabuf-tools"),
                      ("dkms.conf", "kvdmabuf-dkms"),
                      ("kvdmabuf/__init__.py", "python3-kvdmabuf")):
        hit = [d for path, d in owner.items() if path.endswith(want)]
        check(len(hit) == 1 and hit[0].startswith(pkg + "_"),
              "%s: %s" % (want, hit))
    root = os.path.join(out, "root")
    for d in debs:
        subprocess.run(["dpkg", "-x", os.path.join(out, d), root], check=True)
    ma = subprocess.run(["cc", "-print-multiarch"], capture_output=True,
                        text=True, check=True).stdout.strip()
    e = dict(os.environ, PYTHONPATH=root + "/usr/lib/python3/dist-packages")
    for k in ("KVDMABUF_LIBRARY", "LD_LIBRARY_PATH"):
        e.pop(k, None)
    p = run("python3 -c 'import kvdmabuf; print(kvdmabuf._lib._name); "
            "print(kvdmabuf.preload_path()); print(kvdmabuf.version())'",
            env=e, cwd="/")
    lines = p.stdout.splitlines()
    check(p.returncode == 0 and len(lines) == 3, p.stdout + p.stderr)
    check(lines[0] == "%s/usr/lib/%s/libkvdmabuf.so.0" % (root, ma) and
          lines[1] == "%s/usr/lib/%s/libkvdmabuf-preload.so" % (root, ma),
          str(lines))
    e = dict(os.environ, LD_LIBRARY_PATH="%s/usr/lib/%s" % (root, ma),
             PKG_CONFIG_PATH="%s/usr/lib/%s/pkgconfig" % (root, ma),
             PKG_CONFIG_SYSROOT_DIR=root)
    exe = os.path.join(out, "hello")
    p = run("cc -Wall -Werror -o %s %s/tests/install/hello.c $(pkg-config "
            "--cflags --libs kvdmabuf)" % (exe, TOP), env=e)
    check(p.returncode == 0, "build against the -dev package failed")
    p = run(exe, env=e)
    check(p.returncode == 0, "the packaged library disagrees with its header")
    p = run("%s/usr/bin/kvdmabuf --version" % root)
    check(p.returncode == 0 and p.stdout.startswith("kvdmabuf "), p.stdout)
    if shutil.which("apt-get"):
        p = run("apt-get install -s %s" % " ".join(
            os.path.join(out, d) for d in debs))
        check(p.returncode == 0, "apt cannot resolve the packages' "
              "dependencies")
    shutil.rmtree(out, ignore_errors=True)


def udev_rule_installed():
    check(os.path.exists(staged() + "/usr/lib/udev/rules.d/70-kvdmabuf.rules"))


def tmpfiles_entry_makes_the_state_folder():
    with open(staged() + "/usr/lib/tmpfiles.d/kvdmabuf.conf") as f:
        lines = [ln.split() for ln in f if ln.strip() and ln[0] != "#"]
    check(["d", "/run/kvdmabuf/preload", "1777", "root", "root", "-"] in lines,
          str(lines))
    # the folder the preload writes to by default (lib/kvdmabuf_preload.h)
    with open(os.path.join(TOP, "lib", "kvdmabuf_preload.h")) as f:
        check('#define KVDMABUF_PRELOAD_RUN_DIR "/run/kvdmabuf/preload"'
              in f.read())


def uninstall_leaves_nothing():
    d = tempfile.mkdtemp(prefix="kvd-uninstall.")
    try:
        args = "DESTDIR=%s PREFIX=/usr UDEVRULESDIR=/usr/lib/udev/rules.d" % d
        check(run("make -s -C %s install %s" % (TOP, args)).returncode == 0,
              "make install failed")
        n = sum(len(f) for _, _, f in os.walk(d))
        check(n > 50, "only %d files installed" % n)
        check(run("make -s -C %s uninstall %s" % (TOP, args)).returncode == 0,
              "make uninstall failed")
        left = [os.path.join(r, f)[len(d):] for r, _, fs in os.walk(d)
                for f in fs]
        check(not left, "left behind: %s" % " ".join(sorted(left)[:10]))
    finally:
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    rc = ktap.main([
        c_program_builds_with_pkg_config,
        python_package_imports_the_installed_library,
        pip_install_into_a_venv_offline,
        wheel_carries_a_working_preload,
        debian_packages_hold_the_tree_and_work_from_their_files,
        vllm_plugin_hooks_run_in_vllms_order,
        command_runs_and_finds_its_selftests,
        selftest_runs_the_node_list_unless_asked_for_the_vm_suite,
        selftest_that_tests_nothing_fails,
        check_says_how_to_install_the_module,
        status_json_is_json_without_the_module,
        every_function_has_its_man_page,
        man_pages_lint_clean_and_cross_referenced,
        udev_rule_installed,
        tmpfiles_entry_makes_the_state_folder,
        uninstall_leaves_nothing,
    ])
    for tmp in (STAGE, VENV):
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
    raise SystemExit(rc)
