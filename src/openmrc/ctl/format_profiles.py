"""EV format profiles (mrc_ctl_modify_ev_fmt_profile, mrc_ctl_query_ev_fmt_profile): the mode (STEV, UDP,
SRv6) and field widths EV profiles build their EVs from, through the profile state machine of
`openmrc.ctl.machine`."""

from __future__ import annotations

import errno

from openmrc import verbs
from openmrc.ctl import machine
from openmrc.ctl._state import _commit, _ctl, _Fmt, _id, _priv, _slot, _unknown, _vendor
from openmrc.ctl.machine import ProfileOp
from openmrc.ctl.records import (
    MAX_FMT_PROFILES,
    CtlError,
    EvFmtOp,
    EvFmtProfileAttr,
    EvFmtProfileAttrMask,
    ProfileState,
)
from openmrc.ev import EVConfigError, EVFormatMode, EVFormatProfile

_M = EvFmtProfileAttrMask


def _ops(attr: EvFmtProfileAttr, mask: int) -> list[tuple[ProfileOp, str]]:
    """What a modify asks of the state machine besides a move. A format's vendor configuration may change
    while it is ONLINE (an EV or CC profile's may not)."""
    ops: list[tuple[ProfileOp, str]] = []
    if mask & _M.MODE:
        ops.append((ProfileOp.CONFIGURE, "MODE"))
    if mask & _M.OP and attr.op is EvFmtOp.MODIFY_FIELDS:
        ops.append((ProfileOp.CONFIGURE, "its fields (MODIFY_FIELDS)"))
    if mask & _M.OP and attr.op is EvFmtOp.QUERY_FIELDS:
        ops.append((ProfileOp.QUERY, "QUERY_FIELDS"))
    if mask & _M.VENDOR_CFG:
        ops.append((ProfileOp.ADJUST, "VENDOR_CFG"))
    return ops


def modify_ev_fmt_profile(
    ctx: verbs.Context, ev_fmt_profile_id: int, attr: EvFmtProfileAttr, attr_mask: int
) -> None:
    """mrc_ctl_modify_ev_fmt_profile. To OFFLINE: MODE; to ONLINE: the fields (OP with MODIFY_FIELDS, now
    or before). OFFLINE allows MODE and MODIFY_FIELDS; ONLINE a move back to OFFLINE (EBUSY while an
    ONLINE EV profile uses the format), VENDOR_CFG and the queries. E2BIG: fields wider than the mode
    carries."""
    _priv(ctx)
    pid = _id("ev_fmt_profile_id", ev_fmt_profile_id)
    _unknown(attr_mask, EvFmtProfileAttrMask, "modify_ev_fmt_profile")
    c = _ctl(ctx)
    prof = _slot(c.fmts, pid, _Fmt, MAX_FMT_PROFILES, "EV format profiles")
    cur = prof.state
    what = f"EV format profile {pid}"
    new = machine.target(attr_mask, attr.profile_state, cur, _M.STATE, _M.CUR_STATE, what)
    machine.allow(cur, _ops(attr, attr_mask), what)
    staged = _Fmt(prof.state, prof.mode, prof.widths, prof.vendor_cfg)
    if attr_mask & _M.MODE:
        try:
            staged.mode = EVFormatMode(attr.ev_fmt_mode)  # type: ignore[arg-type]
        except (ValueError, TypeError):
            raise CtlError(
                errno.EINVAL, f"ev_fmt_mode: {attr.ev_fmt_mode!r} is not an EV format mode"
            ) from None
    if attr_mask & _M.OP:
        if attr.op is EvFmtOp.MODIFY_FIELDS:
            staged.widths = tuple(attr.fmt_fields)
        elif attr.op is not EvFmtOp.QUERY_FIELDS:
            raise CtlError(errno.EINVAL, f"op: {attr.op!r} is not an EvFmtOp")
    if attr_mask & _M.VENDOR_CFG:
        staged.vendor_cfg = _vendor(attr.vendor_cfg)
    if staged.mode is not None and staged.widths:
        try:
            EVFormatProfile(staged.mode, staged.widths)
        except EVConfigError as exc:
            code = errno.E2BIG if "exceeds" in str(exc) else errno.EINVAL
            raise CtlError(code, f"{what}: {exc}") from None
    if new is ProfileState.OFFLINE and cur is ProfileState.INIT and staged.mode is None:
        raise CtlError(errno.EINVAL, f"{what}: INIT -> OFFLINE needs MODE")
    if new is ProfileState.ONLINE and cur is ProfileState.OFFLINE and not staged.widths:
        raise CtlError(errno.EINVAL, f"{what}: OFFLINE -> ONLINE needs the fields (MODIFY_FIELDS)")
    if cur is ProfileState.ONLINE and new is ProfileState.OFFLINE:
        users = [i for i, e in c.evs.items() if e.fmt_id == pid and e.state is ProfileState.ONLINE]
        if users:
            raise CtlError(errno.EBUSY, f"{what} is used by ONLINE EV profile(s) {users}")
    if attr_mask & _M.OP and attr.op is EvFmtOp.QUERY_FIELDS:
        _fill_fields(attr, list(staged.widths))
    _commit(c.fmts, pid, staged, new, _Fmt)


def _fill_fields(attr: EvFmtProfileAttr, widths: list[int]) -> None:
    if attr.fmt_field_count is not None and attr.fmt_field_count < len(widths):
        attr.fmt_field_count = len(widths)
        raise CtlError(errno.E2BIG, f"{len(widths)} format fields, room for fewer", needed=len(widths))
    attr.fmt_fields = widths
    attr.fmt_field_count = len(widths)


def query_ev_fmt_profile(
    ctx: verbs.Context, ev_fmt_profile_id: int, attr_mask: int, fmt_field_count: int | None = None
) -> EvFmtProfileAttr:
    """mrc_ctl_query_ev_fmt_profile: STATE, MODE and (OP) the fields; E2BIG with ``needed`` when
    ``fmt_field_count`` is too small. A profile never modified is INIT."""
    _priv(ctx)
    pid = _id("ev_fmt_profile_id", ev_fmt_profile_id)
    _unknown(attr_mask, EvFmtProfileAttrMask, "query_ev_fmt_profile")
    M = EvFmtProfileAttrMask
    prof = _ctl(ctx).fmts.get(pid, _Fmt())
    out = EvFmtProfileAttr(fmt_field_count=fmt_field_count)
    if attr_mask & (M.STATE | M.CUR_STATE):
        out.profile_state = out.cur_profile_state = prof.state
    if attr_mask & M.MODE:
        out.ev_fmt_mode = prof.mode
    if attr_mask & M.OP:
        out.op = EvFmtOp.QUERY_FIELDS
        _fill_fields(out, list(prof.widths))
    if attr_mask & M.VENDOR_CFG:
        out.vendor_cfg = prof.vendor_cfg
    return out
