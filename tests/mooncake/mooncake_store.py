#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""mooncake_store - the seed's failure and its fix with the real Mooncake
store (the pinned wheel of tests/vm/mooncake-requirements.txt, installed by
tests/vm/deps.sh in a virtual environment of the root the guest runs).

In the VM: ``mooncake_master`` (its built-in HTTP metadata server, no etcd)
and two engine processes on ``MooncakeDistributedStore`` over RDMA on
soft-RoCE: engine B on rxe1 (it never sleeps, and its global segment holds
every object), engine A on rxe0 (no segment of its own: each of its puts
and gets is an RDMA transfer between its KV memory and B's segment). A's KV
is host memory that A releases and maps again at the same address, as
vLLM's allocator does with GPU memory (lib/python/examples/hostvmm.py),
and is registered with the store (``register_buffer``); A and B move KV
blocks with the zero-copy calls (``put_from``, ``get_into``).

Each test runs the same cycles (A puts, sleeps, B puts while A sleeps, A
wakes, gets B's blocks, puts new ones, B and A get them back):

* baseline (Mooncake alone, registration kept across the sleep and wake):
  the test asserts the seed's failure: every block moved after the wake is
  wrong, with no transfer error, and A's released KV stays pinned while it
  sleeps (VmPin in /proc/self/status);
* kvdmabuf (``kvdmabuf.mooncake.MooncakeSleepHooks``): the sleep drains the
  store transfers in flight and unregisters the buffer, the wake's
  key-change callback registers it again (REREGISTER mode): every block is
  right, no transfer touches the memory while A sleeps, and nothing is
  pinned while it sleeps;
* FOLLOW under the preload (soft-RoCE with dma-buf MRs, tests/rxe): the
  same Mooncake, unmodified, in a process started with
  LD_PRELOAD=libkvdmabuf-preload.so; A's KV is a vgem buffer mapped at a
  fixed address (the stand-in for GPU memory), behind a kvdmabuf proxy
  declared to the preload, so Mooncake's own register_buffer is made on
  the proxy. A sleeps (the vgem buffer is freed) and wakes with a new one
  at the same address, and Mooncake is never asked to register again:
  every block is right, the MR Mooncake holds (its keys) is unchanged, and
  nothing of A's KV is held while it sleeps.
"""
import ctypes
import glob
import hashlib
import json
import os
import select
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))  # ktap
import ktap
from ktap import Skip, check

TOP = ktap.use_build_tree()
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(TOP, "lib", "python", "examples"))
from hostvmm import HostVMM, RW, _libc  # noqa: E402
PRELOAD = os.path.join(TOP, "lib", "libkvdmabuf-preload.so")
VENV = os.environ.get("KVDMABUF_MOONCAKE_VENV",
                      os.path.join(os.environ.get("KVDMABUF_CACHE",
                                                  "/var/cache/kvdmabuf"),
                                   "mooncake-venv"))
IBDEV_A = os.environ.get("KVDMABUF_IBDEV_A", "rxe0")
IBDEV_B = os.environ.get("KVDMABUF_IBDEV_B", "rxe1")
# Addresses the engines' RPC servers bind to (Mooncake looks for an
# interface with an IPv4 address): on the netdevs under rxe0 and rxe1.
IP_A, IP_B = "10.210.0.1", "10.210.0.2"
BLOCKS = 8
BS = 256 << 10                 # one KV block
KV = BLOCKS * BS
SEGMENT = 32 << 20             # B's global segment: the store's memory
CYCLES = int(os.environ.get("KVDMABUF_MOONCAKE_CYCLES", "2"))
REPLY_TIMEOUT = ktap.scaled(300)
# 0: the lane leaves out the scenarios that test Mooncake and the library
# in user space, which do not change with the kernel: they run once per
# make check, on 6.12; FOLLOW, which drives the module and soft-RoCE's
# dma-buf MRs, runs on every lane that has them (tests/vm/check.sh).
SCENARIOS = os.environ.get("KVDMABUF_MOONCAKE_SCENARIOS", "1") != "0"


def pattern(cycle, who, block):
    """KV block @block of engine @who at @cycle: different for each."""
    seed = hashlib.sha256(b"%d/%s/%d" % (cycle, who.encode(), block)).digest()
    return seed * (BS // len(seed))


def sha(b):
    return hashlib.sha256(b).hexdigest()


def vm_kib(field, path="/proc/self/status"):
    with open(path) as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return -1


# ---- A's KV as a DRM engine holds it: vgem (the stand-in for GPU memory) ----

def _ioc(direction, nr, size):
    return (direction << 30) | (size << 16) | (ord("d") << 8) | nr


DRM_IOCTL_VERSION = _ioc(3, 0x00, 64)
DRM_IOCTL_GEM_CLOSE = _ioc(1, 0x09, 8)
DRM_IOCTL_MODE_CREATE_DUMB = _ioc(3, 0xB2, 32)
DRM_IOCTL_MODE_MAP_DUMB = _ioc(3, 0xB3, 16)


def drm_ioctl(fd, req, fmt, *vals):
    import fcntl
    import struct
    buf = bytearray(struct.pack(fmt, *vals))
    fcntl.ioctl(fd, req, buf, True)
    return struct.unpack(fmt, buf)


def vgem_open():
    """The DRM node whose driver is vgem (DRM_IOCTL_VERSION), or None."""
    for card in sorted(glob.glob("/dev/dri/card*")):
        fd = os.open(card, os.O_RDWR | os.O_CLOEXEC)
        name = ctypes.create_string_buffer(32)
        try:
            v = drm_ioctl(fd, DRM_IOCTL_VERSION, "=3i4xQQQQQQ", 0, 0, 0,
                          len(name), ctypes.addressof(name), 0, 0, 0, 0)
            if name.value[:v[3]] == b"vgem":
                return fd
        except OSError:
            pass
        os.close(fd)
    return None


class VgemVMM(HostVMM):
    """A vgem buffer mmapped at a fixed address: ``release()`` frees it
    (its mapping replaced by a reservation, its GEM handle closed: vgem's
    pages go back), ``remap()`` maps a new, zeroed one at the same
    address, as vLLM's allocator does with CUDA VMM memory."""

    def __init__(self, length):
        self.length, self.handle = length, None
        self.drm = vgem_open()
        if self.drm is None:
            raise Skip("no vgem device")
        self.addr = self._map(None, 0, 0x4000)      # reserved (NORESERVE)
        self.remap()

    def remap(self):
        _, _, _, _, self.handle, _, _ = drm_ioctl(
            self.drm, DRM_IOCTL_MODE_CREATE_DUMB, "=6IQ", self.length // 1024,
            1024, 8, 0, 0, 0, 0)
        off = drm_ioctl(self.drm, DRM_IOCTL_MODE_MAP_DUMB, "=IIQ",
                        self.handle, 0, 0)[2]
        p = _libc.mmap(self.addr, self.length, RW, 0x01 | 0x10, self.drm,
                       off)                         # MAP_SHARED | MAP_FIXED
        if p != self.addr:
            raise OSError(ctypes.get_errno(), "mmap of the vgem buffer")

    def release(self):
        super().release()
        drm_ioctl(self.drm, DRM_IOCTL_GEM_CLOSE, "=II", self.handle, 0)
        self.handle = None

    def close(self):
        super().close()
        if self.handle is not None:
            drm_ioctl(self.drm, DRM_IOCTL_GEM_CLOSE, "=II", self.handle, 0)
        os.close(self.drm)


# ---- an engine: one MooncakeDistributedStore client, by command ----

def store_setup(a):
    """An engine's MooncakeDistributedStore client over RDMA, set up as
    the scenario's arguments @a say."""
    from mooncake.store import MooncakeDistributedStore
    store = MooncakeDistributedStore()
    rc = store.setup(a["host"], a["metadata"], a["segment"], 1 << 20,
                     "rdma", a["dev"], a["master"])
    if rc != 0:
        raise RuntimeError("store setup failed: %d" % rc)
    return store


class Engine:
    """Runs in its own process under the venv's python3 (mooncake.store)."""

    def __init__(self, a):
        self.who, self.mode = a["who"], a["mode"]
        self.store = store_setup(a)
        self.pin_base = vm_kib("VmPin")
        self.hooks = self.region = self.ctx = None
        self.bg = None
        if self.mode == "follow":
            self._follow_setup(a)
            return
        self.mem = HostVMM(KV)
        self.mem.write(0, bytes(KV))            # fault every page in
        if self.mode == "kvdmabuf":
            from kvdmabuf.mooncake import MooncakeSleepHooks
            self.hooks = MooncakeSleepHooks(self.store, a["config"])
            self.region = self.hooks.register(self.mem.addr, KV, "kv_cache")
        else:
            rc = self.store.register_buffer(self.mem.addr, KV)
            if rc != 0:
                raise RuntimeError("register_buffer failed: %d" % rc)

    def _follow_setup(self, a):
        """A's KV in vgem behind a proxy, declared to the preload; then
        Mooncake's own register_buffer, which the preload makes on the
        proxy. The engine knows nothing of kvdmabuf but this process's
        sleep hook (self.ctx)."""
        import kvdmabuf
        if not kvdmabuf.preload_loaded():
            raise RuntimeError("not running under the preload")
        self.mem = VgemVMM(KV)
        self.mem.write(0, bytes(KV))
        self.ctx = kvdmabuf.Context(a["config"])
        self.region = self.ctx.add_region(
            self.mem.addr, KV, kvdmabuf.MEM_DRM, tag="kv_cache",
            drm_fd=self.mem.drm, drm_handle=self.mem.handle)
        declare_and_register(self.store, self.region, self.mem.addr, KV,
                             "kv_cache")

    def stats(self):
        out = {"pin_kib": vm_kib("VmPin") - self.pin_base,
               "resident_kib": self.mem.resident_pages() * 4,
               "registrations": self.hooks.registrations
               if self.hooks else 0}
        if self.ctx:
            import kvdmabuf
            out.update(preload=kvdmabuf.preload_state(),
                       mrs=preload_report(),
                       reg_calls=preload_reg_calls(),
                       mode=self.region.info().mode,
                       shmem_kib=vm_kib("Shmem", "/proc/meminfo"))
        return out

    def _xfer(self, fn):
        """One store transfer of KV memory: rc, or None when refused."""
        if not self.hooks:
            return fn()
        import kvdmabuf
        try:
            with self.hooks.io(self.region):
                return fn()
        except kvdmabuf.Error:
            return None

    def op_fill(self, c):
        for i in range(BLOCKS):
            self.mem.write(i * BS, pattern(c["cycle"], self.who, i))
        return {}

    def op_put(self, c):
        rcs = []
        for k, i in zip(c["keys"], c["blocks"]):
            rcs.append(self._xfer(lambda: self.store.put_from(
                k, self.mem.addr + i * BS, BS)))
        return {"rc": rcs}

    def op_get(self, c):
        rcs, shas = [], []
        for k, i in zip(c["keys"], c["blocks"]):
            if not c.get("asleep"):
                self.mem.write(i * BS, bytes(BS))   # nothing left over
            rcs.append(self._xfer(lambda: self.store.get_into(
                k, self.mem.addr + i * BS, BS)))
            shas.append(None if c.get("asleep") else
                        sha(self.mem.read(i * BS, BS)))
        return {"rc": rcs, "sha": shas}

    def op_put_inflight(self, c):
        """A batch of puts in another thread, started before the reply (a
        connector's batch, one io() around it): a sleep now must wait."""
        started = threading.Event()
        res = {}

        def batch():
            def run():
                started.set()
                res["rc"] = [self.store.put_from(k, self.mem.addr + i * BS,
                                                 BS)
                             for k, i in zip(c["keys"], c["blocks"])]
                res["end"] = time.monotonic()
            if self.hooks:
                with self.hooks.io(self.region):
                    run()
            else:
                run()
        self.bg = (threading.Thread(target=batch), res)
        self.bg[0].start()
        started.wait()
        return {}

    def op_sleep(self, c):
        shmem = vm_kib("Shmem", "/proc/meminfo")
        if self.hooks:
            self.hooks.release(["kv_cache"])
        if self.ctx:
            self.ctx.sleep("kv_cache")
        released = time.monotonic()
        self.mem.release()
        out = self.stats()
        # system-wide: other processes' tmpfs logs grow it meanwhile, so
        # the best of a few reads (a held KV never shows up as freed)
        freed = shmem - vm_kib("Shmem", "/proc/meminfo")
        until = time.monotonic() + ktap.scaled(2)
        while freed < (KV >> 10) * 9 // 10 and time.monotonic() < until:
            time.sleep(0.05)
            freed = max(freed, shmem - vm_kib("Shmem", "/proc/meminfo"))
        out["shmem_freed_kib"] = freed
        if self.bg:
            self.bg[0].join()
            res = self.bg[1]
            self.bg = None
            out.update(bg_rc=res["rc"], waited=released >= res["end"])
        return out

    def op_wake(self, c):
        self.mem.remap()
        if self.hooks:
            self.hooks.restore(["kv_cache"])
        if self.ctx:
            self.region.set_drm_handle(self.mem.drm, self.mem.handle)
            self.ctx.wake("kv_cache")
        return self.stats()

    def op_stats(self, c):
        return self.stats()

    def op_close(self, c):
        if self.hooks:
            self.hooks.close()
        else:
            self.store.unregister_buffer(self.mem.addr)
        if self.ctx:
            self.ctx.close()
        self.store.close()
        return {}


# The preload's entry points that make a registration (lib/kvdmabuf_preload.h
# kvdmabuf_preload_calls(), every symbol version it interposes).
PRELOAD_REG_ENTRIES = ("ibv_reg_mr@IBVERBS_1.0", "ibv_reg_mr@IBVERBS_1.1",
                       "ibv_reg_mr_iova@IBVERBS_1.7",
                       "ibv_reg_mr_iova2@IBVERBS_1.8",
                       "ibv_reg_dmabuf_mr@IBVERBS_1.12")


def preload_reg_calls():
    """How many registrations this process's code asked the preload for."""
    fn = ctypes.CDLL(None).kvdmabuf_preload_calls
    fn.restype, fn.argtypes = ctypes.c_longlong, [ctypes.c_char_p]
    n = {e: fn(e.encode()) for e in PRELOAD_REG_ENTRIES}
    bad = [e for e, v in n.items() if v < 0]
    if bad:
        raise RuntimeError("not interposed: %s" % bad)
    return sum(n.values())


def preload_report():
    """The preload's lines for the engine's registrations in KV regions
    (kvdmabuf_preload_report()): Mooncake's own MR, its lkey (= rkey on
    rxe) and whether it is on the proxy."""
    fn = ctypes.CDLL(None).kvdmabuf_preload_report
    fn.restype, fn.argtypes = ctypes.c_int, [ctypes.c_char_p, ctypes.c_size_t]
    buf = ctypes.create_string_buffer(4096)
    fn(buf, len(buf))
    return buf.value.decode(errors="replace").strip()


def engine_main(args, cls=None):
    """An engine process: @cls (Engine) driven by one JSON command a line
    on stdin, one JSON reply a line on the original stdout."""
    ktap_out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)                    # the store's own prints: to the log
    send = lambda o: (ktap_out.write(json.dumps(o) + "\n"), ktap_out.flush())
    try:
        e = (cls or Engine)(json.loads(args))
    except BaseException as ex:
        send({"error": "setup: %s: %s" % (type(ex).__name__, ex)})
        return 1
    send({"ready": True})
    for line in sys.stdin:
        c = json.loads(line)
        try:
            out = getattr(e, "op_" + c["op"])(c)
        except BaseException as ex:
            out = {"error": "%s: %r" % (c["op"], ex)}
        send(out)
        if c["op"] == "close":
            break
    return 0


# ---- the test's side: master, engines, scenario ----

def need_scenarios():
    if not SCENARIOS:
        raise Skip("KVDMABUF_MOONCAKE_SCENARIOS=0: this lane leaves out the "
                   "store's user-space scenarios (they run once, on 6.12)")


def python_of_venv():
    py = os.path.join(VENV, "bin", "python3")
    if not os.access(py, os.X_OK):
        raise Skip("no Mooncake virtual environment at %s for this root "
                   "(tests/vm/deps.sh installs it)" % VENV)
    return py


def master_binary():
    m = glob.glob(os.path.join(VENV, "lib", "python3*", "site-packages",
                               "mooncake", "mooncake_master"))
    check(len(m) == 1, "mooncake_master not found in %s" % VENV)
    return m[0]


def netdev_of(ibdev):
    d = glob.glob("/sys/class/infiniband/%s/ports/1/gid_attrs/ndevs/0" % ibdev)
    if not d:
        raise Skip("no verbs device %s" % ibdev)
    with open(d[0]) as f:
        return f.read().strip()


def ip(*args):
    return subprocess.run(["ip"] + list(args), capture_output=True,
                          text=True).returncode


def wait_port(port, proc, timeout=ktap.scaled(60)):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        check(proc.poll() is None, "mooncake_master exited: %s" % proc.returncode)
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise AssertionError("mooncake_master not listening on %d" % port)


def show_log(path, n=40):
    """The tail of a log, as TAP comments (glog's severity words muted:
    the lane's verdict reads the console for kernel reports). None: the
    log is another node's, which shows it there."""
    if path is None:
        return
    try:
        with open(path, errors="replace") as f:
            lines = f.read().splitlines()[-n:]
    except OSError:
        return
    print("# --- %s" % os.path.basename(path))
    for line in lines:
        print("# | " + line.replace("WARNING:", "warning:")[:300])


class Proc:
    """An engine process of this node, driven over its stdin and stdout."""

    def __init__(self, py, who, conf, log, env=None, expect_error=False,
                 script=None):
        self.who, self.log = who, log
        self.p = subprocess.Popen(
            [py, script or os.path.abspath(__file__), "--engine",
             json.dumps(conf)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=open(log, "w"), text=True,
            env=dict(engine_env(), **(env or {})))
        self.rx, self.tx = self.p.stdout, self.p.stdin
        self._ready(expect_error)

    def _ready(self, expect_error=False):
        r = self._reply()
        self.error = r.get("error")
        if self.error and not expect_error:
            show_log(self.log)
            raise AssertionError("engine %s: %s" % (self.who, r["error"]))

    def status(self):
        return self.p.poll()

    def _reply(self):
        r, _, _ = select.select([self.rx], [], [], REPLY_TIMEOUT)
        line = self.rx.readline() if r else ""
        if not line:
            show_log(self.log)
            raise AssertionError("engine %s: no reply (exit status %s)" %
                                 (self.who, self.status()))
        return json.loads(line)

    def call(self, op, **kw):
        kw["op"] = op
        self.tx.write(json.dumps(kw) + "\n")
        self.tx.flush()
        r = self._reply()
        if "error" in r:
            show_log(self.log)
            raise AssertionError("engine %s: %s" % (self.who, r["error"]))
        return r

    def stop(self):
        if self.status() is None:
            try:
                self.call("close")
            except AssertionError:
                pass
        self._end()

    def _end(self):
        try:
            self.p.wait(timeout=ktap.scaled(30))
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()


def engine_env():
    env = dict(os.environ)
    # rxe on a veth pair in one network namespace: only the IPv6
    # link-local GIDs (index 0) route out of the veth to the other end
    # (an IPv4 GID's route is local, over lo, where rxe does not listen).
    env["MC_GID_INDEX"] = "0"
    env["PYTHONPATH"] = os.path.join(TOP, "lib", "python")
    return env


class Network:
    """IPv4 addresses on the netdevs of rxe0 and rxe1 for the engines'
    RPC servers, removed again afterwards; lo up for the master."""

    def __enter__(self):
        self.added = []
        ip("link", "set", "lo", "up")
        for dev, addr in ((netdev_of(IBDEV_A), IP_A),
                          (netdev_of(IBDEV_B), IP_B)):
            if ip("addr", "add", addr + "/24", "dev", dev) == 0:
                self.added.append((dev, addr))
        return self

    def __exit__(self, *exc):
        for dev, addr in self.added:
            ip("addr", "del", addr + "/24", "dev", dev)


class Tally:
    def __init__(self):
        self.rows = {}
        self.errors = 0

    def add(self, row, ok, total=1):
        r = self.rows.setdefault(row, [0, 0])
        r[0] += ok
        r[1] += total


ROWS = [
    ("pre", "B gets KV that A put before its sleep"),
    ("b_while", "A gets KV that B put while A slept"),
    ("a_post_b", "B gets KV that A put after its wake"),
    ("a_post_a", "A gets its own post-wake KV back"),
    ("inflight", "A's puts in flight at sleep, B gets them"),
    ("refused", "A's transfers while asleep refused"),
]


def start_master(master, port_base, log):
    """mooncake_master with its HTTP metadata server on port_base, its RPC
    service on port_base + 1."""
    return subprocess.Popen([master, "--enable_http_metadata_server=true",
                             "--http_metadata_server_port=%d" % port_base,
                             "--rpc_port=%d" % (port_base + 1),
                             "--metrics_port=%d" % (port_base + 2)],
                            stdout=open(log, "w"), stderr=subprocess.STDOUT)


def stop_master(mp):
    """Ends mooncake_master (or another server of ours): TERM, then KILL."""
    mp.terminate()
    try:
        mp.wait(timeout=ktap.scaled(30))
    except subprocess.TimeoutExpired:
        mp.kill()
        mp.wait()


def a_config(d):
    """Engine A's kvdmabuf configuration, in folder @d: the store's
    transport on IBDEV_A, the module required."""
    conf = os.path.join(d, "kvdmabuf.yaml")
    with open(conf, "w") as f:
        f.write("protocol: rdma\nnics: [%s]\ntransport: mooncake\n"
                "module: require\n" % IBDEV_A)
    return conf


class StoreRun:
    """For a scenario of another engine A (mooncake_elastic.py,
    mooncake_vllm.py): mooncake_master and engine B (this file's Engine,
    host memory, holding the store's segment), a configuration for A that
    requires the module; A added with :meth:`engine_a`. Stops them all
    again (the master's log shown on a failure)."""

    def __init__(self, port_base, prefix, ip_b=IP_B, dev_b=IBDEV_B,
                 master_ip="127.0.0.1"):
        self.port_base, self.prefix = port_base, prefix
        self.ip_b, self.dev_b, self.master_ip = ip_b, dev_b, master_ip

    def __enter__(self):
        self.py = python_of_venv()
        master = master_binary()
        self.tmp = tempfile.mkdtemp(prefix=self.prefix)
        http, rpc = self.port_base, self.port_base + 1
        self.conf = a_config(self.tmp)
        self.mlog = os.path.join(self.tmp, "master.log")
        self.mp = start_master(master, self.port_base, self.mlog)
        self.engines = []
        try:
            wait_port(http, self.mp)
            wait_port(rpc, self.mp)
            self.common = {"metadata": "http://%s:%d/metadata" %
                           (self.master_ip, http),
                           "master": "%s:%d" % (self.master_ip, rpc),
                           "config": self.conf}
            self.b = Proc(self.py, "B", dict(
                self.common, who="B", mode="baseline",
                host="%s:%d" % (self.ip_b, self.port_base + 10),
                dev=self.dev_b,
                segment=SEGMENT), os.path.join(self.tmp, "engine-B.log"))
            self.engines.append(self.b)
        except BaseException:
            self.__exit__(*sys.exc_info())
            raise
        return self

    def engine_a(self, script, env, **conf):
        """Engine A: @script's engine on rxe0 under @env (no segment)."""
        a = Proc(self.py, "A", dict(
            self.common, who="A", host="%s:%d" % (IP_A, self.port_base + 20),
            dev=IBDEV_A, segment=0, **conf),
            os.path.join(self.tmp, "engine-A.log"), env=env, script=script)
        self.engines.append(a)
        return a

    def __exit__(self, *exc):
        for e in reversed(self.engines):
            e.stop()
        stop_master(self.mp)
        if exc[0] is not None:
            show_log(self.mlog, 10)
        shutil.rmtree(self.tmp, ignore_errors=True)


def scenario(mode, port_base):
    """Master + B + A, CYCLES sleep/wake cycles of A. Returns the tally
    and A's memory figures per cycle."""
    py = python_of_venv()
    # FOLLOW runs wherever soft-RoCE has dma-buf MRs, the debug kernel
    # included: it is the one real verbs importer of a proxy there
    if mode != "follow":
        need_scenarios()
    master = master_binary()
    tmp = tempfile.mkdtemp(prefix="kvd-mc-")
    http, rpc = port_base, port_base + 1
    conf = os.path.join(tmp, "kvdmabuf.yaml")
    follow = mode == "follow"
    with open(conf, "w") as f:
        f.write("protocol: rdma\nnics: [%s]\ntransport: mooncake\n"
                "drain_timeout_s: 60\n%s" % (IBDEV_A, "module: require\n"
                                             if follow else ""))
    mlog = os.path.join(tmp, "master.log")
    mp = start_master(master, port_base, mlog)
    engines = []
    t = Tally()
    mem = []
    try:
        wait_port(http, mp)
        wait_port(rpc, mp)
        common = {"metadata": "http://127.0.0.1:%d/metadata" % http,
                  "master": "127.0.0.1:%d" % rpc, "mode": mode,
                  "config": conf}
        b = Proc(py, "B", dict(common, who="B", mode="baseline",
                               host="%s:%d" % (IP_B, port_base + 10),
                               dev=IBDEV_B, segment=SEGMENT),
                 os.path.join(tmp, "engine-B.log"))
        engines.append(b)
        a_host = "%s:%d" % (IP_A, port_base + 20)
        a = Proc(py, "A", dict(common, who="A", host=a_host, dev=IBDEV_A,
                               segment=0),
                 os.path.join(tmp, "engine-A.log"),
                 env={"LD_PRELOAD": PRELOAD} if follow else None)
        engines.append(a)
        blocks = list(range(BLOCKS))

        def keys(tag, c):
            return ["%s-%s-c%d-%d" % (mode, tag, c, i) for i in blocks]

        def ok_puts(r):
            bad = [x for x in r["rc"] if x is None or x != 0]
            t.errors += len(bad)

        def judge(row, r, c, who):
            for i, (rc, h) in enumerate(zip(r["rc"], r["sha"])):
                if rc is None or rc < 0:
                    t.errors += 1
                t.add(row, rc == BS and h == sha(pattern(c, who, i)))

        for c in range(1, CYCLES + 1):
            awake = a.call("stats")
            a.call("fill", cycle=c)
            ok_puts(a.call("put", keys=keys("pre", c), blocks=blocks))
            judge("pre", b.call("get", keys=keys("pre", c), blocks=blocks),
                  c, "A")
            if not follow:
                a.call("put_inflight", keys=keys("fly", c), blocks=blocks)
            asleep = a.call("sleep")
            if not follow:
                t.errors += sum(1 for x in asleep["bg_rc"] if x != 0)
                t.add("drain_waited", asleep["waited"])
                # A tries to move KV while asleep: kvdmabuf refuses;
                # Mooncake alone writes into the pages A released, and
                # says nothing.
                r = a.call("get", keys=keys("pre", c), blocks=blocks,
                           asleep=True)
                for rc in r["rc"]:
                    t.add("refused", rc is None)
            b.call("fill", cycle=c)
            ok_puts(b.call("put", keys=keys("B", c), blocks=blocks))
            woke = a.call("wake")
            judge("b_while", a.call("get", keys=keys("B", c), blocks=blocks),
                  c, "B")
            if not follow:
                judge("inflight", b.call("get", keys=keys("fly", c),
                                         blocks=blocks), c, "A")
            a.call("fill", cycle=100 + c)
            ok_puts(a.call("put", keys=keys("post", c), blocks=blocks))
            judge("a_post_b", b.call("get", keys=keys("post", c),
                                     blocks=blocks), 100 + c, "A")
            judge("a_post_a", a.call("get", keys=keys("post", c),
                                     blocks=blocks), 100 + c, "A")
            # After the wake, once A wrote its KV: old pages still pinned
            # next to the new ones, or only the new ones.
            mem.append((awake, asleep, woke, a.call("stats")))
    finally:
        for e in reversed(engines):
            e.stop()
        stop_master(mp)
        if sys.exc_info()[0] is not None:
            show_log(mlog, 10)
    shutil.rmtree(tmp, ignore_errors=True)
    return t, mem


def report(mode, t, mem):
    print("# %s, Mooncake store over soft-RoCE, %d cycles of %d blocks of "
          "%d KiB:" % (mode, CYCLES, BLOCKS, BS >> 10))
    for key, name in ROWS:
        ok, total = t.rows.get(key, (0, 0))
        print("#   %-44s %4d/%d" % (name, ok, total))
    ok, total = t.rows.get("drain_waited", (0, 0))
    print("#   %-44s %4d/%d" % ("sleep waited for the puts in flight", ok,
                                 total))
    print("#   %-44s %4d" % ("transfer errors (puts and gets)", t.errors))
    print("#   A's KV (%d KiB), KiB pinned (VmPin) / resident:" % (KV >> 10))
    print("#   %-13s %-13s %-13s %-13s" % ("awake", "asleep", "just woken",
                                           "KV written"))
    for c, m in enumerate(mem, 1):
        print("#   %-13s %-13s %-13s %-13s cycle %d" % tuple(
            ["%d / %d" % (x["pin_kib"], x["resident_kib"]) for x in m] + [c]))
    sys.stdout.flush()


def seed_baseline_mooncake_alone_is_silently_wrong():
    t0 = time.monotonic()
    with Network():
        t, mem = scenario("baseline", 18100)
    print("# baseline: %.1f s" % (time.monotonic() - t0))
    report("baseline", t, mem)
    n = CYCLES * BLOCKS
    # Right only in the first cycle: from the second on, A's puts read the
    # pages of the first, which the registration still pins.
    check(t.rows["pre"] == [BLOCKS, n], "B gets KV that A put before its "
          "sleep: %s, expected %d right (the first cycle)" %
          (t.rows["pre"], BLOCKS))
    check(t.errors == 0, "%d transfer errors: the failure must be silent" %
          t.errors)
    for row in ("b_while", "a_post_b", "a_post_a"):
        check(t.rows[row][0] == 0, "baseline %s: %d/%d right, expected "
              "none (registration kept across the wake)" %
              (row, t.rows[row][0], n))
    check(t.rows["refused"][0] == 0, "Mooncake alone refused a transfer")
    for c, (aw, sl, wk, end) in enumerate(mem, 1):
        check(sl["pin_kib"] >= KV >> 10 and sl["resident_kib"] == 0,
              "cycle %d: released KV not held pinned while asleep: %s" %
              (c, sl))
        check(end["pin_kib"] >= KV >> 10 and end["resident_kib"] == KV >> 10,
              "cycle %d: after the wake, old pages not pinned next to the "
              "new ones: %s" % (c, end))


def seed_with_kvdmabuf_every_block_right():
    t0 = time.monotonic()
    with Network():
        t, mem = scenario("kvdmabuf", 18200)
    print("# kvdmabuf: %.1f s" % (time.monotonic() - t0))
    report("kvdmabuf", t, mem)
    n = CYCLES * BLOCKS
    for key, name in ROWS:
        check(t.rows[key] == [n, n], "kvdmabuf: %s: %d/%d" %
              (name, t.rows[key][0], t.rows[key][1]))
    check(t.errors == 0, "%d transfer errors" % t.errors)
    check(t.rows["drain_waited"] == [CYCLES, CYCLES],
          "a sleep did not wait for the puts in flight")
    for c, (aw, sl, wk, end) in enumerate(mem, 1):
        check(aw["pin_kib"] >= KV >> 10, "cycle %d: not pinned awake" % c)
        check(end == wk, "cycle %d: memory moved after the wake: %s, %s" %
              (c, wk, end))
        check(sl["pin_kib"] == 0 and sl["resident_kib"] == 0,
              "cycle %d: memory held while asleep: %s" % (c, sl))
        check(wk["resident_kib"] == KV >> 10 and
              wk["pin_kib"] == aw["pin_kib"],
              "cycle %d: after wake %s, awake before %s" % (c, wk, aw))
        check(wk["registrations"] == c, "cycle %d: %d register_buffer "
              "calls at wakes" % (c, wk["registrations"]))


def need_follow_lane():
    """Skip where soft-RoCE has no dma-buf MRs or Mooncake finds no RNIC;
    the venv and the preload must be there."""
    why = ktap.rxe_dmabuf_missing()
    if why:
        raise Skip(why)
    if not os.path.isdir("/sys/devices/system/node"):
        raise Skip("Mooncake's topology discovery finds no RNIC without "
                   "/sys/devices/system/node (CONFIG_NUMA not set)")
    python_of_venv()
    check(os.path.exists(PRELOAD), "%s not built" % PRELOAD)


def declare_and_register(store, region, addr, length, tag):
    """@region's proxy declared to the preload at [@addr, +@length), then
    the store's own register_buffer of that memory (made on the proxy)."""
    import kvdmabuf
    kvdmabuf.preload_declare(addr, length, tag, dmabuf=region.dmabuf())
    rc = store.register_buffer(addr, length)
    if rc != 0:
        raise RuntimeError("register_buffer failed: %d (preload: %s)" %
                           (rc, kvdmabuf.preload_state()))


def follow_under_the_preload_every_block_right_keys_unchanged():
    """Mooncake unmodified under libkvdmabuf-preload.so, A's KV in vgem
    behind a proxy (FOLLOW): right blocks after every wake with Mooncake's
    registration untouched (its MR and keys the same), A's KV freed
    while A sleeps."""
    need_follow_lane()
    import kvdmabuf
    t0 = time.monotonic()
    with Network():
        t, mem = scenario("follow", 18400)
    print("# follow: %.1f s" % (time.monotonic() - t0))
    report("follow (Mooncake under the preload)", t, mem)
    print("#   Mooncake's MR (the preload's record): %s" % mem[0][0]["mrs"])
    print("#   preload: %s" % mem[0][0]["preload"])
    n = CYCLES * BLOCKS
    for key in ("pre", "b_while", "a_post_b", "a_post_a"):
        check(t.rows[key] == [n, n], "follow: %s: %s" % (key, t.rows[key]))
    check(t.errors == 0, "%d transfer errors" % t.errors)
    mr0 = mem[0][0]["mrs"]
    check(len(mr0.splitlines()) == 1 and " on-proxy" in mr0 and
          "%#x" % KV in mr0, "Mooncake's MR of A's KV not on the proxy: "
          "%r" % mr0)
    check(all(x["mrs"] == mr0 for m in mem for x in m),
          "Mooncake's MR (keys) changed: %s" % [x["mrs"] for m in mem
                                                for x in m])
    for c, (aw, sl, wk, end) in enumerate(mem, 1):
        pre = aw["preload"]
        check(aw["mode"] == kvdmabuf.MODE_FOLLOW, "cycle %d: mode %s" %
              (c, aw["mode"]))
        check(pre["nr_on_proxy"] >= 1 and pre["nr_cannot_follow"] == 0,
              "cycle %d: Mooncake's MR not on the proxy: %s" % (c, pre))
        check(aw["reg_calls"] == sl["reg_calls"] == wk["reg_calls"] ==
              end["reg_calls"], "cycle %d: registrations at sleep or wake: "
              "%s" % (c, [x["reg_calls"] for x in (aw, sl, wk, end)]))
        print("#   cycle %d: Shmem down by %d KiB at sleep (KV %d KiB)" %
              (c, sl["shmem_freed_kib"], KV >> 10))
        check(sl["shmem_freed_kib"] >= (KV >> 10) * 3 // 4,
              "cycle %d: A's KV held while asleep: %d KiB freed of %d" %
              (c, sl["shmem_freed_kib"], KV >> 10))
        check(sl["pin_kib"] <= aw["pin_kib"], "cycle %d: pinned asleep: %s"
              % (c, sl))


class BenchCrashed(Exception):
    pass


def bench_once(bench, http, target, preload, log):
    """One transfer_engine_bench initiator run (rxe0, RDMA writes into the
    target's buffer); returns (throughput, unit, preload mapped in it)."""
    import re
    env = dict(engine_env())
    if preload:
        env["LD_PRELOAD"] = PRELOAD
    with open(log, "w") as f:
        p = subprocess.Popen(
            [bench, "--mode=initiator", "--protocol=rdma",
             "--metadata_server=http://127.0.0.1:%d/metadata" % http,
             "--local_server_name=%s:18530" % IP_A, "--device_name=" +
             IBDEV_A, "--segment_id=" + target, "--operation=write",
             "--duration=3", "--threads=2", "--batch_size=16",
             "--block_size=65536", "--buffer_size=%d" % (64 << 20),
             "--report_unit=MiB"], stdout=f, stderr=subprocess.STDOUT,
            env=env)
        mapped = False
        while p.poll() is None:
            try:
                with open("/proc/%d/maps" % p.pid) as m:
                    mapped |= "libkvdmabuf-preload.so" in m.read()
            except OSError:
                pass
            time.sleep(0.2)
    with open(log, errors="replace") as f:
        out = f.read()
    m = re.search(r"throughput ([0-9.]+) ?([A-Za-z]+/s)", out)
    if p.returncode < 0:
        show_log(log, 5)
        raise BenchCrashed("signal %d" % -p.returncode)
    if p.returncode != 0 or not m:
        show_log(log)
        raise AssertionError("transfer_engine_bench: exit status %d, no "
                             "throughput" % p.returncode)
    return float(m.group(1)), m.group(2), mapped


def transfer_engine_bench_alone_and_under_the_preload():
    """Mooncake's own transfer_engine_bench between two engines over
    soft-RoCE (target rxe1, initiator rxe0), once alone and once under
    libkvdmabuf-preload.so with no KV region declared: the preload only
    passes its registrations through, and the run must still complete
    with a throughput (both figures are printed)."""
    python_of_venv()
    need_scenarios()
    check(os.path.exists(PRELOAD), "%s not built" % PRELOAD)
    bench = os.path.join(os.path.dirname(master_binary()),
                         "transfer_engine_bench")
    tmp = tempfile.mkdtemp(prefix="kvd-mc-")
    target = "%s:18520" % IP_B
    figures = {}
    with Network():
        mp = start_master(master_binary(), 18500,
                          os.path.join(tmp, "master.log"))
        tp = None
        try:
            wait_port(18500, mp)
            tlog = os.path.join(tmp, "target.log")
            tp = subprocess.Popen(
                [bench, "--mode=target", "--protocol=rdma",
                 "--metadata_server=http://127.0.0.1:18500/metadata",
                 "--local_server_name=" + target, "--device_name=" +
                 IBDEV_B, "--buffer_size=%d" % (64 << 20)],
                stdout=open(tlog, "w"), stderr=subprocess.STDOUT,
                env=engine_env())
            time.sleep(ktap.scaled(3))
            check(tp.poll() is None, "bench target exited: %s" %
                  tp.returncode)
            crashes = {False: 0, True: 0}

            def run(preload):
                try:
                    figures[preload] = bench_once(
                        bench, 18500, target, preload, os.path.join(
                            tmp, "initiator-%d.log" % preload))
                    return True
                except BenchCrashed as e:
                    crashes[preload] += 1
                    print("# transfer_engine_bench crashed%s: %s" %
                          (" under the preload" if preload else "", e))
                    return False

            for preload in (False, True):
                # 0.3.13's bench crashes now and then right after its
                # buffer allocation (SIGSEGV, alone as well: 1 run in 4
                # on 6.12 and 7.3): up to 4 tries each; a bench that
                # never runs is a skip of Mooncake's, listed with this
                # reason, not a pass.
                for attempt in (1, 2, 3, 4):
                    if run(preload):
                        break
                if preload in figures:
                    continue
                # "Alone as well" is checked, not assumed: four crashes
                # under the preload are Mooncake's only if the plain
                # bench crashes too (at 1 in 4, eight clean plain runs
                # in a row happen by chance 1 time in 10).
                if preload and not crashes[False]:
                    for attempt in range(8):
                        if not run(False):
                            break
                    check(crashes[False] > 0,
                          "transfer_engine_bench crashed 4 times in a row "
                          "under the preload and in none of %d plain runs"
                          % (attempt + 2))
                raise Skip("Mooncake's transfer_engine_bench crashed "
                           "4 times in a row (a defect of its own, "
                           "alone as well)")
        finally:
            if tp is not None:
                stop_master(tp)
            stop_master(mp)
    for preload, (tput, unit, mapped) in sorted(figures.items()):
        print("# transfer_engine_bench, 64 KiB RDMA writes, 3 s, %s: "
              "%.2f %s" % ("under the preload" if preload else "alone",
                           tput, unit))
    check(not figures[False][2], "the preload was mapped in the plain run")
    check(figures[True][2], "the preload was not mapped in the bench")
    check(figures[False][0] > 0 and figures[True][0] > 0, str(figures))
    shutil.rmtree(tmp, ignore_errors=True)


def mooncake_nvlink_switches(pkg):
    """The environment variables of this Mooncake that turn NVLink /
    multi-node NVLink on (peers then import handles to our memory), read
    from its engine and store libraries."""
    import re
    names = set()
    for lib in ("engine.so", "store.so"):
        with open(os.path.join(pkg, lib), "rb") as f:
            names |= set(re.findall(rb"\b(MC_[A-Z0-9_]*(?:NVLINK|MNNVL)"
                                    rb"[A-Z0-9_]*)\b", f.read()))
    return sorted(n.decode() for n in names)


def mooncake_protocols(pkg):
    """The protocol names this Mooncake knows (mooncake_config.py)."""
    import ast
    with open(os.path.join(pkg, "mooncake_config.py")) as f:
        tree = ast.parse(f.read())
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(
                getattr(t, "id", "") == "_KNOWN_PROTOCOLS"
                for t in node.targets):
            return sorted(c.value for c in ast.walk(node.value)
                          if isinstance(c, ast.Constant) and
                          isinstance(c.value, str))
    raise AssertionError("no _KNOWN_PROTOCOLS in mooncake_config.py")


def gate_refuses_this_mooncakes_nvlink_transports():
    """The gate against the installed Mooncake: each of its NVLink
    switches (environment) set, the real engine starts on it and the
    kvdmabuf hooks refuse to open; each of its protocol names other than
    rdma and tcp refused as kvdmabuf's protocol."""
    py = python_of_venv()
    # It starts the real store (on the debug lane its setup times out).
    need_scenarios()
    pkg = os.path.dirname(master_binary())
    import kvdmabuf
    switches = mooncake_nvlink_switches(pkg)
    print("# Mooncake's NVLink switches: %s" % " ".join(switches))
    check("MC_FORCE_MNNVL" in switches, "MC_FORCE_MNNVL not found: %s" %
          switches)
    protocols = mooncake_protocols(pkg)
    print("# Mooncake's protocols: %s" % " ".join(protocols))
    check({"rdma", "tcp", "nvlink", "nvlink_intra"} <= set(protocols),
          str(protocols))
    tmp = tempfile.mkdtemp(prefix="kvd-mc-")
    conf = os.path.join(tmp, "kvdmabuf.yaml")
    for proto in protocols:
        with open(conf, "w") as f:
            f.write("protocol: %s\nnics: [%s]\ntransport: mooncake\n" %
                    (proto, IBDEV_A))
        ok, why = kvdmabuf.gate(conf)
        check(ok == (proto in ("rdma", "tcp")), "protocol %s: %s" %
              (proto, why))
    with open(conf, "w") as f:
        f.write("protocol: rdma\nnics: [%s]\ntransport: mooncake\n" %
                IBDEV_A)
    mlog = os.path.join(tmp, "master.log")
    with Network():
        mp = start_master(master_binary(), 18300, mlog)
        try:
            wait_port(18300, mp)
            wait_port(18301, mp)
            for n, var in enumerate(switches):
                e = Proc(py, "A", {"metadata": "http://127.0.0.1:18300/"
                                   "metadata", "master": "127.0.0.1:18301",
                                   "mode": "kvdmabuf", "config": conf,
                                   "who": "A", "host": "%s:%d" %
                                   (IP_A, 18320 + n), "dev": IBDEV_A,
                                   "segment": 0},
                         os.path.join(tmp, "engine-%s.log" % var),
                         env={var: "1"}, expect_error=True)
                e.p.wait(timeout=ktap.scaled(60))
                print("# %s=1: %s" % (var, e.error))
                check(e.error and "GateRefused" in e.error and
                      var in e.error and "store setup failed" not in
                      e.error, "%s=1: %s" % (var, e.error))
        finally:
            stop_master(mp)
    shutil.rmtree(tmp, ignore_errors=True)


def hooks_are_all_or_nothing_around_the_store():
    """kvdmabuf.mooncake on its own (any lane: no Mooncake needed): the
    store's calls in the right order, each failure leaving a known state."""
    if not os.path.exists("/sys/class/infiniband/" + IBDEV_A):
        raise Skip("no verbs device %s" % IBDEV_A)
    import errno
    import kvdmabuf
    from kvdmabuf.mooncake import MooncakeError, MooncakeSleepHooks
    sys.path.insert(0, os.path.join(TOP, "lib", "python", "examples"))
    from hostvmm import HostVMM
    conf = tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False)
    conf.write("protocol: rdma\nnics: [%s]\ntransport: mooncake\n" % IBDEV_A)
    conf.close()
    from fake_store import FakeStore    # tests/, on the path for ktap
    store = FakeStore()
    mem = HostVMM(BS)
    h = MooncakeSleepHooks(store, conf.name, drain_timeout_ms=200)
    r = h.register(mem.addr, BS)
    check(r.info().mode == kvdmabuf.MODE_REREGISTER, str(r.info()))
    check(store.registered == {mem.addr: BS}, str(store.calls))

    # a transfer in flight: the sleep times out, nothing was unregistered
    with h.io(r):
        try:
            h.release(["kv_cache"])
            raise AssertionError("release did not wait for the transfer")
        except kvdmabuf.DrainTimeout:
            pass
    check(not r.info().asleep and store.registered, str(store.calls))

    # unregister fails: awake and registered again, everywhere
    store.fail_unregister = True
    try:
        h.release(["kv_cache"])
        raise AssertionError("release did not fail")
    except MooncakeError as e:
        check(e.errno == errno.EIO and "unregister_buffer" in e.strerror,
              e.strerror)
    store.fail_unregister = False
    check(not r.info().asleep and store.registered == {mem.addr: BS},
          str(store.calls))
    with h.io(r):
        pass

    h.release(["kv_cache"])
    check(r.info().asleep and not store.registered, str(store.calls))
    try:
        with h.io(r):
            raise AssertionError("a transfer ran while asleep")
    except kvdmabuf.Error as e:
        check(e.errno == errno.ESHUTDOWN, str(e))
    mem.release()
    mem.remap()

    # register fails at the wake: released again, a retry starts clean
    store.fail_register = True
    try:
        h.restore(["kv_cache"])
        raise AssertionError("restore did not fail")
    except MooncakeError as e:
        check("register_buffer" in e.strerror, e.strerror)
    store.fail_register = False
    check(r.info().asleep and not store.registered, str(store.calls))
    check(vm_kib("VmPin") == 0, "pinned after a failed wake: %d kB" %
          vm_kib("VmPin"))
    h.restore(["kv_cache"])
    check(not r.info().asleep and store.registered == {mem.addr: BS},
          str(store.calls))
    check(h.registrations == 1, "%d registrations" % h.registrations)
    h.close()
    check(not store.registered, str(store.calls))
    mem.close()


if __name__ == "__main__":
    if sys.argv[1:2] == ["--engine"]:
        sys.exit(engine_main(sys.argv[2]))
    sys.exit(ktap.main([
        seed_baseline_mooncake_alone_is_silently_wrong,
        seed_with_kvdmabuf_every_block_right,
        follow_under_the_preload_every_block_right_keys_unchanged,
        transfer_engine_bench_alone_and_under_the_preload,
        gate_refuses_this_mooncakes_nvlink_transports,
        hooks_are_all_or_nothing_around_the_store,
    ]))
