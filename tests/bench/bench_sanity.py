#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""bench_sanity - the benchmark runs and says something well-formed (make
check, in every VM lane): tests/bench/kvdmabuf-bench --sanity, with tiny
sizes and repetitions, host figures and VM figures. Checked: exit status 0,
every figure's BENCH line present, every number finite, times positive,
ratios equal to the quotient of the figures they are made of, every target
reported with a known status (bookkeeping: it says the bench is well made,
not that it is fast). --sanity prints the timing targets but does not
judge them; bench_ratios_bounded judges one ratio per figure, measured in
the same run, against a bound far above what it measures here (a 10x
regression of the proxy's side fails it, noise does not). A
target NOT MEASURED (the wake sizes --sanity leaves out) fails the run
unless --allow-unmeasured, which the VM run passes, and which
bench_unmeasured shows (a wake size no guest holds, figures 1/2/5 only).
"""
import math
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))  # ktap
import ktap
from ktap import Skip, check

HERE = os.path.dirname(os.path.abspath(__file__))
BENCH = os.path.join(HERE, "kvdmabuf-bench")
STATUSES = {"PASS", "FAIL", "UNMEASURED"}
# bench_vm's BENCH lines, for bench_ratios_bounded
VM_LINES = []

# One ratio per figure (proxy path / the path it stands against, both in
# the same run and cycle), its bound, and what it measured in make check's
# 6.1 and 6.12 lanes on 2026-12-06 (--sanity: 1 MiB, 2 cycles). A bound
# sits 3-5x above those; the ratio of a 10x slower proxy side passes it.
# Figures 2, 5 and 6 are absolute times or bytes, judged by the module and
# library tests (memory held, drain wake-up), not here.
RATIO_BOUNDS = [
    # (figure, BENCH name, selector, key, bound, measured)
    ("1", "follow_vs_register", {}, "ratio", 6.0, "1.39-1.66"),
    ("1r", "rxe_follow_vs_rereg", {}, "ratio_without_dereg", 4.0, "0.75"),
    ("3", "map_unmap", {"size": 1048576.0}, "ratio", 3.0, "1.02-1.03"),
    ("7", "scale_alone_growth", {}, "follow_ratio", 4.0, "0.78-0.99"),
    ("7r", "rxe_scale_growth", {}, "follow_ratio", 4.0, "0.88"),
]


def run(args, timeout=ktap.scaled(300), prog=BENCH):
    check(os.access(prog, os.X_OK), "%s not built" % prog)
    t0 = time.monotonic()
    p = subprocess.run([prog] + args, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, universal_newlines=True,
                       timeout=timeout)
    for line in p.stdout.splitlines():
        print("# | " + line)
    print("# %s %s: %.1f s, exit status %d"
          % (os.path.basename(prog), " ".join(args),
             time.monotonic() - t0, p.returncode))
    return p.returncode, p.stdout


def parse(out):
    """BENCH lines as a list of dicts (numbers as float where they parse)."""
    lines = []
    for line in out.splitlines():
        if not line.startswith("BENCH "):
            continue
        d = {}
        for word in line.split()[1:]:
            check("=" in word, "malformed BENCH word %r in %r" % (word, line))
            k, v = word.split("=", 1)
            check(k not in d, "key %s twice in %r" % (k, line))
            try:
                x = float(v)
                check(math.isfinite(x), "%s=%s not finite: %r" % (k, v, line))
                d[k] = x
            except ValueError:
                d[k] = v
        check("name" in d or "target" in d, "BENCH line without name: %r"
              % line)
        lines.append(d)
    return lines


def named(lines, name):
    return [d for d in lines if d.get("name") == name]


def need(lines, name, count=1, keys=()):
    got = named(lines, name)
    check(len(got) >= count, "%d BENCH lines name=%s, want >= %d"
          % (len(got), name, count))
    for d in got:
        for k in keys:
            check(k in d, "name=%s lacks %s: %r" % (name, k, d))
            check(isinstance(d[k], float), "name=%s %s not a number: %r"
                  % (name, k, d))
        for k, v in d.items():
            # times and sizes are positive; an overhead is a difference
            if (k.endswith("ns") or k.endswith("ns_per_gib")) \
                    and "overhead" not in k and k != "hold_ns":
                check(v > 0, "name=%s %s=%s not > 0" % (name, k, v))
            if k.startswith("ratio") or k.endswith("_ratio"):
                check(v > 0, "name=%s %s=%s not > 0" % (name, k, v))
            if k.startswith("bytes"):
                check(v >= 0, "name=%s %s=%s < 0" % (name, k, v))
    return got


def close(a, b, what):
    check(abs(a - b) <= 0.01 * abs(b) + 1e-3, "%s: %s vs %s" % (what, a, b))


def targets(lines, want):
    got = {d["target"]: d.get("status") for d in lines if "target" in d}
    for name, st in got.items():
        check(st in STATUSES, "target %s status %r" % (name, st))
    for name in want:
        check(name in got, "target %s not reported (have %s)"
              % (name, sorted(got)))


def bench_host():
    rc, out = run(["--host-only", "--sanity"])
    check(rc == 0, "exit status %d" % rc)
    lines = parse(out)
    io = need(lines, "io_pair", 3, ("threads", "ns"))
    check({d["threads"] for d in io} == {1.0, 2.0}, "io_pair threads")
    need(lines, "clock_gettime", 1, ("ns",))
    need(lines, "drain_latency", 2, ("ns", "p99_ns", "max_ns", "samples"))
    for d in named(lines, "drain_latency"):
        check(d["ns"] <= d["p99_ns"] <= d["max_ns"], "drain median <= p99 "
              "<= max: %r" % d)
    targets(lines, ["io_begin+io_end<=50ns", "drain_latency_p99<1ms",
                    "drain_latency_max<10ms"])
    check("==== targets (host) ====" in out, "no targets table")


def rxe_expected():
    """Whether this guest has soft-RoCE with dma-buf MRs (tests/rxe), by
    the same signs as tests/rxe_env.h (ktap.rxe_dmabuf_missing()). Where
    it does, the bench must measure figures 1r and 7r (a bench that
    skipped them there fails this test)."""
    return ktap.rxe_dmabuf_missing() is None


def check_rxe(lines, out):
    """Figures 1r and 7r (soft-RoCE dma-buf MRs): measured with
    well-formed figures where the NIC is here, NOT MEASURED with a reason
    (and their targets UNMEASURED) where it is not."""
    st = {d["target"]: d.get("status") for d in lines if "target" in d}
    rx = need(lines, "rxe_dmabuf", 1, ("size", "measured"))
    tnames = ["rxe_wake@1MiB<=1.10x", "rxe_scale_per_region<=1.5x"]
    targets(lines, tnames)
    if not rxe_expected():
        check([d["measured"] for d in rx] == [0.0], "rxe figures without "
              "the NIC: %r" % rx)
        check(need(lines, "rxe_scale", 1, ("measured",))[0]["measured"]
              == 0, "fig 7r without the NIC")
        for t in tnames:
            check(st[t] == "UNMEASURED", "%s: %r" % (t, st[t]))
        why = [ln for ln in out.splitlines()
               if ln.startswith("# fig 1r/7r") and "NOT MEASURED, " in ln]
        check(len(why) == 1 and why[0].split("NOT MEASURED, ", 1)[1],
              "no reason given for NOT MEASURED: %r" % why)
        return
    check([d["measured"] for d in rx] == [1.0], "NIC here, rxe figures "
          "not measured: %r" % rx)
    size = ("size",)
    rr = need(lines, "rxe_rereg_dmabuf", 1,
              size + ("ns", "dereg_ns", "reg_ns", "first_access_ns",
                      "reps"))[0]
    rf = need(lines, "rxe_follow", 1,
              size + ("wake_ns", "first_access_ns", "reps"))[0]
    vs = need(lines, "rxe_follow_vs_rereg", 1,
              size + ("ratio", "ratio_p99", "ratio_medians",
                      "ratio_without_dereg", "overhead_ns",
                      "overhead_p99_ns", "without_dereg_geomean",
                      "without_dereg_ci_lo", "without_dereg_ci_hi"))[0]
    check(0 < vs["without_dereg_ci_lo"] <= vs["without_dereg_geomean"]
          <= vs["without_dereg_ci_hi"], "rxe geometric mean and its "
          "interval: %r" % vs)
    # (f): prefetch_at_wake's context (the bench fails when the NIC
    # refused a prefetch: rxe's advise_mr, tests/rxe)
    pf = need(lines, "rxe_follow_prefetch", 1,
              size + ("wake_ns", "first_access_ns", "reps"))[0]
    check(rr["reps"] == rf["reps"] == pf["reps"] == 2, "--sanity: 2 cycles "
          "each, paired: %r %r %r" % (rr, rf, pf))
    check(rr["size"] == rf["size"] == vs["size"] == 1 << 20, "1 MiB")
    check(vs["ratio"] <= vs["ratio_p99"], "rxe median ratio <= p99: %r" % vs)
    check(vs["ratio"] < vs["ratio_without_dereg"], "(d) without its dereg "
          "costs less: %r" % vs)
    close(vs["ratio_medians"], (rf["wake_ns"] + rf["first_access_ns"])
          / rr["ns"], "rxe FOLLOW/(d) = (wake + first READ) / re-register")
    for k in ("dereg_ns", "reg_ns", "first_access_ns"):
        check(rr[k] < rr["ns"], "a part of (d) below its total: %r" % rr)
    sx = need(lines, "rxe_scale", 2,
              ("regions", "wake_ns", "first_access_ns", "rereg_ns",
               "follow_per_region_ns", "rereg_per_region_ns", "ratio",
               "cycles"))
    check([d["regions"] for d in sx] == [4.0, 16.0], "rxe scale 4, 16")
    for d in sx:
        n = d["regions"]
        close(d["follow_per_region_ns"],
              (d["wake_ns"] + d["first_access_ns"]) / n, "rxe per region")
        close(d["rereg_per_region_ns"], d["rereg_ns"] / n,
              "rxe re-register per region")
        close(d["ratio"], (d["wake_ns"] + d["first_access_ns"])
              / d["rereg_ns"], "rxe scale FOLLOW / re-register")
        check(d["cycles"] == 1, "--sanity: one cycle per count: %r" % d)
    g = need(lines, "rxe_scale_growth", 1, ("from", "to", "follow_ratio",
                                            "follow_max_min"))[0]
    per = [d["follow_per_region_ns"] for d in sx]
    close(g["follow_max_min"], max(per) / min(per), "rxe scale max/min")
    for t in tnames:
        check(st[t] in ("PASS", "FAIL"), "%s: %r" % (t, st[t]))


def bench_vm():
    if not os.path.exists("/dev/kvdmabuf"):
        raise Skip("/dev/kvdmabuf absent: the VM lanes run this")
    rc, out = run(["--sanity", "--allow-unmeasured"])
    check(rc == 0, "exit status %d" % rc)
    lines = parse(out)
    VM_LINES[:] = lines
    st = {d["target"]: d.get("status") for d in lines if "target" in d}
    check(st.get("wake_overhead@64MiB<=1.10x") == "UNMEASURED",
          "--sanity leaves 64 MiB out: %r" % st)
    size = ("size",)
    # fig 1: the three wakes and their ratio, on the same size
    fw = need(lines, "follow_wake", 1, size + ("ns", "reps"))[0]
    ff = need(lines, "follow_first_access", 1, size + ("ns",))[0]
    fl = need(lines, "dmabuf_mr_register", 1,
              size + ("ns", "ns_without_export"))[0]
    need(lines, "cold_export", 1, size + ("ns",))
    vs = need(lines, "follow_vs_register", 1,
              size + ("ratio", "ratio_p99", "overhead_ns",
                      "overhead_p99_ns", "overhead_max_ns", "geomean",
                      "ci_lo", "ci_hi"))[0]
    check(vs["ratio"] <= vs["ratio_p99"], "median ratio <= p99: %r" % vs)
    # bookkeeping: a geometric mean inside its interval (printed with 4
    # decimals: under TCG a 1 MiB cycle's ratio can be so far off that the
    # interval's lower end prints as 0.0000, as on 2026-12-07 in CI's 6.1)
    check(0 <= vs["ci_lo"] <= vs["geomean"] <= vs["ci_hi"],
          "geometric mean and its 95%% interval: %r" % vs)
    check(fl["ns_without_export"] <= fl["ns"], "(b) without export <= (b)")
    need(lines, "rereg_umem_pinned_wake", 1, size + ("ns",))
    rw = need(lines, "rereg_rxe_wake", 1, size + ("ns",))[0]
    vr = need(lines, "follow_vs_rereg_rxe", 1, size + ("ratio",))[0]
    close(vr["ratio"], (fw["ns"] + ff["ns"]) / rw["ns"],
          "FOLLOW/(a) = (wake + first access) / rxe wake")
    for n in ("sleep_follow", "sleep_rereg_umem_pinned", "sleep_rereg_rxe",
              "sleep_host", "sleep_noreg"):
        need(lines, n, 1, size + ("ns",))
    for n in ("held_follow", "held_rereg_umem_pinned", "held_rereg_rxe",
              "held_noreg", "held_host"):
        need(lines, n, 1, size + ("bytes",))
    # fig 3: map/unmap through the proxy vs direct, per size
    mu = need(lines, "map_unmap", 3,
              size + ("proxy_ns", "direct_ns", "ratio", "proxy_p99_ns",
                      "direct_p99_ns", "proxy_map_ns", "direct_map_ns",
                      "proxy_unmap_ns", "direct_unmap_ns", "nmap_proxy",
                      "nmap_direct", "samples"))
    check(len({d["size"] for d in mu}) == len(mu), "map sizes distinct")
    for d in mu:
        close(d["ratio"], d["proxy_ns"] / d["direct_ns"], "map ratio")
        check(d["nmap_proxy"] == d["nmap_direct"] > 0,
              "proxy and direct map the same DMA entries: %r" % d)
        check(d["proxy_ns"] <= d["proxy_p99_ns"], "median <= p99")
    # fig 7: scale
    sf = need(lines, "scale_follow", 2,
              ("regions", "sleep_ns", "wake_ns", "first_access_ns",
               "wake_first_per_region_ns", "cycles"))
    check([d["regions"] for d in sf] == [4.0, 16.0], "scale 4, 16 (--sanity)")
    for d in sf:
        close(d["wake_first_per_region_ns"],
              (d["wake_ns"] + d["first_access_ns"]) / d["regions"],
              "per region")
    check({d["live_regions"] for d in sf} == {20.0},
          "every count alive at once: %r" % sf)
    # the control: each count alone
    sa = need(lines, "scale_follow_alone", 2,
              ("regions", "sleep_ns", "wake_ns", "first_access_ns",
               "wake_first_per_region_ns", "cycles", "live_regions"))
    check([d["regions"] for d in sa] == [4.0, 16.0], "alone: 4, 16")
    for d in sa:
        check(d["live_regions"] == d["regions"], "alone: %r" % d)
        close(d["wake_first_per_region_ns"],
              (d["wake_ns"] + d["first_access_ns"]) / d["regions"],
              "alone: per region")
    ga = need(lines, "scale_alone_growth", 1, ("from", "to", "follow_ratio",
                                               "follow_max_min"))[0]
    pa = [d["wake_first_per_region_ns"] for d in sa]
    close(ga["follow_max_min"], max(pa) / min(pa), "alone: max/min")
    need(lines, "scale_rereg_rxe", 2, ("regions", "wake_ns", "sleep_ns"))
    g = need(lines, "scale_growth", 1, ("from", "to", "follow_ratio",
                                        "follow_max_min",
                                        "rereg_rxe_ratio"))[0]
    per = [d["wake_first_per_region_ns"] for d in sf]
    close(g["follow_max_min"], max(per) / min(per), "scale max/min")
    close(g["follow_ratio"], sf[-1]["wake_first_per_region_ns"] /
          sf[0]["wake_first_per_region_ns"], "scale growth")
    need(lines, "drain_latency", 2, ("ns", "p99_ns", "max_ns"))
    check_rxe(lines, out)
    targets(lines, ["wake_overhead@64MiB<=1.10x", "wake_overhead@64MiB<=200us",
                    "held_bytes_follow",
                    "held_bytes_rereg_umem", "held_bytes_rereg_rxe",
                    "scale_per_region<=1.5x",
                    "scale_per_region_alone<=1.5x",
                    "drain_latency_p99<1ms"])
    check("==== targets (vm) ====" in out, "no targets table")


def bench_ratios_bounded():
    """One ratio per figure under a generous bound (RATIO_BOUNDS): the
    only timing make check judges."""
    if not os.path.exists("/dev/kvdmabuf"):
        raise Skip("/dev/kvdmabuf absent: the VM lanes run this")
    check(VM_LINES, "bench_vm gave no BENCH lines")
    for fig, name, sel, key, bound, seen in RATIO_BOUNDS:
        if fig in ("1r", "7r") and not rxe_expected():
            print("# fig %s: no soft-RoCE with dma-buf MRs here" % fig)
            continue
        got = [d for d in named(VM_LINES, name)
               if all(d.get(k) == v for k, v in sel.items())]
        check(len(got) == 1 and key in got[0], "fig %s: one %s line with "
              "%s: %r" % (fig, name, key, got))
        x = got[0][key]
        print("# fig %s: %s %s = %.3f (bound %.1f; measured %s)"
              % (fig, name, key, x, bound, seen))
        check(0 < x <= bound, "fig %s: %s %s = %.3f, over its bound %.1f "
              "(measured %s)" % (fig, name, key, x, bound, seen))


def bench_unmeasured():
    """Only a wake size no guest holds (1 TiB, skipped), figures 1, 2, 5:
    every wake target NOT MEASURED, and without --allow-unmeasured the
    exit status is 1 (bench_vm shows 0 with it, NOT MEASURED targets
    and all)."""
    if not os.path.exists("/dev/kvdmabuf"):
        raise Skip("/dev/kvdmabuf absent: the VM lanes run this")
    rc, out = run(["--sanity", "--wake-only", "--sizes", "1048576"])
    check(rc == 1, "exit status %d, want 1" % rc)
    st = {d["target"]: d.get("status") for d in parse(out) if "target" in d}
    for t in ("wake_overhead@64MiB<=1.10x", "wake_overhead@64MiB<=200us",
              "wake_overhead@4GiB<=200us", "held_bytes_follow"):
        check(st.get(t) == "UNMEASURED", "%s: %r" % (t, st.get(t)))
    check("NOT MEASURED: exit status 1" in out, "no NOT MEASURED line")


def ranges_bench():
    """tests/bench/ranges-bench --sanity (issue 38): both pools measured,
    every figure a positive number, the ratio the quotient of its parts,
    both targets reported; no timing judged."""
    if not os.path.exists("/dev/kvdmabuf"):
        raise Skip("/dev/kvdmabuf absent: the VM lanes run this")
    rc, out = run(["--sanity"], prog=os.path.join(HERE, "ranges-bench"))
    check(rc == 0, "exit status %d" % rc)
    lines = parse(out)
    pools = need(lines, "ranges", 2, ("pool_mib", "chunks", "rereg_ns",
                                      "swap1_ns", "swap16_ns",
                                      "first_access_ns",
                                      "swap16_over_rereg"))
    check(sorted(d["pool_mib"] for d in pools) == [32.0, 64.0],
          "pools %r" % [d["pool_mib"] for d in pools])
    for d in pools:
        check(d["chunks"] * 2 == d["pool_mib"], "chunks of 2 MiB: %r" % d)
        close(d["swap16_over_rereg"], d["swap16_ns"] / d["rereg_ns"],
              "swap16_over_rereg")
    targets(lines, ("swap16_le_tenth_of_rereg_1g", "swap1_flat_in_pool_size"))


def bench_usage():
    rc, _ = run(["--sizes", "3"])
    check(rc == 2, "a size not a multiple of 64 MiB: status %d, want 2"
          % rc)


if __name__ == "__main__":
    sys.exit(ktap.main([bench_usage, bench_host, bench_vm,
                        bench_ratios_bounded, bench_unmeasured,
                        ranges_bench]))
