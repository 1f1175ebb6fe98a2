#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""SGLang's memory occupation hooks with a transfer backend that owns RDMA
registrations.

SGLang's scheduler releases GPU memory with ``release_memory_occupation``
(tags such as "kv_cache", "weights") and maps it again with
``resume_memory_occupation``. The names below mirror those hook points;
host memory stands in for GPU memory (no SGLang here).

Usage: KVDMABUF_CONFIG=kvdmabuf.yaml sglang_sleep.py
"""
import sys

from hostvmm import HostVMM
from kvdmabuf.hooks import SleepHooks


class Scheduler:
    def __init__(self):
        self.kv_pool = HostVMM(2 << 20)
        self.keys_seen = []
        self.transfer = SleepHooks(on_new_keys=self.keys_seen.append)
        self.kv_region = self.transfer.register(
            self.kv_pool.addr, self.kv_pool.length, "kv_cache", mem="host")

    def release_memory_occupation(self, tags=("kv_cache",)):
        self.transfer.release_memory_occupation(list(tags))
        self.kv_pool.release()

    def resume_memory_occupation(self, tags=("kv_cache",)):
        self.kv_pool.remap()
        self.transfer.resume_memory_occupation(list(tags))


def main():
    support = SleepHooks.supports_sleep_mode()
    if not support:
        print("sleep mode not supported: %s" % support.reason)
        return 1
    s = Scheduler()
    old = s.transfer.keys(s.kv_region)
    s.release_memory_occupation()
    s.resume_memory_occupation()
    new = s.transfer.keys(s.kv_region)
    print("kv_cache keys %s -> %s; announced %d time(s)"
          % (old, new, len(s.keys_seen)))
    s.transfer.close()
    return 0 if new != old and len(s.keys_seen) == 1 else 1


if __name__ == "__main__":
    sys.exit(main())
