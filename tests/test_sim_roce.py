"""The RoCEv2 baseline's DCQCN: reaction-point rate math, the notification point's CNP pacing, per-QP rate
pacing on a wire, and a small incast on a Clos fabric."""

from __future__ import annotations

import random

import pytest

from openmrc.sim.config import FabricSimConfig
from openmrc.sim.engine import Simulator
from openmrc.sim.fabric_sim import FabricSim
from openmrc.sim.network import HEADER_BYTES, Port, sim_packet
from openmrc.sim.roce import CNP_OPCODE, DcqcnConfig, ReactionPoint, RoceConfig, RoceHost, RoceQp
from openmrc.transport import Transmit
from openmrc.wire import BTH, METH, RETH, Opcode, Packet

LINE = 100_000_000_000
G = 1 / 256


# -- reaction point ------------------------------------------------------------------------------------------
def test_a_cnp_cuts_the_rate_by_half_alpha_and_raises_alpha() -> None:
    r = ReactionPoint(DcqcnConfig(alpha_init=0.5), LINE)
    assert not r.limiting and r.next_deadline() is None
    r.on_cnp(0)
    assert r.limiting
    assert r.target == LINE
    assert r.rate == pytest.approx(LINE * (1 - 0.5 / 2))
    assert r.alpha == pytest.approx((1 - G) * 0.5 + G)
    assert r.alpha > 0.5
    before = r.rate
    r.on_cnp(1_000)
    assert r.target == before  # Rt remembers the rate the cut started from
    assert r.rate == pytest.approx(before * (1 - ((1 - G) * 0.5 + G) / 2))


def test_alpha_decays_only_over_periods_without_a_cnp() -> None:
    cfg = DcqcnConfig(alpha_init=0.5)
    r = ReactionPoint(cfg, LINE)
    r.on_cnp(0)
    after_cnp = r.alpha
    r.on_timer(cfg.alpha_period_ns)  # this period saw the CNP: no decay
    assert r.alpha == after_cnp
    r.on_timer(2 * cfg.alpha_period_ns)  # a quiet period
    assert r.alpha == pytest.approx(after_cnp * (1 - G))
    r.on_cnp(2 * cfg.alpha_period_ns + 1)
    raised = r.alpha
    r.on_timer(3 * cfg.alpha_period_ns)
    assert r.alpha == raised


def increase_by_timer(r: ReactionPoint, n: int) -> list[tuple[int, int]]:
    """Fire the rate-increase timer ``n`` times; returns (Rc, Rt) after each."""
    out: list[tuple[int, int]] = []
    for _ in range(n):
        at = r.increase_at
        assert at is not None
        r.on_timer(at)
        out.append((r.rate, r.target))
    return out


def test_fast_recovery_halves_the_gap_to_the_target_then_additive_increase() -> None:
    cfg = DcqcnConfig()
    r = ReactionPoint(cfg, LINE)
    r.on_cnp(0)
    r.on_cnp(1)  # Rt = LINE/2, Rc about LINE/4
    target = r.target
    gap = target - r.rate
    steps = increase_by_timer(r, cfg.fast_recovery_steps)
    for k, (rate, tgt) in enumerate(steps, 1):
        assert tgt == target
        assert target - rate == pytest.approx(gap / 2**k, abs=k)
    (rate, tgt), *_ = increase_by_timer(r, 1)  # past F timer events: additive increase
    assert tgt == target + cfg.rai_bps
    assert steps[-1][0] < rate <= tgt
    (_, tgt2), *_ = increase_by_timer(r, 1)
    assert tgt2 == tgt + cfg.rai_bps  # the byte counter has not passed F: still additive


def test_hyper_increase_once_timer_and_byte_counter_both_pass_f() -> None:
    cfg = DcqcnConfig(byte_counter=10_000, rhai_bps=20_000_000_000, rai_bps=1_000_000_000)
    r = ReactionPoint(cfg, LINE)
    for t in range(4):
        r.on_cnp(t)
    f = cfg.fast_recovery_steps
    r.on_sent(10_000 * f)  # F byte-counter events: fast recovery, target unchanged
    target = r.target
    r.on_sent(10_000)  # BC passes F: additive
    assert r.target == target + cfg.rai_bps
    increase_by_timer(r, f)  # T reaches F: still additive (only BC has passed F)
    assert r.target == target + (f + 1) * cfg.rai_bps
    before = r.target
    increase_by_timer(r, 1)  # both past F: hyper increase
    assert r.target == before + cfg.rhai_bps


def test_rates_stay_within_min_and_line_rate_and_the_limiter_is_freed() -> None:
    cfg = DcqcnConfig(min_rate_bps=1_000_000_000)
    r = ReactionPoint(cfg, LINE)
    for t in range(50):
        r.on_cnp(t)
    assert r.rate == cfg.min_rate_bps
    r.on_sent(cfg.byte_counter * (cfg.fast_recovery_steps + 1))  # BC past F: the timer soon hyper-increases
    steps: list[tuple[int, int]] = []
    while r.limiting and len(steps) < 100:
        steps += increase_by_timer(r, 1)
    assert all(cfg.min_rate_bps <= rate <= tgt <= LINE for rate, tgt in steps)
    assert r.rate == r.target == LINE
    assert not r.limiting and r.next_deadline() is None  # no more timers
    assert r.alpha == cfg.alpha_init  # the next congestion episode starts afresh


# -- hosts on one wire ---------------------------------------------------------------------------------------
def wire(dcqcn: DcqcnConfig | None) -> tuple[Simulator, RoceHost, RoceHost]:
    sim = Simulator()
    cfg = RoceConfig(dcqcn=dcqcn)
    a, b = RoceHost(sim, 0, cfg), RoceHost(sim, 1, cfg)
    rng = random.Random(1)
    for x, y in ((a, b), (b, a)):
        x.ports.append(
            Port(sim, y, LINE, 1_000, buffer=1 << 62, ecn=None, trimming=False, last_hop=False, rng=rng)
        )
    return sim, a, b


def flow(a: RoceHost, b: RoceHost, size: int) -> RoceQp:
    qp = RoceQp(0x1234, a.id, b.id, size, a.cfg.mtu, 50_000)
    a.add_sender(qp)
    b.rcv[qp.qpn] = qp
    return qp


def marked(qp: RoceQp, psn: int) -> Transmit:
    p = Packet(BTH(Opcode.WRITE_MIDDLE, dest_qp=qp.qpn, psn=psn), METH(), None, RETH(0, 1, qp.size))
    sp = sim_packet(p, 4096 + HEADER_BYTES, 0, qp.src, qp.dst, 1, qp.sport)
    sp.ecn = True
    return sp


def test_the_notification_point_sends_at_most_one_cnp_per_interval() -> None:
    cfg = DcqcnConfig()
    sim, a, b = wire(cfg)
    qp = flow(a, b, 1 << 20)
    for t in range(0, 4 * cfg.cnp_interval_ns, cfg.cnp_interval_ns // 5):  # a marked packet every 10 µs
        sim.schedule(t, b.arrive, marked(qp, 0))
    sim.run(until=4 * cfg.cnp_interval_ns)
    assert b.cnps_sent == 4
    assert a.cnps_received == 4
    assert qp.rp is not None and qp.rp.rate < LINE


def test_no_cnps_without_dcqcn() -> None:
    sim, a, b = wire(None)
    qp = flow(a, b, 1 << 20)
    sim.schedule(0, b.arrive, marked(qp, 0))
    sim.run()
    assert b.cnps_sent == a.cnps_received == 0 and qp.rp is None


def fct(dcqcn: DcqcnConfig | None, cut: bool) -> int:
    sim, a, b = wire(dcqcn)
    qp = flow(a, b, 256 << 10)
    if cut:  # a CNP before the flow starts: alpha = 1 halves the rate
        cnp = Packet(BTH(CNP_OPCODE, dest_qp=qp.qpn))
        a.arrive(sim_packet(cnp, HEADER_BYTES, 0, b.id, a.id, 1, 0))
    a.pump(0)
    sim.run()
    assert qp.done_at is not None
    return qp.done_at


def test_a_qp_is_paced_at_its_current_rate() -> None:
    cfg = DcqcnConfig()
    line = fct(None, cut=False)
    assert fct(cfg, cut=False) == pytest.approx(line, rel=0.02)  # at line rate pacing costs nothing
    serialise = 64 * (4096 + HEADER_BYTES) * 8_000_000_000 // LINE
    assert fct(cfg, cut=True) - line == pytest.approx(serialise, rel=0.05)  # half rate: twice as long


# -- a fabric ------------------------------------------------------------------------------------------------
def incast(dcqcn: bool) -> tuple[FabricSim, dict[str, object]]:
    # 1 MiB flows: a 256 KiB flow fits in one 64-packet window and leaves before the first CNP is back.
    cfg = FabricSimConfig(
        planes=1,
        hosts=16,
        t0_radix=8,
        t1_radix=8,
        routing="ecmp",
        transport="roce",
        trimming=False,
        dcqcn=dcqcn,
    )
    sim = FabricSim.clos(cfg)
    for s in range(1, 8):
        sim.add_flow(s, 0, 1 << 20)
    return sim, sim.run(until=10**9).summary()


def test_dcqcn_tames_an_incast() -> None:
    off_sim, off = incast(False)
    on_sim, on = incast(True)
    assert on["completed"] == off["completed"] == 7
    hosts = [n for n in on_sim.nodes if isinstance(n, RoceHost)]
    sent = sum(h.cnps_sent for h in hosts)
    assert sent > 0 and sum(h.cnps_received for h in hosts) == sent
    assert hosts[0].cnps_sent == sent  # only the incast's receiver is congested
    assert all(q.rp is not None and q.rp.rate < LINE for h in hosts for q in h.qps)
    assert isinstance(on["drops"], int) and isinstance(off["drops"], int)
    assert isinstance(on["retransmits"], int) and isinstance(off["retransmits"], int)
    assert on["drops"] < off["drops"] and on["retransmits"] < off["retransmits"]
    last_hop = next(p for n in on_sim.nodes[16:] for p in n.ports if p.peer is on_sim.nodes[0])
    assert last_hop.marks > 0  # RoCE switches mark on the host-facing hop too
    assert sum(h.cnps_sent for h in off_sim.nodes if isinstance(h, RoceHost)) == 0
    assert incast(True)[1] == on  # deterministic
