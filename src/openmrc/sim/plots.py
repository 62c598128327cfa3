"""PNG plots of simulation results (matplotlib, headless): goodput over time as a fraction of line rate with
failure markers, and flow completion time CDFs on a log axis. Several runs (e.g. MRC and RoCEv2, each with
and without its failure) share one figure."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import matplotlib

matplotlib.use("Agg")  # headless: before pyplot is imported

import matplotlib.pyplot as plt
from matplotlib import ticker

from openmrc.sim.metrics import SimResults

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = ["BASELINE_SUFFIX", "line_rate_bps", "plot_fct_cdf", "plot_timeline"]

BASELINE_SUFFIX = ", no failure"
"""A run labelled ``X{BASELINE_SUFFIX}`` is X without its failures: drawn dashed, in X's colour."""


def line_rate_bps(res: SimResults) -> int:
    """What the sending hosts can inject: the rate of every NIC port of every host that sends a flow."""
    senders = {f.src for f in res.flows}
    return sum(link.bps for link in res.links if link.node in senders)


def _colours(labels: list[str]) -> dict[str, str]:
    cycle = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    bases = list(dict.fromkeys(label.removesuffix(BASELINE_SUFFIX) for label in labels))
    return {label: cycle[bases.index(label.removesuffix(BASELINE_SUFFIX)) % len(cycle)] for label in labels}


def plot_timeline(runs: Mapping[str, SimResults], path: Path, *, title: str = "") -> Path:
    """Goodput of each run against simulated time (µs), as a fraction of the senders' line rate (per
    sample interval); a dashed red line and a label at every failure event; the number of EVs marked bad on
    a second axis for MRC runs with failures. A run without its failure is dashed, in the same colour."""
    fig, ax = plt.subplots(figsize=(9, 4.8), dpi=110)
    ev_ax = None
    failures: dict[int, str] = {}
    colour = _colours(list(runs))
    rates = set()
    for label, res in runs.items():
        line = line_rate_bps(res)
        if not res.samples or not line:
            continue
        rates.add(line)
        base = label.endswith(BASELINE_SUFFIX)
        xs = [s.time_ns / 1000 for s in res.samples]
        ax.plot(
            xs,
            [s.goodput_bps / line for s in res.samples],
            label=label,
            color=colour[label],
            linewidth=1.0 if base else 1.5,
            linestyle="--" if base else "-",
            alpha=0.7 if base else 1.0,
        )
        if res.failures and any(s.evs_bad for s in res.samples):
            if ev_ax is None:
                ev_ax = ax.twinx()
                ev_ax.set_ylabel("MRC paths (EVs) marked bad")
            ev_ax.plot(
                xs,
                [s.evs_bad for s in res.samples],
                color=colour[label],
                linestyle=":",
                linewidth=1,
                label=f"{label}: EVs marked bad",
            )
        for t, full in res.failures:
            what = re.sub(r" \([^)]*\)", "", full)  # the plain name; the node names are in failures.csv
            if what not in failures.get(t, ""):
                failures[t] = f"{failures[t]} / {what}" if t in failures else what
    for t, what in sorted(failures.items()):
        ax.axvline(t / 1000, color="red", linestyle="--", linewidth=0.9)
        ax.annotate(
            f"{what} at {t / 1000:g} µs",
            (t / 1000, 0.03),
            xytext=(4, 0),
            textcoords="offset points",
            rotation=90,
            fontsize=8,
            color="red",
            va="bottom",
            bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.8, "pad": 1},
        )
    ax.set_xlabel("simulated time (µs)")
    rate = f" = {next(iter(rates)) / 1e9:,.0f} Gb/s" if len(rates) == 1 else ""
    ax.set_ylabel(f"goodput, fraction of the senders' line rate{rate}", fontsize=9)
    ax.set_ylim(0, 1.05)
    ax.set_xlim(left=0)
    ax.grid(alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    if ev_ax is not None:
        ev_ax.set_ylim(bottom=0)
        h2, l2 = ev_ax.get_legend_handles_labels()
        handles, labels = handles + h2, labels + l2
    if handles:
        ax.legend(handles, labels, fontsize=8, loc="lower right")
    return _save(fig, ax, title or "goodput over time", path)


def plot_fct_cdf(runs: Mapping[str, SimResults], path: Path, *, title: str = "") -> Path:
    """Empirical CDF of flow completion times (µs, log axis so that one slow flow does not squeeze the
    others into one line) of each run."""
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=110)
    colour = _colours(list(runs))
    for label, res in runs.items():
        fcts = res.fcts_us()
        if fcts:
            n = len(fcts)
            base = label.endswith(BASELINE_SUFFIX)
            ax.step(
                fcts,
                [(i + 1) / n for i in range(n)],
                where="post",
                label=label,
                color=colour[label],
                linestyle="--" if base else "-",
            )
    ax.set_xscale("log")
    ax.xaxis.set_major_locator(ticker.LogLocator(subs=(1.0, 2.0, 5.0)))
    ax.xaxis.set_major_formatter(ticker.FuncFormatter(lambda x, _pos: f"{x:,.0f}"))
    ax.xaxis.set_minor_formatter(ticker.NullFormatter())
    ax.set_xlabel("flow completion time (µs, log scale)")
    ax.set_ylabel("fraction of flows finished")
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3, which="both")
    if runs:
        ax.legend(fontsize=8, loc="lower right")
    return _save(fig, ax, title or "flow completion times", path)


def _save(fig: Figure, ax: Axes, title: str, path: Path) -> Path:
    ax.set_title(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path
