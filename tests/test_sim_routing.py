"""ECMP and SRv6 routing in the simulator, and MRC over a fat tree with ECMP-hashed EVs."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from openmrc.fabric import FatTree, MultiPlaneClos, UsidPlan
from openmrc.sim.config import FabricSimConfig
from openmrc.sim.fabric_sim import FabricSim
from openmrc.sim.network import sim_packet
from openmrc.sim.routing import EcmpRouting, SrRouting
from openmrc.transport import Transmit, TrimMark
from openmrc.wire import BTH, METH, RETH, Opcode, Packet


def pkt(src: int, dst: int, entropy: int) -> Transmit:
    p = Packet(BTH(Opcode.WRITE_ONLY), meth=METH(), reth=RETH(0, 1, 0))
    return sim_packet(p, 64, 0, src, dst, 1, entropy)


def walk(
    topo: FatTree | MultiPlaneClos, r: EcmpRouting, src: int, dst: int, entropy: int, plane: int = 0
) -> list[int]:
    node = topo.ports(src)[plane].peer
    path = [src]
    for _ in range(10):
        path.append(node)
        port = r.port(node, pkt(src, dst, entropy))
        node = topo.ports(node)[port].peer
        if node < topo.num_hosts:
            path.append(node)
            return path
    raise AssertionError("loop")


def test_fat_tree_ecmp_follows_shortest_paths_and_spreads() -> None:
    topo = FatTree.from_k(4)
    r = EcmpRouting(topo, seed=3)
    for src, dst in ((0, 1), (0, 3), (0, 15), (5, 10)):
        paths = {tuple(walk(topo, r, src, dst, e)) for e in range(200)}
        valid = {tuple(p) for p in topo.shortest_paths(src, dst)}
        assert paths <= valid
        assert len(paths) == len(valid)  # 200 entropies reach every equal-cost path
        assert len(next(iter(paths))) - 2 == topo.hops(src, dst)
    assert walk(topo, r, 0, 15, 7) == walk(topo, r, 0, 15, 7)  # one flow, one path


def _next_hops(topo: FatTree, dst: int, dead: set[tuple[int, int]]) -> dict[int, tuple[int, ...]]:
    """Each switch's ports on a shortest path to host ``dst`` through live links (hosts do not forward)."""
    dist = {dst: 0}
    todo = [dst]
    while todo:
        later = []
        for v in todo:
            if v != dst and v < topo.num_hosts:
                continue
            for r in topo.ports(v):
                if r.peer not in dist and (r.peer, r.peer_port) not in dead:
                    dist[r.peer] = dist[v] + 1
                    later.append(r.peer)
        todo = later
    out = {}
    for v in range(topo.num_hosts, topo.num_nodes()):
        if dist.get(v, 0) > 0:
            hops = tuple(
                r.port for r in topo.ports(v) if dist.get(r.peer) == dist[v] - 1 and (v, r.port) not in dead
            )
            out[v] = hops
    return out


@pytest.mark.parametrize("topo", [FatTree.from_k(4), FatTree.from_k(6, tiers=2), FatTree.from_k(8)])
def test_fat_tree_tables_are_each_hosts_shortest_paths(topo: FatTree) -> None:
    """Hosts under one edge switch share a search; each still gets its own last hop, every switch its
    own table in a part (``only``), and a dead link gives every host its own search."""
    rng = random.Random(7)
    n = topo.num_nodes()
    only = [rng.random() < 0.5 for _ in range(n)]
    whole, part = EcmpRouting(topo), EcmpRouting(topo, only=only)
    dead: set[tuple[int, int]] = set()
    for _ in range(3):
        for dst in range(topo.num_hosts):
            table = _next_hops(topo, dst, dead)
            for v in range(topo.num_hosts, n):  # (a switch that cannot reach dst: no hop)
                hops = table.get(v, ())
                assert whole.candidates(v, dst) == hops
                assert part.candidates(v, dst) == (hops if only[v] else ())
        v = rng.randrange(topo.num_hosts, n)  # a link dies: from the switch, then back from a host
        dead.add((v, rng.choice(topo.ports(v)).port))
        whole.withdraw(dead)
        part.withdraw(dead)
    assert all(not part._next[v] for v in range(topo.num_hosts, n) if not only[v])  # not built


def test_clos_ecmp_candidates() -> None:
    c = MultiPlaneClos(2, 32, 8, 8)
    r = EcmpRouting(c)
    assert r.candidates(c.t0(0, 0), 1) == (1,)
    assert r.candidates(c.t0(0, 0), 31) == (4, 5, 6, 7)
    assert r.candidates(c.t1(1, 2), 31) == (7,)
    assert walk(c, r, 0, 31, 99, plane=1)[-1] == 31


@pytest.mark.parametrize("topo", [FatTree.from_k(4), MultiPlaneClos(2, 32, 8, 8)], ids=["fattree", "clos"])
def test_a_hashed_path_is_the_hops_the_switches_pick(topo: FatTree | MultiPlaneClos) -> None:
    """`EcmpRouting.path` (which links a RoCEv2 QP's packets take, so which QPs a failure touches) names
    the ports `EcmpRouting.port` picks hop by hop, on every plane, before and after a link is withdrawn."""
    r = EcmpRouting(topo, seed=5)
    rng = random.Random(1)
    planes = len(topo.ports(0))
    for dead in (set(), {(topo.ports(0)[0].peer, len(topo.ports(topo.ports(0)[0].peer)) - 1)}):
        r.withdraw(dead)
        for _ in range(200):
            src, dst = rng.sample(range(topo.num_hosts), 2)
            plane, entropy = rng.randrange(planes), rng.getrandbits(32)
            nodes = walk(topo, r, src, dst, entropy, plane)
            hops = r.path(src, plane, dst, entropy)
            assert [n for n, _p in hops] == nodes[:-1]
            assert all(topo.ports(n)[p].peer == nxt for (n, p), nxt in zip(hops, nodes[1:], strict=True))
            assert r.crosses([(src, plane, dst, entropy)], {hops[-1]})
            assert not r.crosses([(src, plane, dst, entropy)], set(dead) - set(hops))


@pytest.mark.parametrize("routing", ["ecmp", "srv6"])
def test_clos_both_routings_complete(routing: str) -> None:
    sim = FabricSim.clos(
        FabricSimConfig(planes=2, hosts=16, t0_radix=8, t1_radix=8, routing=routing, evs_per_qp=16)
    )
    for s in range(8):
        sim.add_flow(s, 15 - s, 128 << 10)
    res = sim.run(until=10**9)
    assert res.summary()["completed"] == 8


def test_mrc_over_a_fat_tree_is_deterministic() -> None:
    def run() -> list[float]:
        sim = FabricSim.fat_tree(FatTree.from_k(4), FabricSimConfig(routing="ecmp", mtu=4084, seed=2))
        perm = list(range(16))
        random.Random(2).shuffle(perm)
        for s, d in enumerate(perm):
            if s != d:
                sim.add_flow(s, d, 256 << 10)
        res = sim.run(until=10**9)
        assert res.summary()["completed"] == len(sim.flows)
        return res.fcts_us()

    a = run()
    assert a == run()
    assert min(a) > 256 * 1024 * 8 / 100e9 * 1e6  # no faster than one 100G host link allows


def test_bad_routing_configs() -> None:
    with pytest.raises(ValueError, match="routing"):
        FabricSim.clos(FabricSimConfig(routing="ospf"))
    with pytest.raises(ValueError, match="ECMP"):
        FabricSim.fat_tree(FatTree.from_k(4), FabricSimConfig(routing="srv6"))


def test_roce_baseline_completes_with_go_back_n() -> None:
    def run(qps: int, trimming: bool) -> dict[str, object]:
        cfg = FabricSimConfig(
            routing="ecmp", mtu=4084, seed=1, transport="roce", roce_qps=qps, trimming=trimming
        )
        sim = FabricSim.fat_tree(FatTree.from_k(4), cfg)
        perm = list(range(16))
        random.Random(1).shuffle(perm)
        for s, d in enumerate(perm):
            if s != d:
                sim.add_flow(s, d, 512 << 10)
        return sim.run(until=10**9).summary()

    one = run(1, trimming=False)
    assert one["completed"] == one["flows"] == 13
    assert one["drops"] and one["retransmits"]  # ECMP collisions overflow buffers; go-back-N resends
    many = run(8, trimming=False)
    assert many["completed"] == 13
    assert run(1, trimming=True)["completed"] == 13  # trimmed packets are plain losses to RoCE


def test_roce_needs_ecmp() -> None:
    with pytest.raises(ValueError, match="RoCEv2 needs"):
        FabricSim.clos(FabricSimConfig(transport="roce"))
    with pytest.raises(ValueError, match="transport"):
        FabricSim.clos(FabricSimConfig(transport="tcp", routing="ecmp"))


def sr_walk(topo: MultiPlaneClos, r: SrRouting, p: Transmit, src: int, plane: int) -> list[int]:
    node, path = topo.host_t0(src, plane), [src]
    for _ in range(10):
        path.append(node)
        node = topo.ports(node)[r.port(node, p)].peer
        if node < topo.num_hosts:
            return [*path, node]
    raise AssertionError("loop")


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 63), st.integers(0, 63), st.integers(0, 3), st.integers(0, 7), st.integers(1, 3))
def test_srv6_with_an_srh_segment_takes_the_same_path(
    src: int, dst: int, plane: int, up: int, cut: int
) -> None:
    """A path split anywhere between the destination address and an SRH segment is the path of the whole
    address: the switch whose uSID ends the address's carrier takes the segment (End with NEXT-CSID)."""
    topo = MultiPlaneClos(4, 64, 16, 16)
    plan = UsidPlan(topo)
    r = SrRouting(plan)
    usids = plan.path_usids(src, dst, plane, up)
    cut = min(cut, len(usids) - 1)  # the host port's uSID is the last and is never an End
    whole = pkt(src, dst, 0)
    whole.addr = plan.address_int(usids)
    split = pkt(src, dst, 0)
    split.addr, split.seg = plan.address_int(usids[:cut]), plan.address_int(usids[cut:])
    expected = topo.path(src, dst, plane, up)
    assert sr_walk(topo, r, whole, src, plane) == expected
    assert sr_walk(topo, r, split, src, plane) == expected and split.seg == 0
    lost = pkt(src, dst, 0)  # the same cut without its segment ends nowhere: mis-routed, not delivered
    lost.addr = plan.address_int(usids[:cut])
    with pytest.raises(ValueError):
        sr_walk(topo, r, lost, src, plane)


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 63), st.integers(0, 63), st.integers(0, 31), st.none() | st.integers(1, 0xFFFF))
def test_srv6_routed_by_its_ev_matches_the_address_int(src: int, dst: int, i: int, extra: int | None) -> None:
    """A packet whose address stays its EV's (`Transmit.route_by_ev`, no int) takes the hops of one whose
    address is the int of the EV's first 16 bytes, and reads as that int at every hop: with a Clos path's
    uSIDs (past the first switch, three at most: it keeps them in the packet) and with one more after
    them (``extra``, never reached; past the first switch four on a path between T0s: read from the EV at
    every hop)."""
    topo = MultiPlaneClos(4, 64, 16, 16)
    plan = UsidPlan(topo)
    r = SrRouting(plan)
    evs = plan.ev_expanded(src, dst)
    ev, port = evs[i % len(evs)]
    if extra is not None:  # after the path's last uSID
        end = next(b for b in range(4, 16, 2) if ev[b : b + 2] == bytes(2))
        ev = ev[:end] + extra.to_bytes(2, "big") + ev[end + 2 :]
    by_ev, by_int = pkt(src, dst, 0), pkt(src, dst, 0)
    by_ev.ev = by_int.ev = ev
    by_ev.route_by_ev()
    by_int.addr = int.from_bytes(ev[:16], "big")
    assert by_ev.addr == by_int.addr and by_ev.seg == 0
    node = topo.host_t0(src, port - 1)
    for _ in range(4):
        hop = r.port(node, by_ev)
        assert hop == r.port(node, by_int) and by_ev.addr == by_int.addr
        node = topo.ports(node)[hop].peer
        if node < topo.num_hosts:
            break
    assert node == dst
    t1 = topo.t1(port - 1, 0)  # a T1 has no route to a host port
    with pytest.raises(ValueError, match="no route") as by_ev_err:
        r.port(t1, by_ev)
    with pytest.raises(ValueError, match="no route") as by_int_err:
        r.port(t1, by_int)
    assert str(by_ev_err.value) == str(by_int_err.value)


def test_transmit_routed_by_ev_becomes_an_int_when_set() -> None:
    plan = UsidPlan(MultiPlaneClos(4, 64, 16, 16))
    ev, _ = plan.ev_expanded(0, 40)[0]
    p = pkt(0, 40, 0)
    p.ev = ev
    p.route_by_ev()
    whole = int.from_bytes(ev[:16], "big")
    p.seg = 7  # an SRH segment: the address becomes the int it stood for
    assert (p.addr, p.seg) == (whole, 7)
    p.addr = 9  # the segment stays
    assert (p.addr, p.seg) == (9, 7)
    p.route_by_ev()
    p.addr = 5
    assert (p.addr, p.seg) == (5, 0)
    with pytest.raises(ValueError, match="128-bit"):
        p.addr = -1
    with pytest.raises(ValueError, match="128-bit"):
        p.addr = 1 << 128


@pytest.mark.parametrize("mark", list(TrimMark))
def test_transmit_keeps_its_trim_mark(mark: TrimMark) -> None:
    p = pkt(0, 1, 0)
    assert p.trim is TrimMark.NONE
    p.trim = mark
    assert p.trim is mark
    p.trim = TrimMark.NONE
    assert p.trim is TrimMark.NONE
