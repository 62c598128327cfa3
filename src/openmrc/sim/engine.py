"""The discrete-event core: integer nanoseconds, a heap of plain tuples, deterministic ties.

Heap entries are ``(time, priority, sequence, callback, argument)``: equal times run by priority, then in
scheduling order, so a run is a pure function of its inputs and seeds. There are no per-event closures:
callbacks are bound methods and the argument rides in the tuple. Randomness comes only from the
`random.Random` a caller injects.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from typing import Any

__all__ = ["Simulator"]


class Simulator:
    """A minimal event loop: `schedule` callbacks, `run` until a time or until nothing is left."""

    def __init__(self) -> None:
        self.now = 0
        self.heap: list[tuple[int, int, int, Callable[[Any], None], Any]] = []
        """Pending events. Hot paths (link ports) push ``(time, 0, next(seq), callback, arg)`` directly."""
        self.seq = itertools.count()
        self.events = 0
        self.halted = False
        """Set by a callback to make `run` return after the current event (cheaper than a ``stop`` check)."""

    def schedule(self, at: int, callback: Callable[[Any], None], arg: Any = None, priority: int = 0) -> None:
        """Call ``callback(arg)`` at time ``at`` (not before now)."""
        if at < self.now:
            raise ValueError(f"cannot schedule at {at} ns, before now ({self.now} ns)")
        heapq.heappush(self.heap, (at, priority, next(self.seq), callback, arg))

    def peek(self) -> int | None:
        return self.heap[0][0] if self.heap else None

    def run(self, until: int | None = None, stop: Callable[[], bool] | None = None) -> int:
        """Process events in order until ``until`` (inclusive), until ``stop()`` is true, or until none is
        left. Returns the number of events processed."""
        heap = self.heap
        pop = heapq.heappop
        limit = until if until is not None else 1 << 62
        n = 0
        self.halted = False
        while heap:
            t = heap[0][0]
            if t > limit:
                self.now = limit
                break
            _t, _p, _s, cb, arg = pop(heap)
            self.now = t
            cb(arg)
            n += 1
            if self.halted or (stop is not None and stop()):
                break
        self.events += n
        return n
