"""The simulator: event ordering, the one-event-per-hop port model, and seeded whole-fabric runs."""

from __future__ import annotations

import dataclasses
import gc
import heapq
import json
import random
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from openmrc.sim.config import FabricSimConfig
from openmrc.sim.engine import WHEEL_NS, Simulator
from openmrc.sim.fabric_sim import FabricSim
from openmrc.sim.flows import Flow
from openmrc.sim.metrics import LinkStat
from openmrc.sim.network import HEADER_BYTES, Node, Port, PortCold, sim_packet
from openmrc.sim.workloads import permutation
from openmrc.transport import QpAttr, QpSecurity, SackTransmit, SecurityDomain, Transmit, TrimMark
from openmrc.transport.types import QpCapFlags, WcStatus
from openmrc.wire import BTH, METH, RETH, SETH, CcState, Opcode, Packet

GOLDEN = Path(__file__).parent / "golden"


def test_events_run_in_time_priority_then_fifo_order() -> None:
    sim = Simulator()
    seen: list[str] = []
    sim.schedule(10, seen.append, "c")
    sim.schedule(5, seen.append, "b2", priority=1)
    sim.schedule(5, seen.append, "a")
    sim.schedule(5, seen.append, "b")
    assert sim.run() == 4
    assert seen == ["a", "b", "b2", "c"] and sim.now == 10
    with pytest.raises(ValueError):
        sim.schedule(9, seen.append, "late")
    sim.schedule(20, seen.append, "x")
    sim.schedule(30, seen.append, "y")
    sim.run(until=25)
    assert seen[-1] == "x" and sim.now == 25


def test_push_orders_with_schedule_and_priorities_are_bounded() -> None:
    sim = Simulator()
    seen: list[str] = []
    sim.push(5, seen.append, "pushed")  # priority 0, so before a priority-1 event at the same time
    sim.schedule(5, seen.append, "late", priority=1)
    sim.schedule(5, seen.append, "fifo")
    sim.push(3, seen.append, "first")
    assert sim.peek() == 3
    sim.run()
    assert seen == ["first", "pushed", "fifo", "late"]
    for bad in (-1, 16):
        with pytest.raises(ValueError, match="priority"):
            sim.schedule(6, seen.append, "x", priority=bad)


@pytest.mark.parametrize("enabled", [True, False])
def test_run_pauses_the_cyclic_collector_and_restores_it(enabled: bool) -> None:
    sim = Simulator()
    during: list[bool] = []
    sim.schedule(1, lambda _: during.append(gc.isenabled()))
    was = gc.isenabled()
    (gc.enable if enabled else gc.disable)()
    try:
        sim.run()
        assert during == [False] and gc.isenabled() is enabled and gc.get_freeze_count() == 0
    finally:
        (gc.enable if was else gc.disable)()


def test_bulk_flow_set_up_pauses_the_collector_and_an_error_restores_it() -> None:
    """Workloads add their flows with the collector paused (nothing frozen is left behind), and a set-up
    that fails half-way leaves the collector as it found it."""
    from openmrc.sim import workloads

    sim = FabricSim.clos(FabricSimConfig(planes=2, hosts=8, t0_radix=4, t1_radix=4, seed=1))
    runs: list[int] = []

    def seen(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            runs.append(info["generation"])

    was, thresholds = gc.isenabled(), gc.get_threshold()
    gc.enable()
    gc.set_threshold(5)  # a collection every few allocations, were the collector running
    gc.callbacks.append(seen)
    try:
        for s in range(1, 8):  # the same flows one by one: the collector runs many times
            sim.add_flow(0, s, 4096)
        one_by_one = len(runs)
        runs.clear()
        workloads.all_to_all(sim, 4096)  # 56 flows in bulk: only what happens before the pause
        assert one_by_one >= 20 and len(runs) <= 2
        with pytest.raises(ValueError):
            workloads.ring_allreduce(sim, 4096, ranks=[0, 1, 999])  # the second flow's host does not exist
        assert gc.isenabled() and gc.get_freeze_count() == 0
        [object() for _ in range(100)]
        assert runs  # and it runs again
    finally:
        gc.callbacks.remove(seen)
        gc.set_threshold(*thresholds)
        (gc.enable if was else gc.disable)()


class _Reference:
    """The order the engine promises, kept the obvious way: a heap of (time, priority, sequence)."""

    def __init__(self) -> None:
        self.now = 0
        self.heap: list[tuple[int, int, int, Any]] = []
        self.seq = 0

    def schedule(self, at: int, callback: Any, arg: Any = None, priority: int = 0) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (at, priority, self.seq, (callback, arg)))

    def peek(self) -> int | None:
        return self.heap[0][0] if self.heap else None

    def run(self, until: int) -> None:
        while self.heap and self.heap[0][0] <= until:
            at, _, _, (cb, arg) = heapq.heappop(self.heap)
            self.now = at
            cb(arg)
        self.now = max(self.now, until)


# small delays, and delays around the wheel's reach so that events scheduled far and near meet at one time
_delay = st.one_of(
    st.integers(0, 3),
    st.integers(0, 400),
    st.sampled_from([WHEEL_NS - 2, WHEEL_NS - 1, WHEEL_NS, WHEEL_NS + 1, 2 * WHEEL_NS]),
)
_child = st.tuples(_delay, st.sampled_from([0, 0, 0, 1, 2]))


@settings(max_examples=150, deadline=None)
@given(
    start=st.lists(st.tuples(_delay, st.sampled_from([0, 0, 1])), min_size=1, max_size=20),
    children=st.lists(st.lists(_child, max_size=3), max_size=60),
    stops=st.lists(st.integers(0, 4 * WHEEL_NS), max_size=4),
)
def test_the_wheel_runs_events_in_key_order(
    start: list[tuple[int, int]], children: list[list[tuple[int, int]]], stops: list[int]
) -> None:
    """Near and far events, priorities, events scheduled at now from callbacks, runs cut by ``until``:
    the wheel runs them in exactly (time, priority, sequence) order, as a plain heap does."""

    def drive(sim: Any) -> list[tuple[int, int]]:
        seen: list[tuple[int, int]] = []
        made = [0]

        def fire(label: int) -> None:
            seen.append((sim.now, label))
            for delay, prio in children[label] if label < len(children) else []:
                made[0] += 1
                sim.schedule(sim.now + delay, fire, made[0], priority=prio)

        for delay, prio in start:
            made[0] += 1
            sim.schedule(delay, fire, made[0], priority=prio)
        for until in [*sorted(stops), 1 << 40]:
            sim.run(until=until)
            nxt = sim.peek()
            assert nxt is None or nxt > until >= sim.now
        return seen

    got = drive(Simulator())
    assert got == drive(_Reference())


def test_the_wheel_jumps_idle_time_and_halts_mid_slot() -> None:
    sim = Simulator()
    seen: list[object] = []

    def halt(x: object) -> None:
        seen.append(x)
        sim.halted = True

    sim.schedule(10 * WHEEL_NS, seen.append, "far")
    sim.schedule(7, seen.append, "a")
    sim.schedule(7, halt, "stop")
    sim.schedule(7, seen.append, "b")
    assert sim.peek() == 7
    assert sim.run() == 2 and seen == ["a", "stop"] and sim.now == 7
    assert sim.peek() == 7  # "b" is still due at 7
    assert sim.run() == 2 and seen == ["a", "stop", "b", "far"] and sim.now == 10 * WHEEL_NS
    assert sim.peek() is None and sim.in_wheel == 0


class Sink(Node):
    def __init__(self, sim: Simulator) -> None:
        super().__init__(0)
        self.sim = sim
        self.got: list[tuple[int, Transmit]] = []

    def arrive(self, p: Transmit) -> None:
        self.got.append((self.sim.now, p))


def data(n: int = 4096) -> Transmit:
    pkt = Packet(BTH(Opcode.WRITE_MIDDLE), meth=METH(), reth=RETH(0, 1, 1 << 20), payload=bytes(n))
    return sim_packet(pkt, n + HEADER_BYTES, 0, 0, 1, 1, 0)


def control() -> Transmit:
    return sim_packet(Packet(BTH(Opcode.SACK), seth=SETH(), cc_state=CcState()), HEADER_BYTES, 0, 1, 0, 1, 0)


def port(sim: Simulator, sink: Sink, **kw: object) -> Port:
    args: dict[str, object] = {
        "buffer": 3 * 4160,
        "ecn": (4160, 2 * 4160),
        "trimming": True,
        "last_hop": False,
        "rng": random.Random(1),
    }
    args.update(kw)
    return Port(sim, sink, 100_000_000_000, 1_000, **args)  # type: ignore[arg-type]


def test_serialisation_and_propagation() -> None:
    sim = Simulator()
    sink = Sink(sim)
    p = port(sim, sink)
    for _ in range(2):
        p.send(data(), 0)
    sim.run()
    ser = 4160 * 8 * 1_000_000_000 // 100_000_000_000  # 332 ns at 100 Gb/s
    assert [t for t, _ in sink.got] == [ser + 1_000, 2 * ser + 1_000]


def test_ports_built_alike_share_what_they_seldom_change_until_one_changes_it() -> None:
    """A fabric's ports share one `PortCold` per kind; a port that changes its rate, goes down or gets
    other thresholds changes only itself, and the others still send as a port built alone."""
    sim = Simulator()
    sink = Sink(sim)
    shared: dict[tuple[int, ...], PortCold] = {}
    rng = random.Random(1)
    a, b = port(sim, sink, shared=shared, rng=rng), port(sim, sink, shared=shared, rng=rng)
    c = port(sim, sink, shared=shared, rng=rng, buffer=5 * 4160)
    assert a._cold is b._cold and c._cold is not a._cold and (c.buffer, b.buffer) == (5 * 4160, 3 * 4160)
    a.set_rate(50_000_000_000)
    a.set_up(False)
    a.set_up(True)
    a.ecn_high = 3 * 4160
    assert (a.bps, a.nominal_bps, a.pace_ns, a.epoch, a.ecn_high) == (50 * 10**9, 10**11, 665, 1, 3 * 4160)
    assert (b.bps, b.nominal_bps, b.pace_ns, b.epoch, b.ecn_high) == (10**11, 10**11, 332, 0, 2 * 4160)
    alone = port(sim, sink)
    for p in (b, alone, a):
        p.send(data(), 0)
    sim.run()
    ser = 4160 * 8 * 1_000_000_000 // 100_000_000_000
    assert [t for t, _ in sink.got] == [ser + 1_000, ser + 1_000, a.pace_ns + 1_000]  # a: 50 Gb/s


@given(bps=st.integers(1, 10**13), n=st.integers(0, 10**7))
def test_serialisation_time_is_the_floor_of_bytes_at_the_rate(bps: int, n: int) -> None:
    sim = Simulator()
    p = port(sim, Sink(sim))
    p.set_rate(bps)
    assert n * p.byte_num // p.byte_den == n * 8_000_000_000 // bps  # what a packet of n bytes takes
    assert n * p.byte_den // p.byte_num == n * bps // 8_000_000_000  # bytes queued n ns ahead


def test_mrc_data_packets_cross_the_fabric_as_the_senders_transmit() -> None:
    """No `Packet` is built for an MRC data packet or SACK in flight (the receiving NIC takes its fields),
    yet a tap still sees it as one, with the fields the sender emitted."""
    sim = FabricSim.clos(FabricSimConfig(planes=2, hosts=8, t0_radix=8, t1_radix=8, seed=1))
    seen: list[tuple[bool, bool, int]] = []
    sacks: list[bool] = []

    def tap(_host: object, p: Transmit, outgoing: bool) -> None:
        if outgoing and p.is_data:
            built = p.tpl is not None and not p.has_packet()
            seen.append((built, p.tpl is not None, p.packet.bth.psn))
        elif not outgoing and not p.is_data:
            sacks.append(isinstance(p, SackTransmit) and not p.has_packet())

    for n in range(8):
        sim.nodes[n].tap = tap  # type: ignore[union-attr]
    sim.add_flow(0, 5, 64 << 10)
    res = sim.run(until=10**9)
    assert res.summary()["completed"] == 1
    assert seen and all(built and tx for built, tx, _psn in seen)
    assert sorted({psn for *_, psn in seen}) == list(range(len({psn for *_, psn in seen})))
    assert sacks and all(sacks)


def test_ecn_trim_and_priority() -> None:
    sim = Simulator()
    sink = Sink(sim)
    p = port(sim, sink)
    pkts = [data() for _ in range(6)]
    for pk in pkts:
        p.send(pk, 0)
    ctrl = control()
    p.send(ctrl, 0)
    sim.run()
    # queue before each: 0, 1, 2 packets... buffer holds 3 packets, the rest are trimmed to headers
    assert [pk.trim for pk in pkts] == [TrimMark.NONE] * 3 + [TrimMark.TRIMMED] * 3
    assert all(pk.wire_size == HEADER_BYTES for pk in pkts[3:])
    assert pkts[2].ecn and not pkts[0].ecn  # marked once the queue passed ecn_low
    order = [pk for _, pk in sink.got]
    assert order.index(ctrl) < order.index(pkts[1])  # control and trimmed headers overtake queued data
    assert (p.trims, p.drops) == (3, 0)


def test_last_hop_trims_are_marked_and_drop_tail_without_trimming() -> None:
    sim = Simulator()
    sink = Sink(sim)
    lh = port(sim, sink, last_hop=True)
    pkts = [data() for _ in range(5)]
    for pk in pkts:
        lh.send(pk, 0)
    assert pkts[-1].trim is TrimMark.TRIMMED_LASTHOP and not any(pk.ecn for pk in pkts)  # no ECN on last hop
    dt = port(sim, sink, trimming=False)
    for _ in range(5):
        dt.send(data(), 0)
    assert dt.drops == 2
    dt.up = False
    dt.send(control(), 0)
    assert dt.drops == 3


def run_small(seed: int = 1) -> dict[str, object]:
    sim = FabricSim.clos(FabricSimConfig(planes=4, hosts=32, seed=seed))
    permutation(sim, 256 << 10, seed=1)
    res = sim.run(until=10**9)
    out = res.summary()
    out["fcts_us"] = res.fcts_us()
    return out


def test_permutation_completes_and_is_deterministic() -> None:
    a, b = run_small(1), run_small(1)
    assert a == b
    assert a["completed"] == a["flows"] == 32  # every host sends once
    # 256 KiB over 4×100G planes: at least 5.2 µs of serialisation plus a base RTT
    assert 5.2 < float(a["median_fct_us"]) < 60  # type: ignore[arg-type]


def test_golden_permutation() -> None:
    """Fixed seed → fixed result; a change here must be explained (and the golden file regenerated)."""
    got = run_small(1)
    path = GOLDEN / "clos_perm_32.json"
    want = json.loads(path.read_text())
    assert got == want


def test_link_failure_is_ridden_out() -> None:
    sim = FabricSim.clos(FabricSimConfig(planes=4, hosts=32, seed=3))
    permutation(sim, 1 << 20, seed=3)
    t0 = sim.topo.t0(1, 0)
    uplink = sim.nodes[t0].ports[sim.topo.hosts_per_t0]  # T0 0 of plane 1 -> T1 0
    sim.sim.schedule(5_000, lambda _: setattr(uplink, "up", False))
    res = sim.run(until=10**9)
    summary = res.summary()
    assert summary["completed"] == summary["flows"] == len(sim.flows)
    assert all(f.status is not None and f.status.name == "SUCCESS" for f in sim.flows)
    assert uplink.drops > 0 and res.counters["retransmits"] > 0


def test_validation_mode_encodes_every_packet_and_changes_nothing() -> None:
    """With validate_wire every packet goes through openmrc.wire's encoder and parser; the run is the same."""
    runs = []
    for validate in (False, True):
        cfg = FabricSimConfig(planes=2, hosts=16, t0_radix=8, t1_radix=8, seed=2, validate_wire=validate)
        sim = FabricSim.clos(cfg)
        permutation(sim, 64 << 10, seed=2)
        res = sim.run(until=10**9)
        runs.append((res.fcts_us(), res.summary()))
    assert runs[0] == runs[1] and runs[0][1]["completed"] == 16


# -- dataclasses with a written-out __init__ -------------------------------------------------------------
_WRITTEN_OUT: list[tuple[type, dict[str, Any]]] = [
    # each class, and a value for every field (most unlike its default)
    (
        LinkStat,
        dict(
            node=1,
            port=2,
            peer=3,
            bps=4,
            sent_bytes=5,
            utilisation=0.5,
            drops=6,
            losses=7,
            trims=8,
            ecn_marks=9,
            pauses=10,
            paused_us=1.5,
        ),
    ),
    (
        QpAttr,
        dict(
            qp_hint="h",
            ev_profile_id=1,
            cc_profile_id=2,
            dest_qp_num=3,
            peer="p",
            rq_psn=4,
            mpr_dest=5,
            max_wimm_dest=6,
            cap=QpCapFlags.DYNAMIC_MPR,
            sq_psn=7,
            mpr=8,
            max_wimm=9,
            timeout=10,
            retry_linear=3,
            retry_exp=11,
            security=QpSecurity(SecurityDomain(1, bytes(32))),
        ),
    ),
    (
        Flow,
        dict(
            src=1,
            dst=2,
            size=3,
            start=4,
            id=5,
            tag="t",
            imm=True,
            trigger=None,
            send_done=None,
            recv_done=None,
            qp=None,
            finish=6,
            recv_finish=7,
            status=WcStatus.SUCCESS,
        ),
    ),
]


@pytest.mark.parametrize(("cls", "values"), _WRITTEN_OUT, ids=lambda x: getattr(x, "__name__", ""))
def test_a_written_out_init_takes_what_the_dataclass_declares(cls: type, values: dict[str, Any]) -> None:
    """Some dataclasses made by the million write their ``__init__`` out (compiled, it is several times as
    fast as the generated one): it must take exactly the declared fields, in order, with their defaults."""
    declared = dataclasses.fields(cls)
    assert [f.name for f in declared] == list(values)
    whole = cls(**values)
    assert all(getattr(whole, k) == v for k, v in values.items())
    kw_only = all(f.kw_only for f in declared)
    if not kw_only:
        assert (
            cls(*values.values()) == whole if cls is not Flow else repr(cls(*values.values())) == repr(whole)
        )
    required = {f.name: values[f.name] for f in declared if f.default is dataclasses.MISSING}
    least = cls(**required)
    for f in declared:
        assert getattr(least, f.name) == (values[f.name] if f.name in required else f.default), f.name
    with pytest.raises(TypeError):
        cls(**values, not_a_field=1)
