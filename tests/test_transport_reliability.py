"""Reliability end to end through the pair harness: clean and impaired transfers, completion rules,
Write-with-Imm ordering, PSN wrap, retry exhaustion and the fatal remote errors."""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from openmrc.transport import Access, Nic, NicConfig, QpState, Transmit, WcOpcode, WcStatus, WorkCompletion
from openmrc.wire import BTH, NETH, PSN_MASK, NackReason, Opcode, Packet

from .helpers import Fabric, Impairments, Pair
from .transport_tools import (
    Received,
    Sent,
    feed_bytes,
    install,
    run_until_completions,
    statuses,
    tap_receive,
)

MTU = 4096
S = WcStatus


def assert_exact(p: Pair, length: int, offset: int = 0) -> None:
    """``[offset, offset+length)`` of the destination equals the source, and nothing else was written."""
    assert p.dst[offset : offset + length] == p.src[offset : offset + length]
    assert not any(p.dst[:offset]) and not any(p.dst[offset + length :])


def settle(p: Pair, ns: int = 1_000_000) -> None:
    """Let the pair run for ``ns`` more scripted nanoseconds (or until nothing is left to do)."""
    p.run(max_time=p.now + ns, max_steps=200_000)


def failed_then_flushed(wcs: list[WorkCompletion], ids: list[int], first: WcStatus) -> None:
    assert statuses(wcs) == [(ids[0], first)] + [(i, S.WR_FLUSH_ERR) for i in ids[1:]]


# -- clean transfers -------------------------------------------------------------------------------------


@pytest.mark.parametrize("size", [1, MTU, MTU + 1, 5 * MTU - 3])
def test_clean_transfer(size: int) -> None:
    p = Pair(seed=11, buf_size=1 << 16)
    wr = p.write(0, size)
    run_until_completions(p, 1)
    assert [(w.wr_id, w.status, w.byte_len, w.opcode) for w in p.completions()] == [
        (wr, S.SUCCESS, size, WcOpcode.RDMA_WRITE)
    ]
    assert_exact(p, size)
    assert p.a.stats.tx_data == -(-size // MTU) and p.a.stats.retransmits == 0


@pytest.mark.slow
def test_clean_transfer_64_mib() -> None:
    size = 64 << 20
    p = Pair(seed=2, buf_size=size)
    wr = p.write(0, size)
    run_until_completions(p, 1, max_steps=2_000_000)
    assert statuses(p.completions()) == [(wr, S.SUCCESS)]
    assert p.dst == p.src
    assert p.a.stats.tx_data == size // MTU and p.a.stats.retransmits == 0


def test_zero_length_writes_complete() -> None:
    p = Pair(buf_size=1 << 16)
    p.post_recv(1)
    ids = [p.write(0, 0), p.write(0, 0, imm=0x5EED)]
    p.run(lambda: len(p.qp_a.send_cq) >= 2, max_time=10**9, max_steps=100_000)
    assert [(w.imm_data, w.byte_len) for w in p.recv_completions()] == [(0x5EED, 0)]
    assert statuses(p.completions()) == [(i, S.SUCCESS) for i in ids]


def test_unsignaled_wrs_complete_silently() -> None:
    p = Pair(buf_size=1 << 18)
    for i in range(3):
        p.write(i * 3 * MTU, 3 * MTU, signaled=False)
    last = p.write(9 * MTU, 100)
    run_until_completions(p, 1)
    settle(p)
    assert statuses(p.completions()) == [(last, S.SUCCESS)]
    assert_exact(p, 9 * MTU + 100)
    assert not p.qp_a.requester.wrs  # the unsignaled ones were retired too


def test_unsignaled_completion_is_not_reported_before_earlier_signaled() -> None:
    p = Pair(buf_size=1 << 18)
    first = p.write(0, 8 * MTU)
    p.write(8 * MTU, MTU, signaled=False)
    third = p.write(9 * MTU, MTU)
    run_until_completions(p, 2)
    assert statuses(p.completions()) == [(first, S.SUCCESS), (third, S.SUCCESS)]


# -- Write with Immediate ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class ImmMsg:
    offset: int
    size: int
    imm: int


def imm_plan(sizes: list[int]) -> list[ImmMsg]:
    plan, off = [], 0
    for i, size in enumerate(sizes):
        plan.append(ImmMsg(off, size, 0xC0DE0000 + i))
        off += size
    return plan


def post_imm(p: Pair, plan: list[ImmMsg]) -> list[int]:
    p.post_recv(len(plan))  # receives first: MRC has no RNR
    return [p.write(m.offset, m.size, imm=m.imm) for m in plan]


def check_imm_completions(p: Pair, plan: list[ImmMsg], send_ids: list[int]) -> None:
    rwcs = p.recv_completions()
    assert [(w.status, w.opcode, w.imm_data, w.byte_len) for w in rwcs] == [
        (S.SUCCESS, WcOpcode.RECV_RDMA_WITH_IMM, m.imm, m.size) for m in plan
    ]
    assert [w.wr_id for w in rwcs] == sorted(w.wr_id for w in rwcs)  # posted receives used in order
    assert statuses(p.completions()) == [(i, S.SUCCESS) for i in send_ids]
    end = plan[-1].offset + plan[-1].size
    assert_exact(p, end)


def imm_arrivals(log: list[Received], plan_len: int) -> list[int]:
    """imm_data of the Write-with-Imm last packets in the order the responder got them (first copy)."""
    seen: list[int] = []
    for r in log:
        imm = r.packet.imm
        if imm is not None and imm.imm_data not in seen:
            seen.append(imm.imm_data)
    assert len(seen) == plan_len
    return seen


def test_write_with_imm_completes_in_post_order_when_tails_arrive_reversed() -> None:
    plan = imm_plan([3 * MTU, 2 * MTU + 100, MTU + 1, 3 * MTU, 17])
    last_psns: dict[int, int] = {}
    psn = 0
    for i, m in enumerate(plan):
        psn += -(-m.size // MTU)
        last_psns[psn - 1] = i
    n = len(plan)

    def hold_back_tails(s: Sent) -> int:
        # First transmission of the last packet of message i arrives (n - i) * 30 µs late: reversed order.
        i = last_psns.get(s.psn)
        return (n - i) * 30_000 if s.src == "a" and s.is_data and not s.rtx and i is not None else 0

    # Packets held back this long are queued somewhere, and queues mark ECN: a QP that sees congestion
    # waits at least the base RTT before it takes a late packet for a lost one. A base RTT above the
    # longest hold-back: the tail loss rules must wait for these late tails.
    p = Pair(seed=4, buf_size=1 << 16, config=NicConfig(base_rtt_ns=400_000), imp=Impairments(ecn=1.0))
    install(p, hold_back_tails)
    log = tap_receive(p, p.b)
    ids = post_imm(p, plan)
    run_until_completions(p, n)
    assert imm_arrivals(log, n) == [m.imm for m in reversed(plan)]  # the premise: tails really reversed
    assert p.a.stats.retransmits == 0
    check_imm_completions(p, plan, ids)


@pytest.mark.parametrize("seed", range(3))
def test_write_with_imm_in_order_under_random_reordering(seed: int) -> None:
    plan = imm_plan([MTU * (1 + i % 3) - 7 * i for i in range(12)])
    p = Pair(seed=seed, buf_size=1 << 17, imp=Impairments(reorder_ns=40_000))
    log = tap_receive(p, p.b)
    ids = post_imm(p, plan)
    run_until_completions(p, len(plan))
    arrivals = imm_arrivals(log, len(plan))
    assert arrivals != sorted(arrivals)  # the premise: some tails overtook earlier ones
    check_imm_completions(p, plan, ids)


# -- PSN wrap-around ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "imp", [None, Impairments(loss=0.05, reorder_ns=3_000, trim=0.02)], ids=["clean", "lossy"]
)
def test_psn_wrap(imp: Impairments | None) -> None:
    start = 0xFFFFF0
    p = Pair(seed=6, buf_size=1 << 20, sq_psn=start, rq_psn=start, imp=imp)
    hook = install(p)
    plan = imm_plan([1 << 18, 100, (1 << 18) + 5, 3 * MTU])
    ids = post_imm(p, plan)
    run_until_completions(p, len(plan))
    check_imm_completions(p, plan, ids)
    psns = {s.psn for s in hook.select(src="a", data=True)}
    assert {PSN_MASK, 0, 1} <= psns and start in psns  # the transfer really crossed 2^24
    assert all(0 <= x <= PSN_MASK for x in psns)


# -- impairments --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Wr:
    offset: int
    size: int
    signaled: bool
    imm: int | None = None


PLAN = [
    Wr(0, 1, True),
    Wr(1, MTU, False),
    Wr(1 + MTU, 300_000, True, imm=7),
    Wr(301_000, 1 << 20, True),
    Wr(1_400_000, MTU + 1, False, imm=8),
    Wr(1_410_000, 500_000, True),
    Wr(1_910_000, 17, True, imm=9),
]


@settings(max_examples=6, deadline=None, derandomize=True)
@given(
    seed=st.integers(0, 1 << 16),
    fail_port=st.integers(1, 4),
    fail_at=st.integers(5_000, 40_000),  # while the transfer is under way
)
def test_combined_impairments_are_bit_exact(seed: int, fail_port: int, fail_at: int) -> None:
    imp = Impairments(
        loss=0.05, dup=0.02, reorder_ns=5_000, trim=0.02, port_fail={fail_port: (fail_at, None)}
    )
    p = Pair(seed=seed, imp=imp, buf_size=2 << 20)
    hook = install(p)
    p.post_recv(sum(w.imm is not None for w in PLAN))
    ids = [p.write(w.offset, w.size, imm=w.imm, signaled=w.signaled) for w in PLAN]
    signaled = [i for i, w in zip(ids, PLAN, strict=True) if w.signaled]
    run_until_completions(p, len(signaled), max_steps=400_000)
    settle(p, 2_000_000)  # no late duplicate completion
    assert statuses(p.completions()) == [(i, S.SUCCESS) for i in signaled]
    assert [(w.imm_data, w.status) for w in p.recv_completions()] == [
        (w.imm, S.SUCCESS) for w in PLAN if w.imm is not None
    ]
    for w in PLAN:
        assert p.dst[w.offset : w.offset + w.size] == p.src[w.offset : w.offset + w.size]
    written = bytearray(len(p.dst))
    for w in PLAN:
        written[w.offset : w.offset + w.size] = p.src[w.offset : w.offset + w.size]
    assert p.dst == written  # and not a byte elsewhere
    assert p.qp_a.state is QpState.RTS and p.a.stats.retransmits > 0
    assert hook.select(src="a", port=fail_port, since=fail_at, data=True)  # the port failed mid-transfer


# -- retry exhaustion --------------------------------------------------------------------------------------


def blackhole_pair() -> tuple[Pair, list[int]]:
    p = Pair(imp=Impairments(loss=1.0), timeout=1, retry_linear=2, retry_exp=1, buf_size=1 << 16)
    ids = [p.write(0, 3 * MTU), p.write(0, 100, signaled=False), p.write(0, MTU)]
    return p, ids


def test_retry_exhaustion_fails_the_qp() -> None:
    p, ids = blackhole_pair()
    p.run(lambda: p.qp_a.state is QpState.ERROR, max_steps=10_000)
    assert p.qp_a.state is QpState.ERROR
    failed_then_flushed(p.completions(), ids, S.RETRY_EXC_ERR)
    # 1 + retry_linear + retry_exp timeouts: the first three retried, the fourth exhausts.
    assert p.a.stats.timeouts == 1 + 2 + 1
    assert not any(p.dst)


def test_retry_exhaustion_lets_the_driver_go_idle() -> None:
    p, _ids = blackhole_pair()
    p.run(max_steps=10_000)  # raises "too many steps" if a timer keeps firing at the same instant
    assert p.qp_a.state is QpState.ERROR
    assert p.a.get_timer() is None


# -- fatal remote errors -----------------------------------------------------------------------------------

ACCESS_CASES = ["wrong rkey", "past the end", "before the start", "no REMOTE_WRITE"]


@pytest.mark.parametrize("case", ACCESS_CASES)
def test_remote_access_violation_writes_nothing_and_fails_the_requester(case: str) -> None:
    access = Access.LOCAL_WRITE if case == "no REMOTE_WRITE" else Access.LOCAL_WRITE | Access.REMOTE_WRITE
    p = Pair(buf_size=1 << 16, access=access)
    size = 3 * MTU + 10
    rkey, remote_addr = {  # (rkey, remote_addr); None: the valid one
        "wrong rkey": (p.mr_b.rkey ^ 0x00010000, None),
        "past the end": (None, p.mr_b.addr + len(p.dst)),
        "before the start": (None, p.mr_b.addr - size),
        "no REMOTE_WRITE": (None, None),
    }[case]
    ids = [p.write(0, n, rkey=rkey, remote_addr=remote_addr) for n in (size, MTU)]
    p.run(lambda: p.qp_a.state is QpState.ERROR, max_steps=10_000)
    settle(p)
    assert p.qp_a.state is QpState.ERROR
    failed_then_flushed(p.completions(), ids, S.REM_ACCESS_ERR)
    assert not any(p.dst)
    assert p.b.stats.access_errors >= 1 and p.b.stats.rx_data == 0


def test_max_wimm_dest_exceeded_fails_the_requester() -> None:
    p = Pair(max_wimm_dest=1, buf_size=1 << 16)
    install(p, lambda s: 20_000 if s.is_data and s.psn == 0 and not s.rtx else 0)  # tails 1, 2 first
    plan = imm_plan([100, 100, 100])
    ids = post_imm(p, plan)
    p.run(lambda: p.qp_a.state is QpState.ERROR, max_steps=10_000)
    settle(p)
    assert p.qp_a.state is QpState.ERROR
    wcs = p.completions()
    assert sorted(w.wr_id for w in wcs) == ids and all(w.status is not S.SUCCESS for w in wcs)
    assert p.qp_b.state is QpState.ERROR and p.b.stats.protocol_errors >= 1


def test_max_wimm_gates_the_requester_below_max_wimm_dest() -> None:
    p = Pair(max_wimm=1, max_wimm_dest=1, buf_size=1 << 16)
    install(p, lambda s: 20_000 if s.is_data and s.psn == 0 and not s.rtx else 0)
    plan = imm_plan([100, 2 * MTU, 100])
    ids = post_imm(p, plan)
    run_until_completions(p, len(plan))
    check_imm_completions(p, plan, ids)


def test_write_with_imm_without_a_posted_receive_fails_the_requester() -> None:
    p = Pair(buf_size=1 << 16)
    wr = p.write(0, 100, imm=5)
    p.run(lambda: len(p.qp_a.send_cq) > 0 or p.qp_a.state is QpState.ERROR, max_steps=10_000)
    settle(p)
    assert p.qp_b.state is QpState.ERROR  # the responder noticed
    assert p.qp_a.state is QpState.ERROR
    assert [w.status for w in p.completions() if w.wr_id == wr] != [S.SUCCESS]


def unexp_nack(p: Pair, psn: int) -> Packet:
    return Packet(
        BTH(Opcode.NACK, dest_qp=p.qp_a.qp_num, psn=psn),
        neth=NETH(
            reason=NackReason.UNEXP_EVENT,
            src_qp=p.qp_b.qp_num & 0xFFFF,
            dst_qp=p.qp_a.qp_num & 0xFFFF,
            psn=psn,
            cc_type=1,
        ),
    )


@pytest.mark.parametrize("as_bytes", [False, True], ids=["packet", "bytes"])
def test_nack_unexp_event_fails_the_requester_at_once(as_bytes: bool) -> None:
    p = Pair(buf_size=1 << 16)
    ids = [p.write(0, 4 * MTU), p.write(0, MTU, signaled=False), p.write(0, MTU)]
    p.step()  # every packet in flight, none acknowledged yet
    assert len(p.qp_a.requester.outstanding) == 6 and not len(p.qp_a.send_cq)
    nack = unexp_nack(p, psn=min(p.qp_a.requester.outstanding))  # about a packet really in flight
    if as_bytes:
        feed_bytes(p.a, nack, 1, p.now, src="b")
    else:
        p.a.receive(nack, 1, p.now, src="b")
    assert p.qp_a.state is QpState.ERROR  # at once, before any further step
    failed_then_flushed(p.completions(), ids, S.REM_OP_ERR)
    out = p.a.datagrams_to_send(p.now)
    assert not [t for t in out if isinstance(t.packet, Packet) and t.packet.is_data]


def test_retriable_nack_retransmits_on_a_fresh_ev() -> None:
    p = Pair(buf_size=1 << 16)
    hook = install(p)
    wr = p.write(0, 2 * MTU)
    p.step()  # both packets sent
    first = next(s for s in hook.select(src="a", data=True) if s.psn == 0)
    nack = unexp_nack(p, psn=0)
    assert nack.neth is not None
    nack.neth.reason = NackReason.NO_RESOURCE
    nack.neth.entropy = first.entropy
    p.a.receive(nack, 1, p.now, src="b")
    run_until_completions(p, 1)
    assert statuses(p.completions()) == [(wr, S.SUCCESS)]
    again = [s for s in hook.select(src="a", data=True) if s.psn == 0 and s.rtx]
    assert len(again) == 1 and again[0].entropy != first.entropy


@pytest.mark.parametrize("lost", [1, 3])  # a middle packet; the last one (only a tail probe can tell)
def test_a_small_write_recovers_a_lost_packet_well_before_a_timeout(lost: int) -> None:
    """Four packets: fewer than the reordering allowance follow any of them, so the count rule alone could
    never fire. A lost middle packet is inferred once a later one is acknowledged and it is old enough; a
    lost last packet is found by one tail loss probe. Neither waits for the retransmission timeout."""
    p = Pair(seed=5, buf_size=1 << 16, timeout=8)  # RTO = 1.024 µs · 2^8 ≈ 262 µs
    rto = 1024 << 8

    def lose_first_copy(s: Sent) -> int:
        return 10**12 if s.src == "a" and s.is_data and not s.rtx and s.psn == lost else 0

    hook = install(p, lose_first_copy)
    p.write(0, 4 * MTU)
    run_until_completions(p, 1)
    (wc,) = p.completions()
    assert wc.status is WcStatus.SUCCESS and p.dst[: 4 * MTU] == p.src[: 4 * MTU]
    stats = p.a.stats
    assert stats.timeouts == 0 and stats.retransmits == 1
    assert p.now < rto // 4  # a few RTTs (2 µs one way here), not a timeout
    assert len(hook.select(src="a", data=True)) == 5
    if lost == 3:
        assert stats.tail_probes == 1
    else:
        assert stats.losses_inferred == 1 and stats.tail_probes == 0


def test_a_lost_tail_is_probed_after_two_rtts_of_its_own_path_not_of_the_longest() -> None:
    """The configured base RTT is the longest path's; a QP whose paths are shorter (a ring neighbour under
    the same T0) resends a lost tail after about 2·srtt plus the SACK delay (RFC 8985's PTO), not after
    two longest-path RTTs: a collective step of a few packets waits on that."""
    base_rtt = 40_000  # ten times this pair's RTT (2 µs each way)
    p = Pair(seed=5, buf_size=1 << 16, config=NicConfig(base_rtt_ns=base_rtt))

    def lose_first_copy_of_the_last(s: Sent) -> int:
        return 10**12 if s.src == "a" and s.is_data and not s.rtx and s.psn == 7 else 0

    hook = install(p, lose_first_copy_of_the_last)
    p.write(0, 4 * MTU)  # one round first: the QP learns its RTT
    run_until_completions(p, 1)
    assert [wc.status for wc in p.completions()] == [WcStatus.SUCCESS]
    p.write(4 * MTU, 4 * MTU)
    run_until_completions(p, 1)
    assert [wc.status for wc in p.completions()] == [WcStatus.SUCCESS]
    assert p.a.stats.tail_probes == 1 and p.a.stats.timeouts == 0
    sent = [s.time for s in hook.select(src="a", data=True) if s.psn == 7]
    assert len(sent) == 2
    srtt = p.qp_a.requester.srtt
    assert 0 < srtt < base_rtt // 4
    # the PTO (here its floor, half the base RTT) counts from the last acknowledgement: an RTT after the
    # send, plus the responder's SACK delay (the message's last packet, which would send it at once, is lost)
    sack_delay = p.a.config.sack_delay_ns
    pto = max(2 * srtt + sack_delay, base_rtt // 2)
    assert sent[1] - sent[0] <= srtt + sack_delay + pto + 1_000 < base_rtt


def test_a_packet_that_fills_a_hole_is_acknowledged_at_once() -> None:
    """Later packets came first, so the requester may already be timing the late one as lost: its SACK
    goes at the instant it arrives (RFC 5681 §4.2), not after the coalescing delay, or a quiet QP's short
    loss wait would resend it spuriously."""
    p = Pair(seed=3, buf_size=1 << 16)
    late = 1

    def hold_back(s: Sent) -> int:
        return 700 if s.src == "a" and s.is_data and s.psn == late else 0

    hook = install(p, hold_back)
    rx_b = tap_receive(p, p.b)
    p.write(0, 8 * MTU)
    run_until_completions(p, 1)
    assert statuses(p.completions()) == [(1, WcStatus.SUCCESS)]
    order = [r.packet.bth.psn for r in rx_b if r.packet.bth.opcode != Opcode.ACK]
    assert order.index(late) > order.index(late + 1)  # it really came after a later one
    arrival = next(r.time for r in rx_b if r.packet.bth.psn == late and r.packet.bth.opcode != Opcode.ACK)
    assert arrival in {s.time for s in hook.select(src="b", data=False)}
    assert p.a.stats.retransmits == 0


# Every field of a `Transmit`: what the core sets and what a simulated fabric writes while carrying it.
_TRANSMIT_FIELDS = (
    "port", "peer", "ev", "entropy", "qp_num", "size", "tpl", "op", "ack_req", "rtx", "psn", "va", "payload",
    "wire_size", "src", "addr", "seg", "flow_crc", "ecn", "trim", "epoch", "hop", "is_data",
)  # fmt: skip


class CarryingFabric(Fabric):
    """A fabric that carries the `Transmit` objects the NICs emit, as the simulator does: it writes their
    fabric fields when they enter, holds the first transmission of PSN ``hold`` for ``hold_ns`` more, and
    hands each object to the peer's `Nic.receive_transmit`."""

    def __init__(self, base: Fabric, hold: int, hold_ns: int) -> None:
        super().__init__(base.rng, base.imp, latency_ns=base.latency)
        self.hold, self.hold_ns = hold, hold_ns
        self.held: Transmit | None = None
        self.held_until = 0
        self.carried: list[tuple[int, Transmit, dict[str, object]]] = []  # (time, object, fields on entry)
        self.queue: list[tuple[int, int, Nic, Transmit, str]] = []

    def send(self, src: Nic, dst: Nic, t: Transmit, now: int, src_name: str) -> None:
        t.wire_size, t.src, t.addr, t.seg, t.flow_crc = t.size + 64, ord(src_name), 1 << 100, 7, 0x5A5A
        t.ecn, t.epoch, t.hop = False, 3, self
        at = now + self.latency
        if self.held is None and t.is_data and t.psn == self.hold:
            self.held, at = t, at + self.hold_ns
            self.held_until = at
        self.carried.append((now, t, {k: getattr(t, k) for k in _TRANSMIT_FIELDS}))
        heapq.heappush(self.queue, (at, next(self.seq), dst, t, src_name))

    def next_time(self) -> int | None:
        return self.queue[0][0] if self.queue else None

    def deliver_until(self, now: int) -> None:
        while self.queue and self.queue[0][0] <= now:
            _at, _seq, dst, t, src = heapq.heappop(self.queue)
            dst.receive_transmit(t, t.port, now, t.ecn, t.entropy, t.trim, src)


def test_a_retransmission_leaves_the_first_copy_in_flight_untouched() -> None:
    """A fabric carries (and writes) the very objects a NIC emits: the retransmission sent while the first
    copy of a packet is still in flight is a new object with the same packet fields, and nothing the
    requester does then (loss, retransmission, acknowledgement) writes a field of the copy in flight."""
    p = Pair(seed=5, buf_size=1 << 16)
    fabric = CarryingFabric(p.fabric, hold=1, hold_ns=2_000_000)
    p.fabric = fabric
    wr = p.write(0, 6 * MTU)
    run_until_completions(p, 1)
    settle(p, 3_000_000)  # the held copy arrives too (a duplicate by then)
    assert statuses(p.completions()) == [(wr, S.SUCCESS)]
    assert_exact(p, 6 * MTU)
    first = fabric.held
    assert first is not None and not fabric.queue
    resent = [(at, t) for at, t, _ in fabric.carried if t.is_data and t.psn == 1 and t is not first]
    assert resent and all(at < fabric.held_until for at, _ in resent)  # while the first was in flight
    for _at, t in resent:
        assert t.rtx and not first.rtx
        same = ("op", "ack_req", "psn", "va", "qp_num", "tpl", "peer")
        assert [getattr(t, k) for k in same] == [getattr(first, k) for k in same]
        assert bytes(t.payload) == bytes(first.payload) == p.src[MTU : 2 * MTU]
    # every object the fabric carried, the held first copy included, still has the fields it entered with
    for _at, t, fields in fabric.carried:
        assert {k: getattr(t, k) for k in _TRANSMIT_FIELDS} == fields
