# SPDX-License-Identifier: MIT
"""Stands for vllm/device_allocator/cumem.py, CuMemAllocator: allocations
by tag (use_memory_pool), sleep(offload_tags) copies the offload tags to
host memory and then unmaps every allocation, wake_up(tags) maps the tags
again (create_and_map: cuMemCreate, cuMemMap, then cuMemSetAccess) and
copies the host copies back, discard(tags) unmaps those tags alone.
Host memory (hostvmm.HostVMM) stands for the CUDA allocations; each
driver step is reported to the functions in ``observers`` as
(step, tag): "unmap", "map", "set_access". Where the package has the tag
hooks (vllm/device_allocator/__init__.py), sleep and discard run
``run_before_unmap_hooks`` before they unmap and wake_up runs
``run_after_map_hooks`` once it mapped and made accessible what it wakes,
as newer vLLM's cumem.py does."""
import contextlib

import vllm.device_allocator as _hooks
from hostvmm import HostVMM

observers = []


def _step(name, tag):
    for fn in observers:
        fn(name, tag)


class _Allocation:
    def __init__(self, tag, length):
        self.tag, self.mem, self.backup = tag, HostVMM(length), None
        self.is_asleep = False


def _run(name, *args):
    """The package's tag hooks, where this vLLM has them."""
    fn = getattr(_hooks, name, None)
    if fn is not None:
        fn(*args)


class CuMemAllocator:
    instance = None
    default_tag = "default"

    @staticmethod
    def get_instance():
        if CuMemAllocator.instance is None:
            CuMemAllocator.instance = CuMemAllocator()
        return CuMemAllocator.instance

    def __init__(self):
        self.pointer_to_data = {}
        self.current_tag = CuMemAllocator.default_tag

    @contextlib.contextmanager
    def use_memory_pool(self, tag=None):
        old, self.current_tag = self.current_tag, tag or self.default_tag
        try:
            yield
        finally:
            self.current_tag = old

    def malloc(self, length):
        """What PyTorch's pluggable allocator does in use_memory_pool()."""
        a = _Allocation(self.current_tag, length)
        self.pointer_to_data[a.mem.addr] = a
        return a.mem.addr

    def _unmap(self, a):
        if a.is_asleep:
            return
        _step("unmap", a.tag)
        a.mem.release()
        a.is_asleep = True

    def sleep(self, offload_tags=None):
        if offload_tags is None:
            offload_tags = (CuMemAllocator.default_tag,)
        elif isinstance(offload_tags, str):
            offload_tags = (offload_tags,)
        _run("run_before_unmap_hooks", self.pointer_to_data.values())
        for a in self.pointer_to_data.values():
            if a.tag in offload_tags and not a.is_asleep:
                a.backup = a.mem.read(0, a.mem.length)
            self._unmap(a)

    def discard(self, tags):
        if isinstance(tags, str):
            tags = (tags,)
        _run("run_before_unmap_hooks", self.pointer_to_data.values(), tags)
        for a in self.pointer_to_data.values():
            if a.tag in tags:
                self._unmap(a)

    def wake_up(self, tags=None):
        for a in self.pointer_to_data.values():
            if (tags is None or a.tag in tags) and a.is_asleep:
                _step("map", a.tag)
                a.mem.remap()
                _step("set_access", a.tag)
                a.is_asleep = False
                if a.backup is not None:
                    a.mem.write(0, a.backup)
                    a.backup = None
        _run("run_after_map_hooks", self.pointer_to_data.values())
