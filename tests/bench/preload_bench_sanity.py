#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""preload_bench_sanity - tests/bench/preload-bench --sanity (what
libkvdmabuf-preload.so adds per interposed call) runs and says something
well-formed (make check-unit). Checked: exit status 0 (which needs every
preloaded child to have had the preload: ld.so ignores an LD_PRELOAD it
cannot load), figure P1 at 10, 1000 and 100000 live MRs, P3, each
overhead the difference of the two figures it is made of, every target
reported with a known status; figure P2 (a real verbs device) measured
exactly where this machine has one, NOT MEASURED with a reason where it
has none. Never a timing threshold: --sanity does not judge the targets.
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))  # ktap
import ktap
from ktap import check
from bench_sanity import close, need, parse, run, targets

PROG = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                    "preload-bench")


def verbs_device_here():
    try:
        return bool(os.listdir("/sys/class/infiniband"))
    except OSError:
        return False


def preload_bench():
    rc, out = run(["--sanity"], prog=PROG)
    check(rc == 0, "exit status %d" % rc)
    lines = parse(out)
    pairs = need(lines, "preload_pair", 3,
                 ("live", "direct_ns", "preload_ns", "overhead_ns"))
    check([d["live"] for d in pairs] == [10.0, 1000.0, 100000.0],
          "P1 at 10, 1000, 100000 live MRs: %r" % pairs)
    for d in pairs + need(lines, "preload_cuda_call", 1,
                          ("direct_ns", "preload_ns", "overhead_ns")):
        close(d["overhead_ns"], d["preload_ns"] - d["direct_ns"],
              "%s overhead = preload - direct" % d["name"])
    real = need(lines, "preload_pair_real", 1, ("measured",))[0]
    targets(lines, ["preload-pair-flat", "preload-pair-real",
                    "preload-cuda-call"])
    st = {d["target"]: d.get("status") for d in lines if "target" in d}
    if verbs_device_here():
        check(real["measured"] == 1, "a verbs device here, P2 not "
              "measured: %r" % real)
        need(lines, "preload_pair_real", 1,
             ("direct_ns", "preload_ns", "ratio"))
        close(real["ratio"], real["preload_ns"] / real["direct_ns"],
              "P2 ratio")
        check(st["preload-pair-real"] in ("PASS", "FAIL"), "P2 target %r"
              % st["preload-pair-real"])
    else:
        check(real["measured"] == 0, "no verbs device, P2 measured: %r"
              % real)
        why = [ln for ln in out.splitlines()
               if ln.startswith("# P2 NOT MEASURED, ")]
        check(len(why) == 1 and why[0].split(", ", 1)[1], "no reason given "
              "for P2 NOT MEASURED: %r" % why)
        check(st["preload-pair-real"] == "UNMEASURED", "P2 target %r"
              % st["preload-pair-real"])


if __name__ == "__main__":
    sys.exit(ktap.main([preload_bench]))
