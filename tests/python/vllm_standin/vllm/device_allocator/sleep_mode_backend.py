# SPDX-License-Identifier: MIT
"""Stands for vllm/device_allocator/sleep_mode_backend.py: CuMemBackend,
the default sleep-mode backend, maps suspend(level) to the allocator's
sleep (offload tags ("weights",) at level 1, none at level 2), resume(tags)
to wake_up(tags) and discard(tags) to discard(tags).

Read at vllm-project/vllm 0ffa2a24 (vllm/device_allocator/sleep_mode_backend.py)."""
from vllm.device_allocator import get_mem_allocator_instance


class CuMemBackend:
    def suspend(self, level=1):
        get_mem_allocator_instance().sleep(
            offload_tags=("weights",) if level == 1 else tuple())

    def resume(self, tags=None):
        get_mem_allocator_instance().wake_up(tags)

    def discard(self, tags):
        get_mem_allocator_instance().discard(tags)
