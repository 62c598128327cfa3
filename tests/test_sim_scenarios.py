"""Scenario files, overrides, failures and the `openmrc sim` command."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from openmrc.cli.main import app
from openmrc.cli.sim import results_table
from openmrc.sim.clos_sim import FabricSim
from openmrc.sim.metrics import SimResults
from openmrc.sim.scenario import ScenarioError, builtin_scenarios, load_scenario, run_scenario

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
