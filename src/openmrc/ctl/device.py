"""Device and port queries: the control API's versions, the device's controller limits, ports set
administratively up or down (mrc_ctl_query_version, _query_device(_ex), _query_port, _modify_port)."""

from __future__ import annotations

import errno
from typing import Any

from openmrc import verbs
from openmrc.ctl._state import _ctl, _priv, _unknown
from openmrc.ctl.records import (
    CTL_API_CURRENT_VERSION,
    CTL_API_LAST_SUPPORTED_VERSION,
    CTL_VENDOR_API_VERSION,
    EV_MAX_BYTES,
    MAX_CC_PROFILES,
    MAX_EV_PROFILES,
    MAX_EVS,
    MAX_EVS_PER_PROFILE,
    MAX_FMT_PROFILES,
    CtlAttrOpt,
    CtlDeviceAttr,
    CtlError,
    PortAdminState,
    PortAttr,
    PortAttrMask,
)
from openmrc.ev import EVFormatMode, EVProfileMode
from openmrc.transport import cc_algorithms


def query_version() -> verbs.ApiVersions:
    """mrc_ctl_query_version: the control API versions (independent of mrc.h's)."""
    return verbs.ApiVersions(
        CTL_API_CURRENT_VERSION,
        CTL_API_LAST_SUPPORTED_VERSION,
        CTL_VENDOR_API_VERSION,
        CTL_VENDOR_API_VERSION,
    )


_OPTS = CtlAttrOpt.EV_EVENT | CtlAttrOpt.EV_EVENT_PRECISE_DROP_CNT | CtlAttrOpt.EP_OP_EV_PROBE


def query_device(device: verbs.Device) -> CtlDeviceAttr:
    """mrc_ctl_query_device: the controller limits and capabilities (EV and CC profile counts, EV format
    and EV modes, CC algorithms including "uet-1.0-nscc", the ports, the optional features)."""
    device._check()
    nic = device.dev.nic
    used = sum(len(b.entries) for pid, b in nic.ev_profiles.items() if pid != 0)
    return CtlDeviceAttr(
        protocol_version=1,
        ev_max_fmt_profiles=MAX_FMT_PROFILES,
        ev_max_profiles=MAX_EV_PROFILES,
        ev_max_count=MAX_EVS,
        ev_free_count=max(0, MAX_EVS - used),
        ev_max_count_profile=MAX_EVS_PER_PROFILE,
        ev_count_align=1,
        ev_max_width=EV_MAX_BYTES * 8,
        ev_fmt_mode_mask=int(EVFormatMode.STEV | EVFormatMode.SRV6 | EVFormatMode.UDP),
        ev_mode_mask=int(EVProfileMode.AUTO | EVProfileMode.EXP | EVProfileMode.GEN),
        ev_op_max_entries=0,
        cc_max_profiles=MAX_CC_PROFILES,
        algorithms=tuple(cc_algorithms()),
        phy_port_mask=sum(1 << p for p in range(1, nic.num_ports + 1)),
        opt_attr=_OPTS,
    )


def query_device_ex(device: verbs.Device, ctx: verbs.Context) -> CtlDeviceAttr:
    """mrc_ctl_query_device_ex (control API 1.0.1)."""
    ctx._check()
    if ctx.device is not device:
        raise CtlError(errno.EINVAL, "the context belongs to another device")
    return query_device(device)


def _port(ctx: verbs.Context, port_num: Any) -> int:
    n = ctx.dev.nic.num_ports
    if isinstance(port_num, bool) or not isinstance(port_num, int) or not 1 <= port_num <= n:
        raise CtlError(errno.EINVAL, f"port_num: {port_num!r} outside 1..{n}")
    return port_num


def query_port(ctx: verbs.Context, port_num: int, attr_mask: int = PortAttrMask.ADMIN_STATE) -> PortAttr:
    """mrc_ctl_query_port: the port's administrative state."""
    _priv(ctx)
    _unknown(attr_mask, PortAttrMask, "query_port")
    p = _port(ctx, port_num)
    down = p in _ctl(ctx).admin_down
    return PortAttr(PortAdminState.DISABLED if down else PortAdminState.ENABLED)


def modify_port(
    ctx: verbs.Context, port_num: int, attr: PortAttr, attr_mask: int = PortAttrMask.ADMIN_STATE
) -> None:
    """mrc_ctl_modify_port: a DISABLED port is down for the NIC (applications see it down, its EVs stop
    being used, peers are told); ENABLED brings it back."""
    _priv(ctx)
    _unknown(attr_mask, PortAttrMask, "modify_port")
    p = _port(ctx, port_num)
    if not attr_mask & PortAttrMask.ADMIN_STATE:
        return
    state = attr.port_admin_state
    if state not in (PortAdminState.DISABLED, PortAdminState.ENABLED):
        raise CtlError(errno.EINVAL, f"port_admin_state: {state!r}")
    c = _ctl(ctx)
    dev = ctx.dev
    with dev.lock:
        if state is PortAdminState.DISABLED:
            c.admin_down.add(p)
            dev.nic.port_down(p, now=dev.now())
        else:
            c.admin_down.discard(p)
            dev.nic.port_up(p, now=dev.now())
