# SPDX-License-Identifier: MIT
"""Verbs through ctypes, as an engine without pyverbs has them: a device
opened by name, a protection domain whose ``struct ibv_pd *`` is an int
for kvdmabuf (``ibv_get_device_list``, ``ibv_open_device``,
``ibv_alloc_pd``), and an RC queue pair on it for a peer to do RDMA on
(``ibv_create_cq``, ``ibv_create_qp``, ``ibv_modify_qp``). The structs
follow <infiniband/verbs.h>; tests/python/py_engine.py uses it in the VM."""
import ctypes

_v = ctypes.CDLL("libibverbs.so.1", use_errno=True)
P = ctypes.c_void_p
u8, u16, u32, u64 = ctypes.c_uint8, ctypes.c_uint16, ctypes.c_uint32, \
    ctypes.c_uint64


class _Cap(ctypes.Structure):
    _fields_ = [(n, u32) for n in ("max_send_wr", "max_recv_wr",
                                   "max_send_sge", "max_recv_sge",
                                   "max_inline_data")]


class _InitAttr(ctypes.Structure):
    _fields_ = [("qp_context", P), ("send_cq", P), ("recv_cq", P),
                ("srq", P), ("cap", _Cap), ("qp_type", ctypes.c_int),
                ("sq_sig_all", ctypes.c_int)]


class _Gid(ctypes.Union):
    _fields_ = [("raw", u8 * 16), ("words", u64 * 2)]


class _AhAttr(ctypes.Structure):
    _fields_ = [("dgid", _Gid), ("flow_label", u32), ("sgid_index", u8),
                ("hop_limit", u8), ("traffic_class", u8),   # ibv_global_route
                ("dlid", u16), ("sl", u8), ("src_path_bits", u8),
                ("static_rate", u8), ("is_global", u8), ("port_num", u8)]


class _QpAttr(ctypes.Structure):
    _fields_ = [(n, ctypes.c_int) for n in (
        "qp_state", "cur_qp_state", "path_mtu", "path_mig_state")] + \
        [(n, u32) for n in ("qkey", "rq_psn", "sq_psn", "dest_qp_num",
                            "qp_access_flags")] + \
        [("cap", _Cap), ("ah_attr", _AhAttr), ("alt_ah_attr", _AhAttr),
         ("pkey_index", u16), ("alt_pkey_index", u16)] + \
        [(n, u8) for n in ("en_sqd_async_notify", "sq_draining",
                           "max_rd_atomic", "max_dest_rd_atomic",
                           "min_rnr_timer", "port_num", "timeout",
                           "retry_cnt", "rnr_retry", "alt_port_num",
                           "alt_timeout")] + [("rate_limit", u32)]


class _QpHead(ctypes.Structure):       # the start of struct ibv_qp
    _fields_ = [(n, P) for n in ("context", "qp_context", "pd", "send_cq",
                                 "recv_cq", "srq")] + \
        [("handle", u32), ("qp_num", u32)]


for _name, _res, _args in (
        ("ibv_get_device_list", P, [ctypes.POINTER(ctypes.c_int)]),
        ("ibv_free_device_list", None, [P]),
        ("ibv_get_device_name", ctypes.c_char_p, [P]),
        ("ibv_open_device", P, [P]),
        ("ibv_close_device", ctypes.c_int, [P]),
        ("ibv_alloc_pd", P, [P]),
        ("ibv_dealloc_pd", ctypes.c_int, [P]),
        ("ibv_query_gid", ctypes.c_int, [P, u8, ctypes.c_int,
                                         ctypes.POINTER(_Gid)]),
        ("ibv_create_cq", P, [P, ctypes.c_int, P, P, ctypes.c_int]),
        ("ibv_destroy_cq", ctypes.c_int, [P]),
        ("ibv_create_qp", P, [P, ctypes.POINTER(_InitAttr)]),
        ("ibv_destroy_qp", ctypes.c_int, [P]),
        ("ibv_modify_qp", ctypes.c_int, [P, ctypes.POINTER(_QpAttr),
                                         ctypes.c_int])):
    getattr(_v, _name).restype = _res
    getattr(_v, _name).argtypes = _args

QPT_RC, MTU_1024 = 2, 3
INIT, RTR, RTS = 1, 2, 3
STATE, ACCESS, PKEY, PORT, AV, MTU, TIMEOUT, RETRY, RNR_RETRY, RQ_PSN, \
    RD_ATOMIC, MIN_RNR, SQ_PSN, DEST_RD_ATOMIC, DEST_QPN = (
        1, 8, 16, 32, 128, 256, 512, 1024, 2048, 4096, 8192, 32768, 65536,
        131072, 1 << 20)


def _ok(ptr, what):
    if not ptr:
        e = ctypes.get_errno()
        raise OSError(e, "%s failed" % what)
    return ptr


def _rc(rc, what):
    if rc:
        raise OSError(rc, "%s failed" % what)


class Device:
    """A verbs device opened by name, with one protection domain: ``pd`` is
    the ``struct ibv_pd *`` as an int."""

    def __init__(self, name):
        n = ctypes.c_int()
        lst = _ok(_v.ibv_get_device_list(ctypes.byref(n)),
                  "ibv_get_device_list")
        devs = ctypes.cast(lst, ctypes.POINTER(P))
        try:
            dev = next((devs[i] for i in range(n.value)
                        if _v.ibv_get_device_name(devs[i]) == name.encode()),
                       None)
            if dev is None:
                raise OSError(19, "no verbs device %s" % name)
            self.ctx = _ok(_v.ibv_open_device(dev), "ibv_open_device")
        finally:
            _v.ibv_free_device_list(lst)
        self.pd = _ok(_v.ibv_alloc_pd(self.ctx), "ibv_alloc_pd")

    def gid(self, port=1, index=0):
        g = _Gid()
        _rc(_v.ibv_query_gid(self.ctx, port, index, ctypes.byref(g)),
            "ibv_query_gid")
        return bytes(g.raw)

    def close(self):
        _rc(_v.ibv_dealloc_pd(self.pd), "ibv_dealloc_pd")
        _rc(_v.ibv_close_device(self.ctx), "ibv_close_device")


class RCQueuePair:
    """An RC QP (with its CQ) on ``dev``'s PD, taken to RTS against a peer
    by ``connect(qpn, gid)``; the peer does the RDMA."""

    def __init__(self, dev, access):
        self.dev, self.access = dev, access
        self.cq = _ok(_v.ibv_create_cq(dev.ctx, 16, None, None, 0),
                      "ibv_create_cq")
        a = _InitAttr(send_cq=self.cq, recv_cq=self.cq, qp_type=QPT_RC,
                      cap=_Cap(max_send_wr=8, max_recv_wr=8,
                               max_send_sge=1, max_recv_sge=1))
        self.qp = _ok(_v.ibv_create_qp(dev.pd, ctypes.byref(a)),
                      "ibv_create_qp")
        self.qp_num = ctypes.cast(self.qp,
                                  ctypes.POINTER(_QpHead))[0].qp_num
        self._modify("INIT", STATE | PKEY | PORT | ACCESS, qp_state=INIT,
                     port_num=1, qp_access_flags=access)

    def _modify(self, what, mask, **fields):
        a = _QpAttr(**fields)
        _rc(_v.ibv_modify_qp(self.qp, ctypes.byref(a), mask),
            "ibv_modify_qp to " + what)

    def connect(self, qpn, gid):
        ah = _AhAttr(is_global=1, port_num=1, sgid_index=0, hop_limit=1)
        ah.dgid.raw[:] = list(gid)
        self._modify("RTR", STATE | AV | MTU | DEST_QPN | RQ_PSN |
                     DEST_RD_ATOMIC | MIN_RNR, qp_state=RTR,
                     path_mtu=MTU_1024, dest_qp_num=qpn, rq_psn=0,
                     max_dest_rd_atomic=4, min_rnr_timer=12, ah_attr=ah)
        # Ack timeout of 1 s and 6 retries: kvd_ack_timeout() in
        # tests/timeout_scale.h says why.
        self._modify("RTS", STATE | TIMEOUT | RETRY | RNR_RETRY | SQ_PSN |
                     RD_ATOMIC, qp_state=RTS, timeout=18, retry_cnt=6,
                     rnr_retry=7, sq_psn=0, max_rd_atomic=4)

    def close(self):
        _rc(_v.ibv_destroy_qp(self.qp), "ibv_destroy_qp")
        _rc(_v.ibv_destroy_cq(self.cq), "ibv_destroy_cq")
