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

The plugin is laid out as pip would install it (its dist-info with the
entry point, on PYTHONPATH): the guest's Python has no setuptools to
build it; the pip path itself is lib_install's test (host).
"""
import os
import shutil
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import mooncake_store as ms  # noqa: E402
from mooncake_store import ktap, Skip, check  # noqa: E402

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


def vllm_scenario(port_base, plugin):
    """Master, B, A (the vLLM stand-in, with the plugin or without); the
    cycles. Returns the tally and A's figures per cycle."""
    t = ms.Tally()
    mem = []
    with ms.StoreRun(port_base, "kvd-mc-vllm-") as run:
        site = plugin_site(os.path.join(run.tmp, "site"))
        env = {"LD_PRELOAD": ms.PRELOAD, "KVDMABUF_CONFIG": run.conf,
               "LD_LIBRARY_PATH": FAKE_CUDA, "FAKE_CUDA_VGEM": "1",
               "KVDMABUF_STANDIN_MEM": "cuda" if plugin else "host",
               "PYTHONPATH": os.pathsep.join([
                   site, STANDIN, os.path.join(TOP, "lib", "python"),
                   os.path.join(TOP, "lib", "python", "examples"), HERE])}
        if not plugin:
            env["VLLM_PLUGINS"] = ""
        a = run.engine_a(os.path.abspath(__file__), env)
        b = run.b
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


ROWS = ("pre", "b_while", "a_post_b", "a_post_a")


def vllm_with_the_plugin_every_block_right_nothing_held_keys_unchanged():
    """The stand-in vLLM with the plugin, the real store, LD_PRELOAD: every
    block right after each wake, the KV freed while asleep, no
    registration at sleep or wake, the store's MR unchanged."""
    ms.need_follow_lane()
    import kvdmabuf
    t0 = time.monotonic()
    with ms.Network():
        t, mem = vllm_scenario(18700, True)
    n = CYCLES * BLOCKS
    print("# vLLM stand-in + plugin + Mooncake store: %d cycles, %.1f s" %
          (CYCLES, time.monotonic() - t0))
    for key in ROWS:
        print("#   %-10s %d/%d" % (key, t.rows[key][0], t.rows[key][1]))
    print("#   plugins %s, regions' modes %s, MR %s" % (
        mem[0][0]["plugins"], mem[0][0]["modes"], mem[0][0]["mrs"]))
    check(mem[0][0]["plugins"] == ["kvdmabuf"], "plugins loaded: %s" %
          mem[0][0]["plugins"])
    check(mem[0][0]["modes"] == [kvdmabuf.MODE_FOLLOW], "the KV region: %s"
          % mem[0][0]["modes"])
    for key in ROWS:
        check(t.rows[key] == [n, n], "%s: %s" % (key, t.rows[key]))
    check(t.errors == 0, "%d transfer errors" % t.errors)
    mr0 = mem[0][0]["mrs"]
    check(len(mr0.splitlines()) == 1 and " on-proxy" in mr0,
          "the store's MR of the KV cache is not on the proxy: %r" % mr0)
    for c, (aw, sl, wk, end) in enumerate(mem, 1):
        print("#   cycle %d: Shmem down by %d KiB at sleep (KV %d KiB)" %
              (c, sl["shmem_freed_kib"], KV >> 10))
        check(sl["shmem_freed_kib"] >= (KV >> 10) * 3 // 4, "cycle %d: the "
              "KV held while asleep: %d KiB freed" % (c, sl["shmem_freed_kib"]))
        check(all(x["mrs"] == mr0 for x in (aw, sl, wk, end)), "cycle %d: "
              "the store's MR changed: %s" % (c, [x["mrs"] for x in
                                                   (aw, sl, wk, end)]))
        check(aw["reg_calls"] == sl["reg_calls"] == wk["reg_calls"] ==
              end["reg_calls"], "cycle %d: registrations at sleep or wake: "
              "%s" % (c, [x["reg_calls"] for x in (aw, sl, wk, end)]))
        # the connector's own release/restore: skipped, the KV follows
        check(end["connector"] == [], "cycle %d: the connector released "
              "and restored: %s" % (c, end["connector"]))


def vllm_without_the_plugin_is_silently_wrong():
    """Control: the same engine without the plugin: after the first wake
    every block moved is wrong, with no transfer error."""
    ms.need_follow_lane()
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


if __name__ == "__main__":
    if sys.argv[1:2] == ["--engine"]:
        sys.exit(ms.engine_main(sys.argv[2], VllmEngine))
    sys.exit(ktap.main([
        vllm_with_the_plugin_every_block_right_nothing_held_keys_unchanged,
        vllm_without_the_plugin_is_silently_wrong,
    ]))
