"""Queue pairs: attributes, the state machine (one table), work-request posting and flushing.

A QP moves RESET → INIT → RTR → RTS (mrc.h ``mrc_qp_attr_mask``), and to ERROR from any state (a fatal
transport event, or by request); ERROR → RESET. `TRANSITIONS` is the whole state machine: for each legal
(from, to) pair, the attributes that must be given and those that may be. Anything else raises
`LocalProtocolError` at once with an errno-like reason. `openmrc.verbs` derives mrc.h's attribute masks
for each transition from the same table (`openmrc.verbs.qp_attr`), and checks values against `ATTR_RANGES`.
"""

from __future__ import annotations

import errno
from collections import deque
from collections.abc import Hashable
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, Final

from openmrc.transport.cq import CompletionQueue
from openmrc.transport.requester import Requester
from openmrc.transport.responder import Responder
from openmrc.transport.security import QpSecurity, SealState
from openmrc.transport.types import (
    LocalProtocolError,
    QpCapFlags,
    QpState,
    RecvWR,
    SendFlags,
    SendWR,
    WcOpcode,
    WcStatus,
    WorkCompletion,
    WrOpcode,
)
from openmrc.wire import PSN_MASK, QPN_MASK

if TYPE_CHECKING:
    from openmrc.transport.evtable import EvStatus, EvTable
    from openmrc.transport.nic import Nic

__all__ = ["ATTR_RANGES", "TRANSITIONS", "Qp", "QpAttr", "QpInitAttr"]

_RTS: Final = QpState.RTS  # a plain global: an Enum class attribute lookup costs more than the test itself


@dataclass(frozen=True, slots=True, kw_only=True)
class QpInitAttr:
    """Creation attributes (mrc_qp_init_attr)."""

    send_cq: CompletionQueue
    recv_cq: CompletionQueue
    max_send_wr: int | None = None
    """Send-queue depth (outstanding WRs); default from NicConfig."""
    max_recv_wr: int | None = None
    """Receive-queue depth; default from NicConfig."""
    sq_sig_all: bool = False
    """Every send WR generates a completion, signaled or not."""


@dataclass(slots=True, kw_only=True)
class QpAttr:
    """Attributes set by `Qp.modify` (verbs + mrc.h ``mrc_qp_attr``). Only the given ones change."""

    qp_hint: object | None = None
    """INIT: opaque QP hint (mrc_qp_hint)."""
    ev_profile_id: int | None = None
    """INIT: EV profile the QP sprays over (see `Nic.add_ev_profile`)."""
    cc_profile_id: int | None = None
    """INIT: congestion-control profile (see `Nic.add_cc_profile`)."""
    dest_qp_num: int | None = None
    """RTR: the peer QP number."""
    peer: Hashable | None = None
    """RTR: the peer's address (opaque to the core; handed to the driver in every `Transmit`)."""
    rq_psn: int | None = None
    """RTR: first PSN expected from the peer."""
    mpr_dest: int | None = None
    """RTR: responder tracking window, in 128-PSN units (1..255)."""
    max_wimm_dest: int | None = None
    """RTR: Write-with-Imm messages the responder accepts in flight."""
    cap: QpCapFlags | None = None
    """RTR: mrc_qp_cap flags (DYNAMIC_MPR, ...)."""
    sq_psn: int | None = None
    """RTS: first PSN this QP sends."""
    mpr: int | None = None
    """RTS: requester window, in 128-PSN units (1..255)."""
    max_wimm: int | None = None
    """RTS: Write-with-Imm messages this requester keeps in flight."""
    timeout: int | None = None
    """RTS: ACK timeout exponent: 1.024 µs · 2^timeout (0..24)."""
    retry_linear: int | None = None
    """RTS: retries at the fixed interval (0..7)."""
    retry_exp: int | None = None
    """RTS: further retries with exponential backoff (0..25; 25 = infinite)."""
    security: QpSecurity | None = None
    """INIT: **[openmrc]** the security domain the QP's packets are authenticated in (see
    `openmrc.transport.security`); both ends set the same. None: MRC 1.0, unauthenticated."""

    def __init__(
        self,
        *,
        qp_hint: object | None = None,
        ev_profile_id: int | None = None,
        cc_profile_id: int | None = None,
        dest_qp_num: int | None = None,
        peer: Hashable | None = None,
        rq_psn: int | None = None,
        mpr_dest: int | None = None,
        max_wimm_dest: int | None = None,
        cap: QpCapFlags | None = None,
        sq_psn: int | None = None,
        mpr: int | None = None,
        max_wimm: int | None = None,
        timeout: int | None = None,
        retry_linear: int | None = None,
        retry_exp: int | None = None,
        security: QpSecurity | None = None,
    ) -> None:
        # written out (the dataclass keeps it): compiled, it is several times as fast as the generated one
        self.qp_hint = qp_hint
        self.ev_profile_id = ev_profile_id
        self.cc_profile_id = cc_profile_id
        self.dest_qp_num = dest_qp_num
        self.peer = peer
        self.rq_psn = rq_psn
        self.mpr_dest = mpr_dest
        self.max_wimm_dest = max_wimm_dest
        self.cap = cap
        self.sq_psn = sq_psn
        self.mpr = mpr
        self.max_wimm = max_wimm
        self.timeout = timeout
        self.retry_linear = retry_linear
        self.retry_exp = retry_exp
        self.security = security


_ALL: Final = frozenset(f.name for f in fields(QpAttr))
_INIT_REQ: Final = frozenset({"ev_profile_id", "cc_profile_id"})
_INIT_OPT: Final = frozenset({"qp_hint", "security"})
_RTR_REQ: Final = frozenset({"dest_qp_num", "peer", "rq_psn", "mpr_dest", "max_wimm_dest"})
_RTR_OPT: Final = frozenset({"cap"})
_RTS_REQ: Final = frozenset({"sq_psn", "mpr", "max_wimm", "timeout", "retry_linear", "retry_exp"})
_RTS_OPT: Final = frozenset({"timeout", "retry_linear", "retry_exp", "max_wimm"})

_Rule = tuple[frozenset[str], frozenset[str]]  # (required attributes, optional attributes)

#: (from, to) → (required attributes, optional attributes). Absent pairs are illegal.
TRANSITIONS: Final[dict[tuple[QpState, QpState], _Rule]] = {
    (QpState.RESET, QpState.RESET): (frozenset(), frozenset()),
    (QpState.RESET, QpState.INIT): (_INIT_REQ, _INIT_OPT),
    (QpState.INIT, QpState.INIT): (frozenset(), _INIT_REQ | _INIT_OPT),
    (QpState.INIT, QpState.RTR): (_RTR_REQ, _RTR_OPT | _INIT_OPT),
    (QpState.RTR, QpState.RTS): (_RTS_REQ, frozenset()),
    (QpState.RTS, QpState.RTS): (frozenset(), _RTS_OPT),
    **{(s, QpState.ERROR): (frozenset(), frozenset()) for s in QpState},
    (QpState.ERROR, QpState.RESET): (frozenset(), frozenset()),
    **{(s, QpState.RESET): (frozenset(), frozenset()) for s in (QpState.INIT, QpState.RTR, QpState.RTS)},
}

#: The bounds of the integer attributes that have any (the others: any value the rest of `modify` accepts).
ATTR_RANGES: Final[dict[str, tuple[int, int]]] = {
    "mpr_dest": (1, 255),
    "mpr": (1, 255),
    "max_wimm_dest": (0, 0xFFFF),
    "max_wimm": (0, 0xFFFF),
    "timeout": (0, 24),
    "retry_linear": (0, 7),
    "retry_exp": (0, 25),
    "dest_qp_num": (0, QPN_MASK),
    "rq_psn": (0, PSN_MASK),
    "sq_psn": (0, PSN_MASK),
}


def _in_range(name: str, v: object) -> bool:
    """Whether ``v`` is within attribute ``name``'s bounds (only `ATTR_RANGES`' attributes have any)."""
    lo_hi = ATTR_RANGES.get(name)
    return lo_hi is None or (isinstance(v, int) and lo_hi[0] <= v <= lo_hi[1])


_CAP_ALL: Final = sum(int(f) for f in QpCapFlags)  # every defined bit (iteration yields the single bits)


def _cap_flags(cap: object) -> QpCapFlags:
    """``cap`` given as an integer: the `QpCapFlags` it sets, or `LocalProtocolError` if it is not one."""
    if isinstance(cap, int) and not isinstance(cap, bool) and cap >= 0 and not cap & ~_CAP_ALL:
        return QpCapFlags(cap)
    raise LocalProtocolError(errno.EINVAL, f"cap={cap!r} is not a set of QpCapFlags (bits 0x{_CAP_ALL:x})")


class Qp:
    """One MRC queue pair: a requester and a responder sharing attributes, CQs and an EV table."""

    def __init__(self, nic: Nic, qp_num: int, init: QpInitAttr) -> None:
        self.nic = nic
        self.qp_num = qp_num
        self.send_cq = init.send_cq
        self.recv_cq = init.recv_cq
        self.max_send_wr = init.max_send_wr or nic.config.max_send_wr
        self.max_recv_wr = init.max_recv_wr or nic.config.max_recv_wr
        self.sq_sig_all = init.sq_sig_all
        self.state = QpState.RESET
        self.attr = QpAttr()
        self._recv_queue: deque[RecvWR] | None = None  # made at first use (see recv_queue)
        self.evs: EvTable | None = None
        self.timer_at = -1
        """This QP's deadline in the NIC's timer heap (-1: none), set at ``timer_seq``; the NIC's bookkeeping,
        with ``heap_at`` / ``heap_seq``: the heap entry that stands for it (at or before it; -1: none)."""
        self.timer_seq = 0
        self.heap_at = -1
        self.heap_seq = 0
        self.error_detail: str | None = None
        """Why the transport put the QP in ERROR (the status and what led to it), None until then."""
        self.requester = Requester(self)
        self.responder = Responder(self)
        self.pd: object = None
        """The protection domain (`openmrc.verbs` sets it): remote Writes reach only its regions."""
        self.seal: SealState | None = None
        """The QP's sealing state while it is in a security domain (attribute ``security``), else None."""

    def __repr__(self) -> str:
        return f"Qp(0x{self.qp_num:06x}, {self.state.name})"

    def detach(self) -> None:
        """`Nic.destroy_qp` took this QP out of its NIC: break the reference cycles it is part of (its
        requester and responder point back at it) and let go of its EV table and congestion control, so
        that reference counting frees it as soon as nothing else holds it (a simulation that makes and
        destroys millions of QP pairs needs no cyclic garbage collection). Its counters stay readable; it
        is in ERROR and refuses any further use (`destroyed`)."""
        requester = self.requester
        del requester.qp, self.responder.qp
        requester.rec.detach()
        self.evs = None
        self.state = QpState.ERROR

    def destroyed(self) -> bool:
        """Whether `Nic.destroy_qp` took this QP out of its NIC."""
        return self.nic.qps.get(self.qp_num) is not self

    def _refuse_destroyed(self, what: str) -> None:
        if self.destroyed():
            raise LocalProtocolError(errno.EINVAL, f"{what} refused: QP 0x{self.qp_num:06x} is destroyed")

    @property
    def recv_queue(self) -> deque[RecvWR]:
        """Posted receive WRs, oldest first (made at first use: an empty deque is most of a kilobyte, and
        most QPs of a simulated fabric never post a receive)."""
        q = self._recv_queue
        if q is None:
            q = self._recv_queue = deque()
        return q

    # -- state machine -------------------------------------------------------------------------------------
    def modify(self, state: QpState, *, now: int = 0, **attrs: Any) -> None:
        """Move to ``state`` setting ``attrs`` (names of `QpAttr` fields). Raises `LocalProtocolError`."""
        if self.state is QpState.ERROR:
            self._refuse_destroyed("modify")
        rule = TRANSITIONS.get((self.state, state))
        if rule is None:
            raise LocalProtocolError(errno.EINVAL, f"illegal QP transition {self.state.name} -> {state.name}")
        cap = attrs.get("cap")
        if cap is not None and type(cap) is not QpCapFlags:
            attrs["cap"] = _cap_flags(cap)
        peer = attrs.get("peer")
        if peer is not None:
            try:
                hash(peer)  # the endpoint keeps each peer's port status by it
            except TypeError:
                raise LocalProtocolError(errno.EINVAL, f"peer={peer!r} is not hashable") from None
        security = attrs.get("security")
        if security is not None and not isinstance(security, QpSecurity):
            raise LocalProtocolError(errno.EINVAL, f"security={security!r}: expected a QpSecurity")
        if security is not None and security.domain.revoked:
            raise LocalProtocolError(errno.EINVAL, f"security domain {security.domain.sdi} is revoked")
        if not self._fits(rule, state, attrs):
            self._refuse(rule, state, attrs)
        attr = self.attr
        for name, v in attrs.items():
            if v is not None:
                setattr(attr, name, v)
        old, self.state = self.state, state
        if security is not None:
            self.seal = SealState(self.qp_num, security)
            self.nic.secure[self.qp_num] = self.seal
        if self.seal is not None and attr.dest_qp_num is not None:
            self.seal.peer_qpn = attr.dest_qp_num
        if state is QpState.RTR and old is QpState.INIT:
            self.evs = self.nic.build_ev_table(self, now)
            self.responder.start(now)
        elif state is QpState.RTS and old is QpState.RTR:
            self.requester.start(now)
        elif state is QpState.RTS and old is QpState.RTS:
            self.requester.configure()  # the timeout and retry counts may have changed
        elif state is QpState.ERROR and old is not QpState.ERROR:
            self._flush(now)
        elif state is QpState.RESET:
            if self.seal is not None:
                self.seal = None
                del self.nic.secure[self.qp_num]
            self.attr = QpAttr()
            self.evs = None
            self._recv_queue = None
            self.requester = Requester(self)
            self.responder = Responder(self)
        self.nic.wake(self)

    def _fits(self, rule: _Rule, state: QpState, attrs: dict[str, Any]) -> bool:
        """Whether ``attrs`` are right for the transition to ``state`` (one pass, no sets made: every QP of
        a simulated fabric takes three transitions); `_refuse` says what is wrong when they are not."""
        required, optional = rule
        n = 0
        for name, v in attrs.items():
            if v is None:
                if name not in _ALL:
                    return False
                continue
            if name in required:
                n += 1
            elif name not in optional:
                return False
            if not _in_range(name, v):
                return False
        if n != len(required) and state is not self.state:  # INIT -> INIT, RTS -> RTS: nothing required
            return False
        return self._missing_profile(attrs) is None

    def _missing_profile(self, attrs: dict[str, Any]) -> tuple[str, object] | None:
        """The kind ("EV" or "CC") and id of the first profile ``attrs`` bind that this NIC does not have."""
        nic = self.nic
        p = attrs.get("ev_profile_id")
        if p is not None and not (isinstance(p, int) and nic.has_ev_profile(p)):
            return "EV", p
        p = attrs.get("cc_profile_id")
        if p is not None and not (isinstance(p, int) and nic.has_cc_profile(p)):
            return "CC", p
        return None

    def _refuse(self, rule: _Rule, state: QpState, attrs: dict[str, Any]) -> None:
        """Raise `LocalProtocolError` naming the first thing wrong with ``attrs`` for this transition."""
        required, optional = rule
        unknown = set(attrs) - _ALL
        if unknown:
            raise LocalProtocolError(errno.EINVAL, f"unknown QP attribute(s): {', '.join(sorted(unknown))}")
        given = {k for k, v in attrs.items() if v is not None}
        missing = set() if state is self.state else required - given
        if missing:
            raise LocalProtocolError(
                errno.EINVAL,
                f"{self.state.name} -> {state.name} needs attribute(s): {', '.join(sorted(missing))}",
            )
        extra = given - required - optional
        if extra:
            raise LocalProtocolError(
                errno.EINVAL,
                f"attribute(s) not allowed on {self.state.name} -> {state.name}: {', '.join(sorted(extra))}",
            )
        for name in sorted(given):
            v = attrs[name]
            if not _in_range(name, v):
                lo, hi = ATTR_RANGES[name]
                raise LocalProtocolError(errno.EINVAL, f"{name}={v!r} outside [{lo}, {hi}]")
        missing_profile = self._missing_profile(attrs)
        if missing_profile is not None:
            raise LocalProtocolError(errno.EINVAL, f"no {missing_profile[0]} profile {missing_profile[1]!r}")
        raise AssertionError(f"_fits and _refuse disagree on {attrs!r}")  # pragma: no cover

    def set_error(self, now: int, status: WcStatus, detail: str = "") -> None:
        """A fatal transport event: ERROR, the first outstanding WR fails with ``status``, the rest flush;
        ``detail`` says why (`error_detail`)."""
        if self.state is QpState.ERROR:
            return
        self.error_detail = f"{status.name}: {detail}" if detail else status.name
        self.requester.fail_head(status)
        self.modify(QpState.ERROR, now=now)
        self.nic.stats.qp_errors += 1

    def _flush(self, now: int) -> None:
        self.requester.flush()
        while self.recv_queue:
            wr = self.recv_queue.popleft()
            self.recv_cq.push(
                WorkCompletion(
                    wr.wr_id, WcStatus.WR_FLUSH_ERR, WcOpcode.RECV_RDMA_WITH_IMM, qp_num=self.qp_num
                )
            )

    # -- timers --------------------------------------------------------------------------------------------
    def next_timer(self) -> int | None:
        """The earliest of the responder's SACK and hole deadlines and the requester's recovery deadlines
        (timeout, loss check, judgement, plane and EV probes; nothing is sent or probed outside RTS)."""
        r = self.responder
        b = r.sack_deadline
        h = r.hole_deadline
        if h is not None and (b is None or h < b):
            b = h
        if self.state is not _RTS:
            return b
        a = self.requester.rec.next_timer()
        if a is None:
            return b
        return a if b is None or a < b else b

    @property
    def ack_timeout_ns(self) -> int:
        """The retransmission timeout in effect from RTS on: 1.024 µs · 2^``timeout``, at least the NIC's
        floor (`NicConfig.min_ack_timeout_ns`); the first ``retry_linear`` retries wait that long, the next
        ``retry_exp`` double it each time."""
        return self.requester.rec.rto_base

    def time_to_error(self) -> float:
        """Seconds from a peer's last answer to RETRY_EXC_ERR when nothing more comes back (inf with
        ``retry_exp`` 25): ``ack_timeout · (1 + retry_linear + 2 + 4 + … + 2^retry_exp)``."""
        return self.requester.rec.time_to_error()

    def ev_states(self) -> list[EvStatus]:
        """Every EV of this QP with its port, value, state (GOOD, ASSUMED_BAD, DENIED) and whether it is
        in the rotation and usable now; empty before RTR (the EV table is built on INIT -> RTR)."""
        return [] if self.evs is None else self.evs.status()

    def on_timer(self, now: int) -> None:
        self.responder.on_timer(now)
        self.requester.on_timer(now)

    # -- work requests -------------------------------------------------------------------------------------
    def post_send(self, wr: SendWR, *, now: int = 0) -> None:
        """Queue an RDMA Write (with immediate). Raises `LocalProtocolError` on misuse, nothing queued."""
        if self.state is not QpState.RTS:
            if self.state is QpState.ERROR:
                self._refuse_destroyed("post_send")
                raise LocalProtocolError(errno.EINVAL, "QP is in ERROR; post_send refused")
            raise LocalProtocolError(errno.EINVAL, f"post_send needs RTS, QP is {self.state.name}")
        if wr.opcode not in (WrOpcode.RDMA_WRITE, WrOpcode.RDMA_WRITE_WITH_IMM):
            raise LocalProtocolError(errno.EINVAL, f"opcode {wr.opcode!r} is not supported by MRC")
        if (wr.opcode is WrOpcode.RDMA_WRITE_WITH_IMM) != (wr.imm_data is not None):
            raise LocalProtocolError(
                errno.EINVAL, "imm_data is required with RDMA_WRITE_WITH_IMM and only then"
            )
        if wr.imm_data is not None and not 0 <= wr.imm_data <= 0xFFFFFFFF:
            raise LocalProtocolError(errno.EINVAL, f"imm_data {wr.imm_data} does not fit 32 bits")
        if not 0 <= wr.rkey <= 0xFFFFFFFF or not 0 <= wr.remote_addr < 1 << 64:
            raise LocalProtocolError(errno.EINVAL, "rkey / remote_addr out of range")
        if len(self.requester.wrs) >= self.max_send_wr:
            raise LocalProtocolError(errno.ENOMEM, f"send queue full ({self.max_send_wr} outstanding WRs)")
        views = []
        total = 0
        for i, sge in enumerate(wr.sg_list):
            mr = self.nic.mrs.by_lkey(sge.lkey)
            if mr is None:
                raise LocalProtocolError(errno.EINVAL, f"sg_list[{i}]: unknown lkey 0x{sge.lkey:08x}")
            view = mr.slice(sge.addr, sge.length)
            if view is None:
                raise LocalProtocolError(
                    errno.EINVAL, f"sg_list[{i}]: [0x{sge.addr:x}, +{sge.length}) outside its memory region"
                )
            views.append(view)
            total += sge.length
        if total >= 1 << 32:
            raise LocalProtocolError(errno.EINVAL, f"message of {total} B exceeds the 32-bit DMA length")
        if wr.remote_addr + total > 1 << 64:
            raise LocalProtocolError(
                errno.EINVAL,
                f"remote_addr 0x{wr.remote_addr:x} + {total} B passes the end of the address space",
            )
        signaled = self.sq_sig_all or bool(wr.send_flags & SendFlags.SIGNALED)
        self.requester.post(wr, views, total, signaled)
        self.nic.wake(self)

    def post_recv(self, wr: RecvWR) -> None:
        if self.state in (QpState.RESET, QpState.ERROR):
            self._refuse_destroyed("post_recv")
            raise LocalProtocolError(errno.EINVAL, f"post_recv refused in {self.state.name}")
        if len(self.recv_queue) >= self.max_recv_wr:
            raise LocalProtocolError(errno.ENOMEM, f"receive queue full ({self.max_recv_wr} WRs)")
        self.recv_queue.append(wr)
