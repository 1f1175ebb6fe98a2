#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""cli_kvdmabuf - the admin command in the VM: `kvdmabuf check` with the
module loaded (PASS; rxe NICs found and reported without dma-buf MRs), with
the module unloaded (module FAIL, exit 1), and for a user who cannot open
/dev/kvdmabuf (permissions FAIL, exit 1); `--json` says the same;
`kvdmabuf selftest` streams the TAP of the programs it runs and fails when
one of them fails."""
import json
import os
import stat
import subprocess
import tempfile

import ktap
from ktap import Skip, check

TOP = ktap.use_build_tree()
CLI = os.path.join(TOP, "lib", "cli", "kvdmabuf")
KO = os.path.join(os.environ.get("KVDMABUF_BUILD", TOP), "module",
                  "kvdmabuf.ko")


def run(args, **kw):
    p = subprocess.run([CLI] + args, capture_output=True, text=True,
                       timeout=300, **kw)
    for line in (p.stdout + p.stderr).splitlines():
        print("# " + line)
    return p


def check_json(**kw):
    p = run(["check", "--json"], **kw)
    doc = json.loads(p.stdout)
    return p.returncode, doc["verdict"], {i["item"]: i for i in doc["items"]}


def need_root():
    if os.geteuid():
        raise Skip("needs root (module unload, another uid)")


def check_passes_with_the_module_loaded():
    check(os.path.exists("/dev/kvdmabuf"), "module not loaded")
    p = run(["check"])
    check(p.returncode == 0 and "verdict: PASS" in p.stdout)
    rc, verdict, items = check_json()
    check(rc == 0 and verdict == "PASS")
    check(items["module"]["verdict"] == "OK", str(items["module"]))
    nics = [k for k in items if k.startswith("NIC rxe")]
    check(len(nics) >= 2, "rxe NICs not reported: %s" % list(items))
    for k in nics:
        # soft-RoCE has no dma-buf MRs (EOPNOTSUPP), when a dma-buf exists
        check(items[k]["verdict"] in ("WARN", "SKIP"), str(items[k]))
        if items[k]["verdict"] == "WARN":
            check("no dma-buf MRs" in items[k]["detail"], str(items[k]))


def check_fails_without_the_module():
    need_root()
    check(subprocess.run(["rmmod", "kvdmabuf"]).returncode == 0,
          "rmmod kvdmabuf failed (something still holds it)")
    try:
        rc, verdict, items = check_json()
        check(rc == 1 and verdict == "FAIL")
        check(items["module"]["verdict"] == "FAIL" and
              "not loaded" in items["module"]["detail"])
    finally:
        check(subprocess.run(["insmod", KO]).returncode == 0,
              "insmod %s failed" % KO)


def check_fails_for_a_user_without_access():
    need_root()
    mode = os.stat("/dev/kvdmabuf").st_mode
    os.chmod("/dev/kvdmabuf", 0o600)
    try:
        rc, verdict, items = check_json(
            preexec_fn=lambda: (os.setgid(65534), os.setuid(65534)))
        check(rc == 1 and verdict == "FAIL")
        check(items["device permissions"]["verdict"] == "FAIL" and
              "uid 65534" in items["device permissions"]["detail"],
              str(items.get("device permissions")))
        os.chmod("/dev/kvdmabuf", 0o666)
        rc, verdict, items = check_json(
            preexec_fn=lambda: (os.setgid(65534), os.setuid(65534)))
        check(items["device permissions"]["verdict"] == "OK")
        check(items["module"]["verdict"] == "OK")
    finally:
        os.chmod("/dev/kvdmabuf", stat.S_IMODE(mode))


def selftest_runs_programs_and_reports_failures():
    d = tempfile.mkdtemp()
    os.symlink(os.path.join(TOP, "tests", "smoke_vgem"),
               os.path.join(d, "smoke_vgem"))
    with open(os.path.join(d, "broken"), "w") as f:
        f.write("#!/bin/sh\necho 'TAP version 13'\necho 1..1\n"
                "echo 'not ok 1 always'\nexit 1\n")
    os.chmod(os.path.join(d, "broken"), 0o755)
    env = dict(os.environ, KVDMABUF_SELFTEST_DIR=d)
    with open(os.path.join(d, "selftest.list"), "w") as f:
        f.write("# programs\nsmoke_vgem\n")
    p = run(["selftest"], env=env)
    check(p.returncode == 0 and "ok 1 " in p.stdout and
          "0 failed" in p.stdout, "smoke_vgem through selftest failed")
    with open(os.path.join(d, "selftest.list"), "a") as f:
        f.write("broken\n")
    p = run(["selftest"], env=env)
    check(p.returncode == 1 and "1 failed" in p.stdout)
    check(run(["selftest", "--list"], env=env).stdout.split() ==
          ["smoke_vgem", "broken"])


if __name__ == "__main__":
    raise SystemExit(ktap.main([
        check_passes_with_the_module_loaded,
        check_fails_without_the_module,
        check_fails_for_a_user_without_access,
        selftest_runs_programs_and_reports_failures,
    ]))
