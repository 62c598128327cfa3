"""Fidelity: openmrc's figures beside htsim's and the MRC paper's, each from a built-in scenario run here.

  incast_retransmits      htsim-incast-15, MRC 128 EVs: retransmitted packets
  incast_median_fct_us    the same run: median FCT (ideal 2,400 µs: 15 × 2 MB through one 100 Gb/s link)
  tail_fct_us_1ev         htsim-perm-1024 (k=16), MRC 1 EV: tail FCT, median over seeds 1-5 (htsim 889.9 µs);
                          each seed's tail and its busiest link's flow count are printed too
  allreduce_loss1_ratio   paper-allreduce-loss, MRC ring all-reduce: job goodput at 1 % loss on every link
                          over that with no loss (paper: MRC keeps ≈ 1/3)
  p2p_latency_us_t0, _t1  paper-latency: a 2-byte Write, post to the receiver's completion, within one T0
                          and across T1 (paper, ib_write_lat: 5.09 and 6.54 µs)
  bw_32k_fraction         paper-message-size at 32 KiB: bandwidth as a fraction of 8 × 100 Gb/s (paper ≈ 0.96)

    python benchmarks/fidelity_bench.py [--json] [--quick]

``--json`` prints one object: each figure under its key, and the references beside it under the same key with
``_htsim``, ``_paper`` or ``_ideal`` appended (null where that source gives none). References come from the
scenarios' own ``[[references]]`` where they have them. ``--quick`` runs the 1-EV permutation on htsim's k=8
fat tree (128 hosts; no htsim figure to compare) and the all-reduce with 256 KiB per rank.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

from openmrc.sim.scenario import load_scenario, run_scenario

KEYS = (
    "incast_retransmits",
    "incast_median_fct_us",
    "tail_fct_us_1ev",
    "allreduce_loss1_ratio",
    "p2p_latency_us_t0",
    "p2p_latency_us_t1",
    "bw_32k_fraction",
)
SOURCES = ("htsim", "paper", "ideal")
DETAILS = ("tail_fct_us_1ev_by_seed", "busiest_link_flows_1ev_by_seed")
"""Printed after the table (and under their keys with --json)."""
PERM_1EV_SEEDS = (1, 2, 3, 4, 5)
ALLREDUCE_LOSS1_PAPER = 1 / 3
"""MRC-SPEC-NOTES §7: with 1 % loss on all planes MRC keeps about a third of its throughput."""


def _reference(doc: dict[str, Any], variant: str, figure: str, source: str) -> float | None:
    for ref in doc.get("references", []):
        if (ref["variant"], ref["figure"], ref["source"]) == (variant, figure, source):
            return float(ref["value"])
    return None


def _reports(doc: dict[str, Any], variants: list[str]) -> list[dict[str, Any]]:
    return [r.report() for r in run_scenario(doc, variants=variants)]


def incast() -> dict[str, Any]:
    doc = load_scenario("htsim-incast-15", ["sample_us=0"])
    (rep,) = _reports(doc, ["MRC 128 EVs"])
    return {
        "incast_retransmits": rep["retransmits"],
        "incast_retransmits_htsim": _reference(doc, "MRC 128 EVs", "retransmits", "htsim"),
        "incast_median_fct_us": rep.get("median_fct_us"),
        "incast_median_fct_us_htsim": _reference(doc, "MRC 128 EVs", "median_fct_us", "htsim"),
        "incast_median_fct_us_ideal": _reference(doc, "MRC 128 EVs", "max_fct_us", "ideal"),
    }


def perm_1ev(quick: bool) -> dict[str, Any]:
    """With one EV a flow keeps one path, so the tail is set by the busiest link: the flows the ECMP hash
    put on it share it (n flows of 2 MB through 100 Gb/s: n × 160 µs at best). That count depends on the
    seed's entropy draw (htsim draws its own), so the figure is the median tail over `PERM_1EV_SEEDS`,
    with each seed's tail and busiest-link flow count beside it."""
    seeds = PERM_1EV_SEEDS[:1] if quick else PERM_1EV_SEEDS
    tails: list[float] = []
    busiest: list[int] = []
    doc: dict[str, Any] = {}
    for seed in seeds:
        over = ["sample_us=0", f"fabric.seed={seed}"]
        if quick:
            over += ["fabric.k=8", 'workload.file="perm_128n_128c_2MB.cm"']
        doc = load_scenario("htsim-perm-1024", over)
        (run,) = run_scenario(doc, variants=["MRC 1 EV"])
        assert run.sim is not None
        tails.append(run.report()["max_fct_us"])
        size = max(f.size for f in run.sim.flows)
        busiest.append(max(s.sent_bytes for s in run.sim.link_stats()) // size)
    return {
        "tail_fct_us_1ev": statistics.median(tails),
        "tail_fct_us_1ev_htsim": None if quick else _reference(doc, "MRC 1 EV", "max_fct_us", "htsim"),
        "tail_fct_us_1ev_by_seed": tails,
        "busiest_link_flows_1ev_by_seed": busiest,
    }


def allreduce_loss(quick: bool) -> dict[str, Any]:
    over = ["sample_us=0", 'sweep={"failures.0.probability" = [0.0, 0.01]}']
    if quick:
        over.append("workload.size_kib=256")
    clean, lossy = _reports(load_scenario("paper-allreduce-loss", over), ["MRC all-reduce"])
    ratio = None
    if clean.get("job_goodput_gbps") and lossy.get("job_goodput_gbps"):
        ratio = lossy["job_goodput_gbps"] / clean["job_goodput_gbps"]
    return {"allreduce_loss1_ratio": ratio, "allreduce_loss1_ratio_paper": ALLREDUCE_LOSS1_PAPER}


def latency() -> dict[str, Any]:
    doc = load_scenario("paper-latency")
    t0, t1 = _reports(doc, ["MRC within T0", "MRC across T1"])
    return {
        "p2p_latency_us_t0": t0.get("median_delivery_us"),
        "p2p_latency_us_t0_paper": _reference(doc, "MRC within T0", "median_delivery_us", "paper"),
        "p2p_latency_us_t1": t1.get("median_delivery_us"),
        "p2p_latency_us_t1_paper": _reference(doc, "MRC across T1", "median_delivery_us", "paper"),
    }


def bandwidth_32k() -> dict[str, Any]:
    doc = load_scenario("paper-message-size", ['sweep={"workload.size_bytes" = [32768]}'])
    (rep,) = _reports(doc, ["MRC 1 QP"])
    return {
        "bw_32k_fraction": rep.get("goodput_fraction"),
        "bw_32k_fraction_paper": _reference(doc, "MRC 1 QP", "goodput_fraction", "paper"),
    }


def figures(quick: bool) -> dict[str, Any]:
    """Every figure and its references, in `KEYS` order (references beside each, null when unknown)."""
    got: dict[str, Any] = {}
    got |= incast()
    got |= perm_1ev(quick)
    got |= allreduce_loss(quick)
    got |= latency()
    got |= bandwidth_32k()
    out: dict[str, Any] = {}
    for key in KEYS:
        out[key] = got.get(key)
        for source in SOURCES:
            if f"{key}_{source}" in got:
                out[f"{key}_{source}"] = got[f"{key}_{source}"]
    for key in DETAILS:
        out[key] = got.get(key)
    return out


def _fmt(v: Any) -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:,.1f}" if abs(v) >= 100 else f"{v:.3g}"
    return f"{v:,}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--quick", action="store_true", help="smaller permutation and all-reduce (see above)")
    a = ap.parse_args()
    t0 = time.perf_counter()
    out = figures(a.quick)
    if a.json:
        print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in out.items()}))
        return
    print(f"{'figure':24s} {'openmrc':>10s} {'htsim':>10s} {'paper':>10s} {'ideal':>10s}")
    for key in KEYS:
        refs = [_fmt(out.get(f"{key}_{s}")) for s in SOURCES]
        print(f"{key:24s} {_fmt(out[key]):>10s} " + " ".join(f"{r:>10s}" for r in refs))
    tails, busiest = out["tail_fct_us_1ev_by_seed"], out["busiest_link_flows_1ev_by_seed"]
    for seed, tail, n in zip(PERM_1EV_SEEDS[: len(tails)], tails, busiest, strict=True):
        print(f"  1 EV, seed {seed}: tail {tail:,.1f} µs, {n} flows on the busiest link")
    print(f"({'quick, ' if a.quick else ''}{time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
