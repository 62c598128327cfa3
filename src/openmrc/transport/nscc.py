"""NSCC, the network-signal congestion control of UET 1.0 §3.6.13, as configured by ``mrc_ctl_cc_nscc_cfg``.

Theory of operation
-------------------
NSCC is a sender-side, window-based, byte-granular algorithm clocked by SACKs. A packet may leave while
``inflight + size <= cwnd``. The window starts at ``max_cwnd`` (1.5 BDP: a new QP sends at line rate) and is
kept in ``[MTU, max_cwnd]`` after every change.

Each SACK brings two signals: the ECN echo (the SACK's M = SKIP_ONCE bit: some switch saw a queue) and a
queueing-delay sample ``delay = rtt − base_rtt − service_ns`` (the responder's service time is not network
delay). Crossing them against ``target_delay`` gives four quadrants:

==========  ======================  ==============================================================
ECN echo    delay vs target         reaction
==========  ======================  ==============================================================
no          delay < target          *proportional increase*: ``inc += alpha·bytes·(target − delay)``,
                                    or *fast increase* ``cwnd += bytes·fi_scale`` once delay has been
                                    ≈ 0 for a whole window (the path is idle: grab it quickly)
no          delay ≥ target          *fair increase*: ``inc += fi·bytes`` (delay without marks is a
                                    queue elsewhere or a slow path; converge to fairness gently)
yes         delay ≥ target          *multiplicative decrease*, at most once per base_rtt:
                                    ``cwnd *= max(1 − gamma·(avg − target)/avg, max_md_jump)``
yes         delay < target          no change: one congested path, not a congested flow; the EV
                                    load balancer moves traffic off the marked path instead
==========  ======================  ==============================================================

The increases are not applied per SACK. They accumulate in ``inc`` (bytes²) and are applied as
``cwnd += inc / cwnd`` once more than ``adjust_bytes_threshold`` bytes were acknowledged since the last
application, or ``adjust_period_threshold`` ns passed; when the period passed, ``cwnd += eta`` too
(additive increase). ``alpha = 4·MTU·a·b / target`` is not a config field; openmrc derives it from ``fi``
(see :attr:`NsccConfig.alpha`).

``avg`` in the decrease is an EWMA of the delay samples with weight :data:`DELAY_EWMA_WEIGHT`; an unmarked
sample above target counts as ``base_rtt/4`` (it is not evidence of our own queue) and a trim counts as a
sample of ``base_rtt``. The decrease only happens while ``avg > target``.

*Quick adapt* (unless ``disable_qa``) handles sudden overload, e.g. incast. Time is cut into periods of
``base_rtt + target_delay``; at the first event after a period ends, if a trim happened (or the
current delay exceeds ``qa_threshold``) and the bytes acknowledged during the period are fewer than
``max_cwnd >> qa_gate``, the window drops straight to what was achieved (at least one MTU), the pending
``inc`` is discarded, and marked SACKs and trims covering the bytes then in flight are ignored
(their congestion predates the cut). Outside that, a trim NACK shrinks the window by the trimmed packet's
size (but see :meth:`Nscc.on_trim` for last-hop trims) and a loss by one MTU.

Details UET/MRC leave open follow UEC's reference simulator, htsim (``uet-htsim`` ``htsim/sim/uec.cpp``,
``UecSrc::updateCwndOnAck_NSCC`` and the functions it calls); each is named where it is used.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import ClassVar, Final

from mypy_extensions import mypyc_attr

from openmrc.transport.cc import CongestionControl, register_cc

__all__ = [
    "DEFAULT_BASE_RTT_NS",
    "DEFAULT_LINK_BPS",
    "DELAY_EWMA_WEIGHT",
    "FAST_INCREASE_DELAY_NS",
    "MIN_MAX_CWND",
    "REFERENCE_BDP_BYTES",
    "REFERENCE_LINK_BPS",
    "REFERENCE_RTT_NS",
    "Nscc",
    "NsccConfig",
]

REFERENCE_LINK_BPS: Final = 100_000_000_000
"""Link speed of the reference network the NSCC constants are tuned for (100 Gb/s)."""
REFERENCE_RTT_NS: Final = 12_000
"""Base RTT of the reference network (12 µs, htsim ``_reference_network_rtt``)."""
REFERENCE_BDP_BYTES: Final = REFERENCE_LINK_BPS // 8 * REFERENCE_RTT_NS // 1_000_000_000
"""BDP of the reference network: 150 000 bytes; ``a = BDP / REFERENCE_BDP_BYTES``."""

DEFAULT_LINK_BPS: Final = REFERENCE_LINK_BPS
"""Link speed :class:`Nscc` assumes when built without a config (one 100 Gb/s plane port)."""
DEFAULT_BASE_RTT_NS: Final = REFERENCE_RTT_NS
"""Base RTT :class:`Nscc` assumes when built without a config."""

DELAY_EWMA_WEIGHT: Final = 0.0125
"""Weight of a new sample in the average delay driving the decrease (htsim ``_delay_alpha``)."""
FAST_INCREASE_DELAY_NS: Final = 1_000
"""A delay below this counts as "≈ 0" for fast increase (htsim ``fast_increase``: ``timeFromUs(1)``)."""
MIN_MAX_CWND: Final = 256
"""Smallest accepted ``max_cwnd``: the smallest RoCE path MTU. A controller also needs ``max_cwnd ≥ MTU``."""

_U8_MAX: Final = 0xFF
_U32_MAX: Final = 0xFFFF_FFFF
_FLOAT32_MAX: Final = 3.4028234663852886e38
_NEVER: Final = -(1 << 62)


_UINT_FIELDS: Final = (
    ("adjust_bytes_threshold", 0, _U32_MAX),
    ("adjust_period_threshold", 0, _U32_MAX),
    ("base_rtt", 1, _U32_MAX),
    ("max_cwnd", MIN_MAX_CWND, _U32_MAX),
    # uint8_t in C, but a shift of a 32-bit window by 32 or more is meaningless (undefined in C).
    ("qa_gate", 0, min(_U8_MAX, 31)),
    ("qa_threshold", 0, _U32_MAX),
    ("target_delay", 1, _U32_MAX),
)
_FLOAT_FIELDS: Final = (
    ("eta", 0.0, _FLOAT32_MAX, False),
    ("fi", 0.0, _FLOAT32_MAX, False),
    ("fi_scale", 0.0, _FLOAT32_MAX, False),
    ("gamma", 0.0, 1.0, False),
    ("max_md_jump", 0.0, 1.0, True),
)


_DEFAULTS: Final[dict[tuple[object, ...], NsccConfig]] = {}
"""`NsccConfig.defaults` made so far, by class and arguments."""


def _check_uint(name: str, value: object, lo: int, hi: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if not lo <= value <= hi:
        raise ValueError(f"{name} must be in [{lo}, {hi}], got {value}")


def _check_float(name: str, value: object, lo: float, hi: float, *, lo_open: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{name} must be a number, got {value!r}")
    v = float(value)
    if not math.isfinite(v) or v < lo or v > hi or (lo_open and v == lo):
        low = f"({lo}" if lo_open else f"[{lo}"
        raise ValueError(f"{name} must be a finite number in {low}, {hi}], got {value!r}")


@mypyc_attr(native_class=False)  # interpreted: __post_init__ names any field of a wrong type
@dataclass(frozen=True, slots=True)
class NsccConfig:
    """NSCC parameters, field for field OCP's ``struct mrc_ctl_cc_nscc_cfg`` (mrc_ctl.h), same order.

    Integer fields keep the C types' ranges (``uint8_t``/``uint32_t``); the C ``float`` fields are Python
    floats limited to the float32 range. Use :meth:`defaults` to derive a config from the network.
    """

    disable_qa: bool
    """Turn quick adapt off (C: ``uint8_t``, QA disabled if non-zero)."""
    adjust_bytes_threshold: int
    """Apply the accumulated increase once more than this many bytes were acknowledged (bytes)."""
    adjust_period_threshold: int
    """Apply it also once this much time passed since the last ``eta`` step (ns); the ``eta`` period."""
    base_rtt: int
    """Unloaded RTT of the longest path (ns); delay = rtt − base_rtt − service time."""
    eta: float
    """Additive increase applied once per ``adjust_period_threshold`` (bytes)."""
    fi: float
    """Fair-increase gain: ``inc += fi·bytes`` per unmarked SACK with delay ≥ target (bytes)."""
    fi_scale: float
    """Fast-increase gain: ``cwnd += bytes·fi_scale`` per SACK once delay ≈ 0 for a window (no unit)."""
    gamma: float
    """Multiplicative-decrease gain, in [0, 1]."""
    max_md_jump: float
    """Floor of one multiplicative decrease's factor, in (0, 1]: one decrease keeps at least this share."""
    max_cwnd: int
    """Largest window (bytes), and the initial one."""
    qa_gate: int
    """Quick adapt only if the bytes achieved in a period are below ``max_cwnd >> qa_gate``."""
    qa_threshold: int
    """A delay above this (ns) triggers quick adapt like a trim does."""
    target_delay: int
    """Queueing delay NSCC steers towards (ns)."""

    def __post_init__(self) -> None:
        # getattr: compiled, a typed attribute read would reject a wrong type before naming the field
        if not isinstance(getattr(self, "disable_qa"), bool):  # noqa: B009
            raise ValueError(f"disable_qa must be a bool, got {getattr(self, 'disable_qa')!r}")  # noqa: B009
        for name, lo, hi in _UINT_FIELDS:
            _check_uint(name, getattr(self, name), lo, hi)
        for name, flo, fhi, lo_open in _FLOAT_FIELDS:
            _check_float(name, getattr(self, name), flo, fhi, lo_open=lo_open)

    @classmethod
    def defaults(cls, link_bps: int, base_rtt_ns: int, mtu: int, trimming: bool = True) -> NsccConfig:
        """The UET 1.0 defaults for a link of ``link_bps`` and a base RTT of ``base_rtt_ns``.

        BDP = link_bps/8 × base_rtt, a = BDP / 150 000 B; target = 0.75·base_rtt with trimming, else
        base_rtt; eta = 0.15·MTU·a, fi = 5·MTU·a, fi_scale = 0.25·a, gamma 0.8, max_md_jump 0.5,
        max_cwnd = 1.5·BDP, qa_gate 3, qa_threshold = 4·target, adjust thresholds 8·MTU and base_rtt.
        Fractional byte and ns values are rounded down. Configs are immutable, so one is made per network
        and class (a simulated fabric's 100K+ NICs ask for the same one).
        """
        key = (cls, link_bps, base_rtt_ns, mtu, trimming)
        made = _DEFAULTS.get(key)
        if made is not None and type(link_bps) is int and type(base_rtt_ns) is int and type(mtu) is int:
            return made
        for arg, value in (("link_bps", link_bps), ("base_rtt_ns", base_rtt_ns), ("mtu", mtu)):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{arg} must be a positive integer, got {value!r}")
        bdp = link_bps * base_rtt_ns / 8e9
        a = bdp / REFERENCE_BDP_BYTES
        target = base_rtt_ns * 3 // 4 if trimming else base_rtt_ns
        made = _DEFAULTS[key] = cls(
            disable_qa=False,
            adjust_bytes_threshold=8 * mtu,
            adjust_period_threshold=base_rtt_ns,
            base_rtt=base_rtt_ns,
            eta=0.15 * mtu * a,
            fi=5 * mtu * a,
            fi_scale=0.25 * a,
            gamma=0.8,
            max_md_jump=0.5,
            max_cwnd=link_bps * base_rtt_ns * 3 // 16_000_000_000,
            qa_gate=3,
            # htsim uses 4·target whether or not trimming is on; with trimming, trims normally trigger
            # quick adapt long before the delay reaches 3·base_rtt, so this is "large" in practice.
            qa_threshold=4 * target,
            target_delay=target,
        )
        return made

    @property
    def alpha(self) -> float:
        """Proportional-increase gain in bytes/ns: ``4·MTU·a·b / target`` with ``b = target / 12 µs``.

        The C struct has no alpha, so openmrc derives it from ``fi = 5·MTU·a``: alpha = 0.8·fi / 12 µs,
        which equals the UET formula whenever ``fi`` has its default value (``b/target`` is ``1/12 µs``
        whatever the target).
        """
        return 0.8 * self.fi / REFERENCE_RTT_NS

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        """The field names, in ``mrc_ctl_cc_nscc_cfg`` order."""
        return tuple(f.name for f in fields(cls))


class Nscc(CongestionControl):
    """NSCC congestion control for one QP; see the module docstring.

    ``config`` is an :class:`NsccConfig`; ``None`` means :meth:`NsccConfig.defaults` for
    :data:`DEFAULT_LINK_BPS`, :data:`DEFAULT_BASE_RTT_NS`, ``mtu`` and trimming on.
    """

    __slots__ = (
        "_achieved",
        "_adjust_bytes",
        "_adjust_period",
        "_alpha",
        "_avg_delay",
        "_base_rtt",
        "_bytes_ignored",
        "_bytes_to_ignore",
        "_config",
        "_cwnd",
        "_disable_qa",
        "_eta",
        "_fast",
        "_fi",
        "_fi_count",
        "_fi_scale",
        "_gamma",
        "_inc",
        "_last_adjust",
        "_last_md",
        "_max_cwnd",
        "_max_md_jump",
        "_qa_end",
        "_qa_limit",
        "_qa_period",
        "_qa_started",
        "_qa_threshold",
        "_received",
        "_target",
        "_trigger_qa",
        "fast_increase_count",
        "last_delay",
        "md_count",
        "qa_count",
    )

    name: ClassVar[str] = "uet-1.0-nscc"
    config_type: ClassVar[type | None] = NsccConfig

    md_count: int
    """Multiplicative decreases applied."""
    qa_count: int
    """Quick adapts applied."""
    fast_increase_count: int
    """SACKs that applied a fast increase."""
    last_delay: int
    """Queueing delay (ns) used for the last SACK's decision."""

    def __init__(self, *, mtu: int, config: object | None = None, now: int = 0) -> None:
        super().__init__(mtu=mtu, config=config, now=now)
        cfg = (
            config
            if isinstance(config, NsccConfig)
            else NsccConfig.defaults(DEFAULT_LINK_BPS, DEFAULT_BASE_RTT_NS, mtu)
        )
        if cfg.max_cwnd < mtu:
            raise ValueError(f"max_cwnd ({cfg.max_cwnd}) must be at least the MTU ({mtu})")
        self._config = cfg
        self._max_cwnd = cfg.max_cwnd
        self._base_rtt = cfg.base_rtt
        self._target = cfg.target_delay
        self._qa_threshold = cfg.qa_threshold
        self._qa_period = cfg.base_rtt + cfg.target_delay
        self._qa_limit = cfg.max_cwnd >> cfg.qa_gate
        self._disable_qa = cfg.disable_qa
        self._alpha = cfg.alpha
        self._fi = float(cfg.fi)
        self._fi_scale = float(cfg.fi_scale)
        self._eta = float(cfg.eta)
        self._gamma = float(cfg.gamma)
        self._max_md_jump = float(cfg.max_md_jump)
        self._adjust_bytes = cfg.adjust_bytes_threshold
        self._adjust_period = cfg.adjust_period_threshold

        self._cwnd = float(cfg.max_cwnd)  # htsim initNscc: cwnd = maxwnd when no initial window is given
        self._inc = 0.0
        self._received = 0
        self._last_adjust = now
        self._avg_delay = 0.0
        self._last_md = _NEVER
        self._fi_count = 0
        self._fast = False
        self._achieved = 0
        self._qa_started = False
        self._qa_end = 0
        self._trigger_qa = False
        self._bytes_to_ignore = 0
        self._bytes_ignored = 0

        self.md_count = 0
        self.qa_count = 0
        self.fast_increase_count = 0
        self.last_delay = 0

    # -- read-only views -------------------------------------------------------------------------------------

    @property
    def cwnd(self) -> int:
        """Current window in whole bytes. Setting it (tests, state restore) clamps to [MTU, max_cwnd]."""
        return int(self._cwnd)

    @cwnd.setter
    def cwnd(self, value: int) -> None:
        self._cwnd = float(min(max(value, self.mtu), self._max_cwnd))

    @property
    def config(self) -> NsccConfig:
        """The configuration in force."""
        return self._config

    @property
    def alpha(self) -> float:
        """Proportional-increase gain (bytes/ns); see :attr:`NsccConfig.alpha`."""
        return self._alpha

    @property
    def avg_delay(self) -> float:
        """EWMA of the queueing delay (ns) that drives the multiplicative decrease."""
        return self._avg_delay

    @property
    def pending_increase(self) -> float:
        """Accumulated ``inc`` (bytes²) not yet applied to the window."""
        return self._inc

    def can_send(self, inflight: int, size: int) -> bool:
        """Whether ``size`` more bytes fit in the window (same as the base rule, without the int view)."""
        return inflight + size <= self._cwnd

    # -- events ----------------------------------------------------------------------------------------------

    def on_ack(
        self,
        now: int,
        newly_acked: int,
        inflight: int,
        rtt_ns: int | None,
        ecn: bool,
        service_ns: int = 0,
    ) -> None:
        """Run the four-quadrant update for one SACK.

        ``inflight`` is what remains outstanding after this SACK. Without an RTT sample (``rtt_ns`` None,
        e.g. the SACK acknowledges only retransmitted data) the average delay stands in for the sample and
        the average is not updated (htsim ``processAck``). A sample below ``base_rtt + service_ns`` counts
        as zero delay: the path is shorter than the configured longest one, not negatively queued.
        """
        self._received += newly_acked
        self._achieved += newly_acked
        self._bytes_ignored += newly_acked
        target = self._target

        if rtt_ns is None:
            delay = int(self._avg_delay)
        else:
            delay = rtt_ns - self._base_rtt - service_ns
            if delay < 0:
                delay = 0
            # htsim update_delay: an unmarked sample above target is not our queue; count it as base_rtt/4.
            sample = self._base_rtt * 0.25 if (not ecn and delay > target) else delay
            self._avg_delay += DELAY_EWMA_WEIGHT * (sample - self._avg_delay)
        self.last_delay = delay

        if not self._disable_qa and self._quick_adapt(now, inflight, False, ecn, delay):
            return

        if ecn:
            if delay >= target:
                self._multiplicative_decrease(now)
            # ECN with a short queue: leave the window to the EV load balancer.
        elif delay >= target:
            self._inc += self._fi * newly_acked
        elif delay < FAST_INCREASE_DELAY_NS:
            # htsim fast_increase: once a whole window was acknowledged at ≈ 0 delay, grow per SACK
            # until a delay appears.
            self._fi_count += newly_acked
            if self._fast or self._fi_count > self._cwnd:
                self._cwnd += newly_acked * self._fi_scale
                self._fast = True
                self.fast_increase_count += 1
            else:
                self._inc += self._alpha * newly_acked * (target - delay)
        else:
            self._fi_count = 0
            self._fast = False
            self._inc += self._alpha * newly_acked * (target - delay)

        cwnd = self._cwnd
        if cwnd > self._max_cwnd:
            cwnd = float(self._max_cwnd)
        elif cwnd < self.mtu:
            cwnd = float(self.mtu)

        since = now - self._last_adjust
        if self._received > self._adjust_bytes or since > self._adjust_period:
            cwnd += self._inc / cwnd
            if since >= self._adjust_period:
                cwnd += self._eta
                self._last_adjust = now
            self._inc = 0.0
            self._received = 0
            if cwnd > self._max_cwnd:
                cwnd = float(self._max_cwnd)
            elif cwnd < self.mtu:
                cwnd = float(self.mtu)
        self._cwnd = cwnd

    def on_trim(self, now: int, size: int, inflight: int, last_hop: bool) -> None:
        """A trim NACK: counts as a delay sample of ``base_rtt``, arms quick adapt, else ``cwnd −= size``.

        A last-hop trim (TRIMMED_LASTHOP) does not shrink the window: congestion at the receiver's own
        link is the receiver's to manage through CC_STATE (``rcv_cwnd_pen``). htsim skips that decrease
        only when receiver-based CC runs; if the peer does not run it, incast at the last hop is handled
        by delay, ECN and quick adapt alone.
        """
        self._bytes_ignored += size
        # htsim updateCwndOnNack_NSCC: a trim means a full queue, taken as one network RTT of delay.
        self._avg_delay += DELAY_EWMA_WEIGHT * (self._base_rtt - self._avg_delay)
        self._trigger_qa = True
        if not self._disable_qa and self._quick_adapt(now, inflight, True, True, 0):
            return
        if not last_hop:
            cwnd = self._cwnd - size
            self._cwnd = cwnd if cwnd > self.mtu else float(self.mtu)

    def on_loss(self, now: int, inflight: int) -> None:
        """A timeout or inferred loss: ``cwnd −= MTU``.

        htsim shrinks the window by the lost packet's size on a retransmission timeout
        (``mark_packet_for_retransmission``); the hook carries no size, so one MTU is used. Like htsim, a
        loss does not arm quick adapt: with trimming, congestion announces itself by trims, ECN and delay,
        and a loss without a trim is random loss or a failed path, where cutting the window to what the
        last period achieved (a few packets for a collective's small messages) only slows recovery.
        """
        mtu = self.mtu
        cwnd = self._cwnd - mtu
        self._cwnd = cwnd if cwnd > mtu else float(mtu)

    # -- mechanisms ------------------------------------------------------------------------------------------

    def _quick_adapt(self, now: int, inflight: int, is_loss: bool, skip: bool, delay: int) -> bool:
        """Quick adapt bookkeeping (htsim ``quick_adapt``); True if the caller must stop processing.

        True when a quick adapt happened now, or when a marked SACK / trim / loss falls within the bytes
        that were in flight at the last quick adapt. Either way the pending increase is discarded.
        """
        if skip and self._bytes_ignored < self._bytes_to_ignore:
            self._inc = 0.0
            self._received = 0
            return True
        if self._qa_started and now <= self._qa_end:
            return False
        acted = False
        # The first event only opens the first measuring period (htsim: _qa_endtime == 0).
        if (
            self._qa_started
            and (self._trigger_qa or is_loss or delay > self._qa_threshold)
            and self._achieved < self._qa_limit
        ):
            achieved = self._achieved if self._achieved > self.mtu else self.mtu
            # [openmrc] never raise the window here (htsim would, and flags it as "shouldn't happen").
            if achieved < self._cwnd:
                self._cwnd = float(achieved)
            self._bytes_to_ignore = inflight
            self._bytes_ignored = 0
            self._trigger_qa = False
            self.qa_count += 1
            self._inc = 0.0
            self._received = 0
            acted = True
        self._qa_started = True
        self._achieved = 0
        self._qa_end = now + self._qa_period
        return acted

    def _multiplicative_decrease(self, now: int) -> None:
        """At most once per base_rtt, and only while the average delay exceeds the target (htsim)."""
        self._fast = False
        self._fi_count = 0
        avg = self._avg_delay
        target = self._target
        if avg > target and now - self._last_md > self._base_rtt:
            factor = 1.0 - self._gamma * (avg - target) / avg
            if factor < self._max_md_jump:
                factor = self._max_md_jump
            cwnd = self._cwnd * factor
            self._cwnd = cwnd if cwnd > self.mtu else float(self.mtu)
            self._last_md = now
            self.md_count += 1


register_cc(Nscc)
