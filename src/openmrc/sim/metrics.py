"""What a simulation measured: per-flow completion times and goodput, fabric counters, per-link
utilisation, and time series (job goodput, EV states) sampled on simulated time.

`Sampler` is one periodic simulator event: every ``interval`` ns it reads a cumulative "bytes delivered to
receivers" counter (the transports' own: bytes the MRC responders placed, in-order bytes the RoCE receivers
accepted) and drains every MRC NIC's EV event queue, so the series cost nothing between samples and the
EV timeline loses no event. `SimResults` gathers everything `FabricSim.run` returns
(`openmrc.sim.results_files` puts it on disk).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import TYPE_CHECKING, Any, Final

from openmrc.ev.state import EVState

if TYPE_CHECKING:
    from openmrc.sim.engine import Simulator
    from openmrc.sim.flows import Flow
    from openmrc.transport import Nic

__all__ = [
    "LinkStat",
    "Outage",
    "Sample",
    "Sampler",
    "SimResults",
    "outage_report",
]


_EV_BATCH: Final = 4096
"""EV events taken from a NIC per `Nic.poll_ev_events` call."""


@dataclass(frozen=True, slots=True)
class Sample:
    """One point of the time series."""

    time_ns: int
    delivered_bytes: int
    """Cumulative bytes receivers accepted (each byte once)."""
    goodput_bps: float
    """Rate over the interval that ended here."""
    evs_bad: int
    """EVs currently ASSUMED_BAD over every MRC QP of the fabric."""
    ev_to_bad: int
    """EVs that became ASSUMED_BAD during the interval."""
    ev_to_good: int
    """EVs that probes restored to GOOD during the interval."""
    watched_bytes: int = 0
    """Cumulative bytes of the watched host's outgoing flows (a host that lost a NIC port)."""


@dataclass(frozen=True, slots=True)
class LinkStat:
    """One direction of one link over the whole run."""

    node: int
    port: int
    peer: int
    bps: int
    sent_bytes: int
    utilisation: float
    drops: int
    losses: int
    trims: int
    ecn_marks: int
    pauses: int = 0
    """PFC PAUSE frames that stopped this direction (lossless fabrics)."""
    paused_us: float = 0.0
    """Time this direction spent paused by PFC."""


class Sampler:
    """Samples ``delivered()`` and the NICs' EV events every ``interval`` ns of simulated time."""

    def __init__(
        self,
        sim: Simulator,
        interval: int,
        delivered: Callable[[], int],
        nics: Callable[[], list[tuple[int, Nic]]],
        watched: Callable[[], int] | None = None,
    ) -> None:
        if interval <= 0:
            raise ValueError(f"sample interval {interval} ns must be positive")
        self.sim = sim
        self.interval = interval
        self._delivered = delivered
        self._nics = nics
        self.watched = watched
        self.samples: list[Sample] = []
        self.ev_log: list[tuple[int, int, int, int, str]] = []  # (ns, host index, qp, port, new state)
        self.ev_log_limit = 100_000
        self._last = (0, 0)
        self._bad = 0
        sim.schedule(sim.now, self._tick)

    def _tick(self, _: object = None) -> None:
        self.sample()
        self.sim.schedule(self.sim.now + self.interval, self._tick)

    def sample(self) -> Sample:
        now = self.sim.now
        to_bad = to_good = 0
        log = self.ev_log
        for host, nic in self._nics():
            while True:
                events = nic.poll_ev_events(_EV_BATCH)
                for ev in events:
                    if ev.state is EVState.ASSUMED_BAD:
                        to_bad += 1
                    elif ev.state is EVState.GOOD:
                        to_good += 1
                    if len(log) < self.ev_log_limit:
                        log.append((ev.time, host, ev.qp_num, ev.port, ev.state.name))
                if len(events) < _EV_BATCH:
                    break
        self._bad += to_bad - to_good
        got = self._delivered()
        t0, b0 = self._last
        rate = (got - b0) * 8e9 / (now - t0) if now > t0 else 0.0
        self._last = (now, got)
        w = self.watched() if self.watched is not None else 0
        s = Sample(now, got, rate, self._bad, to_bad, to_good, w)
        self.samples.append(s)
        return s


@dataclass(frozen=True, slots=True)
class Outage:
    """One failure event and what the fabric saw of it."""

    at: int
    what: str
    bypass_ns: int | None
    """From the failure to the last data packet sent into the dead link (None: none was)."""
    host: int | None = None
    """The host whose NIC port failed (its outgoing goodput is watched)."""


def _rate(samples: Sequence[Sample], lo: int, hi: int, watched: bool) -> float | None:
    """Mean rate (b/s) over the samples that end in (lo, hi], from the cumulative counter."""
    pts = [s for s in samples if lo <= s.time_ns <= hi]
    if len(pts) < 2 or pts[-1].time_ns == pts[0].time_ns:
        return None
    a, b = pts[0], pts[-1]
    got = (b.watched_bytes - a.watched_bytes) if watched else (b.delivered_bytes - a.delivered_bytes)
    return got * 8e9 / (b.time_ns - a.time_ns)


def outage_report(o: Outage, samples: Sequence[Sample], first_finish_after: int | None) -> dict[str, Any]:
    """Bypass time, goodput before and after (job, and the failed host's when one is watched) and the time
    until goodput is back within 5 % of its new level."""
    out: dict[str, Any] = {"at_us": o.at / 1000, "what": o.what}
    out["bypass_us"] = None if o.bypass_ns is None else o.bypass_ns / 1000
    if len(samples) < 3:
        return out
    step = samples[1].time_ns - samples[0].time_ns
    end = first_finish_after if first_finish_after is not None else samples[-1].time_ns
    settle = o.at + (o.bypass_ns or 0) + 2 * step
    for key, watched in (("goodput", False), ("host_goodput", True)):
        if watched and o.host is None:
            continue
        before = _rate(samples, o.at - 5 * step, o.at, watched)
        after = _rate(samples, settle, end, watched)
        out[f"{key}_before_gbps"] = None if before is None else before / 1e9
        out[f"{key}_after_gbps"] = None if after is None else after / 1e9
        if not watched and after:
            recovered = next(
                (
                    b.time_ns
                    for a, b in pairwise(samples)
                    if b.time_ns > o.at
                    and (b.delivered_bytes - a.delivered_bytes) * 8e9 / step >= 0.95 * after
                ),
                None,
            )
            out["recovery_us"] = None if recovered is None else (recovered - o.at) / 1000
    return out


@dataclass(slots=True)
class SimResults:
    flows: list[Flow]
    now: int
    events: int
    counters: dict[str, int] = field(default_factory=dict)
    samples: list[Sample] = field(default_factory=list)
    links: list[LinkStat] = field(default_factory=list)
    ev_log: list[tuple[int, int, int, int, str]] = field(default_factory=list)
    failures: list[tuple[int, str]] = field(default_factory=list)
    """(time ns, description) of every failure event, for plots."""
    outages: list[Outage] = field(default_factory=list)

    def fcts_us(self, tag: str | None = None) -> list[float]:
        return sorted(
            f.fct_ns / 1000 for f in self.flows if f.fct_ns is not None and (tag is None or f.tag == tag)
        )

    def job_time_ns(self, tag: str | None = None) -> int | None:
        """First start to last finish of the flows (with ``tag``), if they all finished."""
        fl = [f for f in self.flows if tag is None or f.tag == tag]
        if not fl or any(f.finish is None or f.start is None for f in fl):
            return None
        return max(f.finish for f in fl if f.finish is not None) - min(
            f.start for f in fl if f.start is not None
        )

    def summary(self) -> dict[str, Any]:
        fcts = self.fcts_us()
        done = len(fcts)
        out: dict[str, Any] = {
            "flows": len(self.flows),
            "completed": done,
            "sim_time_us": self.now / 1000,
            "events": self.events,
            **self.counters,
        }
        if fcts:
            out |= {
                "median_fct_us": statistics.median(fcts),
                "p99_fct_us": fcts[min(done - 1, int(0.99 * done))],
                "max_fct_us": fcts[-1],
            }
        return out

    def report(self) -> dict[str, Any]:
        """`summary` plus job figures, per-tag FCTs and link utilisation: what results.json holds."""
        out = self.summary()
        job = self.job_time_ns()
        if job:
            total = sum(f.size for f in self.flows)
            out["job_time_us"] = job / 1000
            out["job_goodput_gbps"] = total * 8 / job
        for tag in sorted({f.tag for f in self.flows if f.tag}):
            fc = self.fcts_us(tag)
            if fc:
                out[f"{tag}_median_fct_us"] = statistics.median(fc)
                out[f"{tag}_max_fct_us"] = fc[-1]
            t = self.job_time_ns(tag)
            if t:
                out[f"{tag}_time_us"] = t / 1000
        used = [link.utilisation for link in self.links if link.sent_bytes]
        if used:
            out["link_util_max"] = max(used)
            out["link_util_mean_used"] = sum(used) / len(used)
        if self.samples:
            out["ev_to_bad"] = sum(s.ev_to_bad for s in self.samples)
            out["ev_to_good"] = sum(s.ev_to_good for s in self.samples)
        if self.outages:
            out["outages"] = self.outage_reports()
            bypass = [o.bypass_ns for o in self.outages if o.bypass_ns is not None]
            if bypass:
                out["bypass_us"] = max(bypass) / 1000
        return out

    def outage_reports(self) -> list[dict[str, Any]]:
        reps = []
        for o in self.outages:
            after = [f.finish for f in self.flows if f.finish is not None and f.finish > o.at]
            reps.append(outage_report(o, self.samples, min(after) if after else None))
        return reps
