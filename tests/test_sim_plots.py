"""The simulator's plots: a colour (and, past the colour cycle, a line style) per series, legends that hide
no curve, log axes labelled densely enough to read, failure labels inside the axes. (What they look like was
checked by eye on paper-message-size, link-failure and the demo.)"""

from __future__ import annotations

import itertools
import random
from pathlib import Path

import matplotlib.pyplot as plt
import pytest
from matplotlib.colors import to_rgba

from openmrc.sim.flows import Flow
from openmrc.sim.metrics import BASELINE_SUFFIX, LinkStat, Sample, SimResults
from openmrc.sim.plots import fct_cdf_figure, plot_fct_cdf, plot_timeline, timeline_figure

SIZES = [4**i for i in range(14)] + [32768]


def results(fcts_us: list[float], *, failure_at_us: float | None = None) -> SimResults:
    """A run's results with these FCTs (flows from host 1 to host 0, two 100G ports each) and a flat
    goodput series."""
    flows = [Flow(1, 0, 4096, 0, id=i, finish=round(f * 1000)) for i, f in enumerate(fcts_us)]
    links = [LinkStat(h, p, 9, 100_000_000_000, 0, 0.0, 0, 0, 0, 0) for h in (0, 1) for p in (0, 1)]
    samples = [Sample(t * 1000, t * 20_000, 160e9, 0, 0, 0) for t in range(50)]
    failures = [] if failure_at_us is None else [(round(failure_at_us * 1000), "plane 0: link down (a ↔ b)")]
    return SimResults(flows, 50_000, 0, links=links, samples=samples, failures=failures)


def sweep(n: int = len(SIZES)) -> dict[str, SimResults]:
    rng = random.Random(1)
    return {
        f"MRC 1 QP size_bytes={size}": results([5 + size / 100_000 * rng.uniform(1, 2) for _ in range(20)])
        for size in SIZES[:n]
    }


def test_every_series_of_a_sweep_has_its_own_colour_or_style() -> None:
    fig, ax = fct_cdf_figure(sweep())
    lines = ax.get_lines()
    assert len(lines) == len(SIZES) == 15
    looks = {(to_rgba(line.get_color()), line.get_linestyle()) for line in lines}
    assert len(looks) == 15
    assert len({to_rgba(line.get_color()) for line in lines}) == 15  # colours alone already differ
    for a, b in itertools.pairwise(lines):  # neighbours on the colour map: styles differ too
        assert a.get_linestyle() != b.get_linestyle()
    plt.close(fig)
    fig, ax = fct_cdf_figure(sweep(4))  # few: the colour cycle, solid lines
    cycle = [to_rgba(c) for c in plt.rcParams["axes.prop_cycle"].by_key()["color"]]
    assert [to_rgba(line.get_color()) for line in ax.get_lines()] == cycle[:4]
    assert {line.get_linestyle() for line in ax.get_lines()} == {"-"}
    plt.close(fig)


def test_a_long_legend_sits_beside_the_axes_with_sizes_for_labels() -> None:
    fig, ax = fct_cdf_figure(sweep())
    fig.canvas.draw()
    legend = ax.get_legend()
    assert legend is not None
    inside = ax.get_window_extent()
    box = legend.get_window_extent()
    assert box.x0 >= inside.x1  # right of the axes: it covers no curve
    assert legend.get_title().get_text() == "MRC 1 QP"
    labels = [t.get_text() for t in legend.get_texts()]
    assert labels[:3] == ["1 B", "4 B", "16 B"] and "256 KiB" in labels and labels[-1] == "32 KiB"
    plt.close(fig)


@pytest.mark.parametrize(
    ("lo", "hi", "want"),
    [
        (85.0, 450.0, [80, 100, 150, 200, 300, 400]),  # link-failure's FCTs: 1-2-5 labelled only 100 and 200
        (5.0, 700.0, [5, 10, 20, 50, 100, 200, 500]),
        (3.0, 3e6, [10, 100, 1_000, 10_000, 100_000, 1_000_000]),
    ],
)
def test_a_log_axis_labels_enough_ticks_to_read_a_value(lo: float, hi: float, want: list[int]) -> None:
    fig, ax = fct_cdf_figure({"run": results([lo, (lo * hi) ** 0.5, hi])})
    fig.canvas.draw()
    lo_shown, hi_shown = ax.get_xlim()
    labelled = [
        t.get_loc()
        for t in ax.xaxis.get_major_ticks()
        if lo_shown <= t.get_loc() <= hi_shown and t.label1.get_text()
    ]
    assert [round(x) for x in labelled] == want
    texts = [t.get_text() for t in ax.get_xticklabels() if t.get_text()]
    assert "1,000" in texts or hi < 1000
    plt.close(fig)


def test_the_timeline_keeps_its_legend_and_failure_labels_clear_of_the_curves(tmp_path: Path) -> None:
    runs = {
        "MRC": results([20.0], failure_at_us=10),
        "RoCEv2": results([30.0], failure_at_us=10),
        "MRC" + BASELINE_SUFFIX: results([18.0]),
    }
    runs["RoCEv2"].failures.append((10_000, "host 5 NIC port 1 down"))
    fig, ax = timeline_figure(runs)
    fig.canvas.draw()
    legend = ax.get_legend()
    assert legend is not None and legend.get_window_extent().y1 <= ax.get_window_extent().y0  # below
    (note,) = [t for t in ax.texts if "at 10 µs" in t.get_text()]
    assert note.get_text() == "plane 0: link down at 10 µs\nhost 5 NIC port 1 down at 10 µs"
    assert note.get_window_extent().y1 <= ax.get_window_extent().y1  # inside the axes
    mrc, _roce, base = ax.get_lines()[:3]
    assert base.get_color() == mrc.get_color() and base.get_linestyle() == "--"
    assert ax.get_ylabel() == "goodput, fraction of the bottleneck = 200 Gb/s"
    assert max(mrc.get_ydata()) == pytest.approx(0.8)  # 160 Gb/s into one host of two 100G ports
    plt.close(fig)
    for plot in (plot_timeline, plot_fct_cdf):
        path = plot(runs, tmp_path / f"{plot.__name__}.png")
        assert path.stat().st_size > 10_000
