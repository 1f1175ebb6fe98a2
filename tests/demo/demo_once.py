#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""demo_once - make demo's job, one cycle, its verdict counted by make check
(tests/vm-6.12.list: make demo's default lane, whose move-capable column is
soft-RoCE with dma-buf MRs; tests/vm-debug.list: the same under the debug
kernel; tests/vm-6.1.list: kvd_umem in that column, as
6.1 has no dma-buf rxe; after the VM suite in the same guest). Runs
tests/demo/kvdmabuf-demo --cycles 1 and passes only when it exits 0 with
"verdict: PASS": kvdmabuf's blocks all correct with no transfer error and
nothing held while asleep, the baseline's silent bug reproduced (wrong
blocks, zero transfer errors) on both NICs, FOLLOW with unchanged keys on
the move-capable one and, on dma-buf rxe, keys not A's refused by the
remote access check, the follow path right. Whatever the demo's verdict
judges, this test judges; and where the guest loaded the dma-buf rxe
(tests/vm/guest-run.sh), the move-capable column must be that NIC, not
the kvd_umem fallback. The debug lane runs it with --move-capable-only:
what it is there for is the verbs FOLLOW path under lockdep and KASAN;
the pinning NIC's two passes (plain soft-RoCE, REREGISTER) took 166 of
its 375 s there, over kernel paths lib_vm_rereg drives in that lane.
"""
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))  # ktap
import ktap
from ktap import Skip, check

HERE = os.path.dirname(os.path.abspath(__file__))
DEMO = os.path.join(HERE, "kvdmabuf-demo")


def demo_one_cycle_verdict_pass():
    if not os.path.exists("/dev/kvdmabuf"):
        raise Skip("/dev/kvdmabuf absent: the 6.1, 6.12 and debug VM "
                   "lanes run this")
    check(os.access(DEMO, os.X_OK), "%s not built" % DEMO)
    # the demo's own test (tests/rxe_env.h)
    rxedb = ktap.rxe_dmabuf_missing() is None
    args = [DEMO, "--cycles", "1"]
    if os.environ.get("KVDMABUF_LANE") == "debug":
        args.append("--move-capable-only")
    t0 = time.monotonic()
    p = subprocess.run(args, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, universal_newlines=True,
                       timeout=ktap.scaled(600))
    for line in p.stdout.splitlines():
        print("# | " + line)
    print("# %s: %.1f s, exit status %d"
          % (" ".join(["kvdmabuf-demo"] + args[1:]), time.monotonic() - t0,
             p.returncode))
    verdict = [l for l in p.stdout.splitlines() if l.startswith("verdict: ")]
    nic2 = [l for l in p.stdout.splitlines()
            if l.startswith("  NIC 2, move-capable: ")]
    check(len(nic2) == 1 and ("soft-RoCE with dma-buf MRs" in nic2[0]) ==
          rxedb, "move-capable NIC %r where the dma-buf rxe is %s"
          % (nic2, "loaded" if rxedb else "absent"))
    check(len(verdict) == 1, "%d verdict lines, want 1" % len(verdict))
    check(verdict[0].startswith("verdict: PASS"), verdict[0])
    check(p.returncode == 0, "exit status %d with %s"
          % (p.returncode, verdict[0]))


if __name__ == "__main__":
    sys.exit(ktap.main([demo_one_cycle_verdict_pass]))
