"""nccl-tests for MRC: time a collective over a range of sizes, out of place and in place, check the result,
and report as nccl-tests does (its table, its bus-bandwidth factors, its footer).

Sizes follow nccl-tests: ``size`` is the larger buffer in bytes; for all_gather, reduce_scatter and alltoall
the per-rank ``count`` is size / ranks / element size, rounded down to 16 bytes. Times are the mean over
``iters`` calls after ``warmup`` calls, averaged over the ranks; algbw = bytes / time (GB/s, 10^9 B);
busbw = algbw · factor: all_reduce 2(n-1)/n; all_gather, reduce_scatter, alltoall (n-1)/n; broadcast,
reduce, sendrecv 1. ``#wrong`` counts the elements that differ from the expected result after one more
call with fresh inputs (summed over the ranks); inputs are small integers, so every type and every
reduction order gives an exact expected value.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Final, TextIO

import numpy as np

from openmrc.collectives.communicator import Communicator
from openmrc.collectives.ops import dtype_of, finish_avg, ufunc_of

__all__ = [
    "BENCH_OPS",
    "BenchConfig",
    "Row",
    "bench",
    "busbw_factor",
    "devices",
    "format_header",
    "format_row",
    "settings",
    "sizes",
]

BENCH_OPS: Final = (
    "all_reduce",
    "all_gather",
    "reduce_scatter",
    "alltoall",
    "broadcast",
    "reduce",
    "sendrecv",
)
_REDUCING: Final = ("all_reduce", "reduce_scatter", "reduce")
_ROOTED: Final = ("broadcast", "reduce")
# nccl-tests' type names
_TYPE_NAMES: Final = {"float32": "float", "float16": "half", "float64": "double"}


def busbw_factor(op: str, n: int) -> float:
    if op == "all_reduce":
        return 2 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter", "alltoall"):
        return (n - 1) / n
    return 1.0


def sizes(lo: int, hi: int, factor: int = 2, step: int = 0) -> list[int]:
    """``lo``, ``lo·factor`` … up to ``hi`` (or ``lo``, ``lo+step`` … with ``step``)."""
    out, s = [], lo
    while s <= hi:
        out.append(s)
        s = s + step if step else s * factor
    return out


@dataclass
class BenchConfig:
    """One ``openmrc collective run``: the operation, the sizes and how to measure."""

    op: str = "all_reduce"
    minbytes: int = 8
    maxbytes: int = 64 << 20
    stepfactor: int = 2
    stepbytes: int = 0
    iters: int = 20
    warmup: int = 1
    dtype: str = "float32"
    redop: str = "sum"
    root: int = 0
    algo: str | None = None
    check: bool = True
    loss: float = 0.0
    fail_plane: tuple[int, float] | None = None
    heal_after: float | None = None
    json: bool = False


@dataclass
class Result:
    time_us: float
    algbw: float
    busbw: float
    wrong: int | None


@dataclass
class Row:
    size: int
    count: int
    type: str
    redop: str
    root: int
    out_of_place: Result
    in_place: Result
    retransmits: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


def _counts(op: str, size: int, n: int, itemsize: int) -> tuple[int, int, int]:
    """(per-call parameter count, send elements, receive elements) for a size in bytes (nccl-tests)."""
    count = size // itemsize
    if op in ("all_gather", "reduce_scatter", "alltoall"):
        align = max(1, 16 // itemsize)
        base = (count // n) // align * align
        if op == "all_gather":
            return base, base, base * n
        if op == "reduce_scatter":
            return base, base * n, base
        return base, base * n, base * n
    return count, count, count


def _inputs(rank: int, count: int, dt: np.dtype[Any], salt: int) -> np.ndarray[Any, Any]:
    """Small integers: exact in every type, and for sums, products and extremes of a few ranks."""
    i = np.arange(count, dtype=np.int64)
    v = (i * 7 + rank * 13 + salt) % 5
    return (v - (0 if dt.kind == "u" else 2)).astype(dt)


class _Case:
    """One size of one operation: buffers, the call, and its expected result."""

    def __init__(self, comm: Communicator, cfg: BenchConfig, size: int) -> None:
        self.comm, self.cfg = comm, cfg
        self.dt = dtype_of(cfg.dtype)
        n = comm.size
        self.count, self.ns, self.nr = _counts(cfg.op, size, n, self.dt.itemsize)
        self.size = max(self.ns, self.nr) * self.dt.itemsize
        self.send = _inputs(comm.rank, self.ns, self.dt, 0)
        self.recv = np.zeros(self.nr, self.dt)

    def call(self, inplace: bool) -> np.ndarray[Any, Any]:
        c, cfg, op, r = self.comm, self.cfg, self.cfg.op, self.comm.rank
        n, algo = c.size, cfg.algo
        if op == "all_reduce":
            if inplace:
                c.all_reduce(self.recv, op=cfg.redop, algo=algo)
            else:
                c.all_reduce(self.send, self.recv, op=cfg.redop, algo=algo)
        elif op == "all_gather":
            if inplace:
                c.all_gather(self.recv[r * self.count : (r + 1) * self.count], self.recv)
            else:
                c.all_gather(self.send, self.recv)
        elif op == "reduce_scatter":
            if inplace:  # nccl-tests' in place: the result is this rank's segment of the input
                c.reduce_scatter(self.send, self.send[r * self.count : (r + 1) * self.count], op=cfg.redop)
                return self.send[r * self.count : (r + 1) * self.count]
            c.reduce_scatter(self.send, self.recv, op=cfg.redop)
        elif op == "alltoall":
            c.alltoall(self.send, self.recv)
        elif op == "broadcast":
            if not inplace and r == cfg.root:
                np.copyto(self.recv, self.send)
            c.broadcast(self.recv, root=cfg.root, algo=algo)
        elif op == "reduce":
            if inplace:
                c.reduce(self.recv, None, op=cfg.redop, root=cfg.root, algo=algo)
            else:
                c.reduce(self.send, self.recv, op=cfg.redop, root=cfg.root, algo=algo)
        else:  # sendrecv: to the next rank, from the previous one
            if n == 1:
                np.copyto(self.recv, self.send)
            else:
                c.sendrecv(self.send, (r + 1) % n, self.recv, (r - 1) % n)
        return self.recv

    def prepare(self, inplace: bool, salt: int) -> None:
        """Fresh inputs where the call reads them (in place: in the receive buffer)."""
        r, op = self.comm.rank, self.cfg.op
        self.send[:] = _inputs(r, self.ns, self.dt, salt)
        if not inplace:
            self.recv[:] = 0
            return
        if op in ("all_reduce", "reduce", "broadcast"):
            self.recv[:] = self.send
        elif op == "all_gather":
            self.recv[:] = 0
            self.recv[r * self.count : (r + 1) * self.count] = self.send
        else:
            self.recv[:] = 0

    def expected(self, salt: int) -> np.ndarray[Any, Any] | None:
        """What this rank's receive buffer must hold (None: nothing is defined there)."""
        c, cfg, op = self.comm, self.cfg, self.cfg.op
        n, r = c.size, c.rank
        if op in ("all_reduce", "reduce", "reduce_scatter"):
            if op == "reduce" and r != cfg.root:
                return None
            uf = ufunc_of(cfg.redop)
            acc = _inputs(0, self.ns, self.dt, salt)
            for k in range(1, n):
                acc = uf(acc, _inputs(k, self.ns, self.dt, salt))
            if cfg.redop == "avg":
                finish_avg(acc, n)
            return acc[r * self.count : (r + 1) * self.count] if op == "reduce_scatter" else acc
        if op == "all_gather":
            return np.concatenate([_inputs(k, self.count, self.dt, salt) for k in range(n)])
        if op == "alltoall":
            k = self.count
            return np.concatenate([_inputs(j, self.ns, self.dt, salt)[r * k : (r + 1) * k] for j in range(n)])
        if op == "broadcast":
            return _inputs(cfg.root, self.ns, self.dt, salt)
        return _inputs((r - 1) % n, self.ns, self.dt, salt) if n > 1 else _inputs(r, self.ns, self.dt, salt)


def _mean_over_ranks(comm: Communicator, v: float) -> float:
    x = np.array([v], np.float64)
    comm.all_reduce(x, op="avg")
    return float(x[0])


def _sum_over_ranks(comm: Communicator, v: int) -> int:
    x = np.array([v], np.int64)
    comm.all_reduce(x)
    return int(x[0])


def _measure(case: _Case, inplace: bool) -> Result:
    comm, cfg = case.comm, case.cfg
    n = comm.size
    case.prepare(inplace, 0)
    with np.errstate(all="ignore"):  # in place, call after call, values grow: only the time counts here
        for _ in range(cfg.warmup):
            case.call(inplace)
        comm.barrier()
        t0 = time.perf_counter()
        for _ in range(cfg.iters):
            case.call(inplace)
        sec = _mean_over_ranks(comm, (time.perf_counter() - t0) / max(cfg.iters, 1))
    wrong: int | None = None
    if cfg.check:
        case.prepare(inplace, 1)
        got = case.call(inplace)
        want = case.expected(1)
        mine = 0 if want is None else int(np.count_nonzero(got != want))
        wrong = _sum_over_ranks(comm, mine)
    base = case.count * case.dt.itemsize
    if cfg.op in ("all_gather", "reduce_scatter", "alltoall"):
        base *= n
    algbw = base / 1e9 / sec if sec > 0 else 0.0
    return Result(sec * 1e6, algbw, algbw * busbw_factor(cfg.op, n), wrong)


def _faults(comm: Communicator, cfg: BenchConfig) -> None:
    dev = comm.device
    if cfg.loss:
        dev.impair(None, loss=cfg.loss)
    if cfg.fail_plane is not None:
        plane, at = cfg.fail_plane
        timer = threading.Timer(at, dev.blackhole_port, args=(plane, cfg.heal_after))
        timer.daemon = True
        timer.start()


def _redop_root(cfg: BenchConfig) -> tuple[str, int]:
    """The redop and root as nccl-tests shows them: "none" for an operation that reduces nothing, -1 for one
    without a root."""
    return (cfg.redop if cfg.op in _REDUCING else "none"), (cfg.root if cfg.op in _ROOTED else -1)


class OutputClosed(Exception):
    """The table's reader went away (``openmrc collective run … | head``)."""


def _emit(out: TextIO, text: str) -> None:
    try:
        out.write(text)
        out.flush()
    except BrokenPipeError:
        raise OutputClosed from None


def bench(comm: Communicator, cfg: BenchConfig, out: TextIO | None = None) -> list[Row]:
    """Run ``cfg`` on this rank (every rank calls it); rank 0 writes the table to ``out`` row by row."""
    show = out is not None and comm.rank == 0 and not cfg.json
    ranks = None if cfg.json else devices(comm)  # (every rank or none: it is a collective)
    if show:
        assert out is not None
        _emit(out, format_header(comm, cfg, ranks))
    _faults(comm, cfg)
    rows: list[Row] = []
    for size in sizes(cfg.minbytes, cfg.maxbytes, cfg.stepfactor, cfg.stepbytes):
        case = _Case(comm, cfg, size)
        retx0 = comm.device.nic.stats.retransmits if hasattr(comm.device, "nic") else 0
        oop = _measure(case, False)
        inp = _measure(case, True)
        retx = (comm.device.nic.stats.retransmits if hasattr(comm.device, "nic") else 0) - retx0
        row = Row(
            case.size,
            case.count,
            _TYPE_NAMES.get(cfg.dtype, cfg.dtype),
            *_redop_root(cfg),
            oop,
            inp,
            _sum_over_ranks(comm, retx),
        )
        rows.append(row)
        if show:
            assert out is not None
            _emit(out, format_row(row) + "\n")
    if show:
        assert out is not None
        _emit(out, format_footer(rows, cfg))
    return rows


def _num(v: float, width: int) -> str:
    """nccl-tests' number cell: 2 decimals if they fit, then 1, then 0, then an exponent."""
    for fmt in ("{:>{w}.2f}", "{:>{w}.1f}", "{:>{w}.0f}"):
        s = fmt.format(v, w=width)
        if len(s) <= width:
            return s
    return "{:>{w}.{p}e}".format(v, w=width, p=1 if width >= 7 else 0)


def _cell(r: Result) -> str:
    wrong = "   N/A" if r.wrong is None else f"{r.wrong:>6d}"
    return f"  {_num(r.time_us, 7)}  {_num(r.algbw, 6)}  {_num(r.busbw, 6)}  {wrong}"


def format_row(row: Row) -> str:
    pre = f"{row.size:>12d}  {row.count:>12d}  {row.type:>8s}  {row.redop:>6s}  {row.root:>6d}"
    return pre + _cell(row.out_of_place) + _cell(row.in_place)


def _device(comm: Communicator) -> dict[str, Any]:
    """This rank's line of the header's "Using devices": its process, host and endpoints."""
    ends = [
        f"{ip}:{port}" if ":" not in ip else f"[{ip}]:{port}"
        for ip, port in getattr(comm.device, "endpoints", list)()
    ]
    return {"rank": comm.rank, "pid": os.getpid(), "host": socket.gethostname(), "endpoints": ends}


def devices(comm: Communicator) -> list[dict[str, Any]]:
    """Every rank's `_device`, in rank order (a collective: every rank calls it)."""
    mine = np.frombuffer(json.dumps(_device(comm)).encode(), np.uint8)
    width = np.array([mine.size], np.int64)
    comm.all_reduce(width, op="max")
    padded = np.full(int(width[0]), ord(" "), np.uint8)  # (blanks after JSON are whitespace to it)
    padded[: mine.size] = mine
    every = np.empty(comm.size * padded.size, np.uint8)
    comm.all_gather(padded, every)
    return [json.loads(row.tobytes()) for row in every.reshape(comm.size, -1)]


def settings(comm: Communicator) -> dict[str, Any]:
    """What the run used, as resolved (defaults and a fabric's included): planes, packet payload, chunk,
    and the security domain (its identifier and key fingerprint, never the key; None: unauthenticated)."""
    return {
        "planes": len(getattr(comm.device, "endpoints", list)()),
        "mtu": comm.mtu,
        "chunk_bytes": comm.chunk_bytes,
        "security": _security(comm),
    }


def _security(comm: Communicator) -> dict[str, Any] | None:
    dom = comm.security
    if dom is None:
        return None
    return {"sdi": dom.sdi, "fingerprint": dom.fingerprint(), "encrypt": comm.encrypt}


def format_header(comm: Communicator, cfg: BenchConfig, ranks: list[dict[str, Any]] | None = None) -> str:
    """nccl-tests' header; "Using devices" lists ``ranks`` (`devices`), or without them this rank alone."""
    step = f"{cfg.stepbytes}(bytes)" if cfg.stepbytes else f"{cfg.stepfactor}(factor)"
    lines = [
        f"# openmrc collective: {cfg.op} over MRC ({comm.size} ranks)",
        f"# nThread 1 nGpus 1 minBytes {cfg.minbytes} maxBytes {cfg.maxbytes} step: {step} warmup iters: "
        f"{cfg.warmup} iters: {cfg.iters} agg iters: 1 validation: {int(cfg.check)} graph: 0",
        "#",
        "# Using devices",
    ]
    lines += [
        f"#  Rank {d['rank']:>2d} Group  0 Pid {d['pid']:>6d} on {d['host']:>10s} device  0 "
        f"[mrc] {' '.join(d['endpoints'])}"
        for d in (ranks if ranks is not None else [_device(comm)])
    ]
    sec = _security(comm)
    if sec is not None:
        how = "authenticated and encrypted" if sec["encrypt"] else "authenticated"
        lines.append(f"# Security: every packet {how}, domain {sec['sdi']} (key {sec['fingerprint']})")
    if cfg.loss or cfg.fail_plane:
        what = []
        if cfg.loss:
            what.append(f"{cfg.loss:.2%} loss on every plane, both ways")
        if cfg.fail_plane:
            heal = f", healed after {cfg.heal_after:g} s" if cfg.heal_after else ""
            what.append(f"plane {cfg.fail_plane[0]} blackholed at {cfg.fail_plane[1]:g} s{heal}")
        lines.append("# Faults: " + "; ".join(what))
    blank = f"# {'':>10s}  {'':>12s}  {'':>8s}  {'':>6s}  {'':>6s}"
    lines += [
        "#",
        blank + "           out-of-place                       in-place          ",
        f"# {'size':>10s}  {'count':>12s}  {'type':>8s}  {'redop':>6s}  {'root':>6s}"
        f"  {'time':>7s}  {'algbw':>6s}  {'busbw':>6s}  {'#wrong':>6s}"
        f"  {'time':>7s}  {'algbw':>6s}  {'busbw':>6s}  {'#wrong':>6s} ",
        f"# {'(B)':>10s}  {'(elements)':>12s}  {'':>8s}  {'':>6s}  {'':>6s}  {'(us)':>7s}  {'(GB/s)':>6s}"
        f"  {'(GB/s)':>6s}  {'':>6s}  {'(us)':>7s}  {'(GB/s)':>6s}  {'(GB/s)':>6s}  {'':>6s} ",
    ]
    return "\n".join(lines) + "\n"


def avg_busbw(rows: list[Row]) -> float:
    """nccl-tests' average: the mean bus bandwidth of every measurement, out of place and in place."""
    return sum(r.out_of_place.busbw + r.in_place.busbw for r in rows) / (2 * len(rows)) if rows else 0.0


def wrong_total(rows: list[Row]) -> int:
    return sum((r.out_of_place.wrong or 0) + (r.in_place.wrong or 0) for r in rows)


def format_footer(rows: list[Row], cfg: BenchConfig) -> str:
    bad = wrong_total(rows)
    return (
        f"# {'Out of bounds values':<20s} : {bad} {'FAILED' if bad else 'OK'}\n"
        f"# {'Avg bus bandwidth':<20s} : {avg_busbw(rows):g} \n"
        "#\n"
        f"# Collective test concluded: {cfg.op}\n"
    )


def as_json(
    rows: list[Row], cfg: BenchConfig, ranks: int, used: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The run as JSON: ``config`` is ``cfg`` with its redop and root as the rows show them (`_redop_root`)
    and what the run ``used`` (`settings`)."""
    config = {k: v for k, v in asdict(cfg).items() if k != "json"}
    config["redop"], config["root"] = _redop_root(cfg)
    return {
        "op": cfg.op,
        "ranks": ranks,
        "config": {**config, **(used or {})},
        "results": [asdict(r) for r in rows],
        "out_of_bounds": wrong_total(rows),
        "average_bus_bandwidth": avg_busbw(rows),
    }
