"""NSCC: config defaults and validation, the four quadrants, MD gate, fast increase, quick adapt, clamps."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from openmrc.transport.nscc import (
    DELAY_EWMA_WEIGHT,
    MIN_MAX_CWND,
    REFERENCE_BDP_BYTES,
    Nscc,
    NsccConfig,
)

MTU = 4096
G100 = 100_000_000_000
BASE = 10_000  # ns
TARGET = 7_500  # 0.75 · BASE with trimming
QA_PERIOD = BASE + TARGET
NO_PERIOD = (1 << 32) - 1  # adjust_period_threshold that never elapses in a test


def config(**changes: Any) -> NsccConfig:
    """100 Gb/s, 10 µs, 4 KiB MTU, trimming on, with ``changes`` applied."""
    return dataclasses.replace(NsccConfig.defaults(G100, BASE, MTU), **changes)


def nscc(cwnd: int | None = None, **changes: Any) -> Nscc:
    cc = Nscc(mtu=MTU, config=config(**changes), now=0)
    if cwnd is not None:
        cc.cwnd = cwnd
    return cc


def ack(
    cc: Nscc, now: int, *, delay: int | None, nbytes: int = MTU, ecn: bool = False, inflight: int = 0
) -> None:
    """One SACK whose RTT sample is ``BASE + delay`` (no sample if ``delay`` is None)."""
    rtt = None if delay is None else BASE + delay
    cc.on_ack(now=now, newly_acked=nbytes, inflight=inflight, rtt_ns=rtt, ecn=ecn)


# -- config defaults -----------------------------------------------------------------------------------------


def test_defaults_100g_10us_trimming() -> None:
    c = NsccConfig.defaults(G100, BASE, MTU, trimming=True)
    a = 125_000 / 150_000  # BDP 125 000 B over the 150 000 B reference
    assert c.disable_qa is False
    assert c.adjust_bytes_threshold == 32_768
    assert c.adjust_period_threshold == 10_000
    assert c.base_rtt == 10_000
    assert c.eta == pytest.approx(512.0)
    assert c.fi == pytest.approx(17_066.666_666_7)
    assert c.fi_scale == pytest.approx(0.208_333_333)
    assert c.gamma == 0.8
    assert c.max_md_jump == 0.5
    assert c.max_cwnd == 187_500
    assert c.qa_gate == 3
    assert c.qa_threshold == 30_000
    assert c.target_delay == 7_500
    b = 7_500 / 12_000
    assert c.alpha == pytest.approx(4 * MTU * a * b / 7_500)
    assert c.alpha == pytest.approx(1.137_777_78)


def test_defaults_100g_10us_no_trimming() -> None:
    c = NsccConfig.defaults(G100, BASE, MTU, trimming=False)
    assert c.target_delay == 10_000
    assert c.qa_threshold == 40_000
    assert c.max_cwnd == 187_500
    assert c.eta == pytest.approx(512.0)
    assert c.fi == pytest.approx(17_066.666_666_7)
    # b/target is 1/12 µs whatever the target, so alpha does not depend on trimming.
    assert c.alpha == pytest.approx(4 * MTU * (125_000 / 150_000) * (10_000 / 12_000) / 10_000)


def test_defaults_reference_network_has_unit_scaling() -> None:
    c = NsccConfig.defaults(G100, 12_000, MTU)
    assert REFERENCE_BDP_BYTES == 150_000
    assert c.max_cwnd == 225_000
    assert c.fi_scale == pytest.approx(0.25)
    assert c.fi == pytest.approx(5 * MTU)
    assert c.eta == pytest.approx(0.15 * MTU)
    assert c.target_delay == 9_000


def test_defaults_scale_with_link_speed() -> None:
    c = NsccConfig.defaults(8 * G100, BASE, MTU)
    assert c.max_cwnd == 8 * 187_500
    assert c.fi_scale == pytest.approx(8 * 0.208_333_333)


@pytest.mark.parametrize("arg", ["link_bps", "base_rtt_ns", "mtu"])
def test_defaults_reject_non_positive(arg: str) -> None:
    kwargs: dict[str, Any] = {"link_bps": G100, "base_rtt_ns": BASE, "mtu": MTU, arg: 0}
    with pytest.raises(ValueError, match=arg):
        NsccConfig.defaults(**kwargs)


def test_defaults_made_once_per_network() -> None:
    """One config per network (immutable, so shared); each new network's arguments still checked."""
    a = NsccConfig.defaults(G100, BASE, MTU)
    assert NsccConfig.defaults(G100, BASE, MTU) is a
    assert NsccConfig.defaults(G100, BASE, MTU, trimming=False) != a
    assert NsccConfig.defaults(G100, BASE + 1, MTU).base_rtt == BASE + 1
    with pytest.raises(ValueError, match="mtu"):
        NsccConfig.defaults(G100, BASE, 0)  # checked, not looked up


def test_nscc_without_config_uses_reference_defaults() -> None:
    cc = Nscc(mtu=MTU)
    assert cc.config == NsccConfig.defaults(G100, 12_000, MTU)
    assert cc.cwnd == 225_000


# -- config validation ---------------------------------------------------------------------------------------


def test_config_fields_match_the_c_struct_in_order() -> None:
    assert NsccConfig.field_names() == (
        "disable_qa",
        "adjust_bytes_threshold",
        "adjust_period_threshold",
        "base_rtt",
        "eta",
        "fi",
        "fi_scale",
        "gamma",
        "max_md_jump",
        "max_cwnd",
        "qa_gate",
        "qa_threshold",
        "target_delay",
    )


def test_config_is_frozen() -> None:
    c = config()
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.base_rtt = 1  # type: ignore[misc]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("disable_qa", 1),
        ("adjust_bytes_threshold", -1),
        ("adjust_bytes_threshold", 1 << 32),
        ("adjust_period_threshold", -1),
        ("adjust_period_threshold", 2.5),
        ("base_rtt", 0),
        ("base_rtt", 1 << 32),
        ("base_rtt", True),
        ("eta", -1.0),
        ("eta", float("nan")),
        ("fi", float("inf")),
        ("fi", "5"),
        ("fi_scale", -0.1),
        ("fi_scale", 1e39),
        ("gamma", -0.01),
        ("gamma", 1.01),
        ("max_md_jump", 0.0),
        ("max_md_jump", 1.5),
        ("max_cwnd", MIN_MAX_CWND - 1),
        ("max_cwnd", 1 << 32),
        ("qa_gate", -1),
        ("qa_gate", 32),
        ("qa_threshold", -1),
        ("qa_threshold", 1 << 32),
        ("target_delay", 0),
        ("target_delay", 1 << 32),
    ],
)
def test_config_validation_names_the_field(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field):
        config(**{field: value})


@pytest.mark.parametrize(
    ("field", "value"),
    [("gamma", 0.0), ("gamma", 1.0), ("max_md_jump", 1.0), ("qa_gate", 31), ("max_cwnd", (1 << 32) - 1)],
)
def test_config_accepts_boundaries(field: str, value: object) -> None:
    assert getattr(config(**{field: value}), field) == value


def test_max_cwnd_below_mtu_is_rejected_by_the_controller() -> None:
    with pytest.raises(ValueError, match="max_cwnd"):
        Nscc(mtu=MTU, config=config(max_cwnd=MTU - 1))


def test_wrong_config_type_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="NsccConfig"):
        Nscc(mtu=MTU, config=object())


# -- start and the cwnd setter -------------------------------------------------------------------------------


def test_starts_at_max_cwnd_and_gates_sends() -> None:
    cc = nscc()
    assert cc.cwnd == 187_500
    assert cc.can_send(187_500 - MTU, MTU)
    assert not cc.can_send(187_500 - MTU + 1, MTU)


def test_cwnd_setter_clamps() -> None:
    cc = nscc()
    cc.cwnd = 1
    assert cc.cwnd == MTU
    cc.cwnd = 10**9
    assert cc.cwnd == 187_500


# -- quadrant 1: no ECN, delay < target → proportional increase ----------------------------------------------


def grow(delay: int) -> int:
    """cwnd after nine 4 KiB SACKs at ``delay`` from 100 000: the ninth crosses adjust_bytes_threshold."""
    cc = nscc(100_000, disable_qa=True)
    for i in range(8):
        ack(cc, 1 + i, delay=delay)
        assert cc.cwnd == 100_000  # accumulated in inc, not applied yet
    ack(cc, 9, delay=delay)
    assert cc.pending_increase == 0.0
    return cc.cwnd


def test_proportional_increase_applied_after_bytes_threshold() -> None:
    alpha = config().alpha
    expected = 100_000 + alpha * 9 * MTU * (TARGET - 3_000) / 100_000
    assert grow(3_000) == int(expected)
    assert grow(3_000) > 100_000


def test_proportional_increase_is_proportional_to_headroom() -> None:
    small = grow(TARGET - 1_500) - 100_000
    large = grow(TARGET - 4_500) - 100_000
    assert large == pytest.approx(3 * small, abs=3)


def test_proportional_increase_accumulates_in_inc() -> None:
    cc = nscc(100_000, disable_qa=True)
    ack(cc, 1, delay=2_000)
    assert cc.pending_increase == pytest.approx(cc.alpha * MTU * (TARGET - 2_000))


def test_adjust_period_applies_inc_and_eta() -> None:
    cc = nscc(100_000, disable_qa=True)
    ack(cc, 1, delay=2_000)
    inc = cc.pending_increase
    ack(cc, BASE + 1, delay=2_000)  # period passed: inc of both SACKs plus eta
    expected = 100_000 + (2 * inc) / 100_000 + config().eta
    assert cc.cwnd == int(expected)


def test_bytes_threshold_without_period_adds_no_eta() -> None:
    cc = nscc(100_000, disable_qa=True)
    ack(cc, 1, delay=2_000, nbytes=40_000)
    assert cc.cwnd == int(100_000 + cc.alpha * 40_000 * (TARGET - 2_000) / 100_000)


# -- quadrant 2: no ECN, delay ≥ target → fair increase ------------------------------------------------------


def test_fair_increase_does_not_depend_on_delay() -> None:
    results = []
    for delay in (TARGET, 20_000, 60_000):
        cc = nscc(100_000, disable_qa=True)
        for i in range(9):
            ack(cc, 1 + i, delay=delay)
        results.append(cc.cwnd)
    expected = 100_000 + config().fi * 9 * MTU / 100_000
    assert results == [int(expected)] * 3


def test_fair_increase_accumulates_fi_times_bytes() -> None:
    cc = nscc(100_000, disable_qa=True)
    ack(cc, 1, delay=TARGET + 1, nbytes=1_000)
    assert cc.pending_increase == pytest.approx(config().fi * 1_000)
    assert cc.md_count == 0


# -- quadrant 3: ECN, delay ≥ target → multiplicative decrease -----------------------------------------------


def test_md_follows_the_formula() -> None:
    cc = nscc(disable_qa=True)
    ack(cc, 1, delay=800_000, ecn=True)  # pushes the slow average to 0.0125 · 800 µs = 10 µs
    avg = cc.avg_delay
    assert avg == pytest.approx(DELAY_EWMA_WEIGHT * 800_000)
    factor = 1 - 0.8 * (avg - TARGET) / avg
    assert factor == pytest.approx(0.8)
    assert cc.cwnd == int(187_500 * factor)
    assert cc.md_count == 1


def test_md_floor_is_max_md_jump() -> None:
    cc = nscc(disable_qa=True)
    ack(cc, 1, delay=100_000_000, ecn=True)  # formula alone would keep only ~20%
    assert 1 - 0.8 * (cc.avg_delay - TARGET) / cc.avg_delay < 0.5
    assert cc.cwnd == 187_500 // 2
    cc2 = nscc(disable_qa=True, max_md_jump=0.7)
    ack(cc2, 1, delay=100_000_000, ecn=True)
    assert cc2.cwnd == int(187_500 * 0.7)


def test_md_needs_average_delay_above_target() -> None:
    cc = nscc(disable_qa=True)
    ack(cc, 1, delay=2 * TARGET, ecn=True)  # instantaneous delay high, average still tiny
    assert cc.avg_delay < TARGET
    assert cc.cwnd == 187_500
    assert cc.md_count == 0


def test_md_at_most_once_per_base_rtt() -> None:
    cc = nscc(disable_qa=True, adjust_period_threshold=NO_PERIOD)
    ack(cc, 1, delay=800_000, ecn=True)
    first = cc.cwnd
    ack(cc, 2, delay=800_000, ecn=True)
    ack(cc, 1 + BASE, delay=800_000, ecn=True)  # exactly base_rtt later: still gated
    assert cc.md_count == 1
    assert cc.cwnd == first
    ack(cc, 2 + BASE, delay=800_000, ecn=True)
    assert cc.md_count == 2
    assert cc.cwnd < first


def test_gamma_zero_never_decreases() -> None:
    cc = nscc(disable_qa=True, gamma=0.0)
    ack(cc, 1, delay=800_000, ecn=True)
    assert cc.cwnd == 187_500


# -- quadrant 4: ECN, delay < target → no change -------------------------------------------------------------


def test_ecn_with_low_delay_changes_nothing() -> None:
    cc = nscc(100_000, disable_qa=True)
    ack(cc, 1, delay=2_000)
    inc = cc.pending_increase
    for i in range(5):
        ack(cc, 2 + i, delay=TARGET - 1, ecn=True)
    assert cc.cwnd == 100_000
    assert cc.pending_increase == inc
    assert cc.md_count == 0


# -- delay sample ------------------------------------------------------------------------------------------


def test_service_time_is_not_queueing_delay() -> None:
    cc = nscc(100_000, disable_qa=True)
    cc.on_ack(now=1, newly_acked=MTU, inflight=0, rtt_ns=BASE + 9_000, ecn=False, service_ns=6_000)
    assert cc.last_delay == 3_000
    assert cc.pending_increase == pytest.approx(cc.alpha * MTU * (TARGET - 3_000))


def test_rtt_below_base_is_zero_delay() -> None:
    cc = nscc(100_000, disable_qa=True)
    cc.on_ack(now=1, newly_acked=MTU, inflight=0, rtt_ns=BASE - 500, ecn=False)
    assert cc.last_delay == 0


def test_missing_rtt_uses_average_delay_without_updating_it() -> None:
    cc = nscc(disable_qa=True)
    ack(cc, 1, delay=800_000, ecn=True)
    avg = cc.avg_delay
    ack(cc, 2, delay=None, ecn=True)
    assert cc.avg_delay == avg
    assert cc.last_delay == int(avg)


def test_unmarked_high_delay_pulls_average_towards_quarter_base_rtt() -> None:
    cc = nscc(disable_qa=True)
    ack(cc, 1, delay=800_000)
    assert cc.avg_delay == pytest.approx(DELAY_EWMA_WEIGHT * BASE / 4)


# -- fast increase -------------------------------------------------------------------------------------------


def test_fast_increase_after_a_whole_window_at_zero_delay() -> None:
    cc = nscc(60_000, disable_qa=True, adjust_bytes_threshold=NO_PERIOD)
    acked = 0
    now = 1
    while acked + MTU <= cc.cwnd:  # less than a window acknowledged: proportional only
        ack(cc, now, delay=0)
        acked += MTU
        now += 1
        assert cc.fast_increase_count == 0
    assert cc.cwnd == 60_000
    before = cc.cwnd
    ack(cc, now, delay=0)  # the byte count now exceeds the window
    assert cc.fast_increase_count == 1
    assert cc.cwnd == int(before + MTU * config().fi_scale)
    ack(cc, now + 1, delay=500)  # still ≈ 0: stays in fast mode
    assert cc.fast_increase_count == 2
    ack(cc, now + 2, delay=2_000)  # a real delay ends it and resets the count
    grown = cc.cwnd
    ack(cc, now + 3, delay=0)
    assert cc.fast_increase_count == 2
    assert cc.cwnd == grown


def test_fast_mode_persists_until_a_delay_appears() -> None:
    cc = nscc(20_000, disable_qa=True, adjust_bytes_threshold=NO_PERIOD)
    for i in range(5):  # the fifth SACK brings the count to 20 480 > 20 000
        ack(cc, 1 + i, delay=0)
    assert cc.fast_increase_count == 1
    cc.cwnd = 150_000  # far above the bytes counted so far: fast mode still holds
    ack(cc, 10, delay=0)
    assert cc.fast_increase_count == 2
    assert cc.cwnd == int(150_000 + MTU * config().fi_scale)


def test_no_fast_increase_with_small_but_real_delay() -> None:
    cc = nscc(60_000, disable_qa=True)
    for i in range(100):
        ack(cc, 1 + i, delay=1_000)
    assert cc.fast_increase_count == 0
    assert cc.cwnd > 60_000


# -- quick adapt ---------------------------------------------------------------------------------------------


def open_period(cc: Nscc, now: int = 100) -> int:
    """First event: opens the first quick-adapt period; returns its end."""
    ack(cc, now, delay=1_000, nbytes=0)
    return now + QA_PERIOD


def test_quick_adapt_on_trim() -> None:
    cc = nscc()
    end = open_period(cc)
    ack(cc, 200, delay=1_000, nbytes=8_192)
    cc.on_trim(now=end + 1, size=MTU, inflight=0, last_hop=False)
    assert cc.qa_count == 1
    assert cc.cwnd == 8_192  # achieved, and no extra trim decrease


def test_loss_shrinks_the_window_by_one_mtu_without_quick_adapt() -> None:
    # htsim mark_packet_for_retransmission: a loss without a trim is random loss or a failed path, not
    # the overload quick adapt is for (a trim in the same position does quick adapt: the test above)
    cc = nscc()
    end = open_period(cc)
    ack(cc, 200, delay=1_000, nbytes=12_288)
    before = cc.cwnd
    cc.on_loss(now=end + 1, inflight=0)
    assert cc.qa_count == 0
    assert cc.cwnd == before - cc.mtu


def test_quick_adapt_on_delay_above_threshold() -> None:
    cc = nscc()
    end = open_period(cc)
    ack(cc, 200, delay=1_000, nbytes=8_192)
    ack(cc, end + 1, delay=30_001, nbytes=0)
    assert cc.qa_count == 1
    assert cc.cwnd == 8_192


def test_no_quick_adapt_on_delay_at_threshold() -> None:
    cc = nscc()
    end = open_period(cc)
    ack(cc, 200, delay=1_000, nbytes=8_192)
    ack(cc, end + 1, delay=30_000, nbytes=0)
    assert cc.qa_count == 0


def test_quick_adapt_never_raises_the_window() -> None:
    cc = nscc()
    end = open_period(cc)
    ack(cc, 200, delay=1_000, nbytes=20_000)
    cc.cwnd = 8_192
    cc.on_trim(now=end + 1, size=MTU, inflight=0, last_hop=False)
    assert cc.qa_count == 1
    assert cc.cwnd == 8_192


def test_quick_adapt_consumes_the_trim_trigger() -> None:
    cc = nscc()
    end = open_period(cc)
    cc.on_trim(now=end + 1, size=MTU, inflight=0, last_hop=False)
    assert cc.qa_count == 1
    cc.cwnd = 100_000
    ack(cc, end + 2, delay=1_000, nbytes=MTU)
    ack(cc, end + 2 + QA_PERIOD, delay=1_000, nbytes=0)  # period over, little achieved, but no new trim
    assert cc.qa_count == 1
    assert cc.cwnd >= 100_000


def test_quick_adapt_floor_is_mtu() -> None:
    cc = nscc()
    end = open_period(cc)
    cc.on_trim(now=end + 1, size=MTU, inflight=0, last_hop=False)
    assert cc.qa_count == 1
    assert cc.cwnd == MTU


def test_no_quick_adapt_when_achieved_reaches_gate() -> None:
    cc = nscc()
    end = open_period(cc)
    ack(cc, 200, delay=1_000, nbytes=187_500 >> 3)
    before = cc.cwnd
    cc.on_trim(now=end + 1, size=MTU, inflight=0, last_hop=False)
    assert cc.qa_count == 0
    assert cc.cwnd == before - MTU


def test_quick_adapt_waits_for_the_period_end() -> None:
    cc = nscc()
    end = open_period(cc)
    cc.on_trim(now=end, size=MTU, inflight=0, last_hop=False)  # not yet past the end
    assert cc.qa_count == 0
    assert cc.cwnd == 187_500 - MTU


def test_quick_adapt_not_retriggered_within_base_rtt_plus_target() -> None:
    cc = nscc()
    end = open_period(cc)
    ack(cc, 200, delay=1_000, nbytes=40_960)
    cc.cwnd = 100_000
    cc.on_trim(now=end + 1, size=MTU, inflight=0, last_hop=False)
    # 40 960 ≥ 187 500 >> 3: no QA, the window just loses the trimmed packet; the next period starts.
    cc.cwnd = 100_000
    end2 = end + 1 + QA_PERIOD
    ack(cc, end + 2, delay=1_000, nbytes=8_192)
    cc.on_trim(now=end2 + 1, size=MTU, inflight=0, last_hop=False)
    assert cc.qa_count == 1
    assert cc.cwnd == 8_192
    end3 = end2 + 1 + QA_PERIOD
    cc.on_trim(now=end3 - 1, size=MTU, inflight=0, last_hop=False)
    cc.on_loss(now=end3, inflight=0)
    assert cc.qa_count == 1
    assert cc.cwnd == MTU  # 8 192 − trim − loss
    cc.cwnd = 50_000
    cc.on_trim(now=end3 + 1, size=MTU, inflight=0, last_hop=False)
    assert cc.qa_count == 2
    assert cc.cwnd == MTU


def test_first_event_only_opens_the_period_and_trim_trigger_is_sticky() -> None:
    cc = nscc()
    cc.on_trim(now=100, size=MTU, inflight=0, last_hop=False)  # first event: no QA, plain decrease
    assert cc.qa_count == 0
    assert cc.cwnd == 187_500 - MTU
    ack(cc, 200, delay=1_000, nbytes=16_384)
    ack(cc, 100 + QA_PERIOD + 1, delay=1_000, nbytes=0)  # a plain SACK fires the armed trigger
    assert cc.qa_count == 1
    assert cc.cwnd == 16_384


def test_quick_adapt_ignores_marks_and_trims_for_bytes_then_in_flight() -> None:
    cc = nscc(adjust_period_threshold=NO_PERIOD)
    end = open_period(cc)
    ack(cc, 200, delay=1_000, nbytes=20_000)
    cc.on_trim(now=end + 1, size=MTU, inflight=50_000, last_hop=False)
    assert cc.cwnd == 20_000
    cc.on_trim(now=end + 2, size=MTU, inflight=45_904, last_hop=False)  # ignored
    ack(cc, end + 3, delay=800_000, nbytes=10_000, ecn=True)  # ignored: no MD
    assert cc.cwnd == 20_000
    assert cc.md_count == 0
    ack(cc, end + 4, delay=TARGET, nbytes=10_000)  # unmarked SACKs are processed
    assert cc.pending_increase == pytest.approx(config().fi * 10_000)
    ack(cc, end + 5, delay=1_000, nbytes=30_000)  # now 54 096 ≥ 50 000 accounted for
    before = cc.cwnd
    cc.on_trim(now=end + 6, size=MTU, inflight=0, last_hop=False)
    assert cc.cwnd == before - MTU


def test_disable_qa() -> None:
    cc = nscc(disable_qa=True, adjust_period_threshold=NO_PERIOD)
    end = open_period(cc)
    cc.on_trim(now=end + 1, size=MTU, inflight=0, last_hop=False)
    cc.on_loss(now=end + 2, inflight=0)
    ack(cc, end + 3, delay=100_000, nbytes=0)
    assert cc.qa_count == 0
    assert cc.cwnd == 187_500 - 2 * MTU


# -- trims and losses ----------------------------------------------------------------------------------------


def test_trim_decreases_by_packet_size() -> None:
    cc = nscc(100_000, disable_qa=True)
    cc.on_trim(now=1, size=1_500, inflight=0, last_hop=False)
    assert cc.cwnd == 98_500


def test_last_hop_trim_keeps_window() -> None:
    cc = nscc(100_000, disable_qa=True)
    cc.on_trim(now=1, size=MTU, inflight=0, last_hop=True)
    assert cc.cwnd == 100_000


def test_trim_feeds_a_base_rtt_delay_sample() -> None:
    cc = nscc(100_000, disable_qa=True)
    cc.on_trim(now=1, size=MTU, inflight=0, last_hop=True)
    assert cc.avg_delay == pytest.approx(DELAY_EWMA_WEIGHT * BASE)


def test_trim_and_loss_never_go_below_mtu() -> None:
    cc = nscc(MTU + 100, disable_qa=True)
    cc.on_trim(now=1, size=MTU, inflight=0, last_hop=False)
    assert cc.cwnd == MTU
    cc.on_loss(now=2, inflight=0)
    assert cc.cwnd == MTU


def test_increase_never_exceeds_max_cwnd() -> None:
    cc = nscc(disable_qa=True)
    for i in range(200):
        ack(cc, 1 + i * 1_000, delay=0, nbytes=65_536)
    assert cc.cwnd == 187_500
    assert cc.fast_increase_count > 0


# -- property: clamps hold under any sequence of events -----------------------------------------------------

_ack = st.tuples(
    st.just("ack"),
    st.integers(0, 50_000),
    st.integers(0, 200_000),
    st.one_of(st.none(), st.integers(0, 2_000_000)),
    st.booleans(),
    st.integers(0, 20_000),
)
_trim = st.tuples(st.just("trim"), st.integers(0, 50_000), st.integers(1, 9_000), st.booleans())
_loss = st.tuples(st.just("loss"), st.integers(0, 200_000))
_events = st.lists(st.one_of(_ack, _trim, _loss), max_size=120)


@settings(max_examples=300, deadline=None)
@given(
    events=_events,
    disable_qa=st.booleans(),
    gamma=st.floats(0.0, 1.0),
    max_md_jump=st.floats(0.01, 1.0),
    max_cwnd=st.integers(MTU, 400_000),
    qa_gate=st.integers(0, 8),
    mtu=st.sampled_from([256, 1024, 4096]),
    inflight=st.integers(0, 400_000),
)
def test_cwnd_stays_within_mtu_and_max_cwnd(
    events: list[tuple[Any, ...]],
    disable_qa: bool,
    gamma: float,
    max_md_jump: float,
    max_cwnd: int,
    qa_gate: int,
    mtu: int,
    inflight: int,
) -> None:
    cfg = dataclasses.replace(
        NsccConfig.defaults(G100, BASE, mtu),
        disable_qa=disable_qa,
        gamma=gamma,
        max_md_jump=max_md_jump,
        max_cwnd=max_cwnd,
        qa_gate=qa_gate,
    )
    cc = Nscc(mtu=mtu, config=cfg, now=0)
    now = 0
    for event in events:
        now += event[1]
        if event[0] == "ack":
            _, _, nbytes, rtt, ecn, service = event
            cc.on_ack(now=now, newly_acked=nbytes, inflight=inflight, rtt_ns=rtt, ecn=ecn, service_ns=service)
        elif event[0] == "trim":
            cc.on_trim(now=now, size=event[2], inflight=inflight, last_hop=event[3])
        else:
            cc.on_loss(now=now, inflight=inflight)
        assert isinstance(cc.cwnd, int)
        assert mtu <= cc.cwnd <= max_cwnd
        assert cc.avg_delay >= 0
        assert cc.last_delay >= 0
