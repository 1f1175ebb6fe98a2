# SPDX-License-Identifier: MIT
"""Engine sleep hooks: where vLLM and SGLang put KV memory to sleep.

Both engines release GPU memory by *tag* ("weights", "kv_cache") and map
new memory at the same addresses later. The transfer layer that registered
that memory with the NIC (vLLM: a KV connector; SGLang: its Mooncake/NIXL
transfer backend) must hear of it on both sides of the allocator's work:

* **before** the allocator unmaps: :meth:`SleepHooks.release` (vLLM
  names) or :meth:`SleepHooks.release_memory_occupation` (SGLang names);
* **after** it mapped again: :meth:`SleepHooks.restore` /
  :meth:`SleepHooks.resume_memory_occupation`.

New keys (REREGISTER regions) reach ``on_new_keys`` before any transfer may
start again, so the connector republishes them to its peers.
"""
from __future__ import annotations

from typing import Callable, Iterable, Optional, Sequence

from . import Context, Error, Region, gate

#: ``on_new_keys({tag: [(region, [(lkey, rkey) per NIC], key_gen), ...]})``
NewKeysFn = Callable[[dict], None]


class SleepHooks:
    """One kvdmabuf context for an engine's KV registrations.

    :param config_path: kvdmabuf YAML (None: ``$KVDMABUF_CONFIG``)
    :param pds: the transfer engine's protection domains (pyverbs PDs)
    :param on_new_keys: receives the regions whose keys changed
    :param on_sleep_begin: receives the regions that stop now (tell peers)
    :param drain: asked while a sleep drains; True once the transfer
        engine's own queues are empty (the in-flight counts of
        :meth:`kvdmabuf.Region.io` are waited for in any case)
    """

    def __init__(self, config_path: Optional[str] = None, *,
                 pds: Iterable[object] = (),
                 on_new_keys: Optional[NewKeysFn] = None,
                 on_sleep_begin: Optional[Callable[[Sequence[Region]], None]] = None,
                 drain: Optional[Callable[[], bool]] = None,
                 drain_timeout_ms: int = 0):
        self._on_new_keys = on_new_keys
        self.config_path = config_path
        self.ctx = Context(config_path, pds=pds, key_change=self._keys,
                           sleep_begin=on_sleep_begin, drain=drain,
                           drain_timeout_ms=drain_timeout_ms)
        self._nics = self.ctx.query().nr_nics

    @staticmethod
    def supports_sleep_mode(config_path: Optional[str] = None) -> bool:
        """The gate: may this engine sleep with its configured transport?"""
        return gate(config_path)[0]

    def register(self, addr: int, length: int, tag: str, mem="cuda",
                 released_at_sleep: bool = True) -> Region:
        """Register a KV (or weight) range under ``tag``."""
        return self.ctx.add_region(addr, length, mem, tag=tag,
                                   released_at_sleep=released_at_sleep and
                                   mem == "host")

    def keys(self, region: Region) -> list[tuple[int, int]]:
        return [region.keys(n)[:2] for n in range(self._nics)]

    def _keys(self, regions: Sequence[Region]) -> None:
        if not self._on_new_keys:
            return
        out: dict = {}
        for r in regions:
            _, _, gen = r.keys(0)
            out.setdefault(r.info().tag, []).append((r, self.keys(r), gen))
        self._on_new_keys(out)

    # -- vLLM: around CuMemAllocator.sleep(offload_tags) / wake_up(tags) --
    def release(self, tags: Optional[Sequence[str]] = None) -> None:
        """Before the allocator unmaps ``tags`` (None: every tag). All or
        nothing over the tags: on failure every tag is awake again."""
        done: list[Optional[str]] = []
        try:
            for t in (tags if tags is not None else [None]):
                self.ctx.sleep(t)
                done.append(t)
        except Error:
            for t in reversed(done):
                self.ctx.wake(t)
            raise

    def restore(self, tags: Optional[Sequence[str]] = None) -> None:
        """After the allocator mapped ``tags`` again at the same addresses."""
        done: list[Optional[str]] = []
        try:
            for t in (tags if tags is not None else [None]):
                self.ctx.wake(t)
                done.append(t)
        except Error:
            for t in reversed(done):
                self.ctx.sleep(t)
            raise

    # -- SGLang: release_memory_occupation / resume_memory_occupation --
    def release_memory_occupation(self, tags: Optional[Sequence[str]] = None) -> None:
        self.release(tags)

    def resume_memory_occupation(self, tags: Optional[Sequence[str]] = None) -> None:
        self.restore(tags)

    def close(self) -> None:
        self.ctx.close()
