#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""The vLLM plugin example's entry point (lib/python/examples/vllm_plugin,
kvdmabuf_vllm.register), which vLLM calls unguarded in every process:
with a vLLM whose sleep-mode allocator fails to import with an error other
than ImportError (a CUDA driver too old, say), it logs why it disabled
itself and returns, so the engine still starts; with the stand-in vLLM
(tests/python/vllm_standin), which has vLLM's tag hooks, it subscribes to
them for weights and kv_cache, once however often it is called, and wraps
nothing. The KV cache becomes kvdmabuf regions by the plugin alone: each
allocation of the allocator's kv_cache pool is a region (its address,
length and tag) by the time the KV connector is handed the KV cache, or at
the end of the pool without a connector; the weights' allocations are not;
a re-initialisation of the KV cache outside sleep removes the old regions
(the C allocator frees, then the same addresses may come back) and
registers the new ones. Each case runs in a fresh interpreter, host memory
standing for CUDA memory (KVDMABUF_VLLM_MEM=host). Host-only."""
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))  # ktap
import ktap  # noqa: E402
from ktap import check  # noqa: E402

TOP = ktap.use_build_tree()
PLUGIN = os.path.join(TOP, "lib", "python", "examples", "vllm_plugin")

CODE = """
import sys
sys.path.insert(0, %r)
import ktap
ktap.use_build_tree()
import kvdmabuf_vllm
kvdmabuf_vllm.register()
from vllm.device_allocator.cumem import CuMemAllocator
print("wrapped", getattr(CuMemAllocator, "_kvdmabuf_wrapped", False))
""" % os.path.join(HERE, "..")


def run(vllm_dir, code, **extra):
    env = dict(os.environ, **extra)
    env["PYTHONPATH"] = os.pathsep.join(
        [vllm_dir, PLUGIN, os.path.join(TOP, "lib", "python"),
         os.path.join(TOP, "lib", "python", "examples")])
    return subprocess.run([sys.executable, "-c", code], env=env,
                          capture_output=True, text=True,
                          timeout=ktap.scaled(60))


def run_standin_tcp(code):
    """@code under the stand-in vLLM, host memory standing for CUDA's, a
    configuration of protocol tcp."""
    with tempfile.TemporaryDirectory() as d:
        conf = os.path.join(d, "kvdmabuf.yaml")
        with open(conf, "w") as f:
            f.write("protocol: tcp\n")
        return run(os.path.join(HERE, "vllm_standin"), code,
                   KVDMABUF_CONFIG=conf, KVDMABUF_VLLM_MEM="host")


def broken_vllm_does_not_stop_the_engine():
    with tempfile.TemporaryDirectory() as d:
        pkg = os.path.join(d, "vllm", "device_allocator")
        os.makedirs(pkg)
        for f in ("vllm/__init__.py", "vllm/device_allocator/__init__.py"):
            open(os.path.join(d, f), "w").close()
        with open(os.path.join(pkg, "cumem.py"), "w") as f:
            f.write('raise RuntimeError("CUDA driver too old")\n')
        p = run(d, CODE.replace('from vllm.device_allocator.cumem import '
                                'CuMemAllocator\nprint("wrapped", getattr('
                                'CuMemAllocator, "_kvdmabuf_wrapped", False))',
                                'print("engine starts")'))
    check(p.returncode == 0, "register() raised: %s" % p.stderr)
    check(p.stdout.strip() == "engine starts", p.stdout)
    check("kvdmabuf_vllm: disabled" in p.stderr and
          "RuntimeError: CUDA driver too old" in p.stderr, p.stderr)


def standin_vllm_tag_hooks_are_subscribed_once():
    code = CODE.replace("kvdmabuf_vllm.register()",
                        "kvdmabuf_vllm.register(); kvdmabuf_vllm.register()")
    code += ("from vllm import device_allocator as d\n"
             "print(sorted((t, len(h)) for t, h in d._tag_hooks.items()))\n")
    p = run(os.path.join(HERE, "vllm_standin"), code)
    check(p.returncode == 0, p.stderr)
    check(p.stdout.split("\n")[:2] == ["wrapped False",
                                       "[('kv_cache', 1), ('weights', 1)]"],
          p.stdout + p.stderr)


KV = """
import json, sys
sys.path.insert(0, %r)
import ktap
ktap.use_build_tree()
import kvdmabuf_vllm
kvdmabuf_vllm.register()
from vllm.device_allocator import get_mem_allocator_instance
from vllm.v1.worker.gpu_worker import Worker

def regions():
    return sorted((r.info().addr, r.info().length, r.info().tag)
                  for a, r in kvdmabuf_vllm.kv_regions().items())

w = Worker()
w.load_model([4096, 4096])
w.initialize_from_config([4 * 4096, 8 * 4096])
out = {"saw": w.connector.saw, "kv": sorted((a, n, "kv_cache")
                                            for a, n in w.kv_caches),
       "regions": regions()}
w.initialize_from_config([2 * 4096, 2 * 4096, 2 * 4096])
out.update(saw2=w.connector.saw, kv2=sorted((a, n, "kv_cache")
                                            for a, n in w.kv_caches),
           regions2=regions(),
           nr=kvdmabuf_vllm.current().ctx.query().nr_regions)
a = get_mem_allocator_instance()
with a.use_memory_pool(tag="kv_cache"):
    p = a.malloc(4096)
    out["inside"] = p in kvdmabuf_vllm.kv_regions()
out["after_pool"] = p in kvdmabuf_vllm.kv_regions()
print(json.dumps(out))
""" % os.path.join(HERE, "..")


def kv_cache_is_regions_before_the_connector_sees_it():
    p = run_standin_tcp(KV)
    check(p.returncode == 0, p.stderr)
    out = json.loads(p.stdout.splitlines()[-1])
    # every KV allocation a region, and no weights, when the connector
    # is handed the KV cache
    check(out["saw"] == [True, True], "connector saw %s" % out["saw"])
    check(out["regions"] == out["kv"], "%s, KV %s" % (out["regions"],
                                                      out["kv"]))
    # re-initialised: the old ones gone, the new ones there
    check(out["saw2"] == [True] * 3, "connector saw %s" % out["saw2"])
    check(out["regions2"] == out["kv2"], "%s, KV %s" % (out["regions2"],
                                                        out["kv2"]))
    check(out["nr"] == 3, "%d regions in the context" % out["nr"])
    # without a connector: at the end of the pool, not before
    check(not out["inside"] and out["after_pool"], str(out))


def kv_cache_without_a_context_starts_the_engine():
    """A configuration that cannot be opened: the engine starts, its KV
    cache is not registered by the plugin, and the log says so once."""
    code = KV[:KV.index("w = Worker()")] + (
        "w = Worker()\n"
        "w.initialize_from_config([4 * 4096, 8 * 4096])\n"
        "print(json.dumps({'saw': w.connector.saw,\n"
        "                  'regions': len(kvdmabuf_vllm.kv_regions())}))\n")
    p = run(os.path.join(HERE, "vllm_standin"), code,
            KVDMABUF_CONFIG="/nonexistent/kvdmabuf.yaml",
            KVDMABUF_VLLM_MEM="host")
    check(p.returncode == 0, p.stderr)
    out = json.loads(p.stdout.splitlines()[-1])
    check(out == {"saw": [False, False], "regions": 0}, str(out))
    check(p.stderr.count("are no kvdmabuf regions, no context") == 1 and
          "/nonexistent/kvdmabuf.yaml" in p.stderr, p.stderr)


def connector_hooks_run_after_kvdmabufs():
    """The order between a KV connector's own release/restore (wired
    through vLLM's tag hooks for kv_cache, after the plugin's: vLLM loads
    plugins before it builds a connector) and kvdmabuf's: at the
    connector's release the KV regions are asleep already (drained, the
    memory about to go), at its restore they are awake on the new memory,
    so a connector that registers again registers what is mapped (caught:
    the plugin subscribing late, after the connector)."""
    code = KV[:KV.index("w = Worker()")] + (
        "from vllm import device_allocator as da\n"
        "calls = []\n"
        "def asleep():\n"
        "    return sorted(r.info().asleep\n"
        "                  for r in kvdmabuf_vllm.kv_regions().values())\n"
        "da.register_tag_hooks('kv_cache',\n"
        "    lambda: calls.append(['release', asleep()]),\n"
        "    lambda: calls.append(['restore', asleep()]))\n"
        "w = Worker()\n"
        "w.load_model([4096])\n"
        "w.initialize_from_config([4096, 4096])\n"
        "for level in (1, 2):\n"
        "    w.sleep(level=level)\n"
        "    w.wake_up()\n"
        "print(json.dumps(calls))\n")
    p = run_standin_tcp(code)
    check(p.returncode == 0, p.stderr)
    calls = json.loads(p.stdout.splitlines()[-1])
    check(calls == [["release", [1, 1]], ["restore", [0, 0]]] * 2,
          str(calls))


SLEEPY = """
import json, sys
sys.path.insert(0, %r)
import ktap
ktap.use_build_tree()
from vllm.distributed.kv_transfer.kv_connector import factory

class SleepyConnector:
    # stands for a connector with sleep support of its own (vLLM's
    # Mooncake connectors as issue 31 describes them): its release
    # deregisters the KV cache, its restore registers it again
    calls = []

    @classmethod
    def supports_sleep_mode(cls, config):
        return SUPPORTS

    def register_kv_caches(self, kv_caches):
        pass

    def release_kv_caches(self):
        self.calls.append("release")

    def restore_kv_caches(self):
        self.calls.append("restore")

conn = SleepyConnector()
factory.KVConnectorFactory.create_connector = classmethod(
    lambda cls, config=None, role="worker": conn)
import kvdmabuf_vllm
kvdmabuf_vllm.register()
from vllm.v1.worker.gpu_worker import Worker
w = Worker()
w.load_model([4096])
w.initialize_from_config([4096, 4096])
w.sleep(1)
w.wake_up()
print(json.dumps({"calls": conn.calls, "supports": conn.supports_sleep_mode(None),
                  "follows": kvdmabuf_vllm.kv_cache_follows()}))
""" % os.path.join(HERE, "..")


def connectors_keep_their_release_unless_the_kv_cache_follows():
    """A connector's own release_kv_caches / restore_kv_caches run (through
    the tag hooks) where the KV cache does not follow: here its regions are
    host memory and no preload is loaded (the skip itself, with FOLLOW
    regions under the preload, is mooncake_vllm's, in the VM). Its
    supports_sleep_mode is its own without the preload, yes under it."""
    preload = os.path.join(TOP, "lib", "libkvdmabuf-preload.so")
    want = {("True", False): (["release", "restore"], True),
            ("False", False): ([], False),
            ("False", True): (["release", "restore"], True)}
    for (supports, under), (calls, says) in want.items():
        extra = {"LD_PRELOAD": preload} if under else {}
        with tempfile.TemporaryDirectory() as d:
            conf = os.path.join(d, "kvdmabuf.yaml")
            with open(conf, "w") as f:
                f.write("protocol: tcp\n")
            p = run(os.path.join(HERE, "vllm_standin"),
                    SLEEPY.replace("return SUPPORTS", "return " + supports),
                    KVDMABUF_CONFIG=conf, KVDMABUF_VLLM_MEM="host", **extra)
        check(p.returncode == 0, p.stderr)
        out = json.loads(p.stdout.splitlines()[-1])
        print("# supports %s, preload %s: %s" % (supports, under, out))
        check(out == {"calls": calls, "supports": says, "follows": False},
              "supports %s, preload %s: %s" % (supports, under, out))


if __name__ == "__main__":
    sys.exit(ktap.main([
        broken_vllm_does_not_stop_the_engine,
        standin_vllm_tag_hooks_are_subscribed_once,
        kv_cache_is_regions_before_the_connector_sees_it,
        kv_cache_without_a_context_starts_the_engine,
        connector_hooks_run_after_kvdmabufs,
        connectors_keep_their_release_unless_the_kv_cache_follows,
    ]))
