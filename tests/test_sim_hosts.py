"""A simulated host's public API (`FabricSim.host`): an application registers memory, connects QPs and posts
work on simulated hosts as on real NICs, beside the simulation's own flows; RoCEv2 hosts have no NIC."""

from __future__ import annotations

import pytest

from openmrc.sim.config import FabricSimConfig
from openmrc.sim.fabric_sim import FabricSim
from openmrc.sim.hosts import MrcHost, RoceV2Host
from openmrc.transport import QpState, RecvWR, SendWR, Sge, Transmit, WcOpcode, WcStatus, WrOpcode


@pytest.mark.parametrize("routing", ["srv6", "ecmp"])
def test_an_application_writes_between_simulated_hosts_beside_the_flows(routing: str) -> None:
    sim = FabricSim.clos(FabricSimConfig(planes=2, hosts=9, t0_radix=8, t1_radix=8, routing=routing))
    a, b = sim.host(1), sim.host(8)  # host 8 is alone under the last T0 of each plane
    qa, qb = a.create_qp(), b.create_qp()
    a.connect(qa, 8, qb.qp_num)
    b.connect(qb, 1, qa.qp_num)
    assert qa.state is QpState.RTS and a.qps[qa.qp_num] is qa and b.qps[qb.qp_num] is qb
    size = 50_000
    src, dst = bytearray(bytes(range(256)) * (size // 256 + 1))[:size], bytearray(size)
    mra, mrb = a.register(src), b.register(dst)
    flow = sim.add_flow(2, 7, 100_000)  # the simulation's own traffic alongside
    b.post_recv(qb, RecvWR(7))
    a.post_send(
        qa, SendWR(9, WrOpcode.RDMA_WRITE_WITH_IMM, [Sge(mra.addr, size, mra.lkey)], mrb.addr, mrb.rkey, 5)
    )
    sent, got = [], []
    while not (sent and got) and sim.sim.peek() is not None:
        sim.sim.run(until=sim.sim.now + 1_000)
        sent += a.poll(qa.send_cq)
        got += b.poll(qb.recv_cq)
    assert [(w.wr_id, w.status) for w in sent] == [(9, WcStatus.SUCCESS)]
    assert [(w.wr_id, w.opcode, w.imm_data) for w in got] == [(7, WcOpcode.RECV_RDMA_WITH_IMM, 5)]
    assert dst == src
    res = sim.run(until=10_000_000)
    assert flow.status is WcStatus.SUCCESS and res.summary()["completed"] == 1
    assert a.nic.stats.tx_data >= size // 4096


def test_flow_packets_share_a_zero_payload_and_an_applications_packets_carry_its_bytes() -> None:
    """The flows' buffer holds only zeros, so their packets in flight share one zero view per length
    (no view each); a Write from an application's own memory still carries, and delivers, its bytes."""
    sim = FabricSim.clos(FabricSimConfig(planes=2, hosts=9, t0_radix=8, t1_radix=8))
    a, b = sim.host(1), sim.host(8)
    qa, qb = a.create_qp(), b.create_qp()
    a.connect(qa, 8, qb.qp_num)
    b.connect(qb, 1, qa.qp_num)
    size = 20_000
    src, dst = bytearray(b"\x5a" * size), bytearray(size)
    mra, mrb = a.register(src), b.register(dst)
    flow = sim.add_flow(1, 8, 100_000)
    payloads: list[memoryview] = []

    def tap(_host: object, p: Transmit, sent: bool) -> None:
        if sent and p.tpl is not None:
            payloads.append(p.payload)

    a.node.tap = tap
    a.post_send(qa, SendWR(9, WrOpcode.RDMA_WRITE, [Sge(mra.addr, size, mra.lkey)], mrb.addr, mrb.rkey))
    sent = []
    while not (sent and flow.finish is not None) and sim.sim.peek() is not None:
        sim.sim.run(until=sim.sim.now + 1_000)
        sent += a.poll(qa.send_cq)
    assert [(w.wr_id, w.status) for w in sent] == [(9, WcStatus.SUCCESS)] and dst == src
    assert flow.status is WcStatus.SUCCESS
    own = [v for v in payloads if v.obj is src]
    flows = [v for v in payloads if v.obj is not src]
    assert sum(len(v) for v in own) >= size
    assert sum(len(v) for v in flows) >= 100_000 and not any(any(v) for v in flows)
    assert len({id(v) for v in flows}) == len({len(v) for v in flows})  # one shared view per length


def test_only_mrc_hosts_open_their_nic() -> None:
    sim = FabricSim.clos(
        FabricSimConfig(planes=1, hosts=4, t0_radix=4, t1_radix=4, routing="ecmp", transport="roce")
    )
    assert all(isinstance(h, RoceV2Host) for h in sim.hosts)
    with pytest.raises(ValueError, match="not an MRC host"):
        sim.host(0)
    mrc = FabricSim.clos(FabricSimConfig(planes=1, hosts=4, t0_radix=4, t1_radix=4))
    assert isinstance(mrc.host(3), MrcHost)
    with pytest.raises(ValueError, match=r"0\.\.3"):
        mrc.host(4)


@pytest.mark.parametrize("peer", [-1, 9, 1, True, "2"])
def test_connect_refuses_a_peer_that_is_not_another_host(peer: object) -> None:
    sim = FabricSim.clos(FabricSimConfig(planes=2, hosts=9, t0_radix=8, t1_radix=8))
    a = sim.host(1)
    qp = a.create_qp()
    with pytest.raises(ValueError, match="not another host"):
        a.connect(qp, peer, 5)  # type: ignore[arg-type]
    assert qp.state is QpState.RESET  # nothing half done


@pytest.mark.parametrize("host", [-1, 9, True, 1.0])
def test_host_refuses_what_is_not_a_host_id(host: object) -> None:
    sim = FabricSim.clos(FabricSimConfig(planes=2, hosts=9, t0_radix=8, t1_radix=8))
    with pytest.raises(ValueError, match="not an MRC host"):
        sim.host(host)  # type: ignore[arg-type]
