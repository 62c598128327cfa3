"""Scenario files, overrides, failures and the `openmrc sim` command."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any, get_args

import pytest
from typer.testing import CliRunner

from openmrc.cli.main import app
from openmrc.cli.sim import results_table
from openmrc.fabric.clos import MultiPlaneClos
from openmrc.sim.config import FabricSimConfig
from openmrc.sim.fabric_sim import FabricSim
from openmrc.sim.metrics import SimResults
from openmrc.sim.results_files import aggregate, name_nodes
from openmrc.sim.scenario import (
    ScenarioError,
    _config,
    builtin_scenarios,
    expand_runs,
    load_scenario,
    run_scenario,
)
from openmrc.sim.scenario_failures import FAILURES, Failure, FailureKeys
from openmrc.sim.scenario_schema import SECTIONS, Fabric, markdown
from openmrc.sim.scenario_workloads import WORKLOADS, Workload, WorkloadKeys

SMALL = [
    "fabric.hosts=16",
    "fabric.planes=2",
    "fabric.t0_radix=8",
    "fabric.t1_radix=8",
    "workload.size_kib=64",
]


def run1(doc: dict[str, object]) -> tuple[FabricSim, SimResults]:
    (r,) = run_scenario(doc)
    assert r.sim is not None and r.results is not None
    return r.sim, r.results


def test_builtins_load() -> None:
    names = builtin_scenarios()
    named = {"htsim-perm-1024", "htsim-incast-15", "paper-allreduce-loss", "paper-incast-victim"}
    named.add("link-failure")
    assert named | {"demo", "clos-perm", "clos-incast"} <= set(names)
    for name in names:
        doc = load_scenario(name)
        assert doc["fabric"]["link_gbps"] == 100


def test_overrides_and_errors(tmp_path: Path) -> None:
    doc = load_scenario("clos-perm", ["fabric.hosts=16", 'workload.kind="incast"', "workload.senders=3"])
    assert doc["fabric"]["hosts"] == 16 and doc["workload"]["kind"] == "incast"
    assert doc["workload"]["senders"] == 3
    with pytest.raises(ScenarioError, match=r"fabric\.bogus"):
        load_scenario("clos-perm", ["fabric.bogus=1"])
    with pytest.raises(ScenarioError, match=r"workload\.kind"):
        load_scenario("clos-perm", ['workload.kind="alltoall2"'])
    with pytest.raises(ScenarioError, match="no scenario"):
        load_scenario("nope")
    with pytest.raises(ScenarioError, match="key=value"):
        load_scenario("clos-perm", ["fabric.hosts"])
    bad = tmp_path / "bad.toml"
    bad.write_text('[fabric]\nplanes = 2\n[[failures]]\nkind = "meteor"\nat_us = 1\n')
    with pytest.raises(ScenarioError, match=r"failures\.0\.kind"):
        load_scenario(bad)
    with pytest.raises(ScenarioError, match="fabric"):
        run1(load_scenario("clos-perm", ["fabric.hosts=100000"]))


def test_incast_runs_and_completes() -> None:
    sim, res = run1(load_scenario("clos-incast", [*SMALL, "workload.senders=3"]))
    s = res.summary()
    assert s["flows"] == s["completed"] == 3
    assert {f.dst for f in sim.flows} == {0}


def test_failures_are_ridden_out() -> None:
    over = [*SMALL, "workload.size_kib=512"]
    doc = load_scenario("link-failure", over)
    del doc["variants"]
    doc["failures"] = [
        {"kind": "t0_uplink", "at_us": 5, "plane": 1, "t0": 0, "uplink": 0, "up_at_us": 40},
        {"kind": "nic_port", "at_us": 6, "host": 3, "port": 2},
    ]
    sim, res = run1(doc)
    s = res.summary()
    assert s["completed"] == s["flows"]
    assert all(f.status is not None and f.status.name == "SUCCESS" for f in sim.flows)
    assert s["drops"] > 0
    nic = sim.nodes[3].nic  # type: ignore[attr-defined]
    assert not nic.ports_up[2]
    # host 3's peers got its port status update (routed by ECMP) and stopped using plane 2 towards it
    peers = {f.src for f in sim.flows if f.dst == 3} | {f.dst for f in sim.flows if f.src == 3}
    for h in peers:
        mask = sim.nodes[h].nic.peer_ports.get(3)  # type: ignore[attr-defined]
        assert mask is not None and not mask & 0b10 and mask & 0b01


def test_cli_run_writes_results(tmp_path: Path) -> None:
    args = ["sim", "run", "clos-perm", "--out", str(tmp_path)]
    for o in SMALL:
        args += ["--set", o]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    data = json.loads((tmp_path / "results.json").read_text())
    (run,) = data["runs"]
    assert run["completed"] == run["flows"] > 0
    rows = list(csv.DictReader((tmp_path / "flows.csv").open()))
    assert len(rows) == run["flows"] and all(r["status"] == "SUCCESS" for r in rows)
    for png in ("timeline.png", "fct_cdf.png"):
        assert (tmp_path / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    series = list(csv.DictReader((tmp_path / "series.csv").open()))
    assert int(series[-1]["delivered_bytes"]) == sum(int(r["size_bytes"]) for r in rows)
    listing = CliRunner().invoke(app, ["sim", "scenarios"])
    assert "link-failure" in listing.output
    bad = CliRunner().invoke(app, ["sim", "run", "clos-perm", "--set", "fabric.nope=1"])
    assert bad.exit_code != 0 and "fabric.nope" in bad.output
    unsampled = tmp_path / "unsampled"
    res = CliRunner().invoke(app, [*args[:3], "--out", str(unsampled), *args[5:], "--set", "sample_us=0"])
    assert res.exit_code == 0, res.output
    assert (unsampled / "fct_cdf.png").exists() and not (unsampled / "timeline.png").exists()  # no empty plot


SMALL_CLOS = ["fabric.hosts=16", "fabric.planes=2", "fabric.t0_radix=8", "fabric.t1_radix=8"]
SHRUNK = {
    "htsim-perm-1024": ["fabric.k=4", 'workload.file="perm_16n_16c_2MB.cm"'],
    "htsim-incast-15": [],
    "paper-allreduce-loss": [*SMALL_CLOS, "workload.size_kib=64"],
    "paper-incast-victim": [*SMALL_CLOS, "workload.size_kib=128", "workload.senders=3"],
    "link-failure": [*SMALL_CLOS, "workload.size_kib=512", "failures.0.plane=1"],
    "demo": [*SMALL_CLOS, "workload.size_kib=64", "failures.0.at_us=10"],
    "clos-perm": SMALL,
    "clos-incast": [*SMALL, "workload.senders=3"],
    "paper-latency": [*SMALL_CLOS, "workload.messages=3"],
    "paper-message-size": [*SMALL_CLOS, "fabric.evs_per_qp=8", "workload.total_kib=1024"],
    "paper-qp-scaling": [*SMALL_CLOS, "fabric.evs_per_qp=8", "workload.size_kib=64"],
    "allreduce-hier-1k": [*SMALL_CLOS, "fabric.t1_radix=16", "fabric.hosts=64", "workload.size_kib=64"],
    "allreduce-131k": [*SMALL_CLOS, "fabric.t1_radix=16", "fabric.hosts=64", "workload.size_kib=64"],
}


@pytest.mark.parametrize("name", sorted(SHRUNK))
def test_every_builtin_runs_every_variant_to_completion(name: str) -> None:
    """Each built-in scenario, shrunk: every variant (and sweep point) finishes every flow."""
    assert set(SHRUNK) == set(builtin_scenarios())
    doc = load_scenario(name, SHRUNK[name])
    doc["sweep"] = {k: v[-1:] for k, v in doc.get("sweep", {}).items()}  # the harshest point only
    runs = run_scenario(doc)
    assert len(runs) == max(1, len(doc.get("variants", [])))
    for r in runs:
        assert r.results is not None
        s = r.results.summary()
        assert s["completed"] == s["flows"] > 0, (r.label, s)
        assert all(f.status is not None and f.status.name == "SUCCESS" for f in r.results.flows)


def test_the_table_shows_a_victim_and_pfc_pauses_only_when_a_run_has_them() -> None:
    doc = load_scenario("paper-incast-victim", SHRUNK["paper-incast-victim"])
    runs = run_scenario(doc)
    heads = [str(c.header) for c in results_table(runs, "t").columns]
    assert heads[-1] == "victim\n×alone"
    heads = [str(c.header) for c in results_table(runs, "t", wide=True).columns]
    assert heads[-4:] == ["victim\nµs", "victim\n×alone", "PFC\npauses", "wall\ns"]
    lossless = [r for r in runs if r.results is not None and "pfc_pauses" in r.results.report()]
    assert [r.label for r in lossless] == ["RoCEv2 + DCQCN + PFC"]
    plain = run_scenario(load_scenario("clos-perm", SMALL))
    heads = [str(c.header) for c in results_table(plain, "t").columns]
    assert not any("PFC" in h or "victim" in h for h in heads)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("fabric.hosts=abc", "fabric.hosts: expected an integer, got 'abc'"),
        ("fabric.buffer_bytes=-1", "fabric.buffer_bytes: must be ≥ 1, got -1"),
        ("until_us=-5", "until_us: must be > 0, got -5"),
        ("fabric.evs_per_qp=0", "fabric.evs_per_qp: must be ≥ 1, got 0"),
        ("fabric.evs_per_qp=100000", "fabric.evs_per_qp: must be ≤ 65535, got 100000"),
        ("fabrik.hosts=1", "fabrik: unknown key (known: name, description,"),
        ("fabric.link_bps=100", "fabric.link_bps: unknown key: use link_gbps (Gb/s), got 100"),
        ("fabric.trimming=1", "fabric.trimming: expected true or false, got 1"),
        ('workload.kind="cm"', "workload: kind 'cm' needs file"),
        ("fabric.ecn=[0.9, 0.1]", "fabric.ecn: need 0 ≤ low ≤ high ≤ 1"),
        ("failures.0.probability=2", "failures.0.probability: must be ≤ 1, got 2"),
        (
            'variants.1.set=["fabric.planes=0"]',
            "variant 'RoCEv2 1 QP all-reduce probability=0.0': fabric.planes: must be ≥ 1, got 0",
        ),
    ],
)
def test_a_broken_key_is_named_with_its_value_and_rule(override: str, message: str) -> None:
    scenario = "paper-allreduce-loss" if override.startswith(("failures", "variants")) else "clos-perm"
    with pytest.raises(ScenarioError) as exc:
        load_scenario(scenario, [override])
    assert any(p.startswith(message) for p in exc.value.problems), exc.value.problems


def test_every_problem_of_a_file_is_reported_and_an_empty_file_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('[fabric]\nhosts = "x"\nplanes = 0\n[fabrik]\n[[failures]]\nkind = "link"\n')
    with pytest.raises(ScenarioError) as exc:
        load_scenario(bad)
    keys = sorted(p.split(":")[0] for p in exc.value.problems)
    assert keys == ["fabric.hosts", "fabric.planes", "fabrik", "failures.0"], exc.value.problems
    assert "kind 'link' needs at_us" in str(exc.value)
    empty = tmp_path / "empty.toml"
    empty.write_text("# nothing\n")
    with pytest.raises(ScenarioError, match="empty"):
        load_scenario(empty)


def test_the_schema_fabric_is_the_simulators_config() -> None:
    """Every fabric key but the topology's is a FabricSimConfig field under the same name (link_gbps is
    link_bps in Gb/s), and their defaults agree."""
    cfg = FabricSimConfig()
    for key, info in Fabric.model_fields.items():
        if key in ("topology", "k", "topo_file"):
            continue
        name, scale = ("link_bps", 1e9) if key == "link_gbps" else (key, 1)
        assert hasattr(cfg, name), key
        assert info.default is None or info.default * scale == getattr(cfg, name), key
    assert _config(load_scenario("clos-perm", ["fabric.link_gbps=25"]))[0].link_bps == 25_000_000_000


def test_the_scenario_reference_is_current() -> None:
    committed = (Path(__file__).parents[1] / "docs" / "scenarios.md").read_text()
    assert committed == markdown(), "regenerate: openmrc sim schema --markdown > docs/scenarios.md"
    for _heading, model, _h in SECTIONS:
        for key in model.model_fields:
            assert f"`{key}`" in committed or f"[{key}]" in committed, key


@pytest.mark.parametrize("name", sorted(builtin_scenarios()))
def test_sim_show_round_trips_through_the_loader(name: str, tmp_path: Path) -> None:
    res = CliRunner().invoke(app, ["sim", "show", name])
    assert res.exit_code == 0, res.output
    copy = tmp_path / f"{name}.toml"
    copy.write_text(res.output)
    ours, theirs = load_scenario(copy), load_scenario(name)
    assert {k: v for k, v in ours.items() if k != "_dir"} == {k: v for k, v in theirs.items() if k != "_dir"}
    assert theirs["expected_wall_s"] is not None, "measure the scenario once and store expected_wall_s"


def test_a_run_stopped_at_until_us_says_how_many_flows_are_unfinished() -> None:
    (r,) = run_scenario(load_scenario("clos-perm", [*SMALL, "until_us=8"]))
    rep = r.report()
    assert 0 < rep["completed"] < rep["flows"] or rep["completed"] == 0
    left = rep["flows"] - rep["completed"]
    assert rep["unfinished"] == left > 0
    assert rep["status"] == f"{left} of {rep['flows']} flows unfinished at {rep['sim_time_us']:,.1f} µs"
    assert rep["sim_time_us"] <= 8
    if "median_fct_us" in rep:
        assert rep["fct_over"] == f"the {rep['completed']} finished flows of {rep['flows']}"
    (whole,) = run_scenario(load_scenario("clos-perm", SMALL))
    assert whole.report()["status"] == f"all {whole.report()['flows']} flows finished"


def test_the_victim_is_measured_against_the_same_flow_alone() -> None:
    doc = load_scenario("paper-incast-victim", SHRUNK["paper-incast-victim"])
    runs = run_scenario(doc, variants=["MRC"])
    (r,) = runs
    rep = r.report()
    assert r.results is not None
    (victim,) = [f for f in r.results.flows if f.tag == "victim"]
    assert victim.fct_ns is not None and rep["victim_max_fct_us"] == victim.fct_ns / 1000
    alone = rep["victim_alone_fct_us"]
    assert 0 < alone <= rep["victim_max_fct_us"]
    assert rep["victim_slowdown"] == pytest.approx(rep["victim_max_fct_us"] / alone)


def test_seeds_and_variants_select_runs_and_unknown_variants_are_named() -> None:
    doc = load_scenario("link-failure", SHRUNK["link-failure"])
    runs = expand_runs(doc, seeds=[4, 5], variants=["mrc, nic port"])
    assert [(r.label, r.seed, r.doc["fabric"]["seed"]) for r in runs] == [
        ("MRC, NIC port seed=4", 4, 4),
        ("MRC, NIC port seed=5", 5, 5),
    ]
    with pytest.raises(ScenarioError, match=r"--variant 'nope': no such variant .*'MRC, T0-T1 link'"):
        expand_runs(doc, variants=["nope"])


def test_seed_summaries_are_the_mean_and_spread_of_the_runs() -> None:
    reports = [
        {"label": "a seed=1", "seed": 1, "max_fct_us": 10.0, "status": "x"},
        {"label": "a seed=2", "seed": 2, "max_fct_us": 14.0, "status": "y"},
        {"label": "b", "seed": 1, "max_fct_us": 3.0},
    ]
    agg = aggregate(reports)
    assert agg["a"]["max_fct_us"] == {
        "mean": 12.0,
        "std": pytest.approx(2**0.5 * 2),
        "min": 10.0,
        "max": 14.0,
        "n": 2,
    }
    assert "status" not in agg["a"] and "seed" not in agg["a"]
    assert agg["b"]["max_fct_us"]["std"] == 0.0


def test_node_ids_in_messages_get_the_names_topo_plan_uses() -> None:
    topo = MultiPlaneClos(2, 16, 8, 8, 100 * 10**9, 1000)
    node = topo.t0(1, 2)
    assert name_nodes(f"link {node}:5 down", topo) == f"link p1-t0-2:5 (node {node}) down"
    assert name_nodes(f"switch {node} down", topo) == f"switch p1-t0-2 (node {node}) down"
    assert name_nodes("host 3 NIC port 1 down", topo) == "host 3 NIC port 1 down"


def _kinds_of(doc: dict[str, Any]) -> tuple[set[str], set[str]]:
    """The workload and failure kinds every run of a scenario uses (its variants' overrides applied)."""
    runs = expand_runs(doc)
    return {r.doc["workload"]["kind"] for r in runs}, {f["kind"] for r in runs for f in r.doc["failures"]}


_CLOS = FabricSimConfig(hosts=16, planes=2, t0_radix=8, t1_radix=8).clos()
FAILURE_EXAMPLES: dict[str, dict[str, Any]] = {
    "t0_uplink": {"at_us": 5, "plane": 1, "t0": 0, "uplink": 0, "up_at_us": 40},
    "link": {"at_us": 5, "node": _CLOS.t0(0, 0), "port": _CLOS.hosts_per_t0},
    "switch": {"at_us": 5, "plane": 0, "tier": "t1", "index": 0},
    "nic_port": {"at_us": 6, "host": 3, "port": 2},
    "flap": {"at_us": 5, "plane": 1, "t0": 0, "uplink": 0, "down_us": 5, "period_us": 10, "count": 2},
    "degrade": {"at_us": 5, "node": _CLOS.t0(0, 0), "port": _CLOS.hosts_per_t0, "fraction": 0.5},
    "loss": {"plane": 0, "probability": 0.01},
}
"""One entry of each failure kind, for the 16-host Clos of ``SMALL``."""
WORKLOADS_RUN_ELSEWHERE = {"collective": "test_collectives_sim.py"}
"""Workload kinds no shipped scenario uses, and the test that runs a scenario of that kind."""


def test_every_kind_has_its_keys_a_builder_and_a_scenario() -> None:
    assert set(get_args(WorkloadKeys.model_fields["kind"].annotation)) == set(WORKLOADS)
    assert set(get_args(FailureKeys.model_fields["kind"].annotation)) == set(FAILURES)
    for wk in WORKLOADS.values():
        assert issubclass(Workload, wk.keys) and callable(wk.add)
    for fk in FAILURES.values():
        assert issubclass(Failure, fk.keys) and callable(fk.apply) and callable(fk.needs)
    workloads: set[str] = set()
    failures: set[str] = set()
    for name in builtin_scenarios():
        w, f = _kinds_of(load_scenario(name))
        workloads |= w
        failures |= f
    for kind in set(WORKLOADS) - workloads:
        test = Path(__file__).parent / WORKLOADS_RUN_ELSEWHERE[kind]
        assert f'"kind": "{kind}"' in test.read_text(), kind
    assert set(FAILURE_EXAMPLES) == set(FAILURES)  # each run below


@pytest.mark.parametrize("kind", sorted(FAILURE_EXAMPLES))
def test_a_scenario_of_each_failure_kind_runs_it(kind: str) -> None:
    doc = load_scenario("clos-perm", SMALL)
    doc["failures"] = [{"kind": kind, **FAILURE_EXAMPLES[kind]}]
    _sim, res = run1(doc)
    assert res.failures, kind
    s = res.summary()
    assert s["completed"] == s["flows"], (kind, s)


def test_a_hierarchical_allreduce_reports_its_nvlink_phases_at_nvlink_gbps() -> None:
    """The intra-server phases are computed at workload.nvlink_gbps, beside the simulated network time."""
    over = [*SHRUNK["allreduce-hier-1k"], "workload.nvlink_gbps=1800"]
    (r,) = run_scenario(load_scenario("allreduce-hier-1k", over), variants=["MRC"])
    size = 64 << 10  # bytes per GPU; 8 GPUs per server each send 2·7/8 of them at 1,800 Gb/s (whole ns)
    assert r.report()["allreduce_nvlink_us"] == 2 * size * 7 * 8_000_000_000 // (8 * 1_800_000_000_000) / 1000
    (plain,) = run_scenario(load_scenario("clos-perm", SMALL))
    assert "allreduce_nvlink_us" not in plain.report()
