"""CC profiles (mrc_ctl_modify_cc_profile, mrc_ctl_query_cc_profile): a congestion control algorithm and
its configuration that QPs bind by id, through the profile state machine of `openmrc.ctl.machine`; going
ONLINE installs it in the NIC, going OFFLINE removes it."""

from __future__ import annotations

import errno

from openmrc import verbs
from openmrc.ctl import machine
from openmrc.ctl._state import _busy, _Cc, _commit, _ctl, _id, _priv, _slot, _unknown, _vendor
from openmrc.ctl.machine import ProfileOp
from openmrc.ctl.records import MAX_CC_PROFILES, CcProfileAttr, CcProfileAttrMask, CtlError, ProfileState
from openmrc.ctl.store import _publish
from openmrc.transport import LocalProtocolError, cc_algorithms

_SETTABLE = (CcProfileAttrMask.ALGORITHM, CcProfileAttrMask.CONFIG, CcProfileAttrMask.VENDOR_CFG)


def modify_cc_profile(ctx: verbs.Context, cc_profile_id: int, attr: CcProfileAttr, attr_mask: int) -> None:
    """mrc_ctl_modify_cc_profile. To OFFLINE: ALGORITHM (one of `query_device`'s ``algorithms``); to
    ONLINE: CONFIG (now or before; None: the algorithm's defaults for this NIC). ONLINE allows only the
    move back to OFFLINE (EBUSY while QPs use it)."""
    try:
        _modify_cc_profile(ctx, cc_profile_id, attr, attr_mask)
    finally:
        _publish(ctx)


def _modify_cc_profile(ctx: verbs.Context, cc_profile_id: int, attr: CcProfileAttr, attr_mask: int) -> None:
    _priv(ctx)
    pid = _id("cc_profile_id", cc_profile_id)
    _unknown(attr_mask, CcProfileAttrMask, "modify_cc_profile")
    M = CcProfileAttrMask
    c = _ctl(ctx)
    prof = _slot(c.ccs, pid, _Cc, MAX_CC_PROFILES, "CC profiles")
    cur = prof.state
    what = f"CC profile {pid}"
    new = machine.target(attr_mask, attr.profile_state, cur, M.STATE, M.CUR_STATE, what)
    machine.allow(cur, [(ProfileOp.CONFIGURE, b.name or "?") for b in _SETTABLE if attr_mask & b], what)
    s = _Cc(prof.state, prof.algorithm, prof.config, prof.config_set, prof.vendor_cfg)
    if attr_mask & M.ALGORITHM:
        if attr.algorithm not in cc_algorithms():
            raise CtlError(
                errno.EINVAL, f"algorithm: {attr.algorithm!r}; this device has {', '.join(cc_algorithms())}"
            )
        if attr.algorithm != s.algorithm:
            s.config, s.config_set = None, False
        s.algorithm = attr.algorithm
    if attr_mask & M.CONFIG:
        s.config, s.config_set = attr.cc_config, True
    if attr_mask & M.VENDOR_CFG:
        s.vendor_cfg = _vendor(attr.vendor_cfg)
    if new is ProfileState.OFFLINE and cur is ProfileState.INIT and s.algorithm is None:
        raise CtlError(errno.EINVAL, f"{what}: INIT -> OFFLINE needs ALGORITHM")
    dev = ctx.dev
    if new is ProfileState.ONLINE and cur is ProfileState.OFFLINE:
        if not s.config_set:
            raise CtlError(errno.EINVAL, f"{what}: OFFLINE -> ONLINE needs CONFIG")
        assert s.algorithm is not None
        with dev.lock:
            try:
                dev.nic.add_cc_profile(pid, s.algorithm, s.config)
            except LocalProtocolError as exc:
                raise CtlError(exc.errno, exc.reason) from None
    elif cur is ProfileState.ONLINE and new is ProfileState.OFFLINE:
        _busy(ctx, pid, "cc", what)
        with dev.lock:
            dev.nic.profiles.remove_cc_profile(pid)
    _commit(c.ccs, pid, s, new, _Cc)


def query_cc_profile(ctx: verbs.Context, cc_profile_id: int, attr_mask: int) -> CcProfileAttr:
    """mrc_ctl_query_cc_profile."""
    _priv(ctx)
    pid = _id("cc_profile_id", cc_profile_id)
    _unknown(attr_mask, CcProfileAttrMask, "query_cc_profile")
    M = CcProfileAttrMask
    s = _ctl(ctx).ccs.get(pid, _Cc())
    out = CcProfileAttr()
    if attr_mask & (M.STATE | M.CUR_STATE):
        out.profile_state = out.cur_profile_state = s.state
    if attr_mask & M.ALGORITHM:
        out.algorithm = s.algorithm
    if attr_mask & M.CONFIG:
        out.cc_config = s.config
    if attr_mask & M.VENDOR_CFG:
        out.vendor_cfg = s.vendor_cfg
    return out
