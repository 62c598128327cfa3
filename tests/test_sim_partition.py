"""A simulation split across ranks (`openmrc.sim.partition`) gives the results of the run in one process."""

from __future__ import annotations

import importlib.util
import json
import os
import pickle
import random
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, cast

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from openmrc import _native
from openmrc.cli.main import app
from openmrc.fabric.clos import MultiPlaneClos
from openmrc.fabric.fattree import FatTree
from openmrc.sim import partition
from openmrc.sim.config import FabricSimConfig
from openmrc.sim.engine import WHEEL_NS, Simulator, order_records
from openmrc.sim.fabric_sim import FabricSim, shared_switches
from openmrc.sim.flows import Trigger
from openmrc.sim.hosts import MrcHost, RemoteHost
from openmrc.sim.metrics import SimResults
from openmrc.sim.network import OrderedPort, Remote, Switch
from openmrc.sim.parallel import exchange
from openmrc.sim.parallel import windows as window_loop
from openmrc.sim.parallel.ranks import _walk_ranks
from openmrc.transport import SackTransmit, Transmit, TrimMark
from openmrc.transport.types import data_transmit
from openmrc.wire import AETH, BTH, Opcode, Packet
from openmrc.wire.constants import OP_WRITE_MIDDLE
from openmrc.wire.headers import SETH, CcState
from openmrc.wire.packet import DataTemplate, parse

fork_only = pytest.mark.skipif(not hasattr(os, "fork"), reason="the local backend forks")


def _clos(
    part: tuple[int, int] | None = None, *, whole_switches: bool = False, security: str = "none"
) -> FabricSim:
    """A small 2-plane Clos with everything that must not depend on the split: an incast (trims, ECN
    draws), a permutation, random loss on a plane, a link that fails and returns, a NIC port failure,
    Write-with-Immediate flows (the receiver's completion) and sampling. ``part``: only that rank's part
    (``whole_switches``: each T1 whole, on the rank `assign_ranks` gives it, instead of shared out)."""
    cfg = FabricSimConfig(hosts=32, planes=2, evs_per_qp=8, ordered=True, security=security)
    if whole_switches and part is not None:
        owned = [r == part[0] for r in partition.assign_ranks(cfg.clos(), part[1])]
        sim = FabricSim.clos(cfg, owned=owned)
    else:
        sim = FabricSim.clos(cfg, part=partition.assign(cfg.clos(), part))
    for i in range(1, 9):
        sim.add_flow(3 * i, 0, 300_000, imm=i % 2 == 0)
    for i in range(32):
        sim.add_flow(i, (i + 13) % 32, 100_000, 5_000)
    faults = sim.faults
    faults.fail_link(*faults.t0_uplink(0, 0, 0), 20_000, 60_000)
    faults.fail_nic_port(5, 2, 30_000)
    faults.set_loss(faults.plane_ports(1), 0.01, 0, 50_000)
    sim.sample_every(5_000)
    return sim


def _fat_tree(part: tuple[int, int] | None = None) -> FabricSim:
    """A k=4 fat tree, ECMP: pods split across ranks, core switches shared out; a core switch fails, an
    aggregation link runs degraded and flaps (ECMP reconverges around it)."""
    topo = FatTree.from_k(4)
    cfg = FabricSimConfig(routing="ecmp", evs_per_qp=16, ordered=True, ecmp_reconverge_ns=5_000)
    sim = FabricSim.fat_tree(topo, cfg, part=partition.assign(topo, part))
    for i in range(16):
        sim.add_flow(i, (i + 5) % 16, 200_000, imm=i % 3 == 0)
        sim.add_flow((i + 5) % 16, i, 50_000, 2_000)  # both ways between the same hosts
    sim.faults.fail_switch(sim.topo.num_nodes() - 1, 10_000)
    agg = topo.num_hosts + 8  # an aggregation switch: its links up to the cores cross ranks
    sim.faults.degrade_link(agg, 2, 3_000, 0.5, 40_000)
    sim.faults.flap_link(agg, 3, 5_000, 2_000, 6_000, 3)
    return sim


def _view(res: SimResults) -> dict[str, Any]:
    return {
        "flows": [(f.id, f.start, f.finish, f.recv_finish, f.status) for f in res.flows],
        "counters": res.counters,
        "links": res.links,
        "samples": res.samples,
        "ev_log": res.ev_log,
        "outages": res.outages,
        "events": res.events,
        "now": res.now,
    }


@fork_only
@pytest.mark.parametrize("build", [_clos, _fat_tree])
def test_same_results_on_1_2_and_3_ranks(build: Any) -> None:
    one = _view(partition.run_local(build(), 1, 10**9))
    assert all(f[2] is not None for f in one["flows"])  # every flow finished
    assert one["counters"]["packet_hops"] > 0
    for ranks in (2, 3):
        assert _view(partition.run_local(build(), ranks, 10**9)) == one, ranks  # built whole, then split
        res = partition.run_local(build, ranks, 10**9)
        assert _view(res) == one, ranks  # each rank builds its part
        times = res.timings
        assert len(times) == ranks and len({t["critical_cpu_s"] for t in times}) == 1  # every rank agrees
        # per window the busiest rank's time, summed: at least any one rank's running time in all
        assert all(times[0]["critical_cpu_s"] >= t["run_cpu_s"] for t in times)


@fork_only
def test_authenticated_qps_give_the_same_results_on_2_ranks() -> None:
    """Sealed packets (`[fabric] security`) cross ranks with their bytes: the split run is the whole one,
    and no packet was refused anywhere (every seal opened where it arrived)."""
    one = _view(partition.run_local(_clos(security="auth"), 1, 10**9))
    assert all(f[2] is not None for f in one["flows"])
    assert _view(partition.run_local(lambda part: _clos(part, security="auth"), 2, 10**9)) == one


@fork_only
def test_parts_built_with_each_switch_whole_run_so_and_give_the_same_results() -> None:
    """Parts that run each T1 whole on one rank (the nodes `assign_ranks` gives a rank, not
    `owned_nodes`): every packet into a T1 crosses to that T1's rank, results as in one process; parts
    built the two ways do not run together."""
    one = _view(partition.run_local(_clos(), 1, 10**9))

    def whole(part: tuple[int, int] | None) -> FabricSim:
        return _clos(part, whole_switches=True)

    apart, shared_out = whole((0, 2)).part, _clos((0, 2)).part
    assert apart is not None and apart.shared is None
    assert shared_out is not None and shared_out.shared is not None
    res = partition.run_local(whole, 2, 10**9)
    assert _view(res) == one
    crossed = sum(t["crossing"] for t in res.timings)
    assert sum(t["crossing"] for t in partition.run_local(_clos, 2, 10**9).timings) < crossed  # (fewer)

    def mixed(part: tuple[int, int] | None) -> FabricSim:
        return _clos(part, whole_switches=part is not None and part[0] == 1)

    with pytest.raises(partition.PartitionError, match="built apart"):
        partition.run_local(mixed, 2, 10**9)


def test_the_clos_case_loses_trims_and_drops_packets() -> None:
    """What the equality above covers: trims, random loss, packets lost to the failures, EVs gone bad."""
    one = _view(partition.run_local(_clos(), 1, 10**9))
    counters = one["counters"]
    assert counters["trims"] > 0 and counters["losses"] > 0 and counters["drops"] > 0
    assert counters["retransmits"] > 0 and any(s.ev_to_bad for s in one["samples"])
    assert one["outages"] and any(o.last_packet_ns is not None for o in one["outages"])


def test_a_rank_builds_only_its_part() -> None:
    whole = _clos()
    ports = sum(len(n.ports) for n in whole.nodes)
    qps = {h.id: list(h.nic.qps) for h in whole.hosts if isinstance(h, MrcHost)}
    shared = shared_switches(whole.topo)
    assert shared is not None and any(shared)
    for size in (2, 3):
        rank_of = partition.assign_ranks(whole.topo, size)
        built_ports = 0
        for rank in range(size):
            part = _clos((rank, size))
            share = part.part
            assert share is not None
            here = [rank_of[n] == rank or shared[n] for n in range(whole.topo.num_nodes())]
            assert [n.id for n in part.nodes if not isinstance(n, Remote)] == [
                n for n, h in enumerate(here) if h
            ]
            nics = [h for h in part.hosts if isinstance(h, MrcHost)]
            assert [h.id for h in nics] == [h for h in range(whole.topo.num_hosts) if here[h]]
            assert all(isinstance(h, RemoteHost) for h in part.hosts if rank_of[h.id] != rank)
            for n in part.nodes:  # a shared switch runs here the ports towards this rank's nodes only
                if shared[n.id]:
                    refs = whole.topo.ports(n.id)
                    assert [p is not share.elsewhere for p in n.ports] == [
                        rank_of[r.peer] == rank for r in refs
                    ]
            built_ports += sum(p is not share.elsewhere for n in part.nodes for p in n.ports)
            ghosts = {
                (n, r.port)
                for n in range(whole.topo.num_nodes())
                for r in whole.topo.ports(n)
                if not here[n] and here[r.peer]
            }
            assert set(share.ghosts) == ghosts and ghosts  # a stand-in for each port leading in, no more
            for h in nics:  # the same QP numbers, made in the same order, as in one process
                assert list(h.nic.qps) == qps[h.id]
        assert built_ports == ports  # every port built once, by the rank that runs it


class _Threads:
    """An in-process exchange among threads (one per rank)."""

    def __init__(self, size: int) -> None:
        import threading

        self.size = size
        self.boxes: list[list[Any]] = [[None] * size for _ in range(size)]
        self.barrier = threading.Barrier(size)

    def rank(self, rank: int) -> partition.Exchange:
        outer = self

        class Ex:
            def __init__(self) -> None:
                self.rank, self.size = rank, outer.size

            def alltoall(self, out: list[Any]) -> list[Any]:
                for r in range(outer.size):
                    outer.boxes[r][rank] = out[r]
                outer.barrier.wait()
                got = list(outer.boxes[rank])
                outer.barrier.wait()
                return got

        return Ex()


@pytest.mark.parametrize("size", [2, 3])
def test_qps_of_pairs_cut_by_the_split_are_connected_as_in_one_process(size: int) -> None:
    import threading

    whole = _fat_tree()
    want = {
        (h.id, n): (qp.attr.dest_qp_num, qp.attr.peer)
        for h in whole.hosts
        if isinstance(h, MrcHost)
        for n, qp in h.nic.qps.items()
    }
    assert len(want) == sum(len(h.nic.qps) for h in whole.hosts if isinstance(h, MrcHost))
    parts = [_fat_tree((r, size)) for r in range(size)]
    rank_of = partition.assign_ranks(whole.topo, size)
    ex = _Threads(size)
    threads = [
        threading.Thread(target=window_loop._connect_parts, args=(parts[r], rank_of, ex.rank(r)))
        for r in range(size)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    got = {}
    for part in parts:
        assert part.part is not None and part.part.cut_qps  # some pairs are cut
        for h in part.hosts:
            if isinstance(h, MrcHost):
                for n, qp in h.nic.qps.items():
                    assert qp.requester.dest_qp == qp.attr.dest_qp_num
                    got[h.id, n] = (qp.attr.dest_qp_num, qp.attr.peer)
    assert got == want  # each QP number unique on its NIC, each QP pointed at its peer's


@fork_only
def test_a_rank_that_cannot_build_its_part_stops_every_rank() -> None:
    def build(part: tuple[int, int] | None) -> FabricSim:
        if part is not None and part[0] == 1:
            raise ValueError("no such workload")
        return _clos(part)

    with pytest.raises(partition.PartitionError, match="no such workload"):
        partition.run_local(build, 2, 10**9)


def test_the_split_keeps_t0_groups_and_shares_spines() -> None:
    sim = FabricSim.fat_tree(FatTree.from_k(4), FabricSimConfig(routing="ecmp", ordered=True))
    rank = partition.assign_ranks(sim, 2)
    topo = sim.topo
    assert sorted(set(rank)) == [0, 1]
    for h in range(topo.num_hosts):
        assert rank[h] == rank[topo.ports(h)[0].peer]  # a host runs with its T0
    assert rank[: topo.num_hosts] == sorted(rank[: topo.num_hosts])  # contiguous blocks
    cores = [
        n for n in range(topo.num_hosts, topo.num_nodes()) if len({rank[r.peer] for r in topo.ports(n)}) > 1
    ]
    assert {rank[n] for n in cores} == {0, 1}  # shared out
    assert partition.lookahead_ns(sim) == min(r.latency_ns for r in topo.ports(0))


@pytest.mark.parametrize(
    ("planes", "hosts", "t0_radix", "oversubscription"),
    [(1, 1, 4, 1), (2, 32, 8, 1), (3, 33, 8, 1), (8, 100, 16, 3), (2, 257, 16, 1)],
)
def test_a_clos_split_from_its_shape_is_the_walks(
    planes: int, hosts: int, t0_radix: int, oversubscription: int
) -> None:
    """A `MultiPlaneClos` is split and its window found from its shape: as walking its links gives."""
    for lat, host_lat in ((500, 500), (700, 300), (100, 900)):
        c = MultiPlaneClos(planes, hosts, t0_radix, 64, oversubscription=oversubscription,
                           link_latency_ns=lat, host_link_latency_ns=host_lat)  # fmt: skip
        for ranks in range(1, min(hosts, 5) + 1):
            assert partition.assign_ranks(c, ranks) == _walk_ranks(c, ranks)
        walked = min(r.latency_ns for n in range(c.num_nodes()) for r in c.ports(n))
        assert partition.lookahead_ns(c) == walked


_ORIGINS = pytest.mark.parametrize(
    "origins", [0, 100, 1 << 20], ids=["origins-made-when-met", "few-origins", "many-origins"]
)


@_ORIGINS
def test_ordered_engine_breaks_ties_by_origin_then_scheduling_order(origins: int) -> None:
    sim = Simulator()
    sim.order_by_origin(origins)
    ran: list[str] = []

    def later(name: str) -> None:
        ran.append(name)

    def first(name: str) -> None:
        ran.append(name)
        sim.schedule(sim.now, later, "zero-delay from 1", origin=1)  # merged by origin into this time's

    sim.schedule(10, later, "3a", origin=3)
    sim.push_from(10, later, "2a", 2)
    sim.schedule(10, first, "1a", origin=1)
    sim.push_from(10, later, "3b", 3)
    sim.schedule(10, later, "prio 1", priority=1, origin=0)
    sim.schedule(10, later, "0a", origin=0)
    sim.run()
    assert ran == ["0a", "1a", "zero-delay from 1", "2a", "3a", "3b", "prio 1"]
    with pytest.raises(ValueError, match="already scheduled"):
        sim.order_by_origin()


@_ORIGINS
def test_ordered_slots_hold_the_engines_own_origin_ints_and_count_set_up_events(origins: int) -> None:
    """A slot keeps its events' origins as the engine's shared int objects (none made per event), however
    many origins the engine was told of; origin 0's events are counted as set-up wherever they run: alone
    in their slot, sorted among others, from the heap, or scheduled for the time being run."""
    sim = Simulator()
    sim.order_by_origin(origins)
    ran: list[str] = []

    def rec(name: str) -> None:
        ran.append(name)

    def spawn(_: None) -> None:
        ran.append("spawn")
        sim.schedule(sim.now, rec, "now 0", origin=0)

    big = 70_000  # past any count the engine was told of: its box is made when first met
    sim.push_from(5, rec, "alone 0", 0)
    sim.push_from(7, rec, "big", big)
    sim.push_from(7, spawn, None, 2)
    sim.push_from(7, rec, "zero", 0)
    sim.schedule(WHEEL_NS + 9, rec, "heap 0", origin=0)
    slot = sim.wheel[7]
    assert [slot[0], slot[3], slot[6]] == [big, 2, 0]
    assert slot[0] is sim.boxes[big] and slot[3] is sim.boxes[2] and slot[6] is sim.boxes[0]
    sim.run()
    assert ran == ["alone 0", "zero", "spawn", "now 0", "big", "heap 0"]
    assert sim.setup_events == 4 and sim.events == 6


@pytest.mark.parametrize("origins", [100, 1 << 20], ids=["few-origins", "2**20-origins"])
@pytest.mark.parametrize("crowd", [2, 3, 64, 65, 600])
def test_a_crowded_slot_runs_by_origin_then_scheduling_order(origins: int, crowd: int) -> None:
    """However many events share a time (past 64, the C ordering sorts them another way) and whatever
    their origins, they run by origin, each origin's in the order it scheduled them."""
    sim = Simulator()
    sim.order_by_origin(origins)
    rng = random.Random(crowd)
    events = [(rng.choice((0, 1, 7, origins - 1, origins)), i) for i in range(crowd)]
    ran: list[tuple[int, int]] = []
    for origin, i in events:
        sim.push_from(20, ran.append, (origin, i), origin)
    sim.run()
    assert ran == sorted(events)  # (origin, scheduling order)
    assert sim.setup_events == sum(1 for o, _ in events if o == 0)


_C_ORDER = _native.extension("_order")
_ORDERERS = [
    pytest.param(order_records, id="python"),
    pytest.param(
        _C_ORDER.order_records if _C_ORDER else None,
        id="c",
        marks=pytest.mark.skipif(_C_ORDER is None, reason="the C ordering comes with the compiled build"),
    ),
]
_FIRSTS = st.sampled_from([0, 1, 2, 5, 2**30 - 1, 2**30, 2**62])  # one digit or several
_RECORDS = st.lists(st.tuples(_FIRSTS, st.integers()), max_size=300)


@pytest.mark.parametrize("order", _ORDERERS)
@settings(max_examples=300, deadline=None)
@given(records=_RECORDS, width=st.integers(1, 4))
def test_records_are_put_in_order_of_their_first_items_stably(
    order: Any, records: list[tuple[int, int]], width: int
) -> None:
    """A time's events are ordered by origin, each origin's keeping their order (`order_records`, and the
    C one the compiled build runs): a stable sort of fixed-width records, nothing lost or repeated."""
    flat: list[object] = []
    for i, (first, tag) in enumerate(records):
        flat += [first, tag, i, object()][:width]
    expected = [flat[j * width : (j + 1) * width] for j in range(len(records))]
    expected.sort(key=lambda rec: cast(int, rec[0]))
    order(flat, width)
    assert [flat[j * width : (j + 1) * width] for j in range(len(records))] == expected
    assert all(a is b for a, b in zip(flat, [x for rec in expected for x in rec], strict=True))


@pytest.mark.skipif(_C_ORDER is None, reason="the C ordering comes with the compiled build")
def test_the_c_ordering_refuses_what_is_not_records_of_origins() -> None:
    assert _C_ORDER is not None
    c_order = _C_ORDER.order_records
    with pytest.raises(ValueError, match="not whole records of 3"):
        c_order([1, print, None, 0], 3)
    with pytest.raises(TypeError, match="record 1 begins with str"):
        c_order([1, print, None, "0", print, None], 3)
    with pytest.raises(ValueError, match="record 0 begins with -1"):
        c_order([-1, print, None, 0, print, None], 3)
    with pytest.raises(ValueError, match="record 0 begins with 2361183241434822606848"):
        c_order([2**71, print, None, 0, print, None], 3)
    with pytest.raises(TypeError, match="must be a list"):
        c_order((1, 0), 1)
    with pytest.raises(ValueError, match="width must be at least 1"):
        c_order([1, 0], 0)
    refused = [3, "c", 1, "a", None, "x"]
    with pytest.raises(TypeError):
        c_order(refused, 2)
    assert refused == [3, "c", 1, "a", None, "x"]  # a refused list is left as it was


@pytest.mark.skipif(_C_ORDER is None, reason="the C ordering comes with the compiled build")
def test_a_c_extension_is_used_only_as_built_from_its_source(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`_native.extension` hands out a C extension only with the compiled build and only when the manifest
    says it was built from today's source (an edited ``_order.c`` not yet rebuilt: the engine keeps to its
    Python ordering); the interpreted build orders with the Python reference."""
    manifest = json.loads(_native.MANIFEST.read_text())
    assert _native.extension("_order") is _C_ORDER
    for digest in ("0" * 64, None):
        edited = tmp_path / f"manifest-{digest}.json"
        manifest["c"]["_order"] = digest
        edited.write_text(json.dumps(manifest))
        monkeypatch.setattr(_native, "MANIFEST", edited)
        assert _native.extension("_order") is None
    monkeypatch.undo()
    monkeypatch.setattr(_native, "compiled", frozenset())
    assert _native.extension("_order") is None
    assert _native.extension("_nothing_of_that_name") is None
    code = "from openmrc.sim import engine; print(engine._order_slot is engine.order_records)"
    for pure, python in (("1", "True"), ("", "False")):
        env = {**os.environ, "OPENMRC_PURE": pure}
        done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
        assert done.stdout.strip() == python, (pure, done.stderr)


def test_an_ordered_port_draws_its_own_seeded_uniform_stream() -> None:
    """A port of an ordered run draws from a stream of its own, seeded by the run's seed and the port:
    what other ports draw in between changes nothing, two ports' streams differ, and the draws are
    uniform in [0, 1)."""

    def ports(seed: int) -> list[OrderedPort]:
        sim = FabricSim.clos(FabricSimConfig(hosts=16, planes=1, ordered=True, seed=seed))
        return [p for node in sim.nodes for p in node.ports if isinstance(p, OrderedPort)]

    a, b = ports(1)[:2]
    alone = [a._draw() for _ in range(20_000)]
    assert all(0.0 <= x < 1.0 for x in alone)
    assert abs(sum(alone) / len(alone) - 0.5) < 0.01
    assert sum(x < 0.1 for x in alone) / len(alone) == pytest.approx(0.1, abs=0.01)
    a2, b2 = ports(1)[:2]
    interleaved = []
    for _ in range(20_000):
        interleaved.append(a2._draw())
        b2._draw()
    assert interleaved == alone
    assert [b._draw() for _ in range(100)] != alone[:100]
    assert [ports(2)[0]._draw() for _ in range(100)] != alone[:100]  # the run's seed counts


def test_a_negative_origin_goes_to_the_outbox() -> None:
    sim = Simulator()
    sim.order_by_origin()
    sim.push_from(5, print, "x", ~2)
    assert sim.peek() is None
    assert sim.outbox == [(5, 2, print, "x")]


@fork_only
def test_what_acts_across_hosts_at_once_is_refused() -> None:
    sim = FabricSim.clos(FabricSimConfig(hosts=16, planes=1, ordered=True))
    done = Trigger()
    sim.add_flow(0, 9, 10_000, send_done=done)
    sim.add_flow(9, 1, 10_000, trigger=done)
    with pytest.raises(partition.PartitionError, match="trigger"):
        partition.run_local(sim, 2, 10**9)
    assert partition.run_local(sim, 1, 10**9).flows[1].finish is not None  # one rank: fine
    with pytest.raises(partition.PartitionError, match="ordered"):
        partition.run_local(FabricSim.clos(FabricSimConfig(hosts=16, planes=1)), 2, 10**9)
    with pytest.raises(ValueError, match="MRC hosts without PFC"):
        FabricSimConfig(routing="ecmp", transport="roce", ordered=True)


@fork_only
def test_cli_ranks_writes_the_same_files(tmp_path: Path) -> None:
    outs = []
    for ranks in (1, 2):
        out = tmp_path / f"r{ranks}"
        sets = ["--set", "fabric.hosts=32", "--set", "workload.size_kib=64"]
        res = CliRunner().invoke(
            app, ["sim", "run", "clos-perm", "--ranks", str(ranks), "--quiet", "--out", str(out), *sets]
        )
        assert res.exit_code == 0, res.output
        outs.append(out)
    for name in ("flows.csv", "links.csv", "series.csv"):
        assert (outs[0] / name).read_text() == (outs[1] / name).read_text(), name
    res = CliRunner().invoke(
        app, ["sim", "run", "clos-perm", "--ranks", "2", "--set", "fabric.transport='roce'"]
    )
    assert res.exit_code != 0 and "Traceback" not in res.output


def test_ranks_refuse_a_scenario_with_a_variant_they_cannot_split_before_running_any() -> None:
    res = CliRunner().invoke(app, ["sim", "run", "htsim-incast-15", "--ranks", "2"])
    assert res.exit_code != 0 and "Traceback" not in res.output
    assert "RoCEv2 + DCQCN" in res.output and "--variant" in res.output
    assert "finished MRC" not in res.output  # the MRC variant, first in the file, did not run first


with_mpi = pytest.mark.skipif(
    importlib.util.find_spec("mpi4py") is None
    or shutil.which("mpiexec", path=os.path.dirname(sys.executable)) is None,
    reason="the mpi extra (mpi4py, mpich) is not installed",
)


@with_mpi
def test_mpi_ranks_give_the_single_process_results(tmp_path: Path) -> None:
    script = tmp_path / "run.py"
    script.write_text(  # each rank writes its own file (their stdout lines may interleave)
        "import sys\n"
        "from mpi4py import MPI\n"
        "from openmrc.sim import partition\n"
        "from tests.test_sim_partition import _clos, _view\n"
        "res = _view(partition.run(_clos(), int(sys.argv[1]), 10**9))\n"
        "out = f'{sys.argv[2]}/rank{MPI.COMM_WORLD.Get_rank()}.txt'\n"
        "open(out, 'w').write(f\"{res['flows']!r} {res['counters']!r}\")\n"
    )
    mpiexec = shutil.which("mpiexec", path=os.path.dirname(sys.executable))
    assert mpiexec is not None
    # the tests and the openmrc under test (this process's, wherever it was imported from)
    paths = [Path(__file__).resolve().parent.parent, Path(_native.__file__).resolve().parent.parent]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(map(str, paths)))
    cmd = [mpiexec, "-n", "2", sys.executable, str(script), "2", str(tmp_path)]
    got = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert got.returncode == 0, got.stderr
    one = _view(partition.run_local(_clos(), 1, 10**9))
    want = f"{one['flows']!r} {one['counters']!r}"
    assert (tmp_path / "rank0.txt").read_text() == want
    assert (tmp_path / "rank1.txt").read_text() == want  # every rank has the whole run's results


def test_a_control_packet_crosses_as_its_wire_bytes_or_else_as_itself() -> None:
    ack = Packet(BTH(Opcode.ACK, dest_qp=0x12, psn=77), aeth=AETH(0, 5))
    got = exchange._wire(ack)
    assert isinstance(got, bytes) and parse(got) == ack
    bad = Packet(BTH(Opcode.ACK, dest_qp=0x12, psn=77))  # no AETH: does not encode
    assert exchange._wire(bad) is bad


@with_mpi
def test_the_cli_under_mpiexec_writes_the_results_of_the_single_process_run(tmp_path: Path) -> None:
    from openmrc.testbed.experiment import openmrc_argv

    mpiexec = shutil.which("mpiexec", path=os.path.dirname(sys.executable))
    assert mpiexec is not None
    sets = ["--set", "fabric.hosts=32", "--set", "workload.size_kib=64"]
    ranks2, ranks1 = tmp_path / "r2", tmp_path / "r1"
    cmd = [
        mpiexec,
        "-n",
        "2",
        *openmrc_argv(),
        "sim",
        "run",
        "clos-perm",
        "--ranks",
        "2",
        "--out",
        str(ranks2),
    ]
    got = subprocess.run([*cmd, *sets], capture_output=True, text=True, timeout=300)
    assert got.returncode == 0, got.stdout + got.stderr
    assert got.stdout.count("clos-perm") >= 1 and "Traceback" not in got.stdout + got.stderr  # rank 0's table
    res = CliRunner().invoke(
        app, ["sim", "run", "clos-perm", "--ranks", "1", "--quiet", "--out", str(ranks1), *sets]
    )
    assert res.exit_code == 0, res.output
    assert (ranks2 / "flows.csv").read_text() == (ranks1 / "flows.csv").read_text()


@_ORIGINS
def test_ordered_slots_merge_heap_events_first_within_each_origin(origins: int) -> None:
    sim = Simulator()
    sim.order_by_origin(origins)
    ran: list[str] = []
    far = WHEEL_NS + 5  # scheduled from time 0: waits in the heap, not the wheel

    def rec(name: str) -> None:
        ran.append(name)

    def later(_: None) -> None:  # from time 10 the same time is within the wheel's reach
        for name, origin in (("wheel 2", 2), ("wheel 1", 1), ("wheel 3", 3)):
            sim.push_from(far, rec, name, origin)

    sim.schedule(far, rec, "heap 3", origin=3)
    sim.schedule(far, rec, "heap 1", origin=1)
    sim.schedule(10, later, None, origin=4)
    sim.run()
    assert ran == ["heap 1", "wheel 1", "wheel 2", "heap 3", "wheel 3"]
    assert sim.in_wheel == 0 and not any(sim.wheel)


_TPL = DataTemplate(0x21, 3, 4, 0xBEEF, 1 << 20, 9)


_SACK_FIELDS = (
    "dest_qp", "cack_psn", "ack_psn_offset", "sack_offset", "bitmap", "echo", "m", "pr", "mpr", "ts_echo",
    "ooo_count", "rcvd_256b",
)  # fmt: skip


def _crossing(pkt: Packet | str | None) -> Transmit:
    if isinstance(pkt, str):  # "sack": a SACK as the responder sends it: its fields, no Packet
        tx: Transmit = SackTransmit(0x33, 0x12, 77, -3, 2, (1 << 64) - 2, 0xABCD, 1, True, 64, 5, 2, 0xFFFFFF)
        tx.port, tx.peer, tx.ev, tx.entropy = 2, 5, b"ev", 0xABCD
    elif pkt is None:  # a data packet: its Write's template and fields
        tx = data_transmit(
            2,
            5,
            b"ev",
            0xABCD,
            0x33,
            _TPL,
            OP_WRITE_MIDDLE,
            True,
            False,
            1234,
            1 << 40,
            memoryview(bytes(100)),
        )
    else:
        tx = Transmit(2, 5, b"ev", 0xABCD, pkt, 0x33, 0)
    tx.wire_size, tx.addr, tx.src = 164, (1 << 120) | 77, 3
    tx.ecn, tx.trim, tx.epoch, tx.seg, tx.flow_crc = True, TrimMark.TRIMMED, 2, 1 << 100, 0x5A5A
    return tx


def _assert_arrived_as_sent(got: Transmit, p: Transmit) -> None:
    for name in (
        "wire_size", "addr", "src", "peer", "port", "entropy", "ecn", "trim", "epoch", "seg", "flow_crc",
        "qp_num", "size",
    ):  # fmt: skip
        assert getattr(got, name) == getattr(p, name), name
    assert type(got) is type(p) and got.has_packet() == p.has_packet()
    assert got.packet == p.packet
    assert (got.tpl is None) == (p.tpl is None)
    if type(p) is SackTransmit:
        assert isinstance(got, SackTransmit)
        for name in _SACK_FIELDS:
            assert getattr(got, name) == getattr(p, name), name
    if p.tpl is not None:
        sent_fields = (p.op, p.psn, p.va, p.ack_req, p.rtx, bytes(p.payload))
        assert (got.op, got.psn, got.va, got.ack_req, got.rtx, bytes(got.payload)) == sent_fields
    if p._route < 0 and got._route < 0:  # (a wide one crosses by its address)
        assert (got.ev[:16], got._route) == (p.ev[:16], p._route)


@pytest.mark.parametrize("by_ev", [False, True], ids=["by-address", "by-ev"])
@pytest.mark.parametrize(
    "pkt",
    [
        None,
        "sack",
        Packet(BTH(Opcode.SACK, fecn=True, dest_qp=0x12, psn=77), seth=SETH(), cc_state=CcState()),
        Packet(BTH(Opcode.ACK, dest_qp=0x12, psn=77), aeth=AETH(0, 5)),
        Packet(BTH(Opcode.ACK, dest_qp=0x12, psn=77)),  # does not encode: crosses as itself
    ],
    ids=["data", "sack", "sack-fecn", "ack", "bad"],
)
def test_a_crossing_packet_arrives_as_it_left(pkt: Packet | str | None, by_ev: bool) -> None:
    sim = FabricSim.fat_tree(FatTree.from_k(4), FabricSimConfig(routing="ecmp", ordered=True))
    rank_of = partition.assign_ranks(sim, 2)
    cut = exchange._Cut(sim, rank_of, 1, 2)
    lane = exchange._Lane()
    sent = [_crossing(pkt), _crossing(pkt), _crossing(pkt), _crossing(pkt)]
    sent[1].epoch = 1 << 70  # beyond its packed format: crosses as a tuple of its fields, in its turn
    sent[2].src, sent[2].peer, sent[2].qp_num = 9, 6, 0x44  # a data packet: its template crossed with others
    sent[3].port = 1 << 41  # beyond the word it shares with the kind, flags and trim: wide too
    if by_ev:
        for p in sent:
            p.ev = bytes([0xFC, 0, 0, 1, 0xE0, 1, 0xE1, 2, 0xE2, 3]) + bytes(22)
            p.route_by_ev()
        sent[2]._route = -(1 << 60 | 0xE102 << 5 | 6)  # a compact route (`routing._compact`)
    target = next(h for h in range(sim.topo.num_hosts) if rank_of[h] == 1)
    for i, p in enumerate(sent):
        lane.pack(100 + i, 7 << 40 | 4 * target, p)
    msg = lane.message()
    assert msg is not None and lane.message() is None  # emptied
    assert len(msg.head.wide) == (3 if pkt is None else 2)  # the packets shipped wide
    engine = Simulator()
    engine.order_by_origin()
    assert cut.decode(0, pickle.loads(exchange._dumps(msg.head)), bytes(msg.rows), engine) == 4
    for i, p in enumerate(sent):
        key, cb, got = engine.wheel[100 + i]
        assert cb == sim.nodes[target].arrive_cb and key == 7  # the origin
        _assert_arrived_as_sent(got, p)
    if pkt is None:  # the template crossed once: the packets share the one made of it
        assert engine.wheel[100][2].tpl is engine.wheel[101][2].tpl is engine.wheel[102][2].tpl
    elif by_ev:  # packed, not wide: still routed by its EV, by its compact route as it was
        assert engine.wheel[102][2]._route == sent[2]._route < 0


_BEYOND = [
    ("wire_size", 1 << 22), ("flow_crc", 1 << 33), ("flow_crc", -2), ("epoch", 1 << 29), ("port", 1 << 16),
    ("entropy", 1 << 32), ("src", 1 << 32), ("peer", 1 << 30), ("qp_num", 1 << 24),
]  # fmt: skip
_BEYOND_BY_KIND = [("data", n, v) for n, v in [*_BEYOND, ("op", 1 << 8), ("payload", 1 << 20)]] + [
    (k, n, v) for k in ("sack", "ack") for n, v in [*_BEYOND, ("size", 1 << 32)]
]  # (a data packet's size is its payload's)


@pytest.mark.parametrize("by_ev", [False, True], ids=["by-address", "by-ev"])
@pytest.mark.parametrize(
    ("kind", "name", "value"), _BEYOND_BY_KIND, ids=[f"{k}-{n}={v:#x}" for k, n, v in _BEYOND_BY_KIND]
)
def test_a_field_beyond_its_place_in_a_row_crosses_wide_between_rows(
    kind: str, name: str, value: int, by_ev: bool
) -> None:
    """Each field a row packs beside others in a word (or in fewer bits than it may have) sends a packet
    that does not fit wide, in its turn between packed ones, and it arrives with the value it left with."""
    pkt = {
        "data": None,
        "sack": "sack",
        "ack": Packet(BTH(Opcode.ACK, dest_qp=0x12, psn=77), aeth=AETH(0, 5)),
    }
    sim = FabricSim.fat_tree(FatTree.from_k(4), FabricSimConfig(routing="ecmp", ordered=True))
    rank_of = partition.assign_ranks(sim, 2)
    cut = exchange._Cut(sim, rank_of, 1, 2)
    target = next(h for h in range(sim.topo.num_hosts) if rank_of[h] == 1)
    sent = [_crossing(pkt[kind]) for _ in range(3)]
    odd = sent[1]
    if name == "payload":
        odd.payload = memoryview(bytes(value))
        odd.size = value
    else:
        setattr(odd, name, value)
    if by_ev:
        for p in sent:
            p.ev = bytes([0xFC, 0, 0, 1, 0xE0, 1, 0xE1, 2, 0xE2, 3]) + bytes(22)
            p.route_by_ev()
    lane = exchange._Lane()
    for i, p in enumerate(sent):
        lane.pack(100 + i, 7 << 40 | 4 * target, p)
    msg = lane.message()
    assert msg is not None and len(msg.head.wide) == 1  # the one that does not fit, alone
    engine = Simulator()
    engine.order_by_origin()
    assert cut.decode(0, pickle.loads(exchange._dumps(msg.head)), bytes(msg.rows), engine) == 3
    for i, p in enumerate(sent):
        _assert_arrived_as_sent(engine.wheel[100 + i][2], p)


def test_a_cut_port_of_a_fabric_beyond_the_nodes_a_split_run_names_is_refused() -> None:
    lane = exchange._Lane()
    exchange._Shipper(lane, 1 << 23, 4, (1 << 40) - 1)  # the last name and origin there are
    for origin, deliver in ((1, 1 << 40), ((1 << 23) + 1, 5), (0, 5)):
        with pytest.raises(ValueError, match="at most 8,388,608 nodes"):
            exchange._Shipper(lane, origin, 4, deliver)


def test_a_lane_outgrows_its_first_buffer_and_starts_the_next_window_as_large() -> None:
    """Rows are packed in place: a window of more rows than the lane's first buffer holds crosses whole,
    in order, and the next window's buffer starts as large as the last one needed."""
    sim = FabricSim.fat_tree(FatTree.from_k(4), FabricSimConfig(routing="ecmp", ordered=True))
    rank_of = partition.assign_ranks(sim, 2)
    cut = exchange._Cut(sim, rank_of, 1, 2)
    target = next(h for h in range(sim.topo.num_hosts) if rank_of[h] == 1)
    lane = exchange._Lane()
    first = len(lane.buf)
    sent = []
    for i in range(3 * first // 64):
        p = _crossing(None)
        p.psn = i
        if i == 700:
            p.epoch = 1 << 70  # one in the middle goes wide (over what its row wrote of itself)
        sent.append(p)
        lane.pack(100 + i, 7 << 40 | 4 * target, p)
    msg = lane.message()
    assert msg is not None and len(msg.rows) > first and len(msg.head.wide) == 1
    assert len(lane.buf) >= len(msg.rows) and lane.off == 0
    engine = Simulator()
    engine.order_by_origin()
    assert cut.decode(0, pickle.loads(exchange._dumps(msg.head)), bytes(msg.rows), engine) == len(sent)
    assert [engine.wheel[100 + i][2].psn for i in range(len(sent))] == list(range(len(sent)))
    assert engine.wheel[800][2].epoch == 1 << 70 and engine.wheel[801][2].epoch == 2


def test_more_forked_ranks_than_pipes_can_connect_is_refused_before_any_fork() -> None:
    def build(part: tuple[int, int] | None) -> FabricSim:
        raise AssertionError("no rank may be built")

    with pytest.raises(partition.PartitionError, match="file descriptors"):
        partition.run_local(build, 100_000, 10**9)


@pytest.mark.parametrize("guarded", [False, True], ids=["unguarded", "guarded"])
def test_a_packet_sent_into_a_shared_switch_joins_the_queue_of_the_port_it_leaves_by(guarded: bool) -> None:
    """A T1 is run by every rank, each with its ports towards its own T0s (`shared_switches`): a packet a
    T0 sends up is routed at the T1 as it is sent, and arrives in the queue of the port it leaves by, on
    the rank that runs that port (packed or wide alike) or here, with the sending node as its origin,
    through the sending port's epoch check when its link is guarded. A forged address no switch routes is
    counted at the T1 on its arrival, as the switch would count it."""
    topo = _clos().topo
    rank_of = partition.assign_ranks(topo, 2)
    sims = [_clos((0, 2)), _clos((1, 2))]
    cuts = [exchange._Cut(s, rank_of, r, 2) for r, s in enumerate(sims)]
    n, i = sims[0].faults.t0_uplink(0, 0, 1)  # T0 0 of plane 0 is rank 0's
    assert rank_of[n] == 0
    splitter = sims[0].nodes[n].ports[i].cross
    assert isinstance(splitter, exchange._Splitter)
    for sim, cut in [(sims[0], cuts[0]), (_fat_tree((1, 2)), None)]:  # (a Clos's from its shape)
        ranks = partition.assign_ranks(sim.topo, 2)
        cut = cut or exchange._Cut(sim, ranks, 1, 2)
        shared = None if sim.part is None else sim.part.shared
        tops = [s for s in sim.nodes if isinstance(s, Switch) and shared and shared[s.id]]
        assert tops
        for sw in tops:  # each port of a shared switch: run by its peer's rank
            refs = sorted(sim.topo.ports(sw.id), key=lambda r: r.port)
            assert cut.port_ranks(sw) == [ranks[r.peer] for r in refs]
    t1 = topo.ports(n)[i].peer
    far = next(h for h in range(topo.num_hosts) if rank_of[h] == 1)
    near = next(h for h in range(topo.num_hosts) if rank_of[h] == 0)
    sent = []
    for k, (dst, epoch) in enumerate([(far, 2), (far, 1 << 70), (near, 2)]):  # packed, wide, here
        p = _crossing(None)
        p.peer, p.epoch = dst, epoch  # (its address is outside the plan's locator: routed by ECMP)
        splitter.ship(123 + k, p, guarded)
        sent.append(p)
    msg = cuts[0].lanes[1].message()
    assert msg is not None and len(msg.head.wide) == 1  # the second one wide
    assert cuts[0].lanes[0].message() is None  # nothing for the rank itself
    engine = Simulator()
    engine.order_by_origin()
    assert cuts[1].decode(0, pickle.loads(exchange._dumps(msg.head)), bytes(msg.rows), engine) == 2
    for k, (s, eng) in enumerate([(sims[1], engine), (sims[1], engine), (sims[0], sims[0].sim)]):
        origin, cb, arg = eng.wheel[123 + k][-3:]
        assert origin == n + 1  # its origin: the T0 that sent it
        again = _crossing(None)
        again.peer = sent[k].peer
        leaves = sims[k // 2].routing.port(t1, again)  # (the port depends on the packet alone)
        down = next(r for r in topo.ports(t1) if r.port == leaves)
        out = s.nodes[t1].ports[leaves]
        assert s.part is not None
        assert out is not s.part.elsewhere and rank_of[down.peer] == (1 if k < 2 else 0)
        if guarded:
            guard = s.part.ghosts[n, i] if k < 2 else sims[0].nodes[n].ports[i]
            assert cb is exchange._guarded_entry and arg[:2] == (guard, out)
            _assert_arrived_as_sent(arg[2], sent[k])
        else:
            assert cb == out.enter
            _assert_arrived_as_sent(arg, sent[k])
    forged = _crossing(None)
    plan = sims[0].plan
    assert plan is not None
    forged.addr = plan.locator << 96 | 0xFFFF << 80
    sender = sims[0].nodes[n].ports[i]
    forged.epoch = sender.epoch  # (as the port sets it)
    splitter.ship(200, forged, guarded)
    origin, cb, arg = sims[0].sim.wheel[200][-3:]
    assert origin == n + 1 and cb is exchange._misrouted
    switch = sims[0].nodes[t1]
    assert isinstance(switch, Switch)
    cb(arg)
    assert switch.misrouted == 1
    if guarded:  # its link failed under it: a drop of the sending port's, not a mis-routed packet
        forged.epoch += 1
        cb(arg)
        assert switch.misrouted == 1 and sender.drops == 1


def test_the_switches_shared_port_by_port_are_those_with_every_neighbour_a_tier_below() -> None:
    """A two-tier multi-plane Clos's T1s, a fat tree's cores, a leaf-spine's spines (parallel links too),
    and never a switch with a host beside it."""
    from openmrc.fabric.fattree import LeafSpine
    from openmrc.fabric.topology import Role

    def top(topo: Any) -> set[int]:
        shared = shared_switches(topo)
        return set() if shared is None else {n for n, s in enumerate(shared) if s}

    clos = FabricSimConfig(hosts=32, planes=2).clos()
    assert top(clos) == {clos.t1(p, j) for p in range(clos.planes) for j in range(clos.t1_per_plane)}
    tree = FatTree.from_k(4)
    assert top(tree) == {n for n in range(tree.num_nodes()) if tree.role(n) is Role.T2} != set()
    for uplinks in (1, 2):
        spine = LeafSpine(8, 4, 2, link_bps=100 * 10**9, latency_ns=500, uplinks_per_spine=uplinks)
        assert top(spine) == {n for n in range(spine.num_nodes()) if spine.role(n) is Role.T1} != set()
    one_leaf = LeafSpine(4, 4, 1, link_bps=100 * 10**9, latency_ns=500)
    assert top(one_leaf) == {5} and one_leaf.role(4) is Role.T0  # its spine, not the leaf


def _exchanges(size: int) -> list[partition.PipeExchange]:
    from multiprocessing import Pipe

    pipes = {(a, b): Pipe() for a in range(size) for b in range(a + 1, size)}
    conns: list[dict[int, Any]] = [{} for _ in range(size)]
    for (a, b), (ca, cb) in pipes.items():
        conns[a][b], conns[b][a] = ca, cb
    return [partition.PipeExchange(r, size, conns[r]) for r in range(size)]


def _all_exchange(exs: list[partition.PipeExchange], outs: list[list[Any]]) -> list[list[Any]]:
    """Every rank's `alltoall` at once, each in a thread of its own (a rank stuck waiting fails the test)."""
    import threading

    got: list[Any] = [None] * len(exs)

    def one(r: int) -> None:
        got[r] = exs[r].alltoall(outs[r])

    threads = [threading.Thread(target=one, args=(r,), daemon=True) for r in range(len(exs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "an exchange never finished"
    return cast(list[list[Any]], got)


@pytest.mark.parametrize("size", [2, 3])
def test_the_pipe_exchange_delivers_small_and_large_messages_sent_inline_or_from_a_thread(size: int) -> None:
    """Messages under a rank's `inline_max` are sent before receiving, larger ones from a thread while
    receiving: both arrive whole, their out-of-band buffers too, window after window (the receiving
    buffers reused), whichever rank's messages are large."""
    exs = _exchanges(size)
    inline = exs[0].inline_max
    assert inline > 0 and all(ex.inline_max == inline for ex in exs)
    rng = random.Random(7)
    for big_rank in [None, *range(size), "all"]:
        outs = []
        for r in range(size):
            big = big_rank == "all" or big_rank == r
            n = 4 * inline + rng.randrange(1000) if big else rng.randrange(1, max(2, inline // 2))
            outs.append(
                [(r, d, pickle.PickleBuffer(bytearray(rng.randbytes(n))), "tail") for d in range(size)]
            )
        got = _all_exchange(exs, outs)
        for r in range(size):
            for src in range(size):
                want = outs[src][r]
                head, body, tail = got[r][src][:2], got[r][src][2], got[r][src][3]
                assert head == (src, r) and tail == "tail"
                assert bytes(body) == bytes(want[2].raw()), (big_rank, r, src)


def test_every_message_a_rank_may_post_ahead_fits_the_send_buffer_unread() -> None:
    """What sending inline rests on: the messages of `inline_max` bytes a rank may post before its peer
    reads the first (``2 * (LAG + 1)``: the peer collects a window's only before running the ``LAG +
    1``-th next) are taken by the pipe without waiting (here: a non-blocking write would fail)."""
    from multiprocessing import Pipe

    a, b = Pipe()
    ex = partition.PipeExchange(0, 2, {1: a})
    os.set_blocking(a.fileno(), False)
    msg = b"x" * (ex.inline_max - 12)
    ahead = 2 * (partition.LAG + 1)
    for _ in range(ahead):
        a.send_bytes(msg)  # (BlockingIOError if the pipe could not take it)
    assert [b.recv_bytes() for _ in range(ahead)] == [msg] * ahead


@pytest.mark.parametrize("size", [2, 3])
def test_posted_messages_are_collected_in_the_order_posted_small_and_large_alike(size: int) -> None:
    """Every rank posts several windows before any collects (as a rank running ahead does): small
    messages go at once, large ones from the sending thread, and a small one posted while the thread
    still has some to send queues behind them; each rank collects every rank's in the order posted,
    whole, its own included."""
    exs = _exchanges(size)
    inline = exs[0].inline_max
    rng = random.Random(11)
    windows = 2 * (partition.LAG + 1)
    sizes = [[rng.choice([1, inline // 8, 3 * inline]) for _ in range(windows)] for _ in range(size)]
    sizes[0][:3] = [3 * inline, 1, 1]  # (behind a large one: through the thread, in order)
    bodies = [[rng.randbytes(n) for n in row] for row in sizes]
    for r, ex in enumerate(exs):  # (one thread posts for every rank: none may wait for a reader)
        for w in range(windows):
            ex.post([(r, d, w, pickle.PickleBuffer(bytearray(bodies[r][w]))) for d in range(size)])
    for w in range(windows):
        for r, ex in enumerate(exs):
            got = ex.collect()
            for src in range(size):
                head, body = got[src][:3], got[src][3]
                assert head == (src, r, w)
                assert bytes(body) == bodies[src][w], (w, r, src)


def test_an_all_to_all_returns_once_its_large_message_is_sent_so_the_rank_may_end() -> None:
    """A rank's last exchange (its share of the results) is larger than its pipe: `alltoall` returns only
    once the sending thread has sent it whole, so the rank's process may end at once (its pipe closed
    here) and the other still reads the message whole; a thread that could not send fails `flush`."""
    import threading

    exs = _exchanges(2)
    body = random.Random(5).randbytes(6 * exs[1].inline_max)
    got: list[Any] = []
    reader = threading.Thread(target=lambda: got.append(exs[0].alltoall([None, None])), daemon=True)
    reader.start()
    assert exs[1].alltoall([body, None]) == [None, None]
    exs[1].conns[0].close()  # (the rank's process ends)
    reader.join(60)
    assert got == [[None, body]]
    exs = _exchanges(2)
    exs[0].conns[1].close()  # (the other rank has gone: a large message cannot be sent)
    exs[1].post([body, None])
    with pytest.raises(OSError):
        exs[1].flush()


@fork_only
@pytest.mark.parametrize("lag", range(partition.LAG + 1))
def test_each_lag_gives_one_result_for_every_split_and_idle_time_is_skipped(lag: int) -> None:
    """Windows of the lookahead over ``lag + 1``, ranks up to ``lag`` windows ahead: the results are those
    of 1 rank on 2 and 3, the flows' the same at every lag, and a millisecond of idle time before the
    flows start costs a window or two, not a thousand."""

    def late(part: tuple[int, int] | None) -> FabricSim:
        topo = FatTree.from_k(4)
        cfg = FabricSimConfig(routing="ecmp", evs_per_qp=8, ordered=True)
        sim = FabricSim.fat_tree(topo, cfg, part=partition.assign(topo, part))
        for i in range(16):
            sim.add_flow(i, (i + 6) % 16, 60_000, 1_000_000)
        return sim

    one = _view(partition.run_local(late, 1, 10**9, lag=lag))
    assert all(f[2] is not None for f in one["flows"])
    lookahead = partition.lookahead_ns(late(None))
    for ranks in (2, 3):
        res = partition.run_local(late, ranks, 10**9, lag=lag)
        assert _view(res) == one, ranks
        windows = res.timings[0]["windows"]
        busy = max(f[2] for f in one["flows"]) - 1_000_000  # (from the first flow's start to the last end)
        assert windows <= busy // (lookahead // (lag + 1)) + 2 * (lag + 2), windows
    other = _view(partition.run_local(late, 2, 10**9, lag=partition.LAG - lag))
    assert other["flows"] == one["flows"]


@fork_only
def test_a_lag_beyond_what_the_exchange_allows_is_refused() -> None:
    with pytest.raises(partition.PartitionError, match="lag"):
        partition.run_local(_fat_tree, 2, 10**9, lag=partition.LAG + 1)


def test_an_exchange_with_alltoall_alone_runs_a_split_with_the_same_results() -> None:
    """An `Exchange` that cannot post ahead (here: threads at a barrier) runs each window's exchange as it
    is posted: the same results as the pipes between forked ranks."""
    import threading

    one = _view(partition.run_local(_fat_tree, 1, 10**9))
    ex = _Threads(2)
    got: list[Any] = [None, None]

    def rank(r: int) -> None:
        got[r] = partition.run_split(_fat_tree((r, 2)), ex.rank(r), 10**9)

    threads = [threading.Thread(target=rank, args=(r,), daemon=True) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not any(t.is_alive() for t in threads), "a rank never finished"
    assert _view(got[0]) == one and _view(got[1]) == one


@fork_only
def test_ctrl_c_on_rank_0_stops_every_forked_rank_after_the_same_window(monkeypatch: Any) -> None:
    """A KeyboardInterrupt from rank 0's progress callback reaches the others with its window's message:
    every rank reads back what is still on its way and stops (none is left waiting, none left running)."""
    calls = []

    def progress(sim: FabricSim) -> None:
        calls.append(sim.sim.now)
        raise KeyboardInterrupt

    monkeypatch.setattr(window_loop, "PROGRESS_S", 0.0)
    with pytest.raises(KeyboardInterrupt):
        partition.run_local(_fat_tree, 2, 10**9, progress)
    assert len(calls) == partition.LAG + 2  # (on until the window after the stop was posted comes back)
    with pytest.raises(ChildProcessError):
        os.waitpid(-1, os.WNOHANG)  # every forked rank reaped
