"""What ``openmrc perf`` measured."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["ClientReport", "IntervalReport", "PerfError", "SizeResult"]


class PerfError(RuntimeError):
    """A perf session failed (the peer refused, went away, or the data did not arrive intact)."""


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


@dataclass
class ClientReport:
    results: list[SizeResult]
    hash_ok: bool
    planes: int
    qps: int
    device: dict[str, int] = field(default_factory=dict)
    nic: dict[str, int] = field(default_factory=dict)
    ev_mode: str = "udp"
    intervals: list[IntervalReport] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)
