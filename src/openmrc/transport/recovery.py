"""Loss recovery of one requester: RTT estimation, loss inference, tail loss probes, the retransmission
timeout, EV blame, and the probes of ASSUMED_BAD EVs and doubted planes.

Theory of operation (MRC-SPEC-NOTES §2, §4; RFC 8985 RACK-TLP; RFC 6298; RFC 3522's idea)
-----------------------------------------------------------------------------------------
Every transmission of a packet gets an order number, and `by_order` holds the packets in flight by it
(`openmrc.transport.sent`). RTT samples come from the packet that triggered a SACK when it was sent only once
(RFC 6298 smoothing); the smallest is kept (``rtt_min``: no answer to a transmission comes back sooner).

*Lateness is not loss.* A software NIC is descheduled for milliseconds; its peer reads its socket late and
answers in bursts; packets sprayed over several sockets are read in turns. None of that is loss, and a rule
that compares a packet's age with the time an acknowledgement happens to be *read* takes it for loss. So a
packet is lost only when all of these hold (RACK, RFC 8985 §6):

1. more than ``reorder_allowance`` packets sent after it have been acknowledged (near the tail of what was
   sent, where fewer follow it, any later one);
2. a packet sent after it was delivered, unambiguously (``rack_order``: the latest-sent such packet; an
   acknowledgement of a retransmitted packet sooner than ``rtt_min`` after it left may answer the original,
   and is not used);
3. its acknowledgement is later than that packet's by more than the reordering window and the peer's
   recent delay: ``now >= sent_at + max(rack_rtt, srtt) + reo_wnd + recent service time``, ``rack_rtt``
   being that packet's RTT. What counts is when each was *sent*: a burst of acknowledgements read late
   moves ``now`` and ``rack_rtt`` together (and srtt stands in when the latest-sent delivery took a
   shorter path than the packet's). A peer that reported holding packets for a while lately
   (`recent_service`) is answering a backlog it reads from its sockets in turns, in another order than
   they were sent.

A check timer runs the rule again when only (3) is missing. On a late host the rule runs once per batch
of acknowledgements (the driver's timer call after it has handed over what it read), as of the last one's
arrival: a late peer answers its backlog in a burst of SACKs, which are each other's missing pieces.
The driver hands the core each packet at the
time it reached the host (`openmrc.provider.udp` reads the kernel's receive timestamp), so an
acknowledgement's delay in this host is not taken for the network's. The peer's delay is told: a responder
that knows (`NicConfig.report_service_time`) reports in each SACK how long its trigger had been in its host
(SETH ``svc``). It is taken out of the RTT the congestion control sees (MRC's delay = RTT − base RTT −
service time; only when what is left is no shorter than the shortest RTT seen, as QUIC takes out its
ack_delay), and the longest the peer reported within the last ``_PEER_DELAY_WINDOW_NS`` (at least
`NicConfig.peer_ack_delay_ns`, QUIC's max_ack_delay) is waited for before a tail loss probe.

*The reordering window* is max(4·rttvar, srtt/4) (RACK's default is a quarter of the RTT), and while the QP
sees congestion (a trim or an ECN echo within the last `_CONGESTED_RTTS` RTTs, when queues differ from path to
path by far more than the samples show) max(srtt, 4·rttvar, base_rtt − srtt). It *learns*: when a
packet inferred lost is acknowledged before its retransmission left (it was late, not lost), the window
grows to cover how late it came, and a quarter more (at most srtt, RACK's bound), and keeps that for
`_REO_PERSIST` loss episodes without another such packet (RFC 8985 §6.2.4's ``reo_wnd_persist``), after
which it falls back. A network that drops keeps the small window and recovers fast; a host that is late
widens it for as long as it stays late.

*Blame.* A packet inferred lost is queued for retransmission (oldest PSN first, BTH.RTX set, on a fresh EV)
and its EV is skipped for the rest of the rotation (held out of it until the packet is judged, on a NIC
whose host is late: `NicConfig.late_host`); it is not blamed until the packet is judged. It was late, not
lost (no blame; the EV released; counted in ``spurious_losses``) when

* its acknowledgement comes before its retransmission left, or sooner after it than any answer can;
* the SACK it triggered itself echoes its original EV (RFC 3522's idea: the echo tells which copy arrived);
* a second copy of it reaches the responder within the judging grace after it was acknowledged (the
  responder acknowledges a duplicate at once, echoing its EV): one that echoes the original's EV, or, when
  only one retransmission left, any copy but the one its own SACK already acknowledged;
* a trim NACK answers it (congestion, not a failed path).

Otherwise the original was lost on its EV: ASSUMED_BAD (MRC's rule for a loss without trim), replaced by a
backup of the same plane, when the retransmission is acknowledged; on a late host once a grace has passed
after that (the loss wait plus the SACK delay, or as long again as the original had been out, if longer)
with no copy of the original turning up.

*Tail loss probe* (RFC 8985 §7). If the newest packet has had no acknowledgement for the loss wait plus the
SACK coalescing delay (and at least srtt plus the peer's longest delay), it is sent again (no EV
penalty); its acknowledgement exposes the holes before it. On a late host not while the peer answers
nothing at all with packets on three EVs or more in flight: a lost tail leaves the other paths
answering (or is one EV's burst), a silence across paths is the peer's, descheduled (or gone: the
retransmission timeout's case).
The probe timer also runs from the first packet a QP sends with nothing else in flight, so that a
one-packet message lost on a failed path is recovered in about two RTTs, not a retransmission timeout.

*Retransmission timeout.* ``rto = max(1.024 µs · 2^timeout, min_ack_timeout_ns)``: when nothing is
acknowledged for that long, every packet in flight is taken for lost and judged as above (when nothing at
all comes back, the peer may be what is wrong, not a path: nothing is blamed before something does), and
the oldest is sent again: one packet until an acknowledgement comes (a peer that stopped answering is not
sent its whole window again). The first ``retry_linear`` expiries keep the interval, the next
``retry_exp`` double it (25: for ever), and the next expiry puts the QP in ERROR with RETRY_EXC_ERR; with
no acknowledgement at all that takes ``rto · (1 + retry_linear + 2 + 4 + … + 2^retry_exp)``
(`Recovery.time_to_error`). Any acknowledgement of new data resets the count. A QP with work and no usable
path keeps the timer all the same.

*Probes.* ASSUMED_BAD EVs are probed every max(probe interval, probe timeout), each EV's spacing doubling
while its probes go unanswered, up to ``probe_backoff_max_ns``; a doubted plane (up here, down by the peer's
word) is probed while the QP has work. While the peer answers nothing at all (no acknowledgement, NACK or
probe answer for an RTO, and at least ``silent_probe_interval_ns``), the QP sends at most one probe every
``silent_probe_interval_ns``: a dead or stalled peer costs a bounded, small rate.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Final

from openmrc.transport.cc import CongestionControl
from openmrc.transport.config import NicConfig
from openmrc.transport.evtable import EvEntry, EvTable
from openmrc.transport.sent import NO_WINDOW, SentPacket, Window
from openmrc.transport.stats import NicStats
from openmrc.transport.types import WcStatus

__all__ = ["Recovery"]

_heappush: Final = heapq.heappush

_INFINITE_EXP: Final = 25
_CONGESTED_RTTS: Final = 8
"""A QP that saw a trim or an ECN echo this many RTTs ago or less is congested (`Recovery.reo_wnd`)."""
_REO_PERSIST: Final = 4
"""Loss episodes a learned reordering window outlives without another spurious loss (RFC 8985 §6.2.4 keeps
it for 16 recoveries; a fabric with random loss and no late host recovers faster with fewer)."""
_RETRY_EXC: Final = WcStatus.RETRY_EXC_ERR
_PEER_DELAY_WINDOW_NS: Final = 1_000_000_000
"""How long the longest service time a peer reported is remembered (a host that was descheduled for a
while is likely to be again)."""


def _detached(now: int, status: WcStatus, detail: str) -> None:
    """The ``fail`` of a recovery whose QP is gone."""


class Recovery:
    """Loss recovery of one requester (see the module docstring). The requester hands it each transmission
    (`on_sent`), each acknowledged packet (`on_acked`) and each SACK's trigger (`on_trigger`); it owns the
    packets in flight, the bytes in flight, the congestion control and the timers."""

    def __init__(
        self, config: NicConfig, stats: NicStats, fail: Callable[[int, WcStatus, str], None]
    ) -> None:
        self.stats = stats
        self._fail = fail  # the QP's set_error: retries exhausted
        self.cc: CongestionControl | None = None
        self.cc_on_send = False
        self.evs: EvTable | None = None
        self.by_order = NO_WINDOW  # transmission order -> packet in flight
        self.retx: list[int] = []  # heap of lost seqs awaiting retransmission
        self.inflight = 0
        self.order = 0
        self.acked_order = -1
        self.srtt = 0
        self.rttvar = 0
        self.rtt_min = 0
        self.rack_order = -1  # order of the latest-sent packet delivered unambiguously
        self.rack_rtt = 0  # its RTT
        self.reo_learned = 0  # the reordering window spurious losses taught (0: none)
        self.reo_persist = 0  # loss episodes it still lasts
        self.rto_deadline: int | None = None
        self.check_deadline: int | None = None  # tail loss check / probe
        self.detect_at = -1
        """On a late host, the arrival time of the last acknowledgement not yet judged by (`on_ack_done`)."""
        self.judge_deadline: int | None = None  # the earliest judgement due (`judging`)
        self.first_sent: dict[int, int] = {}
        """When each packet under suspicion (``suspect`` set) first left: seq -> time."""
        self.judging: dict[int, tuple[int, EvEntry, int, int, int]] = {}
        """Packets acknowledged after a retransmission whose original is not judged yet: seq -> (when it is
        judged, the original's EV, retransmissions, the EV echoed by the SACK it triggered itself when that
        SACK acknowledged it, else -1, when the original left)."""
        self.tlp_order = 0  # the transmission the last tail loss probe followed; one probe per tail
        self.timeouts = 0
        self.rto_sends = -1
        """After a retransmission timeout, how many data packets may still leave before an acknowledgement
        comes (-1: no limit)."""
        self.congested_at = -(1 << 62)  # last trim or ECN echo (see `reo_wnd`)
        self.heard_at = 0  # last valid feedback from the peer
        self.silent_probe_at = 0  # while the peer is silent, no probe before this
        self.pending_probes: list[EvEntry] = []  # probes the timer found due, sent by the next emit
        self.plane_probe_at: int | None = None  # next probe of the doubted planes (while there is work)
        self.probe_interval = config.probe_interval_ns
        self.silent_probe_interval = config.silent_probe_interval_ns
        self.reorder_allowance = config.reorder_allowance
        self.late_host = config.late_host
        self.sack_delay = config.sack_delay_ns
        self.base_rtt = config.base_rtt_ns
        self.min_rto = config.min_ack_timeout_ns
        self.peer_delay_floor = config.peer_ack_delay_ns
        self.peer_delay = config.peer_ack_delay_ns  # the longest the peer is expected to hold a SACK
        self.peer_delay_at = 0  # when the peer last reported a service time longer than the floor
        self.recent_svc = 0  # the longest service time reported lately (`recent_service`)
        self.recent_svc_at = 0
        self.rto_base = 1024
        self.silence = self.silent_probe_interval  # no feedback for this long: the peer is silent
        self.retry_linear = 0
        self.retry_limit = 0.0

    # -- set-up --------------------------------------------------------------------------------------------
    def start(self, cc: CongestionControl, evs: EvTable, now: int) -> None:
        """RTR -> RTS: the QP's congestion control and EV table."""
        self.cc = cc
        self.cc_on_send = type(cc).on_send is not CongestionControl.on_send
        self.evs = evs
        self.heard_at = now
        if self.by_order is NO_WINDOW:
            self.by_order = Window()

    def configure(self, timeout: int, retry_linear: int, retry_exp: int) -> None:
        """The QP's ACK timeout exponent and retry counts (RTS, and every RTS -> RTS that changes them)."""
        base = 1024 << timeout
        self.rto_base = base if base > self.min_rto else self.min_rto
        self.silence = max(self.rto_base, self.silent_probe_interval)
        self.retry_linear = retry_linear
        self.retry_limit = float("inf") if retry_exp >= _INFINITE_EXP else float(retry_linear + retry_exp)

    def rto(self) -> int:
        base = self.rto_base
        lin = self.retry_linear
        return base if self.timeouts <= lin else base << min(self.timeouts - lin, 32)

    def time_to_error(self) -> float:
        """Seconds from the last acknowledgement to RETRY_EXC_ERR when nothing more is acknowledged (inf:
        retries for ever)."""
        if self.retry_limit == float("inf"):
            return float("inf")
        exp = int(self.retry_limit) - self.retry_linear
        return self.rto_base * (1 + self.retry_linear + (1 << (exp + 1)) - 2) / 1e9

    def detach(self) -> None:
        """The QP was destroyed: let go of it (``fail`` is its bound method) and of what it shared."""
        self._fail = _detached
        self.cc = None
        self.evs = None

    # -- RTT -----------------------------------------------------------------------------------------------
    def pto(self) -> int:
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

    def reo_wnd(self, now: int) -> int:
        """The reordering window (module docstring): max(4·rttvar, srtt/4), or while congested
        max(srtt, 4·rttvar, base_rtt − srtt); at least what spurious losses taught. Before the first RTT
        sample, the base RTT."""
        srtt = self.srtt
        if not srtt:
            return self.base_rtt
        var4 = 4 * self.rttvar
        if now - self.congested_at < _CONGESTED_RTTS * max(srtt, self.base_rtt):
            w = srtt if srtt > var4 else var4
            rest = self.base_rtt - srtt
            if rest > w:
                w = rest
        else:
            q = srtt >> 2
            w = var4 if var4 > q else q
        learned = self.reo_learned
        return learned if learned > w else w

    def loss_wait(self, now: int) -> int:
        """srtt plus the reordering window: how long after it left a packet's answer is overdue."""
        return self.srtt + self.reo_wnd(now) if self.srtt else self.base_rtt

    def tlp_wait(self, now: int) -> int:
        """How long after the newest transmission, with no acknowledgement of it, a tail loss probe goes:
        the loss wait plus the responder's SACK coalescing delay (the newest packet may be one whose SACK is
        held back); on a late host at least RFC 8985's 2·srtt (its answers come in bursts), and before the
        first RTT sample the retransmission timeout (its first answers can take milliseconds). (Also the
        judging grace of a packet thought lost: `_judge`.)"""
        wait = self.loss_wait(now)
        if self.late_host:
            if not self.srtt:
                return self.rto_base
            if wait < 2 * self.srtt:
                wait = 2 * self.srtt
        return wait + self.sack_delay

    def probe_wait(self, now: int) -> int:
        """`tlp_wait`, and at least srtt plus the longest the peer may hold an acknowledgement (its
        reported service times, `NicConfig.peer_ack_delay_ns`) and the SACK delay: how long the newest
        packet goes unanswered before a tail loss probe."""
        wait = self.tlp_wait(now)
        peer = self._peer_delay(now)
        if peer and self.srtt:
            least = self.srtt + peer + self.sack_delay
            if wait < least:
                return least
        return wait

    def peer_service(self, svc: int, rtt: int | None, now: int) -> int | None:
        """The peer reported holding a SACK's trigger ``svc`` ns in its host: remembered for the tail probe's
        wait (`probe_wait`); returns the RTT sample ``rtt`` (None: none) as the congestion control is to see
        it, without the peer's service time (unless that would make it shorter than any RTT seen)."""
        if svc > self._peer_delay(now):
            self.peer_delay = svc
            self.peer_delay_at = now
        if svc >= self.recent_service(now):
            self.recent_svc = svc
            self.recent_svc_at = now
        if rtt is not None and rtt - svc >= self.rtt_min:
            return rtt - svc
        return rtt

    def recent_service(self, now: int) -> int:
        """The longest service time the peer reported within the last two srtt (0: none): a peer that held
        packets that long is answering a backlog it read in turns from its sockets, so what it answers
        next may have been sent before what it answered first, by up to that much."""
        if now - self.recent_svc_at > 2 * self.srtt:
            return 0
        return self.recent_svc

    def _peer_delay(self, now: int) -> int:
        """The longest the peer may hold an acknowledgement: the longest service time it reported within
        `_PEER_DELAY_WINDOW_NS`, else (a second without one so long) the configured bound."""
        if now - self.peer_delay_at > _PEER_DELAY_WINDOW_NS:
            return self.peer_delay_floor
        return self.peer_delay

    def rtt_sample(self, rtt: int) -> None:
        if rtt <= 0:
            rtt = 1  # a clock that stamped an answer no later than its packet: the shortest sample
        if not self.srtt:
            self.srtt, self.rttvar = rtt, rtt >> 1
        else:  # RFC 6298 smoothing
            self.rttvar = (3 * self.rttvar + abs(self.srtt - rtt)) >> 2
            self.srtt = (7 * self.srtt + rtt) >> 3
        if rtt < self.rtt_min or not self.rtt_min:
            self.rtt_min = rtt

    # -- sending -------------------------------------------------------------------------------------------
    def on_sent(self, p: SentPacket, now: int) -> None:
        """``p`` leaves now (new or retransmitted): in flight, under a new transmission order."""
        p.sent_at = now
        self.order = order = self.order + 1
        p.order = order
        self.by_order.add(order, p)
        self.inflight += p.size
        if self.cc_on_send:
            self.cc.on_send(now, p.size, self.inflight)  # type: ignore[union-attr]
        if self.rto_deadline is None:
            self.rto_deadline = now + self.rto()
        if self.check_deadline is None and self.by_order.live == 1:
            self.check_deadline = now + self.probe_wait(
                now
            )  # a tail probe for what an idle QP starts to send

    def lose(self, p: SentPacket) -> None:
        """``p`` is to be sent again: out of the bytes in flight, queued oldest PSN first."""
        if not p.lost:
            p.lost = True
            self.inflight -= p.size
            _heappush(self.retx, p.seq)

    # -- acknowledgements ----------------------------------------------------------------------------------
    def heard(self, now: int) -> None:
        """Valid feedback from the peer arrived (the peer is not silent)."""
        self.heard_at = now

    def on_acked(self, p: SentPacket, now: int, echo: int) -> None:
        """``p`` is acknowledged (its PSN left the requester's window) by a SACK it triggered itself, echoing
        EV ``echo``, or (``echo`` -1) by another packet's."""
        if p.suspect is not None:
            self._judge(p, now, echo)
        if not p.lost:
            self.inflight -= p.size
        order = p.order
        self.by_order.pop(order)  # (gone already if it was inferred lost)
        if order > self.acked_order:
            self.acked_order = order
        if order > self.rack_order and (not p.sends or now - p.sent_at >= self.rtt_min):
            self.rack_order = order
            self.rack_rtt = now - p.sent_at

    def on_trigger(self, seq: int, entropy: int, p: SentPacket | None, now: int) -> None:
        """A SACK was triggered by the arrival of PSN ``seq`` on EV ``entropy`` (``p``: that packet, if still
        outstanding): a duplicate of a packet under judgement, or the original answering for itself, proves
        its loss spurious."""
        if p is not None:
            e = p.suspect
            if e is not None and p.sends and entropy == e.entropy:
                # the original arrived (not judged again by `on_acked`), this late
                first = self.first_sent.pop(seq, p.sent_at)
                self._spurious(e, now, self._lateness(now, first))
                p.suspect = None
            return
        j = self.judging.get(seq)
        # Another copy than the one whose own SACK acknowledged it (a different echo; the responder repeats
        # a SACK with the same trigger only to report more of its bitmap): with one retransmission, the
        # original. (When another packet's SACK acknowledged it, a SACK it triggered may be its own, come
        # late over another path: only the original's echo proves anything then.)
        if j is not None and (entropy == j[1].entropy or (j[2] == 1 and j[3] >= 0 and entropy != j[3])):
            del self.judging[seq]
            self._spurious(j[1], now, self._lateness(now, j[4]))
            self._rearm_judging()

    def on_ack_done(self, npkts: int, newly: int, rtt: int | None, ecn: bool, now: int, live: bool) -> None:
        """The end of a SACK that acknowledged ``npkts`` packets (``newly`` bytes; ``live``: packets are still
        outstanding): the congestion control, the timers, loss inference."""
        if npkts:
            self.timeouts = 0
            self.rto_sends = -1
            self.cc.on_ack(now, newly, self.inflight, rtt, ecn)  # type: ignore[union-attr]
            self.rto_deadline = now + self.rto() if live else None
            if self.late_host:
                # Acknowledgements read together are judged together, as of the last one's arrival: a late
                # peer drains its sockets in turns and answers a backlog in a burst, whose SACKs are each
                # other's missing pieces (the driver's timer call after the batch runs `check_tail`).
                self.detect_at = now
                self.check_deadline = now
            else:
                self.check_deadline = now + self.probe_wait(now)  # cleared below when nothing is outstanding
                self.detect_losses(now)
        if not live:
            self.check_deadline = None
            self.detect_at = -1

    def on_trimmed(self, p: SentPacket, now: int) -> None:
        """A trim NACK for ``p`` (in flight): congestion, which restarts the retransmission timer (a trim
        proves the path and the peer alive: a sender whose every packet meets a full last hop would
        otherwise time out; the NACK retry limit still holds). A last-hop trim counts too: the responder
        sends no receiver CC penalty (CC_STATE rcv_cwnd_pen), so NSCC must see last-hop trims as trims."""
        self.congested_at = now
        self.cc.on_trim(now, p.size, self.inflight, False)  # type: ignore[union-attr]
        self.rto_deadline = now + self.rto()

    def clear_suspect(self, p: SentPacket) -> None:
        """A trim explains ``p``'s loss: congestion, not its path's failure."""
        if p.suspect is not None:
            self.evs.release(p.suspect)  # type: ignore[union-attr]
            p.suspect = None
            self.first_sent.pop(p.seq, None)

    def nacked(self, p: SentPacket) -> None:
        """``p`` was NACKed (retriable): sent again."""
        self.by_order.pop(p.order)
        self.lose(p)

    # -- loss inference ------------------------------------------------------------------------------------
    def detect_losses(self, now: int) -> None:
        acked_order = self.acked_order
        rack = self.rack_order
        threshold = acked_order - self.reorder_allowance
        tail = self.order - self.reorder_allowance  # later than this, fewer than the allowance follow
        wait = self._expected_rtt() + self.reo_wnd(now) + self.recent_service(now)
        by_order = self.by_order
        base = by_order.base
        lost: list[SentPacket] = []
        for i, p in enumerate(by_order.slots):  # oldest transmission first
            if p is None:
                continue
            order = base + i
            if order >= rack or order >= acked_order or (order >= threshold and order <= tail):
                break  # nothing later delivered, or not enough of it yet
            due = p.sent_at + wait
            if due > now:  # the rest is there, the time not yet: look again then
                if self.check_deadline is None or due < self.check_deadline:
                    self.check_deadline = due
                break
            lost.append(p)
        if not lost:
            return
        evs = self.evs
        assert evs is not None and self.cc is not None
        for p in lost:
            by_order.pop(p.order)
            self.lose(p)
            self._suspect(p, evs)
        self.stats.losses_inferred += 1
        if self.reo_persist:
            self.reo_persist -= 1
            if not self.reo_persist:
                self.reo_learned = 0
        self.cc.on_loss(now, self.inflight)

    def _suspect(self, p: SentPacket, evs: EvTable) -> None:
        """``p`` is thought lost: its EV is skipped for the rotation (held out of it on a late host) and
        blamed (ASSUMED_BAD) only once the loss is judged, since a late packet is not a lost one. A
        retransmission thought lost is judged with its original: its EV is only skipped."""
        if p.suspect is None:
            p.suspect = p.entry
            self.first_sent[p.seq] = p.sent_at
            if self.late_host:
                evs.hold(p.entry)
                return
        evs.skip(p.entry)

    def _judge(self, p: SentPacket, now: int, echo: int) -> None:
        """``p``, inferred lost on EV ``p.suspect``, is acknowledged (module docstring, *Blame*)."""
        e = p.suspect
        p.suspect = None
        assert e is not None
        first = self.first_sent.pop(p.seq, p.sent_at)
        if p.lost or now - p.sent_at < (self.rtt_min or self.base_rtt):
            # how much later than the window allowed it came (RACK's rule: sent_at + rack_rtt + reo_wnd)
            late = now - p.sent_at - self.rack_rtt - self.reo_wnd(now)
            self._spurious(e, now, late if p.lost else 0)
            return
        if not self.late_host:
            self.evs.mark_bad(e, now)  # type: ignore[union-attr]
            return
        # the grace: the loss wait and the SACK delay, or as long again as the original has been out if
        # that is longer (a deep queue, a late host, that delayed it that much may delay it that much more)
        grace = self.tlp_wait(now)
        if now - first > grace:
            grace = now - first
        at = now + grace
        self.judging[p.seq] = (at, e, p.sends, echo, first)
        if self.judge_deadline is None or at < self.judge_deadline:
            self.judge_deadline = at

    def _spurious(self, e: EvEntry, now: int, extent: int) -> None:
        """A loss inferred on EV ``e`` was spurious: no blame, and when its acknowledgement came
        ``extent`` ns later than the window allowed (0: not measured), widen the window to cover that and a
        quarter more, at most srtt (RACK's bound)."""
        self.stats.spurious_losses += 1
        self.evs.release(e)  # type: ignore[union-attr]
        if extent <= 0:
            return
        w = self.reo_wnd(now) + extent
        w += w >> 2
        cap = self.srtt or self.base_rtt
        if w > cap:
            w = cap
        if w > self.reo_learned:
            self.reo_learned = w
        self.reo_persist = _REO_PERSIST

    def _lateness(self, now: int, first: int) -> int:
        """How much later than the window allowed the original of a packet that left at ``first`` turned up
        at ``now`` (on a late host: elsewhere 0, only packets acknowledged before their retransmission
        left teach the window, which keeps a fabric's random losses from widening it)."""
        if not self.late_host:
            return 0
        return now - first - self._expected_rtt() - self.reo_wnd(now)

    def _expected_rtt(self) -> int:
        """How long a packet's answer takes: the RTT of the latest-sent packet delivered, or srtt if longer
        (that delivery may have taken the shortest path)."""
        rtt = self.rack_rtt
        return rtt if rtt > self.srtt else self.srtt

    def _rearm_judging(self) -> None:
        j = self.judging
        self.judge_deadline = min(v[0] for v in j.values()) if j else None

    def _blame_due(self, now: int) -> None:
        evs = self.evs
        assert evs is not None
        due = sorted((v[0], seq) for seq, v in self.judging.items() if v[0] <= now)
        for _at, seq in due:
            evs.mark_bad(self.judging.pop(seq)[1], now)
        self._rearm_judging()

    def check_tail(self, now: int) -> None:
        """The check timer (cleared by the caller; `detect_losses` may set it again): infer tail losses,
        else probe the tail once if nothing came back for a PTO."""
        at = self.detect_at
        if at >= 0:
            self.detect_at = -1
            if at > now:
                at = now
        else:
            at = now
        if not self.by_order.live:
            return
        self.detect_losses(at)
        p = self.by_order.newest()
        if self.retx or p is None:
            return
        order = p.order
        tlp = self.probe_wait(now)
        if order > self.tlp_order and p.sent_at + tlp <= now and not self._silent_peer(now, tlp):
            self.tlp_order = self.order + 1  # the probe's own transmission: no second probe for it
            self.by_order.pop(order)
            self.lose(p)  # resent on a fresh EV, RTX set; its EV keeps its state
            self.stats.tail_probes += 1
        elif self.check_deadline is None and p.sent_at + tlp > now:
            self.check_deadline = p.sent_at + tlp
        # else the newest transmission is the tail probe itself, overdue, or (on a late host) the peer has
        # answered nothing for as long across paths (`_silent_peer`): stalled (its answers come when it
        # runs again) or gone, not a lost tail, and the retransmission timeout is what tells (re-arming
        # the check in the past would spin the driver's timer)

    def _silent_peer(self, now: int, wait: int) -> bool:
        """On a late host, whether the peer has answered nothing for ``wait`` while packets on three EVs or
        more are in flight: a silence across paths is the peer's (descheduled, or gone), not a lost tail
        (a tail lost on one path leaves the others answering, or is a burst on a single EV)."""
        if not self.late_host or now - self.heard_at < wait:
            return False
        first: EvEntry | None = None
        second: EvEntry | None = None
        for p in self.by_order.slots:
            if p is None:
                continue
            e = p.entry
            if first is None:
                first = e
            elif e is not first:
                if second is None:
                    second = e
                elif e is not second:
                    return True
        return False

    # -- probes --------------------------------------------------------------------------------------------
    def collect_probes(self, now: int, has_work: bool, out: list[EvEntry], timer: bool = False) -> None:
        """Append the EVs to probe now: due ASSUMED_BAD EVs, one of each doubted plane while there is work,
        and what the timer found due (``timer``: the timer asks, for `pending_probes`; it starts no plane
        probing, the next emit does); while the peer is silent, at most one every silent probe interval."""
        evs = self.evs
        assert evs is not None
        start = len(out)
        if evs.bad:
            out.extend(evs.due_probes(now, self.pto()))
        at = self.plane_probe_at
        if timer and (at is None or now < at):
            pass
        elif evs.doubted and has_work:
            if at is None or now >= at:
                out.extend(evs.plane_probes())
                self.plane_probe_at = now + max(self.probe_interval, self.pto())
        elif self.plane_probe_at is not None:
            self.plane_probe_at = None
        if len(out) > start and now - self.heard_at >= self.silence:
            # The peer answers nothing: one probe at most every silent interval (the others' schedules
            # have moved on with their backoff).
            if now >= self.silent_probe_at:
                self.silent_probe_at = now + self.silent_probe_interval
                del out[start + 1 :]
            else:
                del out[start:]
            at = self.silent_probe_at
            for e in evs.bad:
                evs.defer_probe(e, at)
            if self.plane_probe_at is not None and self.plane_probe_at < at:
                self.plane_probe_at = at
        if self.pending_probes and not timer:  # (budgeted when the timer found them due)
            out.extend(self.pending_probes)
            self.pending_probes = []

    # -- timers --------------------------------------------------------------------------------------------
    def next_timer(self) -> int | None:
        """The earliest of the recovery's deadlines (RTO, loss check, judgement, plane and EV probes)."""
        a = self.rto_deadline
        c = self.check_deadline
        if c is not None and (a is None or c < a):
            a = c
        c = self.judge_deadline
        if c is not None and (a is None or c < a):
            a = c
        c = self.plane_probe_at
        if c is not None and (a is None or c < a):
            a = c
        evs = self.evs
        if evs is not None and evs.bad:
            c = evs.next_probe_time()
            if c is not None and (a is None or c < a):
                a = c
        return a

    def on_timer(self, now: int, has_work: bool, outstanding: bool, unsent: bool) -> None:
        """Run what is due at ``now``. ``has_work``: Writes are posted; ``outstanding``: packets are
        unacknowledged; ``unsent``: packets are still to be sent the first time."""
        evs = self.evs
        assert evs is not None
        if evs.bad or (self.plane_probe_at is not None and now >= self.plane_probe_at):
            self.collect_probes(now, has_work, self.pending_probes, True)  # leave with the next emit
        if self.judge_deadline is not None and now >= self.judge_deadline:
            self._blame_due(now)
        if self.check_deadline is not None and now >= self.check_deadline:
            self.check_deadline = None
            self.check_tail(now)
        if self.rto_deadline is None or now < self.rto_deadline:
            return
        if not outstanding and not unsent:
            self.rto_deadline = None
            return
        self.timeouts += 1
        self.stats.timeouts += 1
        if self.timeouts > self.retry_limit:
            evs = self.evs
            assert evs is not None
            self._fail(
                now,
                _RETRY_EXC,
                f"{self.timeouts - 1} retransmission timeouts in a row, no acknowledgement for "
                f"{(now - self.heard_at) / 1e6:.1f} ms ({self.by_order.live} packets in flight, "
                f"{len(self.retx)} waiting to be sent again, {evs.usable_count()} usable EVs, "
                f"{len(evs.bad)} ASSUMED_BAD)",
            )
            return
        self.rto_deadline = now + self.rto()
        if not self.by_order.live:  # work and no path, or every outstanding packet already queued again
            if self.retx:
                self.rto_sends = 1  # (the one packet a timeout lets leave)
            return
        # Everything in flight is taken for lost (RFC 5681: the flight is over) and judged like any loss
        # (a silence may be the peer's, not its paths': nothing is blamed before something comes back).
        # One packet may leave before an acknowledgement does (`rto_sends`).
        evs = self.evs
        assert evs is not None
        for p in self.by_order.values():
            self.lose(p)
            if p.suspect is None:
                self._suspect(p, evs)
        self.by_order.clear()
        self.rto_sends = 1
        assert self.cc is not None
        self.cc.on_loss(now, self.inflight)
        self.check_deadline = None

    def flush(self) -> None:
        """ERROR: nothing more is sent or judged."""
        self.by_order.clear()
        self.retx.clear()
        self.inflight = 0
        self.rto_deadline = None
        self.check_deadline = None
        self.detect_at = -1
        self.judge_deadline = None
        self.judging.clear()
        self.first_sent.clear()
        self.plane_probe_at = None
        self.pending_probes = []
        self.rto_sends = -1
