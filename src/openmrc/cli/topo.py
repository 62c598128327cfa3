"""``openmrc topo``: fabric shapes, SRv6 uSID plans and static tables."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from openmrc.cli.render import make_console, print_table
from openmrc.fabric.clos import MultiPlaneClos, SinglePlaneEquivalent, single_plane_equivalent
from openmrc.fabric.linux import LinuxFabric
from openmrc.fabric.srv6 import UsidPlan

app = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    help="Fabric topologies and SRv6 plans.",
)
console = make_console()
LINUX_AUTO_NODES = 4096


@app.command()
def plan(
    planes: Annotated[int, typer.Option(help="independent planes (NIC ports per host)")] = 8,
    hosts: Annotated[int, typer.Option(help="hosts (GPUs)")] = 131072,
    t0_radix: Annotated[int, typer.Option(help="ports of a T0 (leaf) switch")] = 512,
    t1_radix: Annotated[int, typer.Option(help="ports of a T1 (spine) switch")] = 512,
    link_gbps: Annotated[int, typer.Option(help="speed of every link (one NIC port)")] = 100,
    latency_ns: Annotated[int, typer.Option(help="one-way latency of a link")] = 500,
    oversubscription: Annotated[int, typer.Option(help="T0 down:up port ratio")] = 1,
    locator: Annotated[str, typer.Option(help="32-bit SRv6 locator, hex")] = "fc000000",
    out: Annotated[
        Path | None,
        typer.Option(
            help="write plan.json, tables.jsonl and the Linux export (linux/, links.json, hosts.json) here"
        ),
    ] = None,
    linux: Annotated[
        bool | None,
        typer.Option(
            help="with --out: a shell script per switch and host (ip, sysctl), links and hosts "
            f"(default: when the fabric has at most {LINUX_AUTO_NODES:,} nodes)"
        ),
    ] = None,
    mode: Annotated[
        str, typer.Option(help="Linux export: srv6 (uSID tables + host routes) or ecmp")
    ] = "srv6",
    mtu: Annotated[int, typer.Option(help="Linux export: MTU of every port")] = 9000,
) -> None:
    """Print the shape and cost of a multi-plane two-tier Clos, and write its SRv6 tables."""
    t0 = time.perf_counter()
    if mode not in ("srv6", "ecmp"):
        raise typer.BadParameter(f"--mode {mode!r}: srv6 or ecmp")
    try:
        loc = int(locator, 16)
    except ValueError:
        raise typer.BadParameter(f"{locator!r} is not a hexadecimal number", param_hint="--locator") from None
    if not 0 < loc < 1 << 32:
        raise typer.BadParameter(f"{locator!r}: a locator is 32 bits, not zero", param_hint="--locator")
    if out is not None and out.exists() and not out.is_dir():  # before any work, not after the table
        raise typer.BadParameter(f"not a directory: {out} (a file of that name exists)", param_hint="--out")
    try:
        topo = MultiPlaneClos(
            planes, hosts, t0_radix, t1_radix, link_gbps * 10**9, latency_ns, oversubscription
        )
        usid = UsidPlan(topo, loc)
        export = LinuxFabric(usid, srv6=mode == "srv6", mtu=mtu)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc
    build_s = time.perf_counter() - t0
    counts = topo.counts()
    nic_bps = planes * link_gbps * 10**9
    asic_bps = t0_radix * link_gbps * 10**9
    try:  # the comparison column; a fabric whose ASIC split at NIC speed builds no fat tree has none
        sp: SinglePlaneEquivalent | None = single_plane_equivalent(hosts, asic_bps, nic_bps)
        no_sp = ""
    except ValueError as exc:
        sp, no_sp = None, str(exc)

    def single(cell: Callable[[SinglePlaneEquivalent], str]) -> str:
        return "—" if sp is None else cell(sp)

    mp_links = planes * topo.t0_per_plane * topo.uplinks
    lanes_per_optic = max(1, nic_bps // (link_gbps * 10**9))
    mp_optics = -(-2 * mp_links // lanes_per_optic)
    shape = {
        "planes": planes,
        "hosts": hosts,
        "hosts_per_t0": topo.hosts_per_t0,
        "t0_per_plane": topo.t0_per_plane,
        "t1_per_plane": topo.t1_per_plane,
        "t0_total": counts["T0"],
        "t1_total": counts["T1"],
        "switches": topo.num_switches(),
        "host_links": planes * hosts,
        "switch_links": mp_links,
        "tiers": 2,
        "max_switch_hops": 3,
        "paths_between_racks": planes * topo.uplinks,
        "optics_800g_equiv": mp_optics,
        "build_s": build_s,
    }
    t = Table(
        "",
        f"multi-plane ({planes}×{link_gbps}G NIC)",
        f"single plane ({nic_bps // 10**9}G NIC)",
        title=f"{hosts:,} hosts",
    )
    t.add_row("tiers", "2", single(lambda s: str(s.tiers)))
    t.add_row("switch radix", f"{t0_radix}×{link_gbps}G", single(lambda s: f"{s.radix}×{nic_bps // 10**9}G"))
    t.add_row(
        "switches",
        f"{topo.num_switches():,} ({counts['T0']:,} T0 + {counts['T1']:,} T1)",
        single(lambda s: f"{s.switches:,}"),
    )
    t.add_row("switch hops (max)", "3", single(lambda s: str(2 * s.tiers - 1)))
    t.add_row(
        "switch-to-switch links",
        f"{mp_links:,} × {link_gbps}G",
        single(lambda s: f"{s.switch_links:,} × {nic_bps // 10**9}G"),
    )
    t.add_row("optics (800G-equivalent)", f"{mp_optics:,}", single(lambda s: f"{s.transceivers:,}"))
    t.add_row(
        "paths between two racks",
        f"{planes * topo.uplinks:,}",
        single(lambda s: f"{(s.radix // 2) ** (s.tiers - 1):,}"),
    )
    print_table(console, t)
    if sp is None:
        console.print(f"single plane: none to compare with: {no_sp}")
    example = usid.path_address(0, hosts - 1, planes - 1, topo.uplinks - 1)
    console.print(
        f"{planes} planes × ({topo.t0_per_plane} T0 with {topo.hosts_per_t0} hosts + {topo.uplinks} uplinks, "
        f"{topo.t1_per_plane} T1); model built in {build_s * 1e3:.2f} ms; "
        f"example path host0 → host{hosts - 1}: {example}"
    )
    if out is not None:
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            console.print(f"[red]error:[/] --out {out}: {exc.strerror}")
            raise typer.Exit(1) from None
        (out / "plan.json").write_text(
            json.dumps(
                {
                    **shape,
                    "single_plane": None
                    if sp is None
                    else {
                        "tiers": sp.tiers,
                        "switches": sp.switches,
                        "switch_links": sp.switch_links,
                        "optics": sp.transceivers,
                    },
                    "locator": locator,
                },
                indent=2,
            )
            + "\n"
        )
        t1 = time.perf_counter()
        routes = usid.write_tables(str(out / "tables.jsonl"))
        if linux is None:
            linux = topo.num_nodes() <= LINUX_AUTO_NODES
            if not linux:
                console.print(
                    f"Linux export skipped: {topo.num_nodes():,} nodes (--linux writes a script for each; "
                    "at 137,216 nodes that takes minutes and ~2 GB)"
                )
        scripts = export.write(out) if linux else 0
        console.print(
            f"wrote {routes:,} routes of {topo.num_switches():,} switches"
            + (f" and {scripts:,} Linux scripts ({mode})" if linux else "")
            + f" to {out} in {time.perf_counter() - t1:.1f} s"
        )
