#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""preload_symver - libkvdmabuf-preload.so on the host, no NIC: a program
built against the real libibverbs (tests/preload/symver) makes each form
of registration, at each symbol version libibverbs exports, under
LD_PRELOAD with a stand-in libibverbs (tests/preload/fake) that counts
what reaches it. Each form must land in the interposer at its own version
and be forwarded to the same version; the 1.0 ABI's inner calls are
handled at 1.8/1.1. A registration in a declared KV region is made on its
proxy (ibv_reg_dmabuf_mr in the caller's PD) when the region has one, is
made as asked and refuses sleep by name when the NIC says EOPNOTSUPP or
the region has none, whichever came first, declaration or registration.
ibv_rereg_mr (its one version, 1.1): forwarded with the record following
the new range, or refused (EOPNOTSUPP, named on stderr, the stand-in never
reached) where a new translation would leave a proxy or land by address
in a proxied region. The Python binding's preload_* functions (ctypes)."""
import ctypes
import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))  # ktap
import ktap
from ktap import check

TOP = ktap.use_build_tree()
PRELOAD = os.path.join(TOP, "lib", "libkvdmabuf-preload.so")
PROG = os.path.join(TOP, "tests", "preload", "symver")
FAKE = os.path.join(TOP, "tests", "preload", "fake")
CLI = os.path.join(TOP, "lib", "cli", "kvdmabuf")
# the preload's state files (kvdmabuf status) of every run here
STATE = tempfile.mkdtemp(prefix="kvd-preload-")
os.environ["KVDMABUF_PRELOAD_DIR"] = STATE


def run(case):
    env = dict(os.environ, LD_PRELOAD=PRELOAD, LD_LIBRARY_PATH=FAKE)
    p = subprocess.run([PROG, case], env=env, capture_output=True,
                       text=True, timeout=30)
    for line in p.stdout.splitlines():
        print("# " + line)
    check(p.returncode == 0, "%s: status %d %s" % (case, p.returncode,
                                                   p.stderr))
    lines = p.stdout.splitlines()
    return {"mr": lines[0], "reg": lines[1:3], "state": lines[3],
            "check": lines[4], "dereg": lines[-4:-2],
            "final": lines[-2:], "all": p.stdout, "err": p.stderr,
            "rereg": [l for l in lines if l.startswith("rereg:")]}


def lands(case, entries, fake_entries=None, dereg="ibv_dereg_mr@IBVERBS_1.1"):
    r = run(case)
    check(r["mr"].startswith("mr: made"), r["mr"])
    want = "preload: " + " ".join(e + "+1" for e in entries)
    check(r["reg"][0] == want, "%r != %r" % (r["reg"][0], want))
    want = "fake: " + " ".join(e + "+1" for e in (fake_entries or entries))
    check(r["reg"][1] == want, "%r != %r" % (r["reg"][1], want))
    want = [dereg + "+1"] if isinstance(dereg, str) else [d + "+1" for d in dereg]
    check(r["dereg"][0] == "preload: " + " ".join(want), r["dereg"][0])
    check(r["final"][0].endswith("mrs 0 in 0 proxy 0 cannot 0"), r["final"][0])
    return r


def ibv_reg_mr_macro_lands_at_1_1():
    lands("reg_mr", ["ibv_reg_mr@IBVERBS_1.1"])


def ibv_reg_mr_with_optional_access_lands_at_iova2_1_8():
    lands("reg_mr_optional", ["ibv_reg_mr_iova2@IBVERBS_1.8"])


def ibv_reg_mr_iova_lands_at_1_7():
    lands("reg_mr_iova", ["ibv_reg_mr_iova@IBVERBS_1.7"])


def ibv_reg_mr_iova2_lands_at_1_8():
    lands("reg_mr_iova2", ["ibv_reg_mr_iova2@IBVERBS_1.8"])


def ibv_reg_dmabuf_mr_lands_at_1_12():
    lands("reg_dmabuf", ["ibv_reg_dmabuf_mr@IBVERBS_1.12"])


def abi_1_0_lands_and_its_inner_calls_are_handled():
    r = lands("reg_mr_1_0", ["ibv_reg_mr@IBVERBS_1.0",
                             "ibv_reg_mr_iova2@IBVERBS_1.8"],
              dereg=["ibv_dereg_mr@IBVERBS_1.0", "ibv_dereg_mr@IBVERBS_1.1"])
    # the inner call was recorded once (on the real PD), and forgotten
    check("mrs 1 in 0" in r["state"], r["state"])


def outside_any_region_passes_through_but_is_seen():
    r = run("reg_mr")
    check("regions 0 mrs 1 in 0 proxy 0 cannot 0" in r["state"], r["state"])
    # memory under it is still not releasable: the library's sleep asks
    check(r["check"].startswith("check: -16 engine MR 0x100"), r["check"])


def in_region_without_proxy_cannot_follow_named():
    r = run("reg_mr-kv")
    check("cannot 1" in r["state"], r["state"])
    check("engine MR 0x100" in r["check"] and "on NIC fake0 pins: cannot "
          "sleep transparently" in r["check"] and "no proxy" in r["check"],
          r["check"])
    check(r["final"][1] == "check: 0 ", r["final"][1])


def in_region_with_proxy_is_made_on_the_proxy():
    r = run("reg_mr-kv-proxy")
    check(r["reg"][1] == "fake: ibv_reg_dmabuf_mr@IBVERBS_1.12+1", r["reg"][1])
    check("as asked" in r["mr"], r["mr"])   # mr->addr is the caller's
    check("dmabuf 0x1000 fd 99" in r["mr"], r["mr"])  # the region's offset
    check("proxy 1 cannot 0" in r["state"], r["state"])
    check(r["check"] == "check: 0 ", r["check"])


def sub_range_of_a_region_is_made_at_its_offset_in_the_proxy():
    """A registration a page into a region (per layer or per block) is made
    on the proxy at that page: the region's offset in the proxy (4096)
    plus its own (4096), never the region's start (silent wrong bytes)."""
    r = run("reg_mr_mid-kv-proxy")
    check(r["reg"][1] == "fake: ibv_reg_dmabuf_mr@IBVERBS_1.12+1", r["reg"][1])
    check("as asked dmabuf 0x2000 fd 99" in r["mr"], r["mr"])
    check("proxy 1 cannot 0" in r["state"], r["state"])


def engines_own_dmabuf_in_region_is_replaced_by_the_proxy():
    r = run("reg_dmabuf-kv-proxy")
    check("proxy 1 cannot 0" in r["state"], r["state"])


def nic_without_dmabuf_mrs_falls_back_and_refuses():
    r = run("reg_mr-kv-proxy-eopnotsupp")
    check(r["reg"][1] == "fake: ibv_reg_mr@IBVERBS_1.1+1 "
          "ibv_reg_dmabuf_mr@IBVERBS_1.12+1", r["reg"][1])
    check("Operation not supported" in r["check"] and "pins: cannot sleep "
          "transparently" in r["check"], r["check"])


def declared_after_registration_cannot_follow():
    r = run("reg_mr_later")
    check("regions 1 mrs 1 in 1 proxy 0 cannot 1" in r["all"], r["all"])
    check("registered before KV region 'kv_cache' was declared" in r["all"],
          r["all"])


def registration_across_a_region_cannot_follow():
    r = run("reg_mr_across-kv")
    check("reaches past KV region" in r["check"], r["check"])


def rereg(case):
    """The ibv_rereg_mr part of @case: (its result line, the interposer's
    and the stand-in's counts, the state after it)."""
    r = run(case)
    i = r["all"].splitlines().index(r["rereg"][0])
    lines = r["all"].splitlines()
    return r, lines[i:i + 4]


def rereg_outside_regions_is_forwarded_at_1_1():
    r, (res, pre, fake, st) = rereg("reg_mr-rereg_access")
    check(res == "rereg: 0 Success addr old", res)
    check(pre == "preload: ibv_rereg_mr@IBVERBS_1.1+1", pre)
    check(fake == "fake: ibv_rereg_mr@IBVERBS_1.1+1", fake)


def rereg_access_of_a_proxy_mr_is_forwarded_and_stays_on_the_proxy():
    r, (res, pre, fake, st) = rereg("reg_mr-kv-proxy-rereg_access")
    check(res.startswith("rereg: 0 "), res)
    check(fake == "fake: ibv_rereg_mr@IBVERBS_1.1+1", fake)
    check("proxy 1 cannot 0" in st, st)


def rereg_translation_of_a_proxy_mr_is_refused_by_name():
    r, (res, pre, fake, st) = rereg("reg_mr-kv-proxy-rereg_in")
    check(res == "rereg: -1 Operation not supported addr old", res)
    check(pre == "preload: ibv_rereg_mr@IBVERBS_1.1+1", pre)
    check(fake == "fake:", fake)        # never reached libibverbs
    check("proxy 1 cannot 0" in st, st)
    check("ibv_rereg_mr of MR 0x100 refused: it is made on a KV region's "
          "proxy dma-buf" in r["err"] and "deregister it and register"
          in r["err"], r["err"])


def rereg_into_a_proxied_region_is_refused():
    r, (res, pre, fake, st) = rereg("reg_mr_head-kv-proxy-rereg_in")
    check(res.startswith("rereg: -1 Operation not supported"), res)
    check(fake == "fake:", fake)
    check("lies in KV region 'kv_cache', served by its proxy" in r["err"],
          r["err"])


def rereg_into_a_region_without_proxy_cannot_follow():
    r, (res, pre, fake, st) = rereg("reg_mr_head-kv-rereg_in")
    check(res == "rereg: 0 Success addr new", res)
    check("in 1 proxy 0 cannot 1" in st, st)
    check("re-registered (ibv_rereg_mr) by address into KV region "
          "'kv_cache'" in r["all"], r["all"])


def rereg_out_of_a_region_can_no_longer_block_it():
    r, (res, pre, fake, st) = rereg("reg_mr-kv-rereg_out")
    check(res == "rereg: 0 Success addr new", res)
    check("in 0 proxy 0 cannot 0" in st, st)


def status_lists_a_live_engine_and_forgets_it_at_exit():
    """The preload's state file, read by `kvdmabuf status --preload`: the
    region and the engine's MR in it with its cause, while the process
    lives; nothing once it has exited; a dead process's file is not
    listed."""
    env = dict(os.environ, LD_PRELOAD=PRELOAD, LD_LIBRARY_PATH=FAKE)
    p = subprocess.Popen([PROG, "reg_mr-kv-hold"], env=env,
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         text=True)
    try:
        while p.stdout.readline().strip() not in ("held", ""):
            pass
        check(os.path.exists(os.path.join(STATE, str(p.pid))),
              str(os.listdir(STATE)))
        s = subprocess.run([CLI, "status", "--preload", "--json"],
                           capture_output=True, text=True, timeout=30)
        print("# " + s.stdout.replace("\n", "\n# "))
        check(s.returncode == 0, s.stderr)
        procs = {x["pid"]: x for x in json.loads(s.stdout)["preload"]}
        check(p.pid in procs, str(procs))
        me = procs[p.pid]
        check(me["nr_regions"] == 1 and me["nr_in_regions"] == 1 and
              me["nr_cannot_follow"] == 1 and me["nr_on_proxy"] == 0, str(me))
        check(me["regions"][0]["tag"] == "kv_cache" and
              not me["regions"][0]["proxy"] and
              not me["regions"][0]["asleep"], str(me["regions"]))
        mr = me["mrs"][0]
        check(mr["lkey"] == 0x100 and mr["nic"] == "fake0" and
              mr["mode"] == "cannot-follow" and mr["length"] == 4096 and
              "has no proxy dma-buf" in mr["reason"], str(mr))
        t = subprocess.run([CLI, "status", "--preload"], capture_output=True,
                           text=True, timeout=30)
        check("preload pid %d: regions 1 asleep 0 in 1 proxy 0 "
              "cannot 1" % p.pid in t.stdout and "fake0 cannot-follow KV "
              "region 'kv_cache' has no proxy" in t.stdout, t.stdout)
    finally:
        p.communicate("x", timeout=30)
    check(p.returncode == 0, "symver: %d" % p.returncode)
    check(not os.path.exists(os.path.join(STATE, str(p.pid))),
          "state file left behind: %s" % os.listdir(STATE))
    # a file whose process is gone (pid 1 with another start time, as a
    # killed engine's whose pid came back), and one of a pid no process
    # has: not listed, and removed (killed engines leave theirs)
    with open("/proc/sys/kernel/pid_max") as f:
        free_pid = int(f.read()) - 1
    stale = [os.path.join(STATE, "1"), os.path.join(STATE, str(free_pid))]
    for path, pid in zip(stale, (1, free_pid)):
        with open(path, "w") as f:
            f.write("kvdmabuf-preload 1\npid %d 12345678901\nregions 0 "
                    "asleep 0 mrs 0 in 0 proxy 0 cannot 0 env_error 0\n"
                    % pid)
    s = subprocess.run([CLI, "status", "--preload", "--json"],
                       capture_output=True, text=True, timeout=30)
    left = [p for p in stale if os.path.exists(p)]
    for path in left:
        os.unlink(path)
    check(json.loads(s.stdout)["preload"] == [], s.stdout)
    check(not left, "stale state files kept: %s" % left)


def pass_through_calls_leave_the_state_file_alone():
    """1000 registrations and deregistrations outside every KV region
    (an engine's bounce buffers) do not rewrite the state file: it lists
    regions and the MRs in them only, and a rewrite per call cost 50 us to
    1 ms (issue 32 item 10). A rewrite replaces the file (rename): another
    inode, or the same number reused (ext4) with a new change time. Then
    300 registrations in the region, live together (the records' hash
    table grows past its first 64 buckets), are counted, and each is found
    again when it is deregistered."""
    env = dict(os.environ, LD_PRELOAD=PRELOAD, LD_LIBRARY_PATH=FAKE)
    p = subprocess.Popen([PROG, "reg_mr-kv-hold-churn"], env=env,
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         text=True)
    path = os.path.join(STATE, str(p.pid))
    try:
        while p.stdout.readline().strip() not in ("held", ""):
            pass
        st = os.stat(path)
        before = (st.st_ino, st.st_ctime_ns)
        p.stdin.write("x")
        p.stdin.flush()
        while p.stdout.readline().strip() not in ("churned", ""):
            pass
        after = os.stat(path)
        with open(path) as f:
            text = f.read()
        print("# " + text.replace("\n", "\n# "))
        check((after.st_ino, after.st_ctime_ns) == before, "state file "
              "rewritten by pass-through calls (inode, ctime %s -> %s)"
              % (before, (after.st_ino, after.st_ctime_ns)))
        check("in 1 proxy 0 cannot 1" in text, text)
        # then 300 more in the region, all live (the table grows), and
        # each one found again at its deregistration
        for word, want in (("many", "in 301 proxy 0 cannot 301"),
                           ("none", "in 1 proxy 0 cannot 1")):
            p.stdin.write("x")
            p.stdin.flush()
            while p.stdout.readline().strip() not in (word, ""):
                pass
            with open(path) as f:
                text = f.read()
            check(want in text, "%s: %s" % (word, text))
    finally:
        p.communicate("x", timeout=30)
    check(p.returncode == 0, "symver: %d" % p.returncode)


def state_file_of_an_earlier_image_is_removed_at_load():
    """exec keeps the pid: a file the former image left (or a dead process
    whose pid came back) is removed when the preload loads."""
    p = subprocess.run(["sh", "-c", 'echo stale > "$KVDMABUF_PRELOAD_DIR/$$"'
                        ' && LD_PRELOAD="$0" exec sh -c \'ls "$1"\' - "$1"',
                        PRELOAD, STATE], capture_output=True, text=True,
                       timeout=30)
    check(p.returncode == 0 and p.stdout.strip() == "",
          "left: %r %s" % (p.stdout, p.stderr))


def proc_start_time(pid):
    with open("/proc/%d/stat" % pid) as f:
        return int(f.read().rsplit(")", 1)[1].split()[19])


def files_that_dead_processes_left_are_swept():
    """A process that ends without its destructor (killed, _exit: every
    test harness child) leaves its state file; the next process that
    writes one removes, once, the files of its user whose pid is gone or
    belongs to a later process (another start time), and temporary files
    of gone pids. A live writer's file, another user's and anything that
    is not a regular file stay (issue 32 item 11: 627 files piled up in
    the host's folder from the tests)."""
    d = tempfile.mkdtemp(prefix="kvd-preload-sweep-")
    gone = subprocess.Popen(["true"])
    gone.wait()
    me = os.getpid()

    def put(name, pid, start, uid=None):
        path = os.path.join(d, name)
        with open(path, "w") as f:
            f.write("kvdmabuf-preload 2\npid %d %d\nregions 0 asleep 0 "
                    "in 0 proxy 0 cannot 0 env_error 0\n" % (pid, start))
        if uid is not None:
            os.chown(path, uid, -1)
        return name

    swept = [put(str(gone.pid), gone.pid, 1),
             put(".%d.Ab12Cd" % gone.pid, gone.pid, 1),
             put(str(me), me, proc_start_time(me) + 1)]   # pid reused
    kept = [put("1", 1, proc_start_time(1))]               # alive: init
    if os.geteuid() == 0:
        kept.append(put("%d" % (gone.pid + 1000000), gone.pid + 1000000, 1,
                        uid=65534))                        # not ours
    os.mkfifo(os.path.join(d, "%d" % (gone.pid + 2000000)))
    kept.append("%d" % (gone.pid + 2000000))
    env = dict(os.environ, LD_PRELOAD=PRELOAD, LD_LIBRARY_PATH=FAKE,
               KVDMABUF_PRELOAD_DIR=d)
    p = subprocess.run([PROG, "reg_mr-kv"], env=env, capture_output=True,
                       text=True, timeout=30)
    left = sorted(os.listdir(d))
    print("# left: %s" % left)
    shutil.rmtree(d)
    check(p.returncode == 0, "symver: %d %s" % (p.returncode, p.stderr))
    for n in swept:
        check(n not in left, "%s not removed: %s" % (n, left))
    for n in kept:
        check(n in left, "%s removed: %s" % (n, left))


def inherited_declaration_alone_writes_no_state_file():
    """A program an engine starts inherits its KVDMABUF_KV_REGIONS (and
    LD_PRELOAD): with regions from the environment and no registration
    in them it is not an engine, and writes no state file (every helper
    an engine execs wrote one, issue 32 item 11). The same program once
    it registers in the region writes one (status_lists_a_live_engine_
    and_forgets_it_at_exit)."""
    d = tempfile.mkdtemp(prefix="kvd-preload-exec-")
    env = dict(os.environ, LD_PRELOAD=PRELOAD, LD_LIBRARY_PATH=FAKE,
               KVDMABUF_PRELOAD_DIR=d,
               KVDMABUF_KV_REGIONS="0x7f0000000000+0x200000:kv_cache")
    p = subprocess.Popen([sys.executable, "-c", "import ctypes; "
                          "f = ctypes.CDLL(None).kvdmabuf_preload_query; "
                          "print('held', flush=True); input()"], env=env,
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         text=True)
    try:
        held = p.stdout.readline().strip()
        left = os.listdir(d)
    finally:
        p.communicate("x", timeout=30)
    shutil.rmtree(d)
    print("# files while it ran: %s" % left)
    check(held == "held", "the child did not run under the preload: %r"
          % held)
    check(left == [], "state file of a process that only inherited the "
          "declaration: %s" % left)


def run_dlopen_engine(case):
    env = dict(os.environ, LD_PRELOAD=PRELOAD, LD_LIBRARY_PATH=FAKE)
    p = subprocess.run([os.path.join(TOP, "tests", "preload",
                                     "dlopen_engine"), case], env=env,
                       capture_output=True, text=True, timeout=30)
    for line in p.stdout.splitlines():
        print("# " + line)
    check(p.returncode == 0, "%s: status %d %s" % (case, p.returncode,
                                                   p.stderr))
    out = {l.split(":")[0]: l for l in p.stdout.splitlines()}
    check(out["mr"] == "mr: made made", out["mr"])
    return out


def dlopen_engine(case, dmabuf="1 mlx5dv_reg_dmabuf_mr@MLX5_1.25 0"):
    """@dmabuf: the counts of the two dma-buf entry points"""
    out = run_dlopen_engine(case)
    check(out["registered"] == "registered: mrs 2 proxy 2 calls "
          "reg_mr@1.1 1 reg_dmabuf_mr@1.12 %s dereg_mr@1.1 0" % dmabuf,
          "registrations through the handle bypassed the interposer: " +
          out["registered"])
    check(out["check"] == "check: 0 ", "sleep check: " + out["check"])
    check(out["deregistered"].startswith("deregistered: mrs 0 proxy 0") and
          out["deregistered"].endswith("dereg_mr@1.1 2"), out["deregistered"])
    return out


def libibverbs_loaded_locally_and_looked_up_by_dlsym_is_interposed():
    """Mooncake's TENT: dlopen("libibverbs.so.1", RTLD_LOCAL) + dlsym; the
    registrations land in the interposer, on the KV region's proxy."""
    dlopen_engine("tent")


def libibverbs_looked_up_by_dlvsym_is_interposed():
    """NCCL's ibvwrap: dlvsym at IBVERBS_1.1 and 1.12 on its handle."""
    dlopen_engine("nccl")


def libibverbs_in_no_global_scope_is_reached_as_the_next_one():
    """An object linked with -libverbs loaded RTLD_LOCAL (a Python
    extension such as Mooncake's engine.so): its calls land in the
    interposer and reach that libibverbs. (The interposer's own lookup of
    its next one once got itself back from its own dlvsym there and
    recursed; this stand-in does not always take that path, the real
    Mooncake engine under the preload in tests/mooncake does.)"""
    dlopen_engine("ext")


def mlx5dv_dmabuf_mr_is_made_on_the_proxy():
    """mlx5dv_reg_dmabuf_mr@MLX5_1.25 (rdma-core 53; libmlx5 makes the MR
    itself, not through ibv_reg_dmabuf_mr) looked up on a libmlx5 handle:
    made on the region's proxy (fd 99 in the test's declaration) at the
    MR's offset in it, its mlx5 access flags kept."""
    out = dlopen_engine("mlx5", dmabuf="0 mlx5dv_reg_dmabuf_mr@MLX5_1.25 1")
    check(out.get("mlx5") == "mlx5: calls 1 access 0x5 fd 99",
          "the provider was asked: %s" % out.get("mlx5"))


def bypassed_and_refused(case, how):
    """Case @case of dlopen_engine registered past the interposer (nothing
    recorded) and the sleep check refused, naming the object and @how."""
    out = run_dlopen_engine(case)
    check(out["registered"].startswith("registered: mrs 0 proxy 0 calls "
                                       "reg_mr@1.1 0 reg_dmabuf_mr@1.12 0"),
          "the stand-in did not bypass the interposer: " + out["registered"])
    check(out["check"].startswith("check: -16 ") and
          "verbs_ext.so calls ibv_reg_mr" in out["check"] and
          how in out["check"], "sleep check: " + out["check"])


def deepbind_object_refuses_the_sleep_by_name():
    """An object linked with -libverbs loaded RTLD_DEEPBIND binds its
    verbs calls to its own libibverbs, past the interposer: its MRs of KV
    memory are not seen (cannot be), so the sleep check refuses and names
    the object; the same object loaded without it passes (case ext)."""
    bypassed_and_refused("deep", "RTLD_DEEPBIND")


def dlmopen_namespace_object_refuses_the_sleep_by_name():
    """The -libverbs object of case ext loaded by dlmopen into a link-map
    namespace of its own: its libibverbs is that namespace's, where no
    LD_PRELOAD is, so its MRs of KV memory are not seen; the sleep check
    reads the other namespaces too, refuses and names it (before, it
    passed: dl_iterate_phdr shows only the caller's namespace)."""
    bypassed_and_refused("ns", "link-map namespace 1 (loaded by dlmopen)")


def shared_state_folder_is_not_trusted():
    """The state folder may be shared (1777): a FIFO another user left at a
    name the preload writes through, or one named like a live pid, blocks
    neither the engine's registration nor `kvdmabuf status`; a file named
    like a live process but owned by another user is not listed."""
    # a FIFO at every name of the old scheme for this pid (exec keeps it)
    p = subprocess.run(
        ["sh", "-c", 'mkfifo "$1/$$.tmp" && LD_PRELOAD="$0" '
         'LD_LIBRARY_PATH="$2" exec "$3" reg_mr', PRELOAD, STATE, FAKE, PROG],
        capture_output=True, text=True, timeout=ktap.scaled(20))
    check(p.returncode == 0, "registration with a FIFO in the folder: %d %s"
          % (p.returncode, p.stderr))
    for f in os.listdir(STATE):
        if f.endswith(".tmp"):
            os.unlink(os.path.join(STATE, f))
    live = subprocess.Popen(["sleep", "60"])
    try:
        fifo = os.path.join(STATE, str(live.pid))
        os.mkfifo(fifo)
        s = subprocess.run([CLI, "status", "--preload", "--json"],
                           capture_output=True, text=True,
                           timeout=ktap.scaled(20))
        os.unlink(fifo)
        check(s.returncode == 0 and json.loads(s.stdout)["preload"] == [],
              s.stdout + s.stderr)
        if os.geteuid() != 0:
            raise ktap.Skip("forged file: chown needs root")
        with open("/proc/%d/stat" % live.pid) as f:
            start = f.read().rsplit(")", 1)[1].split()[19]
        forged = os.path.join(STATE, str(live.pid))
        with open(forged, "w") as f:
            f.write("kvdmabuf-preload 1\npid %d %s\nregions 1 asleep 0 "
                    "mrs 0 in 0 proxy 0 cannot 0 env_error 0\nregion "
                    "0x1000+0x1000 kv proxy awake\n" % (live.pid, start))
        os.chown(forged, 65534, 65534)
        s = subprocess.run([CLI, "status", "--preload", "--json"],
                           capture_output=True, text=True,
                           timeout=ktap.scaled(20))
        os.chown(forged, 0, 0)
        t = subprocess.run([CLI, "status", "--preload", "--json"],
                           capture_output=True, text=True,
                           timeout=ktap.scaled(20))
        os.unlink(forged)
        check(json.loads(s.stdout)["preload"] == [],
              "another user's file listed: " + s.stdout)
        # the same file owned by the process's user is listed (the check
        # above is the owner's, not a parse failure)
        check([x["pid"] for x in json.loads(t.stdout)["preload"]] ==
              [live.pid], t.stdout)
    finally:
        live.kill()
        live.wait()


def malformed_environment_refuses_sleep():
    code = ("import kvdmabuf; ok, why = kvdmabuf.preload_sleep(); "
            "print(ok, why)")
    env = dict(os.environ, LD_PRELOAD=PRELOAD,
               KVDMABUF_KV_REGIONS="0x100000+junk",
               PYTHONPATH=os.path.join(TOP, "lib", "python"))
    p = subprocess.run([sys.executable, "-c", code], env=env,
                       capture_output=True, text=True, timeout=60)
    print("# " + p.stdout.strip())
    check(p.stdout.startswith("False") and "KVDMABUF_KV_REGIONS" in p.stdout,
          p.stdout + p.stderr)


def python_declares_and_sleeps():
    """The binding declares a region (as a sleep hook would) and sleeps it:
    nothing registered there, so the sleep is accepted. (The refusals, and
    the library's own sleep asking the preload, run on soft-RoCE in
    tests/preload/preload_engine, in the VM.)"""
    code = r'''
import ctypes, mmap, kvdmabuf
m = mmap.mmap(-1, 1 << 20)
a = ctypes.addressof(ctypes.c_char.from_buffer(m))
assert kvdmabuf.preload_loaded()
kvdmabuf.preload_declare(a, 1 << 20, "kv_cache")
print("state", kvdmabuf.preload_state())
ok, why = kvdmabuf.preload_sleep("kv_cache")
print("sleep", ok, why)
'''
    env = dict(os.environ, LD_PRELOAD=PRELOAD,
               PYTHONPATH=os.path.join(TOP, "lib", "python"))
    p = subprocess.run([sys.executable, "-c", code], env=env,
                       capture_output=True, text=True, timeout=60)
    for line in (p.stdout + p.stderr).splitlines():
        print("# " + line)
    check(p.returncode == 0, p.stderr)
    check("'nr_regions': 1" in p.stdout, p.stdout)
    check("sleep True" in p.stdout, p.stdout)   # nothing registered there


IMPOSTOR_C = r"""
#include <errno.h>
#include <stdio.h>
#include <stddef.h>
void kvdmabuf_preload_own(int on) { (void)on; }
int kvdmabuf_preload_declare(void *a, size_t l, const char *t, int fd,
                             unsigned long long o)
{ (void)a; (void)l; (void)t; (void)fd; (void)o; return 0; }
int kvdmabuf_preload_undeclare(void *a) { (void)a; return 0; }
int kvdmabuf_preload_set_proxy_ops(void *a, const void *o)
{ (void)a; (void)o; return 0; }
int kvdmabuf_preload_check(const void *a, size_t l, char *why, size_t n)
{ (void)a; (void)l; snprintf(why, n, "the impostor refuses"); return -EBUSY; }
int kvdmabuf_preload_sleep(const char *t, char *e, size_t n)
{ (void)t; (void)e; (void)n; return 0; }
int kvdmabuf_preload_wake(const char *t, char *e, size_t n)
{ (void)t; (void)e; (void)n; return 0; }
int kvdmabuf_preload_query(void *st) { (void)st; return 0; }
"""


def library_takes_only_a_preload_of_its_symbol_versions():
    """libkvdmabuf and its Python binding find the preload's API by symbol
    version (dlvsym, KVDMABUF_PRELOAD_0.1): an object that defines the same
    names without the versions (another interposer; an incompatible build)
    is not taken for the preload. Control: the same object with the version is, and
    its sleep check then refuses the sleep."""
    d = tempfile.mkdtemp()
    try:
        src = os.path.join(d, "impostor.c")
        with open(src, "w") as f:
            f.write(IMPOSTOR_C)
        vs = os.path.join(d, "v.map")
        with open(vs, "w") as f:
            f.write("KVDMABUF_PRELOAD_0.1 { global: kvdmabuf_preload_*; "
                    "local: *; };\n")
        code = ("import kvdmabuf, os\n"
                "print('binding sees a preload', kvdmabuf.preload_loaded())\n"
                "c = kvdmabuf.Context(config={'protocol': 'tcp'})\n"
                "c.add_region(%d, 4096, 'drm', tag='kv', drm_fd=0)\n"
                "try:\n    c.sleep('kv'); print('slept')\n"
                "except kvdmabuf.Error as e:\n    print('refused', e)\n")
        out = {}
        for name, extra in (("plain", []), ("versioned", ["-Wl,--version-script=" + vs])):
            so = os.path.join(d, name + ".so")
            subprocess.run(["cc", "-shared", "-fPIC", "-o", so, src] + extra,
                           check=True)
            env = dict(os.environ, LD_PRELOAD=so,
                       PYTHONPATH=os.path.join(TOP, "lib", "python"))
            # protocol tcp: the region is never touched, any address will do
            p = subprocess.run([sys.executable, "-c", code % (1 << 30)],
                               env=env,
                capture_output=True, text=True, timeout=60)
            print("# %s: %s %s" % (name, p.stdout.strip(),
                                   p.stderr.strip()[-200:]))
            out[name] = p.stdout
        check("slept" in out["plain"] and "preload False" in out["plain"],
              "an unversioned impostor was taken for the preload: %r" %
              out["plain"])
        check("preload True" in out["versioned"], out["versioned"])
        check("the impostor refuses" in out["versioned"], "the control "
              "never reached the check: %r" % out["versioned"])
    finally:
        shutil.rmtree(d, ignore_errors=True)


def binding_without_the_preload_says_so():
    import kvdmabuf
    if os.environ.get("LD_PRELOAD"):
        raise ktap.Skip("this run is preloaded")
    check(not kvdmabuf.preload_loaded(), "preload seen without LD_PRELOAD")


if __name__ == "__main__":
    try:
        rc = ktap.main([
        ibv_reg_mr_macro_lands_at_1_1,
        ibv_reg_mr_with_optional_access_lands_at_iova2_1_8,
        ibv_reg_mr_iova_lands_at_1_7,
        ibv_reg_mr_iova2_lands_at_1_8,
        ibv_reg_dmabuf_mr_lands_at_1_12,
        abi_1_0_lands_and_its_inner_calls_are_handled,
        outside_any_region_passes_through_but_is_seen,
        in_region_without_proxy_cannot_follow_named,
        in_region_with_proxy_is_made_on_the_proxy,
        sub_range_of_a_region_is_made_at_its_offset_in_the_proxy,
        engines_own_dmabuf_in_region_is_replaced_by_the_proxy,
        nic_without_dmabuf_mrs_falls_back_and_refuses,
        declared_after_registration_cannot_follow,
        registration_across_a_region_cannot_follow,
        rereg_outside_regions_is_forwarded_at_1_1,
        rereg_access_of_a_proxy_mr_is_forwarded_and_stays_on_the_proxy,
        rereg_translation_of_a_proxy_mr_is_refused_by_name,
        rereg_into_a_proxied_region_is_refused,
        rereg_into_a_region_without_proxy_cannot_follow,
        rereg_out_of_a_region_can_no_longer_block_it,
        status_lists_a_live_engine_and_forgets_it_at_exit,
        pass_through_calls_leave_the_state_file_alone,
        state_file_of_an_earlier_image_is_removed_at_load,
        files_that_dead_processes_left_are_swept,
        inherited_declaration_alone_writes_no_state_file,
        shared_state_folder_is_not_trusted,
        libibverbs_loaded_locally_and_looked_up_by_dlsym_is_interposed,
        libibverbs_looked_up_by_dlvsym_is_interposed,
        libibverbs_in_no_global_scope_is_reached_as_the_next_one,
        mlx5dv_dmabuf_mr_is_made_on_the_proxy,
        deepbind_object_refuses_the_sleep_by_name,
        dlmopen_namespace_object_refuses_the_sleep_by_name,
        malformed_environment_refuses_sleep,
        python_declares_and_sleeps,
        library_takes_only_a_preload_of_its_symbol_versions,
        binding_without_the_preload_says_so,
        ])
    finally:
        shutil.rmtree(STATE, ignore_errors=True)
    sys.exit(rc)
