"""PNG plots of simulation results (matplotlib, headless): the job's goodput over time with failure
markers, and flow completion time CDFs. Several runs (e.g. MRC and RoCEv2) share one figure."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import matplotlib

matplotlib.use("Agg")  # headless: before pyplot is imported

import matplotlib.pyplot as plt

from openmrc.sim.metrics import SimResults

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = ["plot_fct_cdf", "plot_timeline"]


def plot_timeline(runs: Mapping[str, SimResults], path: Path, *, title: str = "") -> Path:
    """Goodput (Gb/s, per sample interval) of each run against simulated time (µs); a dashed line and a
    label at every failure event; the number of ASSUMED_BAD EVs on a second axis for MRC runs."""
    fig, ax = plt.subplots(figsize=(9, 4.5), dpi=110)
    ev_ax = None
    failures: dict[int, str] = {}
    for label, res in runs.items():
        if not res.samples:
            continue
        xs = [s.time_ns / 1000 for s in res.samples]
        ax.plot(xs, [s.goodput_bps / 1e9 for s in res.samples], label=label, linewidth=1.4)
        if any(s.evs_bad for s in res.samples):
            if ev_ax is None:
                ev_ax = ax.twinx()
                ev_ax.set_ylabel("EVs ASSUMED_BAD")
            ev_ax.plot(
                xs, [s.evs_bad for s in res.samples], linestyle=":", linewidth=1, label=f"{label}: bad EVs"
            )
        for t, what in res.failures:
            if what not in failures.get(t, ""):
                failures[t] = f"{failures[t]} / {what}" if t in failures else what
    for t, what in sorted(failures.items()):
        ax.axvline(t / 1000, color="red", linestyle="--", linewidth=0.9)
        ax.annotate(what, (t / 1000, 0), xytext=(3, 6), textcoords="offset points", rotation=90, fontsize=7)
    ax.set_xlabel("simulated time (µs)")
    ax.set_ylabel("job goodput (Gb/s)")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    if ev_ax is not None:
        h2, l2 = ev_ax.get_legend_handles_labels()
        handles, labels = handles + h2, labels + l2
    if handles:
        ax.legend(handles, labels, fontsize=8, loc="upper right")
    return _save(fig, ax, title or "job goodput over time", path)


def plot_fct_cdf(runs: Mapping[str, SimResults], path: Path, *, title: str = "") -> Path:
    """Empirical CDF of flow completion times (µs) of each run."""
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=110)
    for label, res in runs.items():
        fcts = res.fcts_us()
        if fcts:
            n = len(fcts)
            ax.step(fcts, [(i + 1) / n for i in range(n)], where="post", label=label)
    ax.set_xlabel("flow completion time (µs)")
    ax.set_ylabel("fraction of flows")
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)
    if runs:
        ax.legend(fontsize=8)
    return _save(fig, ax, title or "flow completion times", path)


def _save(fig: Figure, ax: Axes, title: str, path: Path) -> Path:
    ax.set_title(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path
