# SPDX-License-Identifier: MIT
"""kvdmabuf_vllm - a vLLM plugin (example) that carries the KV cache's RDMA
registrations through vLLM's sleep mode, with no change to vLLM.

What vLLM offers, by file and name in its tree (read there; no code of it
is copied here):

* ``vllm/plugins/__init__.py``, ``load_general_plugins()``: every vLLM
  process calls each entry point of the group ``vllm.general_plugins``
  (``VLLM_PLUGINS`` may name the ones allowed), maybe more than once.
* ``vllm/device_allocator/cumem.py``, ``CuMemAllocator``: ``sleep(
  offload_tags)`` copies the allocations of the offload tags to host memory,
  then unmaps and releases *every* allocation (``unmap_and_release``),
  whatever its tag; ``wake_up(tags)`` maps the allocations of ``tags``
  (None: all) again (``create_and_map``: cuMemCreate, cuMemMap,
  cuMemSetAccess) and copies the host copies back; newer versions add
  ``discard(tags)``, which unmaps those tags alone (the KV-only release:
  ``EngineCore.release_kv_cache_memory()`` reaches it with
  ``("kv_cache",)``).
* ``vllm/device_allocator/sleep_mode_backend.py`` (newer versions):
  ``CuMemBackend.suspend(level)`` / ``resume(tags)`` / ``discard(tags)``
  call the allocator's ``sleep`` (offload tags ``("weights",)`` at level 1,
  none at level 2), ``wake_up`` and ``discard``; ``vllm/v1/worker/
  gpu_worker.py``, ``Worker.sleep`` / ``wake_up`` call the backend (older
  versions call the allocator directly).

Newer vLLM has tag hooks for exactly this (``vllm/device_allocator/
__init__.py``, ``register_tag_hooks(tag, before_unmap, after_map)``): the
allocator calls ``before_unmap`` right before it unmaps mapped
allocations of the tag (sleep at any level, discard) and the idempotent
``after_map`` after every wake-up that leaves all of them mapped. Where
they exist, :func:`register` subscribes :meth:`SleepHooks.release` and
:meth:`SleepHooks.restore` of each of vLLM's tags (``weights``,
``kv_cache``) there and wraps nothing. The plugin's hooks are registered
when vLLM loads its plugins, before any KV connector's, so for each tag
kvdmabuf's release runs before a connector's ``release_kv_caches`` and its
restore before the connector's ``restore_kv_caches``.

On older vLLM the one place every sleep path passes is the allocator's
methods. The entry point :func:`register` wraps them in place there, once
per process:

* ``sleep``: :meth:`SleepHooks.release` of every tag *before* the
  allocator unmaps (it unmaps every tag, at every level);
* ``discard(tags)``: release of those tags before it unmaps them;
* ``wake_up(tags)``: :meth:`SleepHooks.restore` of those tags *after* it
  returned, their memory mapped and accessible (cuMemSetAccess done).

vLLM's backend registry (``SleepModeBackendFactory.register_backend``)
would also take a backend of ours, but only runs it when the server is
started with ``--sleep-mode-backend`` naming it: without the flag, every
sleep would unmap registered memory behind the library's back. Wrapping the
allocator needs no flag and works with the default backend and with vLLM
versions that have no registry.

The KV connector (whatever registers the KV cache with the NIC) uses the
process's hooks: ``kvdmabuf_vllm.hooks(pds=[pd_pointer], on_new_keys=
republish).register(ptr, nbytes, "kv_cache")``. Nothing registered: the
wrapped methods do what vLLM's own do.

Install beside the ``kvdmabuf`` package (see pyproject.toml); vLLM loads it
by itself.
"""
from __future__ import annotations

import functools
import logging
from typing import Callable, Optional, Sequence, Union

from kvdmabuf.hooks import SleepHooks

log = logging.getLogger(__name__)
_hooks: Optional[SleepHooks] = None
_WRAPPED = "_kvdmabuf_wrapped"


def hooks(config_path: Optional[str] = None, **kw) -> SleepHooks:
    """The process's :class:`SleepHooks`, made at the first call with its
    arguments (those of :class:`SleepHooks`); later calls return it."""
    global _hooks
    if _hooks is None:
        _hooks = SleepHooks(config_path, **kw)
    elif config_path is not None or kw:
        raise ValueError("kvdmabuf_vllm.hooks(): the hooks exist already; "
                         "pass their arguments at the first call only")
    return _hooks


def current() -> Optional[SleepHooks]:
    """The process's hooks, or None before the first :func:`hooks` call."""
    return _hooks


def _tag_list(tags: Union[None, str, Sequence[str]]) -> Optional[list]:
    if tags is None:
        return None
    return [tags] if isinstance(tags, str) else list(tags)


def _released_around(tags: Optional[list], unmap: Callable[[], object]):
    """Release ``tags`` (None: all), then let vLLM unmap. When vLLM fails,
    the tags wake again: all or nothing, so regions whose memory vLLM did
    unmap keep every tag asleep, and the next wake_up wakes them."""
    if _hooks is None:
        return unmap()
    _hooks.release(tags)
    try:
        return unmap()
    except BaseException:
        _hooks.restore(tags)
        raise


def _wrap(allocator_class) -> bool:
    """Wrap the allocator's sleep, wake_up and (where it has one) discard;
    False when done before (plugins may be loaded more than once)."""
    if getattr(allocator_class, _WRAPPED, False):
        return False
    sleep, wake_up = allocator_class.sleep, allocator_class.wake_up
    discard = getattr(allocator_class, "discard", None)

    @functools.wraps(sleep)
    def kvd_sleep(self, *args, **kw):
        return _released_around(None, lambda: sleep(self, *args, **kw))

    @functools.wraps(wake_up)
    def kvd_wake_up(self, tags=None, *args, **kw):
        done = wake_up(self, tags, *args, **kw)
        if _hooks is not None:
            _hooks.restore(_tag_list(tags))
        return done

    allocator_class.sleep, allocator_class.wake_up = kvd_sleep, kvd_wake_up
    if discard is not None:
        @functools.wraps(discard)
        def kvd_discard(self, tags, *args, **kw):
            return _released_around(_tag_list(tags),
                                    lambda: discard(self, tags, *args, **kw))
        allocator_class.discard = kvd_discard
    setattr(allocator_class, _WRAPPED, True)
    return True


def register() -> None:
    """The ``vllm.general_plugins`` entry point. vLLM calls it unguarded in
    every process: whatever goes wrong here is logged and the plugin stays
    out of the way (nothing wrapped), never an engine that fails to
    start."""
    try:
        _register()
    except Exception as e:              # noqa: BLE001 (see above)
        log.error("kvdmabuf_vllm: disabled, the sleep-mode allocator is "
                  "not wrapped: %s: %s", type(e).__name__, e)


#: vLLM's sleep-mode tags (vllm/device_allocator/__init__.py,
#: DEFERRABLE_TAGS): a tag without kvdmabuf regions costs nothing
TAGS = ("weights", "kv_cache")
_subscribed = False


def _subscribe(register_tag_hooks) -> bool:
    """Subscribe to vLLM's tag hooks; False when done before."""
    global _subscribed
    if _subscribed:
        return False
    for tag in TAGS:
        register_tag_hooks(
            tag,
            lambda t=tag: _hooks.release([t]) if _hooks is not None else None,
            lambda t=tag: _hooks.restore([t]) if _hooks is not None else None)
    _subscribed = True
    return True


def _register() -> None:
    try:
        from vllm import device_allocator
    except ImportError as e:
        log.warning("kvdmabuf_vllm: no vLLM sleep-mode allocator here (%s); "
                    "nothing wrapped", e)
        return
    tag_hooks = getattr(device_allocator, "register_tag_hooks", None)
    if tag_hooks is not None:
        if _subscribe(tag_hooks):
            log.info("kvdmabuf_vllm: kvdmabuf hooks subscribed to vLLM's "
                     "tag hooks for %s", ", ".join(TAGS))
        return
    try:
        from vllm.device_allocator.cumem import CuMemAllocator
    except ImportError as e:
        log.warning("kvdmabuf_vllm: no vLLM sleep-mode allocator here (%s); "
                    "nothing wrapped", e)
        return
    if _wrap(CuMemAllocator):
        log.info("kvdmabuf_vllm: CuMemAllocator sleep/wake_up%s wrapped "
                 "with kvdmabuf hooks",
                 "/discard" if hasattr(CuMemAllocator, "discard") else "")
