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

**The KV cache becomes kvdmabuf regions by itself.** The plugin follows
the sleep-mode allocator's records (``CuMemAllocator._python_malloc_callback``
and ``_python_free_callback``, which vLLM's C allocator calls for each
allocation of its pool): each allocation made under the tag ``kv_cache``
is registered as a region of that tag (a CUDA region, with a proxy where
the module is loaded) once it is mapped, and before any KV connector sees
the KV cache: the plugin wraps the connectors that
``KVConnectorFactory.create_connector`` makes so that their
``register_kv_caches`` (and ``register_cross_layers_kv_cache``) first
register what the allocator has made since. A transfer engine that then
registers the KV cache with the NIC under ``libkvdmabuf-preload.so``
registers it on the region's proxy (FOLLOW). The C allocator calls the
malloc callback before it maps the memory, so the registration waits for
the connector (or, without one, for the end of the ``kv_cache`` pool). A
KV allocation that vLLM frees outside sleep (a re-initialisation of the KV
cache) has its region removed first. :func:`kv_regions` lists them.
``KVDMABUF_CONFIG`` names the configuration (else the built-in defaults);
``KVDMABUF_VLLM_MEM=host`` stands host memory for CUDA memory (tests).

A connector with its own NIC registrations may still use the process's
hooks for memory of its own: ``kvdmabuf_vllm.hooks().register(ptr, nbytes,
tag)``. Nothing registered: the wrapped methods do what vLLM's own do.

Install beside the ``kvdmabuf`` package (see pyproject.toml); vLLM loads it
by itself.
"""
from __future__ import annotations

import contextlib
import functools
import logging
import os
import types
from typing import Callable, Dict, Optional, Sequence, Union

from kvdmabuf import Region
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


#: the allocator's tag of the KV cache, whose allocations become regions
KV_TAG = "kv_cache"
_TRACKED = "_kvdmabuf_tracked"
_pending: Dict[int, int] = {}       # KV allocations to register: addr -> size
_kv_regions: Dict[int, Region] = {}  # registered ones: addr -> region


def kv_regions() -> Dict[int, Region]:
    """The KV allocations the plugin made regions of: address -> region."""
    return dict(_kv_regions)


def register_kv_allocations() -> int:
    """Register the KV allocations made since the last call (mapped by
    now), each as a region of the tag ``kv_cache``; returns how many. A
    failure is logged, never raised (the engine goes on: a transfer
    engine's registration of that memory then cannot follow, and under
    the preload every sleep of it is refused, naming it)."""
    done = 0
    if not _pending:
        return 0
    try:
        h = hooks()
    except Exception as e:              # noqa: BLE001 (see above)
        log.error("kvdmabuf_vllm: %d KV allocation(s) are no kvdmabuf "
                  "regions, no context: %s: %s", len(_pending),
                  type(e).__name__, e)
        _pending.clear()
        return 0
    mem = os.environ.get("KVDMABUF_VLLM_MEM", "cuda")
    while _pending:
        addr, size = _pending.popitem()
        try:
            _kv_regions[addr] = h.register(addr, size, KV_TAG, mem=mem)
            done += 1
        except Exception as e:          # noqa: BLE001 (see above)
            log.error("kvdmabuf_vllm: KV allocation %#x+%d is no kvdmabuf "
                      "region: %s: %s", addr, size, type(e).__name__, e)
    return done


def _forget(addr: int) -> None:
    """vLLM frees the KV allocation at @addr (outside sleep): its region
    goes first, while the memory is still there."""
    _pending.pop(addr, None)
    r = _kv_regions.pop(addr, None)
    if r is None:
        return
    try:
        r.remove()
    except Exception as e:              # noqa: BLE001 (a free cannot fail)
        log.error("kvdmabuf_vllm: the region of freed KV allocation %#x "
                  "stays: %s: %s", addr, type(e).__name__, e)


def _track(allocator_class) -> bool:
    """Follow the allocator's records of its allocations (see above);
    False when done before."""
    if getattr(allocator_class, _TRACKED, False):
        return False
    malloc_cb = allocator_class._python_malloc_callback
    free_cb = allocator_class._python_free_callback
    use_memory_pool = allocator_class.use_memory_pool

    @functools.wraps(malloc_cb)
    def kvd_malloc_callback(self, allocation_handle):
        done = malloc_cb(self, allocation_handle)
        if self.current_tag == KV_TAG:      # handle: device, size, addr, .
            _pending[allocation_handle[2]] = allocation_handle[1]
        return done

    @functools.wraps(free_cb)
    def kvd_free_callback(self, ptr):
        _forget(ptr)
        return free_cb(self, ptr)

    @functools.wraps(use_memory_pool)
    @contextlib.contextmanager
    def kvd_use_memory_pool(self, tag=None):
        with use_memory_pool(self, tag):
            yield
        if tag == KV_TAG:       # no connector took the KV cache: now
            register_kv_allocations()

    allocator_class._python_malloc_callback = kvd_malloc_callback
    allocator_class._python_free_callback = kvd_free_callback
    allocator_class.use_memory_pool = kvd_use_memory_pool
    # an allocator made before the plugin: its bound callbacks, and what
    # it allocated under the KV tag so far
    inst = getattr(allocator_class, "instance", None)
    if inst is not None:
        inst.python_malloc_callback = types.MethodType(kvd_malloc_callback,
                                                       inst)
        inst.python_free_callback = types.MethodType(kvd_free_callback, inst)
        for addr, data in inst.pointer_to_data.items():
            if data.tag == KV_TAG and not getattr(data, "is_asleep", False):
                _pending[addr] = data.handle[1]
    setattr(allocator_class, _TRACKED, True)
    return True


def _wrap_method(obj, name: str, make: Callable) -> None:
    """@obj's method @name replaced, once, by ``make(method)`` (which
    keeps its name and docstring); a missing method is left missing."""
    fn = getattr(obj, name, None)
    if fn is None or getattr(fn, _WRAPPED, False):
        return
    wrapper = functools.wraps(fn)(make(fn))
    setattr(wrapper, _WRAPPED, True)
    setattr(obj, name, wrapper)


def _registering_first(connector):
    """@connector's KV registrations, after the plugin's own."""
    def make(fn):
        def first(*args, **kw):
            register_kv_allocations()
            return fn(*args, **kw)
        return first
    for name in ("register_kv_caches", "register_cross_layers_kv_cache"):
        _wrap_method(connector, name, make)
    return connector


def kv_cache_follows() -> bool:
    """Does every registration of the KV cache stay valid through sleep
    and wake by itself? True when every KV region the plugin made follows
    (FOLLOW: on a proxy, keys never change) and the process runs under
    libkvdmabuf-preload.so, so that a transfer engine's registrations of
    that memory are on the same proxies (one that could not follow makes
    every sleep fail, naming it)."""
    regions = list(_kv_regions.values())
    try:
        from kvdmabuf import MODE_FOLLOW, preload_loaded
        return bool(regions) and preload_loaded() and \
            all(r.info().mode == MODE_FOLLOW for r in regions)
    except Exception as e:              # noqa: BLE001: never stop vLLM
        log.warning("kvdmabuf_vllm: %s: %s; the connector's own release "
                    "and restore run", type(e).__name__, e)
        return False


def _skipping_when_following(connector):
    """@connector's own ``release_kv_caches`` / ``restore_kv_caches``
    (vLLM's tag hooks call them around a sleep of ``kv_cache``, after the
    plugin's) are skipped while :func:`kv_cache_follows`: its registrations
    are on the proxies, keep their keys (a P/D peer's cached rkey works
    again after the wake) and need no deregistration, and registering
    again would only cost time and new keys. Otherwise they run. Its
    ``supports_sleep_mode`` answers yes under the preload as well: there a
    registration of KV memory that cannot follow makes the sleep fail,
    naming it, instead of going stale."""
    def supports_under_the_preload(ask):
        def supports(*args, **kw):
            if ask(*args, **kw):
                return True
            try:
                from kvdmabuf import preload_loaded
                return preload_loaded()
            except Exception:           # noqa: BLE001: never stop vLLM
                return False
        return supports

    def skipped_while_following(name):
        def make(fn):
            def skipped(*args, **kw):
                if kv_cache_follows():
                    log.info("kvdmabuf_vllm: %s.%s skipped: every KV "
                             "region follows (its registrations keep "
                             "their keys)", type(connector).__name__, name)
                    return None
                return fn(*args, **kw)
            return skipped
        return make

    _wrap_method(connector, "supports_sleep_mode", supports_under_the_preload)
    for name in ("release_kv_caches", "restore_kv_caches"):
        _wrap_method(connector, name, skipped_while_following(name))
    return connector


def _wrap_factory(factory) -> bool:
    """Every connector the factory makes registers the plugin's regions
    first, and skips its own release/restore where they follow; False
    when done before or the factory has no such method."""
    if getattr(factory, _TRACKED, False):
        return False
    names = [n for n in ("create_connector", "create_connector_v1")
             if n in vars(factory)]
    for name in names:
        make = getattr(factory, name)   # bound to the class

        def created(cls, *args, _make=make, **kw):
            return _skipping_when_following(
                _registering_first(_make(*args, **kw)))
        setattr(factory, name, classmethod(functools.wraps(make)(created)))
    setattr(factory, _TRACKED, True)
    return bool(names)


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
    try:
        _register_kv_cache()
    except Exception as e:              # noqa: BLE001 (see above)
        log.error("kvdmabuf_vllm: the KV cache is not registered by the "
                  "plugin: %s: %s", type(e).__name__, e)


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


def _allocator_class(what: str):
    """vLLM's CuMemAllocator, or None where it does not import (logged,
    with @what the plugin then does not do)."""
    try:
        from vllm.device_allocator.cumem import CuMemAllocator
    except ImportError as e:
        log.warning("kvdmabuf_vllm: no vLLM sleep-mode allocator here (%s); "
                    "%s", e, what)
        return None
    return CuMemAllocator


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
    CuMemAllocator = _allocator_class("nothing wrapped")
    if CuMemAllocator is None:
        return
    if _wrap(CuMemAllocator):
        log.info("kvdmabuf_vllm: CuMemAllocator sleep/wake_up%s wrapped "
                 "with kvdmabuf hooks",
                 "/discard" if hasattr(CuMemAllocator, "discard") else "")


def _register_kv_cache() -> None:
    """The KV cache's allocations become regions (see above)."""
    CuMemAllocator = _allocator_class("the KV cache is not registered by "
                                      "the plugin")
    if CuMemAllocator is None:
        return
    if _track(CuMemAllocator):
        log.info("kvdmabuf_vllm: KV allocations (tag %s) become kvdmabuf "
                 "regions", KV_TAG)
    try:
        from vllm.distributed.kv_transfer.kv_connector.factory import \
            KVConnectorFactory
    except ImportError as e:
        log.info("kvdmabuf_vllm: no KV connectors here (%s): KV "
                 "allocations are registered at the end of their pool", e)
        return
    _wrap_factory(KVConnectorFactory)
