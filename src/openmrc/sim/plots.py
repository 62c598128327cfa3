"""PNG plots of simulation results (matplotlib, headless): goodput over time as a fraction of the bottleneck
(`SimResults.bottleneck_bps`) with failure markers, and flow completion time CDFs on a log axis. Several runs
(e.g. MRC and RoCEv2, each with and without its failure) share one figure."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import matplotlib

matplotlib.use("Agg")  # headless: before pyplot is imported

import matplotlib.pyplot as plt
from matplotlib import ticker

from openmrc.sim.metrics import BASELINE_SUFFIX, SimResults

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = [
    "BASELINE_SUFFIX",
    "fct_cdf_figure",
    "line_rate_bps",
    "plot_fct_cdf",
    "plot_size_sweep",
    "plot_timeline",
    "timeline_figure",
]


def line_rate_bps(res: SimResults) -> int:
    """What the sending hosts can inject: the rate of every NIC port of every host that sends a flow."""
    return res.line_rate_bps()


def _colours(labels: list[str]) -> dict[str, Any]:
    """A colour per run, a run without its failure in the colour of the run with it: the default cycle's
    ten while they are enough, else as many evenly spaced along a colour map (in the runs' order: a sweep's
    smallest to largest)."""
    bases = list(dict.fromkeys(label.removesuffix(BASELINE_SUFFIX) for label in labels))
    cycle = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    if len(bases) <= len(cycle):
        colours: list[Any] = list(cycle)
    else:
        cmap = matplotlib.colormaps["turbo"]
        colours = [cmap(0.03 + 0.94 * i / (len(bases) - 1)) for i in range(len(bases))]
    return {label: colours[bases.index(label.removesuffix(BASELINE_SUFFIX))] for label in labels}


_NEIGHBOUR_STYLES = ("-", "--", "-.")
"""More series than the colour cycle: neighbours along the colour map (close colours) also differ in line
style."""


def _styles(labels: list[str]) -> dict[str, str]:
    """A line style per run: a run without its failure dashed; with more runs than the colour cycle has
    colours, runs whose colours are next to each other in turn solid, dashed and dash-dotted."""
    many = len(labels) > len(plt.rcParams["axes.prop_cycle"].by_key()["color"])
    out = {}
    for i, label in enumerate(labels):
        if label.endswith(BASELINE_SUFFIX):
            out[label] = "--"
        else:
            out[label] = _NEIGHBOUR_STYLES[i % len(_NEIGHBOUR_STYLES)] if many else "-"
    return out


_LOG_SUBS: tuple[tuple[float, tuple[float, ...]], ...] = (
    (1.0, (1.0, 1.5, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0)),
    (2.0, (1.0, 2.0, 3.0, 5.0)),
    (4.0, (1.0, 2.0, 5.0)),
    (float("inf"), (1.0,)),
)
"""Log-axis ticks by the decades shown: up to one, eight a decade (90, 100, 150, 200, 300, 400 ...); up to
two, four; up to four, 1-2-5; more, one a decade."""


def _log_ticks(axis: Any, lo: float, hi: float) -> None:
    """Ticks with plain numbers on a log ``axis`` (x or y) that shows ``lo`` to ``hi``: enough to read a
    value off it whatever its span (a locator of 1-2-5 labels only 100 and 200 from 85 to 450)."""
    decades = math.log10(hi / lo) if 0 < lo < hi else 1.0
    subs = next(subs for span, subs in _LOG_SUBS if decades <= span)
    axis.set_major_locator(ticker.LogLocator(subs=subs, numticks=100))
    axis.set_major_formatter(ticker.FuncFormatter(lambda x, _pos: f"{x:,.0f}" if x >= 10 else f"{x:g}"))
    axis.set_minor_locator(ticker.LogLocator(subs="all", numticks=100))
    axis.set_minor_formatter(ticker.NullFormatter())


def _legend(ax: Axes, handles: list[Any], labels: list[str], *, below: bool = False, title: str = "") -> None:
    """The legend where it hides nothing: below the axes (``below``), or beside them on the right when it
    has more than a few entries; else inside, where the curves leave the most room."""
    style: dict[str, Any] = {"fontsize": 8, "title": title or None, "title_fontsize": 8}
    if below:
        ncol = min(3, len(labels))
        ax.legend(
            handles,
            labels,
            loc="upper center",
            bbox_to_anchor=(0.5, -0.14),
            ncol=ncol,
            frameon=False,
            **style,
        )
    elif len(labels) > 4:
        ax.legend(handles, labels, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False, **style)
    else:
        ax.legend(handles, labels, loc="best", **style)


def plot_timeline(runs: Mapping[str, SimResults], path: Path, *, title: str = "") -> Path:
    """Goodput of each run against simulated time (µs), as a fraction of its bottleneck (what its hosts can
    move, `SimResults.bottleneck_bps`; per sample interval); a dashed red line and a label at every failure
    event; the number of EVs marked bad on a second axis for MRC runs with failures. A run without its
    failure is dashed, in the same colour. The legend goes below the axes."""
    fig, ax = timeline_figure(runs)
    return _save(fig, ax, title or "goodput over time", path)


def timeline_figure(runs: Mapping[str, SimResults]) -> tuple[Figure, Axes]:
    """`plot_timeline`'s figure, unsaved."""
    fig, ax = plt.subplots(figsize=(9, 5.4), dpi=110)
    ev_ax = None
    failures: dict[int, str] = {}
    colour, style = _colours(list(runs)), _styles(list(runs))
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
            linestyle=style[label],
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
                failures[t] = f"{failures[t]}\n{what}" if t in failures else what  # (rotated: side by side)
    for t, what in sorted(failures.items()):
        ax.axvline(t / 1000, color="red", linestyle="--", linewidth=0.9)
        ax.annotate(
            "\n".join(f"{w} at {t / 1000:g} µs" for w in what.split("\n")),
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
        _legend(ax, handles, labels, below=True)
    return fig, ax


def plot_fct_cdf(runs: Mapping[str, SimResults], path: Path, *, title: str = "") -> Path:
    """Empirical CDF of flow completion times (µs, log axis so that one slow flow does not squeeze the
    others into one line, with enough ticks labelled to read it) of each run. The legend titled with the
    words every run's label starts with (a swept message size named as a size); beside the axes when it has
    more than a few entries."""
    fig, ax = fct_cdf_figure(runs)
    return _save(fig, ax, title or "flow completion times", path)


def fct_cdf_figure(runs: Mapping[str, SimResults]) -> tuple[Figure, Axes]:
    """`plot_fct_cdf`'s figure, unsaved."""
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=110)
    colour, style = _colours(list(runs)), _styles(list(runs))
    common, names = _short_labels(list(runs))
    shown: list[float] = []
    for (label, res), name in zip(runs.items(), names, strict=True):
        fcts = res.fcts_us()
        if fcts:
            n = len(fcts)
            ax.step(
                fcts,
                [(i + 1) / n for i in range(n)],
                where="post",
                label=name,
                color=colour[label],
                linestyle=style[label],
                linewidth=1.5,
            )
            shown += (fcts[0], fcts[-1])
    ax.set_xscale("log")
    if shown:
        _log_ticks(ax.xaxis, min(shown), max(shown))
    ax.set_xlabel("flow completion time (µs, log scale)")
    ax.set_ylabel("fraction of flows finished")
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3, which="major")
    ax.grid(alpha=0.12, which="minor")
    handles, labels = ax.get_legend_handles_labels()
    if handles:
        _legend(ax, handles, labels, title=common)
    return fig, ax


def _short_labels(labels: list[str]) -> tuple[str, list[str]]:
    """The words every label starts with (a legend's title; "" for one label or none) and what is left of
    each, a message size swept (``size_bytes=65536``) written as one (``64 KiB``)."""
    words = [label.split(" ") for label in labels]
    n = 0
    if len(labels) > 1:
        while all(len(w) > n + 1 and w[n] == words[0][n] for w in words):
            n += 1
    rest = [" ".join(w[n:]) for w in words]
    for i, r in enumerate(rest):
        m = re.fullmatch(r"size_(bytes|kib)=(\d+)", r)
        if m:
            rest[i] = _size_label(int(m[2]) << (10 if m[1] == "kib" else 0))
    return " ".join(words[0][:n]), rest


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
    fig.savefig(path, bbox_inches="tight")  # with a legend outside the axes
    plt.close(fig)
    return path
