#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""A vLLM process on the stand-in, for tests/python/lib_install.py: load the
general plugins as every vLLM process does, allocate weights and KV cache
(the plugin makes the KV cache's allocations regions itself; the weights
are registered through the plugin's hooks), then sleep and wake in vLLM's
order: sleep(1), wake_up(["weights"]), wake_up(["kv_cache"]), the KV-only
release and its wake, sleep(2), wake_up(); then initialise the KV cache
again. Prints one JSON object: the plugins loaded, for each step the
allocator's driver steps with which tags kvdmabuf had asleep at that
moment and the asleep tags after the step, whether the KV connector was
handed each KV allocation as a region, and the KV regions before and after
the re-initialisation.

Usage: serve.py CONFIG [hooks|old]
CONFIG: a kvdmabuf YAML (protocol tcp needs no NIC). Without a mode: a
vLLM with the KV-only release (discard) but before the tag hooks (the
plugin wraps the allocator); hooks: today's vLLM, with the tag hooks
(register_tag_hooks: the plugin subscribes, wraps nothing); old: a vLLM
from before the KV-only release (its CuMemAllocator has no discard), whose
steps are the same without it. The JSON also says whether the allocator
was wrapped."""
import json
import mmap
import os
import sys

from vllm.plugins import load_general_plugins, loaded
from vllm.device_allocator import cumem
from vllm.v1.worker.gpu_worker import Worker

SIZE = 4 * mmap.PAGESIZE


def main(config, mode=""):
    old = mode == "old"
    if old:
        del cumem.CuMemAllocator.discard
    if mode != "hooks":
        import vllm.device_allocator as da
        del da.register_tag_hooks, da.run_before_unmap_hooks, \
            da.run_after_map_hooks
    os.environ["KVDMABUF_CONFIG"] = config
    os.environ["KVDMABUF_VLLM_MEM"] = "host"    # HostVMM stands for CUDA
    load_general_plugins()
    import kvdmabuf_vllm
    worker = Worker()
    worker.load_model([SIZE, SIZE])
    worker.initialize_from_config([SIZE, 2 * SIZE])
    # the KV cache: regions made by the plugin; the weights: by hand
    hooks = kvdmabuf_vllm.hooks()
    regions = [hooks.register(addr, n, "weights", mem="host")
               for addr, n in worker.weights]

    def asleep():
        every = regions + list(kvdmabuf_vllm.kv_regions().values())
        return sorted({r.info().tag for r in every if r.info().asleep})

    steps, current = [], None
    cumem.observers.append(
        lambda what, tag: current["driver"].append([what, tag, asleep()]))
    for name, call, kv_only in (
            ("sleep(1)", lambda: worker.sleep(1), False),
            ("wake_up(weights)", lambda: worker.wake_up(["weights"]), False),
            ("wake_up(kv_cache)", lambda: worker.wake_up(["kv_cache"]), False),
            ("release_kv_cache_memory", lambda: worker.discard(("kv_cache",)),
             True),
            ("wake_up(kv_cache)", lambda: worker.wake_up(["kv_cache"]), True),
            ("sleep(2)", lambda: worker.sleep(2), False),
            ("wake_up()", lambda: worker.wake_up(), False)):
        if old and kv_only:
            continue
        current = {"step": name, "driver": []}
        steps.append(current)
        call()
        current["after"] = asleep()
    # the connector had the KV cache as regions; a re-initialisation
    # outside sleep removes the old ones and registers the new ones
    saw = worker.connector.saw
    old_kv = sorted(a for a, _ in worker.kv_caches)
    worker.initialize_from_config([SIZE, SIZE, SIZE])
    st = hooks.ctx.query()
    print(json.dumps({"connector_saw": saw, "reinit_saw":
                      worker.connector.saw,
                      "kv_before": old_kv,
                      "kv_after": sorted(a for a, _ in worker.kv_caches),
                      "kv_regions": sorted(kvdmabuf_vllm.kv_regions()),
                      "nr_regions": st.nr_regions,
                      "plugins": loaded, "steps": steps,
                      "sleeps": st.sleeps, "wakes": st.wakes,
                      "wrapped": getattr(cumem.CuMemAllocator,
                                         "_kvdmabuf_wrapped", False)}))
    hooks.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "")
