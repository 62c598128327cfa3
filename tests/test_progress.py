"""Progress of scenario runs: phases, bytes delivered of the workload's total, and a clock that agrees with
the results table."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from openmrc.cli.progress import PHASES, RunProgress
from openmrc.sim import scenario
from openmrc.sim.fabric_sim import FabricSim
from openmrc.sim.scenario import Run, iter_runs, load_scenario

SMALL = [
    "fabric.hosts=16",
    "fabric.planes=2",
    "fabric.t0_radix=8",
    "fabric.t1_radix=8",
    "workload.size_kib=2048",
]


def _doc() -> dict[str, object]:
    doc = load_scenario("clos-perm", SMALL)
    doc["sample_us"] = 1
    return doc


def test_runs_go_through_build_set_up_run_and_report_bytes_delivered() -> None:
    seen: list[tuple[str, str]] = []
    delivered: list[tuple[int, int]] = []

    def phase(run: Run, name: str) -> None:
        seen.append((run.label, name))

    def progress(run: Run, sim: FabricSim) -> None:
        seen.append((run.label, "run"))
        delivered.append((sim.delivered_bytes(), sum(f.size for f in sim.flows)))

    (r,) = iter_runs(_doc(), progress, phase=phase)
    assert seen[:3] == [(r.label, "build"), (r.label, "set-up"), (r.label, "run")]
    assert {name for _label, name in seen} == set(PHASES)
    got = [d for d, _total in delivered]
    assert got == sorted(got) and got[-1] == delivered[-1][1] > 0  # grows to every byte of the workload


def test_how_often_progress_is_reported_does_not_change_the_results(monkeypatch: pytest.MonkeyPatch) -> None:
    (ref,) = iter_runs(_doc())
    assert ref.results is not None
    counts = []
    for every_s in (0.0, 1e9):  # steps shrink to the smallest, or grow
        calls: list[int] = []
        monkeypatch.setattr(scenario, "PROGRESS_S", every_s)
        (r,) = iter_runs(_doc(), lambda run, sim, calls=calls: calls.append(sim.sim.now))
        assert r.results is not None
        assert r.results.summary() == ref.results.summary()
        assert [s.delivered_bytes for s in r.results.samples] == [
            s.delivered_bytes for s in ref.results.samples
        ]
        counts.append(len(calls))
    assert counts[0] > 2 * counts[1]


def test_the_bar_shows_each_phase_then_bytes_of_the_total_and_its_clock_stops_at_the_end() -> None:
    out = io.StringIO()
    bar = RunProgress(Console(file=out, force_terminal=True, width=160))
    doc = _doc()
    with bar:
        for r in iter_runs(
            doc, lambda run, sim: bar.update(run.label, sim), phase=lambda run, n: bar.phase(run.label, n)
        ):
            bar.finish(r.label)
            (task,) = bar.bar.tasks
            assert r.sim is not None
            total = sum(f.size for f in r.sim.flows)
            assert task.total == total and task.completed == total
            assert task.fields["phase"] == PHASES["run"]
            assert task.stop_time is not None
            assert task.elapsed is not None and abs(task.elapsed - r.wall_s) < 0.5
    assert "MiB" in out.getvalue() or "KiB" in out.getvalue()


def test_nothing_is_drawn_when_the_console_is_not_a_terminal() -> None:
    out = io.StringIO()
    with RunProgress(Console(file=out, force_terminal=False)) as bar:
        bar.phase("x", "build")
    assert out.getvalue().strip() == ""
