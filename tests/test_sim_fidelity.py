"""Protocol efficacy on the built-in scenarios: random loss is recovered on the QP's own RTT."""

from __future__ import annotations

from openmrc.sim.scenario import load_scenario, run_scenario


def test_random_loss_is_recovered_on_the_qps_own_rtt() -> None:
    """1 % loss on every link: spraying and SACKs recover each loss in about one RTT of the QP's own
    path (not the fabric's longest), so the ring all-reduce keeps at least half its lossless goodput (it
    kept 0.42 when every loss waited 2·max(srtt, base RTT); the paper reports ~1/3), and the lossless run
    resends nothing (a short loss wait must not mistake reordering for loss)."""
    doc = load_scenario("paper-allreduce-loss")  # full size: with one packet per step any recovery is cheap
    doc["sweep"] = {"failures.0.probability": [0.0, 0.01]}
    lossless, lossy = (r.report() for r in run_scenario(doc, variants=["MRC all-reduce"]))
    assert lossy["retransmits"] > 0 and lossless["retransmits"] == 0
    assert lossy["job_goodput_gbps"] >= 0.5 * lossless["job_goodput_gbps"], (lossy, lossless)
