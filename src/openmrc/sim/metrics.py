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
from typing import TYPE_CHECKING, Any, Final

from openmrc.ev.state import EVState

if TYPE_CHECKING:
    from openmrc.sim.engine import Simulator
    from openmrc.sim.flows import Flow
    from openmrc.transport import Nic

__all__ = [
    "BASELINE_SUFFIX",
    "RECOVER_FRACTION",
    "RECOVER_WINDOW_SAMPLES",
    "LinkStat",
    "Outage",
    "Sample",
    "Sampler",
    "SimResults",
    "outage_report",
    "recover_ns",
    "recovery",
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


@dataclass(slots=True)
class LinkStat:
    """One direction of one link over the whole run. (Not frozen: a frozen class sets each field through
    ``object.__setattr__``, and a 131,072-host run's results make 4.2 million of them.)"""

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

    def __init__(
        self,
        node: int,
        port: int,
        peer: int,
        bps: int,
        sent_bytes: int,
        utilisation: float,
        drops: int,
        losses: int,
        trims: int,
        ecn_marks: int,
        pauses: int = 0,
        paused_us: float = 0.0,
    ) -> None:
        # written out (the dataclass keeps it): compiled, it is several times as fast as the generated one
        self.node = node
        self.port = port
        self.peer = peer
        self.bps = bps
        self.sent_bytes = sent_bytes
        self.utilisation = utilisation
        self.drops = drops
        self.losses = losses
        self.trims = trims
        self.ecn_marks = ecn_marks
        self.pauses = pauses
        self.paused_us = paused_us


class Sampler:
    """Samples ``delivered()`` and the NICs' EV events every ``interval`` ns of simulated time."""

    def __init__(
        self,
        sim: Simulator,
        interval: int,
        delivered: Callable[[], int],
        nics: Callable[[], list[tuple[int, Nic]]],
        watched: Callable[[], int] | None = None,
        pairs: Callable[[], tuple[int, ...]] | None = None,
    ) -> None:
        if interval <= 0:
            raise ValueError(f"sample interval {interval} ns must be positive")
        self.sim = sim
        self.interval = interval
        self._delivered = delivered
        self._nics = nics
        self.watched = watched
        self._pairs = pairs
        self.samples: list[Sample] = []
        self.pair_bytes: list[tuple[int, ...]] = []  # per sample: cumulative bytes of each watched pair
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
        if self._pairs is not None:
            self.pair_bytes.append(self._pairs())
        return s


BASELINE_SUFFIX: Final = ", no failure"
"""A run labelled ``X{BASELINE_SUFFIX}`` is X without its failures (plots draw it dashed, in X's colour; an
outage of X is told beside it)."""

RECOVER_FRACTION = 0.9
"""An affected connection has recovered once it delivers this fraction of its pre-failure goodput (its mean
from when it began delivering to the failure: a window just before it would call a connection that had
stalled for another reason idle, and its stall after the failure no loss)."""
RECOVER_WINDOW_SAMPLES = 5
"""Goodputs after the failure are measured over this many sample intervals (and at least so many must
come before it)."""


@dataclass(frozen=True, slots=True)
class Outage:
    """One failure event and what the fabric saw of it."""

    at: int
    what: str
    last_packet_ns: int | None
    """From the failure to the last data packet sent into the dead link (None: none was). Not a recovery
    time: a sender that stalls (go-back-N waiting on a dead path) stops sending into it at once."""
    host: int | None = None
    """The host whose NIC port failed (its outgoing goodput is watched)."""
    pairs: tuple[int, ...] = ()
    """Indices into `SimResults.pair_bytes`: the connections (QPs) whose packets go through the failed
    element (MRC: one per host pair with a path through it, spraying over every path; RoCEv2: the QPs
    whose one ECMP-hashed path, either way, goes through it)."""
    host_pairs: int = 0
    """Host pairs (sender, receiver) with a shortest path through the failed element."""
    connections: int = 0
    """The connections of those pairs (RoCEv2: ``roce_qps`` QPs per flow), ``pairs`` among them."""


def _window(samples: Sequence[Sample], lo: int, hi: int) -> tuple[Sample, Sample] | None:
    """The first and last samples taken in [lo, hi] (None: fewer than two, at different times)."""
    pts = [s for s in samples if lo <= s.time_ns <= hi]
    if len(pts) < 2 or pts[-1].time_ns == pts[0].time_ns:
        return None
    return pts[0], pts[-1]


def _rate(a: Sample, b: Sample, watched: bool) -> float:
    """Mean rate (b/s) from sample ``a`` to sample ``b``, from the cumulative counter."""
    got = (b.watched_bytes - a.watched_bytes) if watched else (b.delivered_bytes - a.delivered_bytes)
    return got * 8e9 / (b.time_ns - a.time_ns)


def recover_ns(
    at: int,
    times: Sequence[int],
    pair_bytes: Sequence[Sequence[int]],
    pairs: Sequence[int],
    done: Sequence[bool],
) -> int | None:
    """Time from the failure at ``at`` until every affected connection is back (`recovery`); None: one
    never got back (not recovered)."""
    got = recovery(at, times, pair_bytes, pairs, done)
    return None if got is None else got[0]


def recovery(
    at: int,
    times: Sequence[int],
    pair_bytes: Sequence[Sequence[int]],
    pairs: Sequence[int],
    done: Sequence[bool],
) -> tuple[int, bool] | None:
    """Time from the failure at ``at`` until every affected connection is back: the start of the first
    window of `RECOVER_WINDOW_SAMPLES` samples, wholly after the failure, in which the connection delivers at
    least `RECOVER_FRACTION` of its goodput before the failure (its mean from the last sample it had
    delivered nothing at to the failure), or from which on it has nothing left to deliver (``done[i]``: its
    flows all finished, and the counter stays put). Connections that had delivered nothing by the failure,
    or everything, are not affected. With it, whether the last connection back got there only by finishing
    (never back to that goodput). None: one never got back (not recovered)."""
    w = RECOVER_WINDOW_SAMPLES
    k0 = next((k for k, t in enumerate(times) if t >= at), None)
    if k0 is None or k0 < w:
        return None
    worst, finished = 0, False
    for i in pairs:
        final = pair_bytes[-1][i]
        if pair_bytes[k0][i] <= 0 or (done[i] and pair_bytes[k0][i] == final):
            continue
        ks = k0
        while ks > 0 and pair_bytes[ks][i] > 0:
            ks -= 1
        before = pair_bytes[k0][i] - pair_bytes[ks][i]
        span = times[k0] - times[ks]
        if before <= 0 or span <= 0:
            continue
        back = None
        ended = False
        for k in range(k0, len(times)):
            if done[i] and pair_bytes[k][i] == final:
                back, ended = k, True
                break
            if k + w < len(times):
                got = pair_bytes[k + w][i] - pair_bytes[k][i]
                if got * span >= RECOVER_FRACTION * before * (times[k + w] - times[k]):
                    back = k
                    break
        if back is None:
            return None
        if times[back] - at > worst or (times[back] - at == worst and ended):
            worst, finished = times[back] - at, ended
    return worst, finished


def outage_report(
    o: Outage,
    samples: Sequence[Sample],
    first_finish_after: int | None,
    pair_bytes: Sequence[Sequence[int]] = (),
    pair_done: Sequence[bool] = (),
) -> dict[str, Any]:
    """What one failure cost: ``bypass_us`` (`recovery`: until every affected connection is back to 90 %
    of its pre-failure goodput, 0 when none fell below that; None when one never is back; with
    ``bypass_ended`` when the last one back got there only by finishing its flows),
    ``affected`` connections (of ``connections`` on the ``host_pairs`` with a path through it),
    ``last_packet_us`` (the last data packet into the dead element), and the rate of all flows (and of
    the failed host's, when one is watched) over the 5 sample intervals before the failure
    (``before_us``: first and last sample) and from 2 intervals after the last packet into it until the
    first flow finished after it (``after_us``)."""
    out: dict[str, Any] = {"at_us": o.at / 1000, "what": o.what}
    out["last_packet_us"] = None if o.last_packet_ns is None else o.last_packet_ns / 1000
    times = [s.time_ns for s in samples]
    out["affected"] = len(o.pairs)
    out["connections"] = o.connections
    out["host_pairs"] = o.host_pairs
    rec = recovery(o.at, times, pair_bytes, o.pairs, pair_done) if pair_bytes else None
    out["bypass_us"] = None if rec is None else rec[0] / 1000
    out["bypass_ended"] = rec is not None and rec[1]
    if len(samples) < 3:
        return out
    step = samples[1].time_ns - samples[0].time_ns
    end = first_finish_after if first_finish_after is not None else samples[-1].time_ns
    settle = o.at + (o.last_packet_ns or 0) + 2 * step  # once nothing goes into the dead element
    for when, lo, hi in (("before", o.at - 5 * step, o.at), ("after", settle, end)):
        span = _window(samples, lo, hi)
        out[f"{when}_us"] = None if span is None else [span[0].time_ns / 1000, span[1].time_ns / 1000]
        for key, watched in (("goodput", False), ("host_goodput", True)):
            if not watched or o.host is not None:
                out[f"{key}_{when}_gbps"] = None if span is None else _rate(span[0], span[1], watched) / 1e9
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
    pair_bytes: list[tuple[int, ...]] = field(default_factory=list)
    """Per sample: each connection watched for the outages' recovery, its cumulative delivered bytes."""
    pair_done: list[bool] = field(default_factory=list)
    """Per watched connection: it delivered everything it was given."""
    timings: list[dict[str, float]] = field(default_factory=list)
    """A split run's (`openmrc.sim.partition`): where each rank's time went, by rank (empty: the run was not
    split). Seconds running its share (``run_s``), packing, in the exchange (waiting for the others
    included) and unpacking, the CPU seconds of each (``*_cpu_s``; ``loads_cpu_s``: unpickling) and in all
    (``cpu_s``), the number of windows and of packets it received (``crossing``), its memory
    (``peak_rss_mb``, ``pss_mb``), what building its part took (``build_s``, ``build_cpu_s``,
    ``build_rss_mb``, and a builder's own phases: `openmrc.sim.fabric_sim.Partition.build_times`), the
    seconds before the loop (``start_s``: connecting the cut QP pairs, the cut) and after it
    (``partial_s``: its share of the results; the merging rank's own entry only: ``gather_s``, until every
    share was there, and ``merge_s``, merging them). ``critical_cpu_s`` (the same on every rank): per
    window, the CPU time of the rank that took the most to run it, pack and unpack, summed: how long the
    loop would take on idle cores with a free exchange (a figure a loaded machine does not blur)."""

    def goodput_gbps(self, from_us: float, to_us: float) -> float | None:
        """The rate of all flows (Gb/s) between the samples taken in [from_us, to_us] (None: fewer than
        two): an outage's windows (``before_us``, ``after_us``) on a run without the failure."""
        span = _window(self.samples, round(from_us * 1000), round(to_us * 1000))
        return None if span is None else _rate(span[0], span[1], False) / 1e9

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

    def line_rate_bps(self) -> int:
        """What the sending hosts can inject: the rate of every NIC port of every host that sends a flow."""
        senders = {f.src for f in self.flows}
        return sum(link.bps for link in self.links if link.node in senders)

    def bottleneck_bps(self) -> int:
        """The most the flows' hosts can move at once, the fabric between them taken as non-blocking: what
        the senders can send or, if less, what the receivers can take, a receiver taking its line rate or,
        if less, the line rate of the senders that feed it. (A host's line rate is that of all its NIC
        ports.) An incast's is its receiver's line rate; a permutation's, an all-to-all's or a ring's, that
        of every sender. Each receiver's feeders count in full for it, so where receivers share senders
        this is an upper bound on what the hosts can move (a goodput fraction never exceeds 1)."""
        feeders: dict[int, set[int]] = {}
        for f in self.flows:
            feeders.setdefault(f.dst, set()).add(f.src)
        senders = {f.src for f in self.flows}
        rate: dict[int, int] = {}
        for link in self.links:
            if link.node in senders or link.node in feeders:
                rate[link.node] = rate.get(link.node, 0) + link.bps
        send = sum(rate.get(s, 0) for s in senders)
        take = sum(min(rate.get(d, 0), sum(rate.get(s, 0) for s in srcs)) for d, srcs in feeders.items())
        return min(send, take)

    def deliveries_us(self) -> list[float]:
        """Start to the receiver's completion of each flow the receiver completes (Write with Immediate)."""
        return sorted(
            (f.recv_finish - f.start) / 1000
            for f in self.flows
            if f.recv_finish is not None and f.start is not None
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
            rate = self.bottleneck_bps()
            if rate:
                out["bottleneck_gbps"] = rate / 1e9
                out["goodput_fraction"] = total * 8e9 / job / rate
        delivered = self.deliveries_us()
        if delivered:
            out["median_delivery_us"] = statistics.median(delivered)
            out["max_delivery_us"] = delivered[-1]
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
            reps = out["outages"] = self.outage_reports()
            bypass = [r["bypass_us"] for r in reps]
            out["bypass_us"] = None if None in bypass else max(bypass)
        return out

    def outage_reports(self) -> list[dict[str, Any]]:
        reps = []
        for o in self.outages:
            after = [f.finish for f in self.flows if f.finish is not None and f.finish > o.at]
            first = min(after) if after else None
            reps.append(outage_report(o, self.samples, first, self.pair_bytes, self.pair_done))
        return reps
