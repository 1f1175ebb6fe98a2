#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""cli_kvdmabuf - the admin command in the VM: `kvdmabuf check` with the
module loaded (PASS; rxe NICs found and reported without dma-buf MRs), with
the module unloaded (module FAIL, exit 1), and for a user who cannot open
/dev/kvdmabuf (permissions FAIL, exit 1); `--json` says the same;
`kvdmabuf status` lists the proxies a user may see (its own; root: all)
through the module's LIST ioctl, whose argument checks are tested here
too; `kvdmabuf selftest` streams the TAP of the programs it runs and fails
when one of them fails."""
import errno
import fcntl
import json
import os
import struct
import stat
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))  # ktap
import ktap
from ktap import Skip, check

TOP = ktap.use_build_tree()
CLI = os.path.join(TOP, "lib", "cli", "kvdmabuf")
KO = os.path.join(os.environ.get("KVDMABUF_BUILD", TOP), "module",
                  "kvdmabuf.ko")


def run(args, **kw):
    p = subprocess.run([CLI] + args, capture_output=True, text=True,
                       timeout=ktap.scaled(300), **kw)
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
    check(items["configuration"]["verdict"] == "OK", str(items))
    check(items["verbs device access"]["verdict"] == "OK",
          str(items.get("verbs device access")))
    nics = [k for k in items if k.startswith("NIC rxe")]
    check(len(nics) >= 2, "rxe NICs not reported: %s" % list(items))
    # The lane's soft-RoCE with dma-buf MRs (tests/rxe) follows moves
    # (but refuses every dma-buf under CONFIG_DMABUF_DEBUG: no struct pages).
    rxe_dmabuf = os.path.exists("/sys/module/rdma_rxe/parameters/dmabuf_pinned")
    for k in nics:
        if rxe_dmabuf and items[k]["verdict"] == "OK":
            check("follows moves" in items[k]["detail"], str(items[k]))
            continue
        # soft-RoCE has no dma-buf MRs (EOPNOTSUPP), when a dma-buf exists
        check(items[k]["verdict"] in ("WARN", "SKIP"), str(items[k]))
        if items[k]["verdict"] == "WARN":
            check("no dma-buf MRs" in items[k]["detail"], str(items[k]))


def check_without_the_module_warns_and_fails_where_required():
    """module: auto (the default) goes on without the module: a WARN, the
    verdict PASS; module: require makes kvdmabuf_open() fail: a FAIL."""
    need_root()
    check(subprocess.run(["rmmod", "kvdmabuf"]).returncode == 0,
          "rmmod kvdmabuf failed (something still holds it)")
    cfg = tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False)
    try:
        rc, verdict, items = check_json()
        # loaded from the build tree: installed (DKMS lanes) or not
        detail = items["module"]["detail"]
        check(items["module"]["verdict"] == "WARN" and
              "modprobe kvdmabuf" in detail and
              ("not loaded" in detail or "make modules_install" in detail)
              and "module: auto" in detail, detail)
        check(rc == 0 and verdict == "PASS",
              "%s: %s" % (verdict, [k for k, i in items.items()
                                    if i["verdict"] == "FAIL"]))
        cfg.write("protocol: rdma\nmodule: require\n")
        cfg.close()
        rc, verdict, items = check_json(
            env=dict(os.environ, KVDMABUF_CONFIG=cfg.name))
        check(rc == 1 and verdict == "FAIL")
        check(items["configuration"]["verdict"] == "OK" and
              "module require" in items["configuration"]["detail"],
              str(items["configuration"]))
        check(items["module"]["verdict"] == "FAIL" and
              "module: require" in items["module"]["detail"],
              str(items["module"]))
    finally:
        os.unlink(cfg.name)
        check(subprocess.run(["insmod", KO] + os.environ.get(
            "KVDMABUF_KO_PARAMS", "").split()).returncode == 0,
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


def _iowr(nr, size):
    return (3 << 30) | (size << 16) | (0xC9 << 8) | nr


def create_proxy(length=1 << 20):
    """KVDMABUF_IOCTL_CREATE by hand; returns (device fd, proxy fd, id)."""
    dev = os.open("/dev/kvdmabuf", os.O_RDWR)
    arg = bytearray(struct.pack("=IIQQIIQ", 40, 0, length, 0, 0, 0, 0))
    fcntl.ioctl(dev, _iowr(0x01, 40), arg)
    _, _, _, proxy_id, fd, _, _ = struct.unpack("=IIQQIIQ", arg)
    return dev, fd, proxy_id


def list_ioctl(flags=0, stat_size=72, count=0, reserved=0):
    dev = os.open("/dev/kvdmabuf", os.O_RDONLY)
    buf = bytearray(max(count, 1) * max(stat_size, 1))
    addr = 0
    if count:
        import ctypes
        addr = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    arg = bytearray(struct.pack("=IIIIQQ", 32, flags, stat_size, count,
                                addr, reserved))
    try:
        fcntl.ioctl(dev, _iowr(0x05, 32), arg)
        return struct.unpack("=IIIIQQ", arg)[3]
    except OSError as e:
        return -e.errno
    finally:
        os.close(dev)


def status_lists_what_the_user_may_see():
    need_root()
    check(list_ioctl(flags=1) == -errno.EINVAL)
    check(list_ioctl(reserved=1) == -errno.EINVAL)
    check(list_ioctl(stat_size=8) == -errno.EINVAL)
    check(list_ioctl(stat_size=8192) == -errno.E2BIG)
    before = list_ioctl()
    dev, fd, my_id = create_proxy()
    check(list_ioctl() == before + 1)
    mode = os.stat("/dev/kvdmabuf").st_mode
    os.chmod("/dev/kvdmabuf", 0o666)
    to_parent, to_child = os.pipe(), os.pipe()
    child = os.fork()
    if not child:       # another user with a proxy of its own
        os.setgid(65534)
        os.setuid(65534)
        d, f, i = create_proxy(2 << 20)
        os.write(to_parent[1], b"%d\n" % i)
        os.read(to_child[0], 1)   # hold it until the parent has looked
        os._exit(0)
    try:
        nobody_id = int(os.read(to_parent[0], 64))
        p = run(["status", "--json"])
        mine = {x["id"]: x for x in json.loads(p.stdout)["proxies"]}
        check(p.returncode == 0 and my_id in mine and nobody_id in mine)
        check(mine[my_id]["state"] == "unbacked" and
              mine[my_id]["length"] == 1 << 20 and
              mine[my_id]["owner_pid"] == os.getpid(), str(mine[my_id]))
        check(mine[my_id]["pinned_importers"] == 0 and
              mine[my_id]["revocable_importers"] == 0 and
              mine[my_id]["revocable_pins"] == 0, str(mine[my_id]))
        check(mine[nobody_id]["owner_uid"] == 65534)
        p = run(["status", "--json"],
                preexec_fn=lambda: (os.setgid(65534), os.setuid(65534)))
        theirs = {x["id"] for x in json.loads(p.stdout)["proxies"]}
        check(theirs == {nobody_id}, "uid 65534 sees %s" % theirs)
        p = run(["status"])
        check(p.returncode == 0 and "unbacked" in p.stdout)
    finally:
        os.write(to_child[1], b"x")
        os.waitpid(child, 0)
        os.chmod("/dev/kvdmabuf", stat.S_IMODE(mode))
        os.close(fd)
        os.close(dev)
    check(list_ioctl() == before)


def selftest_runs_programs_and_reports_failures():
    d = tempfile.mkdtemp()
    os.symlink(os.path.join(TOP, "tests", "module", "smoke_vgem"),
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
        check_without_the_module_warns_and_fails_where_required,
        check_fails_for_a_user_without_access,
        status_lists_what_the_user_may_see,
        selftest_runs_programs_and_reports_failures,
    ]))
