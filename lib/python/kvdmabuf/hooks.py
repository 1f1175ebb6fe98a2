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

import contextlib
from typing import Callable, Iterable, Iterator, Optional, Sequence

from . import Context, Error, Region, gate

#: ``on_new_keys({tag: [(region, [(lkey, rkey) per NIC], key_gen), ...]})``
NewKeysFn = Callable[[dict], None]


class SleepSupport:
    """The gate's answer: true or false, with the reason either way."""

    def __init__(self, supported: bool, reason: str):
        self.supported, self.reason = supported, reason

    def __bool__(self) -> bool:
        return self.supported

    def __repr__(self) -> str:
        return "SleepSupport(%r, %r)" % (self.supported, self.reason)


class SleepHooks:
    """One kvdmabuf context for an engine's KV registrations.

    :param config_path: kvdmabuf YAML (None: ``$KVDMABUF_CONFIG``, else the
        built-in defaults: no file needed)
    :param pds: the transfer engine's protection domains: their
        ``struct ibv_pd *`` as ints (see :func:`kvdmabuf.pd_pointer`)
    :param on_new_keys: receives the regions whose keys changed
    :param on_sleep_begin: receives the regions that stop now (tell peers)
    :param config: the configuration as a dict instead of a file
        (see :class:`kvdmabuf.Context`)
    :param drain: asked while a sleep drains; True once the transfer
        engine's own queues are empty and its peers quiet (the in-flight
        counts of :meth:`kvdmabuf.Region.io` are waited for in any case)
    """

    def __init__(self, config_path: Optional[str] = None, *,
                 pds: Iterable[object] = (),
                 on_new_keys: Optional[NewKeysFn] = None,
                 on_sleep_begin: Optional[Callable[[Sequence[Region]], None]] = None,
                 drain: Optional[Callable[[], bool]] = None,
                 drain_timeout_ms: int = 0,
                 config: Optional[dict] = None):
        self._on_new_keys = on_new_keys
        self.config_path = config_path
        self.ctx = Context(config_path, pds=pds, key_change=self._keys,
                           sleep_begin=on_sleep_begin, drain=drain,
                           drain_timeout_ms=drain_timeout_ms, config=config)

    @staticmethod
    def supports_sleep_mode(config_path: Optional[str] = None) -> SleepSupport:
        """The gate: may this engine sleep with its configured transport?

        Never raises: a missing or invalid config is a false answer too.
        The answer is true or false (``if supports_sleep_mode():``) and
        carries the gate's ``reason``."""
        try:
            return SleepSupport(*gate(config_path))
        except Error as e:
            return SleepSupport(False, e.strerror or str(e))

    def register(self, addr: int, length: int, tag: str, mem="cuda",
                 released_at_sleep: bool = True, nics: int = 0) -> Region:
        """Register a KV (or weight) range under ``tag``, on every NIC or
        on the NICs of bit mask ``nics`` (a worker's own NICs)."""
        return self.ctx.add_region(addr, length, mem, tag=tag,
                                   released_at_sleep=released_at_sleep and
                                   mem == "host", nics=nics)

    def keys(self, region: Region) -> list[tuple[int, int]]:
        """(lkey, rkey) per NIC of the context as it is now (NICs may join
        and leave); (0, 0) on a NIC the region is not registered on."""
        out = []
        for n in range(self.ctx.query().nr_nics):
            try:
                out.append(region.keys(n)[:2])
            except Error:
                out.append((0, 0))
        return out

    @contextlib.contextmanager
    def io(self, regions: Sequence[Region]) -> Iterator[None]:
        """``with hooks.io(regions):`` around one transfer batch (not each
        slice): all or nothing; raises :class:`Error` (ESHUTDOWN) while any
        region is going to sleep."""
        with self.ctx.io_many(regions):
            yield

    def _keys(self, regions: Sequence[Region]) -> None:
        if not self._on_new_keys:
            return
        out: dict = {}
        for r in regions:
            gen = r.info().key_gen
            out.setdefault(r.info().tag, []).append((r, self.keys(r), gen))
        self._on_new_keys(out)

    def _each_tag(self, tags, step, undo) -> None:
        """``step`` on every tag, all or nothing: a step that fails undoes
        the tags done before it. An exception from a callback (the step
        itself succeeded: ctx.last_rc >= 0) undoes nothing, the other tags
        still get their step, and it is raised at the end."""
        done: list[Optional[str]] = []
        late: Optional[BaseException] = None
        for t in (tags if tags is not None else [None]):
            try:
                step(t)
            except Exception as e:
                if isinstance(e, Error) and self.ctx.last_rc < 0:
                    for d in reversed(done):
                        undo(d)
                    raise
                late = late or e
            done.append(t)
        if late is not None:
            raise late

    # -- vLLM: around CuMemAllocator.sleep(offload_tags) / wake_up(tags) --
    def release(self, tags: Optional[Sequence[str]] = None) -> None:
        """Before the allocator unmaps ``tags`` (None: every tag; vLLM's
        sleep unmaps every allocation whatever its offload_tags, so call it
        with None there). All or nothing over the tags: on failure every
        tag is awake again."""
        self._each_tag(tags, self.ctx.sleep, self.ctx.wake)

    def restore(self, tags: Optional[Sequence[str]] = None) -> None:
        """After the allocator mapped ``tags`` again at the same addresses
        and made them accessible (vLLM: after ``wake_up(tags)``, whose
        cuMemSetAccess must be done; a wake of memory not yet mapped fails
        with EFAULT and the tag stays asleep).
        All or nothing: on failure the tags woken before are asleep again;
        an exception of ``on_new_keys`` puts nothing back to sleep."""
        self._each_tag(tags, self.ctx.wake, self.ctx.sleep)

    # -- vLLM's third entry point: the KV cache alone --
    def release_kv_cache_memory(self, tag: str = "kv_cache") -> None:
        """Before vLLM's KV-only release (``release_kv_cache_memory()``),
        which unmaps the KV cache's allocations and nothing else: without
        this call the library's dma-bufs keep that memory allocated. The
        wake is :meth:`restore` with the same tag."""
        self.release([tag])

    # -- SGLang: release_memory_occupation / resume_memory_occupation --
    def release_memory_occupation(self, tags: Optional[Sequence[str]] = None) -> None:
        self.release(tags)

    def resume_memory_occupation(self, tags: Optional[Sequence[str]] = None) -> None:
        self.restore(tags)

    def close(self) -> None:
        self.ctx.close()
