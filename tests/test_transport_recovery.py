"""Loss recovery (`openmrc.transport.recovery`): lateness is not loss, a late packet's EV is not blamed, the
reordering window learns and falls back, a silent peer costs a bounded probe rate and fails the QP in the
time its attributes give. Scripted time throughout (the pair harness, with host stalls where a software NIC
would be descheduled)."""

from __future__ import annotations

import random
import warnings

import pytest

from openmrc.ev import EVState
from openmrc.provider.loopback import HostStalls
from openmrc.provider.udp import SOFTWARE_MIN_ACK_TIMEOUT_NS, software_config
from openmrc.transport import AckTimeoutWarning, NicConfig, WcStatus
from openmrc.transport.cc import FixedWindow
from openmrc.transport.evtable import EvTable
from openmrc.transport.recovery import Recovery
from openmrc.transport.sent import PostedWrite, SentPacket
from openmrc.transport.stats import NicStats
from openmrc.transport.types import SendWR, WrOpcode

from .helpers import Impairments, Pair
from .transport_tools import run_until_completions, statuses

MiB = 1 << 20
BAD = EVState.ASSUMED_BAD


def _bad_events(p: Pair) -> list[int]:
    return [e.entropy for e in p.a.ev_events if e.state is BAD]


def _transfer(p: Pair, n: int, size: int) -> None:
    ids = [p.write(i * size, size) for i in range(n)]
    run_until_completions(p, n, max_time=10**11, max_steps=2_000_000)
    assert statuses(p.completions()) == [(i, WcStatus.SUCCESS) for i in ids]
    assert p.dst[: n * size] == p.src[: n * size]


# -- the rule itself --------------------------------------------------------------------------------------
def _recovery(n: int, cfg: NicConfig | None = None, per_ev: int = 1) -> tuple[Recovery, list[SentPacket]]:
    """A recovery with ``n`` one-MTU packets, ``per_ev`` in a row on an EV, none sent yet, over a real EV
    table of 8 EVs; ``cfg``: the NIC's (default `NicConfig()`)."""
    cfg = cfg or NicConfig()
    rec = Recovery(cfg, NicStats(), lambda now, status, detail: None)
    evs = EvTable([(bytes(32), 1 + i % 4, 0xC000 + i) for i in range(8)], rng=random.Random(1), min_active=1)
    rec.start(FixedWindow(mtu=cfg.mtu), evs, 0)
    rec.configure(14, 7, 7)
    buf = [memoryview(bytearray(n * 4096))]
    w = PostedWrite(SendWR(1, WrOpcode.RDMA_WRITE, [], 0, 0), buf, n * 4096, True, 4096)
    return rec, [SentPacket(i, w, 4096, evs.rotation[(i // per_ev) % len(evs.rotation)]) for i in range(n)]


def test_acknowledgements_read_late_do_not_make_their_neighbours_lost() -> None:
    """300 packets leave together; the host reads the acknowledgements of all but the first 10 ms late.
    Judged by when they were read, the first is long overdue; judged by when they were sent (RACK), it was
    sent with the others and is not lost until the reordering window has passed since theirs came."""
    rec, pkts = _recovery(300)
    for p in pkts:
        rec.on_sent(p, 0)
    late = 10_000_000
    for p in pkts[1:]:
        rec.on_acked(p, late, -1)
    rec.on_ack_done(299, 299 * 4096, late, False, late, True)
    assert not pkts[0].lost and rec.stats.losses_inferred == 0
    assert rec.check_deadline is not None and rec.check_deadline > late  # looked at again, later
    rec.on_acked(pkts[0], late + 1_000, -1)  # and its acknowledgement was only in the next read
    assert rec.stats.losses_inferred == 0 and rec.inflight == 0


def test_a_packet_is_lost_once_one_sent_a_window_later_is_delivered() -> None:
    rec, pkts = _recovery(300)
    rec.on_sent(pkts[0], 0)
    step = 1_000_000  # well past the reordering window of the RTT below
    for i, p in enumerate(pkts[1:], 1):
        rec.on_sent(p, step + i)
    rec.rtt_sample(100_000)
    for p in pkts[1:]:
        rec.on_acked(p, step + 100_000, -1)
    rec.on_ack_done(299, 299 * 4096, 100_000, False, step + 100_000, True)
    assert pkts[0].lost and rec.retx == [0] and rec.stats.losses_inferred == 1
    assert pkts[0].suspect is pkts[0].entry and pkts[0].entry.state is EVState.SKIP  # skipped, not blamed


# -- lateness in a software NIC's host -----------------------------------------------------------------------
def _software_pair(
    stalls: bool | dict[str, HostStalls], seed: int = 1, cfg: NicConfig | None = None, **kw: object
) -> Pair:
    """Two software NICs (``cfg``, default `software_config` at 4 x 10 Gb/s: a 24 MiB transfer meets
    several stalls); ``stalls``: both hosts descheduled ~0.7 ms every 3 ms, or the hosts' stalls given."""
    cfg = cfg or software_config(10.0)
    hosts: dict[str, HostStalls] | None = None
    if stalls is True:
        hosts = {
            "a": HostStalls(3_000_000, 700_000, seed=seed),
            "b": HostStalls(3_000_000, 700_000, seed=seed + 50),
        }
    elif stalls:
        hosts = stalls
    return Pair(
        seed=seed,
        ports=4,
        buf_size=24 * MiB,
        config=cfg,
        latency_ns=20_000,
        link_bps=cfg.link_bps,
        timeout=14,
        stalls=hosts,
        **kw,  # type: ignore[arg-type]
    )


def test_a_descheduled_host_is_not_a_lossy_network() -> None:
    """Both hosts are descheduled for about 0.7 ms every 3 ms (a busy machine): what arrives meanwhile
    waits in the sockets, is read port by port in turns, late. That is lateness: almost nothing is sent
    again, and no EV is blamed. (Judging losses by when acknowledgements were read, with a plane-blind
    rotation and blame at the first answer, six such transfers resent 13.7 % of their packets and blamed
    248 EVs.)"""
    resent = sent = 0
    for seed in (1, 2, 3, 4):
        p = _software_pair(True, seed)
        _transfer(p, 6, 4 * MiB)
        assert p.now > 3_000_000, "the transfer met the stalls"
        assert _bad_events(p) == []
        resent += p.a.stats.retransmits
        sent += p.a.stats.tx_data
    assert resent <= 0.01 * sent, (resent, sent)


def test_a_failed_path_is_blamed_after_its_grace() -> None:
    """The contrast: an EV that loses everything is ASSUMED_BAD once a retransmission is acknowledged and no
    copy of the original turns up within the judging grace. (This pair does not pace: each NIC puts its
    whole window in its ports' queues at once, and a packet late by a queue that much deeper than another's
    may be blamed too; a few are.)"""
    p = _software_pair(False)
    evs = p.qp_a.evs
    assert evs is not None
    dead = evs.rotation[5].entropy
    p.fabric.imp.ev_fail = {dead: (0, None)}
    _transfer(p, 2, 4 * MiB)
    p.run(lambda: not p.qp_a.requester.rec.judging, max_time=p.now + 10**9)
    assert dead in _bad_events(p) and len(set(_bad_events(p))) <= len(evs.entries) // 10


def test_the_learned_window_falls_back_on_a_network_that_drops() -> None:
    p = _software_pair(False, imp=Impairments(loss=0.005))
    rec = p.qp_a.requester.rec
    rec.reo_learned, rec.reo_persist = 5_000_000, 4  # as if the host had been late
    _transfer(p, 4, 4 * MiB)
    assert rec.reo_learned == 0 and p.a.stats.losses_inferred >= 4


# -- a peer that answers nothing -----------------------------------------------------------------------------
def _silence(p: Pair, at: int) -> None:
    p.fabric.imp.port_fail = {port: (at, None) for port in range(1, 5)}


def test_a_dead_peer_fails_the_qp_in_the_time_its_attributes_give_at_a_small_cost() -> None:
    """Some EVs are ASSUMED_BAD (probed), then the peer dies in the middle of a Write: the QP ends in ERROR
    with RETRY_EXC_ERR ``time_to_error`` after the last answer, having sent about one packet per timeout
    and one probe per silent interval, not a probe per EV per probe interval."""
    p = _software_pair(False, retry_exp=7)
    evs = p.qp_a.evs
    assert evs is not None
    broken = [evs.rotation[i].entropy for i in (1, 2, 3)]
    p.fabric.imp.ev_fail = {e: (0, None) for e in broken}
    p.write(0, 24 * MiB)
    p.run(lambda: bool(evs.bad) and p.qp_a.requester.next_seq > 1000, max_time=10**9)
    death = p.now
    assert p.qp_a.requester.outstanding, "the peer dies with the Write in flight"
    _silence(p, death)
    hook = install_late(p)
    p.run(lambda: len(p.qp_a.send_cq) >= 1, max_time=death + 60 * 10**9, max_steps=2_000_000)
    (wc,) = p.completions()
    assert wc.status is WcStatus.RETRY_EXC_ERR
    ttl = p.qp_a.time_to_error()
    assert ttl == pytest.approx(262 * 1024 * (1 << 14) / 1e9)  # 4.4 s with timeout 14, retries 7 and 7
    elapsed = (p.now - death) / 1e9
    assert ttl <= elapsed <= ttl + 0.05
    # what leaves once the window in flight at the death is spent (the first timeout)
    since = death + p.qp_a.ack_timeout_ns
    sent = [s for s in hook if s[0] >= since]
    probes = [s for s in sent if not s[1]]
    span = (p.now - since) / 1e9
    assert len(sent) / span < 120, (len(sent), span)  # datagrams a second towards a dead peer
    assert len(probes) / span <= 101
    assert "retransmission timeouts in a row" in (p.qp_a.error_detail or "")


def install_late(p: Pair) -> list[tuple[int, bool]]:
    """Log (time, is data) of every packet ``p.a`` sends from now on."""
    log: list[tuple[int, bool]] = []
    send = p.fabric.send

    def logged(src, dst, t, now, name):  # type: ignore[no-untyped-def]
        if src is p.a:
            log.append((now, t.tpl is not None or t.packet.bth.opcode < 0xD0))
        send(src, dst, t, now, name)

    p.fabric.send = logged  # type: ignore[method-assign]
    return log


def test_a_stalled_peer_with_endless_retries_costs_a_bounded_rate() -> None:
    p = _software_pair(False, retry_exp=25)
    evs = p.qp_a.evs
    assert evs is not None
    p.fabric.imp.ev_fail = {evs.rotation[i].entropy: (0, None) for i in (1, 2)}
    p.write(0, 24 * MiB)
    p.run(lambda: bool(evs.bad) and p.qp_a.requester.next_seq > 1000, max_time=10**9)
    death = p.now
    assert p.qp_a.requester.outstanding
    _silence(p, death)
    log = install_late(p)
    p.run(max_time=death + 20 * 10**9, max_steps=2_000_000)
    assert p.qp_a.state.name == "RTS" and p.qp_a.time_to_error() == float("inf")
    since = death + p.qp_a.ack_timeout_ns
    assert len([s for s in log if s[0] >= since]) / 20 < 110, len(log)


# -- attributes --------------------------------------------------------------------------------------------
def test_an_ack_timeout_below_the_floor_is_raised_with_a_reason() -> None:
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        p = Pair(config=software_config(), timeout=8, retry_exp=7)
    assert any(issubclass(w.category, AckTimeoutWarning) and "floor" in str(w.message) for w in got)
    assert p.qp_a.ack_timeout_ns == SOFTWARE_MIN_ACK_TIMEOUT_NS
    assert p.qp_a.time_to_error() == pytest.approx(262 * SOFTWARE_MIN_ACK_TIMEOUT_NS / 1e9)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        q = Pair(config=software_config(), timeout=14)  # at or above the floor: nothing to say
    assert q.qp_a.ack_timeout_ns == 1024 << 14


# -- the peer's service time ------------------------------------------------------------------------------
def _responder_stalls(seed: int) -> Pair:
    """A software pair whose responder's host alone is descheduled for about 1.5 ms every 4 ms."""
    return _software_pair({"b": HostStalls(4_000_000, 1_500_000, seed=seed + 50)}, seed)


def test_a_peer_that_holds_its_acknowledgements_is_not_probed_for_a_lost_tail() -> None:
    """The responder is descheduled for ~1.5 ms while the requester sends: every acknowledgement waits in its
    host, so nothing comes back for longer than RFC 8985's tail probe wait of 2·srtt. A software NIC sends
    no tail probe (the peer answers nothing across paths: it is late, and it says how late). (Before the
    peer's service time and delay were allowed for, these three transfers sent 6 tail probes.)"""
    for seed in (1, 2, 3):
        p = _responder_stalls(seed)
        _transfer(p, 6, 4 * MiB)
        _transfer(p, 6, 4 * MiB)
        assert p.now > 8_000_000, "the transfers met the stalls"
        rec = p.qp_a.requester.rec
        assert 2 * rec.srtt < 1_000_000, "the stalls were longer than the probe wait of RFC 8985"
        assert p.a.stats.tail_probes == 0, seed


def _late_recovery(n: int) -> tuple[Recovery, list[SentPacket]]:
    """`_recovery` on a late host (a software NIC) whose peer reports its service times, four packets an
    EV."""
    return _recovery(n, software_config(), 4)


def _timer(rec: Recovery, now: int) -> None:
    rec.on_timer(now, True, bool(rec.by_order.live), False)


def test_acknowledgements_read_together_are_judged_together() -> None:
    """A late peer answers a backlog in a burst of SACKs, in the order it read its sockets: the first SACK
    of the burst acknowledges packets sent well after one that the next SACK acknowledges. Judged SACK by
    SACK, that one is lost; judged when the batch has been read (the driver's timer call), it is not."""
    rec, pkts = _late_recovery(400)
    for i, p in enumerate(pkts):
        rec.on_sent(p, i * 1_000)  # one packet a µs
    rec.rtt_sample(150_000)
    at = 1_000_000
    for p in pkts[200:]:  # read first: the later half
        rec.on_acked(p, at, -1)
    rec.on_ack_done(200, 200 * 4096, None, False, at, True)
    assert not pkts[0].lost, "not judged before the batch is in"
    for p in pkts[:200]:  # then the older half, in the same read
        rec.on_acked(p, at + 2_000, -1)
    rec.on_ack_done(200, 200 * 4096, None, False, at + 2_000, False)
    _timer(rec, at + 3_000)
    assert rec.stats.losses_inferred == 0 and not rec.retx


def test_a_silence_across_paths_is_the_peers_but_a_lost_burst_is_probed() -> None:
    """No answer at all for longer than the tail probe's wait: with the flight sprayed over many EVs the
    peer is late (or gone: the retransmission timeout's case) and no tail probe goes; a message sent as one
    burst on one EV, lost with its path, is probed as before."""
    rec, pkts = _late_recovery(64)
    rec.rtt_sample(150_000)
    for i, p in enumerate(pkts):
        rec.on_sent(p, i * 1_000)  # 16 EVs, four packets each
    rec.heard(64_000)
    late = 64_000 + rec.probe_wait(64_000) + 1
    _timer(rec, late)
    assert rec.stats.tail_probes == 0 and not rec.retx
    # one EV's burst (an idle QP's small message), unanswered
    rec, pkts = _late_recovery(4)
    rec.rtt_sample(150_000)
    for i, p in enumerate(pkts):
        rec.on_sent(p, i * 1_000)
    rec.heard(4_000)
    late = 4_000 + rec.probe_wait(4_000) + 1
    _timer(rec, late)
    assert rec.stats.tail_probes == 1 and rec.retx


def test_the_service_time_is_taken_out_of_the_rtt_the_congestion_control_sees() -> None:
    """MRC's NSCC delay is RTT − base RTT − service time: a SACK that says its trigger waited 300 µs in the
    peer's host gives the congestion control the RTT without those 300 µs (and the tail probe waits for a
    peer that slow); a service time longer than what the RTT leaves over the shortest RTT is not taken out."""
    rec, _ = _recovery(4)
    rec.rtt_sample(100_000)  # rtt_min 100 µs
    assert rec.peer_service(300_000, 450_000, 1_000) == 150_000
    assert rec.peer_service(300_000, 350_000, 2_000) == 350_000  # 50 µs left: below the shortest RTT
    assert rec.peer_service(300_000, None, 3_000) is None
    assert rec.peer_delay == 300_000
    assert rec.probe_wait(4_000) >= rec.srtt + 300_000
    # a second later without so long a delay, it is forgotten
    assert rec.probe_wait(2_000_000_000) < rec.srtt + 300_000
