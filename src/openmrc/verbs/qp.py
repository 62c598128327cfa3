"""QPs and QP hints: `create_qp` (a QP in RESET over the transport's), `modify_qp` through RESET, INIT, RTR
and RTS with the attributes each transition takes (`openmrc.verbs.qp_attr`, derived from the transport's
state machine), `query_qp`, `post_send` / `post_recv` of work requests, `destroy_qp`; and the QP hints
a group of QPs shares."""

from __future__ import annotations

import errno
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from enum import IntFlag
from typing import Any, NamedTuple

from openmrc.transport import (
    Access,
    LocalProtocolError,
    MemoryRegion,
    QpCapFlags,
    QpSecurity,
    QpState,
    RecvWR,
    SecurityDomain,
    SendWR,
    Sge,
    WrOpcode,
)
from openmrc.transport import Qp as CoreQp
from openmrc.transport import QpInitAttr as CoreQpInitAttr
from openmrc.transport.qp import ATTR_RANGES, TRANSITIONS
from openmrc.verbs._errors import PostError, VerbsError, _err
from openmrc.verbs.cq import Cq
from openmrc.verbs.device import MAX_QP_HINTS, Context, ProtocolVersion
from openmrc.verbs.pd import _MR_ACCESS, ProtectionDomain
from openmrc.verbs.qp_attr import (
    _UNSUPPORTED_VATTR,
    ATTR_BITS,
    MAX_VENDOR_CFG_SIZE,
    OWN_FIELDS,
    RULES,
    MrcQpAttr,
    MrcQpAttrMask,
    QpAttr,
    QpAttrMask,
)

_V = QpAttrMask
_M = MrcQpAttrMask


class QpHintAttrMask(IntFlag):
    """mrc_qp_hint_attr_mask bits."""

    NONE = 0
    NUM_QPS_PER_PEER = 1 << 0
    NUM_SEND_PEERS = 1 << 1
    NUM_REMOTE_RECV_PEERS = 1 << 2
    VENDOR_CFG = 1 << 31


class SendOpsFlags(IntFlag):
    """ibv_qp_create_send_ops_flags: the operations a QP may post. MRC has the two Writes."""

    NONE = 0
    WITH_RDMA_WRITE = 1 << 0
    WITH_RDMA_WRITE_WITH_IMM = 1 << 1
    WITH_SEND = 1 << 2
    WITH_SEND_WITH_IMM = 1 << 3
    WITH_RDMA_READ = 1 << 4
    WITH_ATOMIC_CMP_AND_SWP = 1 << 5
    WITH_ATOMIC_FETCH_AND_ADD = 1 << 6


_MRC_SEND_OPS = SendOpsFlags.WITH_RDMA_WRITE | SendOpsFlags.WITH_RDMA_WRITE_WITH_IMM
_OP_FLAG = {
    WrOpcode.RDMA_WRITE: SendOpsFlags.WITH_RDMA_WRITE,
    WrOpcode.RDMA_WRITE_WITH_IMM: SendOpsFlags.WITH_RDMA_WRITE_WITH_IMM,
}


@dataclass(frozen=True, slots=True)
class QpCap:
    """ibv_qp_cap: work-request queue depths and scatter/gather limits."""

    max_send_wr: int = 128
    max_recv_wr: int = 128
    max_send_sge: int = 1
    max_recv_sge: int = 1
    max_inline_data: int = 0


@dataclass(slots=True)
class QpHintAttr:
    """mrc_qp_hint_attr: the traffic a group of QPs expects (the provider may size resources by it)."""

    num_qps_per_peer: int = 0
    num_send_peers: int = 0
    num_remote_recv_peers: int = 0
    vendor_cfg: bytes = b""


# -- QP hints ------------------------------------------------------------------------------------------------
class QpHint:
    """mrc_qp_hint: traffic expectations shared by the QPs that name it (in INIT or RTR)."""

    def __init__(self, ctx: Context, attr: QpHintAttr) -> None:
        self.ctx = ctx
        self.attr = attr
        self.users = 0
        self.alive = True

    def _check(self) -> None:
        if not self.alive:
            raise VerbsError(errno.EINVAL, "the QP hint has been destroyed")
        self.ctx._check()


_HINT_FIELDS = {
    QpHintAttrMask.NUM_QPS_PER_PEER: "num_qps_per_peer",
    QpHintAttrMask.NUM_SEND_PEERS: "num_send_peers",
    QpHintAttrMask.NUM_REMOTE_RECV_PEERS: "num_remote_recv_peers",
    QpHintAttrMask.VENDOR_CFG: "vendor_cfg",
}
_HINT_ALL = QpHintAttrMask(sum(_HINT_FIELDS))


def _check_hint_attr(attr: QpHintAttr, mask: int) -> None:
    if not isinstance(attr, QpHintAttr):
        raise VerbsError(errno.EINVAL, f"expected a QpHintAttr, got {type(attr).__name__}")
    if mask & ~int(_HINT_ALL):
        raise VerbsError(errno.EINVAL, f"qp_hint_attr_mask: unknown bits 0x{mask & ~int(_HINT_ALL):x}")
    for bit, name in _HINT_FIELDS.items():
        if not mask & bit:
            continue
        v = getattr(attr, name)
        if name == "vendor_cfg":
            if not isinstance(v, bytes | bytearray) or len(v) > MAX_VENDOR_CFG_SIZE:
                raise VerbsError(errno.EINVAL, f"vendor_cfg: at most {MAX_VENDOR_CFG_SIZE} bytes")
        elif isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= 0x7FFF_FFFF:
            raise VerbsError(errno.EINVAL, f"{name}: {v!r} is not a count")


def create_qp_hint(ctx: Context, attr: QpHintAttr | None = None) -> QpHint:
    """mrc_create_qp_hint (ENOMEM past the device's ``max_qp_hint``)."""
    ctx._check()
    attr = QpHintAttr() if attr is None else attr
    _check_hint_attr(attr, int(_HINT_ALL))
    if sum(len(c.hints) for c in ctx.device.contexts) >= MAX_QP_HINTS:
        raise VerbsError(errno.ENOMEM, f"{MAX_QP_HINTS} QP hints exist already (max_qp_hint)")
    hint = QpHint(ctx, replace(attr, vendor_cfg=bytes(attr.vendor_cfg)))
    ctx.hints.append(hint)
    return hint


def query_qp_hint(hint: QpHint, qp_hint_attr_mask: int) -> QpHintAttr:
    """mrc_query_qp_hint: the attributes ``qp_hint_attr_mask`` names (the others at their defaults)."""
    hint._check()
    _check_hint_attr(hint.attr, qp_hint_attr_mask)
    out = QpHintAttr()
    for bit, name in _HINT_FIELDS.items():
        if qp_hint_attr_mask & bit:
            setattr(out, name, getattr(hint.attr, name))
    return out


def modify_qp_hint(hint: QpHint, attr: QpHintAttr, qp_hint_attr_mask: int) -> None:
    """mrc_modify_qp_hint: set the attributes ``qp_hint_attr_mask`` names."""
    hint._check()
    _check_hint_attr(attr, qp_hint_attr_mask)
    for bit, name in _HINT_FIELDS.items():
        if qp_hint_attr_mask & bit:
            v = getattr(attr, name)
            setattr(hint.attr, name, bytes(v) if name == "vendor_cfg" else v)


def destroy_qp_hint(hint: QpHint) -> None:
    """mrc_destroy_qp_hint: EBUSY while QPs name it."""
    hint._check()
    if hint.users:
        raise VerbsError(errno.EBUSY, f"the QP hint is in use by {hint.users} QP(s)")
    hint.alive = False
    hint.ctx.hints.remove(hint)


# -- QPs -----------------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True, kw_only=True)
class QpInitAttr:
    """mrc_qp_init_attr."""

    send_cq: Cq
    recv_cq: Cq
    pd: ProtectionDomain
    cap: QpCap = field(default_factory=QpCap)
    sq_sig_all: bool = False
    send_ops_flags: SendOpsFlags = _MRC_SEND_OPS
    protocol_version: ProtocolVersion = ProtocolVersion.DEFAULT
    qp_context: Any = None


MAX_WR = 1 << 16


class Qp:
    """mrc_qp. ``core`` is the transport's QP underneath; ``qp_num`` its number."""

    def __init__(self, ctx: Context, core: CoreQp, init: QpInitAttr) -> None:
        self.ctx = ctx
        self.core = core
        self.init = init
        self.send_cq = init.send_cq
        self.recv_cq = init.recv_cq
        self.pd = init.pd
        self.vattr = QpAttr(path_mtu=None, qp_access_flags=Access.LOCAL_WRITE, pkey_index=0)
        self.mattr = MrcQpAttr(cap=QpCapFlags.NONE, vendor_cfg=b"")
        self.alive = True
        self.user_error = False  # moved to ERROR by the program (no async event for that)
        self.error_reported = False

    @property
    def qp_num(self) -> int:
        return self.core.qp_num

    @property
    def qp_context(self) -> Any:
        return self.init.qp_context

    @property
    def state(self) -> QpState:
        return self.core.state

    def __repr__(self) -> str:
        return f"Qp(0x{self.qp_num:06x}, {self.core.state.name})"

    def _check(self) -> None:
        if not self.alive:
            raise VerbsError(errno.EINVAL, "the QP has been destroyed")
        self.ctx._check()


def create_qp(ctx: Context, init_attr: QpInitAttr) -> Qp:
    """mrc_create_qp: a QP in RESET. ``send_ops_flags`` may name RDMA Write and Write with Immediate only;
    one SGE per work request each way, no inline data; ``protocol_version`` 0 (default) or V1."""
    ctx._check()
    if not isinstance(init_attr, QpInitAttr):
        raise VerbsError(errno.EINVAL, f"expected a verbs.QpInitAttr, got {type(init_attr).__name__}")
    for name in ("send_cq", "recv_cq"):
        cq = getattr(init_attr, name)
        if not isinstance(cq, Cq) or not cq.alive or cq.ctx is not ctx:
            raise VerbsError(errno.EINVAL, f"{name}: a live CQ of this context")
    pd = init_attr.pd
    if not isinstance(pd, ProtectionDomain) or not pd.alive or pd.device is not ctx.device:
        raise VerbsError(errno.EINVAL, "pd: a live PD of this context's device")
    ops = init_attr.send_ops_flags
    if not ops or ops & ~int(_MRC_SEND_OPS):
        raise VerbsError(
            errno.EOPNOTSUPP,
            f"send_ops_flags: 0x{int(ops):x}; an MRC QP posts WITH_RDMA_WRITE and "
            "WITH_RDMA_WRITE_WITH_IMM only",
        )
    if init_attr.protocol_version not in (ProtocolVersion.DEFAULT, ProtocolVersion.V1):
        raise VerbsError(
            errno.EPROTONOSUPPORT,
            f"protocol_version: {int(init_attr.protocol_version)}; this device speaks V1",
        )
    c = init_attr.cap
    for name, v, hi in (
        ("max_send_wr", c.max_send_wr, MAX_WR),
        ("max_recv_wr", c.max_recv_wr, MAX_WR),
        ("max_send_sge", c.max_send_sge, 1),
        ("max_recv_sge", c.max_recv_sge, 1),
        ("max_inline_data", c.max_inline_data, 0),
    ):
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= hi:
            raise VerbsError(errno.EINVAL, f"cap.{name}: {v!r} outside 0..{hi}")
    if c.max_send_wr < 1:
        raise VerbsError(errno.EINVAL, "cap.max_send_wr: at least 1")
    dev = ctx.dev
    core_init = CoreQpInitAttr(
        send_cq=init_attr.send_cq.core,
        recv_cq=init_attr.recv_cq.core,
        max_send_wr=c.max_send_wr,
        max_recv_wr=max(1, c.max_recv_wr),
        sq_sig_all=bool(init_attr.sq_sig_all),
    )
    with dev.lock:
        core = dev.create_qp(core_init)
        core.pd = pd
    qp = Qp(ctx, core, init_attr)
    ctx.qps.append(qp)
    pd.qps.append(qp)
    return qp


def get_security_domain(ctx: Context, sdi: int) -> SecurityDomain:
    """**[openmrc]** The security domain ``sdi`` the device's controller created (`openmrc.ctl`; or the
    node's, through the store the device uses, `UdpDevice.use_profile_store`), to bind a QP to in INIT
    (``MrcQpAttr(security=QpSecurity(domain))``). ENOENT if there is none."""
    ctx._check()
    if isinstance(sdi, bool) or not isinstance(sdi, int):
        raise VerbsError(errno.EINVAL, f"sdi: {sdi!r} is not a security domain identifier")
    nic = ctx.dev.nic
    dom = nic.domains.get(sdi)
    resolver = nic.profiles.resolver
    if dom is None and resolver is not None:  # a device that uses a node's store: the controller's domains
        with ctx.dev.lock:
            if resolver(2, sdi):
                dom = nic.domains.get(sdi)
    if dom is None:
        raise VerbsError(errno.ENOENT, f"no security domain {sdi!r} on this device")
    return dom


def get_qpn(qp: Qp) -> int:
    """mrc_get_qpn."""
    qp._check()
    return qp.qp_num


def destroy_qp(qp: Qp) -> None:
    """mrc_destroy_qp: its outstanding work requests complete with WR_FLUSH_ERR first (pollable on its
    CQs); EBUSY while its async events are unacknowledged."""
    qp._check()
    if any(ev.element is qp for ev in qp.ctx._unacked.values()):
        raise VerbsError(errno.EBUSY, "async event(s) of the QP not acknowledged (ack_async_event)")
    dev = qp.ctx.dev
    with dev.lock:
        if qp.core.state not in (QpState.RESET, QpState.ERROR):
            qp.core.modify(QpState.ERROR, now=dev.now())
        dev.destroy_qp(qp.core)
    hint = qp.mattr.qp_hint
    if hint is not None:
        hint.users -= 1
    qp.alive = False
    qp.ctx.qps.remove(qp)
    qp.pd.qps.remove(qp)


def _names(mask: int, kind: type[IntFlag]) -> str:
    return ", ".join(m.name or "?" for m in kind if m.value and mask & m.value)


def _both(verbs_bits: int, mrc_bits: int) -> str:
    """The bits of each mask, as "verbs AV, DEST_QPN; MRC MPR_DEST" ("" for none)."""
    kinds = (("verbs", verbs_bits, QpAttrMask), ("MRC", mrc_bits, MrcQpAttrMask))
    return "; ".join(f"{what} {_names(bits, kind)}" for what, bits, kind in kinds if bits)


def modify_qp(
    qp: Qp,
    attr: QpAttr | None = None,
    attr_mask: int = 0,
    mrc_attr: MrcQpAttr | None = None,
    mrc_attr_mask: int = 0,
) -> None:
    """mrc_modify_qp: the attributes the two masks name. With ``QpAttrMask.STATE`` the QP moves to
    ``attr.qp_state`` (RESET -> INIT -> RTR -> RTS, any -> ERROR, any -> RESET), and each transition takes
    the attributes mrc.h requires (INIT: EV_PROFILE_ID, CC_PROFILE_ID, HINT; RTR: MAX_WIMM_DEST, MPR_DEST and
    the verbs AV, DEST_QPN, RQ_PSN; RTS: MAX_WIMM, MPR, RETRY_CNT, TIMEOUT and SQ_PSN); without it, INIT
    and RTS QPs change attributes in place. The verbs attributes mrc.h does not support (PORT, TIMEOUT,
    RETRY_CNT, RNR, atomics, alternate path ...) are refused with EINVAL and what to use instead. Nothing
    changes when anything is refused."""
    qp._check()
    attr = attr if attr is not None else QpAttr()
    mrc_attr = mrc_attr if mrc_attr is not None else MrcQpAttr()
    for name, m in (("attr_mask", attr_mask), ("mrc_attr_mask", mrc_attr_mask)):
        if isinstance(m, bool) or not isinstance(m, int) or m < 0:
            raise VerbsError(errno.EINVAL, f"{name}: {m!r} is not a mask")
    bad = [f"{k.name}: {why}" for k, why in _UNSUPPORTED_VATTR.items() if attr_mask & k]
    if bad:
        raise VerbsError(errno.EINVAL, "unsupported verbs attribute(s): " + "; ".join(bad))
    unknown_v = attr_mask & ~sum(int(b) for b in QpAttrMask)
    unknown_m = mrc_attr_mask & ~sum(int(b) for b in MrcQpAttrMask)
    if unknown_v or unknown_m:
        raise VerbsError(errno.EINVAL, f"unknown mask bits: verbs 0x{unknown_v:x}, MRC 0x{unknown_m:x}")
    core = qp.core
    cur = core.state
    if attr_mask & _V.CUR_STATE and attr.cur_qp_state != cur:
        raise VerbsError(errno.EINVAL, f"cur_qp_state: {attr.cur_qp_state!r}, but the QP is in {cur.name}")
    new = cur
    if attr_mask & _V.STATE:
        if not isinstance(attr.qp_state, QpState):
            raise VerbsError(errno.EINVAL, f"qp_state: expected a QpState, got {attr.qp_state!r}")
        new = attr.qp_state
    vm = attr_mask & ~int(_V.STATE | _V.CUR_STATE)
    mm = mrc_attr_mask
    rule = RULES.get((cur, new))
    if rule is None:
        raise VerbsError(errno.EINVAL, f"illegal QP transition {cur.name} -> {new.name}")
    v_req, v_opt, m_req, m_opt = rule
    if cur == new and not (attr_mask & _V.STATE) and not vm and not mm:
        return
    missing = _both(v_req & ~vm, m_req & ~mm)
    if missing:
        raise VerbsError(errno.EINVAL, f"{cur.name} -> {new.name} needs {missing}")
    extra = _both(vm & ~(v_req | v_opt), mm & ~(m_req | m_opt))
    if extra:
        raise VerbsError(errno.EINVAL, f"not allowed on {cur.name} -> {new.name}: {extra}")
    required, optional = TRANSITIONS[cur, new]
    kw, vnew, mnew = _collect(qp, attr, vm, mrc_attr, mm, required | optional)
    dev = qp.ctx.dev
    peer = kw.get("peer")
    with dev.lock:
        try:
            if peer is not None:
                dev.add_peer(peer)
            if new is QpState.INIT and "ev_profile_id" in kw:  # binding a profile: can the device carry it?
                before = core.attr.ev_profile_id
                core.modify(new, now=dev.now(), **kw)
                try:
                    dev.prepare_qp(core)
                except BaseException:
                    if cur is QpState.RESET:
                        core.modify(QpState.RESET, now=dev.now())
                    else:  # INIT -> INIT: the profile it had
                        core.modify(QpState.INIT, now=dev.now(), ev_profile_id=before)
                    raise
            else:
                core.modify(new, now=dev.now(), **kw)
        except LocalProtocolError as exc:
            raise _err(exc) from None
    # committed: record what the program set
    old_hint = qp.mattr.qp_hint
    for k, v in vnew.items():
        setattr(qp.vattr, k, v)
    for k, v in mnew.items():
        setattr(qp.mattr, k, v)
    if new is QpState.RESET and cur is not QpState.RESET:
        qp.vattr = QpAttr(path_mtu=None, qp_access_flags=Access.LOCAL_WRITE, pkey_index=0)
        qp.mattr = MrcQpAttr(cap=QpCapFlags.NONE, vendor_cfg=b"")
        qp.user_error = False
        qp.error_reported = False
    if new is QpState.ERROR and cur is not QpState.ERROR:
        qp.user_error = True
    new_hint = qp.mattr.qp_hint
    if new_hint is not old_hint:
        if old_hint is not None:
            old_hint.users -= 1
        if new_hint is not None:
            new_hint.users += 1


# Bounds of the fields the transport does not bound (its own are in ATTR_RANGES): the profile ids are
# mrc.h's uint64_t (the transport checks that the profile exists), the others the transport never sees.
_OWN_RANGES = {
    "ev_profile_id": (0, (1 << 64) - 1),
    "cc_profile_id": (0, (1 << 64) - 1),
    "pkey_index": (0, 0),
    "path_mtu": (1, 5),
}
_MTU_ENUM = {256: 1, 512: 2, 1024: 3, 2048: 4, 4096: 5}
_CAP_FLAGS = int(
    QpCapFlags.TRIM_NACK_DEST_UNSUPPORTED | QpCapFlags.DYNAMIC_MPR | QpCapFlags.SVC_TIME_DEST_UNSUPPORTED
)


def _int_in(field: str, v: Any, bounds: tuple[int, int]) -> int:
    lo, hi = bounds
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise VerbsError(errno.EINVAL, f"{field}: {v!r} outside {lo}..{hi}")
    return v


def _checked(qp: Qp, name: str, shown: str, v: Any) -> Any:
    """The value ``v`` of transport attribute ``name`` (the verbs field ``shown``), as the core takes it."""
    if name == "peer":
        if v is None:
            raise VerbsError(
                errno.EINVAL, "ah_attr: the peer (for the UDP device, a Peer) is required with AV"
            )
        return v
    if name == "qp_hint":
        if v is not None and (not isinstance(v, QpHint) or not v.alive or v.ctx is not qp.ctx):
            raise VerbsError(errno.EINVAL, "qp_hint: None or a live QP hint of this context")
        return v
    if name == "cap":
        if v is None or isinstance(v, bool) or not isinstance(v, int) or v & ~_CAP_FLAGS:
            raise VerbsError(errno.EINVAL, f"cap: {v!r}; mrc_qp_cap flags only")
        return QpCapFlags(v)
    if name == "security":
        if not isinstance(v, QpSecurity):  # (None too: to the core it would mean "unchanged")
            raise VerbsError(errno.EINVAL, f"security: {v!r}; expected an openmrc.transport.QpSecurity")
        return v
    return _int_in(shown, v, ATTR_RANGES.get(name) or _OWN_RANGES[shown])


def _collect(
    qp: Qp, attr: QpAttr, vm: int, m: MrcQpAttr, mm: int, taken: frozenset[str]
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """Check the named attributes; returns the core's keyword arguments (those of ``taken``, the transport
    attributes of this transition: mrc.h's early MPR and WIMM at RTR are recorded only) and what to
    record."""
    kw: dict[str, Any] = {}
    vrec: dict[str, Any] = {}
    mrec: dict[str, Any] = {}
    for name, (bit, shown) in ATTR_BITS.items():
        verbs_bit = isinstance(bit, QpAttrMask)
        if not (vm if verbs_bit else mm) & bit:
            continue
        value = _checked(qp, name, shown, getattr(attr if verbs_bit else m, shown))
        (vrec if verbs_bit else mrec)[shown] = value
        if name in taken:
            kw[name] = value
    if vm & _V.PKEY_INDEX:
        vrec["pkey_index"] = _int_in("pkey_index", attr.pkey_index, _OWN_RANGES["pkey_index"])
    if vm & _V.PATH_MTU:
        mtu = _int_in("path_mtu", attr.path_mtu, _OWN_RANGES["path_mtu"])
        nic_mtu = _MTU_ENUM.get(qp.ctx.dev.nic.config.mtu, 5)
        if mtu > nic_mtu:
            raise VerbsError(
                errno.EINVAL, f"path_mtu: {mtu} is above the device's MTU ({qp.ctx.dev.nic.config.mtu} B)"
            )
        vrec["path_mtu"] = mtu
    if vm & _V.ACCESS_FLAGS:
        a = attr.qp_access_flags
        if a is None or isinstance(a, bool) or not isinstance(a, int) or a & ~int(_MR_ACCESS):
            raise VerbsError(
                errno.EINVAL, f"qp_access_flags: {a!r}; MRC QPs take LOCAL_WRITE and REMOTE_WRITE"
            )
        vrec["qp_access_flags"] = Access(a)
    if mm & _M.VENDOR_CFG:
        vc = m.vendor_cfg
        if not isinstance(vc, bytes | bytearray) or len(vc) > MAX_VENDOR_CFG_SIZE:
            raise VerbsError(errno.EINVAL, f"vendor_cfg: at most {MAX_VENDOR_CFG_SIZE} bytes")
        mrec["vendor_cfg"] = bytes(vc)
    return kw, vrec, mrec


class QpQuery(NamedTuple):
    """`query_qp`: the verbs attributes, the MRC attributes and the creation attributes."""

    attr: QpAttr
    mrc_attr: MrcQpAttr
    init_attr: QpInitAttr


def query_qp(qp: Qp, attr_mask: int = int(QpAttrMask.STATE), mrc_attr_mask: int = 0) -> QpQuery:
    """mrc_query_qp: the attributes the masks name (the others None), in any state."""
    qp._check()
    unsupported = [k.name for k in _UNSUPPORTED_VATTR if attr_mask & k]
    if unsupported:
        raise VerbsError(
            errno.EINVAL, f"unsupported verbs attribute(s): {', '.join(str(u) for u in unsupported)}"
        )
    v = QpAttr()
    if attr_mask & (_V.STATE | _V.CUR_STATE):
        v.qp_state = v.cur_qp_state = qp.core.state
    m = MrcQpAttr()
    for bit, name in (*ATTR_BITS.values(), *OWN_FIELDS):
        if isinstance(bit, QpAttrMask):
            if attr_mask & bit:
                setattr(v, name, getattr(qp.vattr, name))
        elif mrc_attr_mask & bit:
            setattr(m, name, getattr(qp.mattr, name))
    if attr_mask & _V.PATH_MTU and v.path_mtu is None:
        v.path_mtu = _MTU_ENUM.get(qp.ctx.dev.nic.config.mtu, 5)
    return QpQuery(v, m, qp.init)


# -- posting -------------------------------------------------------------------------------------------------
def post_send(qp: Qp, wr: SendWR | Iterable[SendWR]) -> None:
    """mrc_post_send of one work request or a list of them, in order. The first one refused raises
    `PostError` naming it (``bad_wr``, ``index``) with the reason: an opcode the QP was not created for,
    more SGEs than ``cap.max_send_sge``, an SGE outside its memory region, a full send queue (ENOMEM), a
    QP not in RTS ... The ones before it are posted."""
    qp._check()
    wrs = [wr] if isinstance(wr, SendWR) else list(wr)
    ops = qp.init.send_ops_flags
    max_sge = qp.init.cap.max_send_sge
    dev = qp.ctx.dev
    for i, w in enumerate(wrs):
        if not isinstance(w, SendWR):
            raise PostError(
                errno.EINVAL, f"work request {i}: expected a SendWR, got {type(w).__name__}", w, i
            )
        flag = _OP_FLAG.get(w.opcode)
        if flag is None or not ops & flag:
            raise PostError(
                errno.EINVAL, f"work request {i}: opcode {w.opcode!r} not in the QP's send_ops_flags", w, i
            )
        if len(w.sg_list) > max_sge:
            raise PostError(
                errno.EINVAL, f"work request {i}: {len(w.sg_list)} SGEs, cap.max_send_sge is {max_sge}", w, i
            )
        for s in w.sg_list:
            mr = _mr_of(qp, s)
            if mr is None:
                raise PostError(
                    errno.EINVAL, f"work request {i}: lkey 0x{s.lkey:x} is not a region of the QP's PD", w, i
                )
        try:
            dev.post_send(qp.core, w)
        except LocalProtocolError as exc:
            raise PostError(exc.errno, f"work request {i}: {exc.reason}", w, i) from None


def _mr_of(qp: Qp, s: Sge) -> MemoryRegion | None:
    for mr in qp.pd.mrs:
        if mr.lkey == s.lkey:
            return mr
    return None


def post_recv(qp: Qp, wr: RecvWR | Iterable[RecvWR]) -> None:
    """mrc_post_recv of one receive work request or a list (each consumed by one incoming Write with
    Immediate; MRC places the data by the Write's address, so SGEs are optional). Refusals as in
    `post_send`."""
    qp._check()
    wrs = [wr] if isinstance(wr, RecvWR) else list(wr)
    max_sge = qp.init.cap.max_recv_sge
    dev = qp.ctx.dev
    for i, w in enumerate(wrs):
        if not isinstance(w, RecvWR):
            raise PostError(
                errno.EINVAL, f"work request {i}: expected a RecvWR, got {type(w).__name__}", w, i
            )
        if len(w.sg_list) > max_sge:
            raise PostError(
                errno.EINVAL, f"work request {i}: {len(w.sg_list)} SGEs, cap.max_recv_sge is {max_sge}", w, i
            )
        try:
            dev.post_recv(qp.core, w)
        except LocalProtocolError as exc:
            raise PostError(exc.errno, f"work request {i}: {exc.reason}", w, i) from None
