"""The transport core against abuse: admin actions that cannot fail, QPs that never hang without a path,
forged feedback that is never obeyed, integrity of raw bytes, and one meaning of the port rate."""

from __future__ import annotations

import errno
import random

import pytest

from openmrc.ev import EVState
from openmrc.transport import LocalProtocolError, Nic, NicConfig, QpState, WcStatus
from openmrc.wire import (
    AETH,
    BTH,
    ERTH,
    METH,
    NETH,
    PETH,
    RESERVED_QP_ENDPOINT,
    RETH,
    SETH,
    AethSyndrome,
    CcState,
    EpOp,
    ImmDt,
    NackReason,
    Opcode,
    Packet,
    WireError,
    parse,
    seal,
    trim_datagram,
)

from .helpers import Impairments, Pair
from .test_transport_timers import LOST, run_checked
from .transport_tools import TEST_ADDR, Sent, deliver_sack, install, statuses

MTU = 4096
S = WcStatus


# -- defect 2: the last port going down -------------------------------------------------------------------


def test_last_port_down_is_counted_not_raised_and_up_again_tells_the_peer() -> None:
    p = Pair(ports=2, buf_size=1 << 16)
    p.a.port_down(1, now=0)
    p.a.port_down(2, now=10)  # no port left to send the update on
    assert p.a.stats.ep_unsent == 1 and p.a.local_port_status() == 0
    p.a.port_up(2, now=20)
    out = p.a.datagrams_to_send(20)
    updates = [t for t in out if isinstance(t.packet, Packet) and t.packet.erth is not None]
    assert updates and all(t.packet.erth.port_status == 0b10 for t in updates)  # type: ignore[union-attr]


# -- defect 3: work, no usable path, nothing in flight -------------------------------------------------------


def test_write_with_every_port_down_fails_after_the_retry_budget() -> None:
    p = Pair(ports=2, buf_size=1 << 16, timeout=4, retry_linear=2, retry_exp=2)
    for port in (1, 2):
        p.a.port_down(port, now=0)
    wr = p.write(0, 2 * MTU)
    assert not p.a.datagrams_to_send(0)  # nothing can leave...
    assert p.a.get_timer() is not None  # ...and the QP keeps a timer
    run_checked(p, 1)
    assert statuses(p.completions()) == [(wr, S.RETRY_EXC_ERR)]
    assert p.qp_a.state is QpState.ERROR and p.a.stats.timeouts == 5
    assert p.now < 10**9


def test_write_with_every_port_down_resumes_when_a_port_comes_back() -> None:
    p = Pair(ports=2, buf_size=1 << 16, timeout=4, retry_linear=7, retry_exp=7)
    for port in (1, 2):
        p.a.port_down(port, now=0)
    wr = p.write(0, 2 * MTU)
    run_checked(p, 1, max_time=100_000)
    assert not len(p.qp_a.send_cq) and p.a.stats.timeouts >= 2
    p.a.port_up(2, now=p.now)
    run_checked(p, 1)
    assert statuses(p.completions()) == [(wr, S.SUCCESS)] and p.dst[: 2 * MTU] == p.src[: 2 * MTU]


def port_status_update(status: int) -> Packet:
    return Packet(
        BTH(Opcode.EP_REQUEST, dest_qp=RESERVED_QP_ENDPOINT, psn=77),
        erth=ERTH(op=EpOp.PORT_STATUS_UPDATE, port_status=status),
    )


@pytest.mark.parametrize("claimed", [0, 0b0001], ids=["all-down", "three-down"])
def test_a_wrong_port_status_update_is_found_out_by_probes(claimed: int) -> None:
    """A single update from "b" claiming its ports are down (they are not): the QP probes the doubted
    planes, learns from the answers that they work, and finishes on every plane."""
    p = Pair(buf_size=1 << 20)
    p.a.receive(port_status_update(claimed), 1, 0, src="b")
    assert p.qp_a.evs is not None and p.qp_a.evs.doubted == [
        q for q in (1, 2, 3, 4) if not claimed >> (q - 1) & 1
    ]
    hook = install(p)
    wr = p.write(0, 1 << 20)
    run_checked(p, 1)
    assert statuses(p.completions()) == [(wr, S.SUCCESS)] and p.dst == p.src
    assert p.a.peer_ports["b"] == 0b1111 and not p.qp_a.evs.doubted
    probes = {s.port for s in hook.select(src="a") if s.opcode == Opcode.PROBE}
    assert probes == {q for q in (1, 2, 3, 4) if not claimed >> (q - 1) & 1}
    assert p.now < 2_000_000  # found out within a retransmission timeout or so, not after the retry budget


def test_a_peer_port_really_down_stays_unused_and_the_rest_carries_the_write() -> None:
    imp = Impairments(port_fail={3: (0, None)})  # plane 3 is dead both ways
    p = Pair(buf_size=1 << 20, imp=imp)
    p.a.receive(port_status_update(0b1011), 1, 0, src="b")
    hook = install(p)
    wr = p.write(0, 1 << 20)
    run_checked(p, 1)
    assert statuses(p.completions()) == [(wr, S.SUCCESS)] and p.dst == p.src
    assert not [s for s in hook.select(src="a", port=3, data=True)]
    assert p.a.peer_ports["b"] == 0b1011  # nothing answered on plane 3


# -- defect 4: feedback about PSNs this QP never sent --------------------------------------------------------


def running_pair() -> Pair:
    p = Pair(buf_size=1 << 20)
    p.write(0, 1 << 20)
    for _ in range(3):
        p.step()
    assert p.qp_a.requester.outstanding
    return p


def far_psn(p: Pair) -> int:
    return (p.qp_a.requester.cack + (1 << 22)) & 0xFFFFFF


def nack(p: Pair, psn: int, reason: NackReason) -> Packet:
    return Packet(
        BTH(Opcode.NACK, dest_qp=p.qp_a.qp_num, psn=psn),
        neth=NETH(
            reason=reason, src_qp=p.qp_b.qp_num & 0xFFFF, dst_qp=p.qp_a.qp_num & 0xFFFF, psn=psn, cc_type=1
        ),
    )


def finishes(p: Pair) -> None:
    run_checked(p, 1)
    assert statuses(p.completions()) == [(1, S.SUCCESS)] and p.dst == p.src


@pytest.mark.parametrize(
    "forge",
    [
        lambda p: nack(p, far_psn(p), NackReason.UNEXP_EVENT),
        lambda p: nack(p, far_psn(p), NackReason.TRIMMED),
        lambda p: nack(p, (p.qp_a.requester.next_seq + 5) & 0xFFFFFF, NackReason.UNEXP_EVENT),
        lambda p: Packet(
            BTH(Opcode.ACK, dest_qp=p.qp_a.qp_num, psn=far_psn(p)),
            aeth=AETH(AethSyndrome.NAK_REMOTE_ACCESS_ERROR, 0),
        ),
        lambda p: Packet(
            BTH(Opcode.ACK, dest_qp=p.qp_a.qp_num, psn=(p.qp_a.requester.cack - 1) & 0xFFFFFF),
            aeth=AETH(AethSyndrome.NAK_INVALID_REQUEST, 0),
        ),
    ],
    ids=["unexp-far", "trim-far", "unexp-unsent", "aeth-access-far", "aeth-acked"],
)
def test_forged_nak_about_a_psn_not_outstanding_is_dropped_and_counted(forge) -> None:  # type: ignore[no-untyped-def]
    p = running_pair()
    before = p.a.stats.rx_bogus_ack
    p.a.receive(forge(p), 1, p.now, src="b")
    assert p.qp_a.state is QpState.RTS and p.a.stats.rx_bogus_ack == before + 1
    finishes(p)


def test_nak_from_the_wrong_qp_pair_is_dropped() -> None:
    p = running_pair()
    psn = min(p.qp_a.requester.outstanding) & 0xFFFFFF
    forged = nack(p, psn, NackReason.UNEXP_EVENT)
    assert forged.neth is not None
    forged.neth.src_qp ^= 0x5A5A  # knows our QP number and a live PSN, not the peer's QP
    p.a.receive(forged, 1, p.now, src="b")
    assert p.qp_a.state is QpState.RTS and p.a.stats.rx_bogus_ack == 1
    finishes(p)


def sack(p: Pair, cack: int, **kw: int) -> Packet:
    seth = {"src_qp": p.qp_b.qp_num & 0xFFFF, "dst_qp": p.qp_a.qp_num & 0xFFFF} | kw
    return Packet(
        BTH(Opcode.SACK, dest_qp=p.qp_a.qp_num, psn=cack & 0xFFFFFF),
        seth=SETH(cack_psn=cack & 0xFFFFFF, **seth),
        cc_state=CcState(),
    )


@pytest.mark.parametrize(
    "forge",
    [
        lambda p, r: sack(p, r.next_seq + r.mpr * 128 + 1),  # past any window the responder can have
        lambda p, r: sack(p, r.next_seq + 1),  # one PSN past what was sent
        lambda p, r: sack(p, r.cack, sack_offset=r.next_seq - r.cack, bitmap=1),  # a bit for an unsent PSN
        # a true bit (the oldest packet in flight) beside one for a PSN never sent: the SACK cannot be true
        lambda p, r: sack(p, r.cack, sack_offset=r.next_seq - 32 - r.cack, bitmap=1 | 1 << 40),
        lambda p, r: sack(p, r.cack - 9 * 128 * 8),  # far older than the window
        lambda p, r: sack(p, r.cack, pr=True, entropy=r.qp.evs.rotation[0].entropy),  # no probe outstanding
        lambda p, r: sack(p, max(r.outstanding) + 1, src_qp=(p.qp_b.qp_num ^ 0x5A5A) & 0xFFFF),  # wrong peer
        lambda p, r: sack(p, max(r.outstanding) + 1, dst_qp=(p.qp_a.qp_num ^ 0x5A5A) & 0xFFFF),  # not ours
    ],
    ids=[
        "cack-past-any-window",
        "cack-past-next-psn",
        "bit-for-unsent-psn",
        "true-bit-beside-unsent",
        "cack-ancient",
        "probe-answer-unasked",
        "wrong-src-qp",
        "wrong-dst-qp",
    ],
)
@pytest.mark.parametrize("via", ["packet", "fields"])
def test_forged_sack_is_dropped_and_changes_nothing(forge, via: str) -> None:  # type: ignore[no-untyped-def]
    p = running_pair()
    r = p.qp_a.requester
    state = (r.cack, len(r.outstanding), r.inflight, r.next_seq)
    deliver_sack(p, forge(p, r), via)
    assert (r.cack, len(r.outstanding), r.inflight, r.next_seq) == state
    assert p.a.stats.rx_bogus_ack == 1
    finishes(p)


@pytest.mark.parametrize("via", ["packet", "fields"])
@pytest.mark.parametrize("how", ["bitmap", "only-bit"])
def test_a_forged_bit_for_a_lost_packet_completes_nothing_and_the_packet_is_sent_again(
    via: str, how: str
) -> None:
    """A packet is lost, and a forged SACK (fields right, in the window) says it arrived: the Write does
    not complete on a bitmap's word (only the cumulative acknowledgement completes), and when the
    cumulative acknowledgement stays below it until a retransmission timeout, it is sent again from the
    Write's memory: the transfer ends bit-exact, not stalled for ever with 4 KiB missing."""
    p = Pair(buf_size=1 << 16, timeout=8)
    lost = 3
    sends = 0

    def drop(s: Sent) -> int:
        nonlocal sends
        if s.src == "a" and s.is_data and s.psn == lost:
            sends += 1
            return LOST if sends == 1 else 0
        return 0

    install(p, drop)
    p.write(0, 1 << 16)
    r = p.qp_a.requester
    p.run(lambda: r.next_seq > lost + 1, max_time=10**9)
    bits = 1 if how == "only-bit" else (1 << (r.next_seq - lost)) - 1  # the lost packet and what followed
    deliver_sack(p, sack(p, lost, sack_offset=0, bitmap=bits), via)
    assert p.a.stats.rx_bogus_ack == 0 and lost not in r.outstanding  # believed: nothing tells it from true
    assert not p.completions()
    run_checked(p, 1)
    assert statuses(p.completions()) == [(1, S.SUCCESS)] and p.dst == p.src
    assert sends == 2 and p.a.stats.sacks_reneged >= 1


@pytest.mark.parametrize("via", ["packet", "fields"])
def test_forged_probe_answer_does_not_restore_a_bad_ev(via: str) -> None:
    p = running_pair()
    evs = p.qp_a.evs
    assert evs is not None
    e = evs.rotation[5]
    evs.mark_bad(e, p.now)
    for _ in range(3):
        deliver_sack(p, sack(p, p.qp_a.requester.cack, pr=True, entropy=e.entropy), via)
    assert e.state.name == "ASSUMED_BAD" and p.a.stats.rx_bogus_ack == 3


def test_forged_write_with_a_wrong_rkey_for_an_unsent_psn_does_not_kill_the_requester() -> None:
    p = running_pair()
    psn = (p.qp_a.requester.next_seq + 100) & 0xFFFFFF  # in the responder's window, never sent
    forged = Packet(
        BTH(Opcode.WRITE_ONLY, dest_qp=p.qp_b.qp_num, psn=psn, ack_req=True),
        METH(0, 1),
        None,
        RETH(p.mr_b.addr, p.mr_b.rkey ^ 0xFFFF, 8),
        payload=b"\xee" * 8,
    )
    p.b.receive(forged, 1, p.now, src="a")
    assert p.b.stats.access_errors == 1  # refused, nothing written
    finishes(p)
    assert p.a.stats.rx_bogus_ack >= 1  # the responder's NAK reached the requester and was not obeyed


def test_probe_of_an_unknown_peer_qp_pair_is_ignored_by_the_requester() -> None:
    """A probe is answered by the responder; the answer reaches a requester that sent no probe: dropped."""
    p = running_pair()
    probe = Packet(
        BTH(Opcode.PROBE, dest_qp=p.qp_b.qp_num, psn=0),
        peth=PETH(probe_id=9, src_qp=p.qp_a.qp_num & 0xFFFF, dst_qp=p.qp_b.qp_num & 0xFFFF),
    )
    p.b.receive(probe, 1, p.now, entropy=p.qp_a.evs.rotation[0].entropy, src="a")  # type: ignore[union-attr]
    finishes(p)
    assert p.a.stats.rx_bogus_ack >= 1


# -- defect 5: integrity of raw bytes ------------------------------------------------------------------------


def test_bit_flips_on_the_wire_are_all_dropped_and_the_transfer_is_bit_exact() -> None:
    size = 16 << 20
    p = Pair(seed=11, buf_size=size, wire=True, imp=Impairments(corrupt=0.01))
    wr = p.write(0, size)
    run_checked(p, 1)
    assert statuses(p.completions()) == [(wr, S.SUCCESS)] and p.dst == p.src
    p.run(max_time=p.now + 1_000_000)  # deliver what is still in flight
    dropped = p.a.stats.rx_bad_icrc + p.b.stats.rx_bad_icrc
    assert p.fabric.corrupted > 40 and dropped == p.fabric.corrupted
    assert p.a.stats.rx_malformed + p.b.stats.rx_malformed == 0


def test_a_datagram_with_a_valid_icrc_for_other_addresses_is_dropped() -> None:
    from openmrc.wire import Addressing

    p = running_pair()
    pkt = sack(p, p.qp_a.requester.cack)
    raw = seal(pkt, Addressing("2001:db8::1", "2001:db8::2", 0xC000))
    p.a.receive_datagram(raw, 1, p.now, Addressing("2001:db8::1", "2001:db8::3", 0xC000))
    assert p.a.stats.rx_bad_icrc == 1


def test_receive_refuses_raw_bytes_with_a_reason() -> None:
    p = Pair()
    with pytest.raises(LocalProtocolError, match="receive_datagram"):
        p.a.receive(b"\x00" * 40, 1, 0)  # type: ignore[arg-type]
    with pytest.raises(LocalProtocolError, match="Addressing"):
        p.a.receive_datagram(b"\x00" * 40, 1, 0, ("::1", "::1", 1, 2))  # type: ignore[arg-type]


# -- defect 6: the port rate means one port ------------------------------------------------------------------


@pytest.mark.parametrize("ports", [1, 4])
def test_a_multi_port_qp_reaches_the_aggregate_line_rate(ports: int) -> None:
    size = 4 << 20
    p = Pair(buf_size=size, ports=ports, config=NicConfig(link_bps=100_000_000_000))
    wr = p.write(0, size)
    run_checked(p, 1)
    assert statuses(p.completions()) == [(wr, S.SUCCESS)]
    goodput = size * 8 / (p.now * 1e-9)
    assert goodput >= 0.85 * ports * p.fabric.link_bps


# -- an API that is hard to misuse ---------------------------------------------------------------------------


def test_now_is_keyword_only_where_it_follows_other_arguments() -> None:
    p = Pair()
    with pytest.raises(TypeError):
        p.qp_a.modify(QpState.ERROR, 5)  # type: ignore[misc]
    with pytest.raises(TypeError):
        p.a.port_down(1, 5)  # type: ignore[misc]
    p.qp_a.modify(QpState.ERROR, now=5)
    assert p.qp_a.state is QpState.ERROR


@pytest.mark.parametrize(
    ("call", "errname"),
    [
        (lambda p: Nic(0, rng=random.Random(1)), "EINVAL"),
        (lambda p: p.a.ev_profile(42), "ENOENT"),
        (lambda p: p.a.add_cc_profile(3, "no-such-cc"), "EINVAL"),
        (
            lambda p: p.a.modify_ev_state(p.qp_a, p.qp_a.evs.rotation[0].entropy, EVState.SKIP, now=0),
            "EINVAL",
        ),
        (lambda p: p.a.modify_ev_state(p.qp_a, 0xDEAD, EVState.DENIED, now=0), "ENOENT"),
        (lambda p: p.a.port_down(9, now=0), "EINVAL"),
        (lambda p: p.qp_a.modify(QpState.INIT), "EINVAL"),
    ],
    ids=["ports", "ev-profile", "cc-name", "ev-state-skip", "ev-unknown", "port", "transition"],
)
def test_api_misuse_raises_local_protocol_error_with_an_errno(call, errname: str) -> None:  # type: ignore[no-untyped-def]
    p = Pair()
    with pytest.raises(LocalProtocolError) as info:
        call(p)
    assert errno.errorcode[info.value.errno] == errname and info.value.reason


def test_ev_states_are_queryable() -> None:
    p = Pair(buf_size=1 << 16)
    before = p.qp_a.ev_states()
    assert len(before) == p.a.config.default_ev_count and all(s.state is EVState.GOOD for s in before)
    assert sum(s.active for s in before) == len(p.qp_a.evs.rotation)  # type: ignore[union-attr]
    victim = next(s for s in before if s.active)
    p.a.modify_ev_state(p.qp_a, victim.entropy, EVState.DENIED, now=0)
    p.a.port_down(2, now=0)
    after = {s.entropy: s for s in p.qp_a.ev_states()}
    assert after[victim.entropy].state is EVState.DENIED and not after[victim.entropy].usable
    assert all(not s.usable for s in after.values() if s.port == 2)
    assert all(s.usable for s in after.values() if s.port != 2 and s.state is EVState.GOOD and s.active)


def test_trim_helper_cuts_a_datagram_to_its_headers() -> None:
    p = running_pair()
    hook_pkt = Packet(
        BTH(Opcode.WRITE_ONLY_WITH_IMM, dest_qp=p.qp_b.qp_num, psn=1),
        METH(1, 1),
        None,
        RETH(p.mr_b.addr, p.mr_b.rkey, 100),
        ImmDt(7),
        payload=b"\x01" * 100,
    )
    raw = seal(hook_pkt, TEST_ADDR)
    cut = trim_datagram(raw)
    assert len(cut) == hook_pkt.header_size() + 4 and cut[:-4] == raw[: hook_pkt.header_size()]
    assert parse(cut, trimmed=True).reth == hook_pkt.reth
    with pytest.raises(WireError):
        trim_datagram(sack(p, 0).encode())  # control packets are never trimmed


# -- a storm of forged feedback ------------------------------------------------------------------------------


def forged_feedback(p: Pair, rng: random.Random) -> Packet:
    """A SACK, NACK, AETH NAK or probe answer aimed at QP a with random fields: QP ids right or wrong,
    PSNs anywhere outside what QP a has outstanding."""
    r = p.qp_a.requester
    while True:  # a PSN this QP cannot tell from a real one is out of scope (RDMA has no authentication)
        psn = rng.getrandbits(24)
        seq = r.cack + ((psn - r.cack + (1 << 23)) & 0xFFFFFF) - (1 << 23)
        if not r.cack - 1024 <= seq <= r.next_seq + 64:
            break
    right = rng.random() < 0.7
    src_qp = p.qp_b.qp_num & 0xFFFF if right else rng.getrandbits(16)
    dst_qp = p.qp_a.qp_num & 0xFFFF if right else rng.getrandbits(16)
    kind = rng.randrange(4)
    if kind == 0:
        reason = rng.choice(list(NackReason))
        return Packet(
            BTH(Opcode.NACK, dest_qp=p.qp_a.qp_num, psn=psn),
            neth=NETH(reason=reason, src_qp=src_qp, dst_qp=dst_qp, psn=psn, entropy=rng.getrandbits(32)),
        )
    if kind == 1:
        syndrome = rng.choice(
            [
                AethSyndrome.NAK_REMOTE_ACCESS_ERROR,
                AethSyndrome.NAK_INVALID_REQUEST,
                AethSyndrome.NAK_REMOTE_OPERATIONAL_ERROR,
            ]
        )
        return Packet(BTH(Opcode.ACK, dest_qp=p.qp_a.qp_num, psn=psn), aeth=AETH(syndrome, 0))
    evs = p.qp_a.evs
    assert evs is not None
    seth = SETH(
        src_qp=src_qp,
        dst_qp=dst_qp,
        cack_psn=psn,
        pr=kind == 3,
        m=rng.randrange(3),
        entropy=rng.choice(evs.entries).entropy,
        sack_offset=rng.randrange(-64, 64),
        bitmap=rng.getrandbits(64),
    )
    return Packet(BTH(Opcode.SACK, dest_qp=p.qp_a.qp_num, psn=psn), seth=seth, cc_state=CcState())


@pytest.mark.parametrize("seed", range(4))
def test_a_storm_of_forged_feedback_never_stops_an_impaired_transfer(seed: int) -> None:
    imp = Impairments(loss=0.01, dup=0.01, reorder_ns=4_000, trim=0.02)
    p = Pair(seed=seed, buf_size=1 << 20, imp=imp)
    rng = random.Random(seed)
    wr = p.write(0, 1 << 20)
    forged = 0
    while not len(p.qp_a.send_cq):
        assert p.step() and p.now < 10**9
        for _ in range(rng.randrange(3)):
            p.a.receive(forged_feedback(p, rng), rng.randint(1, 4), p.now, src="b")
            forged += 1
    assert statuses(p.completions()) == [(wr, S.SUCCESS)] and p.dst == p.src
    assert forged > 200 and p.a.stats.rx_bogus_ack >= forged  # every one dropped (plus stale real ones)


def test_a_forged_cumulative_acknowledgement_ends_in_errors_both_sides_not_a_silent_stall() -> None:
    """A packet is lost and a forged SACK's cumulative PSN (in the window, below what was sent) covers it:
    nothing tells it from a true one, so the requester completes the Write. The responder's hole persists:
    it asks for the packet (NACK), the requester finds the contradiction and fails its QP naming the PSN,
    and the responder, asking in vain, fails its own after its NACKs: the Write with Immediate's receive is
    flushed, not left waiting for ever. (Without authentication, that is the most a requester can do.)"""
    p = Pair(buf_size=1 << 16, timeout=8)
    lost = 3

    def drop(s: Sent) -> int:
        return LOST if s.src == "a" and s.is_data and s.psn == lost else 0

    install(p, drop)
    p.post_recv(1)
    p.write(0, 1 << 16, imm=0xABC)
    r = p.qp_a.requester
    p.run(lambda: r.next_seq == 16, max_time=10**9)
    deliver_sack(p, sack(p, r.next_seq), "fields")
    assert p.a.stats.rx_bogus_ack == 0
    p.run(lambda: p.qp_b.state is QpState.ERROR, max_time=p.now + 10**10)
    assert p.qp_a.state is QpState.ERROR and f"PSN {lost}" in p.qp_a.error_detail
    assert p.qp_b.state is QpState.ERROR and "never arrived" in p.qp_b.error_detail
    assert p.b.stats.nacks_sent >= 1
    assert [w.status for w in p.qp_b.recv_cq.poll(4)] == [S.WR_FLUSH_ERR]
