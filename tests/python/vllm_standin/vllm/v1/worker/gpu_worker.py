# SPDX-License-Identifier: MIT
"""Stands for vllm/v1/worker/gpu_worker.py, Worker: the weights are
allocated under the tag "weights" (load_model), the KV cache under
"kv_cache" (initialize_from_config); sleep(level) / wake_up(tags) go to
the sleep-mode backend's suspend / resume, and the KV-only release
(EngineCore.release_kv_cache_memory(), through the executor) to its
discard(("kv_cache",)). The worker's KV connector (made at start,
vllm/distributed/kv_transfer: ensure_kv_transfer_initialized) is handed the
KV cache right after its allocation, still inside the "kv_cache" pool
(gpu_model_runner.py, initialize_kv_cache); initialize_from_config again
frees the old KV cache outside any sleep first (a re-initialisation).

A connector that declares sleep support (``supports_sleep_mode(config)``)
has its ``release_kv_caches`` / ``restore_kv_caches`` subscribed to the
tag hooks of ``kv_cache`` when the worker's connector is made (vLLM:
vllm/distributed/kv_transfer/kv_transfer_state.py,
ensure_kv_transfer_initialized; the contract as vLLM's unit test
tests/v1/kv_connector/unit, test_worker_connector_follows_the_kv_cache_
mapping_iff_it_supports_sleep_mode, states it: released before the KV
cache is unmapped and restored after it is mapped again iff it supports
sleep mode; read in vllm-project/vllm, device_allocator/__init__.py at
e5337d96). A connector without the method (the seed's) is not.

Read at vllm-project/vllm 35d5cda1 (vllm/v1/worker/gpu_worker.py)."""
from vllm.device_allocator import get_mem_allocator_instance
from vllm.device_allocator.sleep_mode_backend import CuMemBackend
from vllm.distributed.kv_transfer.kv_connector.factory import \
    KVConnectorFactory


class Worker:
    def __init__(self):
        self.backend = CuMemBackend()
        self.weights, self.kv_caches = [], []
        self.connector = KVConnectorFactory.create_connector()
        import vllm.device_allocator as da
        supports = getattr(self.connector, "supports_sleep_mode", None)
        if hasattr(da, "register_tag_hooks") and supports and supports(None):
            da.register_tag_hooks("kv_cache",
                                  self.connector.release_kv_caches,
                                  self.connector.restore_kv_caches)

    def _alloc(self, tag, sizes):
        allocator = get_mem_allocator_instance()
        with allocator.use_memory_pool(tag=tag):
            return [(allocator.malloc(n), n) for n in sizes]

    def load_model(self, sizes):
        self.weights = self._alloc("weights", sizes)

    def initialize_from_config(self, sizes):
        allocator = get_mem_allocator_instance()
        for addr, _ in self.kv_caches:
            allocator.free(addr)
        with allocator.use_memory_pool(tag="kv_cache"):
            self.kv_caches = [(allocator.malloc(n), n) for n in sizes]
            self.connector.register_kv_caches(
                {"layer.%d" % i: kv for i, kv in enumerate(self.kv_caches)})

    def sleep(self, level=1):
        self.backend.suspend(level)

    def wake_up(self, tags=None):
        self.backend.resume(tags)

    def discard(self, tags):
        self.backend.discard(tags)
