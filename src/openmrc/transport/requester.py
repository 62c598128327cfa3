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
Retransmissions go first, oldest PSN first, with BTH.RTX set, each on a fresh EV.

What is lost, when, whose fault it was, the retransmission timer and the probes are the business of the
QP's `openmrc.transport.recovery.Recovery` (``rec``): this module tells it what was sent and what each
acknowledgement acknowledged. A NACK queues its PSN at once (TRIMMED: the EV is skipped for the rotation;
TRIMMED_LASTHOP: no EV penalty; both restart the retransmission timer, since a trim proves the path alive;
UNEXP_EVENT: the QP fails); a packet NACKed more times than the retry counts allow fails the QP with
RETRY_EXC_ERR.

A QP with work but no usable path (every plane down locally, or said down by the peer, or every EV
denied) and nothing in flight keeps the retransmission timer all the same: each expiry counts against the
retry budget, and when it runs out the QP goes to ERROR with RETRY_EXC_ERR and every WR is flushed. While
it has work, a QP probes each *doubted* plane (up locally, down by the peer's word), so a wrong or stale
port status update is found out by the first answer; a port coming back resumes it. Probes the timer finds
due are queued and leave with the next `emit`, so the timer always moves past ``now``.

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
import warnings
from collections import deque
from collections.abc import Hashable
from typing import TYPE_CHECKING, Final

from openmrc.transport.evtable import EvEntry
from openmrc.transport.recovery import Recovery
from openmrc.transport.sent import NO_WINDOW, NONE_POSTED, PostedWrite, SentPacket, Window
from openmrc.transport.types import (
    AckTimeoutWarning,
    QpCapFlags,
    QpState,
    SendWR,
    Transmit,
    WcOpcode,
    WcStatus,
    WorkCompletion,
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
from openmrc.wire.constants import OP_WRITE_MIDDLE

if TYPE_CHECKING:
    from openmrc.transport.qp import Qp

__all__ = ["Requester"]

# Final: the compiled build calls these through C statics (``heapq.heappush`` is an attribute lookup per call)
_heappop: Final = heapq.heappop
_heappush: Final = heapq.heappush

_DYNAMIC_MPR: Final = int(QpCapFlags.DYNAMIC_MPR)  # a plain int: see the responder's
_EMPTY: Final = memoryview(b"")
# Enum members as plain globals: an Enum class attribute lookup costs more than the rest of a test.
_RTS: Final = QpState.RTS
_M_NONE: Final = SackM.NONE
_SKIP_ONCE: Final = SackM.SKIP_ONCE
_ALWAYS_SKIP: Final = SackM.ALWAYS_SKIP
_TRIMMED: Final = NackReason.TRIMMED
_TRIMMED_LASTHOP: Final = NackReason.TRIMMED_LASTHOP
_UNEXP_EVENT: Final = NackReason.UNEXP_EVENT
_NO_PKT_BUFFER: Final = NackReason.NO_PKT_BUFFER


class Requester:
    __deletable__ = ("qp",)  # `Qp.detach` breaks the cycle (compiled: only listed attributes can be deleted)

    def __init__(self, qp: Qp) -> None:
        self.qp = qp
        self.wrs = NONE_POSTED  # posted, not yet completed, in post order
        self.unsent = NONE_POSTED  # posted, not every packet sent yet
        self.outstanding = NO_WINDOW  # seq -> packet, unacknowledged
        self.next_seq = 0
        self.cack = 0
        self.msn = 0
        self.rqmsn = 0
        self.imm_inflight = 0
        self.peer_mpr = 0
        # Set when emit() stopped with work left (window, cwnd, WIMM, no usable EV); any feedback (ACK,
        # NACK, timer, EV or port change, new WR) clears it, so idle polls skip the QP.
        self.blocked = False
        self.probe_id = 0
        cfg = qp.nic.config  # frozen: per-packet paths read these copies
        self._peer_port_alive = qp.nic.peer_port_alive
        self.mtu = cfg.mtu
        self.stats = qp.nic.stats
        self.rec = Recovery(cfg, self.stats, qp.set_error)
        self.qp_num = qp.qp_num
        self.dest_qp = 0
        self.peer: Hashable = None
        self.mpr = 1
        self.dynamic_mpr = False

    # -- setup ---------------------------------------------------------------------------------------------
    def start(self, now: int) -> None:
        qp = self.qp
        a = qp.attr
        assert a.sq_psn is not None and qp.evs is not None
        self.next_seq = self.cack = a.sq_psn
        self.rec.start(qp.nic.make_cc(a.cc_profile_id or 0, now), qp.evs, now)
        self.configure()
        self.dest_qp = a.dest_qp_num or 0
        self.peer = a.peer
        self.mpr = a.mpr or 1  # fixed from RTS on (RTS -> RTS cannot change it, nor cap)
        self.dynamic_mpr = bool(int(a.cap or 0) & _DYNAMIC_MPR)

    def configure(self) -> None:
        """The QP's timeout and retry attributes changed (RTS, RTS -> RTS). A timeout below the NIC's floor
        is raised to it, with an `AckTimeoutWarning` saying so."""
        a = self.qp.attr
        t = a.timeout or 0
        rec = self.rec
        rec.configure(t, a.retry_linear or 0, a.retry_exp or 0)
        if rec.rto_base > 1024 << t:
            warnings.warn(
                f"timeout={t} (1.024 µs · 2^{t} = {(1024 << t) / 1e6:.3g} ms) is below this NIC's floor: "
                f"the ACK timeout is {rec.rto_base / 1e6:.3g} ms (NicConfig.min_ack_timeout_ns; a software "
                "NIC is descheduled for milliseconds, and a shorter timeout only fires for nothing)",
                AckTimeoutWarning,
                stacklevel=2,
            )

    @property
    def cc(self) -> object:
        """The QP's congestion control (`Recovery.cc`)."""
        return self.rec.cc

    @property
    def srtt(self) -> int:
        return self.rec.srtt

    @property
    def inflight(self) -> int:
        """Bytes in flight (`Recovery.inflight`)."""
        return self.rec.inflight

    # -- posting -------------------------------------------------------------------------------------------
    def post(self, wr: SendWR, views: list[memoryview], total: int, signaled: bool) -> None:
        self.blocked = False
        w = PostedWrite(wr, views, total, signaled, self.qp.nic.config.mtu)
        if self.wrs is NONE_POSTED:
            self.outstanding = Window()
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
        rec = self.rec
        cc = rec.cc
        assert evs is not None and cc is not None
        if evs.bad or rec.pending_probes or evs.doubted or rec.plane_probe_at is not None:
            probes: list[EvEntry] = []
            rec.collect_probes(now, bool(self.wrs), probes)  # tiny and not window-limited
            for e in probes:
                self._probe(e, now, out)
        if budget <= 0:  # a pacing driver polls often with no room left: nothing more to do but stay polled
            self.blocked = False
            if (self.unsent or rec.retx) and rec.rto_deadline is None:
                # work and no room (or no port at all): the timer stands, whatever the driver's budget
                rec.rto_deadline = now + rec.rto()
            return 0
        after_rto = rec.rto_sends >= 0
        if after_rto:  # one packet after a timeout, until an acknowledgement comes (`Recovery.on_timer`)
            if rec.rto_sends == 0:
                self.blocked = True
                return 0
            budget = rec.rto_sends
        sent = self._retransmit(now, out, budget) if rec.retx else 0
        if rec.retx:
            self.stats.tx_data += sent
            self.blocked = sent < budget or after_rto
            if after_rto:
                rec.rto_sends -= sent
            if rec.rto_deadline is None:
                rec.rto_deadline = now + rec.rto()
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
                if not cc.can_send(rec.inflight, size):
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
                p = SentPacket(seq, w, size, ev)
                outstanding.add(seq, p)
                self.next_seq = seq + 1
                w.next_index = i = i + 1
                if i == w.npkts:
                    unsent.popleft()
                self._transmit(p, ev, now, out, False)
                sent += 1
        self.stats.tx_data += sent
        # out of budget is not blocked (poll again), out of the one packet a timeout allows is
        self.blocked = bool(unsent) and (sent < budget or after_rto)
        if after_rto:
            rec.rto_sends -= sent
        if unsent and rec.rto_deadline is None:
            rec.rto_deadline = now + rec.rto()  # work, nothing in flight, no path: see on_timer
        return sent

    def _retransmit(self, now: int, out: list[Transmit], budget: int) -> int:
        """The lost packets, oldest PSN first, each on a fresh EV; returns how many were sent."""
        evs, rec = self.qp.evs, self.rec
        cc = rec.cc
        assert evs is not None and cc is not None
        retx = rec.retx
        sent = 0
        while retx and sent < budget:
            p = self.outstanding.get(retx[0])
            if p is None or not p.lost:
                _heappop(retx)
                continue
            if not cc.can_send(rec.inflight, p.size):
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

    def _transmit(self, p: SentPacket, ev: EvEntry, now: int, out: list[Transmit], rtx: bool) -> None:
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
        if rtx:
            p.sends += 1
        self.rec.on_sent(p, now)
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
        svc: int = 0,
    ) -> None:
        """A SACK by its SETH fields (QP numbers as SETH carries them: their low 16 bits; ``svc``: the
        responder's service time in ns, 0 if not reported): the one way a SACK reaches the requester,
        whatever shape it arrived in (`Nic` reads them from a decoded `Packet`'s SETH, or from a
        simulated peer's `SackTransmit` with no `Packet` built)."""
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
            or cack > next_seq  # acknowledges PSNs never sent: cannot be true
            or cack < self.cack - self.mpr * 128  # older than anything still useful
            or (bm and wire_cack + sack_offset + bm.bit_length() > next_seq)  # a bit for a PSN never sent
            or (pr and (e is None or not evs.probe_matches(e)))  # answers no outstanding probe
        ):
            # Forged, or the responder took a forged Write at PSNs not sent yet (RDMA has no
            # authentication): believed, it would have the requester take unsent or lost data for
            # delivered. Dropped; a QP that hears nothing else times out (RETRY_EXC_ERR), not stalls.
            self.stats.rx_bogus_ack += 1
            return
        self.blocked = False
        rec = self.rec
        rec.heard(now)
        outstanding = self.outstanding
        trig_seq = wire_cack + ack_psn_offset
        trig = outstanding.get(trig_seq)
        # (a probe's answer names the cumulative PSN as its trigger: it times the probe, not that packet)
        rtt = now - trig.sent_at if trig is not None and not trig.sends and not pr else None
        if rtt is not None:
            rec.rtt_sample(rtt)
        if svc:
            rtt = rec.peer_service(svc, rtt, now)
        if not pr:
            rec.on_trigger(trig_seq, entropy, trig, now)
        acked = []
        advanced = cack > self.cack
        if advanced:
            for seq in range(self.cack, cack):
                p = outstanding.pop(seq)
                if p is not None:
                    acked.append(p)
            self.cack = cack
        if bm:
            base = wire_cack + sack_offset
            while bm:
                low = bm & -bm
                seq = base + low.bit_length() - 1
                p = outstanding.pop(seq)
                if p is not None:
                    acked.append(p)
                bm ^= low
        newly = 0  # bytes
        npkts = len(acked)  # packets (zero-length Writes acknowledge no bytes)
        for p in acked:
            rec.on_acked(p, now, entropy if p is trig else -1)
            p.wr.acked += 1
            newly += p.size
        if e is not None:
            if pr:
                if not (evs.port_mask >> (e.port - 1)) & 1:
                    self._peer_port_alive(self.peer, e.port)  # a doubted plane answered
                evs.probe_answered(e, now, m == _M_NONE)
            elif m == _SKIP_ONCE:
                rec.congested_at = now
                evs.skip(e)
            elif m == _ALWAYS_SKIP:
                evs.mark_bad(e, now)
        if mpr:
            self.peer_mpr = mpr
        # (unacknowledged: below next_seq and not cumulatively acknowledged, whatever a bitmap said)
        unacked = self.cack < next_seq
        rec.on_ack_done(npkts, newly, rtt, m == _SKIP_ONCE, now, unacked)
        if npkts or advanced:
            self._complete()
        if not unacked and not self.unsent:
            rec.rto_deadline = None

    def _complete(self) -> None:
        """Complete the Writes the cumulative acknowledgement has passed, in order. (A SACK's bitmap alone
        completes nothing: a bit may be wrong, and the packet is sent again if the cumulative
        acknowledgement does not follow, `_renege`.)"""
        wrs = self.wrs
        qp = self.qp
        cack = self.cack
        while wrs and wrs[0].acked >= wrs[0].npkts and cack >= wrs[0].first_seq + wrs[0].npkts:
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
        seq = unwrap_psn(neth.psn, self.cack)
        p = self.outstanding.get(seq)
        ours = (
            neth.psn == pkt.bth.psn
            and neth.dst_qp == self.qp_num & 0xFFFF
            and neth.src_qp == self.dest_qp & 0xFFFF
        )
        if p is None or not ours:
            if ours and neth.reason == _NO_PKT_BUFFER and self._asked_again(seq, now):
                return
            stats.rx_bogus_ack += 1  # about no packet in flight: stale, duplicated or forged
            return
        self.blocked = False
        rec = self.rec
        rec.heard(now)
        stats.nacks_received += 1
        if neth.reason == _UNEXP_EVENT:
            qp.set_error(now, WcStatus.REM_OP_ERR)
            return
        trimmed = neth.reason == _TRIMMED or neth.reason == _TRIMMED_LASTHOP
        if trimmed:
            rec.clear_suspect(p)  # if it was inferred lost: trimmed, so congestion, not its path's failure
        if p.lost:
            return
        assert qp.evs is not None
        if trimmed:
            stats.trims_received += 1
            e = qp.evs.find(neth.entropy)
            if e is not None and neth.reason != _TRIMMED_LASTHOP:
                qp.evs.skip(e)  # (the EV is not to blame for a last-hop trim)
            rec.on_trimmed(p, now)
        p.retries += 1
        if p.retries > rec.retry_limit:
            qp.set_error(now, WcStatus.RETRY_EXC_ERR, f"PSN {p.seq & PSN_MASK} NACKed {p.retries} times")
            return
        rec.nacked(p)

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
    def on_timer(self, now: int) -> None:
        self.blocked = False
        if self.qp.state is not _RTS:
            return
        rec = self.rec
        timeouts = rec.timeouts
        rec.on_timer(now, bool(self.wrs), self.cack < self.next_seq, bool(self.unsent))
        if rec.timeouts > timeouts and self.qp.state is _RTS and self.cack < self.next_seq:
            self._renege(self.cack)

    def _asked_again(self, seq: int, now: int) -> bool:
        """The responder asks for PSN ``seq`` (a NACK for a hole that persists) and it is not outstanding:
        if a SACK's bitmap took it out of the window, it is sent again (True); if the cumulative
        acknowledgement had passed it (within the window), what was accepted was wrong and the Writes it
        completed may be missing data: the QP fails, naming it (True); else False (stale or forged)."""
        if self.cack <= seq < self.next_seq:
            self._renege(seq)
            return True
        if self.cack - self.mpr * 128 <= seq < self.cack:
            self.qp.set_error(
                now,
                WcStatus.REM_OP_ERR,
                f"the peer asks for PSN {seq & PSN_MASK} again, which an acknowledgement had covered (a "
                "forged or wrong SACK): Writes completed before may be missing data",
            )
            return True
        return False

    def _renege(self, seq: int) -> None:
        """A retransmission timeout with the cumulative acknowledgement at a packet a SACK's bitmap said had
        arrived (so it left the window), or a NACK asking for such a packet: the bitmap was wrong (forged,
        or about data never placed), and packet ``seq`` is sent again. Data is kept (the Write's memory)
        until the cumulative acknowledgement covers it (RFC 2018 §8: SACKed data may be reneged)."""
        if self.outstanding.get(seq) is not None:
            return  # in flight or queued: the timeout itself deals with it
        for w in self.wrs:
            if w.first_seq <= seq < w.first_seq + w.npkts:
                break
        else:
            return
        evs = self.qp.evs
        if evs is None or not evs.rotation:
            return
        size = w.total - (seq - w.first_seq) * self.mtu
        p = SentPacket(seq, w, size if size < self.mtu else self.mtu, evs.rotation[0])
        p.lost = True  # (not in flight: no bytes to take out)
        self.outstanding.put(seq, p)
        _heappush(self.rec.retx, seq)
        w.acked -= 1
        self.stats.sacks_reneged += 1

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
        self.rec.flush()
