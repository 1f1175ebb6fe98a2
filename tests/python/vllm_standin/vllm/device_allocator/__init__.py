# SPDX-License-Identifier: MIT
"""Stands for vllm/device_allocator/__init__.py: the sleep-mode allocator
of the platform (CUDA: CuMemAllocator), and the tag hooks of newer vLLM
(read in vllm-project/vllm, vllm/device_allocator/__init__.py:
``register_tag_hooks``, ``run_before_unmap_hooks``,
``run_after_map_hooks``): subscribers of a tag get ``before_unmap`` right
before the allocator unmaps mapped allocations of that tag (sleep,
discard) and the idempotent ``after_map`` after every wake-up that leaves
all of them mapped. serve.py deletes the three names to stand for a vLLM
from before them.

Read at vllm-project/vllm e5337d96 (vllm/device_allocator/__init__.py)."""

#: tag -> [(before_unmap, after_map)], in registration order
_tag_hooks = {}


def get_mem_allocator_instance():
    from vllm.device_allocator.cumem import CuMemAllocator
    return CuMemAllocator.get_instance()


def register_tag_hooks(tag, before_unmap, after_map):
    hooks = (before_unmap, after_map)
    _tag_hooks.setdefault(tag, []).append(hooks)
    return lambda: _tag_hooks[tag].remove(hooks)


def run_before_unmap_hooks(allocations, tags=None):
    mapped = {a.tag for a in allocations
              if not a.is_asleep and (tags is None or a.tag in tags)}
    for tag in sorted(mapped & _tag_hooks.keys()):
        for before_unmap, _ in _tag_hooks[tag]:
            before_unmap()


def run_after_map_hooks(allocations):
    asleep = {a.tag for a in allocations if a.is_asleep}
    for tag in sorted(_tag_hooks.keys() - asleep):
        for _, after_map in _tag_hooks[tag]:
            after_map()
