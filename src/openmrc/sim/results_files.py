"""What a scenario run leaves on disk (docs/results.md describes every key and column).

``results.json`` carries its provenance (openmrc version, git commit, compiled or interpreted, Python, the
command line, seeds, the fully resolved scenario, start and wall time), one report per run and, with several
seeds, the mean and spread of every figure per variant. Each run's CSVs are named by its label
(``mrc-128-evs.flows.csv``; no prefix for a scenario of one run). Times are in µs, rates in Gb/s, and nodes
come with the names `openmrc topo plan` gives them (``p0-t0-3``).
"""

from __future__ import annotations

import csv
import json
import platform
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from openmrc import __version__, _native

if TYPE_CHECKING:
    from openmrc.fabric.topology import Topology
    from openmrc.sim.scenario import Run

__all__ = ["aggregate", "file_prefixes", "name_nodes", "provenance", "write_run_files", "write_runs"]

_LINK = re.compile(r"\b(link|switch) (\d+)(?::(\d+))?")


def name_nodes(text: str, topo: Topology) -> str:
    """``text`` with the node ids of "link N:P" and "switch N" followed by the node's name."""

    def named(m: re.Match[str]) -> str:
        node = int(m.group(2))
        try:
            name = topo.node_name(node)
        except (IndexError, ValueError):
            return m.group(0)
        port = f":{m.group(3)}" if m.group(3) else ""
        return f"{m.group(1)} {name}{port} (node {node})"

    return _LINK.sub(named, text)


def _git_commit() -> str | None:
    root = Path(__file__).resolve().parents[3]
    if not (root / ".git").exists():
        return None
    try:
        out = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    commit = out.stdout.strip()
    if out.returncode or not commit:
        return None
    dirty = subprocess.run(
        ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
        capture_output=True,
        text=True,
        timeout=10,
        check=False,
    ).stdout.strip()
    return commit + ("-dirty" if dirty else "")


def provenance(started: float, seeds: Sequence[int], argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Where results came from: ``started`` is the run's ``time.time()`` at start."""
    return {
        "openmrc": __version__,
        "git_commit": _git_commit(),
        "build": "compiled" if _native.compiled else "interpreted",
        "python": platform.python_version(),
        "command": list(sys.argv if argv is None else argv),
        "seeds": list(seeds),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
        "wall_s": round(time.time() - started, 3),
    }


def aggregate(reports: Sequence[dict[str, Any]]) -> dict[str, dict[str, dict[str, float]]]:
    """Per variant (and sweep point) over its seeds: mean, std, min, max and n of every numeric figure."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for rep in reports:
        key = str(rep["label"]).rsplit(" seed=", 1)[0]
        groups.setdefault(key, []).append(rep)
    out: dict[str, dict[str, dict[str, float]]] = {}
    for label, reps in groups.items():
        figures: dict[str, dict[str, float]] = {}
        for key in reps[0]:
            vals = [
                r[key] for r in reps if isinstance(r.get(key), int | float) and not isinstance(r[key], bool)
            ]
            if key in ("seed",) or len(vals) != len(reps):
                continue
            figures[key] = {
                "mean": statistics.fmean(vals),
                "std": statistics.stdev(vals) if len(vals) > 1 else 0.0,
                "min": min(vals),
                "max": max(vals),
                "n": len(vals),
            }
        out[label] = figures
    return out


def file_prefixes(runs: Sequence[Run], named: bool) -> list[str]:
    """Each run's file prefix: its label as a unique file name (``"mrc-128-evs."``); "" unless ``named``."""
    if not named:
        return ["" for _ in runs]
    names: list[str] = []
    for r in runs:
        base = re.sub(r"[^a-z0-9.=]+", "-", r.label.lower()).replace("=", "-").strip("-.") or "run"
        name, n = base, 1
        while name in names:
            n += 1
            name = f"{base}-{n}"
        names.append(name)
    return [f"{n}." for n in names]


def _report(r: Run) -> dict[str, Any]:
    rep = r.report()
    if r.sim is not None and "outages" in rep:
        rep["outages"] = [o | {"what": name_nodes(str(o["what"]), r.sim.topo)} for o in rep["outages"]]
    return rep


def write_run_files(r: Run, out: Path, prefix: str = "") -> list[Path]:
    """One run's CSVs: flows, links (that carried traffic or lost packets), series, EV events, failures."""
    res = r.results
    assert res is not None
    topo = r.sim.topo if r.sim is not None else None

    def name(node: int) -> str:
        return topo.node_name(node) if topo is not None else ""

    def table(kind: str, header: list[str], rows: list[list[Any]]) -> Path:
        path = out / f"{prefix}{kind}.csv"
        with open(path, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(header)
            w.writerows(rows)
        return path

    def us(ns: int | None) -> float | str:
        return "" if ns is None else ns / 1000

    flows = [
        [
            fl.id,
            fl.tag,
            fl.src,
            fl.dst,
            fl.size,
            us(fl.start),
            us(fl.finish),
            us(fl.fct_ns),
            "" if fl.goodput_bps is None else round(fl.goodput_bps / 1e9, 3),
            "" if fl.status is None else fl.status.name,
        ]
        for fl in res.flows
    ]
    links = [
        [
            link.node,
            name(link.node),
            link.port,
            link.peer,
            name(link.peer),
            link.bps / 1e9,
            link.sent_bytes,
            round(link.utilisation, 4),
            link.drops,
            link.losses,
            link.trims,
            link.ecn_marks,
            link.pauses,
            round(link.paused_us, 3),
        ]
        for link in res.links
        if link.sent_bytes or link.drops or link.losses
    ]
    series = [
        [
            s.time_ns / 1000,
            s.delivered_bytes,
            round(s.goodput_bps / 1e9, 3),
            s.evs_bad,
            s.ev_to_bad,
            s.ev_to_good,
        ]
        for s in res.samples
    ]
    head = [
        "id",
        "tag",
        "src",
        "dst",
        "size_bytes",
        "start_us",
        "finish_us",
        "fct_us",
        "goodput_gbps",
        "status",
    ]
    link_head = ["node", "node_name", "port", "peer", "peer_name", "gbps", "sent_bytes", "utilisation"]
    link_head += ["drops", "losses", "trims", "ecn_marks", "pfc_pauses", "paused_us"]
    return [
        table("flows", head, flows),
        table("links", link_head, links),
        table(
            "series",
            ["time_us", "delivered_bytes", "goodput_gbps", "evs_bad", "ev_to_bad", "ev_to_good"],
            series,
        ),
        table(
            "ev_events", ["time_us", "host", "qp", "port", "state"], [[t / 1000, *x] for t, *x in res.ev_log]
        ),
        table("failures", ["at_us", "what"], [[t / 1000, _named(r, what)] for t, what in res.failures]),
    ]


def _named(r: Run, what: str) -> str:
    return name_nodes(what, r.sim.topo) if r.sim is not None else what


def results_document(
    runs: Sequence[Run],
    doc: dict[str, Any],
    *,
    provenance: dict[str, Any] | None = None,
    interrupted: str | None = None,
) -> dict[str, Any]:
    """What results.json holds (and `sim run --json` prints)."""
    reports = []
    for r in runs:
        rep = _report(r)
        assert r.results is not None
        rep["failures"] = [{"at_us": t / 1000, "what": _named(r, w)} for t, w in r.results.failures]
        reports.append(rep)
    out: dict[str, Any] = {"provenance": provenance or {}}
    if interrupted:
        out["interrupted"] = interrupted
    out["scenario"] = {k: v for k, v in doc.items() if not k.startswith("_")}
    out["runs"] = reports
    if len({r.seed for r in runs}) > 1:
        out["seeds_summary"] = aggregate(reports)
    return out


def write_runs(
    runs: Sequence[Run],
    out: Path,
    doc: dict[str, Any],
    *,
    provenance: dict[str, Any] | None = None,
    interrupted: str | None = None,
) -> list[Path]:
    """results.json, each run's CSVs (named by its label when there are several runs or the run was
    ``interrupted``) and the plots (bandwidth against message size too, when the scenario sweeps it)."""
    from openmrc.sim.plots import plot_fct_cdf, plot_size_sweep, plot_timeline  # matplotlib when written

    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    for r, prefix in zip(runs, file_prefixes(runs, len(runs) > 1 or bool(interrupted)), strict=True):
        written += write_run_files(r, out, prefix)
    document = results_document(runs, doc, provenance=provenance, interrupted=interrupted)
    (out / "results.json").write_text(json.dumps(document, indent=2, default=str) + "\n")
    written.insert(0, out / "results.json")
    by_label = {r.label: r.results for r in runs if r.results is not None}
    name = str(doc.get("name", "scenario"))
    if any(res.samples for res in by_label.values()):  # (sample_us = 0: nothing to draw)
        written.append(plot_timeline(by_label, out / "timeline.png", title=f"{name}: job goodput"))
    written.append(plot_fct_cdf(by_label, out / "fct_cdf.png", title=f"{name}: flow completion times"))
    if any(k.startswith("workload.size_") for k in doc.get("sweep", {})):
        by_variant: dict[str, dict[str, Any]] = {}
        for r in runs:
            if r.results is not None and r.results.flows:
                by_variant.setdefault(r.variant, {})[r.label] = r.results
        marks = [
            (int(size), float(ref["value"]), str(ref["source"]))
            for ref in doc.get("references", [])
            if ref["figure"] == "goodput_fraction"
            for key, size in ref.get("at", {}).items()
            if key == "workload.size_bytes"
        ]
        title = f"{name}: bandwidth against message size"
        written.append(plot_size_sweep(by_variant, out / "bandwidth.png", title=title, marks=marks))
    return written
