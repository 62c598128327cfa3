"""The discrete-event core: integer nanoseconds, a timing wheel, deterministic ties.

Events run in the order of their key ``(time, priority, sequence)`` (`event_key` packs it into one integer,
``time << 44 | priority << 40 | sequence``): equal times run by priority, then in scheduling order, so a run
is a pure function of its inputs and seeds. Randomness comes only from the `random.Random` a caller injects.

How the order is kept cheaply
-----------------------------
Nearly every event of a packet-level run is a packet reaching the far end of a link, a few microseconds
ahead, at priority 0, and a large run has tens of events pending per nanosecond of simulated time. Those
events go into a **timing wheel**: one slot per nanosecond of the next `WHEEL_NS`, each slot a flat list
``[callback, argument, callback, argument, …]`` in scheduling order, so scheduling is two list appends and
running is a walk along the list (no comparisons at all). Everything else (events at least `WHEEL_NS` ahead,
and the rare events with a priority above 0) waits in an ordinary heap of keys. At each time ``t`` the loop
runs the heap's priority-0 events of ``t`` first (they were scheduled before any wheel event of ``t``: an
event enters the wheel only once its time is within `WHEEL_NS` of now, and now only grows), then the wheel
slot of ``t`` (including events added to it while it runs), then the heap's higher priorities one at a
time, going back to the slot whenever one of them scheduled more at ``t``. That is exactly the key order.
"""

from __future__ import annotations

import gc
import heapq
from collections.abc import Callable
from typing import Any, Final

__all__ = ["TIME_SHIFT", "WHEEL_NS", "PausedGc", "Simulator", "event_key"]

# Final: the compiled build calls these through C statics (``heapq.heappush`` is an attribute lookup per call)
_heappop: Final = heapq.heappop
_heappush: Final = heapq.heappush

TIME_SHIFT: Final = 44
"""An event key's time is ``key >> TIME_SHIFT``."""
_PRIO_SHIFT: Final = 40
_SEQ_LIMIT: Final = 1 << _PRIO_SHIFT
_PRIO_LIMIT: Final = 1 << (TIME_SHIFT - _PRIO_SHIFT)
_WHEEL_BITS: Final = 15
WHEEL_NS: Final = 1 << _WHEEL_BITS
"""How far ahead (ns) the timing wheel reaches; later events wait in the heap."""
_MASK: Final = WHEEL_NS - 1
_NEVER: Final = 1 << 62


def event_key(at: int, priority: int, seq: int) -> int:
    """The order key of an event at ``at`` ns with ``priority`` (0-15, lower first) scheduled ``seq``-th."""
    return (at << TIME_SHIFT) | (priority << _PRIO_SHIFT) | seq


class PausedGc:
    """``with PausedGc():`` pauses the cyclic garbage collector and freezes what exists (then restores both).

    A simulator allocates millions of objects that live for the whole run (the fabric, the hosts' QPs and
    EV tables) and, while running, millions of short-lived ones (packets, events) that make no reference
    cycles (a whole k=8 fat-tree permutation leaves none). The collector would only rescan the long-lived
    heap again and again: a third of a large run's time, and more than half of setting up 100K hosts'
    flows. Nested uses are free; a caller that disabled the collector itself keeps it disabled."""

    __slots__ = ("enabled",)

    def __init__(self) -> None:
        self.enabled = False

    def __enter__(self) -> None:
        self.enabled = gc.isenabled()
        if self.enabled:
            gc.disable()
            gc.freeze()

    def __exit__(self, *exc: object) -> None:
        if self.enabled:
            gc.unfreeze()
            gc.enable()


class Simulator:
    """A minimal event loop: `schedule` callbacks, `run` until a time or until nothing is left."""

    def __init__(self) -> None:
        self.now = 0
        self.wheel: list[list[Any]] = [[] for _ in range(WHEEL_NS)]
        """Slot ``t % WHEEL_NS``: the priority-0 events of time ``t`` (``now <= t < now + WHEEL_NS``) as
        callback, argument pairs in scheduling order."""
        self.in_wheel = 0
        """Events waiting in the wheel."""
        self.heap: list[int] = []
        """Keys of the events not in the wheel (a heap)."""
        self.pending: dict[int, tuple[Callable[[Any], None], Any]] = {}
        """Each heap event's callback and argument, by key."""
        self.heap_next = _NEVER
        """The time of the heap's first event (``1 << 62`` when it is empty)."""
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
        if priority:
            self.seq += 1
            self._to_heap(event_key(at, priority, self.seq), callback, arg)
        else:
            self.push(at, callback, arg)

    def push(self, at: int, callback: Callable[[Any], None], arg: Any) -> None:
        """`schedule` at priority 0 without the checks, for hot paths (a link port per packet)."""
        self.seq = seq = self.seq + 1
        if at - self.now < WHEEL_NS:
            slot = self.wheel[at & _MASK]
            slot.append(callback)
            slot.append(arg)
            self.in_wheel += 1
        else:
            self._to_heap((at << TIME_SHIFT) | seq, callback, arg)  # event_key(at, 0, seq), inlined

    def _to_heap(self, key: int, callback: Callable[[Any], None], arg: Any) -> None:
        self.pending[key] = (callback, arg)
        _heappush(self.heap, key)
        at = key >> TIME_SHIFT
        if at < self.heap_next:
            self.heap_next = at

    def peek(self) -> int | None:
        """The time of the next event, or None when nothing is pending."""
        t = self.heap_next
        if self.in_wheel:
            for at in range(self.now, min(t, self.now + WHEEL_NS)):
                if self.wheel[at & _MASK]:
                    return at
        return t if self.heap else None

    def run(self, until: int | None = None, stop: Callable[[], bool] | None = None) -> int:
        """Process events in order until ``until`` (inclusive), until ``stop()`` is true, or until none is
        left. Returns the number of events processed."""
        with PausedGc():
            return self._run(until if until is not None else _NEVER, stop)

    def _run(self, limit: int, stop: Callable[[], bool] | None) -> int:
        wheel = self.wheel
        n = 0
        self.halted = False
        t = self.now
        while True:
            # the next time with an event: walk the wheel, or jump to the heap's next event if it is empty
            if not self.in_wheel:
                t = self.heap_next
                if t == _NEVER:
                    break
            elif not wheel[t & _MASK] and t != self.heap_next:
                t += 1
                continue
            if t > limit:
                if limit > self.now:
                    self.now = limit
                break
            self.now = t
            slot = wheel[t & _MASK]
            prio0_end = (t << TIME_SHIFT) | (1 << _PRIO_SHIFT)
            # the heap's priority-0 events of t come first (scheduled before any wheel event of t)
            while self.heap_next == t and self.heap[0] < prio0_end:
                n += 1
                if self._pop_heap() or (stop is not None and stop()):
                    return self._stopped(n, slot, 0)
            i = 0
            while True:
                while i < len(slot):
                    cb = slot[i]
                    arg = slot[i + 1]
                    i += 2
                    self.in_wheel -= 1
                    cb(arg)
                    n += 1
                    if self.halted or (stop is not None and stop()):
                        return self._stopped(n, slot, i)
                if self.heap_next != t:
                    break
                n += 1  # a higher priority at t; it may add to the slot, which then runs first
                if self._pop_heap() or (stop is not None and stop()):
                    return self._stopped(n, slot, i)
            slot.clear()
            t += 1
        self.events += n
        return n

    def _pop_heap(self) -> bool:
        """Run the heap's first event; True if it halted the run."""
        heap = self.heap
        key = _heappop(heap)
        self.heap_next = heap[0] >> TIME_SHIFT if heap else _NEVER
        cb, arg = self.pending.pop(key)
        cb(arg)
        return self.halted

    def _stopped(self, n: int, slot: list[Any], done: int) -> int:
        """Leave the run after ``done`` list items of the current slot ran: drop them, keep the rest."""
        del slot[:done]
        self.events += n
        return n
