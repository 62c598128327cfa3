"""``openmrc sim``: run simulation scenarios."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from openmrc.cli.render import make_console
from openmrc.sim.clos_sim import FabricSim
from openmrc.sim.scenario import (
    Run,
    ScenarioError,
    builtin_scenarios,
    load_scenario,
    run_scenario,
    write_runs,
)

app = typer.Typer(no_args_is_help=True, add_completion=False, help="Packet-level fabric simulation.")
console = make_console()

#: The columns of the comparison table: (report key, heading, format).
COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("completed", "done", "{:,}"),
    ("job_time_us", "job µs", "{:,.1f}"),
    ("job_goodput_gbps", "Gb/s", "{:,.1f}"),
    ("median_fct_us", "FCT p50 µs", "{:,.1f}"),
    ("max_fct_us", "FCT max µs", "{:,.1f}"),
    ("retransmits", "rtx", "{:,}"),
    ("trims", "trims", "{:,}"),
    ("drops", "drops", "{:,}"),
)
#: Columns shown only when some run reports them: a victim flow's FCT (incast with a victim), PFC pauses.
OPTIONAL_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("victim_max_fct_us", "victim µs", "{:,.1f}"),
    ("pfc_pauses", "PFC pauses", "{:,}"),
)


def results_table(runs: list[Run], title: str, extra: tuple[str, ...] = ()) -> Table:
    """One row per run: completion, job time and goodput, FCT percentiles, retransmits, trims, drops (and a
    victim's FCT and PFC pauses when a run has them)."""
    reports = []
    for r in runs:
        assert r.results is not None
        reports.append(r.results.report())
    columns = COLUMNS + tuple(c for c in OPTIONAL_COLUMNS if any(c[0] in rep for rep in reports))
    t = Table("run", *(h for _k, h, _f in columns), *extra, "wall s", title=title)
    for r, rep in zip(runs, reports, strict=True):
        cells = [fmt.format(rep[k]) if k in rep else "–" for k, _h, fmt in columns]
        cells += [f"{rep[k]:,.1f}" if isinstance(rep.get(k), float) else str(rep.get(k, "–")) for k in extra]
        t.add_row(r.label, *cells, f"{r.wall_s:.1f}")
    return t


def print_outages(runs: list[Run]) -> None:
    """One line per failure of each run: when, the bypass time, goodput before and after."""
    for r in runs:
        assert r.results is not None
        for o in r.results.outage_reports():
            bypass = (
                "no data packet went into it"
                if o["bypass_us"] is None
                else f"last data packet into it after {o['bypass_us']:.1f} µs"
            )
            line = f"  {r.label}: {o['what']} at {o['at_us']:.0f} µs; {bypass}"
            before, after = o.get("goodput_before_gbps"), o.get("goodput_after_gbps")
            if before is not None and after is not None:
                line += f"; job goodput {before:,.0f} → {after:,.0f} Gb/s"
            hb, ha = o.get("host_goodput_before_gbps"), o.get("host_goodput_after_gbps")
            if hb is not None and ha is not None:
                line += f"; the host's own {hb:,.0f} → {ha:,.0f} Gb/s"
            console.print(line)


def run_with_progress(doc: dict[str, Any]) -> list[Run]:
    """`run_scenario` under a rich progress bar per run (flows completed; simulated time)."""
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total} flows"),
        TextColumn("{task.fields[sim_us]:>10,.1f} µs simulated"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    ) as bar:
        tasks: dict[str, Any] = {}

        def progress(run: Run, sim: FabricSim) -> None:
            if run.label not in tasks:
                tasks[run.label] = bar.add_task(run.label, total=len(sim.flows), sim_us=0.0)
            bar.update(tasks[run.label], completed=sim.completed, sim_us=sim.sim.now / 1000)

        return run_scenario(doc, progress)


@app.command()
def scenarios() -> None:
    """List the built-in scenarios."""
    t = Table("name", "description")
    for name, path in sorted(builtin_scenarios().items()):
        t.add_row(name, tomllib.loads(path.read_text()).get("description", ""))
    console.print(t)


@app.command()
def run(
    scenario: Annotated[str, typer.Argument(help="a built-in scenario name or a TOML file")],
    set_: Annotated[list[str] | None, typer.Option("--set", help="override: section.key=value")] = None,
    out: Annotated[
        Path | None, typer.Option(help="write results.json, per-run CSVs and PNG plots here")
    ] = None,
) -> None:
    """Run one scenario (every variant) and print a comparison table."""
    try:
        doc = load_scenario(scenario, set_)
        runs = run_with_progress(doc)
    except ScenarioError as exc:
        raise typer.BadParameter(str(exc)) from exc
    console.print(results_table(runs, str(doc.get("name", scenario))))
    print_outages(runs)
    if out is not None:
        for p in write_runs(runs, out, doc):
            console.print(f"wrote {p}")
