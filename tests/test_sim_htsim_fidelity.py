"""Agreement with UEC's htsim where its validation runs are reproduced (the htsim-* scenarios).

htsim's figures come from its sender-CC-only runs (``validate_uec_sender.out``: ``-sender_cc_only``),
which ECN-mark the ToR downlink as well (``set_ecn_parameters(true, !receiver_driven, …)``), so the
scenarios set ``fabric.last_hop_ecn``.
"""

from __future__ import annotations

import statistics

import pytest

from openmrc.sim.scenario import load_scenario, run_scenario

HTSIM_INCAST_RTX = 811
"""htsim, 15 → 1 incast of 2 MB, sender CC only: retransmissions (= NACKs)."""
HTSIM_INCAST_MEDIAN_US = 2287.7
HTSIM_INCAST_TAIL_US = 2478.5


def _last_hop_marks(last_hop_ecn: bool) -> tuple[int, int]:
    """ECN marks on switch ports toward hosts, and on the other switch ports, in a small incast."""
    doc = load_scenario("htsim-incast-15", [f"fabric.last_hop_ecn={str(last_hop_ecn).lower()}"])
    (r,) = run_scenario(doc, variants=["MRC 128 EVs"])
    assert r.sim is not None and r.results is not None
    hosts = r.sim.topo.num_hosts
    last = sum(s.ecn_marks for s in r.results.links if s.node >= hosts and s.peer < hosts)
    other = sum(s.ecn_marks for s in r.results.links if s.node >= hosts and s.peer >= hosts)
    return last, other


def test_the_last_hop_is_marked_only_when_the_fabric_says_so() -> None:
    last, _ = _last_hop_marks(False)
    assert last == 0  # MRC's rule: every hop but the last
    last, _ = _last_hop_marks(True)
    assert last > 0


@pytest.mark.slow
def test_incast_retransmissions_and_median_agree_with_htsim() -> None:
    (r,) = run_scenario(load_scenario("htsim-incast-15"), variants=["MRC 128 EVs"])
    assert r.results is not None
    fcts = r.results.fcts_us()
    assert len(fcts) == 15
    rtx = r.results.counters["retransmits"]
    assert rtx <= 1.5 * HTSIM_INCAST_RTX
    assert statistics.median(fcts) == pytest.approx(HTSIM_INCAST_MEDIAN_US, rel=0.10)
    assert max(fcts) == pytest.approx(HTSIM_INCAST_TAIL_US, rel=0.05)
