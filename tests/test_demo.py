"""What a failure costs: the recovery time of the connections through a failed element (the same
definition for MRC and RoCEv2), RoCEv2 over every plane, and `openmrc demo`'s comparison."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from openmrc.cli.main import app
from openmrc.sim.config import FabricSimConfig
from openmrc.sim.fabric_sim import FabricSim
from openmrc.sim.metrics import RECOVER_WINDOW_SAMPLES, recover_ns, recovery
from openmrc.sim.plots import line_rate_bps
from openmrc.sim.routing import EcmpRouting
from openmrc.sim.scenario import load_scenario, run_scenario
from openmrc.sim.workloads import permutation

SMALL_CLOS = ["fabric.hosts=16", "fabric.planes=2", "fabric.t0_radix=8", "fabric.t1_radix=8"]
# a whole T1 of plane 0 fails: some RoCEv2 QP is surely hashed through it
T1_FAILS = ['failures=[{kind = "switch", at_us = 20, plane = 0, tier = "t1", index = 0}]']


def _series(rates: list[list[int]], step: int = 1_000) -> tuple[list[int], list[tuple[int, ...]]]:
    """Cumulative byte counters from per-interval byte counts (one list per sample, one entry per pair)."""
    times, cum, acc = [], [], [0] * len(rates[0])
    for k, row in enumerate(rates):
        acc = [a + b for a, b in zip(acc, row, strict=True)]
        times.append(k * step)
        cum.append(tuple(acc))
    return times, cum


def test_a_connection_that_stalls_recovers_when_it_is_back_at_speed_not_when_it_stops_sending() -> None:
    w = RECOVER_WINDOW_SAMPLES
    # pair 0 keeps its rate; pair 1 stalls from 10 to 30 µs and then comes back at full speed; pair 2
    # comes back at half speed and never finishes; pair 3 was idle before the failure
    rows = [[100, 100, 100, 0] for _ in range(11)]  # the intervals that end by the failure at 10 µs
    rows += [[100, 0, 0, 0] for _ in range(20)]
    rows += [[100, 100, 50, 0] for _ in range(20)]
    times, cum = _series(rows)
    at = 10_000
    assert recover_ns(at, times, cum, [0], [False] * 4) == 0
    assert recover_ns(at, times, cum, [0, 1], [False] * 4) == 30_000 - at  # its first full window
    assert recover_ns(at, times, cum, [0, 1, 3], [False] * 4) == 30_000 - at  # idle: not affected
    assert recover_ns(at, times, cum, [1, 2], [False] * 4) is None
    # a stalled pair whose flows all finished once its counter stopped: recovered when it finished
    rows = [[100] for _ in range(11)] + [[0] for _ in range(5)] + [[100] for _ in range(3)] + [[0]] * 10
    times, cum = _series(rows)
    assert recover_ns(at, times, cum, [0], [True]) == 18_000 - at  # its last bytes arrive by 18 µs
    assert recover_ns(at, times, cum, [0], [False]) is None
    assert recover_ns(at, times[: w - 1], cum[: w - 1], [0], [True]) is None  # no window before the failure


def test_the_goodput_a_connection_must_get_back_to_is_its_mean_before_the_failure() -> None:
    at = 10_000
    # pair 0 stalled (a go-back-N QP after a drop) in the 5 intervals before the failure, and stays so until
    # 26 µs: it counts, against its mean since it began (40 bytes an interval); pair 1 was done before the
    # failure: not affected; pair 2 began at 4 µs, at 50 bytes an interval, and drops to 40 after: below
    # 90 % until it finishes
    rows = [[100, 100, 0] for _ in range(5)] + [[0, 100 if k < 3 else 0, 0] for k in range(6)]
    for k in range(11):
        rows[k][2] = 50 if k >= 5 else 0
    rows += [[0, 0, 40] for _ in range(15)] + [[100, 0, 40] for _ in range(10)] + [[0, 0, 0]] * 6
    times, cum = _series(rows)
    # the first window of 5 with 90 % of 40 bytes an interval: from 22 µs (2 intervals of 100 in it)
    assert recovery(at, times, cum, [0], [False] * 3) == (22_000 - at, False)
    assert recovery(at, times, cum, [1], [True] * 3) == (0, False)
    assert recovery(at, times, cum, [2], [False, False, True]) == (35_000 - at, True)  # its last bytes
    assert recovery(at, times, cum, [0, 1, 2], [False, True, True]) == (35_000 - at, True)
    assert recover_ns(at, times, cum, [2], [False] * 3) is None  # never back, never done


@pytest.fixture(scope="module")
def t1_failure_runs() -> dict[str, dict[str, object]]:
    doc = load_scenario("demo", [*SMALL_CLOS, "workload.size_kib=1024", *T1_FAILS])
    return {r.label: r.results.report() for r in run_scenario(doc) if r.results is not None}


def test_a_roce_go_back_n_stall_does_not_read_as_a_fast_bypass(t1_failure_runs: dict[str, dict]) -> None:
    (o,) = t1_failure_runs["RoCEv2 + ECMP"]["outages"]
    assert o["affected"] > 0
    # its QPs hashed through the dead switch are back only after ECMP re-converges (100 µs) and go-back-N
    # resends, however early they stopped sending into it
    assert o["bypass_us"] is None or o["bypass_us"] > 100


def test_mrc_bypasses_the_same_failure_before_ecmp_could_reconverge(t1_failure_runs: dict[str, dict]) -> None:
    rep = t1_failure_runs["MRC"]
    (o,) = rep["outages"]
    assert o["affected"] > 0
    assert o["bypass_us"] is not None and o["bypass_us"] < 100
    assert rep["completed"] == rep["flows"]


def test_roce_qps_spread_over_the_planes_use_every_plane() -> None:
    cfg = dict(hosts=16, planes=2, t0_radix=8, t1_radix=8, transport="roce", routing="ecmp", trimming=False)
    used = []
    for planes in (1, 2):
        sim = FabricSim.clos(FabricSimConfig(**cfg, roce_qps=2, roce_planes=planes))  # type: ignore[arg-type]
        flows = permutation(sim, 256 << 10, seed=2)
        res = sim.run(until=10_000_000)
        assert all(f.finish is not None for f in flows)
        hosts = {f.src for f in flows}
        used.append({link.port for link in res.links if link.node in hosts and link.sent_bytes})
        # twice the NIC ports carry the same bytes in about half the time
        if planes == 2:
            assert res.job_time_ns() is not None and line_rate_bps(res) == 2 * 100_000_000_000 * len(hosts)
    assert used == [{0}, {0, 1}]
    with pytest.raises(ValueError, match="roce_planes"):
        FabricSim.clos(FabricSimConfig(**cfg, roce_planes=3))  # type: ignore[arg-type]
    sim = FabricSim.clos(FabricSimConfig(**cfg, roce_qps=4, roce_planes=0))  # type: ignore[arg-type]
    (f,) = [sim.add_flow(0, 9, 64 << 10)]
    assert [q.port for q in sim.hosts[f.src].carriers(f.dst, [f])] == [0, 1, 0, 1]  # 0: every plane in turn


def test_the_demo_prints_what_the_failure_costs_each_transport(tmp_path: Path) -> None:
    args = ["demo", "--out", str(tmp_path)]
    for s in [*SMALL_CLOS, "workload.size_kib=1024", "failures.0.at_us=10"]:
        args += ["--set", s]
    res = CliRunner().invoke(app, args, terminal_width=200)
    assert res.exit_code == 0, res.output
    assert "plane 0: T0 0 ↔ T1 0 link (p0-t0-0 ↔ p0-t1-0) down at 10 µs" in res.output
    # the goodput before and after the failure beside the same windows of the run without it
    rates = [line for line in res.output.splitlines() if line.startswith("    all flows ")]
    assert rates and all(" µs (without the failure " in line for line in rates), res.output
    assert "the whole job's goodput" not in res.output  # (the note for runs without that comparison)
    cost = next(line for line in res.output.splitlines() if line.startswith("The failure costs"))
    assert "MRC +" in cost or "MRC -" in cost
    assert "RoCEv2 + ECMP" in cost and "job time" in cost
    data = json.loads((tmp_path / "results.json").read_text())
    labels = [r["label"] for r in data["runs"]]
    assert labels == ["MRC", "RoCEv2 + ECMP", "MRC, no failure", "RoCEv2 + ECMP, no failure"]
    assert [bool(r.get("outages")) for r in data["runs"]] == [True, True, False, False]
    for png in ("timeline.png", "fct_cdf.png"):
        assert (tmp_path / png).stat().st_size > 10_000


def test_the_roce_qps_a_failed_link_touches_are_those_hashed_through_it() -> None:
    """With ECMP never reconverging, exactly the QPs counted as affected (hashed through the dead link, data
    or ACK way) never finish; MRC counts its one connection per host pair with a path through it."""
    roce = dict(transport="roce", routing="ecmp", trimming=False, roce_qps=2, roce_planes=0)
    for kw in (roce, {}):
        sim = FabricSim.clos(
            FabricSimConfig(hosts=16, planes=2, t0_radix=8, t1_radix=8, ecmp_reconverge_ns=10**12, **kw)  # type: ignore[arg-type]
        )
        flows = permutation(sim, 128 << 10, seed=2)
        sim.faults.fail_link(*sim.faults.t0_uplink(0, 0, 0), 5_000)
        sim.sample_every(1_000)
        res = sim.run(until=3_000_000)
        (o,) = res.outages
        if kw:
            # 2 QPs per flow, on planes 0 and 1; only plane-0 QPs hashed onto uplink 0 (or back over it)
            assert o.connections == 2 * o.host_pairs and 0 < len(o.pairs) < o.host_pairs
            assert isinstance(sim.routing, EcmpRouting)
            dead = set(sim.faults.outages[0][2])
            qps = [(f, q) for f in flows for q in sim.hosts[f.src].carriers(f.dst, [f])]
            through = [(f, q) for f, q in qps if sim.routing.crosses(q.routes(), dead)]
            assert len(through) == len(o.pairs) and all(q.port == 0 for _f, q in through)
            assert {f.id for f, _q in through} == {f.id for f in flows if f.finish is None}
        else:
            assert len(o.pairs) == o.connections == o.host_pairs > 0
            assert all(f.finish is not None for f in flows)  # MRC routes around it


class _Run:
    """What `_failure_cost` reads of a run's results: its job time and its outages."""

    def __init__(self, job_ns: int, bypass_us: float | None = 3.0) -> None:
        self.job_ns, self.bypass_us = job_ns, bypass_us

    def job_time_ns(self) -> int:
        return self.job_ns

    def outage_reports(self) -> list[dict[str, object]]:
        return [{"bypass_us": self.bypass_us, "bypass_ended": False}]


def test_a_failure_that_costs_no_job_time_says_it_is_the_runs_own_variation() -> None:
    from openmrc.cli.main import _failure_cost

    slower = _failure_cost("MRC", _Run(110_000), _Run(100_000))  # type: ignore[arg-type]
    assert slower == "MRC +10.0 % job time (recovered in 3.0 µs)"
    faster = _failure_cost("RoCEv2", _Run(98_500, 197.0), _Run(100_000))  # type: ignore[arg-type]
    assert faster.startswith("RoCEv2 -1.5 % job time (recovered in 197.0 µs; no slower than without it")
    assert "the run's own variation" in faster
