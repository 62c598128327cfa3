"""What ``openmrc perf`` measured, and how it describes a connection (as ``ib_write_bw`` does)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = [
    "ClientReport",
    "Connection",
    "IntervalReport",
    "PerfError",
    "PerfInterrupted",
    "QpAddress",
    "SideAddress",
    "SizeResult",
    "operation_name",
    "summarize",
]


class PerfError(RuntimeError):
    """A perf session failed (the peer refused, went away, or the data did not arrive intact)."""


def operation_name(imm: bool) -> str:
    """What the client posts, as the verbs name it."""
    return "RDMA Write with Immediate" if imm else "RDMA Write"


@dataclass
class SizeResult:
    """One row of the table: a message size and what it achieved."""

    bytes: int
    iterations: int
    bw_peak_gbps: float
    bw_avg_gbps: float
    msg_rate_mpps: float
    seconds: float
    retransmits: int
    ev_state_changes: int
    completions_ok: bool
    evs_marked_bad: int = 0
    """EV events of the run that marked an EV ASSUMED_BAD (``ev_state_changes`` counts those to GOOD too)."""


@dataclass
class IntervalReport:
    """One interval of a duration run: when it ended (``time.time()``), the goodput of the Writes that
    completed in it, the retransmissions in it, and the EVs of the client's QPs by state at its end:
    ``evs_good`` / ``evs_bad`` (GOOD, ASSUMED_BAD), and ``evs_held``: GOOD EVs of the rotation held out of
    use while a loss on them is judged (the sender routes around them before it blames them)."""

    t: float
    gbps: float
    retransmits: int
    evs_good: int
    evs_bad: int
    evs_held: int = 0
    start: float = 0.0
    """When the interval began, in seconds since the run started."""
    end: float = 0.0
    """When it ended, in seconds since the run started."""
    bytes: int = 0
    """Bytes of the Writes that completed in it."""


def summarize(intervals: Sequence[IntervalReport]) -> IntervalReport | None:
    """The intervals as one (iperf3's summary line): from the first's start to the last's end, its bytes
    and retransmissions summed, the EVs as at its end; None without intervals."""
    if not intervals:
        return None
    first, last = intervals[0], intervals[-1]
    nbytes = sum(r.bytes for r in intervals)
    span = max(last.end - first.start, 1e-9)
    return IntervalReport(
        last.t,
        round(nbytes * 8 / span / 1e9, 6),
        sum(r.retransmits for r in intervals),
        last.evs_good,
        last.evs_bad,
        last.evs_held,
        first.start,
        last.end,
        nbytes,
    )


@dataclass(frozen=True)
class QpAddress:
    """A QP as ``ib_write_bw`` describes it: its number, its first PSN, and the R_Key and VA of the buffer
    it writes from (the client) or into (the server)."""

    qpn: int
    psn: int
    rkey: int
    va: int


@dataclass(frozen=True)
class SideAddress:
    """One side of a connection: its endpoint on every plane (``ip:port``, ``[ip]:port``) and its QPs."""

    endpoints: list[str]
    qps: list[QpAddress]


@dataclass(frozen=True)
class Connection:
    """A connection as the side that holds it sees it: ``local`` is that side."""

    local: SideAddress
    remote: SideAddress

    def lines(self) -> list[str]:
        """The block ``ib_write_bw`` prints (a line per QP, its LID replaced by the planes' endpoints)."""
        rule = "-" * 86
        out = [rule]
        for name, side in (("local", self.local), ("remote", self.remote)):
            for q in side.qps:
                out.append(
                    f" {name} address: QPN 0x{q.qpn:06x} PSN 0x{q.psn:06x}"
                    f" RKey 0x{q.rkey:08x} VA 0x{q.va:016x}"
                )
            out.append(f" {name} planes: {', '.join(side.endpoints)}")
        out.append(rule)
        return out


@dataclass
class ClientReport:
    """What a client measured (`run_client`)."""

    results: list[SizeResult]
    hash_ok: bool | None
    """Whether the server's buffer holds what was written (None: not checked, the run was interrupted)."""
    planes: int
    qps: int
    device: dict[str, int] = field(default_factory=dict)
    nic: dict[str, int] = field(default_factory=dict)
    ev_mode: str = "udp"
    intervals: list[IntervalReport] = field(default_factory=list)
    connection: Connection | None = None
    summary: IntervalReport | None = None
    """A duration run's intervals as one (`summarize`)."""
    interrupted: bool = False

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class PerfInterrupted(KeyboardInterrupt):
    """Ctrl-C while the client measured: ``report`` holds what ran so far (its hash not checked)."""

    def __init__(self, report: ClientReport) -> None:
        super().__init__("interrupted")
        self.report = report
