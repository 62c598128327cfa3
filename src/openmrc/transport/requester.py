"""The requester half of a QP: segmentation, spraying, window gating, SACK/NACK processing, retransmission.

Theory of operation (MRC-SPEC-NOTES §1-§4)
------------------------------------------
Internally PSNs are *unwrapped* sequence numbers (Python ints that never wrap); only the wire carries the
low 24 bits, and every PSN read from the wire is unwrapped next to the current cumulative ACK.

Each posted Write is cut into MTU packets that all carry METH and a RETH whose VA advances by one MTU, so
the responder can place any packet on arrival. A new packet is sent only while

    seq < cack + MPR·128     (the responder's tracking window; shrunk by a dynamic-MPR advertisement)
    inflight + size ≤ cwnd   (congestion control; lost packets do not count as in flight)
    Write-with-Imm messages in flight < max_wimm

and each packet (new or retransmitted) goes on the next usable EV of the QP's rotation (`EvTable`).

Loss detection is by *transmission order*, not by PSN, so that retransmissions are judged fairly: every
transmission gets an order number, and a packet is lost once more than ``reorder_allowance`` packets sent
after it have been acknowledged *and* it was sent long enough ago (RACK-like; `_loss_wait`): while the
QP sees congestion (trims, ECN echoes) max(2·srtt, srtt + 4·rttvar, base RTT) — spraying over paths with
different queues reorders far more than a single path does, and with trimming congestion does not lose
packets silently, so an inferred loss must be a clear one — and otherwise srtt + max(4·rttvar, srtt/4),
this QP's own RTT rather than the fabric's longest base RTT: a short path (one T0) would otherwise wait
several of its RTTs per random loss. Near the tail of what has been sent (fewer than
``reorder_allowance`` packets after it) the count cannot be reached, so there any later packet
acknowledged is enough, with the same age rule; a check timer re-runs the rule when only the age is
missing. If the tail itself is lost nothing later can be acknowledged: when the newest packet has had no
acknowledgement for that wait plus the SACK coalescing delay, it is sent again (a tail loss probe, RFC
8985's idea; no EV penalty), and its acknowledgement exposes the holes before it. Small messages (one
collective step of a few packets) then recover in about two RTTs instead of a retransmission timeout.
A lost packet is queued for retransmission (oldest PSN first, BTH.RTX set, on a fresh EV). Its EV is
skipped for the rotation at once and becomes ASSUMED_BAD only when the packet's acknowledgement shows
that the original was lost: an acknowledgement that comes sooner after the retransmission than the
smallest RTT seen (or before it left) answers the original, which was late in deep queues, not lost;
a trim NACK for it explains it as congestion too. A NACK queues its PSN at once (TRIMMED: the EV is skipped
for the rotation; TRIMMED_LASTHOP: no EV penalty; both restart the retransmission timer, since a trim
proves the path alive; UNEXP_EVENT: the QP fails). The retransmission timer
(1.024 µs · 2^timeout) fires when nothing is acknowledged for that long: every outstanding packet is then
retransmitted. ``retry_linear`` timeouts at the fixed interval, then ``retry_exp`` with doubling
(25 = forever), and a packet NACKed more than that many times, exhaust the retries: the QP goes to ERROR
with RETRY_EXC_ERR. Any acknowledgement of new data resets the timeout count.

A QP with work but no usable path (every plane down locally, or said down by the peer, or every EV
denied) and nothing in flight keeps the retransmission timer all the same: each expiry counts against the
retry budget, and when it runs out the QP goes to ERROR with RETRY_EXC_ERR and every WR is flushed. While
it has work, a QP probes each *doubted* plane (up locally, down by the peer's word) every probe interval
(or PTO, when longer: a probe is not repeated while its answer can still come),
so a wrong or stale port status update is found out by the first answer; a port coming back resumes it.
Probes of ASSUMED_BAD EVs and of doubted planes that the timer finds due are queued and leave with the
next `emit`, so the timer always moves past ``now``.

Feedback is checked before it is believed: a SACK, NACK or AETH from another QP id pair, or whose PSN
(cumulative PSN, bitmap, NACK PSN, AETH PSN) is not within what this QP has outstanding, and a probe answer
that matches no outstanding probe, is dropped and counted (``rx_bogus_ack``) and changes nothing: one
forged packet that only knows the QP number cannot tear the connection down. Bitmap bits for PSNs never
sent (the responder placed a forged packet there) are ignored, the rest of that SACK is not; a cumulative
PSN past everything sent (the responder took a forged Write at the very next PSNs) acknowledges what was
sent and no more.

Signaled Writes complete in post order once every packet of them is acknowledged.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Hashable, Iterator
from typing import TYPE_CHECKING, Final

from mypy_extensions import mypyc_attr

from openmrc.transport.cc import CongestionControl
from openmrc.transport.evtable import EvEntry
from openmrc.transport.types import (
    QpCapFlags,
    QpState,
    SendWR,
    Transmit,
    WcOpcode,
    WcStatus,
    WorkCompletion,
    WrOpcode,
    data_transmit,
    unwrap_psn,
)
from openmrc.wire import (
    BTH,
    PETH,
    PSN_MASK,
    AethSyndrome,
    DataTemplate,
    NackReason,
    Opcode,
    Packet,
    SackM,
)
from openmrc.wire.constants import (
    OP_WRITE_FIRST,
    OP_WRITE_LAST,
    OP_WRITE_LAST_WITH_IMM,
    OP_WRITE_MIDDLE,
    OP_WRITE_ONLY,
    OP_WRITE_ONLY_WITH_IMM,
)

if TYPE_CHECKING:
    from openmrc.transport.qp import Qp

__all__ = ["Requester"]

# Final: the compiled build calls these through C statics (``heapq.heappush`` is an attribute lookup per call)
_heappop: Final = heapq.heappop
_heappush: Final = heapq.heappush

_INFINITE_EXP: Final = 25
_DYNAMIC_MPR: Final = int(QpCapFlags.DYNAMIC_MPR)  # a plain int: see the responder's
_CONGESTED_RTTS: Final = 8
"""A QP that saw a trim or an ECN echo this many RTTs ago or less is congested (`Requester._loss_wait`)."""
_EMPTY: Final = memoryview(b"")
# Enum members as plain globals: an Enum class attribute lookup costs more than the rest of a test.
_RTS: Final = QpState.RTS
_M_NONE: Final = SackM.NONE
_SKIP_ONCE: Final = SackM.SKIP_ONCE
_ALWAYS_SKIP: Final = SackM.ALWAYS_SKIP
_TRIMMED: Final = NackReason.TRIMMED
_TRIMMED_LASTHOP: Final = NackReason.TRIMMED_LASTHOP
_UNEXP_EVENT: Final = NackReason.UNEXP_EVENT


@mypyc_attr(acyclic=True)
class _Wr:
    """A posted Write while it is being sent and acknowledged."""

    __slots__ = (
        "acked",
        "first_seq",
        "imm",
        "imm_data",
        "msn",
        "next_index",
        "npkts",
        "op_first",
        "op_last",
        "rkey",
        "rqmsn",
        "signaled",
        "total",
        "tpl",
        "va",
        "view",
        "views",
        "wr",
    )

    def __init__(self, wr: SendWR, views: list[memoryview], total: int, signaled: bool, mtu: int) -> None:
        self.wr = wr
        self.views = views
        self.view = views[0] if len(views) == 1 else None  # the common single-SGE Write, sliced directly
        self.total = total
        self.signaled = signaled
        self.npkts = max(1, -(-total // mtu))
        self.next_index = 0
        self.acked = 0
        self.first_seq = -1
        self.msn = 0
        self.rqmsn = 0
        self.tpl: DataTemplate | None = None  # what every packet of the Write repeats; set with msn/rqmsn
        self.imm = imm = wr.opcode is WrOpcode.RDMA_WRITE_WITH_IMM
        self.imm_data = (wr.imm_data or 0) if imm else None
        self.va = wr.remote_addr
        self.rkey = wr.rkey
        if self.npkts == 1:
            self.op_first = self.op_last = OP_WRITE_ONLY_WITH_IMM if imm else OP_WRITE_ONLY
        else:
            self.op_first = OP_WRITE_FIRST
            self.op_last = OP_WRITE_LAST_WITH_IMM if imm else OP_WRITE_LAST

    def payload(self, offset: int, size: int) -> memoryview:
        views = self.views
        if len(views) == 1:
            return views[0][offset : offset + size]
        out = bytearray()
        pos = 0
        for v in views:  # gather across SGEs (one copy, only for multi-SGE Writes)
            end = pos + len(v)
            if end > offset and pos < offset + size:
                out += v[max(offset - pos, 0) : min(offset + size - pos, len(v))]
            pos = end
        return memoryview(out)


_NONE_POSTED: Final[deque[_Wr]] = deque()
"""A requester's ``wrs`` and ``unsent`` while it has no Write (shared and never appended to: an empty deque
is 600 bytes, and a large simulation's receiving QPs never post)."""


# acyclic: no cyclic-GC header (16 bytes an outstanding packet); neither refers to anything that refers back
@mypyc_attr(acyclic=True)
class _Tx:
    """One outstanding (unacknowledged) packet: ``seq`` its unwrapped PSN, ``size`` its payload bytes.
    Each transmission of it is a `Transmit` of its own (`_transmit`), which lives only while in flight
    (and which the fabric may write). Not the record itself: a packet stays unacknowledged well after
    it has arrived (at the data peak of a large permutation only about 40 % of a host's unacknowledged
    packets are in flight), so a small record and a Transmit in flight take less memory than one
    object as large as both, at the same speed."""

    __slots__ = ("entry", "lost", "order", "resent", "retries", "sent_at", "seq", "size", "suspect", "wr")

    def __init__(self, seq: int, wr: _Wr, size: int, entry: EvEntry) -> None:
        self.seq = seq
        self.wr = wr
        self.size = size
        self.entry = entry
        self.sent_at = 0
        self.order = 0
        self.lost = False
        self.resent = False  # (the flags side by side: the compiled build packs them into one word)
        self.retries = 0
        self.suspect: EvEntry | None = None  # the EV of a transmission inferred lost, until it is judged


class _Window:
    """Packets under consecutive keys (PSNs, transmission orders), added in key order: a list from key
    ``base`` on, None where a packet left, its empty head dropped as it goes. Eight bytes a packet where a
    dict entry takes about thirty (and a dict keeps the table it grew to), and a lookup is an index."""

    __slots__ = ("base", "live", "slots")

    def __init__(self) -> None:
        self.base = 0
        self.slots: list[_Tx | None] = []
        self.live = 0  # packets held

    def __len__(self) -> int:
        return self.live

    def __iter__(self) -> Iterator[int]:
        """The keys held, in order."""
        base = self.base
        return iter([base + i for i, p in enumerate(self.slots) if p is not None])

    def __contains__(self, key: int) -> bool:
        return self.get(key) is not None

    def values(self) -> list[_Tx]:
        """The packets held, in key order."""
        return [p for p in self.slots if p is not None]

    def get(self, key: int) -> _Tx | None:
        i = key - self.base
        slots = self.slots
        return slots[i] if 0 <= i < len(slots) else None

    def add(self, key: int, p: _Tx) -> None:
        """Hold ``p`` under ``key``, which follows every key held so far."""
        slots = self.slots
        if not slots:
            self.base = key
        gap = key - self.base - len(slots)
        assert gap >= 0, "keys are added in order"
        if gap:
            slots.extend([None] * gap)
        slots.append(p)
        self.live += 1

    def pop(self, key: int) -> _Tx | None:
        """Remove and return the packet under ``key`` (None: none)."""
        i = key - self.base
        slots = self.slots
        if i < 0 or i >= len(slots):
            return None
        p = slots[i]
        if p is None:
            return None
        slots[i] = None
        self.live -= 1
        if not self.live:
            slots.clear()  # frees the list's storage
        elif not i:
            n = 1
            while slots[n] is None:
                n += 1
            del slots[:n]
            self.base += n
        return p

    def newest(self) -> _Tx | None:
        """The packet under the highest key held."""
        slots = self.slots
        i = len(slots) - 1
        while i >= 0:
            p = slots[i]
            if p is not None:
                return p
            i -= 1
        return None

    def clear(self) -> None:
        self.slots.clear()
        self.live = 0


_NO_WINDOW: Final = _Window()
"""A requester's ``outstanding`` and ``by_order`` until it posts a Write (shared, only ever read or cleared:
nothing is sent without a Write)."""


class Requester:
    __deletable__ = ("qp",)  # `Qp.detach` breaks the cycle (compiled: only listed attributes can be deleted)

    def __init__(self, qp: Qp) -> None:
        self.qp = qp
        self.wrs = _NONE_POSTED  # posted, not yet completed, in post order
        self.unsent = _NONE_POSTED  # posted, not every packet sent yet
        self.outstanding = _NO_WINDOW  # seq -> packet, unacknowledged
        self.by_order = _NO_WINDOW  # transmission order -> packet in flight
        self.retx: list[int] = []  # heap of lost seqs awaiting retransmission
        self.next_seq = 0
        self.cack = 0
        self.inflight = 0
        self.order = 0
        self.acked_order = -1
        self.msn = 0
        self.rqmsn = 0
        self.imm_inflight = 0
        self.peer_mpr = 0
        self.srtt = 0
        self.rttvar = 0
        self.rtt_min = 0  # the smallest RTT sample: no answer to a transmission can come back sooner
        # Set when emit() stopped with work left (window, cwnd, WIMM, no usable EV); any feedback (ACK,
        # NACK, timer, EV or port change, new WR) clears it, so idle polls skip the QP.
        self.blocked = False
        self.rto_deadline: int | None = None
        self.check_deadline: int | None = None  # tail loss check / probe (see the module docstring)
        self.tlp_order = 0  # the transmission the last tail loss probe followed; one probe per tail
        self.timeouts = 0
        self.cc: CongestionControl | None = None
        self.cc_on_send = False
        self.probe_id = 0
        self.pending_probes: list[EvEntry] = []  # probes the timer found due, sent by the next emit()
        self.plane_probe_at: int | None = None  # next probe of the doubted planes (while there is work)
        cfg = qp.nic.config  # frozen: per-packet paths read these copies
        self.probe_interval = cfg.probe_interval_ns
        self._peer_port_alive = qp.nic.peer_port_alive
        self.mtu = cfg.mtu
        self.reorder_allowance = cfg.reorder_allowance
        self.sack_delay = cfg.sack_delay_ns
        self.congested_at = -(1 << 62)  # last trim or ECN echo (see `_loss_wait`)
        self.base_rtt = cfg.base_rtt_ns
        self.stats = qp.nic.stats
        self.qp_num = qp.qp_num
        self.dest_qp = 0
        self.peer: Hashable = None
        self.mpr = 1
        self.dynamic_mpr = False

    # -- setup ---------------------------------------------------------------------------------------------
    def start(self, now: int) -> None:
        a = self.qp.attr
        assert a.sq_psn is not None
        self.next_seq = self.cack = a.sq_psn
        self.cc = self.qp.nic.make_cc(a.cc_profile_id or 0, now)
        self.cc_on_send = type(self.cc).on_send is not CongestionControl.on_send
        self.dest_qp = a.dest_qp_num or 0
        self.peer = a.peer
        self.mpr = a.mpr or 1  # fixed from RTS on (RTS -> RTS cannot change it, nor cap)
        self.dynamic_mpr = bool(int(a.cap or 0) & _DYNAMIC_MPR)

    def rto(self) -> int:
        a = self.qp.attr
        base = 1024 << (a.timeout or 0)
        lin = a.retry_linear or 0
        return base if self.timeouts <= lin else base << min(self.timeouts - lin, 32)

    def _retry_limit(self) -> float:
        a = self.qp.attr
        exp = a.retry_exp or 0
        return float("inf") if exp >= _INFINITE_EXP else (a.retry_linear or 0) + exp

    # -- posting -------------------------------------------------------------------------------------------
    def post(self, wr: SendWR, views: list[memoryview], total: int, signaled: bool) -> None:
        self.blocked = False
        w = _Wr(wr, views, total, signaled, self.qp.nic.config.mtu)
        if self.wrs is _NONE_POSTED:
            self.outstanding = _Window()
            self.by_order = _Window()
            self.wrs = deque()
            self.unsent = deque()
        self.wrs.append(w)
        self.unsent.append(w)

    # -- sending -------------------------------------------------------------------------------------------
    def emit(self, now: int, out: list[Transmit], budget: int = 1 << 61) -> int:
        """Append the packets this QP may send now (probes, then retransmissions, then new packets), at most
        ``budget`` data packets; returns how many data packets it appended."""
        qp = self.qp
        if qp.state is not _RTS:
            return 0
        evs = qp.evs
        cc = self.cc
        assert evs is not None and cc is not None
        if evs.bad:
            for bad in evs.due_probes(now, self._pto()):  # probes are tiny and not window-limited
                self._probe(bad, now, out)
        if self.pending_probes:
            for e in self.pending_probes:
                self._probe(e, now, out)
            self.pending_probes = []
        if evs.doubted and self.wrs:
            if self.plane_probe_at is None or now >= self.plane_probe_at:
                for e in evs.plane_probes():
                    self._probe(e, now, out)
                self.plane_probe_at = now + max(self.probe_interval, self._pto())
        elif self.plane_probe_at is not None:
            self.plane_probe_at = None
        if budget <= 0:  # a pacing driver polls often with no room left: nothing more to do but stay polled
            self.blocked = False
            return 0
        sent = self._retransmit(now, out, budget) if self.retx else 0
        if self.retx:
            self.stats.tx_data += sent
            self.blocked = sent < budget
            if self.rto_deadline is None:
                self.rto_deadline = now + self.rto()
            return sent
        unsent = self.unsent
        if unsent and sent < budget:
            mtu = self.mtu
            mpr = self.mpr
            if self.peer_mpr and self.dynamic_mpr:
                mpr = min(mpr, self.peer_mpr)
            limit = self.cack + mpr * 128
            outstanding = self.outstanding
            while unsent and sent < budget:
                w = unsent[0]
                seq = self.next_seq
                if seq >= limit:
                    break
                i = w.next_index
                offset = i * mtu
                size = w.total - offset
                if size > mtu:
                    size = mtu
                if not cc.can_send(self.inflight, size):
                    break
                if i == 0:
                    max_wimm = qp.attr.max_wimm or 0
                    if w.imm and max_wimm and self.imm_inflight >= max_wimm:
                        break
                    ev = evs.pick()
                    if ev is None:
                        break
                    w.first_seq = seq
                    w.msn = self.msn = (self.msn + 1) & 0xFFFF
                    if w.imm:
                        self.rqmsn = (self.rqmsn + 1) & 0xFFFF
                        self.imm_inflight += 1
                    w.rqmsn = self.rqmsn
                    w.tpl = DataTemplate(self.dest_qp, w.rqmsn, w.msn, w.rkey, w.total, w.imm_data)
                else:
                    ev = evs.pick()
                    if ev is None:
                        break
                p = _Tx(seq, w, size, ev)
                outstanding.add(seq, p)
                self.next_seq = seq + 1
                w.next_index = i = i + 1
                if i == w.npkts:
                    unsent.popleft()
                self._transmit(p, ev, now, out, False)
                sent += 1
        self.stats.tx_data += sent
        self.blocked = bool(unsent) and sent < budget  # out of budget is not blocked: poll again
        if unsent and self.rto_deadline is None:
            self.rto_deadline = now + self.rto()  # work, nothing in flight, no path: see on_timer
        return sent

    def _retransmit(self, now: int, out: list[Transmit], budget: int) -> int:
        """The lost packets, oldest PSN first, each on a fresh EV; returns how many were sent."""
        evs, cc = self.qp.evs, self.cc
        assert evs is not None and cc is not None
        retx = self.retx
        sent = 0
        while retx and sent < budget:
            p = self.outstanding.get(retx[0])
            if p is None or not p.lost:
                _heappop(retx)
                continue
            if not cc.can_send(self.inflight, p.size):
                break
            ev = evs.pick(p.entry)
            if ev is None:
                break
            _heappop(retx)
            p.lost = False
            self._transmit(p, ev, now, out, True)
            sent += 1
        self.stats.retransmits += sent
        return sent

    def _transmit(self, p: _Tx, ev: EvEntry, now: int, out: list[Transmit], rtx: bool) -> None:
        # Per-packet hot path: positional constructors, no keyword calls, nothing optional computed twice;
        # the caller counts tx_data and retransmits.
        w = p.wr
        i = p.seq - w.first_seq
        last = i == w.npkts - 1
        offset = i * self.mtu
        size = p.size
        if not size:
            payload = _EMPTY
        elif w.view is not None:
            payload = w.view[offset : offset + size]
        else:
            payload = w.payload(offset, size)
        assert w.tpl is not None
        op = w.op_first if i == 0 else (w.op_last if last else OP_WRITE_MIDDLE)
        p.entry = ev
        p.sent_at = now
        if rtx:
            p.resent = True
        self.order = order = self.order + 1
        p.order = order
        self.by_order.add(order, p)
        self.inflight += size
        if self.cc_on_send:
            self.cc.on_send(now, size, self.inflight)  # type: ignore[union-attr]
        if self.rto_deadline is None:
            self._arm(now)
        out.append(
            data_transmit(
                ev.port,
                self.peer,
                ev.expanded,
                ev.entropy,
                self.qp_num,
                w.tpl,
                op,
                last,
                rtx,
                p.seq & PSN_MASK,
                w.va + offset,
                payload,
            )
        )

    def _probe(self, ev: EvEntry, now: int, out: list[Transmit]) -> None:
        qp = self.qp
        self.probe_id = (self.probe_id + 1) & 0xFFFF
        pkt = Packet(
            BTH(Opcode.PROBE, dest_qp=qp.attr.dest_qp_num or 0, psn=self.next_seq & PSN_MASK),
            peth=PETH(
                probe_id=self.probe_id,
                src_qp=qp.qp_num & 0xFFFF,
                dst_qp=(qp.attr.dest_qp_num or 0) & 0xFFFF,
                tx_timestamp=(now >> 7) & 0xFFFF,
            ),
        )
        qp.nic.stats.probes_sent += 1
        ev.probe_out = True
        out.append(Transmit(ev.port, qp.attr.peer, ev.expanded, ev.entropy, pkt, qp.qp_num, 0))

    # -- acknowledgements ----------------------------------------------------------------------------------
    def on_sack(self, pkt: Packet, now: int) -> None:
        """A SACK as a `Packet` (the byte path, the pair harness): its SETH's fields to `on_sack_fields`."""
        seth = pkt.seth
        assert seth is not None
        self.on_sack_fields(
            seth.cack_psn,
            seth.ack_psn_offset,
            seth.sack_offset,
            seth.bitmap,
            seth.entropy,
            seth.m,
            seth.pr,
            seth.src_qp,
            seth.dst_qp,
            seth.mpr,
            now,
        )

    def on_sack_fields(
        self,
        cack_psn: int,
        ack_psn_offset: int,
        sack_offset: int,
        bitmap: int,
        entropy: int,
        m: int,
        pr: bool,
        src_qp: int,
        dst_qp: int,
        mpr: int,
        now: int,
    ) -> None:
        """A SACK by its SETH fields (QP numbers as SETH carries them: their low 16 bits); a simulated peer's
        `SackTransmit` arrives this way, with no `Packet` built."""
        qp = self.qp
        if qp.state is not _RTS:
            return
        wire_cack = cack = unwrap_psn(cack_psn, self.cack)
        bm = bitmap
        next_seq = self.next_seq
        evs = qp.evs
        assert evs is not None
        e = evs.find(entropy)
        if (
            dst_qp != self.qp_num & 0xFFFF
            or src_qp != self.dest_qp & 0xFFFF
            or cack > next_seq + self.mpr * 128  # beyond any window the responder can have
            or cack < self.cack - self.mpr * 128  # older than anything still useful
            or (pr and (e is None or not evs.probe_matches(e)))  # answers no outstanding probe
        ):
            self.stats.rx_bogus_ack += 1
            return
        self.blocked = False
        if cack > next_seq:
            # The responder took a forged Write at PSNs we have not sent yet (RDMA has no authentication),
            # so its cumulative PSN passed them: everything we did send is acknowledged, nothing more.
            cack = next_seq
        trig = self.outstanding.get(wire_cack + ack_psn_offset)
        rtt = now - trig.sent_at if trig is not None and not trig.resent else None
        if rtt is not None:
            if not self.srtt:
                self.srtt, self.rttvar = rtt, rtt >> 1
            else:  # RFC 6298 smoothing
                self.rttvar = (3 * self.rttvar + abs(self.srtt - rtt)) >> 2
                self.srtt = (7 * self.srtt + rtt) >> 3
            if rtt < self.rtt_min or not self.rtt_min:
                self.rtt_min = rtt
        outstanding = self.outstanding
        acked = []
        if cack > self.cack:
            for seq in range(self.cack, cack):
                p = outstanding.pop(seq)
                if p is not None:
                    acked.append(p)
            self.cack = cack
        if bm:
            base = wire_cack + sack_offset
            if base + bm.bit_length() > next_seq:
                # Bits for PSNs never sent: a forged packet the responder placed there (RDMA has no
                # authentication). They tell nothing about our packets; the rest of the SACK does.
                bm &= (1 << max(next_seq - base, 0)) - 1
            while bm:
                low = bm & -bm
                seq = base + low.bit_length() - 1
                p = outstanding.pop(seq)
                if p is not None:
                    acked.append(p)
                bm ^= low
        newly = 0  # bytes
        npkts = len(acked)  # packets (zero-length Writes acknowledge no bytes)
        if acked:
            by_order = self.by_order
            top = self.acked_order
            for p in acked:
                size = p.size
                if p.suspect is not None:
                    self._judge(p, now)
                if not p.lost:
                    self.inflight -= size
                order = p.order
                by_order.pop(order)  # (gone already if it was inferred lost)
                if order > top:
                    top = order
                p.wr.acked += 1
                newly += size
            self.acked_order = top
        assert self.cc is not None
        if e is not None:
            if pr:
                if not (evs.port_mask >> (e.port - 1)) & 1:
                    self._peer_port_alive(self.peer, e.port)  # a doubted plane answered
                evs.probe_answered(e, now, m == _M_NONE)
            elif m == _SKIP_ONCE:
                self.congested_at = now
                evs.skip(e)
            elif m == _ALWAYS_SKIP:
                evs.mark_bad(e, now)
        if mpr:
            self.peer_mpr = mpr
        if npkts:
            self.timeouts = 0
            self.cc.on_ack(now, newly, self.inflight, rtt, m == _SKIP_ONCE)
            self._arm(now)
            self.check_deadline = now + self._tlp_wait(now)  # cleared below when nothing is outstanding
            self._detect_losses(now)
            self._complete()
        if not outstanding.live:
            self.check_deadline = None
            if not self.unsent:
                self.rto_deadline = None

    def _pto(self) -> int:
        """How long an EV probe waits for its answer (and the least spacing of plane probes): 2·srtt plus
        the responder's SACK coalescing delay, at least half the base RTT (2 · base RTT before the first
        sample). The base RTT is the longest path's: a QP whose paths are shorter (within one T0) must not
        wait two long RTTs to learn that a path is back."""
        srtt = self.srtt
        if not srtt:
            return 2 * self.base_rtt
        pto = 2 * srtt + self.sack_delay
        floor = self.base_rtt >> 1
        return pto if pto > floor else floor

    def _loss_wait(self, now: int) -> int:
        """How old a packet must be before an acknowledgement of later ones proves it lost (RACK's
        ``srtt + reo_wnd``). On quiet paths, srtt + max(4·rttvar, srtt/4) (RACK's default reordering
        window is a quarter of the minimum RTT): measured on this QP's paths, not floored at the fabric's
        longest ``base_rtt``, so a short path (one T0) does not wait several of its RTTs per random loss
        (what a collective's small steps cost); the responder acknowledges at once a late packet that
        fills a hole above another or closes the last one, so its SACK is not held back by the coalescing
        delay. While the QP sees congestion
        (a trim or an ECN echo within the last `_CONGESTED_RTTS` RTTs) queues differ from path to path
        by far more than the RTT samples show: then max(2·srtt, srtt + 4·rttvar, base_rtt), since with
        trimming a congested packet is late, not lost. Before the first RTT sample, ``base_rtt``."""
        srtt = self.srtt
        if not srtt:
            return self.base_rtt
        if now - self.congested_at < _CONGESTED_RTTS * max(srtt, self.base_rtt):
            # max(2·srtt, srtt + 4·rttvar, base_rtt) in comparisons (the compiled build calls the
            # generic builtin for a max of three)
            wait = srtt + 4 * self.rttvar
            if wait < 2 * srtt:
                wait = 2 * srtt
            return wait if wait > self.base_rtt else self.base_rtt
        return srtt + max(4 * self.rttvar, srtt >> 2)

    def _tlp_wait(self, now: int) -> int:
        """How long after the newest transmission, with no acknowledgement of it, a tail loss probe
        goes: the loss wait plus the responder's SACK coalescing delay (the newest packet may be one
        whose SACK is held back)."""
        return self._loss_wait(now) + self.sack_delay

    def _detect_losses(self, now: int) -> None:
        acked_order = self.acked_order
        threshold = acked_order - self.reorder_allowance
        tail = self.order - self.reorder_allowance  # later than this, fewer than the allowance follow
        # ...and only once it is older than the loss wait (`_loss_wait`)
        wait = self._loss_wait(now)
        sent_before = now - wait
        by_order = self.by_order
        base = by_order.base
        lost: list[_Tx] = []
        for i, p in enumerate(by_order.slots):  # oldest transmission first
            if p is None:
                continue
            order = base + i
            if order >= acked_order or (order >= threshold and order <= tail):
                break  # nothing later acknowledged, or not enough of it yet
            if p.sent_at > sent_before:
                due = p.sent_at + wait  # the count is there, the age not yet: look again then
                if self.check_deadline is None or due < self.check_deadline:
                    self.check_deadline = due
                break
            lost.append(p)
        if not lost:
            return
        evs = self.qp.evs
        assert evs is not None and self.cc is not None
        for p in lost:
            by_order.pop(p.order)
            self._lose(p)
            # Skipped now, blamed (ASSUMED_BAD) only once the retransmission shows the original was
            # really lost (`_judge`): a packet held in deep queues is late, not lost.
            evs.skip(p.entry)
            if p.suspect is None:
                p.suspect = p.entry
        self.stats.losses_inferred += 1
        self.cc.on_loss(now, self.inflight)

    def _judge(self, p: _Tx, now: int) -> None:
        """``p``, inferred lost on EV ``p.suspect``, is acknowledged: if the answer came sooner after the
        retransmission than any answer can (or before the retransmission left), the original arrived late
        and its EV is not to blame; otherwise the original was lost on it, and the EV is ASSUMED_BAD."""
        e = p.suspect
        p.suspect = None
        assert e is not None
        if p.lost or now - p.sent_at < (self.rtt_min or self.base_rtt):
            self.stats.spurious_losses += 1
            return
        self.qp.evs.mark_bad(e, now)  # type: ignore[union-attr]

    def _check_tail(self, now: int) -> None:
        """The check timer (cleared by the caller; `_detect_losses` may set it again): infer tail losses,
        else probe the tail once if nothing came back for a PTO."""
        if not self.by_order.live:
            return
        self._detect_losses(now)
        p = self.by_order.newest()
        if self.retx or p is None:
            return
        order = p.order
        tlp = self._tlp_wait(now)
        if order > self.tlp_order and p.sent_at + tlp <= now:
            self.tlp_order = self.order + 1  # the probe's own transmission: no second probe for it
            self.by_order.pop(order)
            self._lose(p)  # resent on a fresh EV, RTX set; its EV keeps its state
            self.stats.tail_probes += 1
        elif self.check_deadline is None and p.sent_at + tlp > now:
            self.check_deadline = p.sent_at + tlp
        # else the newest transmission is the tail probe itself, overdue: only the retransmission timeout
        # can tell more now (re-arming the check in the past would spin the driver's timer)

    def _lose(self, p: _Tx) -> None:
        if not p.lost:
            p.lost = True
            self.inflight -= p.size
            _heappush(self.retx, p.seq)

    def _complete(self) -> None:
        wrs = self.wrs
        qp = self.qp
        while wrs and wrs[0].acked >= wrs[0].npkts:
            w = wrs.popleft()
            if w.imm:
                self.imm_inflight -= 1
            if w.signaled:
                qp.send_cq.push(
                    WorkCompletion(
                        w.wr.wr_id, WcStatus.SUCCESS, WcOpcode.RDMA_WRITE, w.total, None, qp.qp_num
                    )
                )

    def on_nack(self, pkt: Packet, now: int) -> None:
        neth, qp = pkt.neth, self.qp
        assert neth is not None
        if qp.state is not _RTS:
            return
        stats = self.stats
        p = self.outstanding.get(unwrap_psn(neth.psn, self.cack))
        if (
            p is None
            or neth.psn != pkt.bth.psn
            or neth.dst_qp != self.qp_num & 0xFFFF
            or neth.src_qp != self.dest_qp & 0xFFFF
        ):
            stats.rx_bogus_ack += 1  # about no packet in flight: stale, duplicated or forged
            return
        self.blocked = False
        stats.nacks_received += 1
        if neth.reason == _UNEXP_EVENT:
            qp.set_error(now, WcStatus.REM_OP_ERR)
            return
        trimmed = neth.reason == _TRIMMED or neth.reason == _TRIMMED_LASTHOP
        if trimmed:
            p.suspect = None  # if it was inferred lost: trimmed, so congestion, not its path's failure
        if p.lost:
            return
        assert self.cc is not None and qp.evs is not None
        if trimmed:
            stats.trims_received += 1
            self.congested_at = now
            last_hop = neth.reason == _TRIMMED_LASTHOP
            e = qp.evs.find(neth.entropy)
            if e is not None and not last_hop:
                qp.evs.skip(e)
            # The EV is not to blame for a last-hop trim, but the window is: our responder sends no receiver
            # CC penalty (CC_STATE rcv_cwnd_pen), so NSCC must see last-hop incast trims as trims.
            self.cc.on_trim(now, p.size, self.inflight, False)
            # A trim proves the path and the peer alive: the retransmission timer, which is there to find
            # silent losses, starts again (a sender whose every packet meets a full last hop would
            # otherwise time out and blame its EVs for congestion; the NACK retry limit still holds).
            self._arm(now)
        p.retries += 1
        if p.retries > self._retry_limit():
            qp.set_error(now, WcStatus.RETRY_EXC_ERR)
            return
        self.by_order.pop(p.order)
        self._lose(p)

    def on_aeth(self, pkt: Packet, now: int) -> None:
        aeth = pkt.aeth
        assert aeth is not None
        status = {
            AethSyndrome.NAK_REMOTE_ACCESS_ERROR: WcStatus.REM_ACCESS_ERR,
            AethSyndrome.NAK_INVALID_REQUEST: WcStatus.REM_INV_REQ_ERR,
            AethSyndrome.NAK_REMOTE_OPERATIONAL_ERROR: WcStatus.REM_OP_ERR,
        }.get(aeth.syndrome)  # type: ignore[call-overload]
        if self.qp.state is not _RTS:
            return
        if self.outstanding.get(unwrap_psn(pkt.bth.psn, self.cack)) is None:
            self.stats.rx_bogus_ack += 1  # about no packet in flight: stale, duplicated or forged
            return
        if status is not None:
            self.qp.set_error(now, status)

    # -- timers --------------------------------------------------------------------------------------------
    def _arm(self, now: int) -> None:
        self.rto_deadline = now + self.rto() if self.outstanding.live else None

    def on_timer(self, now: int) -> None:
        self.blocked = False
        qp = self.qp
        if qp.state is not _RTS:
            return
        evs = qp.evs
        assert evs is not None
        if evs.bad:  # due probes leave with the next emit(); their schedule moves on now
            self.pending_probes.extend(evs.due_probes(now, self._pto()))
        if self.plane_probe_at is not None and now >= self.plane_probe_at:
            if evs.doubted and self.wrs:
                self.pending_probes.extend(evs.plane_probes())
                self.plane_probe_at = now + max(self.probe_interval, self._pto())
            else:
                self.plane_probe_at = None
        if self.check_deadline is not None and now >= self.check_deadline:
            self.check_deadline = None
            self._check_tail(now)
        if self.rto_deadline is None or now < self.rto_deadline:
            return
        if not self.outstanding.live and not self.unsent:
            self.rto_deadline = None
            return
        self.timeouts += 1
        qp.nic.stats.timeouts += 1
        if self.timeouts > self._retry_limit():
            qp.set_error(now, WcStatus.RETRY_EXC_ERR)
            return
        if not self.outstanding.live:  # work and no path (doubted planes are probed on their own schedule)
            self.rto_deadline = now + self.rto()
            return
        assert self.cc is not None
        for p in self.by_order.values():
            self._lose(p)
            evs.mark_bad(p.entry, now)
        self.by_order.clear()
        self.cc.on_loss(now, self.inflight)
        self.rto_deadline = now + self.rto()
        self.check_deadline = None

    # -- errors --------------------------------------------------------------------------------------------
    def fail_head(self, status: WcStatus) -> None:
        """Complete the oldest outstanding WR with ``status`` (the cause of a QP error)."""
        if self.wrs:
            w = self.wrs.popleft()
            if w in self.unsent:
                self.unsent.remove(w)
            qp = self.qp
            qp.send_cq.push(WorkCompletion(w.wr.wr_id, status, WcOpcode.RDMA_WRITE, 0, None, qp.qp_num))

    def flush(self) -> None:
        """ERROR: every outstanding WR completes with WR_FLUSH_ERR (signaled or not); nothing more is sent."""
        qp = self.qp
        while self.wrs:
            w = self.wrs.popleft()
            qp.send_cq.push(
                WorkCompletion(w.wr.wr_id, WcStatus.WR_FLUSH_ERR, WcOpcode.RDMA_WRITE, 0, None, qp.qp_num)
            )
        self.unsent.clear()
        self.outstanding.clear()
        self.by_order.clear()
        self.retx.clear()
        self.inflight = 0
        self.rto_deadline = None
        self.check_deadline = None
        self.plane_probe_at = None
        self.pending_probes = []
