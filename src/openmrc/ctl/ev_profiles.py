"""EV profiles (mrc_ctl_modify_ev_profile, mrc_ctl_query_ev_profile): AUTO, explicit (EXP) and generated
(GEN) sets of EVs that QPs bind by id, through the profile state machine of `openmrc.ctl.machine`; going
ONLINE installs the profile in the NIC (`openmrc.transport.profiles`), going OFFLINE removes it."""

from __future__ import annotations

import errno

from openmrc import verbs
from openmrc.ctl import machine
from openmrc.ctl._state import _busy, _commit, _ctl, _EvProf, _Fmt, _id, _priv, _slot, _unknown, _vendor
from openmrc.ctl.ev_ops import _ev_op
from openmrc.ctl.machine import ProfileOp
from openmrc.ctl.records import (
    EV_UNPOPULATED,
    MAX_EV_PROFILES,
    MAX_EVS_PER_PROFILE,
    CtlError,
    Ev,
    EvFieldsOp,
    EvOp,
    EvProfileAttr,
    EvProfileAttrMask,
    ProfileState,
)
from openmrc.ctl.store import _publish
from openmrc.ev import EVENT_MASK_ALLOWED, EVConfigError, EVField, EVFormatProfile, EVProfile, EVProfileMode
from openmrc.transport import LocalProtocolError

_M = EvProfileAttrMask
_SETTABLE = (_M.MODE, _M.FMT_ID, _M.COUNT, _M.MIN_ACTIVE, _M.EVENT_MASK, _M.VENDOR_CFG)
_EV_OPS = {
    EvOp.REPLACE_EV: ProfileOp.CONFIGURE,
    EvOp.MODIFY_EV_STATE: ProfileOp.ADJUST,
    EvOp.QUERY_EV_STATE: ProfileOp.QUERY,
    EvOp.QUERY_EV_ARRAY: ProfileOp.QUERY,
}


def _ops(attr: EvProfileAttr, mask: int) -> list[tuple[ProfileOp, str]]:
    """What a modify asks of the state machine besides a move."""
    ops = [(ProfileOp.CONFIGURE, b.name or "?") for b in _SETTABLE if mask & b]
    if mask & _M.EV_FIELDS_OP and attr.ev_fields_op is EvFieldsOp.MODIFY_FIELDS:
        ops.append((ProfileOp.CONFIGURE, "its fields (MODIFY_FIELDS)"))
    if mask & _M.EV_FIELDS_OP and attr.ev_fields_op is EvFieldsOp.QUERY_FIELDS:
        ops.append((ProfileOp.QUERY, "QUERY_FIELDS"))
    if mask & _M.EV_OP and isinstance(attr.ev_op, EvOp):
        name = "its EVs (REPLACE_EV)" if attr.ev_op is EvOp.REPLACE_EV else attr.ev_op.name
        ops.append((_EV_OPS[attr.ev_op], name))
    return ops


def modify_ev_profile(ctx: verbs.Context, ev_profile_id: int, attr: EvProfileAttr, attr_mask: int) -> None:
    """mrc_ctl_modify_ev_profile. To OFFLINE: MODE, and for EXP and GEN profiles FMT_ID (an ONLINE format
    profile) and COUNT, and for GEN the fields (EV_FIELDS_OP MODIFY_FIELDS); an EXP array starts
    unpopulated. To ONLINE: MIN_ACTIVE and EVENT_MASK (now or before) and, for EXP, every EV replaced
    (REPLACE_EV). OFFLINE allows every attribute and operation; ONLINE allows STATE (back to OFFLINE:
    EBUSY while QPs use the profile), MODIFY_EV_STATE and the queries. EV_OP and EV_FIELDS_OP together are
    EINVAL; EV operations stop at the first failing entry (the ones before it are done)."""
    try:
        _modify_ev_profile(ctx, ev_profile_id, attr, attr_mask)
    finally:
        _publish(ctx)


def _modify_ev_profile(ctx: verbs.Context, ev_profile_id: int, attr: EvProfileAttr, attr_mask: int) -> None:
    _priv(ctx)
    pid = _id("ev_profile_id", ev_profile_id)
    _unknown(attr_mask, EvProfileAttrMask, "modify_ev_profile")
    M = EvProfileAttrMask
    if attr_mask & M.EV_OP and attr_mask & M.EV_FIELDS_OP:
        raise CtlError(errno.EINVAL, "EV_OP and EV_FIELDS_OP are mutually exclusive")
    c = _ctl(ctx)
    prof = _slot(c.evs, pid, _EvProf, MAX_EV_PROFILES, "EV profiles")
    cur = prof.state
    what = f"EV profile {pid}"
    new = machine.target(attr_mask, attr.profile_state, cur, M.STATE, M.CUR_STATE, what)
    machine.allow(cur, _ops(attr, attr_mask), what)
    online = cur is ProfileState.ONLINE
    s = _EvProf(
        prof.state,
        prof.mode,
        prof.fmt_id,
        prof.count,
        prof.min_active,
        prof.event_mask,
        prof.fields,
        list(prof.evs),
        prof.vendor_cfg,
    )
    if attr_mask & M.MODE:
        try:
            s.mode = EVProfileMode(attr.ev_mode)  # type: ignore[arg-type]
        except (ValueError, TypeError):
            raise CtlError(errno.EINVAL, f"ev_mode: {attr.ev_mode!r} is not an EV mode") from None
    if attr_mask & M.FMT_ID:
        s.fmt_id = _id("ev_fmt_profile_id", attr.ev_fmt_profile_id)
    if attr_mask & M.COUNT:
        n = attr.ev_count
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_EVS_PER_PROFILE:
            raise CtlError(
                errno.E2BIG if isinstance(n, int) and n > 0 else errno.EINVAL,
                f"ev_count: {n!r} outside 1..{MAX_EVS_PER_PROFILE}",
            )
        if n != s.count:
            s.count = n
            if s.mode is EVProfileMode.EXP or (s.mode is None and prof.mode is EVProfileMode.EXP):
                s.evs = [EV_UNPOPULATED] * n
    if attr_mask & M.MIN_ACTIVE:
        s.min_active = attr.ev_min_active
    if attr_mask & M.EVENT_MASK:
        m = attr.ev_event_mask
        if isinstance(m, bool) or not isinstance(m, int) or m & ~int(EVENT_MASK_ALLOWED):
            raise CtlError(errno.EINVAL, f"ev_event_mask: {m!r}; only GOOD and ASSUMED_BAD can be watched")
        s.event_mask = m
    if attr_mask & M.VENDOR_CFG:
        s.vendor_cfg = _vendor(attr.vendor_cfg)
    if s.min_active is not None and (
        isinstance(s.min_active, bool)
        or not isinstance(s.min_active, int)
        or s.min_active < 0
        or (s.count is not None and s.min_active > s.count)
    ):
        raise CtlError(errno.EINVAL, f"ev_min_active: {s.min_active!r} outside 0..ev_count ({s.count})")
    if s.mode is EVProfileMode.EXP and (cur is ProfileState.INIT or len(s.evs) != (s.count or 0)):
        s.evs = [EV_UNPOPULATED] * (s.count or 0) if len(s.evs) != (s.count or 0) else s.evs
    fmt = c.fmts.get(s.fmt_id) if s.fmt_id is not None else None
    # the field operations
    if attr_mask & M.EV_FIELDS_OP:
        if attr.ev_fields_op is EvFieldsOp.MODIFY_FIELDS:
            if fmt is not None and len(attr.fields) > len(fmt.widths):
                raise CtlError(errno.E2BIG, f"{len(attr.fields)} fields, the format has {len(fmt.widths)}")
            s.fields = tuple(attr.fields)
        elif attr.ev_fields_op is EvFieldsOp.QUERY_FIELDS:
            _fill_ev_fields(attr, list(s.fields or ()))
        else:
            raise CtlError(errno.EINVAL, f"ev_fields_op: {attr.ev_fields_op!r}")
    # the transition's requirements
    if new is ProfileState.OFFLINE and cur is ProfileState.INIT:
        if s.mode is None:
            raise CtlError(errno.EINVAL, f"{what}: INIT -> OFFLINE needs MODE")
        if s.mode is not EVProfileMode.AUTO:
            missing = [n for n, v in (("FMT_ID", s.fmt_id), ("COUNT", s.count)) if v is None]
            if s.mode is EVProfileMode.GEN and s.fields is None:
                missing.append("EV_FIELDS_OP MODIFY_FIELDS")
            if missing:
                raise CtlError(errno.EINVAL, f"{what}: INIT -> OFFLINE needs {', '.join(missing)}")
            if fmt is None or fmt.state is not ProfileState.ONLINE:
                raise CtlError(errno.EINVAL, f"{what}: EV format profile {s.fmt_id} is not ONLINE")
    if new is ProfileState.ONLINE and cur is ProfileState.OFFLINE:
        missing = [n for n, v in (("MIN_ACTIVE", s.min_active), ("EVENT_MASK", s.event_mask)) if v is None]
        if missing:
            raise CtlError(errno.EINVAL, f"{what}: OFFLINE -> ONLINE needs {', '.join(missing)}")
        if s.mode is EVProfileMode.EXP:
            holes = sum(1 for e in s.evs if e == EV_UNPOPULATED)
            if holes:
                raise CtlError(
                    errno.EINVAL, f"{what}: {holes} of {len(s.evs)} EVs unpopulated (REPLACE_EV them)"
                )
    if cur is ProfileState.ONLINE and new is ProfileState.OFFLINE:
        _busy(ctx, pid, "ev", what)
    # the EV operations (after the checks above: a refused modify changes nothing, except per-entry ops)
    if attr_mask & M.EV_OP:
        _ev_op(ctx, pid, s, attr, online, fmt)
    # commit
    dev = ctx.dev
    with dev.lock:
        nic = dev.nic
        if new is ProfileState.ONLINE and cur is ProfileState.OFFLINE:
            _install(ctx, pid, s, fmt)
        elif cur is ProfileState.ONLINE and new is ProfileState.OFFLINE:
            nic.profiles.remove_ev_profile(pid)
    _commit(c.evs, pid, s, new, _EvProf)


def _install(ctx: verbs.Context, pid: int, s: _EvProf, fmt: _Fmt | None) -> None:
    nic = ctx.dev.nic
    assert s.min_active is not None and s.event_mask is not None
    try:
        if s.mode is EVProfileMode.AUTO:
            b = nic.profiles.add_auto_profile(pid, s.min_active, s.event_mask)
            s.evs = [Ev(ev, port) for ev, port, _ in b.entries]
            s.count = len(b.entries)
        elif s.mode is EVProfileMode.EXP:
            assert fmt is not None and fmt.mode is not None
            nic.profiles.add_expanded_profile(
                pid, fmt.mode, [(e.val, e.port) for e in s.evs], s.min_active, s.event_mask
            )
        else:
            assert fmt is not None and fmt.mode is not None and s.count is not None
            prof = EVProfile(
                EVProfileMode.GEN,
                EVFormatProfile(fmt.mode, fmt.widths),
                fields=s.fields or (),
                ev_count=s.count,
                ev_min_active=s.min_active,
                event_mask=s.event_mask,
            )
            b = nic.add_ev_profile(pid, prof)
            s.evs = [Ev(ev, port) for ev, port, _ in b.entries]
    except (EVConfigError, LocalProtocolError) as exc:
        raise CtlError(getattr(exc, "errno", errno.EINVAL), f"EV profile {pid}: {exc}") from None


def _fill_ev_fields(attr: EvProfileAttr, fields: list[EVField]) -> None:
    if attr.field_count is not None and attr.field_count < len(fields):
        attr.field_count = len(fields)
        raise CtlError(errno.E2BIG, f"{len(fields)} EV fields, room for fewer", needed=len(fields))
    attr.fields = fields
    attr.field_count = len(fields)


def query_ev_profile(
    ctx: verbs.Context, ev_profile_id: int, attr: EvProfileAttr, attr_mask: int
) -> EvProfileAttr:
    """mrc_ctl_query_ev_profile: fills ``attr`` with what ``attr_mask`` names (and returns it). EV_OP:
    QUERY_EV_STATE fills each entry's state, QUERY_EV_ARRAY the array (E2BIG with ``needed`` when
    ``attr.entry_count`` is too small); EV_FIELDS_OP QUERY_FIELDS the fields."""
    _priv(ctx)
    pid = _id("ev_profile_id", ev_profile_id)
    _unknown(attr_mask, EvProfileAttrMask, "query_ev_profile")
    M = EvProfileAttrMask
    if attr_mask & M.EV_OP and attr_mask & M.EV_FIELDS_OP:
        raise CtlError(errno.EINVAL, "EV_OP and EV_FIELDS_OP are mutually exclusive")
    c = _ctl(ctx)
    s = c.evs.get(pid, _EvProf())
    if attr_mask & (M.STATE | M.CUR_STATE):
        attr.profile_state = attr.cur_profile_state = s.state
    for bit, name, value in (
        (M.MODE, "ev_mode", s.mode),
        (M.FMT_ID, "ev_fmt_profile_id", s.fmt_id),
        (M.COUNT, "ev_count", s.count),
        (M.MIN_ACTIVE, "ev_min_active", s.min_active),
        (M.EVENT_MASK, "ev_event_mask", s.event_mask),
        (M.VENDOR_CFG, "vendor_cfg", s.vendor_cfg),
    ):
        if attr_mask & bit:
            setattr(attr, name, value)
    if attr_mask & M.EV_OP:
        if attr.ev_op not in (EvOp.QUERY_EV_STATE, EvOp.QUERY_EV_ARRAY):
            raise CtlError(
                errno.EINVAL, f"ev_op: {attr.ev_op!r}; a query takes QUERY_EV_STATE or QUERY_EV_ARRAY"
            )
        fmt = c.fmts.get(s.fmt_id) if s.fmt_id is not None else None
        _ev_op(ctx, pid, s, attr, s.state is ProfileState.ONLINE, fmt)
    if attr_mask & M.EV_FIELDS_OP:
        if attr.ev_fields_op is not EvFieldsOp.QUERY_FIELDS:
            raise CtlError(errno.EINVAL, "ev_fields_op: a query takes QUERY_FIELDS")
        _fill_ev_fields(attr, list(s.fields or ()))
    return attr
