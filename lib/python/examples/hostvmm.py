# SPDX-License-Identifier: MIT
"""Host memory that sleeps like CUDA VMM memory, for the examples and tests:
``release()`` gives the pages back but keeps the virtual range reserved
(cuMemUnmap + cuMemRelease keep the VA reservation); ``remap()`` maps new,
zeroed pages at the same address (cuMemCreate + cuMemMap)."""
import ctypes
import mmap

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                       ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
MAP_FIXED, MAP_NORESERVE, PROT_NONE = 0x10, 0x4000, 0
RW = mmap.PROT_READ | mmap.PROT_WRITE
ANON = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS


class HostVMM:
    def __init__(self, length: int):
        self.length = length
        self.addr = self._map(None, RW, 0)

    def _map(self, at, prot, extra) -> int:
        p = _libc.mmap(at, self.length, prot, ANON | extra, -1, 0)
        if p in (None, ctypes.c_void_p(-1).value):
            raise OSError(ctypes.get_errno(), "mmap")
        return p

    def release(self) -> None:
        """The pages go; the range stays reserved (PROT_NONE)."""
        self._map(self.addr, PROT_NONE, MAP_FIXED | MAP_NORESERVE)

    def remap(self) -> None:
        self._map(self.addr, RW, MAP_FIXED)

    def resident_pages(self) -> int:
        """Pages of the range in memory now (mincore)."""
        n = (self.length + mmap.PAGESIZE - 1) // mmap.PAGESIZE
        vec = (ctypes.c_ubyte * n)()
        if _libc.mincore(ctypes.c_void_p(self.addr), self.length, vec):
            raise OSError(ctypes.get_errno(), "mincore")
        return sum(v & 1 for v in vec)

    def write(self, off: int, data: bytes) -> None:
        ctypes.memmove(self.addr + off, data, len(data))

    def read(self, off: int, n: int) -> bytes:
        return ctypes.string_at(self.addr + off, n)

    def close(self) -> None:
        _libc.munmap(self.addr, self.length)
