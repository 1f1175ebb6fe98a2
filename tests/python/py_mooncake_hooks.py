#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""kvdmabuf.mooncake.MooncakeSleepHooks where the keys do not change at a
wake (NOREG: ``protocol: tcp``; FOLLOW behaves the same towards the store):
every buffer the sleep unregistered from the store is registered again at
the wake, each cycle, and only those. Host-only: NOREG host memory needs
neither the module nor a NIC. What stands in: tests/fake_store.py for
Mooncake's ``MooncakeDistributedStore`` (its register_buffer and
unregister_buffer); lib/python/examples/hostvmm.py for the allocator (host
memory released and mapped again at the same address)."""
import errno
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))  # ktap
import ktap  # noqa: E402
from ktap import check  # noqa: E402
from fake_store import FakeStore  # noqa: E402

ktap.use_build_tree()
import kvdmabuf  # noqa: E402
from kvdmabuf.mooncake import MooncakeError, MooncakeSleepHooks  # noqa: E402

sys.path.insert(0, os.path.join(HERE, "..", "..", "lib", "python",
                                "examples"))
from hostvmm import HostVMM  # noqa: E402

SIZE = 1 << 20


def setup():
    conf = tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False)
    conf.write("protocol: tcp\ntransport: mooncake\n")
    conf.close()
    store = FakeStore()
    hooks = MooncakeSleepHooks(store, conf.name)
    os.unlink(conf.name)
    return store, hooks


def cycle(hooks, mem, tags=("kv_cache",)):
    hooks.release(list(tags))
    mem.release()
    mem.remap()
    hooks.restore(list(tags))


def noreg_wake_registers_the_buffer_again_every_cycle():
    store, h = setup()
    mem = HostVMM(SIZE)
    r = h.register(mem.addr, SIZE)
    check(r.info().mode == kvdmabuf.MODE_NOREG, str(r.info()))
    for c in range(1, 4):
        h.release(["kv_cache"])
        check(not store.registered, "cycle %d: still registered while "
              "asleep: %s" % (c, store.calls))
        mem.release()
        mem.remap()
        h.restore(["kv_cache"])
        check(store.registered == {mem.addr: SIZE},
              "cycle %d: not registered after the wake: %s" %
              (c, store.calls))
        check(h.registrations == c, "cycle %d: %d registrations" %
              (c, h.registrations))
    h.close()
    check(not store.registered, str(store.calls))
    mem.close()


def wake_registers_only_what_the_sleep_unregistered():
    """A region the store never had (added to the context directly) is not
    handed to the store at the wake."""
    store, h = setup()
    mine, other = HostVMM(SIZE), HostVMM(SIZE)
    h.register(mine.addr, SIZE)
    h.hooks.register(other.addr, SIZE, "kv_cache", mem="host")
    cycle(h, mine)
    check(store.registered == {mine.addr: SIZE}, str(store.calls))
    check(("register", other.addr, SIZE) not in store.calls, str(store.calls))
    h.close()
    mine.close()
    other.close()


def failed_reregistration_at_the_wake_is_retried():
    """register_buffer fails at the wake: released again (nothing of the
    new memory registered), and the next restore registers it."""
    store, h = setup()
    mem = HostVMM(SIZE)
    r = h.register(mem.addr, SIZE)
    h.release(["kv_cache"])
    mem.release()
    mem.remap()
    store.fail_register = True
    try:
        h.restore(["kv_cache"])
        raise AssertionError("restore did not fail")
    except MooncakeError as e:
        check(e.errno == errno.EIO and "register_buffer" in e.strerror,
              e.strerror)
    store.fail_register = False
    check(r.info().asleep and not store.registered, str(store.calls))
    h.restore(["kv_cache"])
    check(not r.info().asleep and store.registered == {mem.addr: SIZE},
          str(store.calls))
    h.close()
    mem.close()


if __name__ == "__main__":
    sys.exit(ktap.main([
        noreg_wake_registers_the_buffer_again_every_cycle,
        wake_registers_only_what_the_sleep_unregistered,
        failed_reregistration_at_the_wake_is_retried,
    ]))
