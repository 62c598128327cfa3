"""The EV state machine's table: complete, packed faithfully, and listed in its module's docstring."""

from __future__ import annotations

import inspect

import openmrc.ev.state as ev_state
from openmrc.ev import CONTROLLER_VISIBLE, EVState
from openmrc.ev.state import (
    EV_STATE_OF,
    STATE_BITS,
    TRANSITION_CODES,
    TRANSITIONS,
    Action,
    MachineState,
    Trigger,
    diagram,
)


def test_the_docstring_lists_the_tables_transitions() -> None:
    doc = inspect.cleandoc(ev_state.__doc__ or "")
    listed = doc[doc.index("::\n") + 3 :].strip("\n")
    assert inspect.cleandoc(listed) == diagram()


def test_every_state_and_trigger_has_a_cell() -> None:
    assert set(TRANSITIONS) == set(MachineState)
    for row in TRANSITIONS.values():
        assert set(row) == set(Trigger)


def test_the_packed_table_is_the_table() -> None:
    assert len(TRANSITION_CODES) == len(MachineState) * len(Trigger)
    assert max(MachineState) < 1 << STATE_BITS
    for s in MachineState:
        for t in Trigger:
            code = TRANSITION_CODES[s * len(Trigger) + t]
            assert (MachineState(code & ((1 << STATE_BITS) - 1)), Action(code >> STATE_BITS)) == TRANSITIONS[
                s
            ][t]


def test_each_at_floor_trigger_follows_its_plain_form() -> None:
    # (the EV table judges the floor by looking at the next trigger's cell)
    assert Trigger.HOLD_AT_FLOOR == Trigger.HOLD + 1
    assert Trigger.BLAME_AT_FLOOR == Trigger.BLAME + 1


def test_the_controller_sees_skip_and_held_as_good() -> None:
    assert len(EV_STATE_OF) == len(MachineState)
    seen = {s: CONTROLLER_VISIBLE[EV_STATE_OF[s]] for s in MachineState}
    assert seen == {
        MachineState.GOOD: EVState.GOOD,
        MachineState.SKIP: EVState.GOOD,
        MachineState.HELD: EVState.GOOD,
        MachineState.ASSUMED_BAD: EVState.ASSUMED_BAD,
        MachineState.DENIED: EVState.DENIED,
    }


def test_a_change_the_controller_can_see_or_asked_for_is_reported() -> None:
    for s in MachineState:
        for t in Trigger:
            to, action = TRANSITIONS[s][t]
            visible = CONTROLLER_VISIBLE[EV_STATE_OF[s]] is not CONTROLLER_VISIBLE[EV_STATE_OF[to]]
            requested = t in (Trigger.SET_GOOD, Trigger.SET_DENIED) and to is not s
            if visible or requested or (s, t) == (MachineState.DENIED, Trigger.SET_DENIED):
                assert action & Action.EMIT, (s, t)
            else:
                assert not action & Action.EMIT, (s, t)
