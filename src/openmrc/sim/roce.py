"""The RoCEv2 baseline: one path per QP (ECMP-hashed UDP source port), go-back-N, no PFC (lossy fabric).

A flow of ``size`` bytes is split over ``qps`` queue pairs, each with its own UDP source port (so ECMP may
put them on different paths). A QP keeps up to ``window`` packets in flight. The receiver accepts only the
next expected PSN: anything else is dropped, and the first out-of-order arrival after progress answers a
NAK (PSN sequence error) carrying the expected PSN, upon which the sender goes back to it and resends
everything from there. A retransmission timeout does the same. ACKs are cumulative, one per ``ack_every``
packets and on the last. Trimmed packets are simply lost to RoCE (it has no trim NACK).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from openmrc.sim.network import HEADER_BYTES, Node, SimPacket
from openmrc.transport import TrimMark
from openmrc.wire import AETH, BTH, METH, RETH, AethSyndrome, Opcode, Packet

if TYPE_CHECKING:
    from openmrc.sim.engine import Simulator

__all__ = ["RoceConfig", "RoceHost", "RoceQp"]

_EMPTY = memoryview(b"")


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


class RoceQp:
    """The sending side of one RoCE QP of a flow (and, on the peer, its expected PSN)."""

    __slots__ = (
        "acked",
        "done_at",
        "dst",
        "expected",
        "high",
        "last_progress",
        "nak_sent",
        "next_psn",
        "npkts",
        "qpn",
        "rcv_count",
        "rto_at",
        "size",
        "sport",
        "src",
    )

    def __init__(self, qpn: int, src: int, dst: int, size: int, mtu: int, sport: int) -> None:
        self.qpn = qpn
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


class RoceHost(Node):
    """A host running RoCEv2 QPs over its one port per plane (all on plane 0: RoCE uses one NIC port)."""

    __slots__ = (
        "_by_qpn",
        "cfg",
        "on_done",
        "on_received",
        "pace_pending",
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
        self.qps: list[RoceQp] = []  # sending QPs, in start order
        self._by_qpn: dict[int, RoceQp] = {}
        self.rcv: dict[int, RoceQp] = {}  # receiving QPs by QPN
        self.pace_pending = False
        self.timer_pending = False
        self.on_done: Callable[[RoceQp], None] | None = None
        self.on_received: Callable[[RoceQp], None] | None = None  # the receiver got a QP's last byte
        self.resent = 0

    def add_sender(self, qp: RoceQp) -> None:
        self.qps.append(qp)
        self._by_qpn[qp.qpn] = qp

    # -- sending ---------------------------------------------------------------------------------------------
    def _packet(self, qp: RoceQp, psn: int) -> SimPacket:
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
        sp = SimPacket(pkt, size + HEADER_BYTES, 0, self.id, qp.dst, 1, qp.sport)
        return sp

    def pump(self, now: int) -> None:
        port = self.ports[0]
        sent = True
        while sent:
            sent = False
            for qp in self.qps:
                if port.free_at - now >= port.pace_ns:
                    break
                if qp.done_at is None and qp.next_psn < qp.npkts and qp.next_psn - qp.acked < self.cfg.window:
                    port.send(self._packet(qp, qp.next_psn), now)
                    if qp.next_psn < qp.high:
                        self.resent += 1
                    qp.next_psn += 1
                    qp.high = max(qp.high, qp.next_psn)
                    if qp.rto_at <= now:
                        qp.rto_at = now + self.cfg.rto_ns
                    sent = True
        if not self.pace_pending and any(
            q.done_at is None and q.next_psn < q.npkts and q.next_psn - q.acked < self.cfg.window
            for q in self.qps
        ):
            self.pace_pending = True
            self.sim.schedule(max(port.free_at - port.pace_ns, now + 1), self._pace, None)
        self._arm(now)

    def _pace(self, _: None) -> None:
        self.pace_pending = False
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

    # -- receiving -------------------------------------------------------------------------------------------
    def arrive(self, p: SimPacket) -> None:
        now = self.sim.now
        pkt = p.packet
        if pkt.bth.opcode == Opcode.ACK:
            self._on_ack(pkt, now)
            return
        qp = self.rcv.get(pkt.bth.dest_qp)
        if qp is None:
            return
        psn = pkt.bth.psn
        if p.trim is not TrimMark.NONE or psn != qp.expected & 0xFFFFFF:
            if psn != qp.expected & 0xFFFFFF and not qp.nak_sent and (psn - qp.expected) & 0xFFFFFF < 1 << 23:
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

    def _ack(self, qp: RoceQp, syndrome: AethSyndrome, now: int) -> None:
        pkt = Packet(
            BTH(Opcode.ACK, dest_qp=qp.qpn, psn=qp.expected & 0xFFFFFF),
            aeth=AETH(syndrome, 0),
            payload=_EMPTY,
        )
        self.ports[0].send(SimPacket(pkt, HEADER_BYTES, 0, self.id, qp.src, 1, qp.sport ^ 0x8000), now)

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
            if self.on_done is not None:
                self.on_done(q)
        self.pump(now)


def new_qpn(rng: random.Random, used: set[int]) -> int:
    while True:
        q = rng.randrange(0x100, 1 << 24)
        if q not in used:
            used.add(q)
            return q
