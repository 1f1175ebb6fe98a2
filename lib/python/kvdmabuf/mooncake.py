# SPDX-License-Identifier: MIT
"""Sleep and wake for KV buffers registered with Mooncake's store.

``MooncakeDistributedStore.register_buffer(addr, len)`` registers the
engine's KV memory with the store's transfer engine once; the zero-copy
calls (``put_from``, ``get_into``, their batch forms) then move bytes by
RDMA between that memory and the store's segments. The registration pins
the pages that were there when it was made: after a sleep (memory
released) and a wake (new memory at the same address) every transfer of
that buffer uses the old pages, without an error.

:class:`MooncakeSleepHooks` carries the registration through sleep and
wake with Mooncake's own calls, as the seed's engine-side fix does, driven
by kvdmabuf (REREGISTER mode: rdma, host or device memory that is released):

* sleep (:meth:`release`): kvdmabuf stops new transfers on the regions
  (:meth:`io` refuses them), drains (the transfers in flight, counted by
  :meth:`io`, and the ``drain`` callback for the store's own queues, within
  the drain bound), deregisters its MRs; then each buffer is unregistered
  from the store (``unregister_buffer``), before the allocator unmaps;
* wake (:meth:`restore`): after the allocator mapped new memory at the same
  addresses, kvdmabuf registers again and its key-change callback calls the
  store's ``register_buffer`` for each region, before any transfer may
  start again. Every buffer the sleep unregistered is registered again,
  whether its keys changed or not: in FOLLOW (the keys stay) and NOREG
  (``protocol: tcp``, no keys at all) no key-change callback comes, and
  the store must still find the buffer registered.

Both are all or nothing: a failed sleep leaves every buffer registered and
awake; a failed wake leaves them released (a retry starts clean).
"""
from __future__ import annotations

import contextlib
import errno
import threading
from typing import Iterator, Optional, Sequence

from . import Error, Region
from .hooks import SleepHooks


class MooncakeError(Error):
    """A Mooncake call failed: ``errno`` EIO, the call and its code."""


class MooncakeSleepHooks:
    """kvdmabuf hooks for buffers a Mooncake store registered.

    :param store: a set-up ``mooncake.store.MooncakeDistributedStore``
    :param config_path: kvdmabuf YAML (None: ``$KVDMABUF_CONFIG``); its
        ``nics`` are the store's RDMA devices
    :param drain_timeout_ms: drain bound (0: the config's)
    """

    def __init__(self, store, config_path: Optional[str] = None, *,
                 drain_timeout_ms: int = 0):
        self.store = store
        self._lock = threading.Lock()
        self._queued = 0          # transfers handed to the store, not done
        self._in_store: set[int] = set()   # addresses registered there
        self._released: set[int] = set()   # unregistered by a sleep
        self.registrations = 0    # register_buffer calls made at wakes
        self.hooks = SleepHooks(config_path, on_new_keys=self._new_keys,
                                drain=self._drained,
                                drain_timeout_ms=drain_timeout_ms)

    @staticmethod
    def supports_sleep_mode(config_path: Optional[str] = None) -> bool:
        return SleepHooks.supports_sleep_mode(config_path)

    # -- the store's calls, failures as exceptions --
    def _store_register(self, r: Region) -> None:
        i = r.info()
        rc = self.store.register_buffer(i.addr, i.length)
        if rc != 0:
            raise MooncakeError(errno.EIO, "Mooncake register_buffer(0x%x, "
                                "%d) failed: %d" % (i.addr, i.length, rc))
        self._in_store.add(i.addr)
        self._released.discard(i.addr)

    def _store_unregister(self, r: Region) -> None:
        addr = r.info().addr
        rc = self.store.unregister_buffer(addr)
        if rc != 0:
            raise MooncakeError(errno.EIO, "Mooncake unregister_buffer(0x%x) "
                                "failed: %d" % (addr, rc))
        self._in_store.discard(addr)

    def register(self, addr: int, length: int, tag: str = "kv_cache",
                 mem: str = "host") -> Region:
        """kvdmabuf region, then the store's registration of the buffer."""
        r = self.hooks.register(addr, length, tag, mem=mem)
        try:
            self._store_register(r)
        except Error:
            r.remove()
            raise
        return r

    # -- transfers --
    @contextlib.contextmanager
    def io(self, region: Region) -> Iterator[None]:
        """Wrap one store transfer of ``region``'s memory (``put_from``,
        ``get_into``, ...); raises :class:`kvdmabuf.Error` (ESHUTDOWN) while
        the region sleeps: no transfer may touch released memory."""
        with self._lock:
            self._queued += 1
        try:
            with region.io():
                yield
        finally:
            with self._lock:
                self._queued -= 1

    def _drained(self) -> bool:
        with self._lock:
            return self._queued == 0

    # -- kvdmabuf callbacks --
    def _new_keys(self, new: dict) -> None:
        """Key change at wake (I/O still refused): the store registers the
        new pages. A region the store still has registered (a sleep that
        was undone) is left as it is."""
        for entries in new.values():
            for region, _keys, _gen in entries:
                if region.info().asleep or \
                        region.info().addr in self._in_store:
                    continue
                self._store_register(region)
                self.registrations += 1

    def _regions(self, tags: Optional[Sequence[str]]) -> list[Region]:
        return [r for r in self.hooks.ctx.regions()
                if tags is None or r.info().tag in tags]

    # -- the engine's hook points --
    def release(self, tags: Optional[Sequence[str]] = None) -> None:
        """Before the allocator unmaps ``tags`` (None: all)."""
        self.hooks.release(tags)            # stop, drain, deregister ours
        done: list[Region] = []
        try:
            for r in self._regions(tags):
                if r.info().addr in self._in_store:
                    self._store_unregister(r)
                    done.append(r)
            self._released.update(r.info().addr for r in done)
        except Error:
            for r in reversed(done):
                self._store_register(r)
            self.hooks.restore(tags)        # awake again, as before
            raise

    def restore(self, tags: Optional[Sequence[str]] = None) -> None:
        """After the allocator mapped ``tags`` again at the same addresses."""
        try:
            self.hooks.restore(tags)        # callback: register_buffer
            # The buffers whose keys did not change (FOLLOW, NOREG).
            for r in self._regions(tags):
                if not r.info().asleep and r.info().addr in self._released:
                    self._store_register(r)
                    self.registrations += 1
        except Error:
            # Back to released: nothing of the new memory stays registered.
            for r in self._regions(tags):
                if r.info().addr in self._in_store:
                    self._store_unregister(r)
                    self._released.add(r.info().addr)
            self.hooks.release(tags)
            raise

    def close(self) -> None:
        for r in self._regions(None):
            if r.info().addr in self._in_store:
                self._store_unregister(r)
        self.hooks.close()
