"""EV states and the EV state machine (MRC spec notes §2; values from mrc_ctl.h ``mrc_ctl_ev_state``).

Theory of operation: every EV of a QP is in one state. GOOD EVs carry traffic. SKIP is internal to the
NIC: the EV sits out the rest of the current rotation (an ECN echo, a trim NACK not from the last hop, or
a loss not judged yet) and turns GOOD again when a later rotation's pick reaches it. HELD is SKIP held
until a loss thought to have happened on the EV is judged (a NIC whose host is late: lateness is not
loss). ASSUMED_BAD EVs carry no data and are probed in the background until ``probes_to_restore`` probes
in a row come back clean. DENIED is set by the controller and never recovers on its own. The controller
never sees SKIP or HELD: both are reported as GOOD (`CONTROLLER_VISIBLE`).

`TRANSITIONS` is the whole machine, written once: for every (`MachineState`, `Trigger`) pair the state it
leads to and the `Action` the per-QP EV table (`openmrc.transport.evtable.EvTable`) takes, in the order of
the action bits. Every pair is listed; a pair that changes nothing is a no-op (a trigger that does not
apply in that state is ignored, never an error). Guards are triggers of their own: ``*_AT_FLOOR`` when
taking the EV out of use would leave fewer than ``min_active`` usable EVs (judged only where the two
cells differ), and a clean probe answer is PROBE_RESTORES when it is the ``probes_to_restore``-th in a
row. The controller's ASSUMED_BAD is BLAME. Probe bookkeeping (a probe sent, outstanding, unanswered) and
ports going up or down change no state: a plane's EVs are out of use while their port is down.

SKIP_ELAPSED fires lazily, in ``pick``, when the rotation reaches an EV skipped in an earlier one (not at
the rotation's wrap: an EV that is never picked again stays SKIP, which a controller GOOD reports as a
change). The transitions that change something (`diagram` renders them; a test keeps this list in step
with the table)::

    GOOD         skip             -> SKIP         rest
    GOOD         hold             -> HELD         hold
    GOOD         hold_at_floor    -> SKIP         rest
    GOOD         blame            -> ASSUMED_BAD  retire, emit, start_probing
    GOOD         blame_at_floor   -> SKIP         rest
    GOOD         set_good         -> GOOD         stop_probing, reset_ok, rejoin
    GOOD         set_denied       -> DENIED       stop_probing, retire, emit
    SKIP         skip             -> SKIP         rest
    SKIP         skip_elapsed     -> GOOD
    SKIP         hold             -> HELD         hold
    SKIP         hold_at_floor    -> SKIP         rest
    SKIP         blame            -> ASSUMED_BAD  retire, emit, start_probing
    SKIP         blame_at_floor   -> SKIP         rest
    SKIP         set_good         -> GOOD         stop_probing, reset_ok, emit, rejoin
    SKIP         set_denied       -> DENIED       stop_probing, retire, emit
    HELD         release          -> GOOD
    HELD         blame            -> ASSUMED_BAD  retire, emit, start_probing
    HELD         blame_at_floor   -> SKIP         rest
    HELD         set_good         -> GOOD         stop_probing, reset_ok, emit, rejoin
    HELD         set_denied       -> DENIED       stop_probing, retire, emit
    ASSUMED_BAD  blame            -> ASSUMED_BAD  reset_ok
    ASSUMED_BAD  blame_at_floor   -> ASSUMED_BAD  reset_ok
    ASSUMED_BAD  probe_dirty      -> ASSUMED_BAD  reset_ok, clear_misses
    ASSUMED_BAD  probe_clean      -> ASSUMED_BAD  confirm, clear_misses, count_ok
    ASSUMED_BAD  probe_restores   -> GOOD         stop_probing, clear_misses, count_ok, emit, rejoin
    ASSUMED_BAD  set_good         -> GOOD         stop_probing, reset_ok, emit, rejoin
    ASSUMED_BAD  set_denied       -> DENIED       stop_probing, retire, emit
    DENIED       set_good         -> GOOD         stop_probing, reset_ok, emit, rejoin
    DENIED       set_denied       -> DENIED       stop_probing, retire, emit
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import IntEnum, IntFlag
from types import MappingProxyType
from typing import Final

__all__ = [
    "CONTROLLER_VISIBLE",
    "EVENT_MASK_ALLOWED",
    "EV_STATE_OF",
    "TRANSITIONS",
    "TRANSITION_CODES",
    "Action",
    "EVState",
    "MachineState",
    "Trigger",
    "controller_state",
    "diagram",
]


class EVState(IntEnum):
    """State of one EV. Values are the mrc_ctl.h bits, except the internal SKIP."""

    GOOD = 1 << 0
    """Usable for new packets."""
    ASSUMED_BAD = 1 << 1
    """Not used for data; probed in the background, back to GOOD when probes succeed."""
    DENIED = 1 << 2
    """Disabled by the controller; never recovers automatically."""
    SKIP = 1 << 8
    """Internal (openmrc value, outside the mrc_ctl.h bits): skipped for the rest of the current rotation,
    or held (`MachineState.HELD`)."""
    UNKNOWN = 1 << 31
    """Reported to the controller when the state cannot be determined."""


CONTROLLER_VISIBLE: Mapping[EVState, EVState] = MappingProxyType(
    {
        EVState.GOOD: EVState.GOOD,
        EVState.SKIP: EVState.GOOD,
        EVState.ASSUMED_BAD: EVState.ASSUMED_BAD,
        EVState.DENIED: EVState.DENIED,
        EVState.UNKNOWN: EVState.UNKNOWN,
    }
)
"""The state a controller query reports for each internal state (SKIP reads as GOOD)."""

EVENT_MASK_ALLOWED: int = EVState.GOOD | EVState.ASSUMED_BAD
"""The only bits an EV profile's ``event_mask`` may use (mrc_ctl.h ``ev_event_mask``)."""


def controller_state(state: EVState) -> EVState:
    """The controller-visible form of ``state``."""
    return CONTROLLER_VISIBLE[state]


class MachineState(IntEnum):
    """A state of the EV state machine: an `EVState`, with SKIP told apart from HELD."""

    GOOD = 0
    SKIP = 1
    """Skipped for the rest of the rotation it was skipped in."""
    HELD = 2
    """Out of the rotation until a loss thought to have happened on it is judged (an `EVState.SKIP`)."""
    ASSUMED_BAD = 3
    DENIED = 4


class Trigger(IntEnum):
    """What happens to an EV. An ``*_AT_FLOOR`` trigger directly follows its plain form."""

    SKIP = 0
    """An ECN echo (SACK M=SKIP_ONCE), a trim NACK not from the last hop, or a loss not judged yet."""
    SKIP_ELAPSED = 1
    """The rotation's pick reaches the EV in a later rotation than the one it was skipped in."""
    HOLD = 2
    """A loss thought to have happened on the EV, on a NIC whose host is late (`NicConfig.late_host`)."""
    HOLD_AT_FLOOR = 3
    RELEASE = 4
    """The loss that held the EV was spurious, or a trim explained it."""
    BLAME = 5
    """A loss judged (inferred or timeout), SACK M=ALWAYS_SKIP, or the controller's ASSUMED_BAD."""
    BLAME_AT_FLOOR = 6
    PROBE_DIRTY = 7
    """A probe (or any packet) sent on the EV acknowledged with M other than NONE."""
    PROBE_CLEAN = 8
    """A probe acknowledged with M=NONE, fewer than ``probes_to_restore`` in a row."""
    PROBE_RESTORES = 9
    """The ``probes_to_restore``-th clean probe answer in a row."""
    SET_GOOD = 10
    """The controller's MODIFY_EV_STATE GOOD (also lifts a denial)."""
    SET_DENIED = 11
    """The controller's MODIFY_EV_STATE DENIED."""


class Action(IntFlag):
    """What the EV table does on a transition, in the order of the bits."""

    NONE = 0
    STOP_PROBING = 1 << 0
    """Leave the ASSUMED_BAD set: no longer probed."""
    RESET_OK = 1 << 1
    """Clean probe answers in a row back to 0."""
    CONFIRM = 1 << 2
    """If probes went unanswered before this answer (a path back after a failure), probe again at once."""
    CLEAR_MISSES = 1 << 3
    """Unanswered probes back to 0."""
    COUNT_OK = 1 << 4
    """One more clean probe answer in a row."""
    RETIRE = 1 << 5
    """Give the EV's rotation slot to a GOOD backup of its plane, if there is one (a backup: leave the
    backups)."""
    REST = 1 << 6
    """Skipped for the rest of the current rotation (its skip epoch is the current one)."""
    HOLD = 1 << 7
    """Skipped until judged (its skip epoch is after every rotation's)."""
    EMIT = 1 << 8
    """Report the new state as an EV event (``emit``)."""
    START_PROBING = 1 << 9
    """Join the ASSUMED_BAD set: probed from ``probe_interval`` on, its probe counts cleared."""
    REJOIN = 1 << 10
    """Out of the rotation: join its plane's backups (at the end)."""


_S = MachineState
_T = Trigger
_A = Action
_TO_BAD: Final = _A.RETIRE | _A.EMIT | _A.START_PROBING
_TO_GOOD: Final = _A.STOP_PROBING | _A.RESET_OK | _A.EMIT | _A.REJOIN
_TO_DENIED: Final = _A.STOP_PROBING | _A.RETIRE | _A.EMIT
_RESTORED: Final = _A.STOP_PROBING | _A.CLEAR_MISSES | _A.COUNT_OK | _A.EMIT | _A.REJOIN
_NONE: Final = _A.NONE

TRANSITIONS: Final[Mapping[MachineState, Mapping[Trigger, tuple[MachineState, Action]]]] = MappingProxyType(
    {
        _S.GOOD: {
            _T.SKIP: (_S.SKIP, _A.REST),
            _T.SKIP_ELAPSED: (_S.GOOD, _NONE),
            _T.HOLD: (_S.HELD, _A.HOLD),
            _T.HOLD_AT_FLOOR: (_S.SKIP, _A.REST),
            _T.RELEASE: (_S.GOOD, _NONE),
            _T.BLAME: (_S.ASSUMED_BAD, _TO_BAD),
            _T.BLAME_AT_FLOOR: (_S.SKIP, _A.REST),
            _T.PROBE_DIRTY: (_S.GOOD, _NONE),
            _T.PROBE_CLEAN: (_S.GOOD, _NONE),
            _T.PROBE_RESTORES: (_S.GOOD, _NONE),
            _T.SET_GOOD: (_S.GOOD, _TO_GOOD & ~_A.EMIT),  # no event: the state does not change
            _T.SET_DENIED: (_S.DENIED, _TO_DENIED),
        },
        _S.SKIP: {
            _T.SKIP: (_S.SKIP, _A.REST),  # the rotation it sits out is the current one
            _T.SKIP_ELAPSED: (_S.GOOD, _NONE),
            _T.HOLD: (_S.HELD, _A.HOLD),
            _T.HOLD_AT_FLOOR: (_S.SKIP, _A.REST),
            _T.RELEASE: (_S.SKIP, _NONE),
            _T.BLAME: (_S.ASSUMED_BAD, _TO_BAD),
            _T.BLAME_AT_FLOOR: (_S.SKIP, _A.REST),
            _T.PROBE_DIRTY: (_S.SKIP, _NONE),
            _T.PROBE_CLEAN: (_S.SKIP, _NONE),
            _T.PROBE_RESTORES: (_S.SKIP, _NONE),
            _T.SET_GOOD: (_S.GOOD, _TO_GOOD),  # an event, though the controller saw GOOD already
            _T.SET_DENIED: (_S.DENIED, _TO_DENIED),
        },
        _S.HELD: {
            _T.SKIP: (_S.HELD, _NONE),  # a held EV stays held
            _T.SKIP_ELAPSED: (_S.HELD, _NONE),
            _T.HOLD: (_S.HELD, _NONE),
            _T.HOLD_AT_FLOOR: (_S.HELD, _NONE),
            _T.RELEASE: (_S.GOOD, _NONE),
            _T.BLAME: (_S.ASSUMED_BAD, _TO_BAD),
            _T.BLAME_AT_FLOOR: (_S.SKIP, _A.REST),  # judged: no longer held, only rested for the rotation
            _T.PROBE_DIRTY: (_S.HELD, _NONE),
            _T.PROBE_CLEAN: (_S.HELD, _NONE),
            _T.PROBE_RESTORES: (_S.HELD, _NONE),
            _T.SET_GOOD: (_S.GOOD, _TO_GOOD),
            _T.SET_DENIED: (_S.DENIED, _TO_DENIED),
        },
        _S.ASSUMED_BAD: {
            _T.SKIP: (_S.ASSUMED_BAD, _NONE),
            _T.SKIP_ELAPSED: (_S.ASSUMED_BAD, _NONE),
            _T.HOLD: (_S.ASSUMED_BAD, _NONE),
            _T.HOLD_AT_FLOOR: (_S.ASSUMED_BAD, _NONE),
            _T.RELEASE: (_S.ASSUMED_BAD, _NONE),
            _T.BLAME: (_S.ASSUMED_BAD, _A.RESET_OK),  # blamed again: restoring starts over, no event
            _T.BLAME_AT_FLOOR: (_S.ASSUMED_BAD, _A.RESET_OK),
            _T.PROBE_DIRTY: (_S.ASSUMED_BAD, _A.RESET_OK | _A.CLEAR_MISSES),
            _T.PROBE_CLEAN: (_S.ASSUMED_BAD, _A.CONFIRM | _A.CLEAR_MISSES | _A.COUNT_OK),
            _T.PROBE_RESTORES: (_S.GOOD, _RESTORED),
            _T.SET_GOOD: (_S.GOOD, _TO_GOOD),
            _T.SET_DENIED: (_S.DENIED, _TO_DENIED),
        },
        _S.DENIED: {
            _T.SKIP: (_S.DENIED, _NONE),
            _T.SKIP_ELAPSED: (_S.DENIED, _NONE),
            _T.HOLD: (_S.DENIED, _NONE),
            _T.HOLD_AT_FLOOR: (_S.DENIED, _NONE),
            _T.RELEASE: (_S.DENIED, _NONE),
            _T.BLAME: (_S.DENIED, _NONE),  # only the controller lifts a denial
            _T.BLAME_AT_FLOOR: (_S.DENIED, _NONE),
            _T.PROBE_DIRTY: (_S.DENIED, _NONE),
            _T.PROBE_CLEAN: (_S.DENIED, _NONE),
            _T.PROBE_RESTORES: (_S.DENIED, _NONE),
            _T.SET_GOOD: (_S.GOOD, _TO_GOOD),
            _T.SET_DENIED: (_S.DENIED, _TO_DENIED),  # reported again
        },
    }
)
"""State → trigger → (next state, action): the whole EV state machine. Every pair is listed."""

EV_STATE_OF: Final[tuple[EVState, ...]] = (
    EVState.GOOD,
    EVState.SKIP,
    EVState.SKIP,
    EVState.ASSUMED_BAD,
    EVState.DENIED,
)
"""The `EVState` an EV in each `MachineState` holds (HELD is SKIP, told apart by its skip epoch)."""

STATE_BITS: Final = 3
"""A packed transition's low bits: the next `MachineState`."""


def _codes() -> tuple[int, ...]:
    if set(TRANSITIONS) != set(MachineState) or any(set(row) != set(Trigger) for row in TRANSITIONS.values()):
        raise AssertionError("TRANSITIONS must list every (state, trigger) pair")
    out = []
    for s in MachineState:
        for t in Trigger:
            to, action = TRANSITIONS[s][t]
            out.append(to | action << STATE_BITS)
    return tuple(out)


TRANSITION_CODES: Final[tuple[int, ...]] = _codes()
"""`TRANSITIONS` packed for the compiled EV table: index ``state * len(Trigger) + trigger``, value
``next_state | action << STATE_BITS``."""


def diagram() -> str:
    """The transitions that change something, one a line (the module docstring holds this list)."""
    lines = []
    for s in MachineState:
        for t in Trigger:
            to, action = TRANSITIONS[s][t]
            if to is s and not action:
                continue
            names = ", ".join((a.name or "").lower() for a in Action if a and a in action)
            lines.append(f"{s.name:<12} {t.name.lower():<16} -> {to.name:<12} {names}".rstrip())
    return "\n".join(lines)
