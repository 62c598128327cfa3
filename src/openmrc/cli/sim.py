"""``openmrc sim``: run simulation scenarios."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import statistics
import tempfile
import time
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer
from rich import box
from rich.table import Table

from openmrc.cli.capture import PcapOption
from openmrc.cli.interrupt import deferred_interrupt
from openmrc.cli.progress import PHASES, RunProgress
from openmrc.cli.render import make_console, print_table
from openmrc.sim import partition
from openmrc.sim.fabric_sim import FabricSim
from openmrc.sim.metrics import BASELINE_SUFFIX, SimResults
from openmrc.sim.results_files import name_nodes, provenance, results_document, write_runs
from openmrc.sim.scenario import (
    Run,
    ScenarioError,
    builtin_scenarios,
    expand_runs,
    iter_runs,
    load_scenario,
)
from openmrc.sim.scenario_schema import Scenario, markdown
from openmrc.sim.sweep import (
    FIGURES,
    LocalPool,
    Point,
    Pool,
    RayPool,
    SweepError,
    SweepInterrupted,
    SweepSummary,
    plan,
    plot_dimensions,
    rows,
    run_sweep,
    with_dimensions,
    write_tables,
)

app = typer.Typer(no_args_is_help=True, add_completion=False, help="Packet-level fabric simulation.")
console = make_console()
log = make_console(stderr=True)  # progress and diagnostics: stderr, results on stdout

#: The columns of the comparison table: (report key, heading, format, shown without --wide).
COLUMNS: tuple[tuple[str, str, str, bool], ...] = (
    ("completed", "flows\ndone", "{:,.0f}", True),
    ("job_time_us", "job\nµs", "{:,.1f}", True),
    ("job_goodput_gbps", "job\nGb/s", "{:,.0f}", True),
    ("goodput_fraction", "of\nbottleneck", "{:.1%}", False),
    ("median_fct_us", "FCT p50\nµs", "{:,.1f}", True),
    ("p99_fct_us", "FCT p99\nµs", "{:,.1f}", False),
    ("max_fct_us", "FCT max\nµs", "{:,.1f}", True),
    ("retransmits", "\nrtx", "{:,.0f}", True),
    ("trims", "\ntrims", "{:,.0f}", False),
    ("drops", "\ndrops", "{:,.0f}", True),
)
#: Columns shown only when some run reports them: a victim flow's FCT and slowdown, Write-with-Immediate
#: delivery times, PFC pauses.
OPTIONAL_COLUMNS: tuple[tuple[str, str, str, bool], ...] = (
    ("victim_max_fct_us", "victim\nµs", "{:,.1f}", False),
    ("victim_slowdown", "victim\n×alone", "{:,.2f}", True),
    ("median_delivery_us", "delivery\np50 µs", "{:,.2f}", True),
    ("pfc_pauses", "PFC\npauses", "{:,.0f}", False),
    ("collective_us", "collective\nµs", "{:,.1f}", True),
    ("collective_right", "result\nright", "{}", True),
    ("wall_s", "wall\ns", "{:,.1f}", False),
)


def _cell(values: list[Any], fmt: str) -> str:
    if fmt == "{}":  # a yes/no column
        seen = {v for v in values if v is not None}
        return "–" if not seen else ("yes" if seen == {True} else "no" if seen == {False} else "some")
    nums = [v for v in values if isinstance(v, int | float) and not isinstance(v, bool)]
    if not nums:
        return "–"
    if len(nums) == 1:
        return fmt.format(nums[0])
    spread = statistics.stdev(nums)
    return f"{fmt.format(statistics.fmean(nums))}\n±{fmt.format(spread)}"


def _groups(runs: list[Run]) -> list[tuple[str, list[dict[str, Any]]]]:
    """Runs grouped by label without the seed: (label, reports)."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in runs:
        groups.setdefault(r.label.rsplit(" seed=", 1)[0], []).append(r.report())
    return list(groups.items())


def results_table(runs: list[Run], title: str, *, wide: bool = False) -> Table:
    """One row per variant (several seeds: mean ±std): flows done, job time and goodput, FCTs, retransmits
    and drops (``wide``: every column, p99, trims, a victim's FCT and PFC pauses too)."""
    groups = _groups(runs)
    reports = [rep for _l, reps in groups for rep in reps]
    columns = COLUMNS + tuple(c for c in OPTIONAL_COLUMNS if any(c[0] in rep for rep in reports))
    columns = tuple(c for c in columns if wide or c[3])
    t = Table(title=title, box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 0, 0, 1), collapse_padding=True)
    t.add_column("\nrun", min_width=12, overflow="fold")
    for _k, head, _f, _n in columns:
        t.add_column(head, justify="right", no_wrap=True)
    for label, reps in groups:
        cells = [_cell([rep.get(k) for rep in reps], fmt) for k, _h, fmt, _n in columns]
        total = reps[0]["flows"]
        if any(rep["unfinished"] for rep in reps):
            cells[0] = f"{cells[0]}/{total:,}"
        t.add_row(label, *cells)
    return t


def sweep_table(table: list[dict[str, Any]], dims: list[str], title: str) -> Table:
    """The sweep's results: one row per point (its dimensions' values, the variant and seed where there are
    several), the run table's figures, and its status (ok, failed: the errors are listed below it)."""
    show = [*dims] + [k for k in ("variant", "seed") if len({str(r[k]) for r in table}) > 1]
    t = Table(title=title, box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 0, 0, 1), collapse_padding=True)
    for key in show:
        t.add_column(key.replace(".", ".\n", 1) if "." in key else f"\n{key}")
    columns = [c for c in COLUMNS + OPTIONAL_COLUMNS if c[3] and c[0] in FIGURES]
    columns = [c for c in columns if any(row.get(c[0]) is not None for row in table)]
    for _k, head, _f, _n in columns:
        t.add_column(head, justify="right", no_wrap=True)
    t.add_column("\nstatus")
    for row in table:
        cells = [_cell([row.get(k)], fmt) for k, _h, fmt, _n in columns]
        if row.get("flows") and row.get("completed") is not None and row["completed"] < row["flows"]:
            cells[0] = f"{cells[0]}/{row['flows']:,}"
        t.add_row(*(str(row[k]) for k in show), *cells, str(row["status"]))
    return t


def print_notes(runs: list[Run], doc: dict[str, Any]) -> None:
    """Below the table: runs that stopped with flows unfinished, over which flows the FCTs were taken, the
    victim's slowdown against the same flow alone, and reference figures (htsim's) beside openmrc's."""
    for r in runs:
        rep = r.report()
        if rep["unfinished"]:
            over = f" (FCTs: the {rep['completed']:,} finished)" if "fct_over" in rep else ""
            console.print(f"  {r.label}: [bold]{rep['status']}[/bold]{over}", highlight=False)
        if "victim_slowdown" in rep:
            console.print(
                f"  {r.label}: the victim flow took {rep['victim_max_fct_us']:,.1f} µs, "
                f"{rep['victim_slowdown']:.2f}× its {rep['victim_alone_fct_us']:,.1f} µs alone"
            )
    for ref in doc.get("references", []):
        for r in runs:
            if r.variant != ref["variant"] or not _at(r.doc, ref.get("at", {})):
                continue
            ours = r.report().get(ref["figure"])
            line = f"  {r.label}: {ref['figure']} {ref['source']} {_num(ref['value'])}"
            if isinstance(ours, int | float):
                line += f", openmrc {_num(ours)} ({ours / ref['value']:.2f}×)"
            else:
                line += ", openmrc –"
            console.print(line, highlight=False)
            if ref.get("note"):
                console.print(f"    {ref['note']}", highlight=False)


def _num(v: float) -> str:
    return f"{v:,.1f}" if abs(v) >= 10 else f"{v:.3g}"


def _at(doc: dict[str, Any], point: dict[str, Any]) -> bool:
    """Whether a run's resolved document has the values of a sweep point (``{"workload.size_bytes": 8}``)."""
    for key, want in point.items():
        node: Any = doc
        for part in key.split("."):
            if isinstance(node, list) and part.isdigit() and int(part) < len(node):
                node = node[int(part)]
            elif isinstance(node, dict) and part in node:
                node = node[part]
            else:
                return False
        if node != want:
            return False
    return True


def print_outages(runs: list[Run]) -> None:
    """Per failure of each run: what failed and when; its bypass time (until every connection whose
    packets went through it is back to 90 % of its goodput before the failure) and which connections
    those were; the last data packet into it; and the goodput of all flows over the windows named, beside
    the same run without the failure when one ran (labelled with `BASELINE_SUFFIX`)."""
    results = {r.label: r.results for r in runs if r.results is not None}
    alone = False
    for r in runs:
        assert r.results is not None
        for o in r.results.outage_reports():
            what = name_nodes(o["what"], r.sim.topo) if r.sim is not None else o["what"]
            last = o["last_packet_us"]
            lines = [
                f"  {r.label}: {what} at {o['at_us']:,.0f} µs",
                f"    {_bypass(o, str(r.doc['fabric']['transport']))}",
                f"    last data packet into it: +{last:,.1f} µs"
                if last is not None
                else "    no data packet into it",
            ]
            goodputs = _goodputs(o, results.get(r.label + BASELINE_SUFFIX))
            if goodputs:
                lines.append(f"    {goodputs}")
                alone = alone or r.label + BASELINE_SUFFIX not in results
            for line in lines:
                console.print(line, markup=False, highlight=False)
    if alone:
        console.print(
            "  (all flows: the whole job's goodput, which also ramps up and moves with congestion control; "
            "the same run without the failure, --set 'failures=[]', shows how much)",
            style="dim",
            markup=False,
            highlight=False,
        )


def _bypass(o: dict[str, Any], transport: str) -> str:
    """The bypass time of one outage and the connections it is over, in words."""
    n, rec = o["affected"], o["bypass_us"]
    pairs = _count(o["host_pairs"], "host pair") + " with a path through it"
    if transport == "roce":
        who = f"{_count(n, 'RoCEv2 QP')} hashed through it (of the {o['connections']:,} QPs of the {pairs})"
    else:
        who = _count(n, "MRC connection") + " (a QP per host pair with a path through it, spraying over all "
        who += "its paths: only some go through it)"
    if n == 0:
        return f"bypass: no connection's packets went through it ({pairs})"
    if rec is None:
        return f"bypass: not recovered: of its {who}, some never got back to 90 % of their goodput before it"
    if rec == 0:
        return (
            f"bypass time 0 µs: none of its {who} fell below 90 % of their goodput before it (5-sample means)"
        )
    if o.get("bypass_ended"):
        return (
            f"bypass: not back: its {who} stayed below 90 % of their goodput before it until the last "
            f"finished its flows, +{rec:,.1f} µs"
        )
    return f"bypass time {rec:,.1f} µs: until its {who} were back to 90 % of their goodput before it"


def _count(n: int, what: str) -> str:
    return f"{n:,} {what}" + ("" if n == 1 else "s")


def _goodputs(o: dict[str, Any], baseline: SimResults | None) -> str:
    """The goodput of all flows (and of the failed host) before and after, with the windows."""
    before, after = o.get("goodput_before_gbps"), o.get("goodput_after_gbps")
    wb, wa = o.get("before_us"), o.get("after_us")
    if before is None or after is None or wb is None or wa is None:
        return ""
    line = (
        f"all flows {before:,.0f} Gb/s over {wb[0]:,.0f}–{wb[1]:,.0f} µs → {after:,.0f} Gb/s over "
        f"{wa[0]:,.0f}–{wa[1]:,.0f} µs"
    )
    if baseline is not None:
        b0, b1 = baseline.goodput_gbps(*wb), baseline.goodput_gbps(*wa)
        if b0 is not None and b1 is not None:
            line += f" (without the failure {b0:,.0f} → {b1:,.0f})"
    hb, ha = o.get("host_goodput_before_gbps"), o.get("host_goodput_after_gbps")
    if hb is not None and ha is not None:
        line += f"; the host's own {hb:,.0f} → {ha:,.0f} Gb/s"
    return line


def print_written(out: Path, paths: list[Path]) -> None:
    """One line: what went where (``wrote results.json, 10 CSVs, 2 plots to out/``)."""
    csvs = sum(p.suffix == ".csv" for p in paths)
    pngs = sum(p.suffix == ".png" for p in paths)
    console.print(f"wrote results.json, {csvs} CSVs, {pngs} plots to {out}/", highlight=False)


class RunInterrupted(Exception):
    """Ctrl-C stopped a scenario: the variants that had finished, and where the run was."""

    def __init__(self, finished: list[Run], total: int, where: str) -> None:
        super().__init__(where)
        self.finished = finished
        self.total = total
        self.where = where


@dataclass(frozen=True, slots=True)
class Selection:
    """Which runs of a scenario to make, how loudly, and what to attach to each simulation once it is built
    (``prepare(run, sim)``, e.g. a capture tap)."""

    seeds: list[int] | None = None
    variants: list[str] | None = None
    quiet: bool = False
    prepare: Callable[[Run, FabricSim], None] | None = None
    ranks: int | None = None
    """Split each run over this many processes (`openmrc.sim.partition`); None: one, default order."""


def run_with_progress(doc: dict[str, Any], sel: Selection = Selection()) -> list[Run]:
    """`run_scenario` under a progress bar per run (`openmrc.cli.progress`; none when ``sel.quiet``).
    Ctrl-C stops it between simulation steps (`openmrc.cli.interrupt`) and raises `RunInterrupted`."""
    finished: list[Run] = []
    total = len(expand_runs(doc, sel.seeds, sel.variants))
    where = "while building the first variant"
    with deferred_interrupt("the simulation") as stop, RunProgress(quiet=sel.quiet) as bar:

        def phase(run: Run, name: str) -> None:
            nonlocal where
            bar.phase(run.label, name)
            where = f"in variant {run.label!r}, {PHASES[name]}"
            stop.check()

        def progress(run: Run, sim: FabricSim) -> None:
            nonlocal where
            bar.update(run.label, sim)
            where = (
                f"in variant {run.label!r} at {sim.sim.now / 1000:,.1f} µs simulated, "
                f"{sim.completed:,} of {len(sim.flows):,} flows finished"
            )
            stop.check()

        try:
            for r in iter_runs(
                doc,
                progress,
                seeds=sel.seeds,
                variants=sel.variants,
                phase=phase,
                prepare=sel.prepare,
                ranks=sel.ranks,
            ):
                bar.finish(r.label)
                finished.append(r)
                where = f"after variant {r.label!r}"
                if total > 1 and not sel.quiet:
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


def scenario_error(exc: ScenarioError) -> typer.Exit:
    """Print each problem of ``exc`` on a line of its own (stderr); the exit to raise."""
    for p in exc.problems or [str(exc)]:
        typer.echo(f"error: {p}", err=True)
    return typer.Exit(2)


keep: list[Run] = []
"""The last command's finished runs, simulations included: the ``openmrc`` entry point
(`openmrc.cli.main.run`) leaves the process without freeing them (a big fabric takes long to free, and
nothing needs it freed)."""


def run_scenario_cli(
    doc: dict[str, Any], out: Path | None, made_out: bool, sel: Selection = Selection()
) -> list[Run]:
    """`run_with_progress`; on Ctrl-C say where the run was, write what finished to ``out`` and exit 130."""
    started = time.time()
    try:
        runs = run_with_progress(doc, sel)
        keep[:] = runs
        return runs
    except ScenarioError as exc:
        raise scenario_error(exc) from None
    except RunInterrupted as exc:
        done = keep[:] = exc.finished
        console.print(
            f"[bold]interrupted[/bold] {exc.where}; {len(done)} of {exc.total} variant(s) had finished"
        )
        if done:
            print_table(
                console, results_table(done, str(doc.get("name", "scenario")) + " (finished variants)")
            )
            if out is not None:
                where = f"{exc.where}; {len(done)} of {exc.total} variant(s) had finished"
                prov = provenance(started, sorted({r.seed for r in done}))
                print_written(out, write_runs(done, out, doc, provenance=prov, interrupted=where))
        elif out is not None and made_out:
            with contextlib.suppress(OSError):
                out.rmdir()  # made for this run, and nothing to put in it
        raise typer.Exit(130) from None


def _expected(doc: dict[str, Any]) -> str:
    wall = doc.get("expected_wall_s")
    if wall is None:
        return "?"
    return f"{wall:,.0f} s" if wall >= 10 else f"{wall:.1f} s"


@app.command()
def scenarios() -> None:
    """List the built-in scenarios, with how long each took to run once (compiled, every variant)."""
    t = Table("name", "run", "description", box=box.SIMPLE_HEAD, pad_edge=False)
    for name, path in sorted(builtin_scenarios().items()):
        doc = tomllib.loads(path.read_text())
        t.add_row(name, _expected(doc), doc.get("description", ""))
    print_table(console, t)


@app.command()
def show(name: Annotated[str, typer.Argument(help="a built-in scenario's name")]) -> None:
    """Print a built-in scenario's TOML, to copy and edit (`openmrc sim show demo > my.toml`)."""
    known = builtin_scenarios()
    if name not in known:
        typer.echo(f"error: no built-in scenario {name!r} (built-in: {', '.join(sorted(known))})", err=True)
        raise typer.Exit(2)
    typer.echo(known[name].read_text(), nl=False)


@app.command()
def schema(
    markdown_: Annotated[
        bool, typer.Option("--markdown", help="the scenario reference (docs/scenarios.md) instead of JSON")
    ] = False,
) -> None:
    """Print the scenario schema: every key, type, unit, default and rule (JSON Schema, or Markdown)."""
    if markdown_:
        typer.echo(markdown(), nl=False)
    else:
        typer.echo(json.dumps(Scenario.model_json_schema(), indent=2))


@app.command()
def run(
    scenario: Annotated[str, typer.Argument(help="a built-in scenario name or a TOML file")],
    set_: Annotated[
        list[str] | None,
        typer.Option(
            "--set", metavar="SECTION.KEY=VALUE", help="override a scenario value (may be repeated)"
        ),
    ] = None,
    out: Annotated[
        Path | None, typer.Option(help="write results.json, per-run CSVs and PNG plots here")
    ] = None,
    variant: Annotated[
        list[str] | None, typer.Option(help="run only this variant (by name; may be repeated)")
    ] = None,
    seed: Annotated[int | None, typer.Option(min=0, help="fabric.seed for every run")] = None,
    seeds: Annotated[
        int,
        typer.Option(
            min=1,
            max=1000,
            help="run each variant with this many seeds (from --seed or fabric.seed on): mean ±std",
        ),
    ] = 1,
    json_: Annotated[
        bool, typer.Option("--json", help="print results.json's document on stdout, no table")
    ] = False,
    quiet: Annotated[bool, typer.Option(help="no progress bar, no per-variant lines")] = False,
    wide: Annotated[
        bool, typer.Option(help="every column (p99, trims, PFC pauses, the victim's FCT)")
    ] = False,
    pcap: Annotated[Path | None, typer.Option(help="write the MRC runs' packets to this pcap file")] = None,
    pcap_flows: Annotated[str | None, typer.Option(help="--pcap: only these flows (ids: 0,5)")] = None,
    pcap_port: Annotated[str | None, typer.Option(help="--pcap: capture at HOST[:PORT], both ways")] = None,
    ranks: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="split each run over N processes (forked, or the mpiexec ones), same results for any N "
            "(partition-independent order: figures differ from a run without --ranks)",
        ),
    ] = None,
) -> None:
    """Run one scenario (every variant) and print a comparison table."""
    if pcap is None and (pcap_flows is not None or pcap_port is not None):  # (they would be ignored)
        raise scenario_error(
            ScenarioError("--pcap-flows and --pcap-port choose what --pcap captures: give --pcap")
        )
    world = partition.mpi_world() if ranks is not None else None
    if world is not None and world.rank != 0:  # one of mpiexec's other ranks: run, show and write nothing
        quiet, json_, out, pcap = True, False, None, None
    if pcap is not None and ranks is not None and ranks > 1:  # a rank builds only its hosts
        raise scenario_error(ScenarioError("--pcap captures a run in one process: give no --ranks (or 1)"))
    try:
        doc = load_scenario(scenario, set_)
    except ScenarioError as exc:
        raise scenario_error(exc) from None
    base = seed if seed is not None else int(doc["fabric"]["seed"])
    sel = Selection(
        seeds=[base + i for i in range(seeds)] if seed is not None or seeds > 1 else None,
        variants=variant,
        quiet=quiet or json_,
        ranks=ranks,
    )
    try:
        planned = expand_runs(doc, sel.seeds, sel.variants)
    except ScenarioError as exc:
        raise scenario_error(exc) from None
    made = check_out_dir(out) if out is not None else False
    cap = None if pcap is None else PcapOption(pcap, pcap_flows, pcap_port, runs=len(planned))
    if cap is not None:
        sel = dataclasses.replace(sel, prepare=cap.attach)
    started = time.time()
    try:
        runs = run_scenario_cli(doc, out, made, sel)
    finally:
        if cap is not None:
            cap.close()
    if world is not None and world.rank != 0:
        return
    prov = provenance(started, sorted({r.seed for r in runs}))
    if json_:
        typer.echo(json.dumps(results_document(runs, doc, provenance=prov), indent=2, default=str))
    else:
        table = results_table(runs, str(doc.get("name", scenario)), wide=wide)
        print_table(console, table)
        print_notes(runs, doc)
        print_outages(runs)
    for line in [] if cap is None else cap.report():
        typer.echo(line, err=json_)
    if out is not None:
        written = write_runs(runs, out, doc, provenance=prov)
        if not quiet and not json_:
            print_written(out, written)


@app.command("sweep", short_help="Run every point of a scenario's \\[sweep] grid, each in a worker process.")
def sweep_cmd(
    scenario: Annotated[str, typer.Argument(help="a built-in scenario name or a TOML file")],
    set_: Annotated[
        list[str] | None,
        typer.Option(
            "--set", metavar="SECTION.KEY=VALUE", help="override a scenario value (may be repeated)"
        ),
    ] = None,
    dim: Annotated[
        list[str] | None,
        typer.Option(
            "--sweep", metavar="SECTION.KEY=[V1, V2]", help="add a dimension (a TOML list; may be repeated)"
        ),
    ] = None,
    out: Annotated[
        Path | None, typer.Option(help="results here (default sweep-NAME); a re-run skips finished points")
    ] = None,
    jobs: Annotated[int | None, typer.Option(min=1, help="local worker processes (default: CPUs)")] = None,
    ray: Annotated[
        str | None,
        typer.Option(help="on the Ray cluster at ADDRESS ('auto': this machine's, or a new one)"),
    ] = None,
    variant: Annotated[list[str] | None, typer.Option(help="only this variant (may be repeated)")] = None,
    seed: Annotated[int | None, typer.Option(min=0, help="fabric.seed for every point")] = None,
    seeds: Annotated[int, typer.Option(min=1, max=1000, help="this many seeds per point")] = 1,
    quiet: Annotated[bool, typer.Option(help="no line per finished point")] = False,
) -> None:
    """Run every point of a scenario's \\[sweep] grid (× variants × seeds), each in a worker process of its
    own; print a table of their results and write sweep.csv, sweep.json and a plot per dimension. A re-run
    into the same --out skips the points that finished (a changed point runs again); a failed point is
    reported and the others go on (exit 1)."""
    try:
        doc = with_dimensions(load_scenario(scenario, set_), dim or [])
        base = seed if seed is not None else int(doc["fabric"]["seed"])
        points = plan(
            doc, [base + i for i in range(seeds)] if seed is not None or seeds > 1 else None, variant
        )
    except ScenarioError as exc:
        raise scenario_error(exc) from None
    out = out or Path(f"sweep-{doc.get('name', 'scenario')}")
    check_out_dir(out)
    n_jobs = jobs or os.cpu_count() or 1

    def pool(n: int) -> Pool:
        return RayPool(ray) if ray is not None else LocalPool(min(n, n_jobs))

    def on_point(p: Point, rec: dict[str, Any], s: SweepSummary) -> None:
        if not quiet:
            what = "finished" if rec["status"] == "ok" else f"[bold]failed[/bold]: {rec.get('error')}"
            log.print(f"\\[{s.ran + s.skipped}/{s.total}] {p.label} {what} in {rec['wall_s']:.1f} s")

    started = time.time()
    with deferred_interrupt("the sweep") as stop:  # until the tables are written
        try:
            records, summary = run_sweep(points, out, pool, on_point=on_point, check=stop.check)
        except SweepError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2) from None
        except SweepInterrupted as exc:
            s = exc.summary
            failed = f" ({len(s.failed)} more failed)" if s.failed else ""
            console.print(
                f"[bold]interrupted[/bold]: {s.ran + s.skipped - len(s.failed)} of {s.total} points finished"
                f"{failed}, kept in {out}/points/ (the same command goes on from there)",
                highlight=False,
            )
            raise typer.Exit(130) from None
        prov = provenance(started, sorted({p.seed for p in points}))
        written = write_tables(out, doc, points, records, summary, prov)
        table = rows(points, records)
        written += plot_dimensions(out, doc, table)
    print_table(console, sweep_table(table, list(doc.get("sweep", {})), str(doc.get("name", "sweep"))))
    line = f"{summary.total} points: {summary.ran} run, {summary.skipped} skipped (finished before), "
    line += f"{len(summary.failed)} failed; "
    if summary.ran:
        line += (
            f"{summary.wall_s:.1f} s wall for {summary.point_s:.1f} s of points on {summary.workers} "
            f"worker(s): {summary.speedup:.2f}× speed-up"
        )
        line += f" (+{summary.start_s:.1f} s to start them); " if summary.start_s >= 0.1 else "; "
    console.print(f"{line}wrote sweep.csv, sweep.json, {len(written) - 2} plot(s) to {out}/", highlight=False)
    for label, error in summary.failed:
        console.print(f"  failed: {label}: {error}", highlight=False)
    if summary.failed:
        raise typer.Exit(1)
