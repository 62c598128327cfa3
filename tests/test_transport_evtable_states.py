"""The EV state machine walked cell by cell: every `MachineState` × every `Trigger`, brought about through
`EvTable`'s own calls, the EV and the table checked against what `openmrc.ev.state.TRANSITIONS` says (the
next state and each action's effect; nothing else changes)."""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest

from openmrc.ev import EVState
from openmrc.ev.state import EV_STATE_OF, TRANSITIONS, Action, MachineState, Trigger
from openmrc.transport import EvEntry, EvEvent, EvTable

S, T, A = MachineState, Trigger, Action
PROBE_INTERVAL = 1_000
HELD_EPOCH = 1 << 30
NOW = 50_000
PLACEMENTS = ["rotation", "alone", "crowded", "backup"]
"""Where the EV is: in the rotation with GOOD backups of its plane, in the rotation with none, in the
rotation with GOOD backups that came back after it was taken out of use (it keeps its slot), a backup."""


@dataclass(frozen=True)
class Seen:
    """What the walk compares: the EV's fields and the table's sets."""

    state: EVState
    skip_epoch: int
    slot: int
    probe_ok: int
    misses: int
    next_probe: int
    rotation: tuple[int, ...]
    backups: tuple[int, ...]
    bad: tuple[int, ...]
    events: tuple[EvEvent, ...]


def seen(t: EvTable, e: EvEntry, events: list[EvEvent]) -> Seen:
    p = e._probing
    return Seen(
        e.state,
        e.skip_epoch,
        e.slot,
        e.probe_ok,
        0 if p is None else p.misses,
        e.next_probe,
        tuple(x.entropy for x in t.rotation),
        tuple(x.entropy for x in t._backups),
        tuple(x.entropy for x in t.bad),
        tuple(events),
    )


def row_of(e: EvEntry) -> MachineState:
    if e.state is EVState.SKIP:
        return S.HELD if e.skip_epoch == HELD_EPOCH else S.SKIP
    return {EVState.GOOD: S.GOOD, EVState.ASSUMED_BAD: S.ASSUMED_BAD, EVState.DENIED: S.DENIED}[e.state]


def setup(state: MachineState, placement: str) -> tuple[EvTable, EvEntry, list[EvEvent]]:
    """A table with an EV in ``state`` at ``placement``, a rotation later, its probe counts not zero."""
    events: list[EvEvent] = []
    entries = [((0x1000 + i).to_bytes(2, "big") + bytes(30), 1 + i % 2, 0x1000 + i) for i in range(8)]
    t = EvTable(
        entries,
        rng=random.Random(3),
        min_active=0,
        active_fraction=1.0 if placement == "alone" else 0.75,
        reshuffle_rotations=1000,
        probe_interval=PROBE_INTERVAL,
        emit=events.append,
        qp_num=0x42,
        profile_id=3,
    )
    e = t._backups[0] if placement == "backup" else t.rotation[0]
    spares = [b for b in t._backups if b.port == e.port] if placement == "crowded" else []
    for b in spares:
        t.mark_bad(b, 5)
    if state is S.SKIP:
        t.skip(e)
    elif state is S.HELD:
        t.hold(e)
    elif state is S.ASSUMED_BAD:
        t.mark_bad(e, 10)
    elif state is S.DENIED:
        t.set_state(e, EVState.DENIED, 10)
    for b in spares:
        t.set_state(b, EVState.GOOD, 15)
    assert row_of(e) is state
    t.epoch += 1  # a skip (or the rest) from an earlier rotation: REST is seen to move the epoch
    p = e._probe_state()
    p.ok, p.misses, p.next_probe = 1, 1, 20
    events.clear()
    return t, e, events


def fire(t: EvTable, e: EvEntry, trigger: Trigger) -> None:
    """Bring ``trigger`` about on ``e`` through the table's calls (with the guard that selects it)."""
    t.min_active = 10**6 if trigger in (T.HOLD_AT_FLOOR, T.BLAME_AT_FLOOR) else 0
    t.probes_to_restore = e.probe_ok + (1 if trigger is T.PROBE_RESTORES else 2)
    if trigger is T.SKIP:
        t.skip(e)
    elif trigger is T.SKIP_ELAPSED:
        t.pick()  # the rotation's next pick is slot 0: this EV if it is still there
    elif trigger in (T.HOLD, T.HOLD_AT_FLOOR):
        t.hold(e)
    elif trigger is T.RELEASE:
        t.release(e)
    elif trigger in (T.BLAME, T.BLAME_AT_FLOOR):
        t.mark_bad(e, NOW)
    elif trigger in (T.PROBE_DIRTY, T.PROBE_CLEAN, T.PROBE_RESTORES):
        t.probe_answered(e, NOW, trigger is not T.PROBE_DIRTY)
    elif trigger is T.SET_GOOD:
        t.set_state(e, EVState.GOOD, NOW)
    else:
        assert trigger is T.SET_DENIED
        t.set_state(e, EVState.DENIED, NOW)


def expected(t: EvTable, e: EvEntry, before: Seen, to: MachineState, action: Action) -> Seen:
    """``before`` with the transition to ``to`` and ``action`` applied, as the `Action` bits say."""
    ok, misses, next_probe, bad = before.probe_ok, before.misses, before.next_probe, before.bad
    rotation, backups, slot = list(before.rotation), list(before.backups), before.slot
    skip_epoch, events = before.skip_epoch, before.events
    me = e.entropy
    if action & A.STOP_PROBING:
        bad = tuple(x for x in bad if x != me)
    if action & A.RESET_OK:
        ok = 0
    if action & A.CONFIRM and misses:
        next_probe = NOW
    if action & A.CLEAR_MISSES:
        misses = 0
    if action & A.COUNT_OK:
        ok += 1
    if action & A.RETIRE:
        port = e.port
        spare = [b for b in t.entries if b.entropy in backups and b.port == port and b.state is EVState.GOOD]
        if slot < 0:
            backups = [x for x in backups if x != me]
        elif spare:
            first = min(spare, key=lambda b: backups.index(b.entropy))
            backups.remove(first.entropy)
            rotation[slot] = first.entropy
            slot = -1
    if action & A.REST:
        skip_epoch = t.epoch
    if action & A.HOLD:
        skip_epoch = HELD_EPOCH
    state = EV_STATE_OF[to]
    if action & A.EMIT:
        events += (EvEvent(NOW, 0x42, 3, e.port, e.expanded, me, state),)
    if action & A.START_PROBING:
        bad += (me,)
        ok = misses = 0
        next_probe = NOW + PROBE_INTERVAL
    if action & A.REJOIN and slot < 0 and me not in backups:
        backups.append(me)
    return Seen(state, skip_epoch, slot, ok, misses, next_probe, tuple(rotation), tuple(backups), bad, events)


CELLS = [
    (s, t, where)
    for s in MachineState
    for t in Trigger
    for where in PLACEMENTS
    # a backup is never at the floor, nor reached by the rotation's pick
    if not (where == "backup" and t in (T.HOLD_AT_FLOOR, T.BLAME_AT_FLOOR, T.SKIP_ELAPSED))
]


@pytest.mark.parametrize(("state", "trigger", "where"), CELLS, ids=lambda x: getattr(x, "name", x))
def test_every_cell_of_the_table_is_what_the_ev_table_does(
    state: MachineState, trigger: Trigger, where: str
) -> None:
    t, e, events = setup(state, where)
    before = seen(t, e, events)
    reached = trigger is not T.SKIP_ELAPSED or t.rotation[0] is e
    to, action = TRANSITIONS[state][trigger] if reached else (state, A.NONE)
    fire(t, e, trigger)
    assert row_of(e) is to
    assert seen(t, e, events) == expected(t, e, before, to, action)


def test_the_walk_covers_every_cell() -> None:
    assert {(s, t) for s, t, _ in CELLS} == {(s, t) for s in MachineState for t in Trigger}
