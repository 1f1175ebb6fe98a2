# SPDX-License-Identifier: MIT
"""kvdmabuf - carry RDMA registrations of KV-cache regions through an
engine's sleep (memory released) and wake (new memory at the same address).

A ctypes binding over the installed C library, libkvdmabuf.so.0 (no compiled
extension). It mirrors the C API of <kvdmabuf.h>: a :class:`Context` holds
the configuration, the NICs and the regions; a :class:`Region` is one address
range registered on every NIC; :meth:`Context.sleep` and :meth:`Context.wake`
carry the registrations through the engine's sleep and wake, all or nothing.

Errors are :class:`Error` (an :class:`OSError`) or one of its subclasses,
carrying ``errno`` and the library's message (``strerror``).

The library is found without the environment: the copy installed beside
this package (``pip install``), else the one ``make install`` put in its
LIBDIR (recorded in ``_libdir.py`` at install), else the soname through
the dynamic linker's path. ``KVDMABUF_LIBRARY`` names another file (a build
tree) and comes first. Its run-time version must match this binding's
major and minor version.

Engine hooks for vLLM and SGLang are in :mod:`kvdmabuf.hooks`.
"""
from __future__ import annotations

import contextlib
import ctypes
import errno as _errno
import json
import os
import re
import sys
from typing import Callable, Iterable, Iterator, Optional, Sequence, Union

__all__ = [
    "Context", "Region", "RegionInfo", "State", "Error", "GateRefused",
    "DrainTimeout", "Busy", "Broken", "gate", "version", "pd_pointer",
    "rdma_core_release", "preload_path",
    "MEM_HOST", "MEM_CUDA", "MEM_DRM", "MODE_FOLLOW", "MODE_REREGISTER",
    "MODE_HOST", "MODE_NOREG", "MODE_ODP", "MODULE_AUTO", "MODULE_REQUIRE", "MODULE_OFF",
]

#: The C library version this binding speaks (major, minor).
BINDING_VERSION = (0, 6)
SONAME = "libkvdmabuf.so.0"

MEM_HOST, MEM_CUDA, MEM_DRM = 1, 2, 3
MODE_FOLLOW, MODE_REREGISTER, MODE_HOST, MODE_NOREG, MODE_ODP = 1, 2, 3, 4, 5
MODULE_DEFAULT, MODULE_AUTO, MODULE_REQUIRE, MODULE_OFF = 0, 1, 2, 3
REGION_RELEASED_AT_SLEEP = 1 << 0
# An elastic pool that starts with nothing mapped (device memory): pages
# come in and go with Region.ranges().
REGION_EMPTY = 1 << 1
# Region.ranges(): a range gives its memory back, or (CUDA regions) is
# backed by what is mapped there now, exported by the library.
RANGE_RELEASE, RANGE_EXPORT = -1, -2
_MEM_NAMES = {"host": MEM_HOST, "cuda": MEM_CUDA, "drm": MEM_DRM}


class Error(OSError):
    """A failed call: ``errno`` and the library's message."""


class GateRefused(Error):
    """Sleep is not supported with this transport (EPROTONOSUPPORT)."""


class DrainTimeout(Error):
    """Transfers were still in flight when the drain bound ran out."""


class Busy(Error):
    """In use: a transfer in flight, a pin, or another thread's sleep."""


class Broken(Error):
    """A region left in no known state by a failed rollback."""


_BY_ERRNO = {
    _errno.EPROTONOSUPPORT: GateRefused,
    _errno.ETIMEDOUT: DrainTimeout,
    _errno.EBUSY: Busy,
}


# ---- the C declarations (lib/kvdmabuf.h) ----

_DRAIN_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)
_REGIONS_FN = ctypes.CFUNCTYPE(None, ctypes.POINTER(ctypes.c_void_p),
                               ctypes.c_uint, ctypes.c_void_p)
_SLEEP_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_void_p),
                             ctypes.c_uint, ctypes.c_void_p)


class _Options(ctypes.Structure):
    _fields_ = [
        ("config_path", ctypes.c_char_p),
        ("pds", ctypes.POINTER(ctypes.c_void_p)),
        ("nr_pds", ctypes.c_uint),
        ("module", ctypes.c_int),
        ("drain", _DRAIN_FN),
        ("drain_arg", ctypes.c_void_p),
        ("key_change", _REGIONS_FN),
        ("key_change_arg", ctypes.c_void_p),
        ("sleep_begin", _SLEEP_FN),
        ("sleep_begin_arg", ctypes.c_void_p),
        ("cuda_library", ctypes.c_char_p),
        ("drain_timeout_ms", ctypes.c_uint),
        ("access", ctypes.c_uint),
        ("config_yaml", ctypes.c_char_p),
        ("reserved", ctypes.c_uint64 * 7),
    ]


class _RegionDesc(ctypes.Structure):
    _fields_ = [
        ("addr", ctypes.c_void_p),
        ("len", ctypes.c_size_t),
        ("mem", ctypes.c_int),
        ("flags", ctypes.c_uint),
        ("tag", ctypes.c_char_p),
        ("drm_fd", ctypes.c_int),
        ("drm_handle", ctypes.c_uint32),
        ("nics", ctypes.c_uint64),
        ("reserved", ctypes.c_uint64 * 3),
    ]


class _RegionRange(ctypes.Structure):
    _fields_ = [
        ("offset", ctypes.c_size_t),
        ("len", ctypes.c_size_t),
        ("fd", ctypes.c_int),
        ("fd_offset", ctypes.c_uint64),
        ("reserved", ctypes.c_uint64 * 2),
    ]


class _RegionInfo(ctypes.Structure):
    _fields_ = [
        ("addr", ctypes.c_void_p),
        ("len", ctypes.c_size_t),
        ("mem", ctypes.c_int),
        ("mode", ctypes.c_int),
        ("asleep", ctypes.c_int),
        ("proxied", ctypes.c_int),
        ("tag", ctypes.c_char_p),
        ("key_gen", ctypes.c_uint64),
        ("inflight", ctypes.c_uint64),
        ("proxy_id", ctypes.c_uint64),
        ("broken", ctypes.c_int),
        ("backing_lost", ctypes.c_int),
        ("mapping", ctypes.c_int),
        ("reserved", ctypes.c_uint64 * 8),
    ]


class _State(ctypes.Structure):
    _fields_ = [(name, ctypes.c_uint) for name in (
        "nr_regions", "nr_asleep", "nr_broken", "nr_follow",
        "nr_reregister", "nr_host", "nr_noreg", "nr_nics")] + [
        ("module", ctypes.c_int),
        ("protocol_rdma", ctypes.c_int),
        ("inflight", ctypes.c_uint64),
        ("sleeps", ctypes.c_uint64),
        ("wakes", ctypes.c_uint64),
        ("unbalanced_io_end", ctypes.c_uint64),
        ("prefetches", ctypes.c_uint64),
        ("prefetch_failures", ctypes.c_uint64),
        ("reserved", ctypes.c_uint64 * 6),
    ]


def _installed_file(name: str) -> Optional[str]:
    """@name as installed with this package: beside it (pip's wheel), or
    in the library folder `make install` wrote down (_libdir.py)."""
    here = os.path.dirname(os.path.abspath(__file__))
    beside = os.path.join(here, name)
    if os.path.exists(beside):
        return beside
    try:
        from ._libdir import LIBDIR_FROM_PACKAGE
        installed = os.path.join(here, LIBDIR_FROM_PACKAGE, name)
        if os.path.exists(installed):
            return os.path.normpath(installed)
    except ImportError:
        pass
    return None


def _library_path() -> str:
    """The library this package was installed with (see the module doc)."""
    return os.environ.get("KVDMABUF_LIBRARY") or \
        _installed_file(SONAME) or SONAME


def preload_path() -> Optional[str]:
    """The libkvdmabuf-preload.so installed with this package (the wheel
    carries one), for LD_PRELOAD; None where it has none. From a shell:
    ``LD_PRELOAD=$(python3 -m kvdmabuf preload-path)``."""
    return _installed_file("libkvdmabuf-preload.so")


#: the library's run-time dependencies and the Debian packages that hold them
_DEPENDS = {"libibverbs.so.1": "libibverbs1", "libdrm.so.2": "libdrm2",
            "libyaml-0.so.2": "libyaml-0-2"}


def _load_error(path: str, e: OSError) -> str:
    """What to do when @path does not load (@e: dlopen's message)."""
    why = str(e)
    m = re.search(r"([^ :/]+\.so[.0-9]*): cannot open shared object file",
                  why)
    if m and os.path.basename(path) != m.group(1) and \
            not path.endswith("/" + m.group(1)):
        need = m.group(1)
        pkg = _DEPENDS.get(need)
        return ("kvdmabuf: %s needs %s, which is not installed: install "
                "the system package that has it%s (%s)" %
                (path, need, " (Debian and Ubuntu: %s)" % pkg if pkg else "",
                 why))
    return ("kvdmabuf: the C library %s does not load (%s): build it (make "
            "lib) and install it, or set KVDMABUF_LIBRARY to its path" %
            (path, why))


def _load() -> ctypes.CDLL:
    path = _library_path()
    try:
        lib = ctypes.CDLL(path)
    except OSError as e:
        raise ImportError(_load_error(path, e)) from e
    P, I, U, VP = (ctypes.POINTER, ctypes.c_int, ctypes.c_uint,
                   ctypes.c_void_p)
    sig = {
        "kvdmabuf_version": (U, []),
        "kvdmabuf_open": (I, [P(_Options), P(VP), ctypes.c_char_p,
                              ctypes.c_size_t]),
        "kvdmabuf_close": (I, [VP]),
        "kvdmabuf_last_error": (ctypes.c_char_p, [VP]),
        "kvdmabuf_gate": (I, [ctypes.c_char_p, ctypes.c_char_p,
                              ctypes.c_size_t]),
        "kvdmabuf_region_add": (I, [VP, P(_RegionDesc), P(VP)]),
        "kvdmabuf_region_remove": (I, [VP]),
        "kvdmabuf_region_keys": (I, [VP, U, P(ctypes.c_uint32),
                                     P(ctypes.c_uint32),
                                     P(ctypes.c_uint64)]),
        "kvdmabuf_region_info": (I, [VP, P(_RegionInfo)]),
        "kvdmabuf_region_dmabuf": (I, [VP, P(I), P(ctypes.c_uint64)]),
        "kvdmabuf_region_set_drm_handle": (I, [VP, I, ctypes.c_uint32]),
        "kvdmabuf_region_ranges": (I, [VP, P(_RegionRange), U]),
        "kvdmabuf_query": (I, [VP, P(_State)]),
        "kvdmabuf_io_begin": (I, [VP]),
        "kvdmabuf_io_end": (None, [VP]),
        "kvdmabuf_io_begin_many": (I, [P(VP), U]),
        "kvdmabuf_io_end_many": (None, [P(VP), U]),
        "kvdmabuf_io_begin_range": (I, [VP, ctypes.c_size_t,
                                        ctypes.c_size_t]),
        "kvdmabuf_io_end_range": (None, [VP, ctypes.c_size_t,
                                         ctypes.c_size_t]),
        "kvdmabuf_sleep": (I, [VP, ctypes.c_char_p]),
        "kvdmabuf_wake": (I, [VP, ctypes.c_char_p]),
        "kvdmabuf_nic_add": (I, [VP, VP, P(U)]),
        "kvdmabuf_nic_remove": (I, [VP, U]),
    }
    for name, (res, args) in sig.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = res, args
    return lib


_lib = _load()


class _PreloadState(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint32) for n in (
        "nr_regions", "nr_asleep", "nr_mrs", "nr_in_regions",
        "nr_on_proxy", "nr_cannot_follow")] + [
        ("env_error", ctypes.c_int32), ("flags", ctypes.c_uint32)]


def _preload():
    """libkvdmabuf-preload.so's API when the process runs under it
    (LD_PRELOAD), else None: found in the process, never loaded here."""
    # One CDLL object for every lookup: argtypes live on the function
    # objects of the instance that made them (another CDLL(None) would
    # hand out fresh ones, and an address would go as a 32-bit int).
    g = ctypes.CDLL(None)
    # by the preload's symbol version, as the C library finds it: an
    # object that merely defines these names is not the preload
    dlvsym = g.dlvsym
    dlvsym.restype, dlvsym.argtypes = ctypes.c_void_p, [
        ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p]
    if not dlvsym(None, b"kvdmabuf_preload_declare",
                  b"KVDMABUF_PRELOAD_0.1"):
        return None
    fn = g.kvdmabuf_preload_declare
    cp, sz = ctypes.c_char_p, ctypes.c_size_t
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_void_p, sz, cp, ctypes.c_int, ctypes.c_uint64]
    for name in ("kvdmabuf_preload_sleep", "kvdmabuf_preload_wake"):
        f = getattr(g, name)
        f.restype, f.argtypes = ctypes.c_int, [cp, cp, sz]
    g.kvdmabuf_preload_query.restype = ctypes.c_int
    g.kvdmabuf_preload_query.argtypes = [ctypes.POINTER(_PreloadState)]
    return g


def preload_loaded() -> bool:
    """True when the process runs under libkvdmabuf-preload.so."""
    return _preload() is not None


def preload_declare(addr: int, length: int, tag: str = "kv_cache",
                    dmabuf: Optional[tuple[int, int]] = None) -> None:
    """Declare [addr, addr+length) as KV memory to the preload (an
    engine's sleep hook, before or after its transfer engine registered
    it). dmabuf: (fd, offset) of the region's proxy (Region.dmabuf()),
    on which the transfer engine's registrations are then made."""
    g = _preload()
    if g is None:
        raise Error(_errno.ENOSYS, "not running under libkvdmabuf-preload.so")
    fd, off = dmabuf if dmabuf else (-1, 0)
    rc = g.kvdmabuf_preload_declare(addr, length, _b(tag), fd, off)
    if rc:
        raise Error(-rc, "preload_declare(%#x, %#x): %s" % (
            addr, length, os.strerror(-rc)))


def _preload_call(name: str, tag: Optional[str]) -> tuple[bool, str]:
    g = _preload()
    if g is None:
        return True, "not running under libkvdmabuf-preload.so"
    err = ctypes.create_string_buffer(1024)
    rc = getattr(g, name)(_b(tag), err, len(err))
    return rc == 0, err.value.decode(errors="replace")


def preload_sleep(tag: Optional[str] = None) -> tuple[bool, str]:
    """(True, "") when every registration the transfer engine made over the
    declared regions tagged @tag can follow; else (False, the reason,
    naming the MR and NIC) and nothing changed: keep the memory mapped."""
    return _preload_call("kvdmabuf_preload_sleep", tag)


def preload_wake(tag: Optional[str] = None) -> tuple[bool, str]:
    return _preload_call("kvdmabuf_preload_wake", tag)


def preload_state() -> Optional[dict]:
    """The preload's counts (kvdmabuf_preload_query()), or None."""
    g = _preload()
    if g is None:
        return None
    st = _PreloadState()
    g.kvdmabuf_preload_query(ctypes.byref(st))
    return {n: getattr(st, n) for n, _ in _PreloadState._fields_
            if n != "reserved"}


def version() -> tuple[int, int, int]:
    """The loaded C library's version (major, minor, patch)."""
    v = _lib.kvdmabuf_version()
    return (v >> 16, (v >> 8) & 0xff, v & 0xff)


def _compatible(lib: tuple, binding: tuple = BINDING_VERSION) -> bool:
    """The C library's promise (its soname and symbol versions): a library
    of the same major and this minor or a later one serves what was built
    for this one; output structs grow only into their reserved tails."""
    return lib[0] == binding[0] and lib[1] >= binding[1]


if not _compatible(version()):
    raise ImportError("kvdmabuf: %s is version %d.%d.%d, this binding needs "
                      "%d.%d or a later %d.x" % ((SONAME,) + version() +
                                                 BINDING_VERSION +
                                                 BINDING_VERSION[:1]))


#: The rdma-core release from which pyverbs' ``PD.pd`` is the
#: ``struct ibv_pd *`` as an int (rdma-core commit "pyverbs: Change PD object
#: return type"); before it, the property casts that pointer to a Python
#: object, and reading it crashes the process.
PYVERBS_PD_POINTER_SINCE = 59

_PD_HELP = ("pass the engine's struct ibv_pd * as an int (from ibv_alloc_pd() "
            "in its own C code, or through ctypes from libibverbs)")


def rdma_core_release() -> Optional[int]:
    """The rdma-core release of the libibverbs mapped in this process (the
    number in its file name, ``libibverbs.so.1.<abi>.<release>.<n>``, which
    is how rdma-core names it), or None when none is mapped or the name
    says nothing. pyverbs comes from the same rdma-core build."""
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                m = re.search(r"/libibverbs\.so\.1\.\d+\.(\d+)\.\d+$",
                              line.rstrip())
                if m:
                    return int(m.group(1))
    except OSError:
        pass
    return None


def _pyverbs_pd_class():
    """pyverbs' PD class when pyverbs is imported (any PD object given to us
    comes from it then), else None; never imports pyverbs."""
    mod = sys.modules.get("pyverbs.pd")
    return getattr(mod, "PD", None) if mod is not None else None


def pd_pointer(pd: object) -> int:
    """The ``struct ibv_pd *`` to give the library, from:

    * an int (or ``ctypes.c_void_p``): the pointer itself, as an engine gets
      it from its own C code or through ctypes (``ibv_alloc_pd()``);
    * a pyverbs ``PD`` of rdma-core :data:`PYVERBS_PD_POINTER_SINCE` or
      later, whose ``PD.pd`` is that pointer; the release is read from the
      libibverbs file in the process (:func:`rdma_core_release`), since an
      older pyverbs (Debian 12's 44, Debian 13's 56) crashes on ``PD.pd``.

    Raises TypeError for anything else, a pyverbs PD of an older or unknown
    release included, and ValueError for a NULL pointer (a closed PD); the
    message says what to pass. Nothing is read from the object's memory.
    """
    if isinstance(pd, ctypes.c_void_p):
        pd = pd.value or 0
    if isinstance(pd, int) and not isinstance(pd, bool):
        ptr = pd
    elif _pyverbs_pd_class() is not None and \
            isinstance(pd, _pyverbs_pd_class()):
        rel = rdma_core_release()
        if rel is None or rel < PYVERBS_PD_POINTER_SINCE:
            raise TypeError(
                "pd_pointer: pyverbs of rdma-core %s does not expose the "
                "struct ibv_pd * of a PD (PD.pd gives it from rdma-core %d "
                "on); %s" % (rel if rel is not None else "(release unknown)",
                             PYVERBS_PD_POINTER_SINCE, _PD_HELP))
        ptr = pd.pd
        if not isinstance(ptr, int):
            raise TypeError("pd_pointer: pyverbs PD.pd gave %r, not an int; "
                            "%s" % (type(ptr).__name__, _PD_HELP))
    else:
        raise TypeError("pd_pointer: %s is not a protection domain; %s, or "
                        "a pyverbs PD of rdma-core %d or later" % (
                            type(pd).__name__, _PD_HELP,
                            PYVERBS_PD_POINTER_SINCE))
    if ptr <= 0:
        raise ValueError("pd_pointer: %#x is no struct ibv_pd * (a closed "
                         "PD?); %s" % (ptr, _PD_HELP))
    return ptr


def _raise(rc: int, msg: str) -> None:
    cls = _BY_ERRNO.get(-rc, Error)
    raise cls(-rc, msg or os.strerror(-rc))


def _b(s: Optional[str]) -> Optional[bytes]:
    return None if s is None else os.fsencode(s)


def gate(config_path: Optional[str] = None) -> tuple[bool, str]:
    """Is sleep supported with this config (``$KVDMABUF_CONFIG`` if None)?

    Returns (supported, reason). Loads no CUDA library, opens no device.
    Raises :class:`Error` when the config is missing or invalid.
    """
    buf = ctypes.create_string_buffer(512)
    rc = _lib.kvdmabuf_gate(_b(config_path), buf, len(buf))
    msg = buf.value.decode(errors="replace")
    if rc < 0:
        _raise(rc, msg)
    return rc == 1, msg


class RegionInfo:
    """State of one region (see ``struct kvdmabuf_region_info``)."""

    def __init__(self, c: _RegionInfo):
        self.addr: int = c.addr or 0
        self.length: int = c.len
        self.mem: int = c.mem
        self.mode: int = c.mode
        self.asleep: bool = bool(c.asleep)
        self.proxied: bool = bool(c.proxied)
        self.tag: str = (c.tag or b"").decode()
        self.key_gen: int = c.key_gen
        self.inflight: int = c.inflight
        self.proxy_id: int = c.proxy_id
        self.broken: int = c.broken
        self.backing_lost: bool = bool(c.backing_lost)
        # "pcie", "default", or None (not CUDA memory)
        self.mapping = {1: "pcie", 2: "default"}.get(c.mapping)

    def __repr__(self) -> str:
        return "RegionInfo(%s)" % ", ".join(
            "%s=%r" % kv for kv in vars(self).items())


class State:
    """State of a context (see ``struct kvdmabuf_state``)."""

    def __init__(self, c: _State):
        for name, _ in _State._fields_:
            if name != "reserved":
                setattr(self, name, getattr(c, name))

    def __repr__(self) -> str:
        return "State(%s)" % ", ".join("%s=%r" % kv for kv in vars(self).items())


class Region:
    """One address range registered on every NIC of its context."""

    def __init__(self, ctx: "Context", handle: int):
        self._ctx = ctx
        self._h = ctypes.c_void_p(handle)

    @property
    def handle(self) -> int:
        """The C ``struct kvdmabuf_region *`` (for C transfer code)."""
        return self._h.value or 0

    def keys(self, nic: int = 0) -> tuple[int, int, int]:
        """(lkey, rkey, key_gen) on NIC ``nic``; FileNotFoundError-like
        :class:`Error` (ENOENT) while not registered."""
        lk, rk, gen = ctypes.c_uint32(), ctypes.c_uint32(), ctypes.c_uint64()
        rc = _lib.kvdmabuf_region_keys(self._h, nic, ctypes.byref(lk),
                                       ctypes.byref(rk), ctypes.byref(gen))
        if rc < 0:
            _raise(rc, "region keys on NIC %d: %s" % (nic, os.strerror(-rc)))
        return lk.value, rk.value, gen.value

    def info(self) -> RegionInfo:
        c = _RegionInfo()
        rc = _lib.kvdmabuf_region_info(self._h, ctypes.byref(c))
        if rc < 0:
            _raise(rc, "")
        return RegionInfo(c)

    def dmabuf(self) -> tuple[int, int]:
        """(fd, offset) of the region's proxy dma-buf, owned by the library."""
        fd, off = ctypes.c_int(), ctypes.c_uint64()
        rc = _lib.kvdmabuf_region_dmabuf(self._h, ctypes.byref(fd),
                                         ctypes.byref(off))
        if rc < 0:
            _raise(rc, "region has no proxy dma-buf")
        return fd.value, off.value

    def set_drm_handle(self, drm_fd: int, handle: int) -> None:
        """A DRM region's new GEM handle, for the next wake (the engine
        freed its buffer at sleep and mapped a new one at the same
        address); see ``kvdmabuf_region_set_drm_handle``."""
        self._ctx._check(_lib.kvdmabuf_region_set_drm_handle(
            self._h, drm_fd, handle))

    def ranges(self, changes: Sequence[tuple]) -> None:
        """Give ranges of this awake region back and bring new memory in,
        in one step, keys unchanged (an elastic KV pool; see
        ``kvdmabuf_region_ranges``). Each change is ``(offset, length, fd)``
        or ``(offset, length, fd, fd_offset)``: ``fd`` a dma-buf of the new
        memory (not taken), :data:`RANGE_RELEASE` (reads give zeros), or
        :data:`RANGE_EXPORT` (a CUDA region: what is mapped there now).
        Transfers on those ranges must have ended."""
        arr = (_RegionRange * max(len(changes), 1))()
        for i, c in enumerate(changes):
            arr[i].offset, arr[i].len, arr[i].fd = c[0], c[1], c[2]
            arr[i].fd_offset = c[3] if len(c) > 3 else 0
        self._ctx._check(_lib.kvdmabuf_region_ranges(self._h, arr,
                                                     len(changes)))

    def io_begin(self) -> bool:
        """Count a transfer; False when the region sleeps (do not touch it)."""
        return _lib.kvdmabuf_io_begin(self._h) == 0

    def io_end(self) -> None:
        _lib.kvdmabuf_io_end(self._h)

    @contextlib.contextmanager
    def io(self) -> Iterator[None]:
        """``with region.io():`` wraps a transfer batch; raises
        :class:`Error` (ESHUTDOWN) when the region is going to sleep."""
        if not self.io_begin():
            raise Error(_errno.ESHUTDOWN, "region is asleep or going to sleep")
        try:
            yield
        finally:
            self.io_end()

    @contextlib.contextmanager
    def io_range(self, offset: int, length: int) -> Iterator[None]:
        """``with region.io_range(off, n):`` wraps a transfer on those
        bytes of an elastic pool (``kvdmabuf_io_begin_range``):
        :meth:`ranges` waits for it before it changes them. Raises
        :class:`Error` (ESHUTDOWN) while the region sleeps or those bytes
        change, (EINVAL) outside the region."""
        rc = _lib.kvdmabuf_io_begin_range(self._h, offset, length)
        if rc < 0:
            raise Error(-rc, "io_begin_range(%d, %d): %s" %
                        (offset, length, os.strerror(-rc)))
        try:
            yield
        finally:
            _lib.kvdmabuf_io_end_range(self._h, offset, length)

    def remove(self) -> None:
        self._ctx._remove(self)


KeyChangeFn = Callable[[Sequence[Region]], None]
SleepBeginFn = Callable[[Sequence[Region]], None]
DrainFn = Callable[[], bool]


class Context:
    """A kvdmabuf context: ``kvdmabuf_open()`` ... ``kvdmabuf_close()``.

    :param config_path: YAML config (None: ``$KVDMABUF_CONFIG``, else the
        built-in defaults, protocol rdma)
    :param config: the configuration as a dict instead of a file (the
        file's keys: ``{"protocol": "rdma", "nics": ["mlx5_0"]}``);
        ``KVDMABUF_<KEY>`` variables still apply over it
    :param pds: the engine's protection domains: ``struct ibv_pd *``
        addresses as ints, or pyverbs ``PD`` objects where pyverbs exposes
        the pointer (see :func:`pd_pointer`); empty:
        the library opens the config's NICs itself
    :param key_change: called with the regions whose keys changed, once per
        sleep or wake, before I/O resumes: republish their keys
    :param sleep_begin: called with the regions that stop now, before the
        drain: tell peers that use their rkeys to stop
    :param drain: called while draining; return True once local queues and
        the peers are quiet
    """

    def __init__(self, config_path: Optional[str] = None, *,
                 pds: Iterable[object] = (), module: int = MODULE_DEFAULT,
                 key_change: Optional[KeyChangeFn] = None,
                 sleep_begin: Optional[SleepBeginFn] = None,
                 drain: Optional[DrainFn] = None,
                 drain_timeout_ms: int = 0, access: int = 0,
                 cuda_library: Optional[str] = None,
                 config: Optional[dict] = None):
        self._h = ctypes.c_void_p()
        self._regions: dict[int, Region] = {}
        self._cb_error: Optional[BaseException] = None
        #: status of the last C call (>= 0 also when a callback raised)
        self.last_rc = 0
        ptrs = [pd_pointer(p) for p in pds]
        self._pds = (ctypes.c_void_p * max(len(ptrs), 1))(*ptrs)
        o = _Options()
        o.config_path = _b(config_path)
        # a JSON object is YAML: the library reads it as it reads a file
        self._config_yaml = _b(json.dumps(config)) if config is not None \
            else None
        o.config_yaml = self._config_yaml
        o.pds = ctypes.cast(self._pds, ctypes.POINTER(ctypes.c_void_p))
        o.nr_pds = len(ptrs)
        o.module = module
        o.drain_timeout_ms = drain_timeout_ms
        o.access = access
        o.cuda_library = _b(cuda_library)
        # keep the C trampolines alive as long as the context
        self._c_key_change = _REGIONS_FN(self._on_keys) if key_change \
            else _REGIONS_FN()
        self._c_sleep_begin = _SLEEP_FN(self._on_sleep_begin) if sleep_begin \
            else _SLEEP_FN()
        self._c_drain = _DRAIN_FN(self._on_drain) if drain else _DRAIN_FN()
        self._key_change, self._sleep_begin, self._drain = (
            key_change, sleep_begin, drain)
        o.key_change, o.sleep_begin, o.drain = (
            self._c_key_change, self._c_sleep_begin, self._c_drain)
        err = ctypes.create_string_buffer(512)
        rc = _lib.kvdmabuf_open(ctypes.byref(o), ctypes.byref(self._h), err,
                                len(err))
        if rc < 0:
            _raise(rc, err.value.decode(errors="replace"))

    # -- callbacks (from the thread running sleep or wake; the C library
    #    holds no lock, ctypes takes the GIL) --
    def _regions_of(self, arr, n) -> list[Region]:
        return [self._regions[arr[i]] for i in range(n) if arr[i] in self._regions]

    def _on_keys(self, arr, n, _arg) -> None:
        try:
            self._key_change(self._regions_of(arr, n))
        except BaseException as e:      # never across the C frames
            self._cb_error = e

    def _on_sleep_begin(self, arr, n, _arg) -> int:
        try:
            self._sleep_begin(self._regions_of(arr, n))
            return 0
        except OSError as e:
            self._cb_error = e
            return -(e.errno or _errno.ECANCELED)
        except BaseException as e:
            self._cb_error = e
            return -_errno.ECANCELED

    def _on_drain(self, _arg) -> int:
        try:
            return 1 if self._drain() else 0
        except BaseException as e:
            self._cb_error = e
            return -_errno.ECANCELED

    # -- calls --
    def _check(self, rc: int) -> int:
        cb, self._cb_error = self._cb_error, None
        self.last_rc = rc
        if rc < 0:
            msg = (_lib.kvdmabuf_last_error(self._h) or b"").decode(
                errors="replace")
            _raise(rc, msg)
        if cb is not None:
            raise cb
        return rc

    @property
    def handle(self) -> int:
        """The C ``struct kvdmabuf_ctx *``."""
        return self._h.value or 0

    def add_region(self, addr: int, length: int, mem: Union[int, str] = MEM_HOST,
                   *, tag: str = "", released_at_sleep: bool = False,
                   empty: bool = False, drm_fd: int = -1, drm_handle: int = 0,
                   nics: int = 0) -> Region:
        """Export (device memory) and register [addr, addr+length) on every
        NIC (or the NICs of bit mask ``nics``); see ``kvdmabuf_region_add``.
        ``empty``: an elastic pool with nothing mapped yet
        (``KVDMABUF_REGION_EMPTY``)."""
        d = _RegionDesc()
        d.addr, d.len = addr, length
        d.mem = _MEM_NAMES.get(mem, mem) if isinstance(mem, str) else mem
        d.flags = ((REGION_RELEASED_AT_SLEEP if released_at_sleep else 0) |
                   (REGION_EMPTY if empty else 0))
        d.tag = tag.encode()
        d.drm_fd, d.drm_handle, d.nics = drm_fd, drm_handle, nics
        h = ctypes.c_void_p()
        self._check(_lib.kvdmabuf_region_add(self._h, ctypes.byref(d),
                                             ctypes.byref(h)))
        r = Region(self, h.value)
        self._regions[h.value] = r
        return r

    def _remove(self, r: Region) -> None:
        self._check(_lib.kvdmabuf_region_remove(r._h))
        self._regions.pop(r.handle, None)

    def sleep(self, tag: Optional[str] = None) -> None:
        """Before the engine unmaps the memory of the regions tagged ``tag``
        (None: all): stop I/O, drain, release. All or nothing."""
        self._check(_lib.kvdmabuf_sleep(self._h, _b(tag)))

    def wake(self, tag: Optional[str] = None) -> None:
        """After the engine mapped new memory at the same addresses."""
        self._check(_lib.kvdmabuf_wake(self._h, _b(tag)))

    def query(self) -> State:
        c = _State()
        self._check(_lib.kvdmabuf_query(self._h, ctypes.byref(c)))
        return State(c)

    def regions(self) -> list[Region]:
        return list(self._regions.values())

    @contextlib.contextmanager
    def io_many(self, regions: Sequence[Region]) -> Iterator[None]:
        """``with ctx.io_many(regions):`` wraps one transfer batch over
        several regions, all or nothing (``kvdmabuf_io_begin_many``): two
        atomic operations per region per batch, not per slice; raises
        :class:`Error` (ESHUTDOWN) when any of them is going to sleep."""
        arr = (ctypes.c_void_p * max(len(regions), 1))(
            *[r.handle for r in regions])
        if _lib.kvdmabuf_io_begin_many(arr, len(regions)) < 0:
            raise Error(_errno.ESHUTDOWN, "a region is asleep or going to "
                        "sleep")
        try:
            yield
        finally:
            _lib.kvdmabuf_io_end_many(arr, len(regions))

    def nic_add(self, pd: object) -> int:
        """A NIC (its ``struct ibv_pd *``, see :func:`pd_pointer`) joins;
        returns its index."""
        idx = ctypes.c_uint()
        self._check(_lib.kvdmabuf_nic_add(
            self._h, ctypes.c_void_p(pd_pointer(pd)), ctypes.byref(idx)))
        return idx.value

    def nic_remove(self, nic: int) -> None:
        self._check(_lib.kvdmabuf_nic_remove(self._h, nic))

    def close(self) -> None:
        """Remove every region and free the context (Busy while a transfer
        is in flight: nothing is removed then)."""
        if self._h:
            self._check(_lib.kvdmabuf_close(self._h))
            self._h = ctypes.c_void_p()
            self._regions.clear()

    def __enter__(self) -> "Context":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
