"""The timer contract of the sans-IO core: after ``handle_timer(now)``, ``get_timer()`` is None or later than
``now`` (a driver never spins, a simulated clock always advances), under scripted and random impairments."""

from __future__ import annotations

import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from openmrc.transport import Nic, Qp, QpInitAttr, WcStatus

from .helpers import Impairments, Pair
from .transport_tools import Sent, install, statuses

MTU = 4096
LOST = 10**12  # an extra delay no run waits for: the packet is as good as dropped


def run_checked(p: Pair, done: int, *, max_steps: int = 200_000, max_time: int = 10**11) -> None:
    """Step until ``done`` completions (or nothing is left to happen); `Pair.step` checks the timer
    contract for every NIC whose timer fires."""
    for _ in range(max_steps):
        if len(p.qp_a.send_cq) >= done or p.now > max_time or not p.step():
            return
    raise AssertionError("too many steps: the pair does not make progress")


def test_lost_tail_loss_probe_does_not_spin_the_timer() -> None:
    """One 3-packet Write: packet 2 is late by 60 µs, packet 3 and its tail loss probe are lost. The check
    timer must not re-arm in the past; the retransmission timeout recovers."""
    p = Pair(buf_size=1 << 16, timeout=8)
    psn3_sends = 0

    def delay(s: Sent) -> int:
        nonlocal psn3_sends
        if s.src != "a" or not s.is_data:
            return 0
        if s.psn == 1 and not s.rtx:
            return 60_000
        if s.psn == 2:
            psn3_sends += 1
            return LOST if psn3_sends <= 2 else 0  # the packet, then its probe
        return 0

    install(p, delay)
    wr = p.write(0, 3 * MTU)
    run_checked(p, 1)
    assert statuses(p.qp_a.send_cq.poll(8)) == [(wr, WcStatus.SUCCESS)]
    assert p.dst[: 3 * MTU] == p.src[: 3 * MTU]
    assert p.a.stats.tail_probes == 1 and p.a.stats.timeouts >= 1 and psn3_sends == 3


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**16),
    loss=st.sampled_from([0.0, 0.01, 0.05, 0.2]),
    dup=st.sampled_from([0.0, 0.05]),
    reorder_ns=st.sampled_from([0, 5_000, 60_000]),
    trim=st.sampled_from([0.0, 0.05]),
    ecn=st.sampled_from([0.0, 0.1]),
    sizes=st.lists(st.integers(0, 6 * MTU), min_size=1, max_size=4),
    port_fail=st.sampled_from([None, (1, 20_000, None), (2, 10_000, 200_000)]),
    ev_fail=st.booleans(),
    wire=st.booleans(),
)
def test_timer_contract_under_random_impairments(
    seed: int,
    loss: float,
    dup: float,
    reorder_ns: int,
    trim: float,
    ecn: float,
    sizes: list[int],
    port_fail: tuple[int, int, int | None] | None,
    ev_fail: bool,
    wire: bool,
) -> None:
    imp = Impairments(loss=loss, dup=dup, reorder_ns=reorder_ns, trim=trim, ecn=ecn, corrupt=0.02 * wire)
    if port_fail is not None:
        imp.port_fail = {port_fail[0]: port_fail[1:]}
    p = Pair(seed=seed, buf_size=1 << 16, imp=imp, wire=wire, timeout=6, retry_exp=6)
    if ev_fail:
        assert p.qp_a.evs is not None
        for e in p.qp_a.evs.rotation[:8]:
            imp.ev_fail[e.entropy] = (5_000, None)
    offset = 0
    for n in sizes:
        n = min(n, (1 << 16) - offset)
        p.write(offset, n)
        offset += n
    run_checked(p, len(sizes), max_time=2 * 10**9)
    wcs = p.qp_a.send_cq.poll(64)
    assert len(wcs) == len(sizes)  # every Write ends: success, or an error after the retry budget
    for w in wcs:
        assert w.status in (WcStatus.SUCCESS, WcStatus.RETRY_EXC_ERR, WcStatus.WR_FLUSH_ERR)
    if all(w.status is WcStatus.SUCCESS for w in wcs):
        assert p.dst[:offset] == p.src[:offset]


# (QP, its new deadline: None cancels it, else that many ns from now), or (None, ns the clock moves on)
_MOVES = st.one_of(
    st.tuples(st.integers(0, 4), st.one_of(st.none(), st.integers(0, 40))),
    st.tuples(st.none(), st.integers(0, 30)),
)


@settings(max_examples=200, deadline=None)
@given(moves=st.lists(_MOVES, max_size=80), gone=st.one_of(st.none(), st.integers(0, 4)))
def test_the_timer_heap_answers_as_the_list_of_deadlines_would(
    moves: list[tuple[int | None, int | None]], gone: int | None
) -> None:
    """Deadlines of five QPs on one NIC that move earlier, later, back to a value they had, or go, and a
    QP destroyed half-way: `get_timer` is always the earliest of them, `timer_floor` never after it (-1
    only once there is none), and `handle_timer(now)` runs exactly the QPs due by ``now``."""
    nic = Nic(2, rng=random.Random(1))
    qps: list[Qp | None] = [
        nic.create_qp(QpInitAttr(send_cq=nic.create_cq(), recv_cq=nic.create_cq())) for _ in range(5)
    ]
    deadline: dict[int, int] = {}  # the model: QP index -> deadline
    now = 0
    for k, (i, v) in enumerate(moves):
        dead = qps[gone] if gone is not None and k == len(moves) // 2 else None
        if gone is not None and dead is not None:
            nic.destroy_qp(dead)
            deadline.pop(gone, None)
            qps[gone] = None
        if i is not None:
            qp = qps[i]
            if qp is None:
                continue
            qp.responder.sack_deadline = None if v is None else now + v  # (a fresh QP's only timer)
            nic.wake(qp)
            if v is None:
                deadline.pop(i, None)
            else:
                deadline[i] = now + v
            continue
        floor = nic.timer_floor()
        expected = min(deadline.values(), default=None)
        assert nic.get_timer() == expected
        assert (0 <= floor <= expected) if expected is not None else nic.timer_floor() == -1
        now += v or 0
        due = {j for j, d in deadline.items() if d <= now}
        nic.handle_timer(now)
        for j, q in enumerate(qps):
            if q is not None:
                assert (q.responder.sack_deadline is None) == (j in due or j not in deadline)
        for j in due:
            del deadline[j]
        after = nic.get_timer()
        assert after is None or after > now


def test_a_qp_with_work_keeps_a_timer_whatever_the_drivers_budget() -> None:
    """Every port is down (signalled) and the driver, whose ports can take nothing, asks for no data
    (``max_data=0``, as the driver contract allows): the posted Write still has a timer, and runs into its
    retransmission timeouts until the QP fails with RETRY_EXC_ERR instead of waiting for ever."""
    for budget in (0, None):
        p = Pair(buf_size=1 << 16, timeout=8, retry_exp=3)
        for port in range(1, p.a.num_ports + 1):
            p.a.port_down(port, now=p.now)
        p.write(0, 2 * MTU)
        for _ in range(200):
            assert p.a.datagrams_to_send(p.now, budget) == []
            due = p.a.get_timer()
            assert due is not None, f"max_data={budget}: a QP with work and no timer"
            p.now = max(p.now, due)
            p.a.handle_timer(p.now)
            if len(p.qp_a.send_cq):
                break
        assert statuses(p.qp_a.send_cq.poll(4))[0][1] is WcStatus.RETRY_EXC_ERR
