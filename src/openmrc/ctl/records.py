"""mrc_ctl.h's limits, enums and attribute records, and `CtlError`: the vocabulary every part of
`openmrc.ctl` speaks (C names without ``mrc_ctl_``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum, IntFlag
from typing import Any, NamedTuple

from openmrc import verbs
from openmrc.ev import EVField, EVFormatMode, EVProfileMode, EVState

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
