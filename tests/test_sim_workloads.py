"""Simulator workloads (ring all-reduce, all-to-all, incast with a victim, htsim connection matrices with
triggers), `FabricSim.add_flow` argument checks, determinism, and the metrics a run reports (samples,
per-link statistics, result files)."""

from __future__ import annotations

import csv
import itertools
import random
from pathlib import Path
from typing import Any

import pytest

from openmrc.fabric import FatTree
from openmrc.sim.config import FabricSimConfig
from openmrc.sim.fabric_sim import FabricSim
from openmrc.sim.flows import Flow, Trigger
from openmrc.sim.htsim_cm import parse_cm
from openmrc.sim.metrics import LinkStat, SimResults
from openmrc.sim.results_files import write_run_files
from openmrc.sim.scenario import Run
from openmrc.sim.workloads import (
    all_to_all,
    connection_matrix,
    derangement,
    incast,
    permutation,
    ring_allreduce,
)
from tests.sim_tools import ROCE, UNTIL, all_succeeded, clos, topo_of


# -- ring all-reduce ---------------------------------------------------------------------------------------
def single_step_ns(cfg: dict[str, Any], chunk: int) -> int:
    """Start to receiver completion of one uncongested ring step between two hosts under one T0 (the
    shortest path any step can take)."""
    sim = clos(**cfg)
    f = sim.add_flow(0, 1, chunk, imm=True)
    sim.run(until=UNTIL)
    assert f.recv_finish is not None and f.start is not None
    return f.recv_finish - f.start


@pytest.mark.parametrize("cfg", [{}, ROCE], ids=["mrc", "roce"])
def test_ring_allreduce_steps_wait_for_the_previous_receive(cfg: dict[str, Any]) -> None:
    n, size = 6, 256 << 10
    sim = clos(**cfg)
    flows = ring_allreduce(sim, size, ranks=list(range(n)))
    assert len(flows) == n * 2 * (n - 1)
    chunk = -(-size // n)
    assert all(f.size == chunk and f.imm and f.tag == "allreduce" for f in flows)
    res = sim.run(until=UNTIL)
    assert all_succeeded(flows)
    assert all(f.recv_finish is not None for f in flows)  # every step is a Write-with-Immediate
    for k in range(2 * (n - 1)):
        for r in range(n):
            f = flows[k * n + r]
            assert (f.src, f.dst) == (r, (r + 1) % n)
            if k == 0:
                assert f.start == 0
            else:
                pred = flows[(k - 1) * n + (r - 1) % n]  # rank r-1's previous step, received by rank r
                assert pred.dst == f.src
                assert f.start == pred.recv_finish  # released exactly by that receive
    first = min(f.start for f in flows if f.start is not None)
    last_recv = max(f.recv_finish for f in flows if f.recv_finish is not None)
    step = single_step_ns(cfg, chunk)
    assert last_recv - first > 2 * (n - 1) * step  # 2(N−1) steps in sequence on every rank
    job = res.job_time_ns("allreduce")
    assert job is not None and job >= last_recv - first


def test_ring_allreduce_order_seed_shuffles_the_ring_deterministically() -> None:
    n = 8

    def ring(seed: int | None) -> list[tuple[int, int]]:
        sim = clos()
        flows = ring_allreduce(sim, 64 << 10, ranks=list(range(n)), order_seed=seed)
        return [(f.src, f.dst) for f in flows]

    plain, a, b = ring(None), ring(3), ring(3)
    assert a == b
    assert a != plain and a[:n] != ring(4)[:n]
    step0 = dict(a[:n])  # one step: each rank sends to its successor
    assert sorted(step0) == sorted(step0.values()) == list(range(n))
    r, seen = 0, []
    for _ in range(n):  # following successors visits every rank once: a single ring
        seen.append(r)
        r = step0[r]
    assert r == 0 and sorted(seen) == list(range(n))
    assert all(pair in step0.items() for pair in a)  # every step uses the same ring


def test_ring_allreduce_rejects_bad_ranks() -> None:
    with pytest.raises(ValueError, match="distinct ranks"):
        ring_allreduce(clos(), 1024, ranks=[3, 3, 4])
    with pytest.raises(ValueError, match="distinct ranks"):
        ring_allreduce(clos(), 1024, ranks=[5])


def test_ring_allreduce_over_roce_on_a_fat_tree() -> None:
    sim = FabricSim.fat_tree(FatTree.from_k(4), FabricSimConfig(mtu=4084, seed=1, **ROCE))
    n = 5
    flows = ring_allreduce(sim, 128 << 10, ranks=[0, 3, 6, 9, 12])
    sim.run(until=UNTIL)
    assert len(flows) == n * 2 * (n - 1) and all_succeeded(flows)
    for k in range(1, 2 * (n - 1)):
        for r in range(n):
            assert flows[k * n + r].start == flows[(k - 1) * n + (r - 1) % n].recv_finish


# -- permutation -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("n", [2, 3, 5, 16, 64, 1000])
def test_a_permutation_is_a_derangement_drawn_from_the_seed(n: int) -> None:
    cases = set()
    for seed in range(40):
        perm = derangement(n, random.Random(seed))
        assert sorted(perm) == list(range(n))  # every host receives once
        assert all(perm[h] != h for h in range(n))  # and sends to another
        assert perm == derangement(n, random.Random(seed))
        shuffled = list(range(n))
        random.Random(seed).shuffle(shuffled)
        # only the hosts that drew themselves (and the one a lone such host trades with) are redrawn
        moved = [h for h in range(n) if perm[h] != shuffled[h]]
        fixed = [h for h in range(n) if shuffled[h] == h]
        assert set(fixed) <= set(moved) and len(moved) <= max(len(fixed), 2 if fixed else 0)
        cases.add(min(len(fixed), 2))
    if n >= 5:
        assert cases == {0, 1, 2}  # the seeds drew no host, one host and several hosts to themselves
    if n >= 16:
        assert len({tuple(derangement(n, random.Random(seed))) for seed in range(40)}) == 40
    with pytest.raises(ValueError, match="two hosts"):
        derangement(1, random.Random(1))


@pytest.mark.parametrize(("hosts", "seed"), [(16, 1), (16, 2), (16, 3), (32, 1)])
def test_every_host_sends_one_flow_and_receives_one(hosts: int, seed: int) -> None:
    sim = clos(hosts=hosts, t0_radix=16 if hosts > 16 else 8)
    flows = permutation(sim, 4096, seed=seed)
    assert len(flows) == len(sim.flows) == hosts
    assert sorted(f.src for f in flows) == sorted(f.dst for f in flows) == list(range(hosts))
    assert all(f.src != f.dst and f.tag == "perm" for f in flows)


# -- all-to-all ------------------------------------------------------------------------------------------
def test_all_to_all_sends_once_between_every_ordered_pair() -> None:
    sim = clos()
    group = [0, 2, 5, 7, 9, 14]
    flows = all_to_all(sim, 32 << 10, hosts=group)
    n = len(group)
    assert len(flows) == n * (n - 1)
    pairs = [(f.src, f.dst) for f in flows]
    assert len(set(pairs)) == len(pairs)
    assert set(pairs) == {(s, d) for s in group for d in group if s != d}
    for i, s in enumerate(group):  # staggered: member i starts with member i+1
        mine = [f.dst for f in flows if f.src == s]
        assert mine == [group[(i + k) % n] for k in range(1, n)]
    res = sim.run(until=UNTIL)
    assert all_succeeded(flows)
    assert res.summary()["completed"] == n * (n - 1)
    with pytest.raises(ValueError, match="two hosts"):
        all_to_all(clos(), 1024, hosts=[3])


# -- incast ------------------------------------------------------------------------------------------------
def test_incast_victim_shares_the_targets_t0_and_finishes_far_sooner() -> None:
    sim = clos()
    hpt = topo_of(sim).hosts_per_t0
    target, senders = 0, 8
    flows = incast(sim, 256 << 10, senders=senders, target=target, victim=True)
    inc = [f for f in flows if f.tag == "incast"]
    (victim,) = [f for f in flows if f.tag == "victim"]
    assert len(inc) == senders and {f.dst for f in inc} == {target}
    assert all(f.src // hpt != target // hpt for f in inc)  # the senders cross the T1 tier
    assert victim.dst // hpt == target // hpt and victim.dst != target
    assert victim.src not in {f.src for f in inc} | {target}
    sim.run(until=UNTIL)
    assert all_succeeded(flows)
    fcts = sorted(f.fct_ns for f in inc if f.fct_ns is not None)
    assert victim.fct_ns is not None
    assert victim.fct_ns < fcts[0] and 2 * victim.fct_ns < fcts[-1]
    # the incast cannot beat the target's two 100G downlinks
    assert fcts[-1] >= senders * (256 << 10) * 8 * 1e9 / (2 * 100e9)


def _results(pairs: list[tuple[int, int]], ports: int = 2, hosts: int = 8) -> SimResults:
    """A run's results with these flows on hosts of ``ports`` 100G NIC ports each (no simulation)."""
    flows = [Flow(s, d, 1 << 20, 0, id=i) for i, (s, d) in enumerate(pairs)]
    links = [
        LinkStat(h, p, 100 + p, 100_000_000_000, 0, 0.0, 0, 0, 0, 0)
        for h in range(hosts)
        for p in range(ports)
    ]
    return SimResults(flows, 0, 0, links=links)


def test_the_bottleneck_is_what_the_senders_can_send_or_the_receivers_can_take() -> None:
    g = 1_000_000_000
    assert _results([(1, 0), (2, 0), (3, 0)]).bottleneck_bps() == 200 * g  # incast: the receiver's 2 ports
    assert _results([(1, 0), (2, 0), (3, 0)]).line_rate_bps() == 600 * g  # (the senders' ports)
    assert _results([(1, 0), (2, 0), (3, 4)]).bottleneck_bps() == 400 * g  # and a victim beside it
    assert _results([(0, 1), (1, 2), (2, 3), (3, 0)]).bottleneck_bps() == 800 * g  # a permutation
    assert _results([(0, 1), (0, 2), (0, 3)]).bottleneck_bps() == 200 * g  # one sender, three receivers
    assert _results([(0, 1), (1, 0)], ports=4).bottleneck_bps() == 800 * g
    assert _results([]).bottleneck_bps() == 0


def test_an_incast_that_keeps_its_receiver_busy_is_near_its_bottleneck() -> None:
    sim = clos()
    incast(sim, 2 << 20, senders=6)
    rep = sim.run(until=UNTIL).report()
    assert rep["completed"] == 6 and rep["bottleneck_gbps"] == 200  # the target's two 100G ports
    assert 0.9 < rep["goodput_fraction"] <= 1  # (over the senders' line rate: a sixth of that)
    assert rep["job_goodput_gbps"] / rep["goodput_fraction"] == pytest.approx(200)


@pytest.mark.parametrize(
    ("target", "victim"),
    [
        (0, False),
        (0, True),
        (6, True),
        (15, False),
        (15, True),
    ],
)
def test_incast_senders_are_far_from_any_target(target: int, victim: bool) -> None:
    """The senders are "the farthest from the target, so their traffic crosses the fabric's upper tier",
    and a victim finds a free neighbour of the target: for any target, not only low-numbered ones."""
    sim = clos()
    hpt = topo_of(sim).hosts_per_t0
    flows = incast(sim, 4096, senders=3, target=target, victim=victim)
    assert all(f.src // hpt != target // hpt for f in flows if f.tag == "incast")
    assert len(flows) == 3 + victim


def test_incast_argument_errors() -> None:
    with pytest.raises(ValueError, match="target"):
        incast(clos(), 4096, senders=2, target=16)
    with pytest.raises(ValueError, match="senders"):
        incast(clos(), 4096, senders=16)
    with pytest.raises(ValueError, match="senders"):
        incast(clos(), 4096, senders=14, victim=True)
    with pytest.raises(ValueError, match="victim"):
        incast(clos(), 4096, senders=13, victim=True)  # every neighbour of the target is a sender


# -- htsim connection matrices ---------------------------------------------------------------------------
CM = """Nodes 16
Connections 4
Triggers 2
0->5 id 1 start 0 size 65536 recv_done_trigger 1
1->6 id 2 trigger 1 size 65536 send_done_trigger 2
2->7 id 3 start 3 size 131072 send_done_trigger 2
3->8 id 4 trigger 2 size 65536
trigger id 1 oneshot
trigger id 2 barrier count 2
"""


def test_connection_matrix_triggers_start_flows_when_they_fire() -> None:
    sim = clos()
    a, b, c, d = connection_matrix(sim, parse_cm(CM), start=10_000)
    assert a.imm and not c.imm  # a receive-done trigger needs the receiver to see the message complete
    assert b.start is None and d.start is None
    assert (a.start, c.start) == (10_000, 13_000)  # µs in the file, plus the offset in ns
    sim.run(until=UNTIL)
    assert all_succeeded([a, b, c, d])
    assert a.recv_finish is not None and b.start == a.recv_finish  # oneshot fired by a's receiver
    assert b.finish is not None and c.finish is not None
    assert d.start == max(b.finish, c.finish)  # the barrier waits for both send-done arrivals
    assert all(f.tag == "cm" for f in (a, b, c, d))


MULTISHOT = """Nodes 16
Connections 4
Triggers 1
0->5 id 1 start 0 size 65536 send_done_trigger 1
2->7 id 2 start 30 size 65536 send_done_trigger 1
1->6 id 3 trigger 1 size 65536
3->8 id 4 trigger 1 size 65536
trigger id 1 multishot
"""


def test_connection_matrix_multishot_starts_one_target_per_activation() -> None:
    """htsim's MultiShotTrigger starts its next target on each activation; the replay should match."""
    sim = clos()
    a, b, c, d = connection_matrix(sim, parse_cm(MULTISHOT))
    sim.run(until=UNTIL)
    assert all_succeeded([a, b, c, d])
    assert c.start == a.finish
    assert d.start == b.finish


def test_connection_matrix_needs_the_fabrics_host_count() -> None:
    cm = parse_cm("Nodes 8\nConnections 1\n0->1 start 0 size 100\n")
    with pytest.raises(ValueError, match="8 nodes"):
        connection_matrix(clos(), cm)


# -- add_flow and triggers -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("args", "kwargs", "match"),
    [
        ((3, 3, 100), {}, "two different hosts"),
        ((1, 2, 0), {}, "at least one byte"),
        ((1, 2, -5), {}, "at least one byte"),
        ((1, 2, 100, 0), {"trigger": Trigger()}, "a start time or a trigger, not both"),
        ((1, 16, 100), {}, "hosts are 0..15"),
        ((-1, 2, 100), {}, "hosts are 0..15"),
    ],
)
def test_add_flow_argument_errors(args: tuple[Any, ...], kwargs: dict[str, Any], match: str) -> None:
    sim = clos()
    with pytest.raises(ValueError, match=match):
        sim.add_flow(*args, **kwargs)
    assert sim.flows == []
    with pytest.raises(ValueError, match="count"):
        Trigger(0)


def test_a_barrier_fires_once_at_its_count() -> None:
    sim = clos()
    barrier = Trigger(2)
    a = sim.add_flow(0, 4, 16 << 10, send_done=barrier)
    b = sim.add_flow(1, 9, 64 << 10, 2_000, send_done=barrier)
    c = sim.add_flow(2, 10, 8 << 10, None, trigger=barrier)
    sim.run(until=UNTIL)
    assert all_succeeded([a, b, c])
    assert a.finish is not None and b.finish is not None and a.finish < b.finish
    assert barrier.arrivals == 2 and c.start == b.finish


# -- determinism -------------------------------------------------------------------------------------------
def incast_run(seed: int) -> tuple[list[tuple[int | None, int | None]], dict[str, int]]:
    sim = clos(seed=seed)
    incast(sim, 128 << 10, senders=6, victim=True)
    res = sim.run(until=UNTIL)
    return [(f.start, f.finish) for f in res.flows], res.counters


def test_the_same_seed_gives_the_same_run() -> None:
    a = incast_run(5)
    assert a == incast_run(5)
    assert a[1]["ecn_marks"] > 0 and a[1]["trims"] > 0  # the run did exercise the seeded choices
    assert a != incast_run(6)


# -- metrics -----------------------------------------------------------------------------------------------
def test_samples_are_monotone_and_end_with_every_byte_delivered() -> None:
    sim = clos()
    flows = permutation(sim, 256 << 10, seed=2)
    sampler = sim.sample_every(3_000)
    res = sim.run(until=UNTIL)
    assert all_succeeded(flows)
    s = res.samples
    assert s is sampler.samples and len(s) >= res.now // 3_000
    assert s[0].time_ns == 0 and s[0].delivered_bytes == 0
    assert all(x.time_ns <= y.time_ns for x, y in itertools.pairwise(s))
    assert all(x.delivered_bytes <= y.delivered_bytes for x, y in itertools.pairwise(s))
    for x, y in itertools.pairwise(s):
        if y.time_ns > x.time_ns:
            rate = (y.delivered_bytes - x.delivered_bytes) * 8e9 / (y.time_ns - x.time_ns)
            assert y.goodput_bps == pytest.approx(rate)
    total = sum(f.size for f in flows)
    assert s[-1].time_ns == res.now and s[-1].delivered_bytes == total == sim.delivered_bytes()
    assert max(x.goodput_bps for x in s) <= 16 * 2 * 100e9  # no faster than every host's two ports
    with pytest.raises(ValueError, match="positive"):
        clos().sample_every(0)


def test_roce_delivered_bytes_count_each_byte_once() -> None:
    sim = FabricSim.fat_tree(FatTree.from_k(4), FabricSimConfig(mtu=4084, seed=1, **ROCE))
    flows = permutation(sim, 300_001, seed=1)
    sim.sample_every(5_000)
    res = sim.run(until=UNTIL)
    assert all_succeeded(flows) and res.counters["retransmits"] > 0
    assert res.samples[-1].delivered_bytes == sum(f.size for f in flows)


def test_link_stats_and_report() -> None:
    sim = clos()
    flows = all_to_all(sim, 16 << 10)
    res = sim.run(until=UNTIL)
    assert all_succeeded(flows)
    links = res.links
    assert len(links) == sum(len(n.ports) for n in sim.nodes)
    assert all(0.0 <= link.utilisation <= 1.0 for link in links)
    assert any(link.utilisation > 0 for link in links)
    for link in links:
        assert link.utilisation == pytest.approx(link.sent_bytes * 8e9 / (link.bps * res.now))
    hosts = sim.topo.num_hosts
    sent_by_hosts = sum(link.sent_bytes for link in links if link.node < hosts)
    assert sent_by_hosts >= sum(f.size for f in flows)  # payload plus headers, ACKs
    rep = res.report()
    assert rep["flows"] == rep["completed"] == len(flows)
    job = res.job_time_ns()
    assert job == max(f.finish for f in flows if f.finish is not None)
    assert rep["job_time_us"] == job / 1000
    assert rep["job_goodput_gbps"] == pytest.approx(sum(f.size for f in flows) * 8 / job)
    assert rep["link_util_max"] == max(link.utilisation for link in links)


def test_job_time_is_none_until_every_flow_finished() -> None:
    sim = clos()
    sim.add_flow(0, 15, 1 << 20)
    res = sim.run(until=2_000)
    assert res.now == 2_000 and res.flows[0].finish is None
    assert res.job_time_ns() is None and "job_time_us" not in res.report()


def test_write_results_rows_match_the_flows(tmp_path: Path) -> None:
    sim = clos()
    flows = incast(sim, 64 << 10, senders=4, victim=True)
    sim.sample_every(10_000)
    res = sim.run(until=UNTIL)
    write_run_files(Run("incast", {}, sim=sim, results=res), tmp_path, prefix="x-")
    rows = list(csv.DictReader((tmp_path / "x-flows.csv").open()))
    assert len(rows) == len(flows)
    for row, f in zip(rows, flows, strict=True):
        assert (int(row["id"]), row["tag"], int(row["src"]), int(row["dst"]), int(row["size_bytes"])) == (
            f.id,
            f.tag,
            f.src,
            f.dst,
            f.size,
        )
        assert f.fct_ns is not None and float(row["fct_us"]) == pytest.approx(f.fct_ns / 1000)
        assert row["status"] == "SUCCESS"
    links = list(csv.DictReader((tmp_path / "x-links.csv").open()))
    busy = [link for link in res.links if link.sent_bytes or link.drops or link.losses]
    assert len(links) == len(busy) > 0
    assert sum(int(r["sent_bytes"]) for r in links) == sum(link.sent_bytes for link in res.links)
    series = list(csv.DictReader((tmp_path / "x-series.csv").open()))
    assert len(series) == len(res.samples)
    assert int(series[-1]["delivered_bytes"]) == sum(f.size for f in flows)
    assert (tmp_path / "x-ev_events.csv").exists()
