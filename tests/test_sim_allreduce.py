"""The hierarchical all-reduce workload: bytes, step order, lazy flows, transient QPs, failures, golden."""

from __future__ import annotations

import gc
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from openmrc.sim.config import FabricSimConfig
from openmrc.sim.fabric_sim import FabricSim
from openmrc.sim.flows import Flow
from openmrc.sim.hosts import MrcHost
from openmrc.sim.roce import RoceQp
from openmrc.sim.scenario import build_run, expand_runs, load_scenario
from openmrc.sim.workloads import AllReduceJob, hierarchical_allreduce
from openmrc.transport import Qp

GOLDEN = Path(__file__).parent / "golden" / "allreduce_hier_256.json"
ROCE = {"transport": "roce", "routing": "ecmp", "trimming": False, "roce_qps": 4, "roce_planes": 0}


def small(hosts: int = 64, transport: str = "mrc", seed: int = 1) -> FabricSim:
    kw = ROCE if transport == "roce" else {}
    return FabricSim.clos(FabricSimConfig(planes=4, hosts=hosts, t0_radix=32, t1_radix=32, seed=seed, **kw))


def by_step(job: AllReduceJob) -> dict[tuple[int, int], Flow]:
    return {(f.src, job.step_of(f)): f for f in job.sim.flows}


@pytest.mark.parametrize("transport", ["mrc", "roce"])
@pytest.mark.parametrize(("hosts", "size"), [(64, 64 << 10), (256, 256 << 10)])
def test_every_gpu_sends_its_share_and_steps_wait_for_send_and_receive(
    transport: str, hosts: int, size: int
) -> None:
    sim = small(hosts, transport)
    job = hierarchical_allreduce(sim, size)
    res = sim.run(until=10**9)
    servers = hosts // 8
    assert job.steps == 2 * (servers.bit_length() - 1)
    assert len(sim.flows) == res.summary()["completed"] == job.steps * hosts
    sent = [0] * hosts
    for f in sim.flows:
        sent[f.src] += f.size
        assert f.recv_finish is not None and f.finish is not None
    want = 2 * (size // 8) * (servers - 1) // servers
    assert sent == [want] * hosts == [job.network_bytes()] * hosts
    flows = by_step(job)
    for (h, t), f in flows.items():
        p = job.partner(h, t)
        assert f.dst == p and p // 8 != h // 8 and p % 8 == h % 8  # another server, same rail
        if t > 0:
            mine, theirs = flows[(h, t - 1)], flows[(job.partner(h, t - 1), t - 1)]
            assert theirs.dst == h
            assert f.start is not None and mine.finish is not None and theirs.recv_finish is not None
            assert f.start >= max(mine.finish, theirs.recv_finish)
    assert sim.delivered_bytes() == want * hosts
    step = job.step_ns()
    assert step is not None and step == max(max(f.finish or 0, f.recv_finish or 0) for f in sim.flows)


def test_first_steps_cross_the_fabric_last_reduce_scatter_step_stays_in_the_server_rail() -> None:
    job = hierarchical_allreduce(small(256), 256 << 10)
    depth = job.steps // 2
    assert job.partner(0, 0) == 128 and job.partner(0, depth - 1) == 8 and job.partner(0, depth) == 8
    assert job.step_bytes[0] == (256 << 10) // 16 and job.step_bytes[depth - 1] == (256 << 10) // 256
    assert job.step_bytes == job.step_bytes[:depth] + job.step_bytes[:depth][::-1]


def test_flows_are_made_as_steps_fire_and_qps_live_only_while_used() -> None:
    sim = small(64)
    job = hierarchical_allreduce(sim, 64 << 10)
    assert len(sim.flows) == 64  # only the first step exists up front
    counts, qps = [], []
    sim.sim.schedule(0, lambda _: None)
    t = 0
    while not sim.done():
        t += 1_000
        sim.run(until=t)
        counts.append(len(sim.flows))
        qps.append(sum(len(sim.host(h).qps) for h in range(64)))
    assert counts == sorted(counts) and counts[-1] == job.steps * 64 and len(set(counts)) > 2
    # one QP pair per host pair in use, both directions: at most one QP per host per step in flight
    assert max(qps) <= 64 * 2 and qps[-1] == 0
    assert all(not sim.host(h).nic.profiles.ev or set(sim.host(h).nic.profiles.ev) <= {0} for h in range(64))


def test_connections_kept_for_the_whole_step_when_not_transient() -> None:
    sim = small(64)
    job = hierarchical_allreduce(sim, 64 << 10, transient=False)
    sim.run(until=10**9)
    assert job.step_ns() is not None and sim.delivered_bytes() == job.network_bytes() * 64
    partners = {(h, job.partner(h, t)) for h in range(64) for t in range(job.steps)}
    assert len(partners) == 64 * job.steps // 2  # each partner twice, once per phase
    # a QP pair per direction, each end's QP kept
    assert sum(len(sim.host(h).qps) for h in range(64)) == 2 * len(partners)
    assert all(f.qp is not None for f in sim.flows)


def test_one_qp_pair_carries_both_directions() -> None:
    sim = small(64)
    hierarchical_allreduce(sim, 64 << 10)
    a, b = sim.host(0), sim.host(32)
    assert len(a.qps) == len(b.qps) == 1
    (qa,) = a.qps.values()
    (qb,) = b.qps.values()
    assert sim.flows[0].qp is qa and sim.flows[32].qp is qb
    assert qa.attr.dest_qp_num == qb.qp_num and qb.attr.dest_qp_num == qa.qp_num


@pytest.mark.parametrize("transport", ["mrc", "roce"])
def test_a_link_failing_in_the_first_step_is_ridden_out(transport: str) -> None:
    times = []
    for fail in (False, True):
        sim = small(256, transport)
        job = hierarchical_allreduce(sim, 256 << 10)
        if fail:
            sim.faults.fail_link(*sim.faults.t0_uplink(0, 0, 0), 2_000, None)
        sim.run(until=10**10)
        assert all(f.status is not None and f.status.name == "SUCCESS" for f in sim.flows)
        times.append(job.step_ns())
        assert times[-1] is not None
    assert times[1] >= times[0]  # type: ignore[operator]


def live(kind: type) -> int:
    """How many objects of ``kind`` exist (the collector tracks each; a compiled class takes no weakref)."""
    return sum(1 for o in gc.get_objects() if type(o) is kind)


@pytest.fixture
def no_gc() -> Iterator[None]:
    """The cyclic garbage collector off after one collection: what is freed from then on, reference counting
    freed."""
    was = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


@pytest.mark.usefixtures("no_gc")
@pytest.mark.parametrize("fail", [False, True])
@pytest.mark.parametrize("transport", ["mrc", "roce"])
def test_released_connections_are_freed_without_a_garbage_collection(transport: str, fail: bool) -> None:
    kind = Qp if transport == "mrc" else RoceQp
    before = live(kind)
    sim = small(64, transport)
    job = hierarchical_allreduce(sim, 64 << 10)
    if fail:
        sim.faults.fail_link(*sim.faults.t0_uplink(0, 0, 0), 2_000, None)
    t = 0
    while not sim.done():
        t += 2_000
        sim.run(until=t)
        if transport == "mrc":  # a QP pair is freed when it is released, not at some later collection
            assert live(Qp) - before == sum(len(sim.host(h).qps) for h in range(64))
    assert job.step_ns() is not None and sim.delivered_bytes() == job.network_bytes() * 64
    assert live(kind) == before
    assert gc.collect() == 0  # the whole step left no reference cycle behind


@pytest.mark.parametrize(
    ("hosts", "size", "why"),
    [
        (60, 1 << 20, "whole number of 8-GPU servers"),
        (48, 48 << 10, "power of two"),
        (8, 64 << 10, "power of two"),
        (64, 32, "multiple of 64"),
        (64, 100_000, "multiple of 64"),
    ],
)
def test_invalid_shapes_are_refused(hosts: int, size: int, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        hierarchical_allreduce(small(hosts), size)


def test_transient_connections_come_before_flows() -> None:
    sim = small(64)
    sim.add_flow(0, 1, 100)
    with pytest.raises(ValueError, match="before adding flows"):
        sim.transient_connections()
    assert isinstance(sim.host(0), MrcHost)


GOLDEN_SHRINK = ["fabric.hosts=256", "fabric.t0_radix=32", "fabric.t1_radix=32", "workload.size_kib=256"]


def scenario_step_times() -> dict[str, float | None]:
    """`allreduce-hier-1k`'s four variants on 256 GPUs (32 servers; a test-sized run): each step time."""
    out = {}
    for run in expand_runs(load_scenario("allreduce-hier-1k", GOLDEN_SHRINK)):
        sim = build_run(run.doc)
        res = sim.run(until=int(run.doc["until_us"] * 1000))
        rep = res.report()
        assert rep["completed"] == rep["flows"] == 10 * 256
        out[run.label] = rep["job_time_us"]
    return out


def test_golden_allreduce_hier() -> None:
    """Fixed seed → fixed step times; a change must be explained and the golden file regenerated
    (`regenerate` below)."""
    assert scenario_step_times() == json.loads(GOLDEN.read_text())


def regenerate() -> None:
    GOLDEN.write_text(json.dumps(scenario_step_times(), indent=1) + "\n")
