"""The RoCEv2 baseline: one path per QP (ECMP-hashed UDP source port), go-back-N, optionally DCQCN
congestion control; on a lossy fabric by default, or lossless with priority flow control
(`FabricSimConfig.pfc`, `openmrc.sim.ports.Port.enable_pfc`).

A flow of ``size`` bytes is split over ``qps`` queue pairs, each with its own UDP source port (so ECMP may
put them on different paths) and its own NIC port: all on port 0 (one plane), or one per plane in turn as
multi-rail collective libraries open one QP per rail (`FabricSimConfig.roce_planes`). A QP keeps up to
``window`` packets in flight. The receiver accepts only the next expected PSN: anything else is dropped,
and the first out-of-order arrival after progress answers a NAK (PSN sequence error) carrying the expected
PSN, upon which the sender goes back to it and resends everything from there. A retransmission timeout
does the same. ACKs are cumulative, one per ``ack_every`` packets and on the last. Trimmed
packets are simply lost to RoCE (it has no trim NACK).

DCQCN: theory of operation
--------------------------
DCQCN (Zhu et al., "Congestion Control for Large-Scale RDMA Deployments", SIGCOMM 2015, §3) is rate-based
and has three parts. The congestion point (a switch, `openmrc.sim.ports.Port`) ECN-marks data packets
by RED on its queue length, on every hop including the last. The notification point (the receiving NIC)
answers a marked packet with a CNP (a BTH-only packet, opcode `CNP_OPCODE`) to the sending QP, at most
one per ``cnp_interval_ns`` per QP. The reaction point (the sending NIC, `ReactionPoint`) keeps, per QP,
a current rate Rc, a target rate Rt and an estimate alpha of the marked fraction:

- on a CNP: Rt = Rc, Rc = Rc·(1 − alpha/2), alpha = (1 − g)·alpha + g, and the increase state restarts;
- every ``alpha_period_ns`` without a CNP: alpha = (1 − g)·alpha;
- every ``rate_timer_ns`` and every ``byte_counter`` bytes sent, an increase event: while both the timer
  count T and the byte-counter count BC are at most F, fast recovery (Rc = (Rt + Rc)/2); once one of them
  passes F, additive increase (Rt += R_AI first); once both have, hyper increase (Rt += R_HAI first).

Rates stay within [``min_rate_bps``, line rate]. When Rc and Rt are back at line rate the QP leaves rate
limiting (as a NIC frees its rate limiter): its timers stop and the next CNP starts from alpha =
``alpha_init`` again. The sender paces each QP: a packet goes no earlier than the previous one's send time
plus its size at Rc, on top of the window limit. Every timer is a simulator event, so runs are
deterministic.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from openmrc.sim.network import HEADER_BYTES, PAUSED, Node, sim_packet
from openmrc.transport import Transmit, TrimMark
from openmrc.transport.nic import draw_qpn
from openmrc.wire import AETH, BTH, METH, RETH, AethSyndrome, Opcode, Packet

if TYPE_CHECKING:
    from openmrc.sim.engine import Simulator

__all__ = ["CNP_OPCODE", "DcqcnConfig", "ReactionPoint", "RoceConfig", "RoceHost", "RoceQp"]

_EMPTY: Final = memoryview(b"")

#: The RoCEv2 CNP opcode (InfiniBand Annex A17). It is no MRC opcode, so `Packet.encode_headers` would
#: reject it; the simulator never encodes packets.
CNP_OPCODE: Final = 0x81
_REVERSE_SPORT: Final = 0x8000
"""What the receiver flips in a QP's UDP source port for its ACKs, NAKs and CNPs (their ECMP entropy)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class DcqcnConfig:
    """DCQCN parameters: the paper's (SIGCOMM 2015, §3 and §5) and common NIC defaults, rates for 100G."""

    g: float = 1 / 256
    """Gain of the alpha estimate (the paper's g)."""
    alpha_init: float = 1.0
    """Alpha when a QP's rate limiting starts: the first CNP halves the rate."""
    alpha_period_ns: int = 55_000
    """Alpha decays by (1 − g) every this long without a CNP (the paper's K = 55 µs)."""
    rate_timer_ns: int = 55_000
    """Rate-increase timer period (the paper's T = 55 µs), restarted by every CNP."""
    byte_counter: int = 10_000_000
    """Rate-increase byte counter (the paper's B = 10 MB of data sent by the QP)."""
    fast_recovery_steps: int = 5
    """Increase events of each kind (timer, byte counter) spent in fast recovery (the paper's F)."""
    rai_bps: int = 5_000_000_000
    """Additive increase R_AI. The paper's 40 Mb/s at 40G recovers in tens of ms; 5 Gb/s, as is common in
    100G simulations, lets a rate recover within the few hundred µs a simulated flow lasts."""
    rhai_bps: int = 50_000_000_000
    """Hyper increase R_HAI: ten times R_AI, QCN's ratio."""
    min_rate_bps: int = 100_000_000
    """Floor of the current rate."""
    cnp_interval_ns: int = 50_000
    """The notification point sends at most one CNP per QP per this long (50 µs)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RoceConfig:
    mtu: int = 4096
    """Payload per packet."""
    window: int = 64
    """Packets in flight per QP (about one bandwidth-delay product)."""
    rto_ns: int = 100_000
    """Retransmission timeout."""
    ack_every: int = 4
    """The receiver ACKs every this many in-order packets (and the last of a flow)."""
    dcqcn: DcqcnConfig | None = None
    """DCQCN congestion control (CNPs, per-QP rate pacing); None: window-limited only, no CNPs."""


class ReactionPoint:
    """DCQCN's sender side for one QP: the rate Rc, target Rt and alpha, and its two timers' deadlines.

    Sans-IO: the caller reports CNPs (`on_cnp`), bytes sent (`on_sent`) and timer expiry (`on_timer`) with
    the time, and schedules `on_timer` for `next_deadline`.
    """

    __slots__ = (
        "alpha",
        "alpha_at",
        "byte_events",
        "bytes",
        "cfg",
        "cnp_seen",
        "increase_at",
        "line_bps",
        "rate",
        "target",
        "timer_events",
    )

    def __init__(self, cfg: DcqcnConfig, line_bps: int) -> None:
        self.cfg = cfg
        self.line_bps = line_bps
        self.rate = line_bps
        self.target = line_bps
        self.alpha = cfg.alpha_init
        self.alpha_at: int | None = None  # None: not rate limiting, no timers
        self.increase_at: int | None = None
        self.cnp_seen = False
        self.timer_events = 0
        self.byte_events = 0
        self.bytes = 0

    @property
    def limiting(self) -> bool:
        """Whether the QP is rate limited (a CNP came and the rate has not yet recovered)."""
        return self.alpha_at is not None

    def next_deadline(self) -> int | None:
        if self.alpha_at is None or self.increase_at is None:
            return self.alpha_at
        return min(self.alpha_at, self.increase_at)

    def on_cnp(self, now: int) -> None:
        cfg = self.cfg
        if self.alpha_at is None:
            self.alpha_at = now + cfg.alpha_period_ns
        self.target = self.rate
        self.rate = max(cfg.min_rate_bps, int(self.rate * (1 - self.alpha / 2)))
        self.alpha = (1 - cfg.g) * self.alpha + cfg.g
        self.cnp_seen = True
        self.timer_events = self.byte_events = self.bytes = 0
        self.increase_at = now + cfg.rate_timer_ns

    def on_sent(self, nbytes: int) -> None:
        if self.alpha_at is None:
            return
        self.bytes += nbytes
        while self.bytes >= self.cfg.byte_counter and self.alpha_at is not None:
            self.bytes -= self.cfg.byte_counter
            self.byte_events += 1
            self._increase()

    def on_timer(self, now: int) -> None:
        cfg = self.cfg
        if self.alpha_at is not None and self.alpha_at <= now:
            if not self.cnp_seen:
                self.alpha *= 1 - cfg.g
            self.cnp_seen = False
            self.alpha_at = now + cfg.alpha_period_ns
        if self.increase_at is not None and self.increase_at <= now:
            self.timer_events += 1
            self.increase_at = now + cfg.rate_timer_ns
            self._increase()

    def _increase(self) -> None:
        cfg = self.cfg
        f = cfg.fast_recovery_steps
        if min(self.timer_events, self.byte_events) > f:
            self.target += cfg.rhai_bps
        elif max(self.timer_events, self.byte_events) > f:
            self.target += cfg.rai_bps
        line = self.line_bps
        self.target = min(self.target, line)
        self.rate = min(line, max(cfg.min_rate_bps, -(-(self.target + self.rate) // 2)))
        if self.rate == self.target == line:  # recovered: free the rate limiter
            self.alpha = cfg.alpha_init
            self.alpha_at = self.increase_at = None
            self.cnp_seen = False
            self.timer_events = self.byte_events = self.bytes = 0


class RoceQp:
    """The sending side of one RoCE QP of a flow (and, on the peer, its expected PSN)."""

    __slots__ = (
        "acked",
        "cnp_at",
        "done_at",
        "dst",
        "expected",
        "high",
        "last_progress",
        "nak_sent",
        "next_psn",
        "npkts",
        "port",
        "qpn",
        "rcv_count",
        "ready_at",
        "rp",
        "rp_at",
        "rto_at",
        "size",
        "sport",
        "src",
    )

    def __init__(self, qpn: int, src: int, dst: int, size: int, mtu: int, sport: int, port: int = 0) -> None:
        self.qpn = qpn
        self.port = port  # the NIC port (plane, 0-based) both ends send this QP's packets on
        self.src = src
        self.dst = dst
        self.size = size
        self.npkts = max(1, -(-size // mtu))
        self.sport = sport
        self.next_psn = 0
        self.high = 0  # one past the highest PSN ever sent
        self.acked = 0  # cumulative: every PSN < acked is acknowledged
        self.expected = 0  # receiver side
        self.nak_sent = False
        self.rcv_count = 0
        self.rto_at = 0
        self.last_progress = 0
        self.done_at: int | None = None
        self.rp: ReactionPoint | None = None  # DCQCN only
        self.ready_at = 0  # DCQCN pacing: the next packet may go at this time
        self.rp_at: int | None = None  # the reaction point's scheduled timer
        self.cnp_at: int | None = None  # receiver side: when the last CNP went

    def routes(self) -> list[tuple[int, int, int, int]]:
        """The two ways this QP's packets go, each one ECMP-hashed path: (from host, NIC port, to host, UDP
        source port) of the data, then of the ACKs, NAKs and CNPs."""
        return [
            (self.src, self.port, self.dst, self.sport),
            (self.dst, self.port, self.src, self.sport ^ _REVERSE_SPORT),
        ]


class RoceHost(Node):
    """A host running RoCEv2 QPs, each on one of its ports (one port per plane)."""

    __slots__ = (
        "_by_qpn",
        "cfg",
        "cnps_received",
        "cnps_sent",
        "on_done",
        "on_received",
        "pace_at",
        "ports_used",
        "qps",
        "rcv",
        "resent",
        "sim",
        "timer_pending",
    )

    def __init__(self, sim: Simulator, node_id: int, cfg: RoceConfig) -> None:
        super().__init__(node_id)
        self.sim = sim
        self.cfg = cfg
        self.qps: list[RoceQp] = []  # QPs still sending, in start order
        self._by_qpn: dict[int, RoceQp] = {}
        self.rcv: dict[int, RoceQp] = {}  # receiving QPs by QPN
        self.pace_at: int | None = None  # the pending pace event
        self.ports_used = 0  # bit p: a sending QP uses port p
        self.timer_pending = False
        self.on_done: Callable[[RoceQp], None] | None = None
        self.on_received: Callable[[RoceQp], None] | None = None  # the receiver got a QP's last byte
        self.resent = 0
        self.cnps_sent = 0
        self.cnps_received = 0

    def add_sender(self, qp: RoceQp) -> None:
        self.qps.append(qp)
        self._by_qpn[qp.qpn] = qp
        self.ports_used |= 1 << qp.port
        if self.cfg.dcqcn is not None:
            qp.rp = ReactionPoint(self.cfg.dcqcn, self.ports[qp.port].bps)

    def drop_sender(self, qpn: int) -> None:
        """Forget QP ``qpn``, which has finished sending (its flow is done at both ends)."""
        self._by_qpn.pop(qpn, None)

    # -- sending ---------------------------------------------------------------------------------------------
    def _packet(self, qp: RoceQp, psn: int) -> Transmit:
        mtu = self.cfg.mtu
        size = min(mtu, qp.size - psn * mtu)
        last = psn == qp.npkts - 1
        op = Opcode.WRITE_ONLY if qp.npkts == 1 else Opcode.WRITE_LAST if last else Opcode.WRITE_MIDDLE
        pkt = Packet(
            BTH(op, dest_qp=qp.qpn, psn=psn & 0xFFFFFF, ack_req=last),
            METH(),
            None,
            RETH(psn * mtu, 1, qp.size),
        )
        sp = sim_packet(pkt, size + HEADER_BYTES, 0, self.id, qp.dst, qp.port + 1, qp.sport)
        return sp

    def _can_send(self, qp: RoceQp) -> bool:
        return qp.done_at is None and qp.next_psn < qp.npkts and qp.next_psn - qp.acked < self.cfg.window

    def pump(self, now: int) -> None:
        ports = self.ports
        paced = self.cfg.dcqcn is not None
        sent = True
        while sent:
            sent = False
            busy = 0  # ports that cannot take another packet now (sending only makes them busier)
            for qp in self.qps:
                bit = 1 << qp.port
                if busy & bit:
                    continue
                port = ports[qp.port]
                if port.free_at - now >= port.pace_ns:
                    busy |= bit
                    if busy == self.ports_used:
                        break
                    continue
                if self._can_send(qp) and (not paced or qp.ready_at <= now):
                    sp = self._packet(qp, qp.next_psn)
                    port.send(sp, now)
                    if qp.rp is not None:
                        qp.ready_at = now + sp.wire_size * 8_000_000_000 // qp.rp.rate
                        qp.rp.on_sent(sp.wire_size)
                        self._arm_rp(qp)
                    if qp.next_psn < qp.high:
                        self.resent += 1
                    qp.next_psn += 1
                    qp.high = max(qp.high, qp.next_psn)
                    if qp.rto_at <= now:
                        qp.rto_at = now + self.cfg.rto_ns
                    sent = True
        # the next time a QP that has something to send may send (PFC-paused ports wait for `resumed`)
        at = None
        seen = 0  # unpaced, a port's first sendable QP says when that port's QPs may go
        for qp in self.qps:
            bit = 1 << qp.port
            if seen & bit and not paced:
                continue
            port = ports[qp.port]
            if port.free_at < PAUSED and self._can_send(qp):
                seen |= bit
                t = port.free_at - port.pace_ns  # the latest of it, the QP's pacing and now + 1
                if paced and qp.ready_at > t:
                    t = qp.ready_at
                if t <= now:
                    t = now + 1
                if at is None or t < at:
                    at = t
                if seen == self.ports_used and not paced:
                    break
        if at is not None and (self.pace_at is None or at < self.pace_at):
            self.pace_at = at  # a QP may become ready before the pending one
            self.sim.schedule(at, self._pace, at)
        self._arm(now)

    def _pace(self, at: int) -> None:
        if at != self.pace_at:
            return  # superseded by an earlier one
        self.pace_at = None
        self.pump(self.sim.now)

    def resumed(self, _: None) -> None:
        """A PFC pause of this host's port ended: send again."""
        self.pump(self.sim.now)

    def _arm(self, now: int) -> None:
        pending = [q.rto_at for q in self.qps if q.done_at is None and q.acked < q.next_psn]
        if pending and not self.timer_pending:
            self.timer_pending = True
            self.sim.schedule(max(min(pending), now), self._timer, None)

    def _timer(self, _: None) -> None:
        self.timer_pending = False
        now = self.sim.now
        for q in self.qps:
            if q.done_at is None and q.acked < q.next_psn and q.rto_at <= now:
                q.next_psn = q.acked  # go back N
                q.rto_at = now + self.cfg.rto_ns
        self.pump(now)

    def _arm_rp(self, qp: RoceQp) -> None:
        assert qp.rp is not None
        at = qp.rp.next_deadline()
        if at is not None and at != qp.rp_at:
            qp.rp_at = at
            self.sim.schedule(at, self._rp_timer, (qp, at))

    def _rp_timer(self, arg: tuple[RoceQp, int]) -> None:
        qp, at = arg
        if at != qp.rp_at or qp.done_at is not None:
            return  # superseded, or the QP has finished
        assert qp.rp is not None
        qp.rp_at = None
        qp.rp.on_timer(self.sim.now)
        self._arm_rp(qp)

    # -- receiving -------------------------------------------------------------------------------------------
    def arrive(self, p: Transmit) -> None:
        now = self.sim.now
        pkt = p.packet
        if pkt.bth.opcode == Opcode.ACK:
            self._on_ack(pkt, now)
            return
        if pkt.bth.opcode == CNP_OPCODE:
            self._on_cnp(pkt, now)
            return
        qp = self.rcv.get(pkt.bth.dest_qp)
        if qp is None:
            return
        if p.ecn and self.cfg.dcqcn is not None:
            self._notify(qp, self.cfg.dcqcn, now)
        psn = pkt.bth.psn
        if p.trim is not TrimMark.NONE or psn != qp.expected & 0xFFFFFF:
            ahead = (psn - qp.expected) & 0xFFFFFF
            if p.trim is TrimMark.NONE and ahead >= 1 << 23:
                # a duplicate: the sender missed our ACKs (lost, or it timed out), so say again where we
                # are, coalesced like ordinary ACKs
                qp.rcv_count += 1
                if pkt.bth.ack_req or qp.rcv_count % self.cfg.ack_every == 0:
                    self._ack(qp, AethSyndrome.ACK, now)
            elif psn != qp.expected & 0xFFFFFF and not qp.nak_sent and ahead < 1 << 23:
                qp.nak_sent = True
                self._ack(qp, AethSyndrome.NAK_PSN_SEQUENCE_ERROR, now)
            return
        qp.expected += 1
        qp.nak_sent = False
        qp.rcv_count += 1
        if qp.expected == qp.npkts and self.on_received is not None:
            self.on_received(qp)
        if qp.rcv_count % self.cfg.ack_every == 0 or qp.expected == qp.npkts:
            self._ack(qp, AethSyndrome.ACK, now)

    def _notify(self, qp: RoceQp, dcqcn: DcqcnConfig, now: int) -> None:
        """The notification point: a marked packet asks for a CNP, at most one per interval per QP."""
        if qp.cnp_at is not None and now - qp.cnp_at < dcqcn.cnp_interval_ns:
            return
        qp.cnp_at = now
        self.cnps_sent += 1
        pkt = Packet(BTH(CNP_OPCODE, dest_qp=qp.qpn), payload=_EMPTY)
        self.ports[qp.port].send(
            sim_packet(pkt, HEADER_BYTES, 0, self.id, qp.src, qp.port + 1, qp.sport ^ _REVERSE_SPORT), now
        )

    def _on_cnp(self, pkt: Packet, now: int) -> None:
        q = self._by_qpn.get(pkt.bth.dest_qp)
        if q is None or q.rp is None:
            return
        self.cnps_received += 1
        if q.done_at is None:
            q.rp.on_cnp(now)
            self._arm_rp(q)

    def _ack(self, qp: RoceQp, syndrome: AethSyndrome, now: int) -> None:
        pkt = Packet(
            BTH(Opcode.ACK, dest_qp=qp.qpn, psn=qp.expected & 0xFFFFFF),
            aeth=AETH(syndrome, 0),
            payload=_EMPTY,
        )
        self.ports[qp.port].send(
            sim_packet(pkt, HEADER_BYTES, 0, self.id, qp.src, qp.port + 1, qp.sport ^ _REVERSE_SPORT), now
        )

    def _on_ack(self, pkt: Packet, now: int) -> None:
        q = self._by_qpn.get(pkt.bth.dest_qp)
        if q is None:
            return
        upto = q.acked + ((pkt.bth.psn - q.acked) & 0xFFFFFF)
        if upto > q.next_psn:
            upto = q.next_psn if upto > q.npkts else upto
        if upto > q.acked:
            q.acked = upto
            q.rto_at = now + self.cfg.rto_ns
        assert pkt.aeth is not None
        if pkt.aeth.syndrome == AethSyndrome.NAK_PSN_SEQUENCE_ERROR:
            q.next_psn = q.acked  # go back N
        if q.acked >= q.npkts and q.done_at is None:
            q.done_at = now
            self.qps.remove(q)  # pumping walks the sending QPs: finished ones must not accumulate
            if self.on_done is not None:
                self.on_done(q)
        self.pump(now)


def new_qpn(rng: random.Random, used: set[int]) -> int:
    while True:
        q = draw_qpn(rng)
        if q not in used:
            used.add(q)
            return q
