"""Simulated failures: links failing mid-transfer, ECMP reconvergence, flapping links, dead switches,
degraded links, random loss on a plane, and the argument checks of every failure call."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import pytest

from openmrc.fabric import FatTree
from openmrc.sim.config import FabricSimConfig
from openmrc.sim.engine import Simulator
from openmrc.sim.fabric_sim import FabricSim
from openmrc.sim.flows import Flow
from openmrc.sim.network import HEADER_BYTES, Node, Port, sim_packet
from openmrc.sim.routing import EcmpRouting
from openmrc.sim.workloads import permutation
from openmrc.transport import Transmit, TrimMark, WcStatus
from openmrc.wire import BTH, METH, RETH, Opcode, Packet
from tests.sim_tools import UNTIL, all_succeeded, clos, topo_of


def probe(sim: FabricSim, at: int, read: Callable[[], Any]) -> list[Any]:
    """What ``read()`` returns at simulated time ``at`` (a one-element list once the run got there)."""
    out: list[Any] = []
    sim.sim.schedule(at, lambda _: out.append(read()))
    return out


# -- a link failing mid-transfer ---------------------------------------------------------------------------
def test_a_link_failing_mid_transfer_loses_packets_and_mrc_completes() -> None:
    sim = clos()
    flows = permutation(sim, 512 << 10, seed=2)
    node, port = sim.faults.t0_uplink(0, 0, 0)
    fwd, back = sim.faults.link(node, port)
    carried = probe(sim, 4_999, lambda: fwd.sent_bytes + back.sent_bytes)
    sim.faults.fail_link(node, port, at=5_000)
    res = sim.run(until=UNTIL)
    assert carried[0] > 0  # the link was in use when it failed
    assert not fwd.up and not back.up
    assert fwd.drops + back.drops > 0  # what it queued or carried was lost
    assert res.counters["retransmits"] > 0
    assert all_succeeded(flows)
    assert res.failures == [(5_000, "plane 0: T0 0 ↔ T1 0 link (p0-t0-0 ↔ p0-t1-0) down")]


def sink_port(sim: Simulator) -> tuple[Port, list[tuple[int, Transmit]]]:
    got: list[tuple[int, Transmit]] = []

    class Sink(Node):
        def arrive(self, p: Transmit) -> None:
            got.append((sim.now, p))

    port = Port(
        sim,
        Sink(0),
        100_000_000_000,
        1_000,
        buffer=3 * 4160,
        ecn=None,
        trimming=True,
        last_hop=False,
        rng=random.Random(1),
    )
    port.guarded = True  # as `FailureInjector.fail_port` sets it
    return port, got


def data() -> Transmit:
    payload = memoryview(bytes(4096))
    pkt = Packet(BTH(Opcode.WRITE_MIDDLE), meth=METH(), reth=RETH(0, 1, 1 << 20), payload=payload)
    return sim_packet(pkt, 4096 + HEADER_BYTES, 0, 0, 1, 1, 0)


def test_a_port_going_down_loses_what_it_queued_and_carried() -> None:
    sim = Simulator()
    port, got = sink_port(sim)
    for _ in range(3):
        port.send(data(), 0)  # one on the wire, two queued
    sim.schedule(100, port.set_up, False)
    sim.schedule(200, port.set_up, True)
    sim.run()
    assert got == [] and port.drops == 3 and port.epoch == 1
    port.send(data(), sim.now)
    sim.run()
    assert len(got) == 1  # up again: new packets get through


def test_a_port_that_went_down_starts_with_an_empty_queue() -> None:
    sim = Simulator()
    port, got = sink_port(sim)
    for _ in range(3):
        port.send(data(), 0)  # fills the buffer
    sim.schedule(100, port.set_up, False)
    sim.schedule(200, port.set_up, True)
    late = data()
    sim.schedule(300, lambda _: port.send(late, 300))
    sim.run()
    assert port.drops == 3
    ser = late.wire_size * 8_000_000_000 // port.bps
    assert late.trim is TrimMark.NONE  # the queue was lost with the link: nothing to trim for
    assert got == [(300 + ser + 1_000, late)]


# -- ECMP reconvergence ------------------------------------------------------------------------------------
RECONVERGE = 50_000


def test_ecmp_reconverges_around_a_dead_t0_uplink_after_the_delay() -> None:
    sim = clos(routing="ecmp", ecmp_reconverge_ns=RECONVERGE)
    topo = topo_of(sim)
    routing = sim.routing
    assert isinstance(routing, EcmpRouting)
    hpt = topo.hosts_per_t0
    up = tuple(range(hpt, hpt + topo.uplinks))
    t0 = topo.t0(1, 0)
    node, port = sim.faults.t0_uplink(1, 0, 2)
    assert (node, port) == (t0, hpt + 2)
    sim.faults.fail_link(node, port, at=1_000, up_at=200_000)
    sim.sim.run(until=1_000 + RECONVERGE - 1)
    assert not sim.nodes[node].ports[port].up
    assert routing.candidates(t0, 15) == up  # not converged yet: still hashed onto the dead link
    sim.sim.run(until=1_000 + RECONVERGE)
    assert routing.candidates(t0, 15) == tuple(p for p in up if p != port)
    assert routing.candidates(t0, 2) == (2,)  # hosts under the same T0 are unaffected
    assert routing.candidates(topo.t0(0, 0), 15) == up  # so is the other plane
    assert routing.candidates(topo.t0(1, 1), 15) == up  # and the other T0s (T1 2 still reaches T0 3)
    assert routing.candidates(topo.t0(1, 3), 0) == tuple(p for p in up if p != port)  # T1 2 lost T0 0
    assert sim.faults.reconvergences == 1
    sim.sim.run(until=200_000 + RECONVERGE)
    assert routing.candidates(t0, 15) == up and not routing.dead
    assert sim.faults.reconvergences == 2


def test_ecmp_reconverges_around_a_dead_t1_downlink() -> None:
    sim = clos(routing="ecmp", ecmp_reconverge_ns=RECONVERGE)
    topo = topo_of(sim)
    routing = sim.routing
    assert isinstance(routing, EcmpRouting)
    hpt = topo.hosts_per_t0
    up = tuple(range(hpt, hpt + topo.uplinks))
    t1 = topo.t1(0, 1)
    sim.faults.fail_link(t1, 3, at=0)  # T1 1 of plane 0 loses its link to T0 3 (hosts 12..15)
    sim.sim.run(until=RECONVERGE)
    without = tuple(p for p in up if p != hpt + 1)
    for t0 in range(3):
        assert routing.candidates(topo.t0(0, t0), 13) == without  # T1 1 no longer reaches T0 3
        assert routing.candidates(topo.t0(0, t0), 5 if t0 != 1 else 0) == up  # it still reaches others
    assert routing.candidates(topo.t0(0, 3), 0) == without
    assert routing.candidates(topo.t0(1, 0), 13) == up
    assert sim.counters()["reconvergences"] == 1


def test_without_reconvergence_ecmp_never_withdraws() -> None:
    sim = clos(routing="ecmp", ecmp_reconverge_ns=None)
    topo = topo_of(sim)
    routing = sim.routing
    assert isinstance(routing, EcmpRouting)
    hpt = topo.hosts_per_t0
    sim.faults.fail_link(*sim.faults.t0_uplink(0, 0, 1), at=1_000)
    sim.sim.run(until=10_000_000)
    assert not routing.dead
    assert routing.candidates(topo.t0(0, 0), 15) == tuple(range(hpt, hpt + topo.uplinks))
    assert sim.faults.reconvergences == 0 and "reconvergences" not in sim.counters()


def test_ecmp_reconvergence_on_a_fat_tree() -> None:
    topo = FatTree.from_k(4)
    sim = FabricSim.fat_tree(
        topo, FabricSimConfig(routing="ecmp", mtu=4084, seed=2, ecmp_reconverge_ns=RECONVERGE)
    )
    routing = sim.routing
    assert isinstance(routing, EcmpRouting)
    tor = topo.tor(0)
    port = topo.port_to(tor, topo.agg(0))
    other = topo.port_to(tor, topo.agg(1))
    assert set(routing.candidates(tor, 15)) == {port, other}
    flows = permutation(sim, 256 << 10, seed=2)
    sim.faults.fail_link(tor, port, at=2_000)
    res = sim.run(until=UNTIL)
    assert all_succeeded(flows)
    assert res.now > 2_000 + RECONVERGE  # the run outlasted the convergence delay
    assert routing.candidates(tor, 15) == (other,)
    assert res.counters["reconvergences"] == 1


def roce_clos(**kw: Any) -> FabricSim:
    return clos(planes=1, routing="ecmp", transport="roce", trimming=False, **kw)


def test_roce_over_ecmp_rides_out_a_failure_only_by_reconvergence() -> None:
    size = 1 << 20
    base = roce_clos()
    f = base.add_flow(0, 15, size)
    res = base.run(until=UNTIL)
    assert f.finish is not None
    topo = topo_of(base)
    hpt = topo.hosts_per_t0
    t0 = topo.t0(0, 0)
    used = [link.port - hpt for link in res.links if link.node == t0 and link.port >= hpt and link.sent_bytes]
    assert len(used) == 1  # one QP, one ECMP path
    at = f.finish // 4  # mid-transfer

    def failed(reconverge: int | None) -> tuple[FabricSim, Flow]:
        sim = roce_clos(ecmp_reconverge_ns=reconverge)
        fl = sim.add_flow(0, 15, size)
        sim.faults.fail_link(*sim.faults.t0_uplink(0, 0, used[0]), at=at)
        sim.run(until=3_000_000)
        return sim, fl

    sim, fl = failed(RECONVERGE)
    assert fl.status is WcStatus.SUCCESS and fl.finish is not None
    assert fl.finish > at + RECONVERGE and fl.finish > f.finish  # it waited for the routing, went around
    assert sim.counters()["reconvergences"] == 1 and sim.counters()["drops"] > 0
    stuck, sf = failed(None)
    assert sf.finish is None  # go-back-N keeps hashing onto the dead link
    assert stuck.counters()["retransmits"] > sim.counters()["retransmits"]


# -- flapping links, dead switches ------------------------------------------------------------------------
def test_a_flapping_link_goes_down_and_up_count_times() -> None:
    sim = clos()
    flows = permutation(sim, 1 << 20, seed=2)
    node, port = sim.faults.t0_uplink(0, 0, 0)
    pair = sim.faults.link(node, port)
    at, down, period, count = 5_000, 2_000, 6_000, 3

    def state() -> tuple[bool, bool]:
        return pair[0].up, pair[1].up

    probes = {t: probe(sim, t, state) for t in (4_000, 25_000)}
    for i in range(count):
        t = at + i * period
        probes[t + down // 2] = probe(sim, t + down // 2, state)
        probes[t + down + 1_000] = probe(sim, t + down + 1_000, state)
    sim.faults.flap_link(node, port, at=at, down_ns=down, period_ns=period, count=count)
    res = sim.run(until=UNTIL)
    assert all_succeeded(flows)
    assert res.now > 25_000
    for t, got in probes.items():
        i, into = divmod(t - at, period)
        down_now = t >= at and i < count and into < down
        assert got == [(not down_now, not down_now)], t
    assert [p.epoch for p in pair] == [count, count]  # each flap lost what the link carried
    assert res.failures == [(at, f"link {node}:{port} flaps ×{count}")]


@pytest.mark.parametrize(("role", "up_at"), [("t1", None), ("t0", 30_000)])
def test_a_dead_switch_takes_every_link_with_it(role: str, up_at: int | None) -> None:
    sim = clos()
    topo = topo_of(sim)
    flows = permutation(sim, 1 << 20, seed=2)
    switch = topo.t1(0, 0) if role == "t1" else topo.t0(1, 2)
    own = sim.nodes[switch].ports
    toward = [sim.faults.link(switch, i)[1] for i in range(len(own))]
    dead = {id(p) for p in [*own, *toward]}

    def downs() -> set[int]:
        return {id(p) for node in sim.nodes for p in node.ports if not p.up}

    during = probe(sim, 6_000, downs)
    after = probe(sim, 31_000, downs)
    sim.faults.fail_switch(switch, at=5_000, up_at=up_at)
    res = sim.run(until=UNTIL)
    assert res.now > 31_000
    assert during == [dead]  # exactly the switch's ports and the ports facing it
    assert after == [dead if up_at is None else set()]
    assert all_succeeded(flows)
    assert res.counters["drops"] > 0
    assert (5_000, f"switch {switch} down") in res.failures


# -- degraded links ----------------------------------------------------------------------------------------
def test_a_degraded_link_runs_at_the_fraction_until_restored() -> None:
    sim = clos()
    permutation(sim, 1 << 20, seed=2)
    node, port = sim.faults.t0_uplink(1, 3, 1)
    pair = sim.faults.link(node, port)

    def rates() -> list[int]:
        return [p.bps for p in pair]

    before, during, after = probe(sim, 999, rates), probe(sim, 1_001, rates), probe(sim, 20_001, rates)
    sim.faults.degrade_link(node, port, at=1_000, fraction=0.3, until=20_000)
    sim.run(until=UNTIL)
    nominal = 100_000_000_000
    assert before == [[nominal] * 2]
    assert during == [[30_000_000_000] * 2]
    assert after == [[nominal] * 2]
    assert all(p.nominal_bps == nominal for p in pair)
    assert (1_000, f"link {node}:{port} at 30%") in sim.faults.failures


def test_a_degraded_link_slows_the_flow_pinned_to_it() -> None:
    size, fraction = 1 << 20, 0.25
    base = roce_clos()
    f = base.add_flow(0, 15, size)
    res = base.run(until=UNTIL)
    topo = topo_of(base)
    hpt = topo.hosts_per_t0
    t0 = topo.t0(0, 0)
    (used,) = [link.port for link in res.links if link.node == t0 and link.port >= hpt and link.sent_bytes]
    assert f.fct_ns is not None and f.fct_ns < size * 8e9 / (fraction * 100e9)

    sim = roce_clos()
    slow = sim.add_flow(0, 15, size)
    sim.faults.degrade_link(t0, used, at=0, fraction=fraction)
    res = sim.run(until=UNTIL)
    assert slow.status is WcStatus.SUCCESS and slow.fct_ns is not None
    assert slow.fct_ns >= size * 8e9 / (fraction * 100e9)  # every byte crossed the slow link
    (stat,) = [link for link in res.links if (link.node, link.port) == (t0, used)]
    assert stat.bps == 100_000_000_000  # utilisation is of the nominal rate...
    assert 0 < stat.utilisation <= fraction * 1.01  # ...so a link at a quarter speed is at most 25 % busy


# -- random loss -------------------------------------------------------------------------------------------
def test_plane_ports_are_both_directions_of_every_link_of_the_plane() -> None:
    sim = clos()
    topo = topo_of(sim)
    for plane in range(topo.planes):
        ports = sim.faults.plane_ports(plane)
        assert (
            len({id(p) for p in ports})
            == len(ports)
            == 2 * (topo.num_hosts + topo.t0_per_plane * topo.uplinks)
        )
        owners = {id(p): n for n, node in enumerate(sim.nodes) for p in node.ports}
        for p in ports:
            for end in (owners[id(p)], p.peer.id):
                assert end < topo.num_hosts or topo.plane(end) == plane


def test_loss_on_one_plane_is_ridden_out() -> None:
    sim = clos()
    flows = permutation(sim, 256 << 10, seed=2)
    plane = {id(p) for p in sim.faults.plane_ports(1)}

    def losses() -> tuple[set[float], set[float]]:
        mine = {p.loss for n in sim.nodes for p in n.ports if id(p) in plane}
        rest = {p.loss for n in sim.nodes for p in n.ports if id(p) not in plane}
        return mine, rest

    before, during = probe(sim, 1_999, losses), probe(sim, 2_001, losses)
    sim.faults.set_loss(sim.faults.plane_ports(1), 0.02, at=2_000)
    res = sim.run(until=UNTIL)
    assert before == [({0.0}, {0.0})] and during == [({0.02}, {0.0})]
    assert res.counters["losses"] > 0 and res.counters["retransmits"] > 0
    owners = {id(p): (n, i) for n, node in enumerate(sim.nodes) for i, p in enumerate(node.ports)}
    lossy = {(link.node, link.port) for link in res.links if link.losses}
    assert lossy <= {owners[i] for i in plane}
    assert all_succeeded(flows)
    assert sim.delivered_bytes() == sum(f.size for f in flows)  # retransmitted bytes count once


def test_loss_stops_at_until() -> None:
    sim = clos()
    permutation(sim, 512 << 10, seed=2)
    ports = sim.faults.plane_ports(0)
    during = probe(sim, 5_000, lambda: {p.loss for p in ports})
    after = probe(sim, 8_001, lambda: {p.loss for p in ports})
    sim.faults.set_loss(ports, 0.5, at=1_000, until=8_000)
    sim.run(until=UNTIL)
    assert during == [{0.5}] and after == [{0.0}]


def test_a_black_holed_plane_marks_its_evs_bad_and_mrc_completes() -> None:
    sim = clos()
    flows = permutation(sim, 256 << 10, seed=2)
    sim.faults.set_loss(sim.faults.plane_ports(1), 1.0, at=2_000)
    sim.sample_every(5_000)
    res = sim.run(until=UNTIL)
    assert all_succeeded(flows)
    assert sum(s.ev_to_bad for s in res.samples) > 0
    assert res.samples[-1].evs_bad > 0
    bad_ports = {port for _t, _h, _qp, port, state in res.ev_log if state == "ASSUMED_BAD"}
    assert bad_ports == {2}  # NIC port 2 is plane 1; plane 0 stayed good
    assert res.report()["ev_to_bad"] == sum(s.ev_to_bad for s in res.samples)


# -- argument checks ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda s: s.faults.degrade_link(*s.faults.t0_uplink(0, 0, 0), at=0, fraction=0.0), "fraction"),
        (lambda s: s.faults.degrade_link(*s.faults.t0_uplink(0, 0, 0), at=0, fraction=1.5), "fraction"),
        (lambda s: s.faults.set_loss(s.faults.plane_ports(0), 1.5), "probability"),
        (lambda s: s.faults.set_loss(s.faults.plane_ports(0), -0.1), "probability"),
        (
            lambda s: s.faults.flap_link(
                *s.faults.t0_uplink(0, 0, 0), at=0, down_ns=10, period_ns=10, count=2
            ),
            "flap",
        ),
        (
            lambda s: s.faults.flap_link(
                *s.faults.t0_uplink(0, 0, 0), at=0, down_ns=0, period_ns=10, count=2
            ),
            "flap",
        ),
        (
            lambda s: s.faults.flap_link(
                *s.faults.t0_uplink(0, 0, 0), at=0, down_ns=5, period_ns=10, count=0
            ),
            "flap",
        ),
        (lambda s: s.faults.fail_switch(3, at=0), "not a switch"),
        (lambda s: s.faults.fail_switch(len(s.nodes), at=0), "not a switch"),
        (lambda s: s.faults.t0_uplink(2, 0, 0), "plane 2"),
        (lambda s: s.faults.t0_uplink(0, 4, 0), "t0 4"),
        (lambda s: s.faults.t0_uplink(0, 0, -1), "uplink -1"),
        (lambda s: s.faults.link(0, 2), "no port 2"),
        (lambda s: s.faults.plane_ports(2), "plane 2"),
        (lambda s: s.faults.fail_nic_port(16, 1, at=0), "no host 16"),
        (lambda s: s.faults.fail_nic_port(0, 0, at=0), "no port 0"),
        (lambda s: s.faults.fail_nic_port(0, 3, at=0), "no port 3"),
    ],
)
def test_failure_argument_errors(call: Callable[[FabricSim], object], match: str) -> None:
    sim = clos()
    with pytest.raises(ValueError, match=match):
        call(sim)
    assert not sim.faults.failures and sim.sim.peek() is None  # nothing was scheduled


def test_port_rejects_bad_rates_and_losses() -> None:
    port, _ = sink_port(Simulator())
    with pytest.raises(ValueError, match="positive"):
        port.set_rate(0)
    with pytest.raises(ValueError, match="probability"):
        port.set_loss(1.01)
    port.set_rate(25_000_000_000)
    assert port.bps == 25_000_000_000 and port.nominal_bps == 100_000_000_000


def test_planes_and_t0_uplinks_need_a_multi_plane_clos() -> None:
    sim = FabricSim.fat_tree(FatTree.from_k(4))
    with pytest.raises(ValueError, match="multi-plane Clos"):
        sim.faults.t0_uplink(0, 0, 0)
    with pytest.raises(ValueError, match="multi-plane Clos"):
        sim.faults.plane_ports(0)
