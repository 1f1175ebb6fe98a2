#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""mooncake_elastic - an elastic KV pool (issue 38) under the real Mooncake
store: pages mapped and unmapped while serving, one registration, keys
unchanged.

Engine A is a kvcached-shaped stand-in: a reserved virtual range (kvcached
csrc/ftensor.cpp) into which pages are mapped as requests need KV and
unmapped when they end, each page its own allocation (csrc/page.cpp,
GPUPage: cuMemCreate, then cuMemMap + cuMemSetAccess at its address). A
vgem buffer stands for each GPU page (no GPU here); its dma-buf is the
page's export. A runs under LD_PRELOAD=libkvdmabuf-preload.so and adds the
pool as an empty kvdmabuf region (KVDMABUF_REGION_EMPTY: a proxy whose
pages all map the module's zeroed scratch), declared to the preload; then
Mooncake's own register_buffer of the whole pool, made on the proxy by
the preload, is the only registration. Each page A maps is brought in with
Region.ranges() (its dma-buf), each page it frees given back before its
buffer goes. Engine B (mooncake_store.py's engine, host memory) holds the
store's segment: every put and get of A is an RDMA transfer between A's
pool and B over soft-RoCE with dma-buf MRs (tests/rxe).

Over rounds of churn (pages freed and mapped in one batch each), checked:
every block A puts from a mapped page reaches B right, and every block A
gets into a mapped page is B's; a put from a page A freed gives zeros
(never the freed page's bytes, never another page's); a freed page's
memory is freed when the call returns (Shmem); Mooncake's MR (its keys)
never changes and no registration is made after the first.
"""
import ctypes
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import mooncake_store as ms  # noqa: E402
from mooncake_store import ktap, Skip, check  # noqa: E402
from hostvmm import _libc, ANON, MAP_FIXED, MAP_NORESERVE, PROT_NONE, RW  # noqa: E402,E501

PAGE = 2 << 20                 # kvcached's page (the GPU's granularity)
PAGES = 6
POOL = PAGES * PAGE
BS = ms.BS                     # one KV block
EDGES = (0, PAGE - BS)         # the blocks moved per page: its two ends
# Rounds of churn: (pages freed, pages mapped), each one batch.
ROUNDS = [((), (0, 1, 2, 3)), ((1,), (4,)), ((0, 2), (1, 5)),
          ((3, 4), (0,))]
DRM_IOCTL_PRIME_HANDLE_TO_FD = ms._ioc(3, 0x2D, 12)
O_RDWR, O_CLOEXEC = os.O_RDWR, os.O_CLOEXEC


class ElasticPool:
    """The reserved range and its pages, each a vgem buffer mapped at its
    place (MAP_FIXED over the reservation) and unmapped back to it."""

    def __init__(self):
        self.drm = ms.vgem_open()
        if self.drm is None:
            raise Skip("no vgem device")
        self.addr = _libc.mmap(None, POOL, PROT_NONE, ANON | MAP_NORESERVE,
                               -1, 0)
        if self.addr in (None, ctypes.c_void_p(-1).value):
            raise OSError(ctypes.get_errno(), "mmap of the pool's range")
        self.handles = {}

    def map_page(self, i):
        """A new, zeroed page at page @i; returns its dma-buf fd."""
        _, _, _, _, h, _, _ = ms.drm_ioctl(
            self.drm, ms.DRM_IOCTL_MODE_CREATE_DUMB, "=6IQ", PAGE // 1024,
            1024, 8, 0, 0, 0, 0)
        off = ms.drm_ioctl(self.drm, ms.DRM_IOCTL_MODE_MAP_DUMB, "=IIQ", h,
                           0, 0)[2]
        p = _libc.mmap(self.addr + i * PAGE, PAGE, RW, 0x01 | MAP_FIXED,
                       self.drm, off)
        if p != self.addr + i * PAGE:
            raise OSError(ctypes.get_errno(), "mmap of page %d" % i)
        self.handles[i] = h
        return ms.drm_ioctl(self.drm, DRM_IOCTL_PRIME_HANDLE_TO_FD, "=IIi",
                            h, O_RDWR | O_CLOEXEC, -1)[2]

    def unmap_page(self, i):
        """Page @i's memory goes; its range stays reserved."""
        _libc.mmap(self.addr + i * PAGE, PAGE, PROT_NONE,
                   ANON | MAP_FIXED | MAP_NORESERVE, -1, 0)
        ms.drm_ioctl(self.drm, ms.DRM_IOCTL_GEM_CLOSE, "=II",
                     self.handles.pop(i), 0)

    def write(self, off, data):
        ctypes.memmove(self.addr + off, data, len(data))

    def read(self, off, n):
        return ctypes.string_at(self.addr + off, n)


class ElasticEngine:
    """Engine A: the pool, registered once with the store through the
    preload; ops by command as mooncake_store's Engine."""

    def __init__(self, a):
        import kvdmabuf
        if not kvdmabuf.preload_loaded():
            raise RuntimeError("not running under the preload")
        self.store = ms.store_setup(a)
        self.kvdmabuf = kvdmabuf
        self.pool = ElasticPool()
        self.ctx = kvdmabuf.Context(a["config"])
        self.region = self.ctx.add_region(self.pool.addr, POOL,
                                          kvdmabuf.MEM_DRM, tag="kv_pool",
                                          empty=True, drm_fd=self.pool.drm)
        ms.declare_and_register(self.store, self.region, self.pool.addr,
                                POOL, "kv_pool")

    def stats(self):
        return {"mrs": ms.preload_report(), "reg_calls": ms.preload_reg_calls(),
                "mode": self.region.info().mode,
                "mapped": sorted(self.pool.handles)}

    def op_change(self, c):
        """kvcached frees pages (given back, then unmapped and released)
        and maps new ones (mapped, then brought in), a batch each."""
        R = self.kvdmabuf.RANGE_RELEASE
        out = {"freed_kib": 0}
        if c["free"]:
            shmem = ms.vm_kib("Shmem", "/proc/meminfo")
            self.region.ranges([(i * PAGE, PAGE, R) for i in c["free"]])
            for i in c["free"]:
                self.pool.unmap_page(i)
            want = len(c["free"]) * (PAGE >> 10)
            freed = shmem - ms.vm_kib("Shmem", "/proc/meminfo")
            until = time.monotonic() + ktap.scaled(2)
            while freed < want * 9 // 10 and time.monotonic() < until:
                time.sleep(0.05)
                freed = max(freed, shmem - ms.vm_kib("Shmem",
                                                     "/proc/meminfo"))
            out["freed_kib"] = freed
        if c["map"]:
            fds = [(i, self.pool.map_page(i)) for i in c["map"]]
            try:
                self.region.ranges([(i * PAGE, PAGE, fd) for i, fd in fds])
            finally:
                for _, fd in fds:
                    os.close(fd)
        out.update(self.stats())
        return out

    def op_fill(self, c):
        for i, off in c["at"]:
            self.pool.write(off, ms.pattern(c["round"], "A", i))
        return {}

    def op_put(self, c):
        return {"rc": [self.store.put_from(k, self.pool.addr + off, BS)
                       for k, off in zip(c["keys"], c["offs"])]}

    def op_get(self, c):
        rcs, shas = [], []
        for k, off in zip(c["keys"], c["offs"]):
            self.pool.write(off, bytes(BS))         # nothing left over
            rcs.append(self.store.get_into(k, self.pool.addr + off, BS))
            shas.append(ms.sha(self.pool.read(off, BS)))
        return {"rc": rcs, "sha": shas}

    def op_stats(self, c):
        return self.stats()

    def op_close(self, c):
        self.store.unregister_buffer(self.pool.addr)
        self.ctx.close()
        self.store.close()
        return {}


def elastic_scenario(port_base):
    """Master, B, A; the rounds of ROUNDS. Returns (tally, A's stats before
    the rounds, A's stats per round)."""
    t = ms.Tally()
    rounds = []
    with ms.StoreRun(port_base, "kvd-mc-el-") as run:
        a = run.engine_a(os.path.abspath(__file__),
                         {"LD_PRELOAD": ms.PRELOAD}, mode="elastic")
        b = run.b
        first = a.call("stats")
        for r, (free, new) in enumerate(ROUNDS, 1):
            st = a.call("change", free=list(free), map=list(new))
            rounds.append(st)
            live = st["mapped"]
            gone = [i for i in range(PAGES) if i not in live]
            at = [(n, p * PAGE + e) for n, (p, e) in enumerate(
                (p, e) for p in live for e in EDGES)]
            keys = ["el-r%d-a%d" % (r, n) for n, _ in at]
            # A's KV, put from its live pages: B gets it right
            a.call("fill", round=r, at=at)
            t.errors += sum(rc != 0 for rc in a.call(
                "put", keys=keys, offs=[o for _, o in at])["rc"])
            got = b.call("get", keys=keys, blocks=[0] * len(keys))
            for n, rc, h in zip(range(len(keys)), got["rc"], got["sha"]):
                t.add("a_to_b", rc == BS and h == ms.sha(ms.pattern(r, "A",
                                                                    n)))
            # B's KV, got into A's live pages: A reads B's bytes
            b.call("fill", cycle=r)
            bkeys = ["el-r%d-b%d" % (r, j) for j in range(ms.BLOCKS)]
            t.errors += sum(rc != 0 for rc in b.call(
                "put", keys=bkeys, blocks=list(range(ms.BLOCKS)))["rc"])
            offs = [o for _, o in at][:ms.BLOCKS]
            got = a.call("get", keys=bkeys[:len(offs)], offs=offs)
            for j, (rc, h) in enumerate(zip(got["rc"], got["sha"])):
                t.add("b_to_a", rc == BS and h == ms.sha(ms.pattern(r, "B",
                                                                    j)))
            # a page A freed: a put from it moves zeros, nothing else
            gkeys = ["el-r%d-g%d" % (r, p) for p in gone]
            if gone:
                t.errors += sum(rc != 0 for rc in a.call(
                    "put", keys=gkeys,
                    offs=[p * PAGE for p in gone])["rc"])
                got = b.call("get", keys=gkeys, blocks=[0] * len(gkeys))
                for rc, h in zip(got["rc"], got["sha"]):
                    t.add("gone_zeros", rc == BS and h == ms.sha(bytes(BS)))
        rounds.append(a.call("stats"))
    return t, first, rounds


def elastic_pool_under_the_preload_one_registration_right_blocks():
    """The kvcached-shaped engine's pool under the preload and the real
    store: right blocks in live pages, zeros from freed ones, freed pages'
    memory back at once, one MR with the same keys throughout."""
    ms.need_follow_lane()
    import kvdmabuf
    t0 = time.monotonic()
    with ms.Network():
        t, first, rounds = elastic_scenario(18600)
    print("# elastic pool: %d pages of %d KiB, %d rounds, %.1f s" %
          (PAGES, PAGE >> 10, len(ROUNDS), time.monotonic() - t0))
    for key, name in (("a_to_b", "B gets what A put from a live page"),
                      ("b_to_a", "A gets B's KV into a live page"),
                      ("gone_zeros", "a put from a freed page moves zeros")):
        ok, total = t.rows.get(key, (0, 0))
        print("#   %-42s %4d/%d" % (name, ok, total))
        check(total and ok == total, "%s: %d of %d right" % (key, ok, total))
    print("#   Mooncake's MR (the preload's record): %s" % first["mrs"])
    check(t.errors == 0, "%d transfer errors" % t.errors)
    mr0 = first["mrs"]
    check(len(mr0.splitlines()) == 1 and " on-proxy" in mr0 and
          "%#x" % POOL in mr0, "Mooncake's MR of the pool not on the proxy: "
          "%r" % mr0)
    check(first["mode"] == kvdmabuf.MODE_FOLLOW, "mode %s" % first["mode"])
    for r, st in enumerate(rounds, 1):
        check(st["mrs"] == mr0, "round %d: Mooncake's MR (keys) changed: %r"
              % (r, st["mrs"]))
        check(st["reg_calls"] == first["reg_calls"], "round %d: %d "
              "registrations after the first %d" % (r, st["reg_calls"],
                                                    first["reg_calls"]))
    for r, ((free, _), st) in enumerate(zip(ROUNDS, rounds), 1):
        want = len(free) * (PAGE >> 10)
        if free:
            print("#   round %d: Shmem down by %d KiB when %d page(s) "
                  "freed (%d KiB)" % (r, st["freed_kib"], len(free), want))
        check(st["freed_kib"] >= want * 3 // 4, "round %d: freed pages "
              "held: %d KiB of %d" % (r, st["freed_kib"], want))


if __name__ == "__main__":
    if sys.argv[1:2] == ["--engine"]:
        sys.exit(ms.engine_main(sys.argv[2], ElasticEngine))
    sys.exit(ktap.main([
        elastic_pool_under_the_preload_one_registration_right_blocks,
    ]))
