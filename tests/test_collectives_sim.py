"""The real Communicator on simulated hosts (`SimWorld`): real data reduced on 1,024 hosts of a simulated
fabric, and its simulated time against the simulator's flow model of the same ring."""

from __future__ import annotations

import numpy as np
import pytest

from openmrc.collectives import CollectiveError
from openmrc.collectives.engine import _ADVERT, ADVERT_BYTES, MAILBOX
from openmrc.collectives.simworld import SimWorld
from openmrc.sim import workloads
from openmrc.sim.config import FabricSimConfig
from openmrc.sim.fabric_sim import FabricSim


def _fabric(hosts: int, routing: str = "ecmp") -> FabricSim:
    cfg = FabricSimConfig(planes=2, hosts=hosts, t0_radix=min(hosts, 32), t1_radix=64, routing=routing)
    return FabricSim.clos(cfg)


def test_all_reduce_on_1024_simulated_hosts_is_right() -> None:
    world = SimWorld(_fabric(1024), chunk_bytes=8192, slots=2)
    rng = np.random.default_rng(4)
    xs = [rng.integers(-3, 4, 2048).astype(np.int32) for _ in range(world.size)]
    want = np.sum(xs, axis=0, dtype=np.int32)
    ns = world.run(lambda comm, r: comm.all_reduce(xs[r], algo="rhd"))
    assert ns > 0
    for r in range(world.size):
        np.testing.assert_array_equal(xs[r], want, err_msg=f"rank {r}")
    world.close()


@pytest.mark.parametrize("routing", ["ecmp", "srv6"])
def test_ring_all_reduce_takes_the_flow_models_time(routing: str) -> None:
    """The same ring -- one Write with Immediate of size/n per step, the next released by the arrival --
    as `workloads.ring_allreduce`, but with real data, slots and credits: within 10 % of its time."""
    hosts, size = 32, 1 << 20
    world = SimWorld(_fabric(hosts, routing), chunk_bytes=size // hosts)
    xs = [np.full(size // 4, r, np.float32) for r in range(hosts)]
    ns = world.run(lambda comm, r: comm.all_reduce(xs[r], algo="ring"))
    world.close()
    assert all((x == sum(range(hosts))).all() for x in xs)
    flow = _fabric(hosts, routing)
    flows = workloads.ring_allreduce(flow, size)
    flow.run()
    model = max(f.finish for f in flows) - min(f.start for f in flows)
    assert ns == pytest.approx(model, rel=0.10), (ns, model)


@pytest.mark.parametrize("direct_bytes", [None, 1000])
def test_every_collective_on_simulated_hosts(direct_bytes: int | None) -> None:
    """The collectives that place data, through slots and (over ``direct_bytes``) direct into the
    receiver's buffer: the region a rank exposed for one takes no Write once it is over."""
    world = SimWorld(_fabric(8), chunk_bytes=4096, direct_bytes=direct_bytes)
    n = world.size
    outs = [np.zeros(n * 1000, np.float64) for _ in range(n)]
    world.run(lambda comm, r: comm.all_gather(np.full(1000, float(r)), outs[r]))
    assert all((o == np.repeat(np.arange(n, dtype=np.float64), 1000)).all() for o in outs)
    bufs = [np.arange(5000, dtype=np.int16) if r == 3 else np.zeros(5000, np.int16) for r in range(n)]
    world.run(lambda comm, r: comm.broadcast(bufs[r], root=3))
    assert all((b == np.arange(5000)).all() for b in bufs)
    sizes = [[(i * 7 + j * 3) % 5 * 200 for j in range(n)] for i in range(n)]  # (some pairs under 1000 B)
    ins = [
        np.concatenate([np.full(c, i * 100 + j, np.int32) for j, c in enumerate(sizes[i])]) for i in range(n)
    ]
    got = [np.full(sum(sizes[j][i] for j in range(n)), -1, np.int32) for i in range(n)]
    world.run(lambda comm, r: comm.alltoallv(ins[r], sizes[r], got[r], [sizes[j][r] for j in range(n)]))
    for i in range(n):
        want = np.concatenate([np.full(sizes[j][i], j * 100 + i, np.int32) for j in range(n)])
        np.testing.assert_array_equal(got[i], want)
    xs = [np.arange(4000, dtype=np.float32) * (r + 1) for r in range(n)]
    world.run(lambda comm, r: comm.all_reduce(xs[r], algo="ring"))  # (its gathering half direct)
    assert all((x == np.arange(4000, dtype=np.float32) * (n * (n + 1) // 2)).all() for x in xs)
    direct = sum(c.engine.stats["pieces_direct"] for c in world.comms)
    assert (direct > 0) == (direct_bytes is not None)
    nic, links = world.devices[0].nic, world.comms[0].engine.links
    for c in world.comms:
        link = c.engine.links.get(0)
        if link is not None and link.adverts_in:  # what rank 0 exposed to it last: gone with the collective
            entry = c.engine._mailbox() + ((link.adverts_in - 1) % MAILBOX) * ADVERT_BYTES
            addr, rkey, room, _granted = _ADVERT.unpack_from(link.slots, entry)
            pd = links[c.rank].qp.core.pd  # (the QP's own PD: its slots still take a Write, that region not)
            assert nic.mrs.remote_write(link.remote_rkey, link.remote_addr, memoryview(b"x"), pd)
            assert room > 0 and not nic.mrs.remote_write(rkey, addr, memoryview(b"x"), pd)
    with pytest.raises(ValueError, match="exactly one collective"):
        world.run(lambda comm, r: None)
    world.close()


def test_more_direct_messages_than_a_mailbox_holds() -> None:
    """A ring all_gather of 24 ranks: 23 direct messages from the left neighbour, all ready at once; the
    adverts beyond the peer's mailbox wait for its first pieces instead of overwriting unread ones."""
    world = SimWorld(_fabric(24), chunk_bytes=4096, direct_bytes=1)
    n = world.size
    assert n - 1 > MAILBOX
    outs = [np.zeros(n * 50, np.int32) for _ in range(n)]
    world.run(lambda comm, r: comm.all_gather(np.full(50, r, np.int32), outs[r]))
    assert all((o == np.repeat(np.arange(n, dtype=np.int32), 50)).all() for o in outs)
    assert all(c.engine.links[(c.rank - 1) % n].adverts_out == n - 1 for c in world.comms)
    world.close()


def test_a_stalled_simulation_is_an_error_not_a_hang() -> None:
    world = SimWorld(_fabric(4), chunk_bytes=4096)
    x = [np.zeros(10, np.float32) for _ in range(4)]
    with pytest.raises(CollectiveError, match="stalled"):  # every rank waits for a piece nobody sends
        world.run(lambda comm, r: comm.recv(x[r], (r + 1) % 4))
    world.close()


def test_a_scenario_runs_the_real_communicator_through_a_link_failure() -> None:
    """Workload kind "collective": every host a rank, real data, the simulator's own loop; a failure
    scenario runs it like any other workload and reports its time and whether every result is right."""
    from openmrc.sim.scenario import run_scenario, validate

    doc = validate(
        {
            "name": "collective",
            "until_us": 5000,
            "fabric": {"planes": 2, "hosts": 16},
            "workload": {
                "kind": "collective",
                "op": "all_reduce",
                "algo": "ring",
                "size_kib": 256,
                "chunk_kib": 8,
            },
            "failures": [{"kind": "t0_uplink", "at_us": 10, "plane": 0, "t0": 0, "uplink": 0}],
        }
    )
    (run,) = run_scenario(doc)
    rep = run.report()
    assert rep["collective"] == "all_reduce" and rep["collective_ranks"] == 16
    assert rep["collective_right"] is True and rep["collective_us"] > 10
    assert run.sim is not None and run.sim.done()


def test_immediates_a_peer_cannot_mean_are_refused() -> None:
    """Forged or impossible immediates on a live QP: more credits than slots, a piece out of order, an
    abort naming no rank -- each ends the collective with a CollectiveError naming the link, nothing else."""
    from openmrc.collectives.engine import (
        ABORT,
        ADVERT,
        CREDIT,
        DIRECT,
        DISAGREED,
        FIRST,
        KIND_SHIFT,
        PING,
        WHO,
        WHY_SHIFT,
    )
    from openmrc.verbs import WcOpcode, WcStatus, WorkCompletion

    for imm, match in (
        ((CREDIT << KIND_SHIFT) | 1, "gave back 1 slot"),  # every slot is free already
        ((CREDIT << KIND_SHIFT) | 0, "gave back 0 slot"),
        ((CREDIT << KIND_SHIFT) | 1 << 15, "1 direct credit"),  # every direct credit is back already
        (5, "piece 5 from rank 1, expected 1"),
        (DIRECT | 1, "a direct piece from rank 1 that no receive"),
        (DIRECT | FIRST | 1, "a direct message this rank never advertised"),
        ((PING << KIND_SHIFT) | ADVERT, "more adverts than its mailbox"),  # (sent MAILBOX + 1 times)
        ((ABORT << KIND_SHIFT) | WHO, "a rank failed"),
        ((ABORT << KIND_SHIFT) | DISAGREED << WHY_SHIFT | 1, "rank 1 found that the ranks are not running"),
    ):
        world = SimWorld(_fabric(2), chunk_bytes=4096)
        bufs = [(np.zeros(4, np.float32), np.zeros(4, np.float32)) for _ in range(2)]
        world.run(lambda comm, r, b=bufs: comm.sendrecv(b[r][0], 1 - r, b[r][1], 1 - r))  # (a QP each way)
        eng = world.comms[0].engine
        link = eng.links[1]
        wc = WorkCompletion(0, WcStatus.SUCCESS, WcOpcode.RECV_RDMA_WITH_IMM, 0, imm, link.qp.qp_num)
        if "mailbox" in match:
            for _ in range(MAILBOX):
                eng._received(wc)
        with pytest.raises(CollectiveError, match=match):
            eng._received(wc)
        assert eng.failed is not None
        world.close()


def test_ranks_that_disagree_get_an_error_not_garbage() -> None:
    """Rank 1 all-reduces twice as many elements as the others: a piece of the wrong size arrives, and the
    collective stops with an error saying so rather than reducing misaligned data."""
    world = SimWorld(_fabric(4), chunk_bytes=4096)
    xs = [np.ones(2000 if r == 1 else 1000, np.float32) for r in range(4)]
    with pytest.raises(CollectiveError, match="not running the same collective"):
        world.run(lambda comm, r: comm.all_reduce(xs[r], algo="ring"))
    world.close()
