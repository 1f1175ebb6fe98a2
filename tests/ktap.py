# SPDX-License-Identifier: MIT
"""kselftest-style TAP for the Python tests: one function per test, each run
in order; ``-l`` lists, ``-t NAME`` runs one (a name that matches nothing
fails). Exit status 0 pass, 1 fail, 4 skip (all skipped)."""
import faulthandler
import os
import sys
import traceback


class Skip(Exception):
    """Raised by a test that cannot run here; the message is the reason."""


def scaled(seconds):
    """@seconds times KVDMABUF_TIMEOUT_SCALE (the debug lane runs 4x slower
    under KASAN and lockdep): every wall-clock bound and guard of a test."""
    try:
        k = int(os.environ.get("KVDMABUF_TIMEOUT_SCALE", "1"))
    except ValueError:
        k = 1
    return seconds * max(k, 1)


def check(cond, what="check failed"):
    if not cond:
        raise AssertionError(what)


def main(tests):
    faulthandler.enable()           # a crash in C code names the line
    args = sys.argv[1:]
    if "-l" in args:
        for t in tests:
            print(t.__name__)
        return 0
    if "-t" in args:
        name = args[args.index("-t") + 1]
        tests = [t for t in tests if t.__name__ == name]
        if not tests:
            print("# no test named %s" % name)
            return 1
    print("TAP version 13")
    print("1..%d" % len(tests))
    failed = skipped = 0
    for i, t in enumerate(tests, 1):
        try:
            t()
            print("ok %d %s" % (i, t.__name__))
        except Skip as e:
            skipped += 1
            print("ok %d %s # SKIP %s" % (i, t.__name__, e))
        except BaseException:                # report, go on
            failed += 1
            for line in traceback.format_exc().splitlines():
                print("# " + line)
            print("not ok %d %s" % (i, t.__name__))
        sys.stdout.flush()
    print("# Totals: pass:%d fail:%d skip:%d" % (
        len(tests) - failed - skipped, failed, skipped))
    if failed:
        return 1
    return 4 if skipped == len(tests) else 0


_TOP = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def use_build_tree():
    """Import kvdmabuf from this tree's lib/python and load its library."""
    top = _TOP
    sys.path.insert(0, os.path.join(top, "lib", "python"))
    os.environ.setdefault("KVDMABUF_LIBRARY",
                          os.path.join(top, "lib", "libkvdmabuf.so.0"))
    return top


def rxe_dmabuf_missing():
    """Why soft-RoCE here has no usable dma-buf MRs (tests/rxe_env.h: the
    patched rdma_rxe and rdma-core's patched provider), or None."""
    rxe = os.path.join(os.environ.get("KVDMABUF_BUILD", _TOP), "tests", "rxe",
                       "build")

    def first_line(name, default):
        try:
            with open(os.path.join(rxe, name)) as f:
                return f.readline().strip() or default
        except OSError:
            return default
    if not os.path.exists("/sys/module/rdma_rxe/parameters/dmabuf_pinned"):
        return first_line("SKIP", "rdma_rxe without dma-buf MRs loaded")
    if not os.environ.get("RDMAV_DRIVERS"):
        return "rxe provider not built: %s" % first_line(
            os.path.join("provider", "SKIP"), "no provider library")
    return None
