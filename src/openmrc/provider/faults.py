"""Fault injection shared by every driver: what a fabric does to each packet a NIC port sends.

One `Impairments` per port (or per fabric) holds probabilities and failure windows; `fates` decides, for one
packet, whether it is lost and otherwise what happens to each copy that arrives (extra delay, trimming, an
ECN mark, a flipped bit). The pair harness (`openmrc.provider.loopback`) applies the verdicts in scripted
time, the UDP device (`openmrc.provider.udp`) to real datagrams in wall-clock time, so a test or a demo
without root sees the same faults a switch would cause: drop, duplicate, reorder, trim, corrupt, and
blackhole one EV or a whole port for a while.

All randomness comes from the `random.Random` the caller passes, so a seeded run is reproducible.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Final

from openmrc.transport.types import TrimMark

__all__ = ["Fate", "Impairments", "fates", "flip_bit", "in_window"]


@dataclass
class Impairments:
    """What the fabric does to packets (probabilities per packet, times in ns of the driver's clock)."""

    loss: float = 0.0
    """Probability that a packet is lost."""
    dup: float = 0.0
    """Probability that a packet arrives twice."""
    reorder_ns: int = 0
    """Each arriving copy is delayed by a uniform random 0 .. reorder_ns - 1 ns (reordering)."""
    trim: float = 0.0
    """Probability that a data packet is trimmed in the fabric (payload cut, headers delivered)."""
    trim_lasthop: float = 0.0
    """Probability that a data packet is trimmed at the last hop (incast at the destination)."""
    ecn: float = 0.0
    """Probability that a data packet arrives ECN-marked (CE)."""
    port_fail: dict[int, tuple[int, int | None]] = field(default_factory=dict)
    """Port -> (down from, up again at or None): every packet of that port is lost in the window."""
    ev_fail: dict[int, tuple[int, int | None]] = field(default_factory=dict)
    """Entropy (32-bit EV echo value) -> (blackholed from, until or None)."""
    ev_slow: dict[int, int] = field(default_factory=dict)
    """Entropy -> extra delay (ns) of every packet along that EV: a slow path (a deep queue), not a lossy
    one."""
    data_only: bool = False
    """Only data packets suffer random loss (control traffic protected)."""
    corrupt: float = 0.0
    """Probability that one random bit of a packet's bytes is flipped (drivers that carry bytes only)."""

    def __post_init__(self) -> None:
        for name in ("loss", "dup", "trim", "trim_lasthop", "ecn", "corrupt"):
            p = getattr(self, name)
            if not 0.0 <= p <= 1.0:
                raise ValueError(f"Impairments.{name}: {p!r} is not a probability (0..1)")
        if self.trim + self.trim_lasthop > 1.0:
            raise ValueError("Impairments.trim + trim_lasthop: together more than 1")
        if self.reorder_ns < 0:
            raise ValueError(f"Impairments.reorder_ns: {self.reorder_ns!r} < 0")

    @property
    def active(self) -> bool:
        """Whether anything at all can happen to a packet (a driver skips `fates` otherwise)."""
        return bool(
            self.loss
            or self.dup
            or self.reorder_ns
            or self.trim
            or self.trim_lasthop
            or self.ecn
            or self.port_fail
            or self.ev_fail
            or self.ev_slow
            or self.corrupt
        )


@dataclass(frozen=True, slots=True)
class Fate:
    """What happens to one arriving copy of a packet."""

    delay: int
    """Extra delay, ns (reordering)."""
    trim: TrimMark
    ecn: bool
    corrupt: bool
    """One random bit of its bytes is flipped (see `flip_bit`)."""

    @property
    def plain(self) -> bool:
        """Delivered as it was sent, when it was sent (a driver may batch it with its neighbours)."""
        return not (self.delay or self.trim or self.ecn or self.corrupt)


_PLAIN: Final = [Fate(0, TrimMark.NONE, False, False)]
"""The one copy of a packet that nothing but loss can befall (shared: not to be changed)."""


def in_window(window: tuple[int, int | None] | None, now: int) -> bool:
    """Whether ``now`` lies in a failure window (start, end or None)."""
    if window is None:
        return False
    start, end = window
    return start <= now and (end is None or now < end)


def fates(
    imp: Impairments, rng: random.Random, now: int, port: int, entropy: int, is_data: bool
) -> list[Fate]:
    """The copies of one packet (sent at ``now`` on ``port`` along EV ``entropy``) that arrive: empty if it
    is lost, two if it is duplicated."""
    if in_window(imp.port_fail.get(port), now) or in_window(imp.ev_fail.get(entropy), now):
        return []
    if (is_data or not imp.data_only) and rng.random() < imp.loss:
        return []
    if not (
        imp.dup or imp.trim or imp.trim_lasthop or imp.ecn or imp.corrupt or imp.reorder_ns or imp.ev_slow
    ):
        return _PLAIN  # loss and failures only: the packet goes as it is (a driver's fast path)
    out = []
    for _ in range(2 if rng.random() < imp.dup else 1):
        trim = TrimMark.NONE
        cut = imp.trim + imp.trim_lasthop
        if is_data and rng.random() < cut:
            trim = TrimMark.TRIMMED_LASTHOP if rng.random() * cut < imp.trim_lasthop else TrimMark.TRIMMED
        corrupt = bool(imp.corrupt) and rng.random() < imp.corrupt
        ecn = is_data and rng.random() < imp.ecn
        delay = rng.randrange(imp.reorder_ns) if imp.reorder_ns else 0
        if imp.ev_slow:
            delay += imp.ev_slow.get(entropy, 0)
        out.append(Fate(delay, trim, ecn, corrupt))
    return out


def flip_bit(data: bytes | bytearray | memoryview, rng: random.Random) -> tuple[bytes, int]:
    """``data`` with one random bit flipped, and the index of the byte it is in."""
    flipped = bytearray(data)
    bit = rng.randrange(8 * len(flipped))
    flipped[bit >> 3] ^= 1 << (bit & 7)
    return bytes(flipped), bit >> 3
