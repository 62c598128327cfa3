"""EV operations on a profile's EVs (mrc_ctl_ev_op): replacing an explicit profile's EVs while it is not
ONLINE, setting EV states on line (a DENIED EV is seen at once by the QPs bound to the profile, and by QPs
that bind it later), and reading EV states and the EV array."""

from __future__ import annotations

import errno
from typing import Any

from openmrc import verbs
from openmrc.ctl._state import _EvProf, _Fmt
from openmrc.ctl.records import (
    EV_MAX_BYTES,
    EV_UNPOPULATED,
    CtlError,
    Ev,
    EvOp,
    EvOpEntry,
    EvOpFlags,
    EvProfileAttr,
)
from openmrc.ev import EVFormatMode, EVProfileMode, EVState, controller_state, ev_echo32


def _ev_check(ev: Any, what: str, num_ports: int, allow_unpopulated: bool = False) -> Ev:
    if not isinstance(ev, Ev) or not isinstance(ev.val, bytes | bytearray) or len(ev.val) != EV_MAX_BYTES:
        raise CtlError(errno.EINVAL, f"{what}: an Ev of {EV_MAX_BYTES} bytes and a port")
    if ev == EV_UNPOPULATED and allow_unpopulated:
        return ev
    if isinstance(ev.port, bool) or not isinstance(ev.port, int) or not 1 <= ev.port <= num_ports:
        raise CtlError(errno.EINVAL, f"{what}: port {ev.port!r} outside 1..{num_ports}")
    return Ev(bytes(ev.val), ev.port)


def _fits(ev: Ev, fmt: _Fmt) -> bool:
    """Whether the expanded EV uses no bits past the format's total width (from the first byte on)."""
    width = sum(fmt.widths)
    value = int.from_bytes(ev.val, "big")
    return value >> (EV_MAX_BYTES * 8 - width) << (EV_MAX_BYTES * 8 - width) == value


def _ev_op(
    ctx: verbs.Context,
    pid: int,
    s: _EvProf,
    attr: EvProfileAttr,
    online: bool,
    fmt: _Fmt | None,
) -> None:
    op = attr.ev_op
    nports = ctx.dev.nic.num_ports
    if op is EvOp.QUERY_EV_ARRAY:
        _fill_array(attr, s)
        return
    if op is EvOp.REPLACE_EV:  # (the state machine refused it ONLINE)
        if s.mode is not EVProfileMode.EXP:
            raise CtlError(errno.EINVAL, f"EV profile {pid}: REPLACE_EV is for EXP profiles")
        for i, ent in enumerate(attr.entries):
            old = _ev_check(ent.ev, f"entries[{i}].ev", nports, allow_unpopulated=True)
            new = _ev_check(ent.ev_new, f"entries[{i}].ev_new", nports)
            if fmt is not None and not _fits(new, fmt):
                raise CtlError(
                    errno.EINVAL, f"entries[{i}].ev_new: wider than the format's {sum(fmt.widths)} bits"
                )
            hits = [k for k, e in enumerate(s.evs) if e == old]
            if not hits:
                raise CtlError(errno.ENOENT, f"entries[{i}].ev: not in EV profile {pid}")
            for k in hits if ent.flags & EvOpFlags.ALL_COPIES else hits[:1]:
                s.evs[k] = new
        return
    if op not in (EvOp.MODIFY_EV_STATE, EvOp.QUERY_EV_STATE):
        raise CtlError(errno.EINVAL, f"ev_op: {op!r} is not an EvOp")
    mode = _mode_of(ctx, s, fmt)
    dev = ctx.dev
    for i, ent in enumerate(attr.entries):
        ev = _ev_check(ent.ev, f"entries[{i}].ev", nports)
        if ev not in s.evs:
            raise CtlError(errno.ENOENT, f"entries[{i}].ev: not in EV profile {pid}")
        echo = ev_echo32(ev.val, mode)
        if op is EvOp.QUERY_EV_STATE:
            ent.state = _ev_state(ctx, pid, echo)
            continue
        state = ent.state
        if state not in (EVState.GOOD, EVState.ASSUMED_BAD, EVState.DENIED):
            raise CtlError(errno.EINVAL, f"entries[{i}].state: {state!r}; GOOD, ASSUMED_BAD or DENIED")
        with dev.lock:
            states = dev.nic.profiles.ev_states.setdefault(pid, {})
            if state is EVState.GOOD:
                states.pop(echo, None)
            elif state is EVState.DENIED:
                states[echo] = state
            if online:
                for qp in dev.nic.qps.values():
                    if (
                        qp.evs is not None
                        and (qp.attr.ev_profile_id or 0) == pid
                        and qp.evs.find(echo) is not None
                    ):
                        dev.nic.modify_ev_state(qp, echo, state, now=dev.now())


def _mode_of(ctx: verbs.Context, s: _EvProf, fmt: _Fmt | None) -> EVFormatMode:
    if fmt is not None and fmt.mode is not None:
        return fmt.mode
    return EVFormatMode.UDP  # AUTO: the NIC's own source-port EVs


def _ev_state(ctx: verbs.Context, pid: int, echo: int) -> EVState:
    """The controller's view of one EV of a profile: DENIED if the controller denied it, ASSUMED_BAD if a
    QP bound to the profile holds it so, else GOOD (UNKNOWN when no QP has it and nothing was set)."""
    nic = ctx.dev.nic
    if nic.profiles.ev_states.get(pid, {}).get(echo) is EVState.DENIED:
        return EVState.DENIED
    seen = False
    for qp in nic.qps.values():
        if qp.evs is not None and (qp.attr.ev_profile_id or 0) == pid:
            e = qp.evs.find(echo)
            if e is not None:
                seen = True
                st = controller_state(e.state)
                if st is not EVState.GOOD:
                    return st
    return EVState.GOOD if seen or pid in nic.ev_profiles else EVState.UNKNOWN


def _fill_array(attr: EvProfileAttr, s: _EvProf) -> None:
    n = len(s.evs)
    if attr.entry_count is not None and attr.entry_count < n:
        attr.entry_count = n
        raise CtlError(
            errno.E2BIG, f"the EV array has {n} entries, room for {len(attr.entries) or 'fewer'}", needed=n
        )
    attr.entries = [EvOpEntry(ev) for ev in s.evs]
    attr.entry_count = n
