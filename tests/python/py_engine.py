#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""py_engine - a Python engine on kvdmabuf with rdma-core's own Python verbs
binding (pyverbs), over soft-RoCE (rxe0 for the engine, rxe1 for a peer
process) in the VM:

* the engine registers its KV region through kvdmabuf on its own PD, got
  through ctypes from libibverbs as an engine without pyverbs would
  (tests/python/verbs_ctypes.py: pyverbs before rdma-core 59 does not expose the
  struct ibv_pd *), and publishes the keys; a second process reads and writes that memory by
  RDMA with them; the engine sleeps (memory unpinned and given back) and
  wakes (new memory at the same address); the new keys arrive through the
  key-change callback before I/O resumes, and every byte moved by the peer
  after each wake is right; a peer still holding a key from before the last
  sleep gets a remote access error, never the old pages;
* a gate refusal (at open and at sleep) and a drain time-out raise the
  right exception with the library's message;
* the vLLM and SGLang examples (lib/python/examples) run to success.
"""
import hashlib
import json
import mmap
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))  # ktap
import ktap
from ktap import Skip, check

TOP = ktap.use_build_tree()
sys.path.insert(0, os.path.join(TOP, "lib", "python", "examples"))

LEN = 256 << 10
IBDEV_A = os.environ.get("KVDMABUF_IBDEV_A", "rxe0")
IBDEV_B = os.environ.get("KVDMABUF_IBDEV_B", "rxe1")
ACCESS = 1 | 2 | 4        # local write, remote write, remote read
WC_SUCCESS, WC_REM_ACCESS_ERR = 0, 10


def need_verbs():
    try:
        import pyverbs.device  # noqa: F401
    except ImportError as e:
        raise Skip("python3-pyverbs not installed: %s" % e)
    if not os.path.exists("/sys/class/infiniband/" + IBDEV_A):
        raise Skip("no verbs device %s" % IBDEV_A)


def config(extra=""):
    f = tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False)
    f.write("protocol: rdma\nnics: [%s]\n%s" % (IBDEV_A, extra))
    f.close()
    return f.name


class EngineEndpoint:
    """The engine's RC QP, on the PD it gave kvdmabuf (verbs_ctypes)."""

    def __init__(self, dev):
        import verbs_ctypes
        self.dev, self.qp = dev, verbs_ctypes.RCQueuePair(dev, ACCESS)

    def me(self):
        g = self.dev.gid().hex()
        return {"qpn": self.qp.qp_num,
                "gid": ":".join(g[i:i + 4] for i in range(0, 32, 4))}

    def connect(self, peer):
        self.qp.connect(peer["qpn"],
                        bytes.fromhex(peer["gid"].replace(":", "")))

    def close(self):
        self.qp.close()


class Endpoint:
    """An RC QP on @pd (pyverbs), connected by exchanging QPN and GID."""

    def __init__(self, ctx, pd):
        from pyverbs.cq import CQ
        from pyverbs.qp import QP, QPAttr, QPCap, QPInitAttr
        import pyverbs.enums as e
        self.ctx, self.pd = ctx, pd
        self.cq = CQ(ctx, 16)
        init = QPInitAttr(qp_type=e.IBV_QPT_RC, scq=self.cq, rcq=self.cq,
                          cap=QPCap(max_send_wr=8, max_recv_wr=8,
                                    max_send_sge=1, max_recv_sge=1))
        attr = QPAttr(port_num=1)
        attr.qp_access_flags = ACCESS
        self.qp = QP(pd, init, attr)

    def me(self):
        return {"qpn": self.qp.qp_num,
                "gid": self.ctx.query_gid(port_num=1, index=0).gid}

    def connect(self, peer):
        from pyverbs.addr import AHAttr, GID, GlobalRoute
        from pyverbs.qp import QPAttr
        import pyverbs.enums as e
        a = QPAttr(port_num=1)
        a.qp_access_flags = ACCESS
        a.path_mtu = e.IBV_MTU_1024
        a.dest_qp_num = peer["qpn"]
        a.rq_psn = a.sq_psn = 0
        a.max_dest_rd_atomic = a.max_rd_atomic = 4
        # ack timeout of 1 s and 6 retries: tests/timeout_scale.h says why
        a.min_rnr_timer, a.timeout, a.retry_cnt, a.rnr_retry = 12, 18, 6, 7
        gr = GlobalRoute(dgid=GID(peer["gid"]), sgid_index=0, hop_limit=1)
        a.ah_attr = AHAttr(gr=gr, is_global=1, port_num=1)
        self.qp.to_rts(a)


# ---- the peer process: RDMA on the engine's memory, by command ----

def peer_main():
    from pyverbs.device import Context
    from pyverbs.mr import MR
    from pyverbs.pd import PD
    from pyverbs.wr import SGE, SendWR
    import pyverbs.enums as e
    ctx = Context(name=IBDEV_B)
    pd = PD(ctx)
    ep = Endpoint(ctx, pd)
    mr = MR(pd, LEN, ACCESS)
    send = lambda obj: (print(json.dumps(obj)), sys.stdout.flush())
    send(ep.me())
    ep.connect(json.loads(sys.stdin.readline()))
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["op"] == "write":
            mr.write(bytes.fromhex(cmd["data"]), len(cmd["data"]) // 2)
        op = e.IBV_WR_RDMA_WRITE if cmd["op"] == "write" else \
            e.IBV_WR_RDMA_READ
        n = cmd["len"]
        wr = SendWR(opcode=op, num_sge=1, sg=[SGE(mr.buf, n, mr.lkey)],
                    send_flags=e.IBV_SEND_SIGNALED)
        wr.set_wr_rdma(cmd["rkey"], cmd["addr"])
        ep.qp.post_send(wr)
        polled = 0
        while not polled:
            polled, wcs = ep.cq.poll()
        out = {"status": wcs[0].status}
        if cmd["op"] == "read":
            out["sha"] = hashlib.sha256(mr.read(n, 0)).hexdigest()
        send(out)


class Peer:
    def __init__(self, engine_ep):
        self.p = subprocess.Popen([sys.executable, __file__, "--peer"],
                                  stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True)
        peer = json.loads(self.p.stdout.readline())
        engine_ep.connect(peer)
        self.call(engine_ep.me(), reply=False)

    def call(self, obj, reply=True):
        self.p.stdin.write(json.dumps(obj) + "\n")
        self.p.stdin.flush()
        return json.loads(self.p.stdout.readline()) if reply else None

    def write(self, addr, rkey, data):
        return self.call({"op": "write", "addr": addr, "rkey": rkey,
                          "len": len(data), "data": data.hex()})["status"]

    def read(self, addr, rkey, n):
        return self.call({"op": "read", "addr": addr, "rkey": rkey, "len": n})

    def close(self):
        self.p.stdin.close()
        self.p.wait(timeout=ktap.scaled(30))


def vm_kib(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return -1


def pattern(cycle, who):
    return bytes((i * 7 + cycle * 31 + who) & 0xff for i in range(LEN))


# ---- tests ----

def engine_keeps_peer_rdma_right_through_sleep_and_wake():
    need_verbs()
    import kvdmabuf
    import verbs_ctypes
    from hostvmm import HostVMM

    dev = verbs_ctypes.Device(IBDEV_A)
    # a pyverbs PD: taken where pyverbs gives its pointer (rdma-core 59 on),
    # else refused with what to pass, without touching the object
    from pyverbs.device import Context
    from pyverbs.pd import PD
    vctx = Context(name=IBDEV_A)
    vpd = PD(vctx)
    if (kvdmabuf.rdma_core_release() or 0) < \
            kvdmabuf.PYVERBS_PD_POINTER_SINCE:
        try:
            kvdmabuf.Context(config(), pds=[vpd])
            raise AssertionError("a pyverbs PD of rdma-core %s was taken"
                                 % kvdmabuf.rdma_core_release())
        except TypeError as e:
            check("ibv_alloc_pd" in str(e), str(e))
    else:
        check(kvdmabuf.pd_pointer(vpd) == vpd.pd)
    vpd.close()
    vctx.close()
    announced = []

    def on_keys(regions):
        # I/O is still stopped: nothing may use the old keys meanwhile
        announced.append([(r.keys(0), r.io_begin()) for r in regions])

    ctx = kvdmabuf.Context(config(), pds=[dev.pd], key_change=on_keys)
    mem = HostVMM(LEN)
    kv = ctx.add_region(mem.addr, LEN, "host", tag="kv_cache",
                        released_at_sleep=True)
    check(kv.info().mode == kvdmabuf.MODE_REREGISTER, str(kv.info()))
    ep = EngineEndpoint(dev)
    peer = Peer(ep)
    _, rkey, gen = kv.keys(0)
    stale = None
    for cycle in range(1, 4):
        check(peer.write(mem.addr, rkey, pattern(cycle, 1)) == WC_SUCCESS)
        check(mem.read(0, LEN) == pattern(cycle, 1), "peer write wrong")
        mem.write(0, pattern(cycle, 2))
        r = peer.read(mem.addr, rkey, LEN)
        check(r["status"] == WC_SUCCESS and
              r["sha"] == hashlib.sha256(pattern(cycle, 2)).hexdigest(),
              "peer read wrong: %s" % r)
        check(vm_kib("VmPin") >= LEN // 1024, "not pinned while awake")

        check(mem.resident_pages() == LEN // mmap.PAGESIZE)
        ctx.sleep("kv_cache")
        mem.release()
        check(vm_kib("VmPin") == 0, "still pinned asleep: %d kB" %
              vm_kib("VmPin"))
        check(mem.resident_pages() == 0, "memory not given back")
        mem.remap()
        announced.clear()
        ctx.wake("kv_cache")
        check(len(announced) == 1 and len(announced[0]) == 1, str(announced))
        (lk, new_rkey, new_gen), io_ok = announced[0][0]
        check(not io_ok, "I/O allowed before the new keys were announced")
        check(new_gen == gen + 1 and (lk, new_rkey, new_gen) == kv.keys(0))
        stale, rkey, gen = rkey, new_rkey, new_gen
        check(mem.read(0, LEN) == bytes(LEN), "wake must map new memory")
    # a key from before the last sleep reaches nothing
    r = peer.read(mem.addr, stale, LEN)
    check(r["status"] == WC_REM_ACCESS_ERR, "stale rkey gave %s" % r)
    peer.close()
    ctx.close()
    ep.close()
    dev.close()
    mem.close()


def gate_refusal_raises_with_the_reason():
    need_verbs()
    import kvdmabuf
    os.environ["MC_FORCE_MNNVL"] = "1"
    try:
        kvdmabuf.Context(config())
        raise AssertionError("open not refused")
    except kvdmabuf.GateRefused as e:
        check("MC_FORCE_MNNVL" in e.strerror, e.strerror)
    finally:
        del os.environ["MC_FORCE_MNNVL"]
    ctx = kvdmabuf.Context(config())
    os.environ["SGLANG_MOONCAKE_CUSTOM_MEM_POOL"] = "NVLINK"
    try:
        ctx.sleep()
        raise AssertionError("sleep not refused")
    except kvdmabuf.GateRefused as e:
        check("SGLANG_MOONCAKE_CUSTOM_MEM_POOL" in e.strerror, e.strerror)
    finally:
        del os.environ["SGLANG_MOONCAKE_CUSTOM_MEM_POOL"]
    ctx.close()


def drain_timeout_raises_with_the_count():
    need_verbs()
    import kvdmabuf
    from hostvmm import HostVMM
    ctx = kvdmabuf.Context(config(), drain_timeout_ms=100)
    mem = HostVMM(LEN)
    kv = ctx.add_region(mem.addr, LEN, "host", tag="kv",
                        released_at_sleep=True)
    with kv.io():
        try:
            ctx.sleep()
            raise AssertionError("sleep did not time out")
        except kvdmabuf.DrainTimeout as e:
            check("1 transfer(s) still in flight" in e.strerror, e.strerror)
    check(not kv.info().asleep)
    ctx.sleep()
    ctx.close()
    mem.close()


def engine_examples_run():
    need_verbs()
    py = os.path.join(TOP, "lib", "python")
    env = dict(os.environ, KVDMABUF_CONFIG=config(),
               PYTHONPATH=py + ":" + os.path.join(py, "examples"))
    out = {}
    for ex in ("vllm_sleep.py", "sglang_sleep.py"):
        p = subprocess.run([sys.executable, os.path.join(py, "examples", ex)],
                           env=env, capture_output=True, text=True,
                           timeout=ktap.scaled(120))
        for line in (p.stdout + p.stderr).splitlines():
            print("# %s: %s" % (ex, line))
        check(p.returncode == 0, "%s exited %d" % (ex, p.returncode))
        out[ex] = p.stdout
    # host KV memory is REREGISTER on rxe: every wake republishes
    check(out["vllm_sleep.py"].count("(republished)") == 4,
          "vLLM connector did not republish every wake")


if __name__ == "__main__":
    if sys.argv[1:] == ["--peer"]:
        peer_main()
        sys.exit(0)
    sys.exit(ktap.main([
        engine_keeps_peer_rdma_right_through_sleep_and_wake,
        gate_refusal_raises_with_the_reason,
        drain_timeout_raises_with_the_count,
        engine_examples_run,
    ]))
