"""Parameter sweeps: every point of a scenario's grid (variant × `[sweep]` combination × seed) in a worker of
its own, on a local process pool or a Ray cluster, resumable.

Theory of operation. `plan` resolves the grid into `Point`s, each a validated scenario document of one run
with a digest of that document. `run_sweep` hands the points to a pool (`LocalPool`: a
`ProcessPoolExecutor` whose workers start fresh, by forkserver or spawn; `RayPool`: the same worker
function as a Ray task) and writes each point's record to ``points/<name>.json`` (by atomic replace) the
moment it comes back, so a sweep stopped in any way keeps what finished. A later sweep into the same
directory skips a point whose record says it finished with the same digest: a changed point (another value,
another `--set`) runs again, and so does one that failed. A point that raises is recorded with its error;
the others go on. `write_tables` gathers the records into ``sweep.csv`` and ``sweep.json`` and
`plot_dimensions` draws one PNG per sweep dimension (docs/results.md).
"""

from __future__ import annotations

import concurrent.futures as cf
import copy
import csv
import hashlib
import importlib
import json
import math
import multiprocessing
import os
import signal
import statistics
import time
import tomllib
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from openmrc import _native
from openmrc.sim.results_files import file_prefixes
from openmrc.sim.scenario import ScenarioError, expand_runs, iter_runs, validate

__all__ = [
    "FIGURES",
    "LocalPool",
    "Point",
    "Pool",
    "RayPool",
    "SweepError",
    "SweepInterrupted",
    "SweepSummary",
    "finished_records",
    "plan",
    "plot_dimensions",
    "rows",
    "run_point",
    "run_sweep",
    "with_dimensions",
    "write_tables",
]

FIGURES = (
    "completed",
    "flows",
    "job_time_us",
    "job_goodput_gbps",
    "median_fct_us",
    "p99_fct_us",
    "max_fct_us",
    "retransmits",
    "trims",
    "drops",
    "losses",
    "victim_slowdown",
    "ev_to_bad",
)
"""The report figures a sweep's table carries (a point whose report lacks one leaves it empty)."""

PLOTTED = ("job_time_us", "max_fct_us", "retransmits")
"""The figures drawn against each sweep dimension, one panel each."""


class SweepError(RuntimeError):
    """A sweep that cannot start (no Ray, a cluster that cannot be reached): one line."""


@dataclass(frozen=True, slots=True)
class Point:
    """One run of a sweep: its label, file name, variant, seed, the values of the sweep's dimensions, the
    resolved scenario document, and that document's digest."""

    label: str
    name: str
    variant: str
    seed: int
    values: dict[str, Any]
    doc: dict[str, Any]
    digest: str


def _get(doc: Any, key: str) -> Any:
    for part in key.split("."):
        doc = doc[int(part)] if isinstance(doc, list) else doc[part]
    return doc


def digest(doc: dict[str, Any]) -> str:
    """What identifies a point's run: a hash of its resolved document (not of where the scenario lives)."""
    text = json.dumps({k: v for k, v in doc.items() if k != "_dir"}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def with_dimensions(doc: dict[str, Any], assignments: Sequence[str]) -> dict[str, Any]:
    """``doc`` with more sweep dimensions (``key=[v1, v2]``, values as TOML), validated again."""
    d = copy.deepcopy(doc)
    dims = d.setdefault("sweep", {})
    for a in assignments:
        key, sep, value = a.partition("=")
        try:
            values = tomllib.loads(f"v = {value}")["v"] if sep else None
        except tomllib.TOMLDecodeError:
            values = None
        if not isinstance(values, list) or not values:
            raise ScenarioError(f"--sweep {a!r}: expected key=[value, ...] (a TOML list)")
        dims[key.strip()] = values
    d = validate(d)
    expand_runs(d)
    return d


def plan(
    doc: dict[str, Any], seeds: list[int] | None = None, variants: list[str] | None = None
) -> list[Point]:
    """Every point of a scenario's sweep (`expand_runs`), each with a unique file name."""
    runs = expand_runs(doc, seeds, variants)
    dims = list(doc.get("sweep", {}))
    names = [p.removesuffix(".") for p in file_prefixes(runs, True)]
    return [
        Point(r.label, n, r.variant, r.seed, {k: _get(r.doc, k) for k in dims}, r.doc, digest(r.doc))
        for r, n in zip(runs, names, strict=True)
    ]


def run_point(doc: dict[str, Any]) -> dict[str, Any]:
    """The worker: run one resolved scenario document; its report, or the error it raised (never raises
    an Exception)."""
    t0 = time.perf_counter()
    try:
        (run,) = list(iter_runs(doc))
        rep = run.report()
        out: dict[str, Any] = {"status": "ok", "report": rep}
    except Exception as exc:
        first = str(exc).splitlines()[0] if str(exc) else ""
        out = {
            "status": "failed",
            "error": f"{type(exc).__name__}: {first}".rstrip(": "),
            "traceback": traceback.format_exc(),
        }
    out["wall_s"] = round(time.perf_counter() - t0, 4)
    out["build"] = "compiled" if _native.compiled else "interpreted"
    out["host"] = os.uname().nodename
    return out


def _worker_init() -> None:
    # Ctrl-C in a terminal reaches the whole process group; the parent stops the sweep and its workers
    # (an interrupt inside a worker's compiled code could abort it instead of stopping it)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


class Pool(Protocol):
    """Where points run: `submit` a document, `wait` for some to come back, `close`."""

    workers: int

    def submit(self, doc: dict[str, Any]) -> Any: ...

    def wait(self, pending: Sequence[Any], timeout: float) -> list[tuple[Any, dict[str, Any]]]: ...

    def close(self, cancel: bool) -> None: ...


def _crashed(exc: BaseException) -> dict[str, Any]:
    """The record of a point whose worker died (or whose task the cluster lost)."""
    first = str(exc).splitlines()[0] if str(exc) else ""
    return {"status": "failed", "error": f"{type(exc).__name__}: {first}".rstrip(": "), "wall_s": 0.0}


class LocalPool:
    """``jobs`` worker processes on this machine (started by forkserver, or spawn where there is none)."""

    def __init__(self, jobs: int) -> None:
        method = "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"
        self.workers = jobs
        self._ex = cf.ProcessPoolExecutor(
            jobs, mp_context=multiprocessing.get_context(method), initializer=_worker_init
        )

    def submit(self, doc: dict[str, Any]) -> cf.Future[dict[str, Any]]:
        return self._ex.submit(run_point, doc)

    def wait(
        self, pending: Sequence[cf.Future[dict[str, Any]]], timeout: float
    ) -> list[tuple[cf.Future[dict[str, Any]], dict[str, Any]]]:
        done, _ = cf.wait(pending, timeout, return_when=cf.FIRST_COMPLETED)
        out = []
        for f in done:
            exc = f.exception()
            out.append((f, _crashed(exc) if exc is not None else f.result()))
        return out

    def close(self, cancel: bool) -> None:
        """Shut the pool; ``cancel``: drop the points not started and stop the running ones at once."""
        running = list(self._ex._processes.values()) if cancel else []
        self._ex.shutdown(wait=not cancel, cancel_futures=cancel)
        for p in running:
            p.terminate()
        for p in running:
            p.join(10)


class RayPool:
    """The same worker as a Ray task (one CPU each) on the cluster at ``address`` ("auto": the cluster
    started on this machine, or a new local one)."""

    def __init__(self, address: str) -> None:
        try:
            self._ray: Any = importlib.import_module("ray")
        except ImportError:
            raise SweepError("--ray needs the ray package: pip install 'openmrc[ray]'") from None
        try:
            self._ray.init(
                address=None if address == "auto" else address,
                ignore_reinit_error=True,
                include_dashboard=False,
                logging_level="ERROR",
            )
        except Exception as exc:  # ray raises ConnectionError, RuntimeError, ValueError …
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise SweepError(f"--ray {address}: cannot connect: {first}") from None
        self.workers = max(1, int(self._ray.cluster_resources().get("CPU", 1)))
        self._task = self._ray.remote(num_cpus=1, max_retries=0)(run_point)
        self._pending: set[Any] = set()

    def submit(self, doc: dict[str, Any]) -> Any:
        ref = self._task.remote(doc)
        self._pending.add(ref)
        return ref

    def wait(self, pending: Sequence[Any], timeout: float) -> list[tuple[Any, dict[str, Any]]]:
        ready, _ = self._ray.wait(list(pending), num_returns=1, timeout=timeout)
        if ready:  # and whatever else is ready by now
            ready, _ = self._ray.wait(list(pending), num_returns=len(pending), timeout=0)
        out = []
        for ref in ready:
            self._pending.discard(ref)
            try:
                out.append((ref, self._ray.get(ref)))
            except Exception as exc:  # the task's worker died, or the cluster lost it
                out.append((ref, _crashed(exc)))
        return out

    def close(self, cancel: bool) -> None:
        """Disconnect (and stop a cluster started here); ``cancel``: stop the tasks not back yet first."""
        for ref in self._pending if cancel else ():
            self._ray.cancel(ref, force=True)
        self._ray.shutdown()


@dataclass(slots=True)
class SweepSummary:
    """How a sweep went: points in all, run now, skipped (finished before), and which failed."""

    total: int
    ran: int = 0
    skipped: int = 0
    failed: list[tuple[str, str]] = field(default_factory=list)
    start_s: float = 0.0
    """Seconds to get the pool ready (a Ray cluster's start-up or connection)."""
    wall_s: float = 0.0
    """Seconds from the pool being ready to the last point back."""
    point_s: float = 0.0
    """Sum of the wall times of the points run now (each in its worker)."""
    workers: int = 1

    @property
    def speedup(self) -> float:
        """Sum of point times over the sweep's wall time (without the pool's start-up)."""
        return self.point_s / self.wall_s if self.wall_s > 0 else 0.0


class SweepInterrupted(Exception):
    """Ctrl-C (a `check` that raised KeyboardInterrupt) stopped a sweep; finished points are on disk."""

    def __init__(self, summary: SweepSummary) -> None:
        super().__init__(f"{summary.ran} point(s) had finished")
        self.summary = summary


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def finished_records(out: Path, points: Sequence[Point]) -> dict[str, dict[str, Any]]:
    """Name → record of the points already finished in ``out`` with the same digest (unreadable records,
    failed points and changed points are left out: they run again)."""
    done = {}
    for p in points:
        try:
            rec = json.loads((out / "points" / f"{p.name}.json").read_text())
        except (OSError, ValueError):
            continue
        if isinstance(rec, dict) and rec.get("digest") == p.digest and rec.get("status") == "ok":
            done[p.name] = rec
    return done


def record(p: Point, outcome: dict[str, Any]) -> dict[str, Any]:
    """A point's file: who it is and what its run gave."""
    rec: dict[str, Any] = {
        "label": p.label,
        "variant": p.variant,
        "seed": p.seed,
        "values": p.values,
        "digest": p.digest,
    }
    rec |= outcome
    if "report" in rec:
        rec["report"] = rec["report"] | {"label": p.label, "variant": p.variant, "seed": p.seed}
    return rec


def run_sweep(
    points: Sequence[Point],
    out: Path,
    pool_factory: Callable[[int], Pool],
    *,
    on_point: Callable[[Point, dict[str, Any], SweepSummary], None] | None = None,
    check: Callable[[], None] | None = None,
) -> tuple[dict[str, dict[str, Any]], SweepSummary]:
    """Run the points not finished in ``out`` on ``pool_factory(n_to_run)``; each record is written to
    ``out/points/`` as it arrives and passed to ``on_point``. ``check()`` is called about every 0.2 s; if
    it raises KeyboardInterrupt, the pool is cancelled and `SweepInterrupted` raised. Returns every
    point's record (by name) and the summary."""
    (out / "points").mkdir(parents=True, exist_ok=True)
    records = finished_records(out, points)
    summary = SweepSummary(total=len(points), skipped=len(records))
    todo = [p for p in points if p.name not in records]
    if not todo:
        return records, summary
    t0 = time.perf_counter()
    pool = pool_factory(len(todo))
    summary.workers = pool.workers
    summary.start_s = time.perf_counter() - t0
    t0 += summary.start_s
    pending = {pool.submit(p.doc): p for p in todo}
    try:
        while pending:
            if check is not None:
                check()
            for handle, outcome in pool.wait(list(pending), 0.2):
                p = pending.pop(handle)
                rec = records[p.name] = record(p, outcome)
                _write_atomic(out / "points" / f"{p.name}.json", json.dumps(rec, indent=1, default=str))
                summary.ran += 1
                summary.point_s += float(rec.get("wall_s", 0.0))
                if rec["status"] != "ok":
                    summary.failed.append((p.label, str(rec.get("error", "?"))))
                summary.wall_s = time.perf_counter() - t0
                if on_point is not None:
                    on_point(p, rec, summary)
    except KeyboardInterrupt:
        pool.close(cancel=True)
        summary.wall_s = time.perf_counter() - t0
        raise SweepInterrupted(summary) from None
    pool.close(cancel=False)
    summary.wall_s = time.perf_counter() - t0
    return records, summary


def rows(points: Sequence[Point], records: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per point (in plan order): its sweep values, variant, seed, status, wall time, figures."""
    out = []
    for p in points:
        rec = records.get(p.name, {})
        rep = rec.get("report", {})
        row: dict[str, Any] = dict(p.values)
        row |= {"variant": p.variant, "seed": p.seed, "label": p.label}
        row |= {"status": rec.get("status", "not run"), "error": rec.get("error", "")}
        row["wall_s"] = rec.get("wall_s")
        row |= {k: rep.get(k) for k in FIGURES}
        out.append(row)
    return out


def write_tables(
    out: Path,
    doc: dict[str, Any],
    points: Sequence[Point],
    records: dict[str, dict[str, Any]],
    summary: SweepSummary,
    provenance: dict[str, Any],
) -> list[Path]:
    """``sweep.csv`` and ``sweep.json``: one row per point."""
    table = rows(points, records)
    header = list(table[0]) if table else []
    with open(out / "sweep.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows([["" if r[k] is None else r[k] for k in header] for r in table])
    document = {
        "provenance": provenance,
        "scenario": {k: v for k, v in doc.items() if not k.startswith("_")},
        "dimensions": list(doc.get("sweep", {})),
        "summary": {
            "points": summary.total,
            "ran": summary.ran,
            "skipped": summary.skipped,
            "failed": [{"label": lbl, "error": e} for lbl, e in summary.failed],
            "workers": summary.workers,
            "start_s": round(summary.start_s, 3),
            "wall_s": round(summary.wall_s, 3),
            "point_s": round(summary.point_s, 3),
            "speedup": round(summary.speedup, 3),
        },
        "rows": table,
    }
    _write_atomic(out / "sweep.json", json.dumps(document, indent=2, default=str) + "\n")
    return [out / "sweep.csv", out / "sweep.json"]


def _file_name(key: str) -> str:
    return "".join(c if c.isalnum() or c in "._-" else "-" for c in key)


def plot_dimensions(out: Path, doc: dict[str, Any], table: list[dict[str, Any]]) -> list[Path]:
    """One PNG per sweep dimension (``sweep-<key>.png``): each of `PLOTTED` against the dimension's values,
    one line per variant (and per value of the other dimensions, when that makes 8 lines or fewer; else
    their mean), each the mean over seeds with its min–max as error bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    dims = list(doc.get("sweep", {}))
    ok = [r for r in table if r["status"] == "ok"]
    written = []
    for dim in dims:
        others = [d for d in dims if d != dim]
        xs = list(dict.fromkeys(r[dim] for r in table))
        lines: dict[str, list[dict[str, Any]]] = {}
        split = len({(r["variant"], *(r[d] for d in others)) for r in table}) <= 8
        for r in ok:
            name = r["variant"]
            if split and others:
                name += " " + " ".join(f"{d.rsplit('.', 1)[-1]}={r[d]}" for d in others)
            lines.setdefault(name, []).append(r)
        figures = [f for f in PLOTTED if any(isinstance(r.get(f), int | float) for r in ok)]
        fig, axes = plt.subplots(1, max(1, len(figures)), figsize=(4.2 * max(1, len(figures)), 4), dpi=100)
        axes_list = list(axes) if hasattr(axes, "__len__") else [axes]
        for ax, fig_key in zip(axes_list, figures, strict=False):
            for name, rs in lines.items():
                pos, mean, lo, hi = [], [], [], []
                for i, x in enumerate(xs):
                    vals = [r[fig_key] for r in rs if r[dim] == x and isinstance(r.get(fig_key), int | float)]
                    if vals:
                        m = statistics.fmean(vals)
                        pos.append(i)
                        mean.append(m)
                        lo.append(m - min(vals))
                        hi.append(max(vals) - m)
                if pos:
                    ax.errorbar(pos, mean, yerr=[lo, hi], marker="o", capsize=3, label=name)
            ax.set_xticks(range(len(xs)), [str(x) for x in xs])
            ax.set_xlabel(dim)
            ax.set_title(fig_key, fontsize=10)
            ax.grid(True, alpha=0.3)
            if any(math.isfinite(v) and v > 0 for v in ax.get_ylim()):
                ax.set_ylim(bottom=0)
        if figures:
            axes_list[0].legend(fontsize=7)
        else:
            axes_list[0].text(0.5, 0.5, "no finished point", ha="center", transform=axes_list[0].transAxes)
        name = str(doc.get("name", "sweep"))
        fig.suptitle(
            f"{name}: figures against {dim}" + ("" if split or not others else " (mean of the rest)")
        )
        fig.tight_layout()
        path = out / f"sweep-{_file_name(dim)}.png"
        fig.savefig(path)
        plt.close(fig)
        written.append(path)
    return written
