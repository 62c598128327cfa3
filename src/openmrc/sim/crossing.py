"""What crosses between the ranks of a split run, and how: the names of `openmrc.sim.parallel.exchange`,
which holds the code."""

from __future__ import annotations

from openmrc.sim.parallel.exchange import (
    LaneHead,
    LaneMessage,
    _Arrival,
    _Cut,
    _dumps,
    _guarded_entry,
    _Lane,
    _misrouted,
    _Shipper,
    _Splitter,
    _wire,
)

__all__ = [
    "LaneHead",
    "LaneMessage",
    "_Arrival",
    "_Cut",
    "_Lane",
    "_Shipper",
    "_Splitter",
    "_dumps",
    "_guarded_entry",
    "_misrouted",
    "_wire",
]
