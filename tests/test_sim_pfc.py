"""Priority flow control: lossless ports (PAUSE/RESUME with ingress accounting) and lossless fabrics."""

from __future__ import annotations

import random

import pytest

from openmrc.sim.config import FabricSimConfig
from openmrc.sim.engine import Simulator
from openmrc.sim.fabric_sim import FabricSim
from openmrc.sim.network import HEADER_BYTES, PAUSED, Node, Port, sim_packet
from openmrc.transport import Transmit
from openmrc.wire import BTH, METH, RETH, Opcode, Packet

PKT = 4096 + HEADER_BYTES
LAT = 1_000


class Sink(Node):
    def __init__(self, sim: Simulator) -> None:
        super().__init__(0)
        self.sim = sim
        self.got: list[tuple[int, int]] = []  # (time, sequence number)

    def arrive(self, p: Transmit) -> None:
        self.got.append((self.sim.now, p.src))


class Relay(Node):
    """A one-port switch: forwards every arrival on its port 0."""

    def __init__(self, sim: Simulator) -> None:
        super().__init__(1)
        self.sim = sim

    def arrive(self, p: Transmit) -> None:
        self.ports[0].send(p, self.sim.now)


def data(seq: int) -> Transmit:
    pkt = Packet(BTH(Opcode.WRITE_MIDDLE), meth=METH(), reth=RETH(0, 1, 1 << 20), payload=bytes(4096))
    return sim_packet(pkt, PKT, 0, seq, 9, 1, 0)


def chain(pfc: bool, buffer: int = 1 << 30) -> tuple[Simulator, Port, Port, Sink]:
    """A 100 Gb/s port into a relay whose port drains at 10 Gb/s into a sink."""
    sim = Simulator()
    sink, relay = Sink(sim), Relay(sim)
    rng = random.Random(1)
    kw = {"ecn": None, "trimming": False, "last_hop": False, "rng": rng}
    first = Port(sim, relay, 100_000_000_000, LAT, buffer=1 << 62, **kw)  # type: ignore[arg-type]
    slow = Port(sim, sink, 10_000_000_000, LAT, buffer=buffer, **kw)  # type: ignore[arg-type]
    relay.ports.append(slow)
    if pfc:
        first.enable_pfc(xoff=3 * PKT, xon=PKT)
        slow.enable_pfc(xoff=3 * PKT, xon=PKT)
    return sim, first, slow, sink


def test_a_pause_stops_the_upstream_port_and_nothing_is_lost() -> None:
    sim, first, slow, sink = chain(pfc=True)
    for i in range(40):
        first.send(data(i), 0)
    sim.run()
    assert [seq for _, seq in sink.got] == list(range(40))  # every packet, in order
    assert first.drops == slow.drops == 0
    assert first.pfc is not None and slow.pfc is not None
    assert first.pauses >= 1 and first.pfc.paused_ns > 0 and not first.pfc.paused
    # what the relay holds is bounded by xoff plus what was already on its way when the PAUSE took effect:
    # one propagation delay back, one forward, and a packet on the wire at each end
    headroom = 2 * LAT * 100_000_000_000 // 8_000_000_000 + 2 * PKT
    assert slow.pfc.max_queued <= 3 * PKT + headroom
    assert first.pfc.rx_bytes == 0 and not first.pfc.pause_sent  # the relay's ingress charge is all released
    # the slow port set the pace: the last packet left it 40 packet times (at 10 Gb/s) after the first
    assert sink.got[-1][0] - sink.got[0][0] == 39 * PKT * 8 // 10


def test_without_pfc_the_same_burst_overflows_a_small_buffer() -> None:
    sim, first, slow, sink = chain(pfc=False, buffer=6 * PKT)
    for i in range(40):
        first.send(data(i), 0)
    sim.run()
    assert slow.drops > 0 and len(sink.got) == 40 - slow.drops


def test_a_pause_takes_effect_one_propagation_delay_later_and_lets_the_current_packet_finish() -> None:
    sim, first, _slow, _sink = chain(pfc=True)
    pfc = first.pfc
    assert pfc is not None
    for i in range(40):
        first.send(data(i), 0)
    sent: list[int] = []
    paused_at: list[int] = []

    def watch(_: object) -> None:
        sent.append(first.sent_packets)
        if pfc.paused and not paused_at:
            paused_at.append(sim.now)
        if sim.now < 60_000:
            sim.schedule(sim.now + 10, watch)

    sim.schedule(0, watch)
    sim.run(until=60_000)
    assert paused_at
    at = paused_at[0]
    # the relay passes xoff while receiving: the PAUSE is sent then and arrives LAT later
    assert at >= LAT
    # while paused, the port finishes at most the packet it was serialising, then sends nothing
    during = [n for t, n in zip(range(0, 60_000, 10), sent, strict=False) if at + 400 <= t < at + 2_000]
    assert during and max(during) - min(during) <= 1
    # a paused port with data waiting tells its NIC not to hand it more
    if pfc.paused and pfc.queue:
        assert first.free_at == PAUSED


def test_thresholds_are_checked() -> None:
    _sim, first, _slow, _sink = chain(pfc=False)
    with pytest.raises(ValueError, match="xon"):
        first.enable_pfc(xoff=PKT, xon=PKT)
    with pytest.raises(ValueError, match="pfc_xon"):
        FabricSim.clos(FabricSimConfig(pfc=True, pfc_xon=0.5, pfc_xoff=0.25))


def roce_incast(pfc: bool, seed: int = 1) -> FabricSim:
    cfg = FabricSimConfig(
        planes=2, hosts=32, transport="roce", routing="ecmp", trimming=False, pfc=pfc, seed=seed
    )
    sim = FabricSim.clos(cfg)
    for s in range(16, 24):
        sim.add_flow(s, 0, 1 << 19, 0, tag="incast")
    return sim


def test_a_lossless_fabric_carries_an_incast_without_a_drop_or_a_retransmission() -> None:
    lossy = roce_incast(pfc=False).run(until=10**8)
    sim = roce_incast(pfc=True)
    res = sim.run(until=10**8)
    assert lossy.counters["drops"] > 0 and lossy.counters["retransmits"] > 0
    c = res.counters
    assert res.summary()["completed"] == 8
    assert c["drops"] == 0 and c["retransmits"] == 0 and c["pfc_pauses"] > 0 and c["pfc_paused_ns"] > 0
    # the last flow ends near the ideal 8 × 512 KiB at 100 Gb/s: PAUSEs hold senders back, nothing is resent
    ideal_us = 8 * (1 << 19) * 8 / 100e3
    assert max(res.fcts_us()) < 1.2 * ideal_us < max(lossy.fcts_us())
    stats = [link for link in res.links if link.pauses]
    assert stats and all(link.paused_us > 0 for link in stats)
    assert roce_incast(pfc=True).run(until=10**8).fcts_us() == res.fcts_us()  # seeded: the same run again


def test_a_link_failure_in_a_lossless_fabric_releases_what_it_held() -> None:
    """Packets queued at a port whose link dies are lost and their ingress charge released, so no port stays
    paused for ever; go-back-N recovers them over the re-converged paths."""
    sim = roce_incast(pfc=True)
    hosts = sim.topo.num_hosts
    # the switch-to-switch direction that holds the most when the link fails (found at that moment)
    inner = [(n, i, p) for n, node in enumerate(sim.nodes[hosts:], hosts) for i, p in enumerate(node.ports)]
    inner = [(n, i, p) for n, i, p in inner if p.peer.id >= hosts]
    failed: list[tuple[Port, int]] = []

    def fail(_: object) -> None:
        n, i, port = max(inner, key=lambda x: x[2].pfc.queued_bytes if x[2].pfc is not None else 0)
        assert port.pfc is not None
        failed.append((port, port.pfc.queued_bytes))
        sim.faults.fail_link(n, i, sim.sim.now)

    sim.sim.schedule(20_000, fail)
    res = sim.run(until=10**8)
    ((port, held),) = failed
    assert held > 0 and port.drops > 0
    assert res.summary()["completed"] == 8 and res.counters["retransmits"] > 0
    pfcs = [p.pfc for node in sim.nodes for p in node.ports]
    assert all(q is not None and not (q.paused or q.pause_sent or q.rx_bytes) for q in pfcs)


def test_mrc_runs_on_a_lossless_fabric_too() -> None:
    sim = FabricSim.clos(FabricSimConfig(planes=2, hosts=32, pfc=True))
    for s in range(16, 24):
        sim.add_flow(s, 0, 1 << 19, 0)
    res = sim.run(until=10**8)
    assert res.summary()["completed"] == 8
    assert res.counters["drops"] == 0 and res.counters["trims"] == 0
