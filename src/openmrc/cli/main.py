"""The ``openmrc`` command line (typer + rich)."""

from __future__ import annotations

import contextlib
import math
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich import box
from rich.table import Table

from openmrc import __version__
from openmrc.cli.collective import app as collective_app
from openmrc.cli.decode import decode
from openmrc.cli.perf import app as perf_app
from openmrc.cli.render import make_console, opcode_name, packet_table, print_table
from openmrc.cli.sim import app as sim_app
from openmrc.cli.testbed import app as testbed_app
from openmrc.cli.topo import app as topo_app
from openmrc.wire import MRC_UDP_PORT
from openmrc.wire.examples import ExampleFrame, example_conversation
from openmrc.wire.framing import encapsulate
from openmrc.wire.pcap import write_pcap

if TYPE_CHECKING:
    from openmrc.sim.metrics import SimResults

app = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    help="openmrc: MRC 1.0 (OCP) in Python.",
)
app.add_typer(topo_app, name="topo")
app.add_typer(sim_app, name="sim")
app.add_typer(perf_app, name="perf")
app.add_typer(testbed_app, name="testbed")
app.add_typer(collective_app, name="collective")
console = make_console()


def _version(value: bool) -> None:
    if value:
        typer.echo(__version__)
        raise typer.Exit()


@app.callback()
def main(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="print the version and exit")
    ] = False,
) -> None:
    """openmrc: MRC 1.0 (OCP) in Python."""


@app.command()
def version() -> None:
    """Print the openmrc version."""
    console.print(__version__)


@app.command("wireshark-plugin")
def wireshark_plugin() -> None:
    """Print the path of the bundled Wireshark Lua dissector (use: tshark -X lua_script:PATH)."""
    from openmrc.contrib.wireshark import DISSECTOR_PATH

    typer.echo(str(DISSECTOR_PATH))


@app.command()
def pcap(
    file: Annotated[Path, typer.Argument(help="pcap file to write")],
    port: Annotated[
        int, typer.Option(min=1, max=65535, help="UDP destination port of the MRC packets")
    ] = MRC_UDP_PORT,
) -> None:
    """Write a short example MRC conversation (every packet kind; IPv4, IPv6, SRv6+SRH) as a pcap."""
    if file.is_dir():
        raise typer.BadParameter(f"{file} is a directory; name a file in it", param_hint="FILE")
    if not file.parent.is_dir():
        raise typer.BadParameter(f"the directory {file.parent} does not exist", param_hint="FILE")
    frames = []
    for ex in example_conversation():
        frame = ex.frame
        if port != MRC_UDP_PORT:
            frame = encapsulate(
                ex.packet, src=ex.src, dst=ex.dst, sport=ex.sport, dport=port, srv6=ex.srv6, ether=True
            )
        frames.append((ex.ts_ns, frame))
    try:
        n = write_pcap(file, frames)
    except OSError as exc:
        console.print(f"error: cannot write {file}: {exc.strerror or exc}")
        raise typer.Exit(1) from None
    console.print(f"wrote {n} packets to {file}")
    console.print(f"decode: tshark -X lua_script:$(openmrc wireshark-plugin) -r {file} -V")


# (typer's rich help keeps a docstring's line breaks in the commands list: there, a short_help of one line)
app.command(
    short_help="Decode one MRC packet (a UDP payload, or a whole frame with --frame / --ip) or a capture."
)(decode)


@app.command(
    short_help="The main job: a bandwidth-bound permutation on a 4-plane, 64-host Clos while a T0-T1 link "
    "fails, MRC vs RoCEv2."
)
def demo(
    out: Annotated[Path, typer.Option(help="where results.json, CSVs and the PNG plots go")] = Path(
        "openmrc-demo"
    ),
    set_: Annotated[
        list[str] | None,
        typer.Option(
            "--set", metavar="SECTION.KEY=VALUE", help="override a scenario value (may be repeated)"
        ),
    ] = None,
) -> None:
    """The main job: a bandwidth-bound permutation on a 4-plane, 64-host Clos while a T0-T1 link fails; MRC vs
    RoCEv2 on the same planes, each run with and without the failure to show what the failure costs."""
    from openmrc.cli.sim import (
        check_out_dir,
        print_notes,
        print_outages,
        print_written,
        results_table,
        run_scenario_cli,
        scenario_error,
    )
    from openmrc.sim.metrics import BASELINE_SUFFIX
    from openmrc.sim.results_files import provenance, write_runs
    from openmrc.sim.scenario import ScenarioError, load_scenario

    try:
        doc = load_scenario("demo", set_)
    except ScenarioError as exc:
        raise scenario_error(exc) from None
    made = check_out_dir(out)
    started = time.time()
    variants = doc.get("variants") or [{"name": str(doc.get("name", "run"))}]
    doc["variants"] = [
        *variants,
        *({"name": v["name"] + BASELINE_SUFFIX, "set": [*v.get("set", []), "failures=[]"]} for v in variants),
    ]
    fab, wl = doc["fabric"], doc["workload"]
    console.rule(f"[bold]{wl.get('kind', 'permutation')} on {fab['hosts']} hosts × {fab['planes']} planes")
    console.print(str(doc["description"]))
    runs = run_scenario_cli(doc, out, made)
    print_table(console, results_table(runs, "demo"))
    print_notes(runs, doc)
    console.print("[dim]Gb/s: every byte of the job over the job time.[/dim]")
    n = len(variants)
    print_outages(runs)
    costs = [_failure_cost(r.label, r.results, b.results) for r, b in zip(runs[:n], runs[n:], strict=True)]
    console.print("[bold]The failure costs " + ", ".join(costs) + ".")
    console.print(
        "[dim](job time with the failure vs the same run without it; recovered = every connection through the"
        " failed link back to 90 % of its goodput before it, over 5 sample intervals)[/dim]"
    )
    print_written(
        out, write_runs(runs, out, doc, provenance=provenance(started, sorted({r.seed for r in runs})))
    )
    console.print(
        "More: `openmrc sim scenarios`, `openmrc tour` (wire format, EVs, transport), `openmrc topo plan`."
    )


def _failure_cost(label: str, failed: SimResults | None, clean: SimResults | None) -> str:
    """ "MRC +3.1 % job time (recovered in 4.0 µs)": one transport's run with its failure against the same
    run without it."""
    a = None if failed is None else failed.job_time_ns()
    b = None if clean is None else clean.job_time_ns()
    if not a or not b or failed is None:
        return f"{label}: not comparable (a run did not finish)"
    reps = failed.outage_reports()
    worst = max(reps, key=lambda o: math.inf if o["bypass_us"] is None else o["bypass_us"], default=None)
    rec = None if worst is None else worst["bypass_us"]
    back = (
        "not recovered"
        if rec is None
        else "its connections never fell below 90 %"
        if rec == 0
        else f"not back to 90 % before its connections finished, +{rec:,.1f} µs"
        if worst is not None and worst["bypass_ended"]
        else f"recovered in {rec:,.1f} µs"
    )
    if a <= b:  # not slower with the failure (ECMP's hashes and the timing of go-back-N differ run to run)
        back += "; no slower than without it: the failure's cost is within the run's own variation"
    return f"{label} {(a / b - 1) * 100:+.1f} % job time ({back})"


@app.command()
def tour() -> None:
    """A tour of the wire format, EV expansion and the transport over an impaired 4-plane pair."""
    from openmrc.ev import EVField, EVFormatMode, EVFormatProfile, EVProfile, EVProfileMode, packet_fields

    console.rule("[bold]MRC 1.0 packets")
    examples = example_conversation()
    t = Table("t (µs)", "what", "opcode", "dest QP", "PSN", "bytes", "path")
    for ex in examples:
        p = ex.packet
        path = f"SRv6 {ex.srv6.dst}" if ex.srv6 else ("IPv6" if ":" in ex.src else "IPv4")
        t.add_row(
            f"{ex.ts_ns / 1000:.0f}",
            ex.description,
            opcode_name(p.bth.opcode),
            f"0x{p.bth.dest_qp:06x}",
            str(p.bth.psn),
            str(len(ex.frame)),
            path,
        )
    print_table(console, t)
    first = examples[0]
    console.print(f"\n[bold]{first.description}[/bold], as the UDP payload on the wire:")
    console.print(first.packet.encode().hex(" ", 4))
    print_table(console, packet_table(first.packet))
    _tshark_tour(examples)

    console.rule("[bold]EV expansion (SRv6 uSID paths)")
    fmt = EVFormatProfile(EVFormatMode.SRV6, (32, 16, 16, 16, 16))
    # locator fc00:0000; uSIDs: T0 uplink (plane<<8 | uplink), T1, destination T0, destination port.
    fields = (
        EVField(32, init_val=0xFC000000),
        EVField(16, init_val=0x0100, min_val=0, max_val=0xF, mask=0x000F),
        EVField(16, init_val=0x0200, min_val=0, max_val=0xF, mask=0x000F),
        EVField(16, init_val=0x0305),
        EVField(16, init_val=0x0401),
    )
    prof = EVProfile(EVProfileMode.GEN, fmt, fields, ev_count=6, ev_min_active=2, event_mask=0)
    t = Table("compact EV", "expanded (32 B)", "outer IPv6 destination", "sport", "flow label")
    for compact in prof.generate(random.Random(7)):
        expanded = prof.expand(compact)
        pf = packet_fields(prof, expanded)
        t.add_row(
            compact.hex(),
            expanded[:16].hex() + "…",
            str(pf.dst),
            f"0x{pf.udp_sport:04x}",
            f"0x{pf.flow_label:05x}",
        )
    print_table(console, t)
    _transport_tour()
    console.print("Next: `openmrc pcap mrc.pcap`, then open it in Wireshark with `openmrc wireshark-plugin`.")


def _transport_tour() -> None:
    """Two NICs over 4 planes: an 8 MiB Write through loss, reordering, trims and a plane that fails."""
    from openmrc.provider.loopback import Impairments, Pair

    console.rule("[bold]Transport: one QP spraying over 4 planes")
    t = Table(box=box.SIMPLE_HEAD)
    t.add_column("fabric", ratio=1)
    for head in (
        "done",
        "bytes\nexact",
        "time\nµs",
        "goodput\nGb/s",
        "packets\nresent",
        "trim\nNACKs",
        "EVs\nbad",
    ):
        t.add_column(head, justify="right", no_wrap=True)
    cases = [
        ("clean", Impairments()),
        ("1% loss, reordering, 2% trims", Impairments(loss=0.01, reorder_ns=2_000, trim=0.02)),
        ("plane 2 fails at 20 µs", Impairments(port_fail={2: (20_000, None)})),
    ]
    size = 8 << 20
    for name, imp in cases:
        p = Pair(seed=7, buf_size=size, imp=imp)
        p.write(0, size)
        p.run(lambda p=p: len(p.qp_a.send_cq) > 0, max_time=10**10)  # type: ignore[misc]
        wc = p.completions()
        ok = bool(wc) and wc[0].status.name == "SUCCESS"
        bad = sum(1 for e in p.a.poll_ev_events(1 << 20) if e.state.name == "ASSUMED_BAD")
        t.add_row(
            name,
            "yes" if ok else "NO",
            "yes" if p.dst == p.src else "NO",
            f"{p.now / 1000:.0f}",
            f"{size * 8 / p.now:.0f}",
            str(p.a.stats.retransmits),
            str(p.a.stats.trims_received),
            str(bad),
        )
    print_table(console, t)
    console.print(
        "Four 100 Gb/s planes carry up to 400 Gb/s; a failed plane's EVs are marked bad and replaced."
    )


def _tshark_tour(examples: list[ExampleFrame]) -> None:
    tshark = shutil.which("tshark")
    if tshark is None:
        console.print("[dim](tshark not installed: skipping the Wireshark decode)[/dim]")
        return
    from openmrc.contrib.wireshark import DISSECTOR_PATH

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "demo.pcap"
        write_pcap(path, [(e.ts_ns, e.frame) for e in examples])
        try:
            out = subprocess.run(
                [
                    tshark,
                    "-X",
                    f"lua_script:{DISSECTOR_PATH}",
                    "-r",
                    str(path),
                    "-T",
                    "fields",
                    "-e",
                    "_ws.col.Info",
                ],
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            console.print(f"[dim](tshark failed: {exc})[/dim]")
            return
    console.print("\n[bold]tshark with the openmrc dissector[/bold] (Info column):")
    for line in out.stdout.splitlines():
        console.print(f"  {line}")


def run() -> None:
    """The ``openmrc`` command: the app, then out of the process at once. The simulations a command ran stay
    alive until then (`openmrc.cli.sim.keep`), so a 131,072-host fabric's millions of objects are not freed
    one by one (about 40 s) after everything has been written."""
    try:
        app()
        code: object = 0
    except SystemExit as exc:
        code = exc.code
    if code is not None and not isinstance(code, int):  # sys.exit("message"): print it, as Python would
        print(code, file=sys.stderr)
        code = 1
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed pipe (`| head`): nothing more to say there
            stream.flush()
    mpi = sys.modules.get("mpi4py.MPI")  # a rank under mpiexec: leaving unfinalised gets the others killed
    if mpi is not None and mpi.Is_initialized():
        if not mpi.Is_finalized():
            mpi.Finalize()
        # and leaving by os._exit after MPI_Finalize gets mpiexec (hydra) to kill the ranks still finishing
        sys.exit(code or 0)
    os._exit(code or 0)


if __name__ == "__main__":  # pragma: no cover
    run()
