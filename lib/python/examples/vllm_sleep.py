#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""vLLM's sleep mode with a KV connector that owns RDMA registrations.

vLLM's ``CuMemAllocator.sleep(offload_tags)`` unmaps and releases *every*
allocation, whatever its tag (the offload tags are first copied to host
memory), and ``wake_up(tags)`` maps new memory at the same addresses for
the tags it is given. The names below mirror those hook points; host memory
stands in for GPU memory (no vLLM here). The connector calls
``hooks.release()`` (every tag) before the allocator unmaps and
``hooks.restore(tags)`` after it mapped those tags again (and set their
access), and republishes keys that changed. In a real vLLM, the plugin
in vllm_plugin/ makes those two calls at the allocator itself.

Usage: KVDMABUF_CONFIG=kvdmabuf.yaml vllm_sleep.py [cycles]
"""
import sys

from hostvmm import HostVMM
from kvdmabuf.hooks import SleepHooks


class CuMemAllocator:
    """The allocator: pools by tag, sleep / wake_up as vLLM names them."""

    def __init__(self):
        self.pools = {}

    def allocate(self, tag, length):
        mem = HostVMM(length)
        self.pools.setdefault(tag, []).append(mem)
        return mem

    def sleep(self, offload_tags=()):
        # every pool: offload_tags only decides what is copied to host first
        del offload_tags
        for pool in self.pools.values():
            for mem in pool:
                mem.release()

    def wake_up(self, tags=None):
        for tag in tags or list(self.pools):
            for mem in self.pools[tag]:
                mem.remap()


class KVConnector:
    """Owns the registrations; what a vLLM KV connector would do."""

    def __init__(self, pds=()):
        self.published = {}
        self.hooks = SleepHooks(pds=pds, on_new_keys=self.republish)

    def register_kv_caches(self, kv_caches):
        for name, mem in kv_caches.items():
            r = self.hooks.register(mem.addr, mem.length, "kv_cache",
                                    mem="host")
            self.published[name] = (r, self.hooks.keys(r))

    def republish(self, new_keys):
        for _tag, entries in new_keys.items():
            for region, keys, _gen in entries:
                for name, (r, _) in self.published.items():
                    if r is region:
                        self.published[name] = (r, keys)


def main(cycles=2):
    support = SleepHooks.supports_sleep_mode()
    if not support:
        print("sleep mode not supported: %s" % support.reason)
        return 1
    alloc = CuMemAllocator()
    kv = {"layer0": alloc.allocate("kv_cache", 1 << 20),
          "layer1": alloc.allocate("kv_cache", 1 << 20)}
    conn = KVConnector()
    conn.register_kv_caches(kv)
    for c in range(cycles):
        before = {n: k for n, (_, k) in conn.published.items()}
        conn.hooks.release()                  # every tag, before it unmaps
        alloc.sleep(offload_tags=("weights",))
        alloc.wake_up(["kv_cache"])
        conn.hooks.restore(["kv_cache"])      # after it mapped again
        for n, (r, keys) in conn.published.items():
            changed = keys != before[n]
            print("cycle %d %s: keys %s%s" % (c + 1, n, keys,
                                              " (republished)" if changed
                                              else ""))
            if keys != conn.hooks.keys(r):
                print("stale keys published for", n)
                return 1
    conn.hooks.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]) if len(sys.argv) > 1 else 2))
