"""``openmrc perf``: RDMA Write bandwidth between two software MRC NICs over UDP (like ``ib_write_bw``)."""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import sys
from pathlib import Path
from typing import Annotated

import typer

from openmrc.cli.render import make_console
from openmrc.provider.perf import (
    EV_MODES,
    OOB_PORT,
    Connection,
    IntervalReport,
    PerfError,
    PerfFabric,
    PerfInterrupted,
    SizeResult,
    operation_name,
    run_client,
    serve,
    summarize,
    sweep_sizes,
)
from openmrc.provider.udp import format_endpoint, parse_endpoint
from openmrc.transport import LocalProtocolError, SecurityDomain

app = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    help="RDMA Write bandwidth over the software MRC NIC (UDP, one socket per plane), like ib_write_bw.",
)
console = make_console()
errors = make_console(stderr=True)  # diagnostics: stderr, so that a JSON reader of stdout reads JSON only


def say(line: str) -> None:
    """A line of results as it is (no markup: ``[fd00::2]:18515`` is an endpoint, not a style)."""
    console.print(line, markup=False, highlight=False)


def warn(line: str) -> None:
    errors.print(line, markup=False, highlight=False)


_SIZE = re.compile(r"^\s*(\d+)\s*([kKmMgG]?)(i?[bB])?\s*$")


def parse_size(text: str) -> int:
    """``64K``, ``1M``, ``4096`` -> bytes (K/M/G are powers of 1024, as perftest's ``-s``)."""
    m = _SIZE.match(text)
    if not m:
        raise typer.BadParameter(f"{text!r} is not a size (e.g. 4096, 64K, 1M)")
    return int(m.group(1)) << {"": 0, "k": 10, "m": 20, "g": 30}[m.group(2).lower()]


def parse_percent(text: str) -> float:
    t = text.strip().rstrip("%")
    try:
        v = float(t) / 100 if text.strip().endswith("%") else float(t)
    except ValueError:
        raise typer.BadParameter(f"{text!r} is not a loss rate (e.g. 1% or 0.01)") from None
    if not 0 <= v < 1:
        raise typer.BadParameter(f"{text!r}: a loss rate is 0 .. <100 %")
    return v


def parse_fail(text: str) -> tuple[int, float]:
    m = re.match(r"^\s*(\d+)\s*@\s*([\d.]+)\s*(ms|s)?\s*$", text)
    if not m:
        raise typer.BadParameter(f"{text!r}: expected PORT@TIME, e.g. 2@1s or 3@500ms")
    t = float(m.group(2)) / (1000 if m.group(3) == "ms" else 1)
    return int(m.group(1)), t


def _binds(bind: list[str] | None, planes: int, third: int) -> list[str]:
    if bind:
        try:
            return [f"[{ip}]:{p}" if ":" in ip else f"{ip}:{p}" for ip, p in map(parse_endpoint, bind)]
        except ValueError as exc:
            raise typer.BadParameter(str(exc)) from None
    if not 1 <= planes <= 32:
        raise typer.BadParameter(f"--planes {planes}: 1..32")
    return [f"127.0.{third}.{p}" for p in range(1, planes + 1)]


PlanesOpt = Annotated[int, typer.Option("--planes", "-p", help="ports (planes) when no --bind is given")]
BindOpt = Annotated[
    list[str] | None,
    typer.Option("--bind", "-b", help="one endpoint per plane, in plane order: ADDR or ADDR:PORT (repeat)"),
]
RateOpt = Annotated[float, typer.Option(help="rate of one port, Gb/s (pacing and congestion control)")]
FabricOpt = Annotated[
    str | None,
    typer.Option(
        help="a fabric export (topo plan --out, testbed up): find this host in it, bind its addresses "
        "when no --bind is given, and allow --ev-mode srv6"
    ),
]


SecureOpt = Annotated[
    Path | None,
    typer.Option(
        "--secure",
        help="authenticate every packet in the security domain of this key file (`openmrc perf keygen`)",
        dir_okay=False,
    ),
]


MAX_LINK_GBPS = 1600.0  # the fastest NIC port of today


def _check_rate(link_gbps: float) -> None:
    """A port rate the NIC can take, checked before any work (a usage error, exit 2)."""
    if not math.isfinite(link_gbps) or not 0.01 <= link_gbps <= MAX_LINK_GBPS:
        raise typer.BadParameter(f"--link-gbps {link_gbps:g}: a port rate in 0.01 .. {MAX_LINK_GBPS:g} Gb/s")


def _domain(path: Path | None) -> SecurityDomain | None:
    """The security domain a key file holds; a usage error (exit 2) if it cannot be read."""
    if path is None:
        return None
    try:
        return SecurityDomain.load(path)
    except ValueError as exc:
        raise typer.BadParameter(f"--secure {exc}") from None


@app.command(short_help="Write a new security domain (an identifier and a random key) for `perf --secure`.")
def keygen(
    path: Annotated[Path, typer.Argument(help="the key file to write (readable by its owner only)")],
    sdi: Annotated[int, typer.Option(help="the security domain's identifier, 1 .. 4294967295")] = 1,
    force: Annotated[bool, typer.Option(help="replace the file if it exists")] = False,
) -> None:
    """Write a new security domain (its identifier and a random 256-bit key) for `perf --secure`: copy the
    file to the other host out of band (it is a secret)."""
    if not 1 <= sdi <= 0xFFFFFFFF:
        raise typer.BadParameter(f"--sdi {sdi}: 1 .. 4294967295")
    if not str(path) or path == Path(".") or path.is_dir():
        raise typer.BadParameter(f"{str(path)!r}: a directory, not a key file's name")
    if os.path.lexists(path) and not force:  # (a symbolic link too, dangling or not)
        raise typer.BadParameter(f"{path} exists (--force replaces it)")
    dom = SecurityDomain.generate(sdi)
    try:
        if force:  # replaced, never written through: a link is removed, not followed to its target
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        os.fchmod(fd, 0o600)  # (whatever the umask)
        with os.fdopen(fd, "w") as f:
            f.write(dom.spec() + "\n")
    except OSError as exc:
        raise typer.BadParameter(f"{path}: {exc.strerror or exc}") from None
    console.print(f"security domain {sdi}: key written to {path} (fingerprint {dom.fingerprint()})")


def _locate(fabric: str | None, bind: list[str] | None) -> PerfFabric | None:
    if fabric is None:
        return None
    try:
        return PerfFabric.locate(fabric, bind)
    except (PerfError, ValueError) as exc:
        raise typer.BadParameter(f"--fabric: {exc}") from None


@app.command(short_help="Wait for perf clients (default: 4 planes on 127.0.1.1-4; --bind or --fabric).")
def server(
    planes: PlanesOpt = 4,
    bind: BindOpt = None,
    oob_port: Annotated[int, typer.Option(help="TCP port for the out-of-band exchange")] = OOB_PORT,
    oob_bind: Annotated[str, typer.Option(help="TCP address to listen on (:: is IPv6 and IPv4)")] = "::",
    once: Annotated[bool, typer.Option(help="exit after one client")] = False,
    link_gbps: RateOpt = 25.0,
    fabric: FabricOpt = None,
    secure: SecureOpt = None,
) -> None:
    """Wait for perf clients. Default: 4 planes on 127.0.1.1-4 (one machine); on real hosts give one
    --bind per plane interface address (or --fabric)."""
    _check_rate(link_gbps)
    fab = _locate(fabric, bind)
    binds = fab.binds() if fab is not None and not bind else _binds(bind, planes, 1)
    if not 1 <= oob_port <= 65535:
        raise typer.BadParameter(f"--oob-port {oob_port}: 1..65535")
    domain = _domain(secure)
    try:
        serve(
            binds,
            oob=(oob_bind, oob_port),
            once=once,
            link_gbps=link_gbps,
            log=say,
            warn=warn,
            fabric=fab,
            security=domain,
        )
    except (LocalProtocolError, OSError) as exc:
        warn(f"error: {exc}")
        raise typer.Exit(1) from None
    except KeyboardInterrupt:
        errors.print("interrupted")
        raise typer.Exit(130) from None


@app.command()
def client(
    host: Annotated[str, typer.Argument(help="the server's out-of-band (TCP) address")],
    planes: PlanesOpt = 4,
    bind: BindOpt = None,
    size: Annotated[str, typer.Option("--size", "-s", help="message size (e.g. 4096, 64K, 1M)")] = "64K",
    sweep: Annotated[bool, typer.Option("--sweep", "-a", help="every size 2 B .. 8 MiB")] = False,
    qps: Annotated[int, typer.Option("--qps", "-q", help="QPs (round-robin)")] = 1,
    iters: Annotated[
        int | None, typer.Option("--iters", "-n", help="messages per size (default: ~64 MiB)")
    ] = None,
    imm: Annotated[bool, typer.Option(help="RDMA Write with immediate")] = False,
    loss: Annotated[str, typer.Option(help="random loss both ways, e.g. 1%")] = "0",
    fail_port: Annotated[str | None, typer.Option(help="PORT@TIME: blackhole a plane, e.g. 2@1s")] = None,
    tx_depth: Annotated[int, typer.Option(help="Writes outstanding at most")] = 128,
    oob_port: Annotated[int, typer.Option(help="the server's TCP port")] = OOB_PORT,
    json_out: Annotated[bool, typer.Option("--json", help="print results as JSON, no table")] = False,
    link_gbps: RateOpt = 25.0,
    ev_mode: Annotated[
        str, typer.Option(help="EVs: udp (source ports), stev (+ IPv6 flow labels), srv6 (uSID paths)")
    ] = "udp",
    evs: Annotated[int | None, typer.Option(help="EVs per QP (default: 64 STEV, every SRv6 path)")] = None,
    fabric: FabricOpt = None,
    duration: Annotated[
        float | None, typer.Option("--duration", "-D", help="write --size for this many seconds")
    ] = None,
    interval_ms: Annotated[
        float, typer.Option(help="with --duration: report goodput and EV states this often")
    ] = 100.0,
    secure: SecureOpt = None,
    encrypt: Annotated[bool, typer.Option(help="with --secure: encrypt payloads too (AES-GCM)")] = False,
    header_tag: Annotated[
        bool | None,
        typer.Option(
            help="with --secure: header tags on every data packet, so that a trimmed packet is verified "
            "(--no-header-tag: never; default: from the first trimmed packet the server could not "
            "verify, so only a fabric that trims pays their AES-GCM call per packet)",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Measure RDMA Write bandwidth to a perf server. Default: 4 planes on 127.0.2.1-4."""
    _check_rate(link_gbps)
    fab = _locate(fabric, bind)
    binds = fab.binds() if fab is not None and not bind else _binds(bind, planes, 2)
    if ev_mode not in EV_MODES:
        raise typer.BadParameter(f"--ev-mode {ev_mode!r}: one of {', '.join(EV_MODES)}")
    if ev_mode == "srv6" and (fab is None or not fab.fabric.srv6):
        raise typer.BadParameter("--ev-mode srv6 needs --fabric DIR, an export with SRv6 (not --mode ecmp)")
    if evs is not None and not 1 <= evs <= 4096:
        raise typer.BadParameter(f"--evs {evs}: 1..4096")
    if duration is not None and (sweep or not 0 < duration <= 3600):
        raise typer.BadParameter(f"--duration {duration}: 0 < seconds <= 3600, one --size (no --sweep)")
    if not 1 <= interval_ms <= 60_000:
        raise typer.BadParameter(f"--interval-ms {interval_ms}: 1 .. 60000")
    sizes = sweep_sizes() if sweep else [parse_size(size)]
    if not 1 <= qps <= 64:
        raise typer.BadParameter(f"--qps {qps}: 1..64")
    if iters is not None and iters < 1:
        raise typer.BadParameter(f"--iters {iters}: at least 1")
    if not 1 <= tx_depth <= 4096:
        raise typer.BadParameter(f"--tx-depth {tx_depth}: 1..4096")
    loss_rate = parse_percent(loss)
    fail = parse_fail(fail_port) if fail_port else None
    if (encrypt or header_tag is not None) and secure is None:
        raise typer.BadParameter("--encrypt and --[no-]header-tag need --secure KEYFILE")
    domain = _domain(secure)

    header_due = True  # the table's header, printed with its first row (not above a connection error)
    ticks: list[IntervalReport] = []
    tick_header_due = True

    def row(r: SizeResult) -> None:
        nonlocal header_due
        if json_out:
            return
        if duration is not None:
            _summary(summarize(ticks), qps)
        if header_due:
            header_due = False
            say(
                f"{'#bytes':>10} {'#iterations':>12} {'BW peak[Gb/s]':>14} {'BW average[Gb/s]':>17}"
                f" {'MsgRate[Mpps]':>14} {'retx':>6} {'EV changes':>10}"
            )
        say(
            f"{r.bytes:>10} {r.iterations:>12} {r.bw_peak_gbps:>14.2f} {r.bw_avg_gbps:>17.2f}"
            f" {r.msg_rate_mpps:>14.6f} {r.retransmits:>6} {r.ev_state_changes:>10}"
        )

    def tick(r: IntervalReport) -> None:  # JSON has the wall clock too (`IntervalReport.t`)
        nonlocal tick_header_due
        if json_out:
            sys.stdout.write(json.dumps({"interval": r.__dict__}) + "\n")
            sys.stdout.flush()
            return
        ticks.append(r)
        if r.end - r.start < interval_ms / 10_000:  # the run's last moments: in the summary only (iperf3)
            return
        if tick_header_due:
            tick_header_due = False
            say(_INTERVAL_HEADER)
        say(_interval_line(r, qps))

    def connected(c: Connection) -> None:
        if not json_out:
            for line in c.lines():
                say(line)

    if not json_out:
        say(
            f"openmrc perf: {operation_name(imm)}, {len(binds)} planes, {qps} QP(s), {ev_mode} EVs"
            + _run_modes(domain, encrypt, duration, loss_rate, fail)
            + f", server {format_endpoint((host, oob_port))}"
        )
    try:
        rep = run_client(
            (host, oob_port),
            binds,
            sizes,
            iters=iters,
            qps=qps,
            imm=imm,
            loss=loss_rate,
            fail_port=fail,
            tx_depth=tx_depth,
            link_gbps=link_gbps,
            on_result=row,
            ev_mode=ev_mode,
            evs=evs,
            fabric=fab,
            duration=duration,
            interval=interval_ms / 1000,
            on_interval=tick if duration is not None else None,
            security=domain,
            encrypt=encrypt,
            header_tag="auto" if header_tag is None else header_tag,
            on_connect=connected,
        )
    except (PerfError, LocalProtocolError, OSError) as exc:
        warn(f"error: {exc}")
        raise typer.Exit(1) from None
    except PerfInterrupted as stopped:  # what ran so far, then the exit code of an interrupt
        if json_out:
            json.dump(stopped.report.as_dict(), sys.stdout, indent=2)
            sys.stdout.write("\n")
        elif stopped.report.summary is not None:
            _summary(stopped.report.summary, qps)
        warn("interrupted")
        raise typer.Exit(130) from None
    except KeyboardInterrupt:
        warn("interrupted")
        raise typer.Exit(130) from None
    if json_out:
        json.dump(rep.as_dict(), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        verdict = "[green]matches[/]" if rep.hash_ok else "[red]DIFFERS[/]"
        console.print(f"server buffer SHA-256 {verdict} what was written")
    if not rep.hash_ok:
        raise typer.Exit(2)


def _run_modes(
    domain: SecurityDomain | None,
    encrypt: bool,
    duration: float | None,
    loss: float,
    fail: tuple[int, float] | None,
) -> str:
    """The header's words for how the run differs from a plain sweep (security, duration, impairments)."""
    out = ""
    if domain is not None:
        out += f", {'encrypted' if encrypt else 'authenticated'} (domain {domain.sdi})"
    if duration is not None:
        out += f", for {duration:g} s"
    if loss:
        out += f", {loss:.2%} loss both ways"
    if fail is not None:
        out += f", port {fail[0]} fails at {fail[1]:g} s"
    return out


# a duration run's lines, as iperf3 prints its intervals
_INTERVAL_HEADER = "[ ID] Interval           Transfer     Bitrate         Retr  EVs good/bad/held"


def _scaled(value: float, base: int, units: tuple[str, ...]) -> str:
    """iperf3's figures: three significant digits in the unit that keeps them below ``base``."""
    i = 0
    while value >= base and i < len(units) - 1:
        value /= base
        i += 1
    digits = 2 if value < 9.995 else 1 if value < 99.95 else 0
    return f"{value:.{digits}f} {units[i]}"


def _interval_line(r: IntervalReport, qps: int) -> str:
    transfer = _scaled(r.bytes, 1024, ("Bytes", "KBytes", "MBytes", "GBytes", "TBytes"))
    rate = _scaled(r.gbps * 1e9, 1000, ("bits/sec", "Kbits/sec", "Mbits/sec", "Gbits/sec", "Tbits/sec"))
    ident = "SUM" if qps > 1 else "1"  # (the QPs' intervals summed)
    return (
        f"[{ident:>3}] {r.start:6.2f}-{r.end:<6.2f} sec  {transfer:>11}  {rate:>14}  {r.retransmits:>4}"
        f"  {r.evs_good}/{r.evs_bad}/{r.evs_held}"
    )


def _summary(total: IntervalReport | None, qps: int) -> None:
    """The whole run as one interval, under a rule (iperf3's summary)."""
    if total is None:
        return
    say(" ".join("-" * 38))
    say(_INTERVAL_HEADER)
    say(_interval_line(total, qps) + "  sender")
