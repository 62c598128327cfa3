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

Partition-independent order (`Simulator.order_by_origin`)
---------------------------------------------------------
The sequence number is global scheduling order: it depends on everything else the process scheduled, so a
simulation split across processes (`openmrc.sim.partition`) cannot reproduce it. In ordered mode the
events of one time run by ``origin``, who scheduled them (0: set-up and failures, node ``i``: ``i + 1``),
and each origin's in the order it scheduled them. A node's events are scheduled where the node lives, so
that order is the same however the fabric is split. No count is kept for it: each origin's events reach a
slot in their scheduling order (the heap's, scheduled earlier, go first; another process ships an
origin's events in order), so a stable sort of the slot by origin alone gives it. An event scheduled for
the current time while it runs is merged in by origin (`now_heap`). A slot holds each event's origin
before its callback and argument (one list to reach per event, as in the default mode), the origin one
of the engine's own int objects (`Simulator.boxes`: no int made per event, none left to go cold until its
time comes: an int made when an event is scheduled and read when it runs costs a cache miss of its own).
A slot is put in that order as its time comes by `order_records`, a stable sort of the slot's records by
their first item: in the compiled build the C one of ``openmrc/_order.c`` (the origins read as C integers
and the list's own references moved into place: tens of nanoseconds a slot, where making and sorting a key
object per event cost some 125 ns an event), otherwise the Python one here (the reference, run by the
interpreted build). A slot of one event is not sorted at all. Two events of different nodes at one time
never touch the same state (links have a latency), so each node sees its events in the same order in every
split. An origin made negative (``~origin``) marks an event for another process: it goes to `outbox`
instead (the link to that process is longer than the exchange window).
"""

from __future__ import annotations

import gc
import heapq
from collections.abc import Callable
from typing import Any, Final, cast

from openmrc import _native

__all__ = ["TIME_SHIFT", "WHEEL_NS", "PausedGc", "Simulator", "event_key", "order_records"]

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


def order_records(records: list[Any], width: int) -> None:
    """Put ``records``, a list of records of ``width`` items each, in order of their first items (ints from
    0), records with equal first items keeping their order; in place. The reference for ``openmrc/_order.c``,
    which the compiled build uses instead (`_order_slot`)."""
    firsts = records[::width]
    order = sorted(range(len(firsts)), key=firsts.__getitem__)
    records[:] = [records[i * width + c] for i in order for c in range(width)]


def _records_orderer() -> Callable[[list[Any], int], None]:
    c = _native.extension("_order")
    return cast(Callable[[list[Any], int], None], c.order_records) if c is not None else order_records


_order_slot: Final = _records_orderer()
"""`order_records`, in C when the compiled build has it."""


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
        self.ordered = False
        """Partition-independent ties (`order_by_origin`): each wheel slot then holds origin, callback,
        argument triples (the origin one of `boxes`), put in origin order (`order_records`) as the slot's
        time comes, each origin's events in their scheduling order."""
        self.boxes: list[object] = []
        """Ordered mode: the int objects ``0 .. origins`` a slot holds (`_box`)."""
        self.oheap: list[tuple[int, int, int, int, Callable[[Any], None], Any]] = []
        """Ordered mode: (time, priority, origin, sequence, callback, argument) of the events not in the
        wheel."""
        self.now_heap: list[tuple[int, int, Callable[[Any], None], Any]] = []
        """Ordered mode: priority-0 events scheduled for the time being run, while it runs."""
        self.in_now = False
        self.setup_events = 0
        """Ordered mode: events of origin 0 (set-up, failures, sampling) run so far: a split run runs them
        in every process."""
        self.outbox: list[tuple[int, int, Callable[[Any], None], Any]] = []
        """Ordered mode: (time, origin, callback, argument) of events for another process (negative origins),
        in scheduling order."""

    def order_by_origin(self, origins: int = 0) -> None:
        """Break ties by origin, then each origin's own scheduling order, instead of global scheduling order
        (see the module's notes). Call before anything is scheduled. ``origins``, when known (every origin
        is at most it), makes the int objects a slot holds for them at once (others are made when met)."""
        if self.seq:
            raise ValueError("order_by_origin: events are already scheduled")
        self.ordered = True
        self.boxes = list(range(origins + 1))

    def schedule(
        self, at: int, callback: Callable[[Any], None], arg: Any = None, priority: int = 0, origin: int = 0
    ) -> None:
        """Call ``callback(arg)`` at time ``at`` (not before now); ``origin`` breaks ties in ordered mode."""
        if at < self.now:
            raise ValueError(f"cannot schedule at {at} ns, before now ({self.now} ns)")
        if not 0 <= priority < _PRIO_LIMIT:
            raise ValueError(f"priority {priority} outside 0..{_PRIO_LIMIT - 1}")
        if self.seq + 1 >= _SEQ_LIMIT:
            raise OverflowError(f"more than {_SEQ_LIMIT - 1} events scheduled")
        if self.ordered:
            self._push_ordered(at, callback, arg, origin, priority)
        elif priority:
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

    def push_from(self, at: int, callback: Callable[[Any], None], arg: Any, origin: int) -> None:
        """`push` by ``origin`` (which only ordered mode reads)."""
        if self.ordered:
            self._push_ordered(at, callback, arg, origin, 0)
        else:
            self.push(at, callback, arg)

    def _push_ordered(
        self, at: int, callback: Callable[[Any], None], arg: Any, origin: int, prio: int
    ) -> None:
        if origin < 0:
            self.outbox.append((at, ~origin, callback, arg))
        elif prio == 0 and at != self.now and at - self.now < WHEEL_NS:  # `insert`'s common case
            self.seq += 1
            slot = self.wheel[at & _MASK]
            boxes = self.boxes
            slot.append(boxes[origin] if origin < len(boxes) else self._box(origin))
            slot.append(callback)
            slot.append(arg)
            self.in_wheel += 1
        else:
            self.insert(at, prio, origin, callback, arg)

    def _box(self, origin: int) -> object:
        """Ordered mode: ``origin`` as one of `boxes` (made when first met: `order_by_origin` was not
        told how many origins there are)."""
        boxes = self.boxes
        if origin >= len(boxes):
            boxes.extend(range(len(boxes), origin + 1))
        return boxes[origin]

    def insert(self, at: int, priority: int, origin: int, callback: Callable[[Any], None], arg: Any) -> None:
        """Ordered mode: schedule an event of ``origin``'s (one another process sent: each origin's events
        must come in the order that origin scheduled them)."""
        self.seq = seq = self.seq + 1
        if priority == 0 and at == self.now and self.in_now:
            _heappush(self.now_heap, (origin, seq, callback, arg))
        elif priority == 0 and at - self.now < WHEEL_NS:
            slot = self.wheel[at & _MASK]
            slot.append(self._box(origin))
            slot.append(callback)
            slot.append(arg)
            self.in_wheel += 1
        else:
            _heappush(self.oheap, (at, priority, origin, seq, callback, arg))
            if at < self.heap_next:
                self.heap_next = at

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
        return t if self.heap or self.oheap else None

    def run(self, until: int | None = None, stop: Callable[[], bool] | None = None) -> int:
        """Process events in order until ``until`` (inclusive), until ``stop()`` is true, or until none is
        left. Returns the number of events processed."""
        with PausedGc():
            if self.ordered:
                if stop is not None:
                    raise ValueError("ordered mode runs to a time (no stop condition)")
                return self._run_ordered(until if until is not None else _NEVER)
            return self._run(until if until is not None else _NEVER, stop)

    def _run(self, limit: int, stop: Callable[[], bool] | None) -> int:
        wheel = self.wheel
        n = 0
        self.halted = False
        t = self.now
        while True:
            t = self._next_time(t, limit)
            if t < 0:
                break
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

    def _next_time(self, t: int, limit: int) -> int:
        """The next time from ``t`` with an event, made ``now`` (walk the wheel, or jump to the heap's next
        event when the wheel is empty); -1 when none is left or it is past ``limit`` (``now`` moves there)."""
        wheel = self.wheel
        while True:
            if not self.in_wheel:
                t = self.heap_next
                if t == _NEVER:
                    return -1
            elif not wheel[t & _MASK] and t != self.heap_next:
                t += 1
                continue
            if t > limit:
                if limit > self.now:
                    self.now = limit
                return -1
            self.now = t
            return t

    def _run_ordered(self, limit: int) -> int:
        """`_run` in origin order: each time's events by (priority, origin), ``halted`` ignored (an ordered
        run stops at window ends only, where every process agrees)."""
        wheel = self.wheel
        heap = self.oheap
        nowh = self.now_heap
        n = 0
        t = self.now
        while True:
            t = self._next_time(t, limit)
            if t < 0:
                break
            slot = wheel[t & _MASK]
            m = len(slot) // 3
            self.in_wheel -= m
            if heap and heap[0][0] == t and heap[0][1] == 0:  # scheduled before the wheel's: first
                early: list[Any] = []
                while heap and heap[0][0] == t and heap[0][1] == 0:
                    e = _heappop(heap)
                    early.append(self._box(e[2]))
                    early.append(e[4])
                    early.append(e[5])
                early.extend(slot)
                slot.clear()
                slot = early
                m = len(slot) // 3
                self.heap_next = heap[0][0] if heap else _NEVER
            self.in_now = True
            if m == 1:  # nothing to order (this time's own events come later: none is scheduled yet)
                origin = cast(int, slot[0])
                slot[1](slot[2])
                n += 1
                if not origin:
                    self.setup_events += 1
            elif m:
                _order_slot(slot, 3)  # by origin; each origin's events stay in their scheduling order
                for j in range(0, 3 * m, 3):  # with what this time's events schedule for it merged in
                    origin = cast(int, slot[j])
                    while nowh and nowh[0][0] < origin:
                        e0 = _heappop(nowh)
                        n += self._run_one(e0[0], e0[2], e0[3])
                    cb = slot[j + 1]
                    cb(slot[j + 2])
                    n += 1
                    if not origin:
                        self.setup_events += 1
            while True:
                if nowh:
                    e0 = _heappop(nowh)
                    n += self._run_one(e0[0], e0[2], e0[3])
                elif self.heap_next == t:  # a higher priority at t, after every priority-0 event of t
                    e = _heappop(heap)
                    self.heap_next = heap[0][0] if heap else _NEVER
                    n += self._run_one(e[2], e[4], e[5])
                else:
                    break
            self.in_now = False
            slot.clear()
            t += 1
        self.events += n
        return n

    def _run_one(self, origin: int, cb: Callable[[Any], None], arg: Any) -> int:
        cb(arg)
        if not origin:
            self.setup_events += 1
        return 1

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
