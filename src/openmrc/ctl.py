"""The controller API of an MRC device, mirroring OCP MRC 1.0 ``mrc_ctl.h``: what a node's controller
programs and a NIC's applications bind to by id.

A controller opens the device and creates an MRC context with `openmrc.verbs`, then, through this module,
queries the device's controller limits (`query_device`), sets ports administratively up or down
(`modify_port`), builds EV format profiles, EV profiles and CC profiles, each through the state machine
INIT -> OFFLINE -> ONLINE -> OFFLINE -> INIT (`modify_ev_fmt_profile`, `modify_ev_profile`,
`modify_cc_profile`, and their queries), changes EV states on line (DENIED, GOOD, ASSUMED_BAD), reads EV
state-change events from an EV event queue (`create_ev_event_cq`, `poll_ev_event`), and sends batches of
endpoint requests (EV probes, port status updates) with `ep_batch_send_wait`. QPs bind ONLINE profiles by
id in INIT (`verbs.modify_qp`).

Conventions as in `openmrc.verbs`: C names without ``mrc_ctl_``, outputs returned, failures raised as
`CtlError` (a `openmrc.verbs.VerbsError`: ``errno_name``, ``reason``). Controller calls are privileged, as
CAP_NET_ADMIN guards them on a real node: they need root, or `grant` for a software device this process
owns (the explicit override); otherwise EPERM says which. The profiles live in the device (the NIC's
`openmrc.transport.profiles.ProfileTable` once ONLINE), so a controller and the applications of one
process share them. The table in ``docs/ctl.md`` maps every mrc_ctl.h function and notes the choices
openmrc made where the header leaves room.
"""

from __future__ import annotations

import contextlib
import errno
import os
import time
from collections import deque
from dataclasses import dataclass, field
from enum import IntEnum, IntFlag
from typing import Any, NamedTuple

from openmrc import verbs
from openmrc.ev import (
    EVENT_MASK_ALLOWED,
    EVConfigError,
    EVField,
    EVFormatMode,
    EVFormatProfile,
    EVProfile,
    EVProfileMode,
    EVState,
    controller_state,
    ev_echo32,
)
from openmrc.provider.profile_store import ProfileStore
from openmrc.transport import EvEvent, LocalProtocolError, QpState, SecurityDomain, cc_algorithms
from openmrc.wire import RESERVED_QP_ENDPOINT, EpOp

__all__ = [
    "CTL_API_CURRENT_VERSION",
    "CTL_API_LAST_SUPPORTED_VERSION",
    "EV_UNPOPULATED",
    "CcProfileAttr",
    "CcProfileAttrMask",
    "CtlAttrOpt",
    "CtlDeviceAttr",
    "CtlError",
    "EVState",
    "EpOpType",
    "EpReq",
    "EpRsp",
    "Ev",
    "EvEventCq",
    "EvFieldsOp",
    "EvFmtOp",
    "EvFmtProfileAttr",
    "EvFmtProfileAttrMask",
    "EvOp",
    "EvOpEntry",
    "EvOpFlags",
    "EvProfileAttr",
    "EvProfileAttrMask",
    "PortAdminState",
    "PortAttr",
    "PortAttrMask",
    "ProfileState",
    "SecurityDomainAttr",
    "attach_store",
    "create_ev_event_cq",
    "create_security_domain",
    "destroy_security_domain",
    "ep_batch_send_wait",
    "grant",
    "modify_cc_profile",
    "modify_ev_fmt_profile",
    "modify_ev_profile",
    "modify_port",
    "poll_ev_event",
    "query_cc_profile",
    "query_device",
    "query_device_ex",
    "query_ev_fmt_profile",
    "query_ev_profile",
    "query_port",
    "query_security_domain",
    "query_version",
    "revoke_security_domain",
    "rotate_security_domain",
    "secure_endpoint",
]

CTL_API_CURRENT_VERSION = verbs.api_ver(1, 0, 1)
CTL_API_LAST_SUPPORTED_VERSION = verbs.api_ver(1, 0, 0)
CTL_VENDOR_API_VERSION = verbs.api_ver(1, 0, 0)
MAX_VENDOR_CFG_SIZE = 128
EV_MAX_BYTES = 32
MAX_FMT_PROFILES = 64
MAX_EV_PROFILES = 1024
MAX_CC_PROFILES = 64
MAX_EVS_PER_PROFILE = 1 << 16
MAX_EVS = 1 << 20


class CtlError(verbs.VerbsError):
    """A controller call failed (``errno_name``, ``reason``); ``needed`` is the array length an E2BIG asks
    for, ``responses`` the answers that came before an ETIMEDOUT."""

    def __init__(
        self, err: int, reason: str, *, needed: int | None = None, responses: list[EpRsp] | None = None
    ):
        super().__init__(err, reason)
        self.needed = needed
        self.responses = responses or []


# -- enums and records ---------------------------------------------------------------------------------------
class ProfileState(IntEnum):
    """mrc_ctl_profile_state."""

    INIT = 0
    OFFLINE = 1
    ONLINE = 2


class CtlAttrOpt(IntFlag):
    """mrc_ctl_attr_opt: optional controller features."""

    NONE = 0
    EV_PROFILE_MODIFY_ONLINE = 1 << 0
    CC_PROFILE_MODIFY_ONLINE = 1 << 1
    EV_EVENT = 1 << 2
    EV_EXPLICIT_RANGE = 1 << 3
    EV_EVENT_PRECISE_DROP_CNT = 1 << 4
    EP_OP_EV_PROBE = 1 << 5


class PortAdminState(IntEnum):
    DISABLED = 0
    ENABLED = 1


class PortAttrMask(IntFlag):
    NONE = 0
    ADMIN_STATE = 1 << 0


class EvFmtOp(IntEnum):
    MODIFY_FIELDS = 0
    QUERY_FIELDS = 1


class EvFmtProfileAttrMask(IntFlag):
    NONE = 0
    STATE = 1 << 0
    CUR_STATE = 1 << 1
    MODE = 1 << 2
    OP = 1 << 3
    VENDOR_CFG = 1 << 31


class EvOp(IntEnum):
    REPLACE_EV = 0
    MODIFY_EV_STATE = 1
    QUERY_EV_STATE = 2
    QUERY_EV_ARRAY = 3


class EvFieldsOp(IntEnum):
    MODIFY_FIELDS = 0
    QUERY_FIELDS = 1


class EvOpFlags(IntFlag):
    NONE = 0
    ALL_COPIES = 1 << 0


class EvProfileAttrMask(IntFlag):
    NONE = 0
    STATE = 1 << 0
    CUR_STATE = 1 << 1
    MODE = 1 << 2
    FMT_ID = 1 << 3
    COUNT = 1 << 4
    MIN_ACTIVE = 1 << 5
    EVENT_MASK = 1 << 6
    EV_OP = 1 << 7
    EV_FIELDS_OP = 1 << 8
    VENDOR_CFG = 1 << 31


class CcProfileAttrMask(IntFlag):
    NONE = 0
    STATE = 1 << 0
    CUR_STATE = 1 << 1
    ALGORITHM = 1 << 2
    CONFIG = 1 << 3
    VENDOR_CFG = 1 << 31


class EpOpType(IntEnum):
    EV_PROBE = 0
    PORT_STATUS_UPDATE = 1


@dataclass(frozen=True, slots=True)
class Ev:
    """mrc_ctl_ev: an expanded EV (32 bytes: STEV and UDP values in the first 4 / 2 bytes, SRv6 the uSID
    address then the SRH segment, as `openmrc.ev.packet_fields` reads them) and its port (1-based; 0 only
    in `EV_UNPOPULATED`)."""

    val: bytes = bytes(EV_MAX_BYTES)
    port: int = 0

    @classmethod
    def of(cls, value: int, nbytes: int, port: int) -> Ev:
        """An EV whose first ``nbytes`` bytes hold ``value`` (big-endian), e.g. ``Ev.of(x, 4, 1)`` for
        STEV."""
        return cls(value.to_bytes(nbytes, "big") + bytes(EV_MAX_BYTES - nbytes), port)


EV_UNPOPULATED = Ev()


@dataclass(slots=True)
class EvOpEntry:
    """mrc_ctl_ev_op_entry: ``ev`` (the subject), ``ev_new`` (REPLACE_EV), ``state`` (MODIFY_EV_STATE in,
    QUERY_EV_STATE out), ``flags`` (`EvOpFlags`)."""

    ev: Ev = EV_UNPOPULATED
    ev_new: Ev | None = None
    state: EVState = EVState.UNKNOWN
    flags: int = 0


@dataclass(slots=True)
class EvFmtProfileAttr:
    """mrc_ctl_ev_fmt_profile_attr. ``fmt_fields``: the field widths in bits; ``fmt_field_count`` the
    capacity a QUERY_FIELDS may fill (None: any), set to the count on return."""

    profile_state: ProfileState | None = None
    cur_profile_state: ProfileState | None = None
    ev_fmt_mode: EVFormatMode | None = None
    op: EvFmtOp | None = None
    fmt_fields: list[int] = field(default_factory=list)
    fmt_field_count: int | None = None
    vendor_cfg: bytes = b""


@dataclass(slots=True)
class EvProfileAttr:
    """mrc_ctl_ev_profile_attr. ``ev_op`` with ``entries`` (and ``entry_count``, the capacity a
    QUERY_EV_ARRAY may fill, set to the count on return); ``ev_fields_op`` with ``fields`` (and
    ``field_count`` likewise)."""

    profile_state: ProfileState | None = None
    cur_profile_state: ProfileState | None = None
    ev_mode: EVProfileMode | None = None
    ev_fmt_profile_id: int | None = None
    ev_count: int | None = None
    ev_min_active: int | None = None
    ev_event_mask: int | None = None
    ev_op: EvOp | None = None
    entries: list[EvOpEntry] = field(default_factory=list)
    entry_count: int | None = None
    ev_fields_op: EvFieldsOp | None = None
    fields: list[EVField] = field(default_factory=list)
    field_count: int | None = None
    vendor_cfg: bytes = b""


@dataclass(slots=True)
class CcProfileAttr:
    """mrc_ctl_cc_profile_attr: ``algorithm`` one of `CtlDeviceAttr.algorithms`; ``cc_config`` its
    configuration (for "uet-1.0-nscc" an `openmrc.transport.NsccConfig`, mrc_ctl_cc_nscc_cfg field for
    field)."""

    profile_state: ProfileState | None = None
    cur_profile_state: ProfileState | None = None
    algorithm: str | None = None
    cc_config: object | None = None
    vendor_cfg: bytes = b""


@dataclass(frozen=True, slots=True)
class CtlDeviceAttr:
    """mrc_ctl_device_attr."""

    protocol_version: int
    ev_max_fmt_profiles: int
    ev_max_profiles: int
    ev_max_count: int
    ev_free_count: int
    ev_max_count_profile: int
    ev_count_align: int
    ev_max_width: int
    ev_fmt_mode_mask: int
    ev_mode_mask: int
    ev_op_max_entries: int
    cc_max_profiles: int
    algorithms: tuple[str, ...]
    phy_port_mask: int
    opt_attr: CtlAttrOpt
    supported: bool = True


@dataclass(slots=True)
class PortAttr:
    port_admin_state: PortAdminState = PortAdminState.ENABLED


@dataclass(frozen=True, slots=True)
class CtlEvEvent:
    """mrc_ctl_ev_event: an EV of ``profile_id`` changed to ``state``; ``drop_count`` events were lost
    on this queue just before it. ``qp_num`` (openmrc's addition) is the QP whose EV it was."""

    profile_id: int
    ev: Ev
    drop_count: int
    state: EVState
    qp_num: int = 0


@dataclass(frozen=True, slots=True)
class EpReq:
    """mrc_ctl_ep_req. ``dgid``: the peer as the device addresses it (for the UDP device a `Peer` or an IP
    address); ``sgid`` is informational (a device sends from its port's address); ``req_ev``: the EV and
    port to send on; ``port_status``: for PORT_STATUS_UPDATE."""

    req_id: int
    dgid: Any
    req_ev: Ev
    ev_fmt_mode: EVFormatMode = EVFormatMode.UDP
    sgid: Any = None
    port_status: int = 0


class EpRsp(NamedTuple):
    """mrc_ctl_ep_rsp: RTT in ns, adjusted for the responder's service time when ``adj_svc_time``."""

    req_id: int
    port: int
    rtt: int
    adj_svc_time: bool


# -- privilege and per-device controller state ---------------------------------------------------------------
_GRANTED: dict[int, Any] = {}


def grant(device: verbs.Device) -> None:
    """Let this process control ``device`` without root: the explicit override for a software NIC it owns
    (a real NIC's controller needs CAP_NET_ADMIN)."""
    device._check()
    _GRANTED[id(device.dev)] = device.dev


def _priv(ctx: verbs.Context) -> None:
    ctx._check()
    if os.geteuid() != 0 and _GRANTED.get(id(ctx.dev)) is not ctx.dev:
        raise CtlError(
            errno.EPERM,
            f"controlling {ctx.device.name!r} needs CAP_NET_ADMIN: run as root, or call ctl.grant(device) "
            "for a software NIC this process owns",
        )


@dataclass(slots=True)
class _Fmt:
    state: ProfileState = ProfileState.INIT
    mode: EVFormatMode | None = None
    widths: tuple[int, ...] = ()
    vendor_cfg: bytes = b""


@dataclass(slots=True)
class _EvProf:
    state: ProfileState = ProfileState.INIT
    mode: EVProfileMode | None = None
    fmt_id: int | None = None
    count: int | None = None
    min_active: int | None = None
    event_mask: int | None = None
    fields: tuple[EVField, ...] | None = None
    evs: list[Ev] = field(default_factory=list)  # EXP: the array; ONLINE: the EVs in use
    vendor_cfg: bytes = b""


@dataclass(slots=True)
class _Cc:
    state: ProfileState = ProfileState.INIT
    algorithm: str | None = None
    config: object | None = None
    config_set: bool = False
    vendor_cfg: bytes = b""


@dataclass(slots=True)
class _Controller:
    dev: Any
    fmts: dict[int, _Fmt] = field(default_factory=dict)
    evs: dict[int, _EvProf] = field(default_factory=dict)
    ccs: dict[int, _Cc] = field(default_factory=dict)
    admin_down: set[int] = field(default_factory=set)
    store: ProfileStore | None = None


_CONTROLLERS: dict[int, _Controller] = {}


def _ctl(ctx: verbs.Context) -> _Controller:
    dev = ctx.dev
    c = _CONTROLLERS.get(id(dev))
    if c is None or c.dev is not dev:
        c = _CONTROLLERS[id(dev)] = _Controller(dev)
        nic = dev.nic
        # the NIC's own profile 0 of each kind: ONLINE from the start (AUTO EVs, NSCC for its rate)
        b = nic.ev_profile(0)
        c.evs[0] = _EvProf(
            ProfileState.ONLINE,
            EVProfileMode.AUTO,
            None,
            len(b.entries),
            b.min_active,
            b.event_mask,
            None,
            [Ev(ev, port) for ev, port, _ in b.entries],
        )
        algo, cfg = nic.cc_profiles[0]
        c.ccs[0] = _Cc(ProfileState.ONLINE, algo, cfg, True)
    return c


def _id(name: str, v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < 1 << 64:
        raise CtlError(errno.EINVAL, f"{name}: {v!r} is not a 64-bit profile id")
    return v


def _vendor(v: Any) -> bytes:
    if not isinstance(v, bytes | bytearray) or len(v) > MAX_VENDOR_CFG_SIZE:
        raise CtlError(errno.EINVAL, f"vendor_cfg: at most {MAX_VENDOR_CFG_SIZE} bytes")
    return bytes(v)


def _target(
    mask: int, attr_state: ProfileState | None, cur: ProfileState, cur_mask: int, what: str
) -> ProfileState:
    """The state a modify moves to (CUR_STATE checked), or ``cur``; INIT -> OFFLINE -> ONLINE -> OFFLINE
    -> INIT, one step at a time."""
    if mask & cur_mask:
        raise CtlError(errno.EINVAL, f"{what}: CUR_STATE is for queries; modify asserts nothing")
    if not mask & 1:
        return cur
    if not isinstance(attr_state, ProfileState):
        raise CtlError(errno.EINVAL, f"{what}: profile_state {attr_state!r} is not a ProfileState")
    steps = {
        (ProfileState.INIT, ProfileState.OFFLINE),
        (ProfileState.OFFLINE, ProfileState.ONLINE),
        (ProfileState.ONLINE, ProfileState.OFFLINE),
        (ProfileState.OFFLINE, ProfileState.INIT),
    }
    if attr_state is not cur and (cur, attr_state) not in steps:
        raise CtlError(errno.EINVAL, f"{what}: {cur.name} -> {attr_state.name} is not a profile transition")
    return attr_state


def _unknown(mask: int, kind: type[IntFlag], what: str) -> None:
    known = sum(int(b) for b in kind)
    if isinstance(mask, bool) or not isinstance(mask, int) or mask < 0 or mask & ~known:
        raise CtlError(errno.EINVAL, f"{what}: attr_mask {mask!r} has bits {kind.__name__} does not name")


# -- versions, device, ports ---------------------------------------------------------------------------------
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


# -- EV format profiles --------------------------------------------------------------------------------------
def modify_ev_fmt_profile(
    ctx: verbs.Context, ev_fmt_profile_id: int, attr: EvFmtProfileAttr, attr_mask: int
) -> None:
    """mrc_ctl_modify_ev_fmt_profile. To OFFLINE: MODE; to ONLINE: the fields (OP with MODIFY_FIELDS, now
    or before). OFFLINE allows MODE and MODIFY_FIELDS; ONLINE only a move back to OFFLINE (EBUSY while an
    ONLINE EV profile uses the format). E2BIG: fields wider than the mode carries."""
    _priv(ctx)
    pid = _id("ev_fmt_profile_id", ev_fmt_profile_id)
    _unknown(attr_mask, EvFmtProfileAttrMask, "modify_ev_fmt_profile")
    M = EvFmtProfileAttrMask
    c = _ctl(ctx)
    prof = c.fmts.get(pid)
    if prof is None:
        if len(c.fmts) >= MAX_FMT_PROFILES:
            raise CtlError(errno.ENOMEM, f"{MAX_FMT_PROFILES} EV format profiles exist already")
        prof = _Fmt()
    cur = prof.state
    new = _target(attr_mask, attr.profile_state, cur, M.CUR_STATE, f"EV format profile {pid}")
    staged = _Fmt(prof.state, prof.mode, prof.widths, prof.vendor_cfg)
    editable = cur is not ProfileState.ONLINE
    if attr_mask & M.MODE:
        if not editable:
            raise CtlError(errno.EINVAL, f"EV format profile {pid} is ONLINE: its MODE cannot change")
        try:
            staged.mode = EVFormatMode(attr.ev_fmt_mode)  # type: ignore[arg-type]
        except (ValueError, TypeError):
            raise CtlError(
                errno.EINVAL, f"ev_fmt_mode: {attr.ev_fmt_mode!r} is not an EV format mode"
            ) from None
    if attr_mask & M.OP:
        if attr.op is EvFmtOp.MODIFY_FIELDS:
            if not editable:
                raise CtlError(errno.EINVAL, f"EV format profile {pid} is ONLINE: its fields cannot change")
            staged.widths = tuple(attr.fmt_fields)
        elif attr.op is not EvFmtOp.QUERY_FIELDS:
            raise CtlError(errno.EINVAL, f"op: {attr.op!r} is not an EvFmtOp")
    if attr_mask & M.VENDOR_CFG:
        staged.vendor_cfg = _vendor(attr.vendor_cfg)
    if staged.mode is not None and staged.widths:
        try:
            EVFormatProfile(staged.mode, staged.widths)
        except EVConfigError as exc:
            code = errno.E2BIG if "exceeds" in str(exc) else errno.EINVAL
            raise CtlError(code, f"EV format profile {pid}: {exc}") from None
    if new is ProfileState.OFFLINE and cur is ProfileState.INIT and staged.mode is None:
        raise CtlError(errno.EINVAL, f"EV format profile {pid}: INIT -> OFFLINE needs MODE")
    if new is ProfileState.ONLINE and cur is ProfileState.OFFLINE and not staged.widths:
        raise CtlError(
            errno.EINVAL, f"EV format profile {pid}: OFFLINE -> ONLINE needs the fields (MODIFY_FIELDS)"
        )
    if cur is ProfileState.ONLINE and new is ProfileState.OFFLINE:
        users = [i for i, e in c.evs.items() if e.fmt_id == pid and e.state is ProfileState.ONLINE]
        if users:
            raise CtlError(errno.EBUSY, f"EV format profile {pid} is used by ONLINE EV profile(s) {users}")
    if attr_mask & M.OP and attr.op is EvFmtOp.QUERY_FIELDS:
        _fill_fields(attr, list(staged.widths))
    staged.state = new
    if new is ProfileState.INIT and cur is not ProfileState.INIT:
        staged = _Fmt()  # back to INIT: unconfigured again
    c.fmts[pid] = staged


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


# -- EV profiles ---------------------------------------------------------------------------------------------
def _busy(ctx: verbs.Context, pid: int, kind: str, what: str) -> None:
    """EBUSY when QPs bind profile ``pid`` of ``kind`` ("ev", "cc"): this process's, and, with a store
    attached, those other processes' devices recorded there."""
    attr = f"{kind}_profile_id"
    users = [
        f"0x{qp.qp_num:06x}"
        for qp in ctx.dev.nic.qps.values()
        if qp.state is not QpState.RESET and (getattr(qp.attr, attr) or 0) == pid
    ]
    c = _CONTROLLERS.get(id(ctx.dev))
    if c is not None and c.store is not None:
        users += [f"0x{qpn:06x} (process {proc})" for proc, qpn in c.store.users(kind, pid)]
    if users:
        more = f" and {len(users) - 8} more" if len(users) > 8 else ""
        raise CtlError(errno.EBUSY, f"{what} is bound by {len(users)} QP(s): {', '.join(users[:8])}{more}")


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
    prof = c.evs.get(pid)
    if prof is None:
        if len(c.evs) >= MAX_EV_PROFILES:
            raise CtlError(errno.ENOMEM, f"{MAX_EV_PROFILES} EV profiles exist already")
        prof = _EvProf()
    cur = prof.state
    what = f"EV profile {pid}"
    new = _target(attr_mask, attr.profile_state, cur, M.CUR_STATE, what)
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
    settable = (M.MODE, M.FMT_ID, M.COUNT, M.MIN_ACTIVE, M.EVENT_MASK, M.VENDOR_CFG)
    if online and any(attr_mask & b for b in settable):
        names = ", ".join(b.name or "?" for b in settable if attr_mask & b)
        raise CtlError(errno.EINVAL, f"{what} is ONLINE: {names} cannot change (take it OFFLINE first)")
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
            if online:
                raise CtlError(errno.EINVAL, f"{what} is ONLINE: its fields cannot change")
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
        _ev_op(ctx, c, pid, s, attr, online, fmt)
    # commit
    dev = ctx.dev
    with dev.lock:
        nic = dev.nic
        if new is ProfileState.ONLINE and cur is ProfileState.OFFLINE:
            _install(ctx, pid, s, fmt)
        elif cur is ProfileState.ONLINE and new is ProfileState.OFFLINE:
            nic.profiles.remove_ev_profile(pid)
    s.state = new
    c.evs[pid] = _EvProf() if new is ProfileState.INIT and cur is not ProfileState.INIT else s


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


def _ev_op(
    ctx: verbs.Context,
    c: _Controller,
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
    if op is EvOp.REPLACE_EV:
        if online:
            raise CtlError(errno.EINVAL, f"EV profile {pid} is ONLINE: REPLACE_EV needs it OFFLINE")
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
            ent.state = _state(ctx, pid, echo)
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


def _state(ctx: verbs.Context, pid: int, echo: int) -> EVState:
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
        _ev_op(ctx, c, pid, s, attr, s.state is ProfileState.ONLINE, fmt)
    if attr_mask & M.EV_FIELDS_OP:
        if attr.ev_fields_op is not EvFieldsOp.QUERY_FIELDS:
            raise CtlError(errno.EINVAL, "ev_fields_op: a query takes QUERY_FIELDS")
        _fill_ev_fields(attr, list(s.fields or ()))
    return attr


# -- CC profiles ---------------------------------------------------------------------------------------------
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
    prof = c.ccs.get(pid)
    if prof is None:
        if len(c.ccs) >= MAX_CC_PROFILES:
            raise CtlError(errno.ENOMEM, f"{MAX_CC_PROFILES} CC profiles exist already")
        prof = _Cc()
    cur = prof.state
    what = f"CC profile {pid}"
    new = _target(attr_mask, attr.profile_state, cur, M.CUR_STATE, what)
    s = _Cc(prof.state, prof.algorithm, prof.config, prof.config_set, prof.vendor_cfg)
    if cur is ProfileState.ONLINE and attr_mask & (M.ALGORITHM | M.CONFIG | M.VENDOR_CFG):
        raise CtlError(errno.EINVAL, f"{what} is ONLINE: take it OFFLINE to change it")
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
    s.state = new
    c.ccs[pid] = _Cc() if new is ProfileState.INIT and cur is not ProfileState.INIT else s


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


def attach_store(ctx: verbs.Context, path: str | os.PathLike[str]) -> ProfileStore:
    """Publish this device's ONLINE EV and CC profiles (not the NIC's own profile 0 of each kind) and the
    EVs denied on them to the node-local store at ``path``, now and after every change, so that the
    applications of other processes (devices with `UdpDevice.use_profile_store`) bind them by id."""
    _priv(ctx)
    c = _ctl(ctx)
    c.store = ProfileStore(path)
    _publish(ctx)
    return c.store


def _publish(ctx: verbs.Context) -> None:
    c = _CONTROLLERS.get(id(ctx.dev))
    if c is None or c.store is None or c.dev is not ctx.dev:
        return
    online_ev = sorted(i for i, p in c.evs.items() if i and p.state is ProfileState.ONLINE)
    online_cc = sorted(i for i, p in c.ccs.items() if i and p.state is ProfileState.ONLINE)
    with ctx.dev.lock:
        try:
            c.store.publish(ctx.dev.nic, online_ev, online_cc)
            c.store.publish_domains(ctx.dev.nic.domains)
        except LocalProtocolError as exc:
            raise CtlError(exc.errno, exc.reason) from None


# -- security domains (**[openmrc]**: mrc_ctl.h has none) ----------------------------------------------------
class SecurityDomainAttr(NamedTuple):
    """`query_security_domain`: the domain's identifier, current key epoch, whether it is revoked, the QPs
    of this device in it, and its key's fingerprint (never the key)."""

    sdi: int
    epoch: int
    revoked: bool
    qps: int
    fingerprint: str


def _domain(ctx: verbs.Context, sdi: Any) -> SecurityDomain:
    _priv(ctx)
    if isinstance(sdi, bool) or not isinstance(sdi, int):
        raise CtlError(errno.EINVAL, f"sdi: {sdi!r} is not a security domain identifier")
    dom = ctx.dev.nic.domains.get(sdi)
    if dom is None:
        raise CtlError(errno.ENOENT, f"no security domain {sdi} on {ctx.device.name!r}")
    return dom


def create_security_domain(
    ctx: verbs.Context, sdi: int, key: bytes | None = None, *, epoch: int = 0
) -> SecurityDomain:
    """Create security domain ``sdi`` (1 .. 2^32-1) on the device with the 32-byte domain ``key`` (a fresh
    random one when None: hand `SecurityDomain.spec` to the other members out of band). Applications
    bind QPs to it in INIT (`verbs.MrcQpAttr.security`; `verbs.get_security_domain` finds it by id), in
    other processes of the node too once the device publishes to a store (`attach_store`: rotations and
    revocations follow). EEXIST if the device has it already."""
    _priv(ctx)
    nic = ctx.dev.nic
    if isinstance(sdi, int) and not isinstance(sdi, bool) and sdi in nic.domains:
        raise CtlError(errno.EEXIST, f"security domain {sdi} exists on {ctx.device.name!r}")
    try:
        dom = (
            SecurityDomain(sdi, key, epoch=epoch)
            if key is not None
            else SecurityDomain.generate(sdi, epoch=epoch)
        )
    except LocalProtocolError as exc:
        raise CtlError(exc.errno, exc.reason) from None
    with ctx.dev.lock:
        nic.domains[dom.sdi] = dom
    _publish(ctx)
    return dom


def query_security_domain(ctx: verbs.Context, sdi: int) -> SecurityDomainAttr:
    dom = _domain(ctx, sdi)
    nic = ctx.dev.nic
    n = sum(1 for q, s in nic.secure.items() if s.domain is dom and q in nic.qps)
    return SecurityDomainAttr(dom.sdi, dom.epoch, dom.revoked, n, dom.fingerprint())


def rotate_security_domain(ctx: verbs.Context, sdi: int) -> int:
    """Seal with the next key epoch from now on; the new epoch. Packets of the epoch before stay
    accepted (those in flight), and the next epoch is accepted already, so the members of a domain rotate
    without coordinating, as long as none runs more than one epoch ahead."""
    dom = _domain(ctx, sdi)
    with ctx.dev.lock:
        try:
            epoch = dom.rotate()
        except LocalProtocolError as exc:
            raise CtlError(exc.errno, exc.reason) from None
    _publish(ctx)
    return epoch


def revoke_security_domain(ctx: verbs.Context, sdi: int) -> int:
    """End security domain ``sdi`` at once: nothing is sealed or opened under it again, and every QP of the
    device in it fails (ERROR, its work flushed with LOC_PROT_ERR first, a QP_FATAL async event); how many
    QPs. The domain stays, revoked, until `destroy_security_domain`."""
    dom = _domain(ctx, sdi)
    dev = ctx.dev
    with dev.lock:
        n = dev.nic.revoke_domain(dom, dev.now())
    _publish(ctx)
    return n


def secure_endpoint(ctx: verbs.Context, sdi: int | None) -> None:
    """**[openmrc]** Authenticate the device's endpoint packets (port status updates, EV probes and their
    answers) in security domain ``sdi``, so that a forged one cannot take a plane out of use; None: MRC
    1.0 again. Every device that exchanges endpoint packets with this one must do the same."""
    if sdi is None:
        _priv(ctx)
        dom = None
    else:
        dom = _domain(ctx, sdi)
    with ctx.dev.lock:
        ctx.dev.nic.secure_endpoint(dom)


def destroy_security_domain(ctx: verbs.Context, sdi: int) -> None:
    """Remove security domain ``sdi`` from the device (EBUSY while a QP not in RESET is bound to it)."""
    dom = _domain(ctx, sdi)
    nic = ctx.dev.nic
    users = [
        q
        for q, s in nic.secure.items()
        if s.domain is dom and q in nic.qps and nic.qps[q].state is not QpState.ERROR
    ]
    if (ep := nic.secure.get(RESERVED_QP_ENDPOINT)) is not None and ep.domain is dom:
        raise CtlError(
            errno.EBUSY, f"security domain {sdi} secures the endpoint (secure_endpoint(ctx, None))"
        )
    if users:
        raise CtlError(errno.EBUSY, f"security domain {sdi} is bound by {len(users)} QP(s)")
    with ctx.dev.lock:
        del nic.domains[dom.sdi]
    _publish(ctx)


# -- EV events -----------------------------------------------------------------------------------------------
class EvEventCq(verbs.Cq):
    """An EV event queue (mrc_ctl_create_ev_event_cq): at most ``cqe`` events wait; past that the newest
    are dropped and counted, and the next event delivered carries the count (it never overruns). Armed with
    `verbs.req_notify_cq`, it reports to its channel like a CQ; destroyed with `verbs.destroy_cq`."""

    def __init__(
        self, ctx: verbs.Context, cqe: int, cq_context: Any, channel: verbs.CompChannel | None
    ) -> None:
        from openmrc.transport import CompletionQueue

        super().__init__(ctx, CompletionQueue(1), cq_context, channel)
        self._events: deque[CtlEvEvent] = deque()
        self._cap = cqe
        self._dropped = 0
        self._profiles = ctx.dev.nic.profiles

    def _sink(self, ev: EvEvent) -> None:  # from the progress path, under the device lock
        if len(self._events) >= self._cap:
            self._dropped += 1
            return
        self._events.append(
            CtlEvEvent(
                ev.profile_id, Ev(ev.ev, ev.port), self._dropped, controller_state(ev.state), ev.qp_num
            )
        )
        self._dropped = 0
        core = self.core
        if core.armed and core.notify is not None:
            core.armed = 0
            core.notify(core)

    def _released(self) -> None:
        if self._sink in self._profiles.sinks:
            self._profiles.sinks.remove(self._sink)


def create_ev_event_cq(
    ctx: verbs.Context,
    cqe: int,
    cq_context: Any = None,
    channel: verbs.CompChannel | None = None,
    comp_vector: int = 0,
) -> EvEventCq:
    """mrc_ctl_create_ev_event_cq: a queue of the EV state changes every EV profile's event mask selects."""
    _priv(ctx)
    if isinstance(cqe, bool) or not isinstance(cqe, int) or not 1 <= cqe <= verbs.MAX_CQE:
        raise CtlError(errno.EINVAL, f"cqe: {cqe!r} outside 1..{verbs.MAX_CQE}")
    if comp_vector != 0:
        raise CtlError(errno.EINVAL, f"comp_vector: {comp_vector!r}; this device has one vector, 0")
    if channel is not None and (not channel.alive or channel.ctx is not ctx):
        raise CtlError(errno.EINVAL, "channel: destroyed, or of another context")
    cq = EvEventCq(ctx, cqe, cq_context, channel)
    dev = ctx.dev
    with dev.lock:
        if channel is not None:
            cq.core.notify = lambda _c, cq=cq, ch=channel: ch._post(cq)
            channel.cqs.append(cq)
        dev.nic.profiles.sinks.append(cq._sink)
    ctx.cqs.append(cq)
    return cq


def poll_ev_event(ev_cq: EvEventCq, num_entries: int) -> list[CtlEvEvent]:
    """mrc_ctl_poll_ev_event: up to ``num_entries`` events, oldest first (the device makes progress first
    unless its own thread does)."""
    if not isinstance(ev_cq, EvEventCq):
        raise CtlError(errno.EINVAL, "ev_cq: an EV event CQ (create_ev_event_cq)")
    ev_cq._check()
    if isinstance(num_entries, bool) or not isinstance(num_entries, int) or num_entries < 0:
        raise CtlError(errno.EINVAL, f"num_entries: {num_entries!r} is not a count")
    ev_cq.ctx.progress()
    out: list[CtlEvEvent] = []
    with ev_cq.ctx.dev.lock:
        while ev_cq._events and len(out) < num_entries:
            out.append(ev_cq._events.popleft())
    return out


# -- endpoint requests ---------------------------------------------------------------------------------------
def ep_batch_send_wait(
    ctx: verbs.Context,
    req_tc: int,
    op_type: EpOpType,
    reqs: list[EpReq],
    rsp_timeout: int,
) -> list[EpRsp]:
    """mrc_ctl_ep_batch_send_wait: send ``reqs`` (all EV probes or all port status updates) and wait up to
    ``rsp_timeout`` ns of the device's clock for their answers, returned in arrival order. ETIMEDOUT when
    some did not come: the error's ``responses`` hold those that did. ``req_tc``: the DSCP (0..63) the
    request asks for; the software NIC sends every endpoint packet with its own marking."""
    _priv(ctx)
    if isinstance(req_tc, bool) or not isinstance(req_tc, int) or not 0 <= req_tc <= 63:
        raise CtlError(errno.EINVAL, f"req_tc: {req_tc!r} is not a DSCP (0..63)")
    if op_type not in (EpOpType.EV_PROBE, EpOpType.PORT_STATUS_UPDATE):
        raise CtlError(errno.ENOTSUP, f"op_type: {op_type!r}")
    if isinstance(rsp_timeout, bool) or not isinstance(rsp_timeout, int) or not 0 <= rsp_timeout < 1 << 32:
        raise CtlError(errno.EINVAL, f"rsp_timeout: {rsp_timeout!r} ns outside 0..2^32-1")
    if not reqs:
        return []
    dev = ctx.dev
    nic = dev.nic
    ids = [r.req_id for r in reqs]
    if len(set(ids)) != len(ids) or any(
        isinstance(i, bool) or not isinstance(i, int) or not 0 <= i <= 0xFFFF for i in ids
    ):
        raise CtlError(errno.EINVAL, "req_id: 16-bit values, unique within the batch")
    for i, r in enumerate(reqs):
        _ev_check(r.req_ev, f"reqs[{i}].req_ev", nic.num_ports)
    op = EpOp.EV_PROBE if op_type is EpOpType.EV_PROBE else EpOp.PORT_STATUS_UPDATE
    with dev.lock:
        start = dev.now()
        for r in reqs:
            if r.dgid is not None:
                # a peer the device may not know yet; an address it cannot learn is answered there
                with contextlib.suppress(LocalProtocolError, TypeError, AttributeError):
                    dev.add_peer(r.dgid)
            try:
                nic.endpoint.request(
                    op,
                    r.dgid,
                    now=start,
                    port=r.req_ev.port,
                    ev=r.req_ev.val,
                    entropy=ev_echo32(r.req_ev.val, r.ev_fmt_mode),
                    port_status=r.port_status if op_type is EpOpType.PORT_STATUS_UPDATE else None,
                    rid=r.req_id,
                )
            except LocalProtocolError as exc:
                raise CtlError(exc.errno, exc.reason) from None
    want = set(ids)
    got: list[EpRsp] = []
    while want:
        with dev.lock:
            pending = nic.endpoint.responses
            kept = []
            while pending:
                resp = pending.popleft()
                if resp.req_id in want:
                    want.discard(resp.req_id)
                    got.append(EpRsp(resp.req_id, resp.port, resp.rtt, resp.adj_svc_time))
                else:
                    kept.append(resp)
            pending.extend(kept)
            now = dev.now()
        if not want:
            break
        if now - start >= rsp_timeout:
            raise CtlError(
                errno.ETIMEDOUT, f"{len(want)} of {len(reqs)} endpoint request(s) unanswered", responses=got
            )
        step = min(0.001, (rsp_timeout - (now - start)) / 1e9)
        if dev.threaded:
            time.sleep(step)
        else:
            dev.progress(step)
    return got
