"""``openmrc sim``: run simulation scenarios."""

from __future__ import annotations

import time
import tomllib
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from openmrc.sim.scenario import ScenarioError, builtin_scenarios, load_scenario, run_scenario, write_results

app = typer.Typer(no_args_is_help=True, add_completion=False, help="Packet-level fabric simulation.")
console = Console()


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
    out: Annotated[Path | None, typer.Option(help="write results.json and flows.csv here")] = None,
) -> None:
    """Run one scenario and print its summary."""
    try:
        doc = load_scenario(scenario, set_)
        t0 = time.perf_counter()
        with console.status(f"simulating {doc.get('name', scenario)} …"):
            sim, res = run_scenario(doc)
        wall = time.perf_counter() - t0
    except ScenarioError as exc:
        raise typer.BadParameter(str(exc)) from exc
    s = res.summary()
    t = Table("metric", "value", title=str(doc.get("name", scenario)))
    for k, v in s.items():
        t.add_row(k, f"{v:,.3f}" if isinstance(v, float) else f"{v:,}")
    t.add_row("wall_s", f"{wall:.2f}")
    console.print(t)
    if out is not None:
        write_results(sim, res, out, doc)
        console.print(f"wrote {out / 'results.json'} and {out / 'flows.csv'}")
