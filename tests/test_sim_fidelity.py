"""Protocol efficacy on the built-in scenarios: congestion never looks like failure, and random loss is
recovered without waiting several RTTs (``paper-allreduce-loss``)."""

from __future__ import annotations

from typing import Any

import pytest

from openmrc.sim.scenario import builtin_scenarios, expand_runs, load_scenario, run_scenario

from .test_sim_scenarios import SHRUNK

FULL_SIZE_WALL_S = 2.0
"""Scenarios that run this fast (``expected_wall_s``, every variant, compiled) are checked at full size:
the congestion that once made EVs look failed needs the real load. Slower ones run shrunk (`SHRUNK`)."""


def _has_failures(doc: dict[str, Any]) -> bool:
    """Whether any variant of the scenario injects a failure (its own ``[[failures]]`` or a variant's)."""
    return bool(doc.get("failures")) or any(r.doc.get("failures") for r in expand_runs(doc))


def _failure_free() -> list[str]:
    return sorted(n for n in builtin_scenarios() if not _has_failures(load_scenario(n)))


def test_the_failure_free_set_is_what_the_scenarios_say() -> None:
    names = _failure_free()
    assert "htsim-incast-15" in names and "paper-incast-victim" in names
    assert "link-failure" not in names and "demo" not in names and "paper-allreduce-loss" not in names


@pytest.mark.parametrize("name", _failure_free())
def test_no_ev_is_assumed_bad_without_a_failure(name: str) -> None:
    """Incast, victims, permutations: trims, queues and reordering, but no path fails, so no MRC run may
    mark an EV ASSUMED_BAD."""
    doc = load_scenario(name)
    if float(doc.get("expected_wall_s", 0)) > FULL_SIZE_WALL_S:
        doc = load_scenario(name, SHRUNK[name])
    mrc = [str(v["name"]) for v in doc.get("variants", []) if "roce" not in " ".join(v.get("set", []))]
    runs = run_scenario(doc, variants=mrc or None)
    assert runs
    for r in runs:
        assert r.results is not None
        rep = r.results.report()
        assert rep["completed"] == rep["flows"] > 0, r.label
        assert rep["ev_to_bad"] == 0, (r.label, r.results.sampler.ev_log[:5])


def test_random_loss_is_recovered_on_the_qps_own_rtt() -> None:
    """1 % loss on every link: spraying and SACKs recover each loss in about one RTT of the QP's own
    path (not the fabric's longest), so the ring all-reduce keeps 0.48 of its lossless goodput (0.42
    when every loss waited 2·max(srtt, base RTT); the paper reports ~1/3)."""
    doc = load_scenario("paper-allreduce-loss")  # full size: with one packet per step any recovery is cheap
    doc["sweep"] = {"failures.0.probability": [0.0, 0.01]}
    lossless, lossy = (r.report() for r in run_scenario(doc, variants=["MRC all-reduce"]))
    assert lossy["retransmits"] > 0 and lossless["retransmits"] == 0
    assert lossy["job_goodput_gbps"] >= 0.46 * lossless["job_goodput_gbps"], (lossy, lossless)
