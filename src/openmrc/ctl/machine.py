"""The profile state machine of mrc_ctl.h as one table, shared by EV format, EV and CC profiles.

Every profile starts in INIT and moves one step at a time: INIT -> OFFLINE -> ONLINE -> OFFLINE -> INIT
(back in INIT it is unconfigured again). A modify call is a set of operations (`ProfileOp`) applied to the
profile's current state: a move to a state, a change of what the profile is (CONFIGURE: its mode, format,
count, algorithm, fields, EV array...), a change that may happen on line too (ADJUST: EV states; the vendor
configuration of a format profile), a query. `TABLE` says, for each (state, operation), the state the
profile is in afterwards, or the refusal (errno and reason) the call raises. What a kind needs before a move
(the mode before OFFLINE, the fields before ONLINE, no QP bound before leaving ONLINE) is the kind's own
check, made after the table allowed the move.
"""

from __future__ import annotations

import errno
from enum import Enum
from typing import Final, NamedTuple

from openmrc.ctl.records import CtlError, ProfileState

__all__ = ["TABLE", "ProfileOp", "Refusal", "allow", "move", "target"]


class ProfileOp(Enum):
    """What a call does to a profile, as the state machine sees it."""

    TO_INIT = "move to INIT"
    TO_OFFLINE = "move to OFFLINE"
    TO_ONLINE = "move to ONLINE"
    CONFIGURE = "change what the profile is"
    ADJUST = "change what may change on line"
    QUERY = "read"


class Refusal(NamedTuple):
    """A refused operation: the errno and the reason, with ``{what}`` (the profile), ``{cur}`` / ``{new}``
    (state names) and ``{names}`` (the attributes or operations asked for) filled in."""

    errno: int
    reason: str


S = ProfileState
_NO_STEP: Final = Refusal(errno.EINVAL, "{what}: {cur} -> {new} is not a profile transition")
_ONLINE: Final = Refusal(errno.EINVAL, "{what} is ONLINE: {names} cannot change (take it OFFLINE first)")

TABLE: Final[dict[tuple[ProfileState, ProfileOp], ProfileState | Refusal]] = {
    (S.INIT, ProfileOp.TO_INIT): S.INIT,
    (S.INIT, ProfileOp.TO_OFFLINE): S.OFFLINE,
    (S.INIT, ProfileOp.TO_ONLINE): _NO_STEP,
    (S.INIT, ProfileOp.CONFIGURE): S.INIT,
    (S.INIT, ProfileOp.ADJUST): S.INIT,
    (S.INIT, ProfileOp.QUERY): S.INIT,
    (S.OFFLINE, ProfileOp.TO_INIT): S.INIT,
    (S.OFFLINE, ProfileOp.TO_OFFLINE): S.OFFLINE,
    (S.OFFLINE, ProfileOp.TO_ONLINE): S.ONLINE,
    (S.OFFLINE, ProfileOp.CONFIGURE): S.OFFLINE,
    (S.OFFLINE, ProfileOp.ADJUST): S.OFFLINE,
    (S.OFFLINE, ProfileOp.QUERY): S.OFFLINE,
    (S.ONLINE, ProfileOp.TO_INIT): _NO_STEP,
    (S.ONLINE, ProfileOp.TO_OFFLINE): S.OFFLINE,
    (S.ONLINE, ProfileOp.TO_ONLINE): S.ONLINE,
    (S.ONLINE, ProfileOp.CONFIGURE): _ONLINE,
    (S.ONLINE, ProfileOp.ADJUST): S.ONLINE,
    (S.ONLINE, ProfileOp.QUERY): S.ONLINE,
}
"""(state, operation) -> the state after it, or the refusal."""

_TO: Final = {S.INIT: ProfileOp.TO_INIT, S.OFFLINE: ProfileOp.TO_OFFLINE, S.ONLINE: ProfileOp.TO_ONLINE}


def _refuse(r: Refusal, what: str, cur: ProfileState, new: ProfileState | None, names: str) -> CtlError:
    to = new.name if new is not None else ""
    return CtlError(r.errno, r.reason.format(what=what, cur=cur.name, new=to, names=names))


def move(cur: ProfileState, new: ProfileState, what: str) -> ProfileState:
    """The state after asking ``cur`` to move to ``new``, or the table's refusal raised."""
    after = TABLE[cur, _TO[new]]
    if isinstance(after, Refusal):
        raise _refuse(after, what, cur, new, "")
    return after


def allow(cur: ProfileState, ops: list[tuple[ProfileOp, str]], what: str) -> None:
    """Raise the table's refusal of the first operation in ``ops`` ((operation, the attribute or operation
    of the call that asks for it), in the call's order) that ``cur`` does not allow, naming every part of
    the call that asks for that operation."""
    for op, _ in ops:
        after = TABLE[cur, op]
        if isinstance(after, Refusal):
            raise _refuse(after, what, cur, None, ", ".join(n for o, n in ops if o is op))


def target(
    mask: int, attr_state: object, cur: ProfileState, state_bit: int, cur_bit: int, what: str
) -> ProfileState:
    """The state a modify whose ``attr_mask`` is ``mask`` leaves the profile in: ``cur`` without
    ``state_bit``, else `move` to ``attr_state``. CUR_STATE (``cur_bit``) is for queries."""
    if mask & cur_bit:
        raise CtlError(errno.EINVAL, f"{what}: CUR_STATE is for queries; modify asserts nothing")
    if not mask & state_bit:
        return cur
    if not isinstance(attr_state, ProfileState):
        raise CtlError(errno.EINVAL, f"{what}: profile_state {attr_state!r} is not a ProfileState")
    return move(cur, attr_state, what)
