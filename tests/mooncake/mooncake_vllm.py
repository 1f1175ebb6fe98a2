#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""mooncake_vllm - the vLLM stand-in with the plugin and the real Mooncake
store, nothing but the plugin installed and LD_PRELOAD (issue 31 item 7).

Engine A is the vLLM stand-in (tests/python/vllm_standin: its Worker, its
CuMemAllocator, its tag hooks) whose allocator takes its memory from the
CUDA driver API (driver_vmm.py: cuMemCreate, cuMemMap, cuMemSetAccess;
cuMemUnmap, cuMemRelease at sleep) of tests/fake_cuda's libcuda, each
allocation a vgem buffer (FAKE_CUDA_VGEM=1: its export a real dma-buf).
The plugin (lib/python/examples/vllm_plugin) is found through its entry
point as vLLM finds plugins; A runs under
LD_PRELOAD=libkvdmabuf-preload.so. A's KV connector stands for vLLM's
Mooncake connectors' register_kv_caches: it registers each KV allocation
with the store (register_buffer), which the preload makes on the region's
proxy because the plugin made the allocation a CUDA region first. Engine B
(mooncake_store.py's engine, host memory) holds the store's segment; every
put and get of A is an RDMA transfer over soft-RoCE with dma-buf MRs.

Cycles as mooncake_store.py's: A puts, sleeps (worker.sleep(1): the
plugin's before_unmap hook sleeps the KV region, then the allocator
unmaps), B puts while A sleeps, A wakes (worker.wake_up(): map, set
access, then the plugin's after_map hook wakes the region on the new
memory), gets B's blocks, puts new ones, and both read them back. Checked:
every block right, A's KV memory freed while it sleeps (Shmem), no
registration call at sleep or wake, Mooncake's MR (its keys) unchanged.

A's connector has sleep support of its own (release unregisters the KV
cache from the store, restore registers it again, through the tag hooks):
with the plugin and the KV cache following, it is skipped, never called.

Control: the same engine without the plugin (VLLM_PLUGINS empty) and with
the seed's connector (no sleep support). vgem
memory cannot be registered by address, so its KV is host memory there
(KVDMABUF_STANDIN_MEM=host): the seed's failure, every block moved after
the first wake wrong with no transfer error.

Two nodes (tests/vm/check.sh twonode: KVDMABUF_NODE set): engine A with
the plugin on node 1, driven over a TCP connection by the scenario on node
2, which runs the master and B; every put and get crosses the wire between
the two guests' soft-RoCE, judged as on one node.

The plugin is laid out as pip would install it (its dist-info with the
entry point, on PYTHONPATH): the guest's Python has no setuptools to
build it; the pip path itself is lib_install's test (host).
"""
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import mooncake_store as ms  # noqa: E402
from mooncake_store import ktap, check  # noqa: E402

TOP = ms.TOP
STANDIN = os.path.join(TOP, "tests", "python", "vllm_standin")
PLUGIN = os.path.join(TOP, "lib", "python", "examples", "vllm_plugin")
FAKE_CUDA = os.path.join(TOP, "tests", "fake_cuda")
BS, BLOCKS, KV = ms.BS, ms.BLOCKS, ms.KV
WEIGHTS = 1 << 20
CYCLES = 2


class StoreConnector:
    """Stands for the register_kv_caches of vLLM's Mooncake connectors as
    the seed had them (no sleep support): the KV cache's memory registered
    with the store."""

    def __init__(self, store):
        self.store, self.rcs, self.kv, self.calls = store, [], [], []

    def register_kv_caches(self, kv_caches):
        self.kv = list(kv_caches.values())
        self.rcs = [self.store.register_buffer(addr, n)
                    for addr, n in self.kv]


class SleepyStoreConnector(StoreConnector):
    """The same with sleep support of its own, as issue 31 describes
    today's (supports_sleep_mode, release_kv_caches, restore_kv_caches
    through the tag hooks of kv_cache): release unregisters the KV cache
    from the store, restore registers it again (the engine-side fix: new
    keys). Under the plugin, with the KV cache following, both are
    skipped."""

    @classmethod
    def supports_sleep_mode(cls, config):
        return True

    def release_kv_caches(self):
        self.calls.append("release")
        for addr, _ in self.kv:
            self.store.unregister_buffer(addr)

    def restore_kv_caches(self):
        self.calls.append("restore")
        self.rcs = [self.store.register_buffer(addr, n)
                    for addr, n in self.kv]


class VllmEngine:
    """Engine A: the stand-in vLLM worker; ops by command as
    mooncake_store's Engine."""

    def __init__(self, a):
        self.store = ms.store_setup(a)
        # the connector vLLM's configuration names, made by the factory
        # (which the plugin wraps when vLLM loads it)
        from vllm.distributed.kv_transfer.kv_connector import factory
        plugin = os.environ.get("VLLM_PLUGINS") != ""
        self.conn = conn = (SleepyStoreConnector if plugin
                            else StoreConnector)(self.store)
        factory.KVConnectorFactory.create_connector = classmethod(
            lambda cls, config=None, role="worker": conn)
        from vllm.plugins import load_general_plugins, loaded
        load_general_plugins()
        self.plugins = list(loaded)
        from vllm.v1.worker.gpu_worker import Worker
        from vllm.device_allocator import get_mem_allocator_instance
        self.worker = Worker()
        self.worker.load_model([WEIGHTS])
        self.worker.initialize_from_config([KV])
        if conn.rcs != [0]:
            raise RuntimeError("register_buffer of the KV cache: %s" %
                               conn.rcs)
        self.addr = self.worker.kv_caches[0][0]
        self.alloc = get_mem_allocator_instance().pointer_to_data[self.addr]
        self.pin_base = ms.vm_kib("VmPin")

    def stats(self):
        out = {"plugins": self.plugins, "reg_calls": ms.preload_reg_calls(),
               "mrs": ms.preload_report(), "connector": list(self.conn.calls),
               "pin_kib": ms.vm_kib("VmPin") - self.pin_base}
        try:
            import kvdmabuf_vllm
            regions = kvdmabuf_vllm.kv_regions()
            out["modes"] = [r.info().mode for r in regions.values()]
        except ImportError:
            out["modes"] = []
        return out

    def op_fill(self, c):
        for i in range(BLOCKS):
            self.alloc.mem.write(i * BS, ms.pattern(c["cycle"], "A", i))
        return {}

    def op_put(self, c):
        return {"rc": [self.store.put_from(k, self.addr + i * BS, BS)
                       for k, i in zip(c["keys"], c["blocks"])]}

    def op_get(self, c):
        rcs, shas = [], []
        for k, i in zip(c["keys"], c["blocks"]):
            self.alloc.mem.write(i * BS, bytes(BS))
            rcs.append(self.store.get_into(k, self.addr + i * BS, BS))
            shas.append(ms.sha(self.alloc.mem.read(i * BS, BS)))
        return {"rc": rcs, "sha": shas}

    def op_sleep(self, c):
        shmem = ms.vm_kib("Shmem", "/proc/meminfo")
        self.worker.sleep(1)
        freed = shmem - ms.vm_kib("Shmem", "/proc/meminfo")
        until = time.monotonic() + ktap.scaled(2)
        while freed < (KV >> 10) * 9 // 10 and time.monotonic() < until:
            time.sleep(0.05)
            freed = max(freed, shmem - ms.vm_kib("Shmem", "/proc/meminfo"))
        out = self.stats()
        out["shmem_freed_kib"] = freed
        return out

    def op_wake(self, c):
        self.worker.wake_up()
        return self.stats()

    def op_stats(self, c):
        return self.stats()

    def op_close(self, c):
        self.store.unregister_buffer(self.addr)
        self.store.close()
        return {}


def plugin_site(d):
    """The plugin as pip lays it out: its package and a dist-info with the
    entry point of its pyproject.toml, in @d."""
    shutil.copytree(os.path.join(PLUGIN, "kvdmabuf_vllm"),
                    os.path.join(d, "kvdmabuf_vllm"))
    info = os.path.join(d, "kvdmabuf_vllm-0.0.0.dist-info")
    os.mkdir(info)
    with open(os.path.join(info, "METADATA"), "w") as f:
        f.write("Metadata-Version: 2.1\nName: kvdmabuf-vllm\n"
                "Version: 0.0.0\n")
    with open(os.path.join(PLUGIN, "pyproject.toml")) as f:
        eps = [l.split("=", 1) for l in f if l.startswith("kvdmabuf =")]
    check(eps, "the plugin's entry point not found in its pyproject.toml")
    with open(os.path.join(info, "entry_points.txt"), "w") as f:
        f.write("[vllm.general_plugins]\n%s = %s\n" % (
            eps[0][0].strip(), eps[0][1].strip().strip('"')))
    return d


def a_env(tmp, conf, plugin):
    """Engine A's environment: the plugin as pip lays it out (in @tmp),
    the preload with kvdmabuf configuration @conf, the fake libcuda on
    vgem; without @plugin, no plugin (VLLM_PLUGINS empty) and host KV."""
    site = plugin_site(os.path.join(tmp, "site"))
    env = {"LD_PRELOAD": ms.PRELOAD, "KVDMABUF_CONFIG": conf,
           "LD_LIBRARY_PATH": FAKE_CUDA, "FAKE_CUDA_VGEM": "1",
           "KVDMABUF_STANDIN_MEM": "cuda" if plugin else "host",
           "PYTHONPATH": os.pathsep.join([
               site, STANDIN, os.path.join(TOP, "lib", "python"),
               os.path.join(TOP, "lib", "python", "examples"), HERE])}
    if not plugin:
        env["VLLM_PLUGINS"] = ""
    return env


def seed_cycles(a, b, plugin):
    """The seed's cycles between engine A (the vLLM stand-in) and B.
    Returns the tally and A's figures per cycle."""
    t = ms.Tally()
    mem = []
    blocks = list(range(BLOCKS))

    def keys(tag, c):
        return ["vllm%d-%s-c%d-%d" % (plugin, tag, c, i) for i in blocks]

    def ok_puts(r):
        t.errors += sum(1 for x in r["rc"] if x != 0)

    def judge(row, r, c, who):
        for i, (rc, h) in enumerate(zip(r["rc"], r["sha"])):
            t.errors += rc < 0
            t.add(row, rc == BS and h == ms.sha(ms.pattern(c, who, i)))

    for c in range(1, CYCLES + 1):
        awake = a.call("stats")
        a.call("fill", cycle=c)
        ok_puts(a.call("put", keys=keys("pre", c), blocks=blocks))
        judge("pre", b.call("get", keys=keys("pre", c), blocks=blocks),
              c, "A")
        asleep = a.call("sleep")
        b.call("fill", cycle=c)
        ok_puts(b.call("put", keys=keys("B", c), blocks=blocks))
        woke = a.call("wake")
        judge("b_while", a.call("get", keys=keys("B", c), blocks=blocks),
              c, "B")
        a.call("fill", cycle=100 + c)
        ok_puts(a.call("put", keys=keys("post", c), blocks=blocks))
        judge("a_post_b", b.call("get", keys=keys("post", c),
                                 blocks=blocks), 100 + c, "A")
        judge("a_post_a", a.call("get", keys=keys("post", c),
                                 blocks=blocks), 100 + c, "A")
        mem.append((awake, asleep, woke, a.call("stats")))
    return t, mem


def vllm_scenario(port_base, plugin):
    """Master, B, A (the vLLM stand-in, with the plugin or without) on
    this node; the cycles."""
    with ms.StoreRun(port_base, "kvd-mc-vllm-") as run:
        a = run.engine_a(os.path.abspath(__file__),
                         a_env(run.tmp, run.conf, plugin))
        return seed_cycles(a, run.b, plugin)


ROWS = ("pre", "b_while", "a_post_b", "a_post_a")


def judge_with_the_plugin(t, mem, where):
    """Every block right, the KV freed while asleep, no registration at
    sleep or wake, the store's MR on the proxy and unchanged, the
    connector's own release/restore never called."""
    import kvdmabuf
    n = CYCLES * BLOCKS
    for key in ROWS:
        print("#   %-10s %d/%d" % (key, t.rows[key][0], t.rows[key][1]))
    print("#   plugins %s, regions' modes %s, MR %s" % (
        mem[0][0]["plugins"], mem[0][0]["modes"], mem[0][0]["mrs"]))
    check(mem[0][0]["plugins"] == ["kvdmabuf"], "%s: plugins loaded: %s" %
          (where, mem[0][0]["plugins"]))
    check(mem[0][0]["modes"] == [kvdmabuf.MODE_FOLLOW], "%s: the KV "
          "region: %s" % (where, mem[0][0]["modes"]))
    for key in ROWS:
        check(t.rows[key] == [n, n], "%s: %s: %s" % (where, key,
                                                   t.rows[key]))
    check(t.errors == 0, "%s: %d transfer errors" % (where, t.errors))
    mr0 = mem[0][0]["mrs"]
    check(len(mr0.splitlines()) == 1 and " on-proxy" in mr0,
          "%s: the store's MR of the KV cache is not on the proxy: %r" %
          (where, mr0))
    for c, (aw, sl, wk, end) in enumerate(mem, 1):
        print("#   cycle %d: Shmem down by %d KiB at sleep (KV %d KiB)" %
              (c, sl["shmem_freed_kib"], KV >> 10))
        check(sl["shmem_freed_kib"] >= (KV >> 10) * 3 // 4, "%s, cycle %d: "
              "the KV held while asleep: %d KiB freed" %
              (where, c, sl["shmem_freed_kib"]))
        check(all(x["mrs"] == mr0 for x in (aw, sl, wk, end)), "%s, cycle "
              "%d: the store's MR changed: %s" % (where, c, [
                  x["mrs"] for x in (aw, sl, wk, end)]))
        check(aw["reg_calls"] == sl["reg_calls"] == wk["reg_calls"] ==
              end["reg_calls"], "%s, cycle %d: registrations at sleep or "
              "wake: %s" % (where, c, [x["reg_calls"] for x in
                                       (aw, sl, wk, end)]))
        # the connector's own release/restore: skipped, the KV follows
        check(end["connector"] == [], "%s, cycle %d: the connector "
              "released and restored: %s" % (where, c, end["connector"]))


def vllm_with_the_plugin_every_block_right_nothing_held_keys_unchanged():
    """The stand-in vLLM with the plugin, the real store, LD_PRELOAD: every
    block right after each wake, the KV freed while asleep, no
    registration at sleep or wake, the store's MR unchanged."""
    ms.need_follow_lane()
    t0 = time.monotonic()
    with ms.Network():
        t, mem = vllm_scenario(18700, True)
    print("# vLLM stand-in + plugin + Mooncake store: %d cycles, %.1f s" %
          (CYCLES, time.monotonic() - t0))
    judge_with_the_plugin(t, mem, "one node")


def vllm_without_the_plugin_is_silently_wrong():
    """Control: the same engine without the plugin: after the first wake
    every block moved is wrong, with no transfer error. User space only
    (host KV, no proxy): where the store's scenarios run."""
    ms.need_follow_lane()
    ms.need_scenarios()
    with ms.Network():
        t, mem = vllm_scenario(18800, False)
    n = CYCLES * BLOCKS
    for key in ROWS:
        print("#   %-10s %d/%d" % (key, t.rows[key][0], t.rows[key][1]))
    check(mem[0][0]["plugins"] == [], "plugins loaded: %s" %
          mem[0][0]["plugins"])
    check(t.errors == 0, "%d transfer errors: the failure must be silent" %
          t.errors)
    for key in ("b_while", "a_post_b", "a_post_a"):
        check(t.rows[key] == [0, n], "without the plugin, %s: %s right "
              "(expected none)" % (key, t.rows[key]))


# ---- two nodes (tests/vm/two-node.sh): A on node 1; B, the master and
# the scenario on node 2, every transfer over the wire between them ----

TWO_NODE_PORTS = 18900      # the master, B and A as vllm_scenario's
CTL_PORT = 18990            # node 1's: node 2 drives engine A through it


class RemoteEngine(ms.Proc):
    """Engine A on node 1 (two_node_engine_a), driven over a TCP
    connection as ms.Proc drives an engine of this node over pipes; the
    first line sent is the engine's arguments."""

    def __init__(self, peer, conf):
        self.who, self.log = "A (node 1)", None
        end = time.monotonic() + ktap.scaled(300)
        while True:
            try:
                self.sock = socket.create_connection((peer, CTL_PORT), 5)
                break
            except OSError as e:
                check(time.monotonic() < end, "node 1 (%s:%d) does not "
                      "answer: %s" % (peer, CTL_PORT, e))
                time.sleep(1)
        self.sock.settimeout(None)
        # one file each way: select() needs the reader's fileno()
        self.rx, self.tx = self.sock.makefile("r"), self.sock.makefile("w")
        self.tx.write(json.dumps(conf) + "\n")
        self.tx.flush()
        self._ready()

    def status(self):
        return None if self.sock.fileno() >= 0 else "closed"

    def _end(self):
        self.rx.close()
        self.tx.close()
        self.sock.close()


def two_node_engine_a():
    """Node 1 of two: engine A, the vLLM stand-in with the plugin under
    the preload on this node's rxe0, served to node 2's scenario over one
    TCP connection; passes when the engine ran to node 2's close."""
    ms.need_follow_lane()
    py = ms.python_of_venv()
    tmp = tempfile.mkdtemp(prefix="kvd-mc-2node-a-")
    try:
        conf = ms.a_config(tmp)
        env = dict(ms.engine_env(), **a_env(tmp, conf, True))
        log = os.path.join(tmp, "engine-A.log")
        with socket.create_server(("", CTL_PORT)) as srv:
            srv.settimeout(ktap.scaled(600))
            conn, peer = srv.accept()
        with conn:
            conn.settimeout(ktap.scaled(600))
            line = b""
            while not line.endswith(b"\n"):
                got = conn.recv(1)
                check(got, "node 2 closed before naming the engine")
                line += got
            conn.settimeout(None)
            a = dict(json.loads(line), config=conf)
            print("# node 1: engine A for %s, on %s" % (peer[0], a["host"]))
            p = subprocess.Popen([py, os.path.abspath(__file__), "--engine",
                                  json.dumps(a)], stdin=conn, stdout=conn,
                                 stderr=open(log, "w"), env=env)
            try:
                rc = p.wait(timeout=ms.REPLY_TIMEOUT * 4)
            except subprocess.TimeoutExpired:
                p.kill()
                rc = p.wait()
        if rc != 0:
            ms.show_log(log)
        check(rc == 0, "engine A exited with status %s" % rc)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def two_node_vllm_with_the_plugin_every_block_right():
    """Node 2 of two: the master and B here, engine A on node 1 (the
    stand-in vLLM with the plugin under the preload): the seed's cycles
    over the wire, judged as on one node."""
    ms.need_follow_lane()
    peer, me = os.environ["KVDMABUF_NODE_PEER"], "10.77.0.2"
    ms.ip("link", "set", "lo", "up")
    t0 = time.monotonic()
    with ms.StoreRun(TWO_NODE_PORTS, "kvd-mc-2node-", ip_b=me,
                     dev_b=ms.IBDEV_A, master_ip=me) as run:
        a = RemoteEngine(peer, dict(
            run.common, who="A", host="%s:%d" % (peer, TWO_NODE_PORTS + 20),
            dev=ms.IBDEV_A, segment=0))
        run.engines.append(a)
        t, mem = seed_cycles(a, run.b, True)
    print("# two nodes: vLLM stand-in + plugin on node 1, Mooncake store "
          "on node 2: %d cycles, %.1f s" % (CYCLES, time.monotonic() - t0))
    judge_with_the_plugin(t, mem, "two nodes")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--engine"]:
        sys.exit(ms.engine_main(sys.argv[2], VllmEngine))
    node = os.environ.get("KVDMABUF_NODE")
    if node:
        sys.exit(ktap.main([two_node_engine_a] if node == "1" else
                           [two_node_vllm_with_the_plugin_every_block_right]))
    sys.exit(ktap.main([
        vllm_with_the_plugin_every_block_right_nothing_held_keys_unchanged,
        vllm_without_the_plugin_is_silently_wrong,
    ]))
