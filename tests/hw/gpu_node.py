#!/usr/bin/env python3
# SPDX-License-Identifier: GPL-2.0
"""tests/hw/gpu-node.sh's dry run on this machine (no GPU): with the fake
libcuda every test of tests/hw/cuda_vmm is in the table, skipped with the
reason the fake gives; the preload tests of the second run skip for CUDA,
not for a preload that did not load (the script's LD_PRELOAD works); the
exit status is kselftest's "all skipped"; a bad argument runs nothing.
On a GPU node the same script is the check (docs/admin.md)."""
import os
import re
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))  # ktap
import ktap  # noqa: E402
from ktap import check  # noqa: E402

TOP = ktap.use_build_tree()
SCRIPT = os.path.join(TOP, "tests", "hw", "gpu-node.sh")
PROG = os.path.join(TOP, "tests", "hw", "cuda_vmm")
FAKE = os.path.join(TOP, "tests", "fake_cuda", "libcuda.so.1")


def run(*args, **env):
    return subprocess.run([SCRIPT] + list(args), capture_output=True,
                          text=True, timeout=ktap.scaled(120),
                          env=dict(os.environ, **env))


def dry_run_on_the_fake_lists_every_test_skipped():
    names = subprocess.run([PROG, "-l"], capture_output=True, text=True,
                           check=True).stdout.split()
    p = run(KVDMABUF_CUDA_LIBRARY=FAKE)
    logs = re.search(r"logs in (/tmp/kvdmabuf-gpu-node\.\w+)\)", p.stdout)
    if logs:
        shutil.rmtree(logs.group(1), ignore_errors=True)
    print("\n".join("# " + ln for ln in p.stdout.splitlines()[-14:]))
    check(p.returncode == 4, "status %d, not 4 (all skipped): %s" %
          (p.returncode, p.stderr))
    rows = re.findall(r"^# (driver|preload) +(\S+) +(\w+)(?:: (.*))?$",
                      p.stdout, re.M)
    check(sorted(r[1] for r in rows) == sorted(names),
          "table rows %s, tests %s" % ([r[1] for r in rows], names))
    for run_name, name, res, why in rows:
        check(res == "SKIP" and "fake libcuda" in why,
              "%s %s: %s %s" % (run_name, name, res, why))
        check((run_name == "preload") == name.startswith("preload_"),
              "%s in the %s run" % (name, run_name))
    check(re.search(r"^0 passed, 0 failed, %d skipped" % len(names),
                    p.stdout, re.M), "no summary line")
    check(re.search(r"^# libcuda +%s$" % re.escape(FAKE), p.stdout, re.M),
          "the node's libcuda row does not name the one tested")


def bad_arguments_run_nothing():
    for args in (["--bogus"], ["--mib", "lots"]):
        p = run(*args)
        check(p.returncode == 2 and "gpu-node.sh:" in p.stderr and
              "passed" not in p.stdout, "%s: %d %r" % (args, p.returncode,
                                                       p.stderr))


if __name__ == "__main__":
    sys.exit(ktap.main([dry_run_on_the_fake_lists_every_test_skipped,
                        bad_arguments_run_nothing]))
