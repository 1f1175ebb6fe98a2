#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""preload_pingpong - rdma-core's own programs run unchanged under
libkvdmabuf-preload.so on soft-RoCE (rxe1 serves, rxe0 connects, over the
guest's loopback): ibv_rc_pingpong (ibverbs-utils), and perftest's
ib_write_bw where it is installed. The dynamic linker's own log
(LD_DEBUG=bindings) shows that their registrations were bound to the
interposer; a KV region is declared that they do not touch, so every
registration passes through."""
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))  # ktap
import ktap
from ktap import Skip, check

TOP = ktap.use_build_tree()
PRELOAD = os.path.join(TOP, "lib", "libkvdmabuf-preload.so")
IBDEV_A = os.environ.get("KVDMABUF_IBDEV_A", "rxe0")
IBDEV_B = os.environ.get("KVDMABUF_IBDEV_B", "rxe1")


def need(prog):
    path = shutil.which(prog)
    if not path:
        raise Skip("%s is not installed" % prog)
    if not os.path.isdir("/sys/class/infiniband/" + IBDEV_A):
        raise Skip("no verbs device %s" % IBDEV_A)
    subprocess.run(["ip", "link", "set", "lo", "up"], capture_output=True)
    return path


def plain(text):
    """@text without the dynamic linker's log (LD_DEBUG: "PID:\t...")."""
    return [l for l in text.splitlines() if not re.match(r"\s*\d+:\t", l)]


def pair(server, client, port):
    """Server and client under the preload; their output (the dynamic
    linker's log is long: files, never an unread pipe)."""
    env = dict(os.environ, LD_PRELOAD=PRELOAD,
               KVDMABUF_KV_REGIONS="0x7e0000000000+0x100000:kv_cache",
               LD_DEBUG="bindings")
    with tempfile.TemporaryFile("w+") as so, \
            tempfile.TemporaryFile("w+") as se:
        s = subprocess.Popen(server + ["-p", str(port)], env=env,
                             stdout=so, stderr=se, text=True)
        try:
            # until the server listens: its start under LD_DEBUG takes
            # seconds in a guest on a loaded host (50 tries of 0.2 s were
            # once too few); not past its exit
            end = time.monotonic() + ktap.scaled(60)
            while True:
                time.sleep(0.2)
                c = subprocess.run(client + ["-p", str(port), "127.0.0.1"],
                                   env=env, capture_output=True, text=True,
                                   timeout=ktap.scaled(120))
                if c.returncode == 0 or "onnect" not in "\n".join(
                        plain(c.stdout + c.stderr)):
                    break
                if s.poll() is not None or time.monotonic() > end:
                    break
            s.wait(timeout=ktap.scaled(60))
        finally:
            if s.poll() is None:
                s.kill()
                s.wait()
        so.seek(0)
        se.seek(0)
        sout, serr = so.read(), se.read()
    out = sout + c.stdout
    for line in plain(out)[-12:]:
        print("# " + line)
    check(c.returncode == 0, "client: status %s: %s" % (
        c.returncode, plain(c.stdout + c.stderr)[-8:]))
    check(s.returncode == 0, "server: status %s: %s" % (
        s.returncode, plain(sout + serr)[-8:]))
    # "binding file PROG [0] to .../libkvdmabuf-preload.so [0]: normal
    # symbol `ibv_reg_mr' [IBVERBS_1.1]": the program's own references
    bound = set()
    for m in re.finditer(r"binding file (\S+) \[\d+\] to (\S+) \[\d+\]: "
                         r"normal symbol `(ibv_\w+)' \[(\S+)\]",
                         serr + c.stderr):
        if m.group(2).endswith("libkvdmabuf-preload.so") and \
                not m.group(1).endswith("libkvdmabuf-preload.so"):
            bound.add("%s@%s" % (m.group(3), m.group(4)))
    print("# bound to the preload: " + " ".join(sorted(bound)))
    check(any(b.startswith("ibv_reg_mr") for b in bound),
          "no ibv_reg_mr* bound to the preload")
    check("ibv_dereg_mr@IBVERBS_1.1" in bound,
          "ibv_dereg_mr not bound to the preload")
    return out


def ibv_rc_pingpong_runs_unchanged():
    p = need("ibv_rc_pingpong")
    out = pair([p, "-d", IBDEV_B, "-g", "0", "-n", "100"],
               [p, "-d", IBDEV_A, "-g", "0", "-n", "100"], 18515)
    check("bytes in" in out, out)


def ib_write_bw_runs_unchanged():
    p = need("ib_write_bw")
    # -u 20: an ACK time-out of 4 s, not perftest's 67 ms (7 retries: half
    # a second), so that soft-RoCE stalled under TCG on a loaded host is
    # not taken for a failure of the preload
    out = pair([p, "-d", IBDEV_B, "-x", "0", "-n", "100", "-s", "65536",
                "-u", "20"],
               [p, "-d", IBDEV_A, "-x", "0", "-n", "100", "-s", "65536",
                "-u", "20"], 18516)
    check("65536" in out, out)


if __name__ == "__main__":
    sys.exit(ktap.main([ibv_rc_pingpong_runs_unchanged,
                        ib_write_bw_runs_unchanged]))
