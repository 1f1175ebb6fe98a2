# SPDX-License-Identifier: MIT
"""Stands for vllm/device_allocator/__init__.py: the sleep-mode allocator
of the platform (CUDA: CuMemAllocator)."""


def get_mem_allocator_instance():
    from vllm.device_allocator.cumem import CuMemAllocator
    return CuMemAllocator.get_instance()
