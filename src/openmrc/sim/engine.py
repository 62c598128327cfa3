"""The discrete-event core: integer nanoseconds, a heap of plain tuples, deterministic ties.

Every event has one integer key, ``time << 44 | priority << 40 | sequence`` (`event_key`): equal times
run by priority, then in scheduling order, so a run is a pure function of its inputs and seeds. The heap
holds the keys alone (each comparison is one integer comparison, the cost that dominates a large heap) and
a dict maps each key to its ``(callback, argument)``. There are no per-event closures: callbacks are bound
methods and the argument rides along. Randomness comes only from the `random.Random` a caller injects.
"""

from __future__ import annotations

import gc
import heapq
from collections.abc import Callable
from typing import Any, Final

__all__ = ["TIME_SHIFT", "Simulator", "event_key"]

TIME_SHIFT: Final = 44
"""An event key's time is ``key >> TIME_SHIFT``."""
_PRIO_SHIFT: Final = 40
_SEQ_LIMIT: Final = 1 << _PRIO_SHIFT
_PRIO_LIMIT: Final = 1 << (TIME_SHIFT - _PRIO_SHIFT)


def event_key(at: int, priority: int, seq: int) -> int:
    """The heap key of an event at ``at`` ns with ``priority`` (0-15, lower first) scheduled ``seq``-th."""
    return (at << TIME_SHIFT) | (priority << _PRIO_SHIFT) | seq


class Simulator:
    """A minimal event loop: `schedule` callbacks, `run` until a time or until nothing is left."""

    def __init__(self) -> None:
        self.now = 0
        self.heap: list[int] = []
        """Keys of the pending events (a heap)."""
        self.pending: dict[int, tuple[Callable[[Any], None], Any]] = {}
        """Each pending event's callback and argument, by key."""
        self.seq = 0
        """Events scheduled so far (the last event's sequence number)."""
        self.events = 0
        self.halted = False
        """Set by a callback to make `run` return after the current event (cheaper than a ``stop`` check)."""

    def schedule(self, at: int, callback: Callable[[Any], None], arg: Any = None, priority: int = 0) -> None:
        """Call ``callback(arg)`` at time ``at`` (not before now)."""
        if at < self.now:
            raise ValueError(f"cannot schedule at {at} ns, before now ({self.now} ns)")
        if not 0 <= priority < _PRIO_LIMIT:
            raise ValueError(f"priority {priority} outside 0..{_PRIO_LIMIT - 1}")
        if self.seq + 1 >= _SEQ_LIMIT:
            raise OverflowError(f"more than {_SEQ_LIMIT - 1} events scheduled")
        self.seq += 1
        self._enqueue(event_key(at, priority, self.seq), callback, arg)

    def push(self, at: int, callback: Callable[[Any], None], arg: Any) -> None:
        """`schedule` at priority 0 without the checks, for hot paths (a link port per packet)."""
        self.seq = seq = self.seq + 1
        self._enqueue((at << TIME_SHIFT) | seq, callback, arg)  # event_key(at, 0, seq), inlined

    def _enqueue(self, key: int, callback: Callable[[Any], None], arg: Any) -> None:
        self.pending[key] = (callback, arg)
        heapq.heappush(self.heap, key)

    def peek(self) -> int | None:
        return self.heap[0] >> TIME_SHIFT if self.heap else None

    def run(self, until: int | None = None, stop: Callable[[], bool] | None = None) -> int:
        """Process events in order until ``until`` (inclusive), until ``stop()`` is true, or until none is
        left. Returns the number of events processed."""
        # A run allocates millions of short-lived objects (packets, events) around a fabric that lives for the
        # whole run, and creates no reference cycles (a whole k=8 fat-tree permutation leaves none): the
        # cyclic collector would only rescan the fabric and the packets in flight, which costs a third of a
        # large run. It is paused for the run and whatever existed before is frozen, then both restored.
        enabled = gc.isenabled()
        if enabled:
            gc.disable()
            gc.freeze()
        try:
            return self._run(until, stop)
        finally:
            if enabled:
                gc.unfreeze()
                gc.enable()

    def _run(self, until: int | None, stop: Callable[[], bool] | None) -> int:
        heap = self.heap
        pending = self.pending
        limit = until if until is not None else 1 << 62
        n = 0
        self.halted = False
        while heap:
            key = heap[0]
            t = key >> TIME_SHIFT
            if t > limit:
                self.now = limit
                break
            heapq.heappop(heap)
            cb, arg = pending.pop(key)
            self.now = t
            cb(arg)
            n += 1
            if self.halted or (stop is not None and stop()):
                break
        self.events += n
        return n
