# SPDX-License-Identifier: MIT
"""Stands for vLLM's csrc/cumem_allocator.cpp (create_and_map,
unmap_and_release): an allocation's memory through the CUDA driver API of
the process's libcuda.so.1 (cuMemAddressReserve, then cuMemCreate +
cuMemMap + cuMemSetAccess; cuMemUnmap + cuMemRelease at sleep, the range
kept). With the HostVMM interface (addr, length, release, remap, read,
write, close), for cumem.py when KVDMABUF_STANDIN_MEM=cuda. In the VM the
libcuda is tests/fake_cuda's with FAKE_CUDA_VGEM=1: each allocation a vgem
buffer, its export a real dma-buf. Under libkvdmabuf-preload.so these
calls go through the preload's CUDA interposer, as vLLM's do.

Read at vllm-project/vllm 619e4b31 (csrc/cumem_allocator.cpp)."""
import ctypes

_cu = None


class _Location(ctypes.Structure):
    _fields_ = [("type", ctypes.c_uint), ("id", ctypes.c_int)]


class _AllocFlags(ctypes.Structure):
    _fields_ = [("compressionType", ctypes.c_ubyte),
                ("gpuDirectRDMACapable", ctypes.c_ubyte),
                ("usage", ctypes.c_ushort),
                ("reserved", ctypes.c_ubyte * 4)]


class _Prop(ctypes.Structure):          # CUmemAllocationProp
    _fields_ = [("type", ctypes.c_uint), ("requestedHandleTypes", ctypes.c_uint),
                ("location", _Location), ("win32HandleMetaData", ctypes.c_void_p),
                ("allocFlags", _AllocFlags)]


class _Access(ctypes.Structure):        # CUmemAccessDesc
    _fields_ = [("location", _Location), ("flags", ctypes.c_uint)]


PINNED, DEVICE, READWRITE = 1, 1, 3


def _driver():
    global _cu
    if _cu is None:
        _cu = ctypes.CDLL("libcuda.so.1")
        _check(_cu.cuInit(0), "cuInit")
    return _cu


def _check(rc, what):
    if rc:
        raise OSError("%s: CUDA error %d" % (what, rc))


class DriverVMM:
    def __init__(self, length: int):
        cu = _driver()
        self.length, self.handle = length, None
        p = ctypes.c_uint64()
        _check(cu.cuMemAddressReserve(ctypes.byref(p), ctypes.c_size_t(length),
                                      ctypes.c_size_t(0), ctypes.c_uint64(0),
                                      ctypes.c_ulonglong(0)),
               "cuMemAddressReserve")
        self.addr = p.value
        self.remap()

    def remap(self) -> None:
        """create_and_map: new memory at the same address."""
        cu = _driver()
        prop = _Prop(type=PINNED, location=_Location(DEVICE, 0))
        prop.allocFlags.gpuDirectRDMACapable = 1
        h = ctypes.c_ulonglong()
        _check(cu.cuMemCreate(ctypes.byref(h), ctypes.c_size_t(self.length),
                              ctypes.byref(prop), ctypes.c_ulonglong(0)),
               "cuMemCreate")
        _check(cu.cuMemMap(ctypes.c_uint64(self.addr),
                           ctypes.c_size_t(self.length), ctypes.c_size_t(0),
                           h, ctypes.c_ulonglong(0)), "cuMemMap")
        acc = _Access(location=_Location(DEVICE, 0), flags=READWRITE)
        _check(cu.cuMemSetAccess(ctypes.c_uint64(self.addr),
                                 ctypes.c_size_t(self.length),
                                 ctypes.byref(acc), ctypes.c_size_t(1)),
               "cuMemSetAccess")
        self.handle = h

    def release(self) -> None:
        """unmap_and_release: the memory goes, the range stays."""
        cu = _driver()
        _check(cu.cuMemUnmap(ctypes.c_uint64(self.addr),
                             ctypes.c_size_t(self.length)), "cuMemUnmap")
        _check(cu.cuMemRelease(self.handle), "cuMemRelease")
        self.handle = None

    def write(self, off: int, data: bytes) -> None:
        ctypes.memmove(self.addr + off, data, len(data))

    def read(self, off: int, n: int) -> bytes:
        return ctypes.string_at(self.addr + off, n)

    def close(self) -> None:
        cu = _driver()
        if self.handle is not None:
            self.release()
        cu.cuMemAddressFree(ctypes.c_uint64(self.addr),
                            ctypes.c_size_t(self.length))
