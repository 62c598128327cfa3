"""``openmrc sim``: run simulation scenarios."""

from __future__ import annotations

import contextlib
import tempfile
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from openmrc.cli.capture import PcapOption
from openmrc.cli.interrupt import deferred_interrupt
from openmrc.cli.render import make_console
from openmrc.sim.clos_sim import FabricSim
from openmrc.sim.scenario import (
    Run,
    ScenarioError,
    builtin_scenarios,
    expand_runs,
    iter_runs,
    load_scenario,
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


class RunInterrupted(Exception):
    """Ctrl-C stopped a scenario: the variants that had finished, and where the run was."""

    def __init__(self, finished: list[Run], total: int, where: str) -> None:
        super().__init__(where)
        self.finished = finished
        self.total = total
        self.where = where


def run_with_progress(
    doc: dict[str, Any], prepare: Callable[[Run, FabricSim], None] | None = None
) -> list[Run]:
    """`run_scenario` under a rich progress bar per run (flows completed; simulated time). Ctrl-C stops it
    between simulation steps (`openmrc.cli.interrupt`) and raises `RunInterrupted`."""
    finished: list[Run] = []
    total = len(expand_runs(doc))
    where = "while building the first variant"
    with (
        deferred_interrupt("the simulation") as stop,
        Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            TextColumn("{task.completed}/{task.total} flows"),
            TextColumn("{task.fields[sim_us]:>10,.1f} µs simulated"),
            TimeElapsedColumn(),
            console=console,
            transient=True,
        ) as bar,
    ):
        tasks: dict[str, Any] = {}

        def progress(run: Run, sim: FabricSim) -> None:
            nonlocal where
            if run.label not in tasks:
                tasks[run.label] = bar.add_task(run.label, total=len(sim.flows), sim_us=0.0)
            bar.update(tasks[run.label], completed=sim.completed, sim_us=sim.sim.now / 1000)
            where = (
                f"in variant {run.label!r} at {sim.sim.now / 1000:,.1f} µs simulated, "
                f"{sim.completed:,} of {len(sim.flows):,} flows finished"
            )
            stop.check()

        try:
            for r in iter_runs(doc, progress, prepare):
                finished.append(r)
                where = f"after variant {r.label!r}"
                if total > 1:
                    bar.console.print(f"finished {r.label} ({len(finished)} of {total}) in {r.wall_s:.1f} s")
                stop.check()
        except KeyboardInterrupt:
            raise RunInterrupted(finished, total, where) from None
    return finished


def check_out_dir(out: Path, option: str = "--out") -> bool:
    """Make sure results can be written to ``out`` before anything runs: a directory (made if missing) in
    which a file can be created. Raises `typer.BadParameter` naming the option and the reason; returns
    whether the directory was made here."""
    if out.exists() and not out.is_dir():
        raise typer.BadParameter(f"{out} exists and is not a directory", param_hint=option)
    made = not out.exists()
    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=out):
            pass
    except OSError as exc:
        raise typer.BadParameter(f"cannot write to {out}: {exc.strerror or exc}", param_hint=option) from None
    return made


def run_scenario_cli(
    doc: dict[str, Any],
    out: Path | None,
    made_out: bool,
    prepare: Callable[[Run, FabricSim], None] | None = None,
) -> list[Run]:
    """`run_with_progress`; on Ctrl-C say where the run was, write what finished to ``out`` and exit 130."""
    try:
        return run_with_progress(doc, prepare)
    except RunInterrupted as exc:
        done = exc.finished
        console.print(
            f"[bold]interrupted[/bold] {exc.where}; {len(done)} of {exc.total} variant(s) had finished"
        )
        if done:
            console.print(results_table(done, str(doc.get("name", "scenario")) + " (finished variants)"))
            if out is not None:
                where = f"{exc.where}; {len(done)} of {exc.total} variant(s) had finished"
                for p in write_runs(done, out, doc, interrupted=where):
                    console.print(f"wrote {p}")
        elif out is not None and made_out:
            with contextlib.suppress(OSError):
                out.rmdir()  # made for this run, and nothing to put in it
        raise typer.Exit(130) from None


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
    pcap: Annotated[Path | None, typer.Option(help="write the MRC runs' packets to this pcap file")] = None,
    pcap_flows: Annotated[str | None, typer.Option(help="--pcap: only these flows (ids: 0,5)")] = None,
    pcap_port: Annotated[str | None, typer.Option(help="--pcap: capture at HOST[:PORT], both ways")] = None,
) -> None:
    """Run one scenario (every variant) and print a comparison table."""
    try:
        doc = load_scenario(scenario, set_)
    except ScenarioError as exc:
        raise typer.BadParameter(str(exc)) from exc
    made = check_out_dir(out) if out is not None else False
    cap = None if pcap is None else PcapOption(pcap, pcap_flows, pcap_port, runs=len(expand_runs(doc)))
    try:
        runs = run_scenario_cli(doc, out, made, None if cap is None else cap.attach)
    except ScenarioError as exc:
        raise typer.BadParameter(str(exc)) from exc
    finally:
        if cap is not None:
            cap.close()
    console.print(results_table(runs, str(doc.get("name", scenario))))
    print_outages(runs)
    for line in [] if cap is None else cap.report():
        console.print(line)
    if out is not None:
        for p in write_runs(runs, out, doc):
            console.print(f"wrote {p}")
