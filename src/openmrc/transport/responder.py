"""The responder half of a QP: validation, direct placement, the receive bitmap, SACK/NACK generation and
in-order Write-with-Imm completion.

Theory of operation (MRC-SPEC-NOTES §3-§4)
------------------------------------------
The responder tracks PSNs ``[cack, cack + MPR_dest·128)`` with a bitmap (a Python int, bit i ↔ cack+i);
``cack`` is the cumulative PSN: every PSN before it has arrived. A data packet is accepted only if it lies
in that window, has not arrived before, its length fits the MTU and its position in the message
(First/Middle: a whole MTU; Last/Only: what the DMA length leaves), and R_Key, bounds and REMOTE_WRITE
allow the write. Only then is its payload written at RETH.VA, whatever order packets arrive in.

A duplicate is not rewritten, only re-acknowledged. A PSN beyond the window gets NACK PSN_OOR_WINDOW; a
trimmed packet NACK TRIMMED or TRIMMED_LASTHOP (unless the QP's cap says the peer cannot take them:
then it is dropped unanswered, as a loss); a protocol violation NACK UNEXP_EVENT (fatal for the
requester); an access violation AETH NAK remote access error. SACKs are coalesced: one every
``sack_every`` packets, or after ``sack_delay_ns``, and at once when a packet opens a hole, fills one
(later packets came first, so the requester's loss timer may be running on it: RFC 5681 §4.2; at the
cumulative PSN only when that leaves no hole, since spraying reorders a bulk transfer all the time),
arrives ECN-marked, asks for an ACK (last packet of a message), or is a duplicate or a probe. Each SACK
echoes the triggering packet's EV and ECN mark (M=SKIP_ONCE) and carries 64 bits of the bitmap starting
at the oldest arrival no SACK has reported yet (deep reordering over many paths would otherwise leave
arrivals that no 64-bit window ever covers, and the requester would retransmit them spuriously). A
duplicate's SACK reports the window from the cumulative PSN on instead (or the one ending at the
duplicate): a requester that resends what arrived missed a SACK, and what that SACK said is there.
Where the driver knows when a packet arrived and when its SACK leaves, the SACK carries the time its
trigger spent in this host (SETH ``svc``: `NicConfig.report_service_time`).

A hole below received packets that outlives four of the QP's retransmission timeouts is asked for: NACK
NO_PKT_BUFFER at the cumulative PSN ("send it again"), the wait doubling with each, and after
`_HOLE_NACKS` of them the QP fails (RETRY_EXC_ERR). A requester that recovers its losses never sees one; a
requester that took a forged acknowledgement for true learns from it (`openmrc.transport.requester`).

Write-with-Imm messages complete when the cumulative PSN passes their last packet, so completions come in
message (RQMSN) order even when the last packets of later messages arrive first; each consumes one posted
receive. More than ``max_wimm_dest`` such messages pending, or none posted, is fatal (MRC has no RNR).
"""

from __future__ import annotations

import heapq
from typing import TYPE_CHECKING, Final

from openmrc.transport.types import (
    QpCapFlags,
    QpState,
    SackTransmit,
    TrimMark,
    WcOpcode,
    WcStatus,
    WorkCompletion,
    unwrap_psn,
)
from openmrc.wire import (
    AETH,
    BTH,
    NETH,
    PSN_MASK,
    AethSyndrome,
    NackReason,
    Opcode,
    Packet,
    SackM,
)
from openmrc.wire.constants import (
    OP_WRITE_FIRST,
    OP_WRITE_LAST_WITH_IMM,
    OP_WRITE_MIDDLE,
    OP_WRITE_ONLY,
    OP_WRITE_ONLY_WITH_IMM,
)

if TYPE_CHECKING:
    from openmrc.transport.qp import Qp

__all__ = ["Responder"]

# Final: the compiled build calls these through C statics (``heapq.heappush`` is an attribute lookup per call)
_heappop: Final = heapq.heappop
_heappush: Final = heapq.heappush

_MASK64: Final = (1 << 64) - 1
# the flags as plain ints: a flag operation goes through the enum module's interpreted code (a tenth of
# setting up a large fabric's QPs, when it was per QP)
_DYNAMIC_MPR: Final = int(QpCapFlags.DYNAMIC_MPR)
_NO_TRIM_NACK: Final = int(QpCapFlags.TRIM_NACK_DEST_UNSUPPORTED)
_NO_SVC_TIME: Final = int(QpCapFlags.SVC_TIME_DEST_UNSUPPORTED)
_HOLE_NACKS: Final = 7
"""NACKs for a hole that persists before the responder gives up on it (`Responder._ask_for_hole`)."""
# Enum members as plain globals: an Enum class attribute lookup costs more than the rest of a test.
_M_NONE: Final = SackM.NONE
_SKIP_ONCE: Final = SackM.SKIP_ONCE
_RTR: Final = QpState.RTR
_RTS: Final = QpState.RTS
_TRIMMED_LASTHOP: Final = TrimMark.TRIMMED_LASTHOP


class Responder:
    __deletable__ = ("qp",)  # `Qp.detach` breaks the cycle (compiled: only listed attributes can be deleted)

    def __init__(self, qp: Qp) -> None:
        self.qp = qp
        self.cack = 0
        self.bitmap = 0
        self.unreported = 0  # received PSNs (bit i = cack+i) no SACK bitmap has carried yet
        self.window = 128
        self.rcvd_bytes = 0
        self.unacked = 0
        self.pending_imm: list[tuple[int, int, int]] = []  # heap of (last seq, imm, byte_len)
        self.sack_deadline: int | None = None
        # A hole below received packets that persists: asked for by a NACK (`on_timer`).
        self.hole_at = -1  # the cumulative PSN the hole was first seen at (-1: no hole)
        self.hole_since = 0  # when
        self.hole_deadline: int | None = None  # when to look at it (`on_timer`)
        self.hole_nacks = 0
        self._hole_port = self._hole_entropy = 0
        # The last arrival not yet acknowledged (when ``unacked``), for the delayed SACK; plain fields: no
        # tuple per packet.
        self._last_seq = self._last_entropy = self._last_port = self._last_ts = self._last_at = 0
        self._last_ecn = False
        self.adv_mpr = 0
        cfg = qp.nic.config  # frozen: per-packet paths read these copies
        self.mtu = cfg.mtu
        self.sack_every = cfg.sack_every
        self.sack_on_reorder = cfg.sack_on_reorder
        self.sack_delay = cfg.sack_delay_ns
        self._hole_floor = 16 * cfg.base_rtt_ns  # the least a hole's wait can be (`_hole_wait`)
        self.report_service = cfg.report_service_time  # (and the peer takes it: `start`)

    def start(self, now: int) -> None:
        a = self.qp.attr
        assert a.rq_psn is not None and a.mpr_dest is not None
        self.cack = a.rq_psn
        self.window = a.mpr_dest * 128
        self.adv_mpr = a.mpr_dest if int(a.cap or 0) & _DYNAMIC_MPR else 0
        # SVC_TIME_DEST_UNSUPPORTED: the peer cannot take a service time in its acknowledgements
        self.report_service = self.qp.nic.config.report_service_time and not int(a.cap or 0) & _NO_SVC_TIME

    # -- data ----------------------------------------------------------------------------------------------
    def on_fields(
        self,
        op: int,
        psn: int,
        ack_req: bool,
        va: int,
        rkey: int,
        dma: int,
        payload: memoryview,
        imm_data: int,
        ts: int,
        now: int,
        port: int,
        ecn: bool,
        entropy: int,
        trim: TrimMark,
    ) -> None:
        """A data packet, by its fields: the one way data reaches the responder, whatever shape it arrived
        in (`Nic` reads them from a decoded `Packet`, from a `Transmit`'s template or straight from a plain
        datagram's bytes, `openmrc.wire.plain_data_fields`). ``imm_data`` counts only for a Write with Imm;
        ``ts``: the TSETH timestamp (0: none)."""
        qp = self.qp
        nic = qp.nic
        stats = nic.stats
        state = qp.state
        if state is not _RTR and state is not _RTS:
            stats.rx_dropped_state += 1
            return
        cack = self.cack
        seq = unwrap_psn(psn, cack)
        d = seq - cack
        if d >= self.window:
            self._nack(NackReason.PSN_OOR_WINDOW, seq, entropy, port)
            return
        bitmap = self.bitmap
        if d < 0 or (bitmap >> d) & 1:
            stats.duplicates += 1
            self._sack(seq, entropy, port, ecn, now, 0, False, True)
            return
        if trim:
            stats.trims_seen += 1
            if int(qp.attr.cap or 0) & _NO_TRIM_NACK:
                # the peer cannot take a TRIM NACK (mrc.h TRIM_NACK_DEST_UNSUPPORTED): the trimmed packet
                # is dropped unanswered and the peer recovers it as a loss (SACK gap or timeout)
                stats.trims_unreported += 1
                return
            reason = NackReason.TRIMMED_LASTHOP if trim is _TRIMMED_LASTHOP else NackReason.TRIMMED
            self._nack(reason, seq, entropy, port)
            return
        n = len(payload)
        mtu = self.mtu
        if op in (OP_WRITE_FIRST, OP_WRITE_MIDDLE):
            ok = n == mtu and dma > mtu
        elif op in (OP_WRITE_ONLY, OP_WRITE_ONLY_WITH_IMM):
            ok = n == dma and n <= mtu
        else:  # LAST: what the DMA length leaves after whole MTUs
            ok = dma > mtu and n == dma - (-(-dma // mtu) - 1) * mtu
        if not ok:
            stats.protocol_errors += 1
            self._nack(NackReason.UNEXP_EVENT, seq, entropy, port)
            return
        if n and not nic.mrs.remote_write(rkey, va, payload, qp.pd):
            stats.access_errors += 1
            self._send(
                Packet(
                    BTH(Opcode.ACK, dest_qp=qp.attr.dest_qp_num or 0, psn=seq & PSN_MASK),
                    aeth=AETH(AethSyndrome.NAK_REMOTE_ACCESS_ERROR, self.cack & 0xFFFFFF),
                ),
                port,
            )
            return
        imm = op in (OP_WRITE_LAST_WITH_IMM, OP_WRITE_ONLY_WITH_IMM)
        if imm:
            _heappush(self.pending_imm, (seq, imm_data, dma))
            limit = qp.attr.max_wimm_dest or 0
            if limit and len(self.pending_imm) > limit:
                stats.protocol_errors += 1
                self._nack(NackReason.UNEXP_EVENT, seq, entropy, port)
                qp.set_error(now, WcStatus.REM_INV_REQ_ERR)
                return
        reorder = self.sack_on_reorder
        new_hole = reorder and d > 0 and not (bitmap >> (d - 1)) & 1
        # later packets came first: the sender may be judging it lost
        fills_hole = reorder and bitmap >> (d + 1) != 0
        bit = 1 << d
        bitmap |= bit
        self.rcvd_bytes += n
        stats.rx_data += 1
        if d == 0:
            t = (~bitmap & (bitmap + 1)).bit_length() - 1  # trailing ones
            self.bitmap = bitmap >> t
            fills_hole = fills_hole and not self.bitmap  # at cack: only when no hole is left above it
            self.unreported = (self.unreported | bit) >> t
            self.cack = cack + t
            if self.pending_imm and self.pending_imm[0][0] < self.cack and not self._complete_imm(now):
                self._nack(NackReason.UNEXP_EVENT, seq, entropy, port)  # no receive posted: no RNR in MRC
                return
        else:
            self.bitmap = bitmap
            self.unreported |= bit
        self.unacked += 1
        if self.bitmap:
            if self.hole_at != self.cack:  # a new hole (or the old one moved): its wait starts now
                # (looked at first after the least wait: the whole one is worked out only then)
                self.hole_at = self.cack
                self.hole_since = now
                self.hole_nacks = 0
                self.hole_deadline = now + self._hole_floor
                self._hole_port, self._hole_entropy = port, entropy
        elif self.hole_at >= 0:
            self.hole_at = -1
            self.hole_deadline = None
        if ecn or new_hole or fills_hole or ack_req or imm or self.unacked >= self.sack_every:
            self._sack(seq, entropy, port, ecn, now, ts)
        else:
            self._last_seq = seq
            self._last_entropy = entropy
            self._last_port = port
            self._last_ts = ts
            self._last_ecn = ecn
            self._last_at = now
            if self.sack_deadline is None:
                self.sack_deadline = now + self.sack_delay  # Nic.receive wakes the QP after this returns

    def _complete_imm(self, now: int) -> bool:
        """Complete the Write-with-Imm messages cack has passed; False if a receive was missing."""
        qp = self.qp
        pending = self.pending_imm
        while pending and pending[0][0] < self.cack:
            _seq, imm, length = _heappop(pending)
            if not qp.recv_queue:
                qp.nic.stats.protocol_errors += 1
                qp.set_error(now, WcStatus.LOC_QP_OP_ERR)
                return False
            wr = qp.recv_queue.popleft()
            qp.recv_cq.push(
                WorkCompletion(
                    wr.wr_id, WcStatus.SUCCESS, WcOpcode.RECV_RDMA_WITH_IMM, length, imm, qp.qp_num
                )
            )
        return True

    def on_probe(self, pkt: Packet, now: int, port: int, ecn: bool, entropy: int) -> None:
        if self.qp.state is _RTR or self.qp.state is _RTS:
            self.qp.nic.stats.probes_answered += 1
            peth = pkt.peth
            self._sack(self.cack, entropy, port, ecn, now, peth.tx_timestamp if peth else 0, True)

    # -- acknowledgements ----------------------------------------------------------------------------------
    def _sack(
        self,
        trigger: int,
        entropy: int,
        port: int,
        ecn: bool,
        now: int,
        ts: int = 0,
        pr: bool = False,
        again: bool = False,
        arrived: int = 0,
    ) -> None:
        """Send a SACK triggered by PSN ``trigger`` (arrived on EV ``entropy``, NIC port ``port``, at
        ``arrived``; 0: now, the arrival being handled)."""
        qp = self.qp
        cack = self.cack
        off = trigger - cack
        un = self.unreported
        if again or not un:
            # Nothing new, or (``again``) a duplicate: the requester resends what it thinks lost, so it
            # missed a SACK; the window from cack on (or the one ending at the duplicate) again.
            base = cack if off < 64 else trigger - 63
            shift = base - cack
            if un:
                self.unreported = un & ~(_MASK64 << shift)
        else:
            # Report the oldest news first, so that every arrival is reported at least once.
            base = cack + (un & -un).bit_length() - 1
            shift = base - cack
            # clear the 64 PSNs from base on: base is un's lowest bit, none is below
            self.unreported = (un >> (shift + 64)) << (shift + 64)
        bits = self.bitmap >> shift
        if bits >> 64:  # (a 64-bit mask is a big integer: skip the AND when it would change nothing)
            bits &= _MASK64
        sack = SackTransmit(
            qp.qp_num,
            qp.attr.dest_qp_num or 0,
            cack & PSN_MASK,
            off if -0x8000 <= off <= 0x7FFF else (0x7FFF if off > 0 else -0x8000),
            base - cack,
            bits,
            entropy,
            _SKIP_ONCE if ecn else _M_NONE,
            pr,
            self.adv_mpr,
            ts,
            min(self.bitmap.bit_count(), 0x7FFF),
            (-(-self.rcvd_bytes // 256)) & 0xFFFFFF,
        )
        if self.report_service:  # the driver stamps the service time as the SACK leaves
            sack.arrived = arrived if arrived else now
        self.unacked = 0
        self.sack_deadline = None
        nic = qp.nic
        nic.stats.sacks_sent += 1
        nic.send_transmit(qp, sack, port)
        if self.unreported and not pr:
            # News beyond this window: report it now. Arrivals that keep filling holes near cack would
            # otherwise win every SACK, and packets that arrived far above them would wait unreported
            # until the requester gave them up as lost (and blamed their paths).
            self._sack(trigger, entropy, port, False, now, arrived=arrived)

    def _ask_for_hole(self, now: int) -> None:
        """The hole at the cumulative PSN has outlived its wait: NACK it (NO_PKT_BUFFER, "send it again"):
        a requester that took it for acknowledged (a forged SACK) sends it again from the Write's memory,
        or, if it had completed the Write, finds the contradiction and fails the QP. After
        `_HOLE_NACKS` unanswered NACKs this QP fails (RETRY_EXC_ERR): a hole is never waited for for ever."""
        qp = self.qp
        if self.hole_nacks >= _HOLE_NACKS:
            self.hole_deadline = None
            qp.set_error(
                now,
                WcStatus.RETRY_EXC_ERR,
                f"PSN {self.cack & PSN_MASK} never arrived while later ones did "
                f"({_HOLE_NACKS} NACKs asked for it)",
            )
            return
        self.hole_nacks += 1
        self.hole_deadline = now + self._hole_wait()
        self._nack(NackReason.NO_PKT_BUFFER, self.cack, self._hole_entropy, self._hole_port)

    def _nack(self, reason: NackReason, seq: int, entropy: int, port: int) -> None:
        qp = self.qp
        a = qp.attr
        qp.nic.stats.nacks_sent += 1
        self._send(
            Packet(
                BTH(Opcode.NACK, dest_qp=a.dest_qp_num or 0, psn=seq & PSN_MASK),
                neth=NETH(
                    reason=reason,
                    entropy=entropy,
                    src_qp=qp.qp_num & 0xFFFF,
                    dst_qp=(a.dest_qp_num or 0) & 0xFFFF,
                    psn=seq & PSN_MASK,
                    cc_type=1,
                ),
            ),
            port,
        )

    def _send(self, pkt: Packet, port: int) -> None:
        self.qp.nic.send_control(self.qp, pkt, port)

    # -- timers --------------------------------------------------------------------------------------------
    def _hole_wait(self) -> int:
        """How long a hole may stay before it is asked for: four of the QP's retransmission timeouts (the
        requester recovers a loss on its own well within that; 16 base RTTs at least, for a QP that only
        receives), doubling with each NACK."""
        qp = self.qp
        rto = qp.requester.rec.rto_base
        floor = 4 * qp.nic.config.base_rtt_ns
        return (4 * (rto if rto > floor else floor)) << self.hole_nacks

    def on_timer(self, now: int) -> None:
        h = self.hole_deadline
        if h is not None and now >= h:
            state = self.qp.state
            if state is not _RTR and state is not _RTS:
                self.hole_deadline = None
            elif not self.hole_nacks and now < self.hole_since + self._hole_wait():
                self.hole_deadline = self.hole_since + self._hole_wait()  # its whole first wait
            else:
                self._ask_for_hole(now)
        if self.sack_deadline is not None and now >= self.sack_deadline:
            self.sack_deadline = None
            if self.unacked:
                self._sack(
                    self._last_seq,
                    self._last_entropy,
                    self._last_port,
                    self._last_ecn,
                    now,
                    self._last_ts,
                    arrived=self._last_at,
                )
