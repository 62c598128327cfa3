"""`openmrc sim sweep`: a scenario's grid on a local process pool (and on a local Ray, when ray is installed),
resumable, a failing point reported while the others finish, Ctrl-C stopping the workers too."""

from __future__ import annotations

import csv
import importlib.util
import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from openmrc.cli.main import app
from openmrc.sim.scenario import load_scenario, run_scenario
from openmrc.sim.sweep import finished_records, plan, with_dimensions
from openmrc.testbed.experiment import openmrc_argv
from tests.sim_tools import lines_until
from tests.test_sim_scenarios import SMALL

runner = CliRunner()

GRID = ["--sweep", "workload.senders=[3, 5]", "--sweep", "fabric.evs_per_qp=[8, 32]"]
BASE = [a for o in [*SMALL, "workload.size_kib=32"] for a in ("--set", o)]


def sweep(out: Path, *args: str) -> tuple[int, str]:
    res = runner.invoke(
        app, ["sim", "sweep", "clos-incast", *BASE, "--out", str(out), *args], terminal_width=300
    )
    assert "Traceback" not in res.output, res.output
    return res.exit_code, res.output


def table(out: Path) -> list[dict[str, str]]:
    return list(csv.DictReader((out / "sweep.csv").open()))


def summary(out: Path) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((out / "sweep.json").read_text())
    return doc["summary"] | {"rows": doc["rows"], "dimensions": doc["dimensions"]}


def test_a_grid_runs_on_the_local_pool_with_the_same_figures_as_in_process(tmp_path: Path) -> None:
    code, text = sweep(tmp_path, *GRID, "--jobs", "2")
    assert code == 0, text
    assert "4 points: 4 run, 0 skipped" in text and "speed-up" in text
    rows = table(tmp_path)
    assert [(r["workload.senders"], r["fabric.evs_per_qp"]) for r in rows] == [
        ("3", "8"),
        ("3", "32"),
        ("5", "8"),
        ("5", "32"),
    ]
    assert all(r["status"] == "ok" and r["completed"] == r["flows"] == r["workload.senders"] for r in rows)
    # the results table printed: a row per point, its values, flows done, job time and status
    printed = [line.split() for line in text.splitlines()]
    for r in rows:
        job_us = f"{float(r['job_time_us']):,.1f}"
        row = [r["workload.senders"], r["fabric.evs_per_qp"], r["completed"], job_us]
        assert [*row, "ok"] in [[*cells[:4], cells[-1]] for cells in printed if cells], (row, text)
    s = summary(tmp_path)
    assert s["dimensions"] == ["workload.senders", "fabric.evs_per_qp"]
    assert s["ran"] == 4 and s["failed"] == [] and s["point_s"] > 0 and s["wall_s"] > 0
    # a point run in a worker gives what the same point gives run here
    doc = load_scenario(
        "clos-incast", [*SMALL, "workload.size_kib=32", "workload.senders=5", "fabric.evs_per_qp=8"]
    )
    (run,) = run_scenario(doc)
    rep = run.report()
    assert (
        float(rows[2]["max_fct_us"]) == rep["max_fct_us"]
        and int(rows[2]["retransmits"]) == rep["retransmits"]
    )
    for dim in s["dimensions"]:
        assert (tmp_path / f"sweep-{dim}.png").stat().st_size > 10_000
    point = json.loads((tmp_path / "points" / "clos-incast-senders-5-evs-per-qp-8.json").read_text())
    assert point["values"] == {"workload.senders": 5, "fabric.evs_per_qp": 8}
    assert point["report"]["label"] == "clos-incast senders=5 evs_per_qp=8"


def test_a_rerun_skips_finished_points_and_runs_changed_or_spoilt_ones(tmp_path: Path) -> None:
    assert sweep(tmp_path, *GRID)[0] == 0
    first = {r["label"]: r["max_fct_us"] for r in table(tmp_path)}

    code, text = sweep(tmp_path, *GRID)
    assert code == 0 and "4 points: 0 run, 4 skipped" in text, text
    assert {r["label"]: r["max_fct_us"] for r in table(tmp_path)} == first  # the table from the records

    points = tmp_path / "points"
    (points / "clos-incast-senders-3-evs-per-qp-8.json").unlink()
    (points / "clos-incast-senders-5-evs-per-qp-32.json").write_text('{"status": "o')  # cut short
    code, text = sweep(tmp_path, *GRID)
    assert code == 0 and "4 points: 2 run, 2 skipped" in text, text
    assert "senders=3 evs_per_qp=8 finished" in text and "senders=5 evs_per_qp=32 finished" in text
    assert "senders=3 evs_per_qp=32 finished" not in text

    # another value on one dimension: only the new points run
    code, text = sweep(tmp_path, "--sweep", "workload.senders=[3, 5]", "--sweep", "fabric.evs_per_qp=[8, 64]")
    assert code == 0 and "4 points: 2 run, 2 skipped" in text, text
    assert "evs_per_qp=64 finished" in text and "evs_per_qp=8 finished" not in text

    # a change to the document of every point (not a sweep value): every point runs again
    code, text = sweep(tmp_path, *GRID, "--set", "fabric.latency_ns=1500")
    assert code == 0 and "4 points: 4 run, 0 skipped" in text, text
    assert all(float(r["max_fct_us"]) > float(first[r["label"]]) for r in table(tmp_path))


def test_a_failing_point_is_reported_while_the_others_finish(tmp_path: Path) -> None:
    grid = ["--sweep", "workload.senders=[3, 99]", "--sweep", "fabric.evs_per_qp=[8, 32]"]
    code, text = sweep(tmp_path, *grid)
    assert code == 1, text
    assert "4 points: 4 run, 0 skipped (finished before), 2 failed" in text
    assert "failed: clos-incast senders=99 evs_per_qp=8: ScenarioError: workload: incast: 99 senders" in text
    assert [line.split()[:3] for line in text.splitlines() if line.split()[-1:] == ["failed"]] == [
        ["99", "8", "–"],
        ["99", "32", "–"],
    ], text  # a failed point's row in the table: no figures
    rows = {r["label"]: r for r in table(tmp_path)}
    assert [rows[k]["status"] for k in sorted(rows)] == ["ok", "ok", "failed", "failed"]
    assert rows["clos-incast senders=99 evs_per_qp=32"]["error"].startswith("ScenarioError: workload: incast")
    assert rows["clos-incast senders=99 evs_per_qp=32"]["max_fct_us"] == ""
    assert sorted(f["label"] for f in summary(tmp_path)["failed"]) == [
        "clos-incast senders=99 evs_per_qp=32",
        "clos-incast senders=99 evs_per_qp=8",
    ]
    rec = json.loads((tmp_path / "points" / "clos-incast-senders-99-evs-per-qp-8.json").read_text())
    assert rec["status"] == "failed" and "Traceback" in rec["traceback"]
    # a failed point is not finished: a re-run tries it again, and only it
    code, text = sweep(tmp_path, *grid)
    assert code == 1 and "4 points: 2 run, 2 skipped" in text, text


def test_bad_dimensions_and_a_missing_ray_are_one_line_errors(tmp_path: Path, monkeypatch: Any) -> None:
    for bad, says in [
        ("workload.senders", "expected key=[value, ...]"),
        ("workload.senders=3", "expected key=[value, ...]"),
        ("fabric.evs_per_qp=[8, -1]", "evs_per_qp"),
    ]:
        code, text = sweep(tmp_path, "--sweep", bad)
        assert code == 2 and says in text, (bad, text)
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray raises ImportError
    code, text = sweep(tmp_path, *GRID, "--ray", "auto")
    assert code == 2 and "error: --ray needs the ray package: pip install 'openmrc[ray]'" in text, text


def test_a_changed_point_has_another_digest() -> None:
    doc = load_scenario("clos-incast", SMALL)
    a = plan(with_dimensions(doc, ["fabric.evs_per_qp=[8, 32]"]))
    b = plan(with_dimensions(doc, ["fabric.evs_per_qp=[8, 64]"]))
    c = plan(
        with_dimensions(load_scenario("clos-incast", [*SMALL, "until_us=900"]), ["fabric.evs_per_qp=[8]"])
    )
    assert a[0].digest == b[0].digest and a[1].digest != b[1].digest and c[0].digest != a[0].digest
    assert [p.name for p in a] == ["clos-incast-evs-per-qp-8", "clos-incast-evs-per-qp-32"]


@pytest.mark.skipif(
    importlib.util.find_spec("ray") is None, reason="ray is not installed (pip install openmrc[ray])"
)
def test_the_same_grid_on_a_local_ray_cluster(tmp_path: Path) -> None:
    local, on_ray = tmp_path / "local", tmp_path / "ray"
    assert sweep(local, *GRID)[0] == 0
    code, text = sweep(on_ray, *GRID, "--ray", "auto")
    assert code == 0 and "4 points: 4 run" in text, text
    figures = ("label", "completed", "max_fct_us", "retransmits", "trims")
    assert [[r[k] for k in figures] for r in table(on_ray)] == [[r[k] for k in figures] for r in table(local)]


# one short point, then one long enough (256 MiB per sender, for up to 10 s simulated) to be interrupted
SLOW = ["--sweep", "workload.size_kib=[32, 262144]", "--jobs", "1"]
LONG = "until_us=10000000"


def test_ctrl_c_stops_the_sweep_and_its_workers_and_keeps_finished_points(tmp_path: Path) -> None:
    args = ["sim", "sweep", "clos-incast", *BASE, "--set", LONG, *SLOW, "--out", str(tmp_path)]
    proc = subprocess.Popen(
        [*openmrc_argv(), *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    lines = lines_until(proc, "[1/2]")
    assert lines and "size_kib=32 finished" in lines[-1], "".join(lines)
    time.sleep(1)  # inside the long point, in its worker
    t0 = time.monotonic()
    proc.send_signal(signal.SIGINT)
    rest, _ = proc.communicate(timeout=60)
    text = "".join(lines) + rest
    assert proc.returncode == 130, text
    assert time.monotonic() - t0 < 20  # the long point's worker was stopped, not waited for
    assert "Traceback" not in text and "fatal" not in text
    assert "interrupted: 1 of 2 points finished" in text
    doc = load_scenario("clos-incast", [*SMALL, "workload.size_kib=32", LONG])
    points = plan(with_dimensions(doc, SLOW[1:2]))
    assert list(finished_records(tmp_path, points)) == ["clos-incast-size-kib-32"]
