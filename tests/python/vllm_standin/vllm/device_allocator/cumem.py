# SPDX-License-Identifier: MIT
"""Stands for vllm/device_allocator/cumem.py, CuMemAllocator: allocations
by tag (use_memory_pool), sleep(offload_tags) copies the offload tags to
host memory and then unmaps every allocation, wake_up(tags) maps the tags
again (create_and_map: cuMemCreate, cuMemMap, then cuMemSetAccess) and
copies the host copies back, discard(tags) unmaps those tags alone.
Host memory (hostvmm.HostVMM) stands for the CUDA allocations, or the
CUDA driver API (driver_vmm.py, KVDMABUF_STANDIN_MEM=cuda); each
driver step is reported to the functions in ``observers`` as
(step, tag): "unmap", "map", "set_access". Where the package has the tag
hooks (vllm/device_allocator/__init__.py), sleep and discard run
``run_before_unmap_hooks`` before they unmap and wake_up runs
``run_after_map_hooks`` once it mapped and made accessible what it wakes,
as newer vLLM's cumem.py does.

Allocations go through the allocator's callbacks as in vLLM's
csrc/cumem_allocator.cpp (my_malloc, my_free) and cumem.py
(_python_malloc_callback, _python_free_callback; read at vLLM 0.11-0.12):
the range is reserved, the malloc callback records the handle (device,
aligned size, address, memory handle) under the current tag while the
range is still unmapped, then the memory is mapped; a free calls the free
callback first (it drops the record and returns the handle), then unmaps
and frees the range.

Read at vllm-project/vllm 9ac96588 (vllm/device_allocator/cumem.py)."""
import contextlib
import os

import vllm.device_allocator as _hooks
from hostvmm import HostVMM


def _memory(length):
    """An allocation's memory: host memory standing for CUDA's, or
    (KVDMABUF_STANDIN_MEM=cuda) the CUDA driver API's (driver_vmm.py)."""
    if os.environ.get("KVDMABUF_STANDIN_MEM") == "cuda":
        from vllm.device_allocator.driver_vmm import DriverVMM
        return DriverVMM(length)
    return HostVMM(length)

observers = []


def _step(name, tag):
    for fn in observers:
        fn(name, tag)


class _Allocation:
    """Stands for vllm.device_allocator.AllocationData."""

    def __init__(self, handle, tag, mem):
        self.handle, self.tag, self.mem, self.backup = handle, tag, mem, None
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
        self._reserved = {}             # address -> HostVMM
        # vLLM keeps the bound callbacks it hands to the C side
        self.python_malloc_callback = self._python_malloc_callback
        self.python_free_callback = self._python_free_callback

    def _python_malloc_callback(self, allocation_handle):
        addr = allocation_handle[2]
        self.pointer_to_data[addr] = _Allocation(
            allocation_handle, self.current_tag, self._reserved[addr])

    def _python_free_callback(self, ptr):
        return self.pointer_to_data.pop(ptr).handle

    @contextlib.contextmanager
    def use_memory_pool(self, tag=None):
        old, self.current_tag = self.current_tag, tag or self.default_tag
        try:
            yield
        finally:
            self.current_tag = old

    def malloc(self, length):
        """my_malloc, in use_memory_pool(): reserve, the malloc callback,
        then map (create_and_map)."""
        mem = _memory(length)
        mem.release()                   # reserved, not mapped yet
        self._reserved[mem.addr] = mem
        self.python_malloc_callback((0, length, mem.addr, 0))
        mem.remap()
        return mem.addr

    def free(self, ptr):
        """my_free: the free callback, then unmap and free the range."""
        handle = self.python_free_callback(ptr)
        self._reserved.pop(handle[2]).close()

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
