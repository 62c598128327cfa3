"""``openmrc collective``: nccl-tests for MRC (`openmrc.collectives.bench`)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer

from openmrc.cli.perf import parse_percent, parse_size

if TYPE_CHECKING:
    from openmrc.collectives.bench import BenchConfig, Row
    from openmrc.collectives.communicator import Communicator

app = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    help="Collectives over MRC: nccl-tests' benchmark on local ranks (or one rank under torchrun / mpiexec).",
)

_OPS = ("all_reduce", "all_gather", "reduce_scatter", "alltoall", "broadcast", "reduce", "sendrecv")


def _fail(msg: str) -> NoReturn:
    """A bad argument: one line on stderr, exit status 2, before any work."""
    print(f"openmrc collective run: error: {msg}", file=sys.stderr)
    raise typer.Exit(2)


def _size(opt: str, text: str) -> int:
    try:
        return parse_size(text)
    except typer.BadParameter as exc:
        _fail(f"{opt} {exc.message}")


def _rate(text: str) -> float:
    try:
        return parse_percent(text)
    except typer.BadParameter as exc:
        _fail(f"--loss {exc.message}")


def _fail_plane(text: str, planes: int) -> tuple[int, float, float | None]:
    m = re.match(r"^\s*(\d+)\s*@\s*([\d.]+)\s*(ms|s)?\s*(?:\+\s*([\d.]+)\s*(ms|s)?)?\s*$", text)
    if not m:
        _fail(f"--fail-plane {text!r}: expected PLANE@TIME[+DURATION], e.g. 1@2s or 2@500ms+1s")
    plane = int(m.group(1))
    if not 1 <= plane <= planes:
        _fail(f"--fail-plane {text!r}: plane {plane} outside 1..{planes}")
    at = float(m.group(2)) / (1000 if m.group(3) == "ms" else 1)
    heal = None if m.group(4) is None else float(m.group(4)) / (1000 if m.group(5) == "ms" else 1)
    if planes == 1 and heal is None:  # (for a while, with +DURATION, the transport rides it out)
        _fail(
            f"--fail-plane {text}: blackholing the only plane cuts the ranks apart (give --planes 2 or more)"
        )
    return plane, at, heal


def _launched() -> str | None:
    """Which launcher started this process as one rank of a job, if any."""
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        return "torchrun"
    if any(k in os.environ for k in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK")):
        return "mpiexec"
    return None


_CLOSED = "output closed"


def _rank_job(comm: Communicator, cfg: BenchConfig) -> tuple[list[Row], dict[str, Any]] | str:
    """One rank's benchmark and what it used (`settings`); rank 0 prints the table. When the table's reader
    goes away (``| head``) rank 0 stops the job at once: its peers get an abort rather than waiting for it."""
    from openmrc.collectives.bench import OutputClosed, bench, settings

    try:
        return bench(comm, cfg, sys.stdout), settings(comm)
    except OutputClosed:
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # (nothing more to print there)
        comm.abort("the table's reader went away")
        return _CLOSED


# (typer's rich help keeps a docstring's line breaks in the commands list and after its first paragraph, so
# the docstring is one paragraph, and the list shows a short_help of one line)
@app.command(
    short_help="Time a collective from --minbytes to --maxbytes, out of place and in place, as nccl-tests "
    "does."
)
def run(
    ranks: Annotated[
        int, typer.Option("--ranks", "-n", help="local ranks to start (ignored under a launcher)")
    ] = 2,
    op: Annotated[str, typer.Option("--op", help=f"collective: {', '.join(_OPS)}")] = "all_reduce",
    minbytes: Annotated[str, typer.Option("--minbytes", "-b", help="smallest size (8, 64K, 1M ...)")] = "8",
    maxbytes: Annotated[str, typer.Option("--maxbytes", "-e", help="largest size")] = "64M",
    stepfactor: Annotated[int, typer.Option("--stepfactor", "-f", help="size multiplication factor")] = 2,
    stepbytes: Annotated[
        str | None, typer.Option("--stepbytes", "-i", help="size increment (instead of a factor)")
    ] = None,
    iters: Annotated[int, typer.Option("--iters", help="timed calls per size")] = 20,
    warmup: Annotated[int, typer.Option("--warmup", "-w", help="untimed calls per size first")] = 1,
    dtype: Annotated[
        str, typer.Option("--dtype", "-d", help="element type (float32, bfloat16, int8 ...)")
    ] = "float32",
    redop: Annotated[str, typer.Option("--redop", "-o", help="reduction: sum, prod, min, max, avg")] = "sum",
    root: Annotated[int, typer.Option("--root", "-r", help="root of broadcast and reduce")] = 0,
    algo: Annotated[str | None, typer.Option(help="algorithm (default: chosen by size)")] = None,
    check: Annotated[bool, typer.Option("--check/--no-check", "-c", help="count wrong elements")] = True,
    planes: Annotated[int, typer.Option("--planes", "-p", help="planes (UDP endpoints) per rank")] = 2,
    loss: Annotated[str, typer.Option(help="random loss on every plane, both ways (e.g. 1%)")] = "0",
    fail_plane: Annotated[
        str | None, typer.Option(help="PLANE@TIME[+DURATION]: blackhole a plane on every rank, e.g. 1@2s")
    ] = None,
    chunk: Annotated[str, typer.Option(help="pipelining unit (one Write with Immediate)")] = "1M",
    mtu: Annotated[
        str | None,
        typer.Option(help="payload bytes per packet, 256 .. 60K (default: 32K on loopback, else 4K)"),
    ] = None,
    timeout: Annotated[float, typer.Option(help="seconds the whole run may take")] = 1800.0,
    fabric: Annotated[
        str | None,
        typer.Option(
            help="a fabric export (openmrc testbed's): this host's planes and paths (under a launcher)"
        ),
    ] = None,
    json_out: Annotated[bool, typer.Option("--json", help="print the results as JSON, no table")] = False,
    secure: Annotated[
        str | None,
        typer.Option(help="authenticate every packet in the security domain of this key file (perf keygen)"),
    ] = None,
    encrypt: Annotated[bool, typer.Option(help="with --secure: encrypt payloads too")] = False,
) -> None:
    """Time a collective from --minbytes to --maxbytes, out of place and in place, as nccl-tests does. Starts
    --ranks local ranks, each a software MRC NIC with --planes loopback endpoints; under torchrun or mpiexec
    each process is one rank instead. Prints nccl-tests' table: size, count, type, redop, root, then time
    (us), algbw and busbw (GB/s) and #wrong, out of place and in place, and the average bus bandwidth."""
    from openmrc.collectives.algorithms import ALGORITHMS
    from openmrc.collectives.bench import BenchConfig, as_json
    from openmrc.collectives.ops import DTYPES, OPS, dtype_of

    if op not in _OPS:
        _fail(f"--op {op!r}: one of {', '.join(_OPS)}")
    lo, hi = _size("--minbytes", minbytes), _size("--maxbytes", maxbytes)
    if not 0 <= lo <= hi <= 1 << 31:
        _fail(f"--minbytes {minbytes} / --maxbytes {maxbytes}: 0 <= min <= max <= 2G")
    step = _size("--stepbytes", stepbytes) if stepbytes is not None else 0
    if stepbytes is not None and step < 1:
        _fail("--stepbytes: at least 1")
    if step == 0 and stepfactor < 2:
        _fail(f"--stepfactor {stepfactor}: at least 2 (or give --stepbytes)")
    if step == 0 and lo == 0:
        _fail("--minbytes 0: a geometric sweep (--stepfactor) needs --minbytes > 0 (or give --stepbytes)")
    if not 1 <= ranks <= 64:
        _fail(f"--ranks {ranks}: 1..64 local ranks")
    if not 1 <= iters <= 100_000 or not 0 <= warmup <= 100_000:
        _fail(f"--iters {iters} / --warmup {warmup}: iters 1..100000, warmup 0..100000")
    try:
        dtype_of(dtype)
    except ValueError:
        _fail(f"--dtype {dtype!r}: one of {', '.join(DTYPES)}")
    if redop not in OPS:
        _fail(f"--redop {redop!r}: one of {', '.join(OPS)}")
    if algo is not None:
        have = ALGORITHMS.get(op, ())
        if algo not in have:
            _fail(f"--algo {algo!r}: {op} has {', '.join(have) or 'no choice of algorithm'}")
    if not 1 <= planes <= 8:
        _fail(f"--planes {planes}: 1..8")
    chunk_bytes = _size("--chunk", chunk)
    mtu_bytes = None if mtu is None else _size("--mtu", mtu)
    if mtu_bytes is not None and (not 256 <= mtu_bytes <= 60 << 10 or mtu_bytes % 4):
        _fail(f"--mtu {mtu}: a multiple of 4 B in 256 .. 60K")
    if mtu_bytes is not None and fabric is not None:
        _fail("--mtu: a fabric's path MTU is its own (4K); not with --fabric")
    if not 4096 <= chunk_bytes <= 64 << 20 or chunk_bytes % 16:
        _fail(f"--chunk {chunk}: a multiple of 16 B in 4K .. 64M")
    if not 1 <= timeout <= 86_400:
        _fail(f"--timeout {timeout}: 1 .. 86400 s")
    launcher = _launched()
    if fabric is not None and launcher is None:
        _fail("--fabric: each rank on its own host: start it under torchrun or mpiexec on every host")
    if fabric is not None and not os.path.isfile(os.path.join(fabric, "hosts.json")):
        _fail(f"--fabric {fabric}: not a fabric export (no hosts.json)")
    world = ranks if launcher is None else int(os.environ.get("WORLD_SIZE", "0") or 0) or None
    if world is not None and not 0 <= root < world:
        _fail(f"--root {root}: outside 0..{world - 1}")
    fp = _fail_plane(fail_plane, planes) if fail_plane else None
    cfg = BenchConfig(
        op=op,
        minbytes=lo,
        maxbytes=hi,
        stepfactor=stepfactor,
        stepbytes=step,
        iters=iters,
        warmup=warmup,
        dtype=_canonical(dtype),
        redop=redop,
        root=root,
        algo=algo,
        check=check,
        loss=_rate(loss),
        fail_plane=None if fp is None else (fp[0], fp[1]),
        heal_after=None if fp is None else fp[2],
        json=json_out,
    )
    if encrypt and secure is None:
        _fail("--encrypt needs --secure KEYFILE")
    spec = None
    if secure is not None:
        from openmrc.transport import SecurityDomain

        try:
            spec = SecurityDomain.load(secure).spec()
        except ValueError as exc:
            _fail(f"--secure {exc}")
    comm_kwargs: dict[str, Any] = {"planes": planes, "chunk_bytes": chunk_bytes}
    if spec is not None:
        comm_kwargs["security"] = spec
        comm_kwargs["encrypt"] = encrypt
    if mtu_bytes is not None:
        comm_kwargs["mtu"] = mtu_bytes
    rows, used, n = _execute(launcher, ranks, cfg, comm_kwargs, timeout, fabric)
    if rows is not None and json_out:
        json.dump(as_json(rows, cfg, n, used), sys.stdout, indent=2)
        sys.stdout.write("\n")
    if rows is not None and any((r.out_of_place.wrong or 0) + (r.in_place.wrong or 0) for r in rows):
        raise typer.Exit(1)


def _canonical(name: str) -> str:
    from openmrc.collectives.ops import DTYPES, dtype_of

    dt = dtype_of(name)
    return next(k for k, v in DTYPES.items() if v == dt)


def _execute(
    launcher: str | None,
    ranks: int,
    cfg: BenchConfig,
    comm_kwargs: dict[str, Any],
    timeout: float,
    fabric: str | None = None,
) -> tuple[list[Row] | None, dict[str, Any], int]:
    """Run the benchmark; rank 0's rows (None on other ranks of a launched job), what the run used
    (`settings`) and the world size."""
    from openmrc.collectives import CollectiveError, Communicator
    from openmrc.collectives.launch import RankFailed, run_local
    from openmrc.provider.perf import PerfError

    try:
        if launcher is None:
            results = run_local(ranks, _rank_job, cfg, timeout=timeout, comm_kwargs=comm_kwargs)
            if results[0] == _CLOSED:
                return None, {}, ranks
            rows, used = results[0]
            return rows, used, ranks
        if fabric is not None:
            from openmrc.collectives.fabric import fabric_device

            fd = fabric_device(fabric)
            comm_kwargs = {
                "device": fd.device,
                "ev_profile": fd.profile_for,
                "chunk_bytes": comm_kwargs["chunk_bytes"],
                **{k: v for k, v in comm_kwargs.items() if k in ("security", "encrypt")},
            }
        if launcher == "torchrun":
            comm = Communicator.from_env(**comm_kwargs)
        else:
            comm = Communicator.from_mpi(**comm_kwargs)
        with comm:
            done = _rank_job(comm, cfg)
            if isinstance(done, str):
                return None, {}, comm.size
            rows, used = done
            return (rows if comm.rank == 0 else None), used, comm.size
    except RankFailed as exc:
        if exc.outcomes[0] == ("ok", _CLOSED):  # `| head` had what it wanted: stop quietly
            raise typer.Exit(0) from None
        for r, (kind, text) in enumerate(exc.outcomes):
            if kind != "ok":
                print(f"openmrc collective run: rank {r}: {str(text).splitlines()[-1]}", file=sys.stderr)
        raise typer.Exit(1) from None
    except (CollectiveError, PerfError, OSError, TimeoutError, KeyError, ValueError) as exc:
        print(f"openmrc collective run: error: {exc}", file=sys.stderr)
        raise typer.Exit(1) from None
    except KeyboardInterrupt:
        print("openmrc collective run: interrupted", file=sys.stderr)
        raise typer.Exit(130) from None
