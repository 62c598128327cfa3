"""PNG plots of simulation results (matplotlib, headless): goodput over time as a fraction of the bottleneck
(`SimResults.bottleneck_bps`) with failure markers, and flow completion time CDFs on a log axis. Several runs
(e.g. MRC and RoCEv2, each with and without its failure) share one figure."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import matplotlib

matplotlib.use("Agg")  # headless: before pyplot is imported

import matplotlib.pyplot as plt
from matplotlib import ticker

from openmrc.sim.metrics import BASELINE_SUFFIX, SimResults

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = ["BASELINE_SUFFIX", "line_rate_bps", "plot_fct_cdf", "plot_size_sweep", "plot_timeline"]


def line_rate_bps(res: SimResults) -> int:
    """What the sending hosts can inject: the rate of every NIC port of every host that sends a flow."""
    return res.line_rate_bps()


def _colours(labels: list[str]) -> dict[str, str]:
    cycle = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    bases = list(dict.fromkeys(label.removesuffix(BASELINE_SUFFIX) for label in labels))
    return {label: cycle[bases.index(label.removesuffix(BASELINE_SUFFIX)) % len(cycle)] for label in labels}


def plot_timeline(runs: Mapping[str, SimResults], path: Path, *, title: str = "") -> Path:
    """Goodput of each run against simulated time (µs), as a fraction of its bottleneck (what its hosts can
    move, `SimResults.bottleneck_bps`; per sample interval); a dashed red line and a label at every failure
    event; the number of EVs marked bad on a second axis for MRC runs with failures. A run without its
    failure is dashed, in the same colour."""
    fig, ax = plt.subplots(figsize=(9, 4.8), dpi=110)
    ev_ax = None
    failures: dict[int, str] = {}
    colour = _colours(list(runs))
    rates = set()
    for label, res in runs.items():
        line = res.bottleneck_bps()
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
    ax.set_ylabel(f"goodput, fraction of the bottleneck{rate}", fontsize=9)
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


def _size_label(size: float, _pos: object = None) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if size >= 1 << shift:
            return f"{size / (1 << shift):g} {unit}"
    return f"{size:g} B"


def plot_size_sweep(
    variants: Mapping[str, Mapping[str, SimResults]],
    path: Path,
    *,
    title: str = "",
    marks: Sequence[tuple[int, float, str]] = (),
) -> Path:
    """Bandwidth (all bytes over first start to last completion, Gb/s) against message size (log axis)
    for each variant's runs, one run per size, as ib_write_bw's sweep prints it; a dashed line at the
    senders' line rate; ``marks`` (size, fraction of the line rate, label) are reference points."""
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=110)
    rates = set()
    for variant, runs in variants.items():
        points = []
        for res in runs.values():
            job = res.job_time_ns()
            if job:
                points.append((max(f.size for f in res.flows), sum(f.size for f in res.flows) * 8 / job))
                rates.add(res.line_rate_bps())
        points.sort()
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", markersize=4, label=variant)
    for size, fraction, label in marks:
        for rate in sorted(rates)[-1:]:
            ax.plot([size], [fraction * rate / 1e9], marker="*", markersize=11, color="red", linestyle="")
            ax.annotate(f"{label}: {fraction:.0%}", (size, fraction * rate / 1e9), xytext=(6, -14),
                        textcoords="offset points", fontsize=8, color="red")  # fmt: skip
    for rate in sorted(rates):
        ax.axhline(rate / 1e9, color="grey", linestyle="--", linewidth=1)
        ax.annotate(
            f"line rate {rate / 1e9:,.0f} Gb/s",
            (0.01, rate / 1e9),
            xycoords=("axes fraction", "data"),
            xytext=(0, 3),
            textcoords="offset points",
            fontsize=8,
            color="grey",
        )
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(ticker.LogLocator(base=4))
    ax.xaxis.set_major_formatter(ticker.FuncFormatter(_size_label))
    ax.xaxis.set_minor_formatter(ticker.NullFormatter())
    ax.tick_params(axis="x", labelsize=8, labelrotation=45)
    ax.set_xlabel("message size")
    ax.set_ylabel("bandwidth (Gb/s)")
    ax.set_ylim(0, max(rates, default=1e9) / 1e9 * 1.08)
    ax.grid(alpha=0.3, which="both")
    if variants:
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(0, 0.93))
    return _save(fig, ax, title or "bandwidth against message size", path)


def _save(fig: Figure, ax: Axes, title: str, path: Path) -> Path:
    ax.set_title(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path
