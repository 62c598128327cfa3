"""Every multi-plane Clos shape the simulator's config accepts builds and carries traffic (the last T0 of a
plane may be partly filled); every shape it rejects, `openmrc topo plan` rejects with the same rule."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from openmrc.cli.main import app
from openmrc.fabric.clos import MultiPlaneClos
from openmrc.sim.config import FabricSimConfig
from openmrc.sim.fabric_sim import FabricSim
from openmrc.transport import WcStatus

SHAPES = st.fixed_dictionaries(
    {
        "planes": st.integers(1, 3),
        "hosts": st.integers(1, 48),
        "t0_radix": st.integers(1, 10),
        "t1_radix": st.integers(1, 8),
    }
)
STACKS = st.sampled_from(
    [{"routing": "srv6"}, {"routing": "ecmp"}, {"routing": "ecmp", "transport": "roce", "roce_qps": 2}]
)


def _plan(shape: dict[str, int]) -> tuple[int, str]:
    args = ["topo", "plan"]
    for key, value in shape.items():
        args += [f"--{key.replace('_', '-')}", str(value)]
    res = CliRunner().invoke(app, args)
    return res.exit_code, " ".join(res.output.replace("│", " ").split())


def _flows(hosts: int) -> list[tuple[int, int]]:
    """Both directions between the first and the last host (under the last, possibly partial, T0), and one
    from host 1 to the middle."""
    pairs = [(0, hosts - 1), (hosts - 1, 0), (1 % hosts, hosts // 2)]
    return [(s, d) for s, d in dict.fromkeys(pairs) if s != d]


@settings(max_examples=60, deadline=None)
@given(shape=SHAPES, stack=STACKS)
def test_a_shape_the_config_accepts_runs_and_topo_plan_agrees(
    shape: dict[str, int], stack: dict[str, object]
) -> None:
    cfg = FabricSimConfig(**shape, mtu=1024, **stack)  # type: ignore[arg-type]
    try:
        cfg.clos()
    except ValueError as exc:
        code, out = _plan(shape)
        assert code != 0 and " ".join(str(exc).split()) in out
        with pytest.raises(ValueError, match=re.escape(str(exc))):
            FabricSim.clos(cfg)
        return
    assert _plan(shape)[0] == 0
    sim = FabricSim.clos(cfg)
    flows = [sim.add_flow(s, d, 3000) for s, d in _flows(shape["hosts"])]
    res = sim.run(until=10_000_000)
    assert all(f.finish is not None and f.status is WcStatus.SUCCESS for f in flows), res.summary()


def test_a_partly_filled_t0_keeps_its_port_numbers() -> None:
    """33 hosts on T0s of 8 host ports: T0 4 of each plane has one host on port 0 and its uplinks on ports
    8..15, as `topo plan` numbers them; failures and link statistics name the wired ports only."""
    sim = FabricSim.clos(FabricSimConfig(planes=2, hosts=33, t0_radix=16, t1_radix=16))
    topo = sim.topo
    assert isinstance(topo, MultiPlaneClos)
    t0 = topo.t0(0, 4)
    assert [r.port for r in topo.ports(t0)] == [0, *range(8, 16)]
    fwd, back = sim.faults.link(t0, 8)
    assert fwd.peer is sim.nodes[topo.t1(0, 0)] and back.peer is sim.nodes[t0]
    with pytest.raises(ValueError, match="no port 3"):
        sim.faults.link(t0, 3)
    sim.faults.fail_switch(t0, at=0)
    assert len(sim.faults.outages[0][2]) == 2 * 9
    assert len(sim.faults.plane_ports(0)) == 2 * topo.num_links() // topo.planes
    sim.faults.fail_link(topo.t0(1, 4), 9, at=0, up_at=50_000)  # plane 1: T0 4's uplink to T1 1
    assert sim.faults.failures[-2][1] == "plane 1: T0 4 ↔ T1 1 link (p1-t0-4 ↔ p1-t1-1) down"
    f = sim.add_flow(32, 0, 100_000)
    g = sim.add_flow(0, 32, 100_000)
    sim.add_flow(1, 2, 100_000)  # under T0 0: touched by neither failure
    sim.sample_every(2_000)
    res = sim.run(until=10_000_000)
    assert f.status is WcStatus.SUCCESS and g.status is WcStatus.SUCCESS
    assert [len(o.pairs) for o in res.outages] == [2, 2]  # both directions of 0 <-> 32, each failure
    assert {(s.node, s.port) for s in res.links} == {
        (n, r.port) for n in range(topo.num_nodes()) for r in topo.ports(n)
    }
