"""Congestion must not look like failure: every run of a built-in scenario that fails nothing (no link,
switch or NIC port down, no loss injected) ends with no EV ever marked ASSUMED_BAD.

Trims, ECN marks, deep queues, reordering over hundreds of paths and incast at the last hop are all
congestion; an EV is to be blamed only for a loss that no trim explains. The heavy scenarios run in the
compiled pass of the suite only (the interpreted one takes minutes for them)."""

from __future__ import annotations

from typing import Any

import pytest

from openmrc import _native
from openmrc.ev import EVState
from openmrc.sim.scenario import builtin_scenarios, expand_runs, iter_runs, load_scenario

INTERPRETED_LIMIT_S = 3.0
"""Scenarios expected to take longer than this (compiled) run only in the compiled pass."""
TOO_BIG_S = 600.0
"""Scenarios longer than this (`allreduce-131k`: about 45 minutes, 6.5 GB) are left to the benchmark."""


def _failure_free_mrc_runs() -> list[Any]:
    params = []
    for name in sorted(builtin_scenarios()):
        doc = load_scenario(name)
        heavy = float(doc.get("expected_wall_s") or 0) > INTERPRETED_LIMIT_S
        if float(doc.get("expected_wall_s") or 0) > TOO_BIG_S:
            continue
        for run in expand_runs(doc):
            if run.doc.get("failures") or run.doc["fabric"].get("transport", "mrc") != "mrc":
                continue
            marks = [pytest.mark.skipif(not _native.compiled, reason="heavy: run in the compiled pass")]
            pid = f"{name}:{run.label}"
            params.append(pytest.param(name, run.label, id=pid, marks=marks if heavy else []))
    return params


@pytest.mark.parametrize(("name", "label"), _failure_free_mrc_runs())
def test_congestion_marks_no_ev_bad(name: str, label: str) -> None:
    (point,) = [r for r in expand_runs(load_scenario(name)) if r.label == label]  # a variant at a sweep point
    doc = point.doc
    doc["sample_us"] = doc.get("sample_us") or 5  # the sampler collects the EV events
    (run,) = iter_runs(doc)
    assert run.sim is not None and run.results is not None
    assert run.sim.sampler is not None
    run.sim.sampler.sample()  # events since the last sample
    bad = [e for e in run.sim.sampler.ev_log if e[4] == EVState.ASSUMED_BAD.name]
    assert run.results.summary()["completed"] > 0
    assert bad == [], f"{len(bad)} EV(s) marked ASSUMED_BAD without any failure, first: {bad[:3]}"


def test_the_rule_is_checked_where_it_can_fail() -> None:
    """The scenarios above do congest: trims and retransmissions happen, so the rule is not empty."""
    doc = load_scenario("clos-incast")
    (run,) = iter_runs(doc)
    assert run.results is not None
    s = run.results.summary()
    assert s["trims"] > 100 and s["retransmits"] > 100
