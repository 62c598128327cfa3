"""``openmrc testbed``: a multi-plane leaf-spine of network namespaces built from the fabric export."""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Callable
from typing import Annotated

import typer
from rich.table import Table

from openmrc.cli.perf import parse_percent
from openmrc.cli.render import make_console, print_table
from openmrc.testbed import Testbed, TestbedError, missing
from openmrc.testbed.netns import MODES

app = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    help="A real-kernel multi-plane SRv6 / ECMP fabric of network namespaces on this machine (root).",
)
console = make_console()
errors = make_console(stderr=True)  # diagnostics: stderr, so that a JSON reader of stdout reads JSON only


def _this_command() -> str:
    """How to run openmrc again as this process was run: the ``openmrc`` script's absolute path, or the
    interpreter with ``-m openmrc.cli.main``."""
    argv0 = sys.argv[0] if sys.argv else ""
    if os.path.basename(argv0) == "openmrc" and os.path.exists(argv0):
        return shlex.quote(os.path.abspath(argv0))
    return f"{shlex.quote(sys.executable)} -m openmrc.cli.main"


def _bed() -> Testbed:
    why = missing()
    if why:
        errors.print(f"error: {why}", markup=False, highlight=False)
        raise typer.Exit(1)
    return Testbed()


def _do(what: str, fn: Callable[[], object], undone: str = "") -> None:
    """Run ``fn`` and turn the testbed's and the user's errors into one line and exit status 1 (Ctrl-C: a
    line, with ``undone`` saying what the interrupted step cleaned up, and 130)."""
    try:
        fn()
    except (TestbedError, ValueError, OSError) as exc:
        errors.print(f"error: {what}: {exc}", markup=False, highlight=False)
        raise typer.Exit(1) from None
    except KeyboardInterrupt:
        errors.print(f"interrupted: {what}" + (f" ({undone})" if undone else ""), markup=False)
        raise typer.Exit(130) from None


@app.command()
def up(
    planes: Annotated[int, typer.Option(help="planes (ports per host)")] = 2,
    hosts: Annotated[int, typer.Option(help="hosts")] = 4,
    spines: Annotated[int, typer.Option(help="T1 (spine) switches per plane")] = 2,
    hosts_per_t0: Annotated[int | None, typer.Option(help="hosts per T0 (default: --spines)")] = None,
    mode: Annotated[
        str, typer.Option(help="srv6 (uSID tables + host routes) or ecmp (host routes)")
    ] = "srv6",
) -> None:
    """Build the fabric: one namespace per host and switch, veth links, configured by the export alone."""
    bed = _bed()
    if mode not in MODES:
        raise typer.BadParameter(f"--mode {mode!r}: one of {', '.join(MODES)}")
    try:
        Testbed.shape(planes, hosts, spines, hosts_per_t0)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None

    def build() -> None:
        fab = bed.up(planes, hosts, spines, mode=mode, hosts_per_t0=hosts_per_t0, log=console.print)
        t = fab.topo
        console.print(
            f"[green]up[/]: {t.planes} planes × ({t.t0_per_plane} T0 + {t.t1_per_plane} T1), {t.num_hosts} "
            f"hosts, {mode}; namespaces {bed.prefix}<node>, export in {bed.export_dir}"
        )
        h0, h1 = 0, t.num_hosts - 1
        me = _this_command()  # (the path that ran this one: works without an activated venv)
        console.print(
            f"try: {me} testbed exec host{h1} -- {me} perf server --fabric {bed.export_dir}\n"
            f"     {me} testbed exec host{h0} -- {me} perf client {fab.host_address(h1, 0)} "
            f"--fabric {bed.export_dir} --ev-mode {'srv6' if fab.srv6 else 'stev'}",
            markup=False,
            highlight=False,
        )

    _do("testbed up", build, undone="what it had made is removed")


@app.command()
def down() -> None:
    """Remove every namespace of the testbed (safe after a crash, and when none is up)."""
    bed = _bed()
    n = bed.down()
    console.print(f"removed {n} namespaces" if n else "no testbed was up")


LinkArg = Annotated[
    str, typer.Argument(help="a link A--B as `testbed status` lists them, e.g. p0-t0-0--p0-t1-1")
]


@app.command()
def fail(link: LinkArg) -> None:
    """Blackhole LINK both ways (it stays up: only the transport can notice)."""
    bed = _bed()
    _do(f"fail {link}", lambda: bed.fail(link))
    console.print(f"{link}: blackholed")


@app.command()
def heal(link: Annotated[str | None, typer.Argument(help="a link A--B; every fault if none")] = None) -> None:
    """Remove the fault of LINK (or of every link)."""
    bed = _bed()
    healed: list[str] = []
    _do("heal", lambda: healed.extend(bed.heal(link)))
    console.print(f"healed {', '.join(healed)}" if healed else "no fault to heal")


@app.command()
def loss(link: LinkArg, rate: Annotated[str, typer.Argument(help="e.g. 5%")]) -> None:
    """Drop RATE of LINK's packets at random, both ways."""
    bed = _bed()
    r = parse_percent(rate)
    if r == 0:
        raise typer.BadParameter("a loss rate above 0 (heal removes a fault)")
    _do(f"loss {link}", lambda: bed.loss(link, r))
    console.print(f"{link}: {r * 100:g}% loss")


@app.command(
    "exec",
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
)
def exec_(
    ctx: typer.Context,
    host: Annotated[str, typer.Argument(help="a node, e.g. host0 or p0-t1-0")],
) -> None:
    """Run a command inside HOST's namespace: openmrc testbed exec HOST -- CMD ARGS..."""
    bed = _bed()
    argv: list[str] = []
    _do("exec", lambda: argv.extend(bed.exec_argv(host, list(ctx.args))))
    try:
        os.execvp(argv[0], argv)
    except OSError as exc:
        errors.print(f"error: exec: {exc.strerror}", markup=False, highlight=False)
        raise typer.Exit(1) from None


@app.command()
def status() -> None:
    """Every link with its fault and the packets it carried each way."""
    bed = _bed()
    rows: list[dict[str, object]] = []
    _do("status", lambda: rows.extend(bed.status()))
    t = Table(
        "link", "plane", "fault", "a→b packets", "b→a packets", "dropped", title=f"testbed ({bed.mode})"
    )
    for r in rows:
        t.add_row(
            str(r["link"]),
            str(r["plane"]),
            str(r["fault"]),
            f"{r['a_to_b']:,}",
            f"{r['b_to_a']:,}",
            f"{r['dropped']:,}",
        )
    print_table(console, t)
