"""The application API of an MRC device, mirroring OCP MRC 1.0 ``mrc.h`` (and the few ibverbs calls it
leans on: device list, open/close, PD, memory registration).

A program finds a device by name (`get_device_list`, `open_device`), queries it (`query_device`), creates
an MRC context with the API version it was written for (`create_context`), a PD and memory regions
(`alloc_pd`, `reg_mr`), completion channels and CQs, optional QP hints, and QPs that it moves through
RESET -> INIT -> RTR -> RTS with `modify_qp` (ibverbs attributes and MRC attributes, each with its mask),
binding in INIT to the EV and CC profiles a controller installed (`openmrc.ctl`). Work is posted with
`post_send` (RDMA Write, Write with Immediate) and `post_recv`, completions come from `poll_cq` or, armed
with `req_notify_cq`, through the completion channel's file descriptor (`get_cq_event`, `ack_cq_events`),
and QP, CQ and port events from `get_async_event`.

The functions keep the C names without the ``mrc_`` prefix and take the same arguments in the same order;
outputs are return values instead of out-parameters, and failures raise `VerbsError` (a
`openmrc.transport.LocalProtocolError` carrying the errno: ``err.errno_name`` is ``"EINVAL"``,
``"EBUSY"`` ...) instead of returning -1. Where openmrc differs on purpose, the function says so; the table
in ``docs/verbs.md`` maps every C function to its Python counterpart.

A device is anything that implements `VerbsDevice` and is registered under a name (`add_device`): the
software NIC over UDP (`openmrc.provider.udp.UdpDevice`) and the simulator's hosts. The same program runs
against either, selected by the name it opens.
"""

from __future__ import annotations

import contextlib
import errno
import os
import select
import threading
import time
from collections import deque
from collections.abc import Hashable, Iterable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field, replace
from enum import IntEnum, IntFlag
from typing import Any, NamedTuple, Protocol

from openmrc.transport import (
    Access,
    CompletionQueue,
    LocalProtocolError,
    MemoryRegion,
    Nic,
    QpCapFlags,
    QpSecurity,
    QpState,
    RecvWR,
    SecurityDomain,
    SendFlags,
    SendWR,
    Sge,
    WcOpcode,
    WcStatus,
    WorkCompletion,
    WrOpcode,
)
from openmrc.transport import Qp as CoreQp
from openmrc.transport import QpInitAttr as CoreQpInitAttr

__all__ = [
    "API_CURRENT_VERSION",
    "API_LAST_SUPPORTED_VERSION",
    "MAX_VENDOR_CFG_SIZE",
    "VENDOR_API_CURRENT_VERSION",
    "VENDOR_API_LAST_SUPPORTED_VERSION",
    "Access",
    "ApiVersions",
    "AsyncEvent",
    "AsyncEventType",
    "CompChannel",
    "Context",
    "Cq",
    "Device",
    "DeviceAttr",
    "DeviceCap",
    "MemoryRegion",
    "MrcQpAttr",
    "MrcQpAttrMask",
    "PostError",
    "ProtectionDomain",
    "ProtocolVersion",
    "Qp",
    "QpAttr",
    "QpAttrMask",
    "QpCap",
    "QpCapFlags",
    "QpHint",
    "QpHintAttr",
    "QpHintAttrMask",
    "QpInitAttr",
    "QpQuery",
    "QpSecurity",
    "QpState",
    "RecvWR",
    "SecurityDomain",
    "SendFlags",
    "SendOpsFlags",
    "SendWR",
    "Sge",
    "VerbsDevice",
    "VerbsError",
    "WcOpcode",
    "WcStatus",
    "WorkCompletion",
    "WrOpcode",
    "ack_async_event",
    "ack_cq_events",
    "add_device",
    "alloc_pd",
    "api_ver",
    "close_device",
    "create_comp_channel",
    "create_context",
    "create_cq",
    "create_qp",
    "create_qp_hint",
    "dealloc_pd",
    "dereg_mr",
    "destroy_comp_channel",
    "destroy_context",
    "destroy_cq",
    "destroy_qp",
    "destroy_qp_hint",
    "get_async_event",
    "get_comp_channel_fd",
    "get_cq_event",
    "get_device_list",
    "get_qpn",
    "get_security_domain",
    "modify_qp",
    "modify_qp_hint",
    "open_device",
    "poll_cq",
    "post_recv",
    "post_send",
    "query_device",
    "query_device_ex",
    "query_qp",
    "query_qp_hint",
    "query_version",
    "reg_mr",
    "remove_device",
    "req_notify_cq",
]

MAX_VENDOR_CFG_SIZE = 128


def api_ver(major: int, minor: int, sub_minor: int) -> int:
    """An API version as mrc_api_ver.h encodes it: major in bits 31..24, minor 23..16, sub-minor 15..0."""
    if not (0 <= major <= 0xFF and 0 <= minor <= 0xFF and 0 <= sub_minor <= 0xFFFF):
        raise VerbsError(errno.EINVAL, f"API version {major}.{minor}.{sub_minor} out of range")
    return major << 24 | minor << 16 | sub_minor


def _ver_text(v: int) -> str:
    return f"{v >> 24}.{(v >> 16) & 0xFF}.{v & 0xFFFF}"


API_CURRENT_VERSION = 1 << 24 | 0 << 16 | 1
"""The mrc.h API version this module implements (1.0.1: `query_device_ex`)."""
API_LAST_SUPPORTED_VERSION = 1 << 24
"""The oldest API version it still serves (1.0.0)."""
VENDOR_API_CURRENT_VERSION = 1 << 24
"""openmrc's provider (vendor) API version."""
VENDOR_API_LAST_SUPPORTED_VERSION = 1 << 24


# -- errors --------------------------------------------------------------------------------------------------
class VerbsError(LocalProtocolError):
    """A verbs call failed: ``errno`` (and ``errno_name``) as the C call would set it, ``reason`` in words."""

    def __init__(self, err: int, reason: str) -> None:
        # set here rather than by LocalProtocolError's __init__, which the compiled build checks for
        # its exact class
        self.errno = err
        self.reason = reason
        ValueError.__init__(self, f"[{errno.errorcode.get(err, err)}] {reason}")

    @property
    def errno_name(self) -> str:
        if self.errno == errno.EOPNOTSUPP:  # the same number as ENOTSUP on Linux; verbs says EOPNOTSUPP
            return "EOPNOTSUPP"
        return errno.errorcode.get(self.errno, str(self.errno))


class PostError(VerbsError):
    """`post_send` / `post_recv` stopped at ``bad_wr`` (index ``index`` of the list); the work requests
    before it are posted, it and those after it are not (``bad_wr`` of ibv_post_send)."""

    def __init__(self, err: int, reason: str, bad_wr: SendWR | RecvWR, index: int) -> None:
        super().__init__(err, reason)
        self.bad_wr = bad_wr
        self.index = index


def _err(exc: LocalProtocolError) -> VerbsError:
    return exc if isinstance(exc, VerbsError) else VerbsError(exc.errno, exc.reason)


# -- enums and attribute records -----------------------------------------------------------------------------
class ProtocolVersion(IntFlag):
    """mrc_protocol_version: wire protocol versions (a device reports a bitmap; 0 = provider default)."""

    DEFAULT = 0
    V1 = 1 << 0


class DeviceCap(IntFlag):
    """mrc_device_cap."""

    NONE = 0
    TRIM_NACK = 1 << 0
    DYNAMIC_MPR = 1 << 1
    SVC_TIME = 1 << 2


class QpAttrMask(IntFlag):
    """ibv_qp_attr_mask bits (the ibverbs attributes of `modify_qp` / `query_qp`)."""

    NONE = 0
    STATE = 1 << 0
    CUR_STATE = 1 << 1
    EN_SQD_ASYNC_NOTIFY = 1 << 2
    ACCESS_FLAGS = 1 << 3
    PKEY_INDEX = 1 << 4
    PORT = 1 << 5
    QKEY = 1 << 6
    AV = 1 << 7
    PATH_MTU = 1 << 8
    TIMEOUT = 1 << 9
    RETRY_CNT = 1 << 10
    RNR_RETRY = 1 << 11
    RQ_PSN = 1 << 12
    MAX_QP_RD_ATOMIC = 1 << 13
    ALT_PATH = 1 << 14
    MIN_RNR_TIMER = 1 << 15
    SQ_PSN = 1 << 16
    MAX_DEST_RD_ATOMIC = 1 << 17
    PATH_MIG_STATE = 1 << 18
    CAP = 1 << 19
    DEST_QPN = 1 << 20


# Verbs attributes MRC does not have, and what to use instead (mrc.h's list, plus the UD/SQD-only ones).
_UNSUPPORTED_VATTR: dict[QpAttrMask, str] = {
    QpAttrMask.PORT: "an MRC QP uses every port (plane); there is no port to choose",
    QpAttrMask.TIMEOUT: "use MrcQpAttrMask.TIMEOUT",
    QpAttrMask.RETRY_CNT: "use MrcQpAttrMask.RETRY_CNT (linear_cnt, exp_cnt)",
    QpAttrMask.RNR_RETRY: "MRC has no receiver-not-ready retries (Write with Imm needs no receive buffer)",
    QpAttrMask.MIN_RNR_TIMER: "MRC has no receiver-not-ready timer",
    QpAttrMask.MAX_QP_RD_ATOMIC: "MRC has no RDMA Read or atomics",
    QpAttrMask.MAX_DEST_RD_ATOMIC: "MRC has no RDMA Read or atomics",
    QpAttrMask.ALT_PATH: "MRC sprays over EVs; there is no alternate path",
    QpAttrMask.PATH_MIG_STATE: "MRC sprays over EVs; there is no path migration",
    QpAttrMask.QKEY: "Q_Keys belong to UD QPs",
    QpAttrMask.EN_SQD_ASYNC_NOTIFY: "MRC QPs have no SQD state",
    QpAttrMask.CAP: "QP capacities are fixed at creation",
}


class MrcQpAttrMask(IntFlag):
    """mrc_qp_attr_mask bits (the MRC attributes of `modify_qp` / `query_qp`)."""

    NONE = 0
    MAX_WIMM = 1 << 0
    MAX_WIMM_DEST = 1 << 1
    MPR = 1 << 2
    MPR_DEST = 1 << 3
    TIMEOUT = 1 << 4
    EV_PROFILE_ID = 1 << 5
    CC_PROFILE_ID = 1 << 6
    HINT = 1 << 7
    RETRY_CNT = 1 << 8
    CAP = 1 << 9
    SECURITY = 1 << 16
    """**[openmrc]** ``MrcQpAttr.security``: the security domain the QP's packets are authenticated in
    (INIT only; both ends set the same)."""
    VENDOR_CFG = 1 << 31


class QpHintAttrMask(IntFlag):
    """mrc_qp_hint_attr_mask bits."""

    NONE = 0
    NUM_QPS_PER_PEER = 1 << 0
    NUM_SEND_PEERS = 1 << 1
    NUM_REMOTE_RECV_PEERS = 1 << 2
    VENDOR_CFG = 1 << 31


class SendOpsFlags(IntFlag):
    """ibv_qp_create_send_ops_flags: the operations a QP may post. MRC has the two Writes."""

    NONE = 0
    WITH_RDMA_WRITE = 1 << 0
    WITH_RDMA_WRITE_WITH_IMM = 1 << 1
    WITH_SEND = 1 << 2
    WITH_SEND_WITH_IMM = 1 << 3
    WITH_RDMA_READ = 1 << 4
    WITH_ATOMIC_CMP_AND_SWP = 1 << 5
    WITH_ATOMIC_FETCH_AND_ADD = 1 << 6


_MRC_SEND_OPS = SendOpsFlags.WITH_RDMA_WRITE | SendOpsFlags.WITH_RDMA_WRITE_WITH_IMM
_OP_FLAG = {
    WrOpcode.RDMA_WRITE: SendOpsFlags.WITH_RDMA_WRITE,
    WrOpcode.RDMA_WRITE_WITH_IMM: SendOpsFlags.WITH_RDMA_WRITE_WITH_IMM,
}


class AsyncEventType(IntEnum):
    """ibv_event_type values of the events an MRC device reports."""

    CQ_ERR = 0
    QP_FATAL = 1
    QP_REQ_ERR = 2
    QP_ACCESS_ERR = 3
    DEVICE_FATAL = 8
    PORT_ACTIVE = 9
    PORT_ERR = 10


class ApiVersions(NamedTuple):
    """`query_version`: the mrc.h API versions (`api_ver` encoding) this library serves."""

    current: int
    last_supported: int
    vendor: int
    last_supported_vendor: int


@dataclass(frozen=True, slots=True)
class DeviceAttr:
    """mrc_device_attr, and whether the device supports MRC at all (``supported``)."""

    protocol_version: ProtocolVersion
    max_wimm: int
    max_wimm_dest: int
    max_mpr: int
    mpr_resolution: int
    max_qp_hint: int
    cap: DeviceCap
    supported: bool = True


@dataclass(frozen=True, slots=True)
class QpCap:
    """ibv_qp_cap: work-request queue depths and scatter/gather limits."""

    max_send_wr: int = 128
    max_recv_wr: int = 128
    max_send_sge: int = 1
    max_recv_sge: int = 1
    max_inline_data: int = 0


@dataclass(slots=True)
class QpHintAttr:
    """mrc_qp_hint_attr: the traffic a group of QPs expects (the provider may size resources by it)."""

    num_qps_per_peer: int = 0
    num_send_peers: int = 0
    num_remote_recv_peers: int = 0
    vendor_cfg: bytes = b""


@dataclass(slots=True)
class QpAttr:
    """The ibverbs attributes (ibv_qp_attr) an MRC QP has. ``ah_attr`` is the peer: for the UDP device
    a `openmrc.provider.udp.Peer` (one address per plane), for a simulated host its host number."""

    qp_state: QpState | None = None
    cur_qp_state: QpState | None = None
    path_mtu: int | None = None
    qp_access_flags: Access | None = None
    pkey_index: int | None = None
    ah_attr: Hashable | None = None
    dest_qp_num: int | None = None
    rq_psn: int | None = None
    sq_psn: int | None = None


@dataclass(slots=True)
class MrcQpAttr:
    """mrc_qp_attr: the MRC attributes of a QP (``linear_cnt`` / ``exp_cnt`` are ``retry``'s fields)."""

    mpr: int | None = None
    mpr_dest: int | None = None
    max_wimm: int | None = None
    max_wimm_dest: int | None = None
    timeout: int | None = None
    ev_profile_id: int | None = None
    cc_profile_id: int | None = None
    linear_cnt: int | None = None
    exp_cnt: int | None = None
    qp_hint: QpHint | None = None
    cap: QpCapFlags | None = None
    vendor_cfg: bytes | None = None
    security: QpSecurity | None = None
    """**[openmrc]** (mask bit SECURITY) authenticated MRC: `openmrc.transport.QpSecurity`."""


@dataclass(frozen=True, slots=True, eq=False)
class AsyncEvent:
    """mrc_async_event: ``element`` is the `Qp`, the `Cq` or the port number the event is about."""

    event_type: AsyncEventType
    element: Qp | Cq | int
    context: Context = field(repr=False)


# -- devices -------------------------------------------------------------------------------------------------
class VerbsDevice(Protocol):
    """What a device offers this module: its NIC, a lock held while it makes progress, its clock, explicit
    progress (or a progress thread of its own), resources, and the QP hooks it needs (checking that it can
    carry a QP's EVs when the QP binds them, learning a peer's addresses)."""

    @property
    def nic(self) -> Nic: ...
    @property
    def lock(self) -> AbstractContextManager[Any]: ...
    @property
    def closed(self) -> bool: ...
    @property
    def threaded(self) -> bool: ...
    def now(self) -> int: ...
    def progress(self, timeout: float | None = 0.0) -> int: ...
    def register(self, buffer: Any, access: Access = ...) -> MemoryRegion: ...
    def deregister(self, mr: MemoryRegion) -> None: ...
    def create_cq(self, depth: int = 65536) -> CompletionQueue: ...
    def destroy_cq(self, cq: CompletionQueue) -> None: ...
    def create_qp(self, init: CoreQpInitAttr | None = None) -> CoreQp: ...
    def destroy_qp(self, qp: CoreQp) -> None: ...
    def prepare_qp(self, qp: CoreQp) -> None: ...
    def add_peer(self, peer: Any) -> None: ...
    def post_send(self, qp: CoreQp, wr: SendWR) -> None: ...
    def post_recv(self, qp: CoreQp, wr: RecvWR) -> None: ...


_DEVICES: dict[str, VerbsDevice] = {}
_DEVICES_LOCK = threading.Lock()


def add_device(name: str, device: VerbsDevice) -> None:
    """Make ``device`` openable as ``name`` (EEXIST if the name is taken by another device)."""
    if not isinstance(name, str) or not name or len(name) > 64:
        raise VerbsError(errno.EINVAL, f"device name {name!r}: 1..64 characters")
    with _DEVICES_LOCK:
        if _DEVICES.get(name, device) is not device:
            raise VerbsError(errno.EEXIST, f"a device named {name!r} exists already")
        _DEVICES[name] = device


def remove_device(name: str) -> None:
    """Forget the device named ``name`` (ENOENT if none); contexts already open keep working."""
    with _DEVICES_LOCK:
        if _DEVICES.pop(name, None) is None:
            raise VerbsError(errno.ENOENT, f"no device named {name!r}")


def get_device_list() -> list[str]:
    """The names of the devices that can be opened (ibv_get_device_list), sorted."""
    with _DEVICES_LOCK:
        return sorted(name for name, d in _DEVICES.items() if not d.closed)


class Device:
    """An opened device (ibv_context)."""

    def __init__(self, name: str, dev: VerbsDevice) -> None:
        self.name = name
        self.dev = dev
        self.pds: list[ProtectionDomain] = []
        self.contexts: list[Context] = []
        self.open = True

    def __repr__(self) -> str:
        return f"Device({self.name!r})"

    def _check(self) -> None:
        if not self.open:
            raise VerbsError(errno.EBADF, f"device {self.name!r} is closed")
        if self.dev.closed:
            raise VerbsError(errno.ENODEV, f"device {self.name!r} has been shut down")


def open_device(name: str) -> Device:
    """Open the device named ``name`` (ibv_open_device); ENOENT with the names there are."""
    with _DEVICES_LOCK:
        dev = _DEVICES.get(name)
    if dev is None or dev.closed:
        names = ", ".join(get_device_list()) or "none"
        raise VerbsError(errno.ENOENT, f"no device named {name!r} (devices: {names})")
    return Device(name, dev)


def close_device(device: Device) -> None:
    """Close an opened device (ibv_close_device): EBUSY while PDs or MRC contexts of it remain."""
    if not device.open:
        raise VerbsError(errno.EBADF, f"device {device.name!r} is closed already")
    if device.pds or device.contexts:
        raise VerbsError(
            errno.EBUSY,
            f"device {device.name!r} still has {len(device.pds)} PD(s) and {len(device.contexts)} context(s)",
        )
    device.open = False


def query_version() -> ApiVersions:
    """mrc_query_version: the API versions this library serves (callable before any context)."""
    return ApiVersions(
        API_CURRENT_VERSION,
        API_LAST_SUPPORTED_VERSION,
        VENDOR_API_CURRENT_VERSION,
        VENDOR_API_LAST_SUPPORTED_VERSION,
    )


def query_device(device: Device) -> DeviceAttr:
    """mrc_query_device (API 1.0.0 semantics): the device's MRC limits and capabilities."""
    device._check()
    nic = device.dev.nic  # every openmrc NIC has the same limits (the transport core's)
    cap = DeviceCap.TRIM_NACK | DeviceCap.DYNAMIC_MPR
    if nic.config.report_service_time:  # the UDP device: SACKs say how long their trigger was in the host
        cap |= DeviceCap.SVC_TIME
    return DeviceAttr(
        protocol_version=ProtocolVersion.V1,
        max_wimm=0xFFFF,
        max_wimm_dest=0xFFFF,
        max_mpr=255,
        mpr_resolution=1,
        max_qp_hint=MAX_QP_HINTS,
        # The responder NACKs trimmed packets and dynamic MPR is implemented; a device that knows when its
        # packets arrived and its SACKs leave reports the responder's service time (SVC_TIME).
        cap=cap,
    )


def query_device_ex(device: Device, context: Context) -> DeviceAttr:
    """mrc_query_device_ex (API 1.0.1): `query_device` for a program that created ``context`` on it."""
    context._check()
    if context.device is not device:
        raise VerbsError(errno.EINVAL, "the context belongs to another device")
    if context.api_version and context.api_version < api_ver(1, 0, 1):
        raise VerbsError(
            errno.EOPNOTSUPP,
            f"query_device_ex is API 1.0.1; the context was created for {_ver_text(context.api_version)}",
        )
    return query_device(device)


MAX_QP_HINTS = 4096


# -- protection domains and memory ---------------------------------------------------------------------------
class ProtectionDomain:
    """ibv_pd: groups memory regions and the QPs that may use them."""

    def __init__(self, device: Device) -> None:
        self.device = device
        self.mrs: list[MemoryRegion] = []
        self.qps: list[Qp] = []
        self.alive = True

    def _check(self) -> None:
        if not self.alive:
            raise VerbsError(errno.EINVAL, "the PD has been deallocated")
        self.device._check()


def alloc_pd(device: Device) -> ProtectionDomain:
    """ibv_alloc_pd."""
    device._check()
    pd = ProtectionDomain(device)
    device.pds.append(pd)
    return pd


def dealloc_pd(pd: ProtectionDomain) -> None:
    """ibv_dealloc_pd: EBUSY while memory regions or QPs use it."""
    pd._check()
    if pd.mrs or pd.qps:
        raise VerbsError(errno.EBUSY, f"the PD still has {len(pd.mrs)} MR(s) and {len(pd.qps)} QP(s)")
    pd.alive = False
    pd.device.pds.remove(pd)


_MR_ACCESS = Access.LOCAL_WRITE | Access.REMOTE_WRITE
_IBV_REMOTE_READ = 1 << 2
_IBV_REMOTE_ATOMIC = 1 << 3


def reg_mr(pd: ProtectionDomain, buffer: Any, access: int) -> MemoryRegion:
    """ibv_reg_mr of a buffer-protocol object (bytearray, numpy array, mmap; a read-only one such as
    ``bytes`` with access 0, as the source of Writes). ``access``: `Access` flags; REMOTE_WRITE needs
    LOCAL_WRITE (as in verbs); REMOTE_READ and REMOTE_ATOMIC are refused (MRC has neither)."""
    pd._check()
    if isinstance(access, bool) or not isinstance(access, int) or access < 0:
        raise VerbsError(errno.EINVAL, f"access: expected Access flags, got {access!r}")
    if access & (_IBV_REMOTE_READ | _IBV_REMOTE_ATOMIC):
        raise VerbsError(
            errno.EINVAL, "access: MRC has no RDMA Read or atomics (REMOTE_READ / REMOTE_ATOMIC)"
        )
    if access & ~int(_MR_ACCESS):
        raise VerbsError(errno.EINVAL, f"access: unknown flag bits 0x{access & ~int(_MR_ACCESS):x}")
    if access & Access.REMOTE_WRITE and not access & Access.LOCAL_WRITE:
        raise VerbsError(errno.EINVAL, "access: REMOTE_WRITE needs LOCAL_WRITE")
    try:
        mr = pd.device.dev.register(buffer, Access(access))
    except LocalProtocolError as exc:
        raise _err(exc) from None
    mr.pd = pd  # remote Writes reach it only through QPs of this PD (the NIC checks it per packet)
    pd.mrs.append(mr)
    return mr


def dereg_mr(mr: MemoryRegion) -> None:
    """ibv_dereg_mr. Writes already in flight to it are refused (R_Key unknown) from now on."""
    pd = getattr(mr, "pd", None)
    if not isinstance(pd, ProtectionDomain) or mr not in pd.mrs:
        raise VerbsError(errno.EINVAL, "the memory region is not registered")
    pd.mrs.remove(mr)
    mr.pd = None
    with pd.device.dev.lock:
        pd.device.dev.deregister(mr)


# -- MRC context ---------------------------------------------------------------------------------------------
class Context:
    """mrc_context: the parent of a program's MRC objects on one device, with the API versions it uses."""

    def __init__(self, device: Device, api_version: int, vendor_api_version: int) -> None:
        self.device = device
        self.api_version = api_version
        self.vendor_api_version = vendor_api_version
        self.channels: list[CompChannel] = []
        self.cqs: list[Cq] = []
        self.hints: list[QpHint] = []
        self.qps: list[Qp] = []
        self.alive = True
        self._events: deque[AsyncEvent] = deque()
        self._unacked: dict[int, AsyncEvent] = {}  # id(event) -> event handed out, not acknowledged
        self._ports_seen = list(device.dev.nic.ports_up)

    def __repr__(self) -> str:
        return f"Context({self.device.name!r}, api {_ver_text(self.api_version or API_CURRENT_VERSION)})"

    def _check(self) -> None:
        if not self.alive:
            raise VerbsError(errno.EINVAL, "the MRC context has been destroyed")
        self.device._check()

    @property
    def dev(self) -> VerbsDevice:
        return self.device.dev

    def progress(self) -> None:
        """One progress round of the device unless its own thread makes progress."""
        dev = self.device.dev
        if not dev.threaded and not dev.closed:
            dev.progress(0)


def create_context(device: Device, api_version_used: int = 0, vendor_api_version_used: int = 0) -> Context:
    """mrc_create_context. ``api_version_used`` (`api_ver` encoding; 0: the latest) must lie between
    `API_LAST_SUPPORTED_VERSION` and `API_CURRENT_VERSION`, the vendor version likewise (EINVAL with both
    ranges otherwise)."""
    device._check()
    for what, v, lo, hi in (
        ("api_version_used", api_version_used, API_LAST_SUPPORTED_VERSION, API_CURRENT_VERSION),
        (
            "vendor_api_version_used",
            vendor_api_version_used,
            VENDOR_API_LAST_SUPPORTED_VERSION,
            VENDOR_API_CURRENT_VERSION,
        ),
    ):
        if isinstance(v, bool) or not isinstance(v, int) or v < 0 or v > 0xFFFF_FFFF:
            raise VerbsError(errno.EINVAL, f"{what}: expected an api_ver() value, got {v!r}")
        if v and not lo <= v <= hi:
            raise VerbsError(
                errno.EINVAL,
                f"{what}: {_ver_text(v)} is not served (this library: {_ver_text(lo)} .. {_ver_text(hi)})",
            )
    ctx = Context(device, api_version_used, vendor_api_version_used)
    device.contexts.append(ctx)
    return ctx


def destroy_context(ctx: Context) -> None:
    """mrc_destroy_context: EBUSY while QPs, QP hints, CQs or completion channels of it remain."""
    ctx._check()
    left = {
        "QP(s)": len(ctx.qps),
        "QP hint(s)": len(ctx.hints),
        "CQ(s)": len(ctx.cqs),
        "channel(s)": len(ctx.channels),
    }
    busy = [f"{n} {k}" for k, n in left.items() if n]
    if busy:
        raise VerbsError(errno.EBUSY, f"the context still has {', '.join(busy)}")
    ctx.alive = False
    ctx.device.contexts.remove(ctx)


# -- completion channels and CQs -----------------------------------------------------------------------------
class CompChannel:
    """mrc_comp_channel: where armed CQs report their next completion. ``fileno()`` is readable while a
    CQ event waits (for `select`, `selectors` and asyncio's ``add_reader``)."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.cqs: list[Cq] = []
        self._events: deque[Cq] = deque()
        self._lock = threading.Lock()
        self._rfd, self._wfd = _signal_fd()
        self.alive = True

    def fileno(self) -> int:
        return self._rfd

    def _post(self, cq: Cq) -> None:  # from the progress path, under the device lock
        with self._lock:
            self._events.append(cq)
            with contextlib.suppress(OSError):
                os.write(self._wfd, b"\x01" if self._rfd != self._wfd else (1).to_bytes(8, "little"))

    def _take(self) -> Cq | None:
        with self._lock:
            if not self._events:
                return None
            cq = self._events.popleft()
            if not self._events:  # nothing more waits: the descriptor stops being readable
                with contextlib.suppress(OSError):
                    os.read(self._rfd, 4096)
            return cq

    def _close(self) -> None:
        for fd in {self._rfd, self._wfd}:
            with contextlib.suppress(OSError):
                os.close(fd)


def _signal_fd() -> tuple[int, int]:
    """A non-blocking descriptor pair that can be made readable: an eventfd where there is one."""
    eventfd = getattr(os, "eventfd", None)
    if eventfd is not None:
        fd = eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        return fd, fd
    r, w = os.pipe()
    os.set_blocking(r, False)
    os.set_blocking(w, False)
    return r, w


def create_comp_channel(ctx: Context) -> CompChannel:
    """mrc_create_comp_channel."""
    ctx._check()
    ch = CompChannel(ctx)
    ctx.channels.append(ch)
    return ch


def get_comp_channel_fd(channel: CompChannel) -> int:
    """mrc_get_comp_channel_fd."""
    if not channel.alive:
        raise VerbsError(errno.EINVAL, "the completion channel has been destroyed")
    return channel.fileno()


def destroy_comp_channel(channel: CompChannel) -> None:
    """mrc_destroy_comp_channel: EBUSY while CQs report to it."""
    if not channel.alive:
        raise VerbsError(errno.EINVAL, "the completion channel has been destroyed already")
    if channel.cqs:
        raise VerbsError(errno.EBUSY, f"{len(channel.cqs)} CQ(s) still report to the channel")
    channel.alive = False
    channel.ctx.channels.remove(channel)
    channel._close()


class Cq:
    """mrc_cq: a completion queue of at least ``cqe`` entries, with the application's ``cq_context``."""

    def __init__(
        self, ctx: Context, core: CompletionQueue, cq_context: Any, channel: CompChannel | None
    ) -> None:
        self.ctx = ctx
        self.core = core
        self.cq_context = cq_context
        self.channel = channel
        self.events_unacked = 0
        self.alive = True
        self.overrun_reported = False

    @property
    def cqe(self) -> int:
        return self.core.depth

    def _released(self) -> None:
        """Called once `destroy_cq` has taken the CQ apart (a kind of CQ with more to release extends it)."""

    def _check(self) -> None:
        if not self.alive:
            raise VerbsError(errno.EINVAL, "the CQ has been destroyed")
        self.ctx._check()


MAX_CQE = 1 << 22


def create_cq(
    ctx: Context, cqe: int, cq_context: Any = None, channel: CompChannel | None = None, comp_vector: int = 0
) -> Cq:
    """mrc_create_cq: ``cqe`` entries at least (1 .. 2^22); ``channel``: where `req_notify_cq` reports;
    ``comp_vector`` 0 (a software NIC has one completion vector)."""
    ctx._check()
    if isinstance(cqe, bool) or not isinstance(cqe, int) or not 1 <= cqe <= MAX_CQE:
        raise VerbsError(errno.EINVAL, f"cqe: {cqe!r} outside 1..{MAX_CQE}")
    if comp_vector != 0:
        raise VerbsError(errno.EINVAL, f"comp_vector: {comp_vector!r}; this device has one vector, 0")
    if channel is not None and (not channel.alive or channel.ctx is not ctx):
        raise VerbsError(errno.EINVAL, "channel: destroyed, or of another context")
    dev = ctx.dev
    with dev.lock:
        core = dev.create_cq(cqe)
        cq = Cq(ctx, core, cq_context, channel)
        if channel is not None:
            core.notify = lambda _c, cq=cq, ch=channel: ch._post(cq)
            channel.cqs.append(cq)
    ctx.cqs.append(cq)
    return cq


def poll_cq(cq: Cq, num_entries: int) -> list[WorkCompletion]:
    """mrc_poll_cq: up to ``num_entries`` completions, oldest first (fewer: the CQ is empty). Without a
    progress thread the device makes one round of progress first."""
    cq._check()
    if isinstance(num_entries, bool) or not isinstance(num_entries, int) or num_entries < 0:
        raise VerbsError(errno.EINVAL, f"num_entries: {num_entries!r} is not a count")
    cq.ctx.progress()
    with cq.ctx.dev.lock:
        return cq.core.poll(num_entries)


def req_notify_cq(cq: Cq, solicited_only: bool = False) -> None:
    """mrc_req_notify_cq: report the CQ's next completion on its channel (``solicited_only``: the next
    receive (Write with Immediate) or error completion; MRC Writes carry no solicited flag of their own,
    so every Write with Immediate counts as solicited). A completion already in the CQ does not count."""
    cq._check()
    if cq.channel is None:
        raise VerbsError(errno.EINVAL, "the CQ was created without a completion channel")
    with cq.ctx.dev.lock:
        cq.core.arm(bool(solicited_only))


def get_cq_event(channel: CompChannel, timeout: float | None = None) -> tuple[Cq, Any]:
    """mrc_get_cq_event: the next CQ that reported (and its ``cq_context``), waiting up to ``timeout``
    seconds (None: until one does; EAGAIN when the time is up). Every event must be acknowledged with
    `ack_cq_events`. Without a progress thread, the device makes progress while this waits."""
    if not channel.alive:
        raise VerbsError(errno.EINVAL, "the completion channel has been destroyed")
    ctx = channel.ctx
    end = None if timeout is None else time.monotonic() + max(0.0, timeout)
    while True:
        cq = channel._take()
        if cq is not None:
            cq.events_unacked += 1
            return cq, cq.cq_context
        ctx._check()
        left = None if end is None else end - time.monotonic()
        if left is not None and left <= 0:
            raise VerbsError(errno.EAGAIN, "no CQ event within the timeout")
        step = 0.01 if left is None else min(left, 0.01)
        dev = ctx.dev
        if dev.threaded:
            select.select([channel._rfd], [], [], step)
        else:
            dev.progress(step)


def ack_cq_events(cq: Cq, nevents: int) -> None:
    """mrc_ack_cq_events: acknowledge ``nevents`` events `get_cq_event` returned for ``cq`` (EINVAL if that
    is more than it returned)."""
    if isinstance(nevents, bool) or not isinstance(nevents, int) or not 0 <= nevents <= cq.events_unacked:
        raise VerbsError(errno.EINVAL, f"nevents: {nevents!r}; {cq.events_unacked} event(s) unacknowledged")
    cq.events_unacked -= nevents


def destroy_cq(cq: Cq) -> None:
    """mrc_destroy_cq: EBUSY while a QP uses it or events of it are unacknowledged (mrc.h waits for the
    acknowledgements; a Python program that forgot one gets the reason instead of a hang)."""
    cq._check()
    users = [qp for qp in cq.ctx.qps if cq in (qp.send_cq, qp.recv_cq)]
    if users:
        raise VerbsError(errno.EBUSY, f"the CQ is in use by {len(users)} QP(s)")
    if cq.events_unacked:
        raise VerbsError(errno.EBUSY, f"{cq.events_unacked} CQ event(s) not acknowledged (ack_cq_events)")
    dev = cq.ctx.dev
    with dev.lock:
        try:
            dev.destroy_cq(cq.core)
        except LocalProtocolError as exc:
            raise _err(exc) from None
        cq.core.notify = None
        cq.core.armed = 0
        cq._released()
    cq.alive = False
    cq.ctx.cqs.remove(cq)
    if cq.channel is not None:
        cq.channel.cqs.remove(cq)
        with cq.channel._lock:
            kept = [c for c in cq.channel._events if c is not cq]
            cq.channel._events.clear()
            cq.channel._events.extend(kept)


# -- QP hints ------------------------------------------------------------------------------------------------
class QpHint:
    """mrc_qp_hint: traffic expectations shared by the QPs that name it (in INIT or RTR)."""

    def __init__(self, ctx: Context, attr: QpHintAttr) -> None:
        self.ctx = ctx
        self.attr = attr
        self.users = 0
        self.alive = True

    def _check(self) -> None:
        if not self.alive:
            raise VerbsError(errno.EINVAL, "the QP hint has been destroyed")
        self.ctx._check()


_HINT_FIELDS = {
    QpHintAttrMask.NUM_QPS_PER_PEER: "num_qps_per_peer",
    QpHintAttrMask.NUM_SEND_PEERS: "num_send_peers",
    QpHintAttrMask.NUM_REMOTE_RECV_PEERS: "num_remote_recv_peers",
    QpHintAttrMask.VENDOR_CFG: "vendor_cfg",
}
_HINT_ALL = QpHintAttrMask(sum(_HINT_FIELDS))


def _check_hint_attr(attr: QpHintAttr, mask: int) -> None:
    if not isinstance(attr, QpHintAttr):
        raise VerbsError(errno.EINVAL, f"expected a QpHintAttr, got {type(attr).__name__}")
    if mask & ~int(_HINT_ALL):
        raise VerbsError(errno.EINVAL, f"qp_hint_attr_mask: unknown bits 0x{mask & ~int(_HINT_ALL):x}")
    for bit, name in _HINT_FIELDS.items():
        if not mask & bit:
            continue
        v = getattr(attr, name)
        if name == "vendor_cfg":
            if not isinstance(v, bytes | bytearray) or len(v) > MAX_VENDOR_CFG_SIZE:
                raise VerbsError(errno.EINVAL, f"vendor_cfg: at most {MAX_VENDOR_CFG_SIZE} bytes")
        elif isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= 0x7FFF_FFFF:
            raise VerbsError(errno.EINVAL, f"{name}: {v!r} is not a count")


def create_qp_hint(ctx: Context, attr: QpHintAttr | None = None) -> QpHint:
    """mrc_create_qp_hint (ENOMEM past the device's ``max_qp_hint``)."""
    ctx._check()
    attr = QpHintAttr() if attr is None else attr
    _check_hint_attr(attr, int(_HINT_ALL))
    if sum(len(c.hints) for c in ctx.device.contexts) >= MAX_QP_HINTS:
        raise VerbsError(errno.ENOMEM, f"{MAX_QP_HINTS} QP hints exist already (max_qp_hint)")
    hint = QpHint(ctx, replace(attr, vendor_cfg=bytes(attr.vendor_cfg)))
    ctx.hints.append(hint)
    return hint


def query_qp_hint(hint: QpHint, qp_hint_attr_mask: int) -> QpHintAttr:
    """mrc_query_qp_hint: the attributes ``qp_hint_attr_mask`` names (the others at their defaults)."""
    hint._check()
    _check_hint_attr(hint.attr, qp_hint_attr_mask)
    out = QpHintAttr()
    for bit, name in _HINT_FIELDS.items():
        if qp_hint_attr_mask & bit:
            setattr(out, name, getattr(hint.attr, name))
    return out


def modify_qp_hint(hint: QpHint, attr: QpHintAttr, qp_hint_attr_mask: int) -> None:
    """mrc_modify_qp_hint: set the attributes ``qp_hint_attr_mask`` names."""
    hint._check()
    _check_hint_attr(attr, qp_hint_attr_mask)
    for bit, name in _HINT_FIELDS.items():
        if qp_hint_attr_mask & bit:
            v = getattr(attr, name)
            setattr(hint.attr, name, bytes(v) if name == "vendor_cfg" else v)


def destroy_qp_hint(hint: QpHint) -> None:
    """mrc_destroy_qp_hint: EBUSY while QPs name it."""
    hint._check()
    if hint.users:
        raise VerbsError(errno.EBUSY, f"the QP hint is in use by {hint.users} QP(s)")
    hint.alive = False
    hint.ctx.hints.remove(hint)


# -- QPs -----------------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True, kw_only=True)
class QpInitAttr:
    """mrc_qp_init_attr."""

    send_cq: Cq
    recv_cq: Cq
    pd: ProtectionDomain
    cap: QpCap = field(default_factory=QpCap)
    sq_sig_all: bool = False
    send_ops_flags: SendOpsFlags = _MRC_SEND_OPS
    protocol_version: ProtocolVersion = ProtocolVersion.DEFAULT
    qp_context: Any = None


MAX_WR = 1 << 16


class Qp:
    """mrc_qp. ``core`` is the transport's QP underneath; ``qp_num`` its number."""

    def __init__(self, ctx: Context, core: CoreQp, init: QpInitAttr) -> None:
        self.ctx = ctx
        self.core = core
        self.init = init
        self.send_cq = init.send_cq
        self.recv_cq = init.recv_cq
        self.pd = init.pd
        self.vattr = QpAttr(path_mtu=None, qp_access_flags=Access.LOCAL_WRITE, pkey_index=0)
        self.mattr = MrcQpAttr(cap=QpCapFlags.NONE, vendor_cfg=b"")
        self.alive = True
        self.user_error = False  # moved to ERROR by the program (no async event for that)
        self.error_reported = False

    @property
    def qp_num(self) -> int:
        return self.core.qp_num

    @property
    def qp_context(self) -> Any:
        return self.init.qp_context

    @property
    def state(self) -> QpState:
        return self.core.state

    def __repr__(self) -> str:
        return f"Qp(0x{self.qp_num:06x}, {self.core.state.name})"

    def _check(self) -> None:
        if not self.alive:
            raise VerbsError(errno.EINVAL, "the QP has been destroyed")
        self.ctx._check()


def create_qp(ctx: Context, init_attr: QpInitAttr) -> Qp:
    """mrc_create_qp: a QP in RESET. ``send_ops_flags`` may name RDMA Write and Write with Immediate only;
    one SGE per work request each way, no inline data; ``protocol_version`` 0 (default) or V1."""
    ctx._check()
    if not isinstance(init_attr, QpInitAttr):
        raise VerbsError(errno.EINVAL, f"expected a verbs.QpInitAttr, got {type(init_attr).__name__}")
    for name in ("send_cq", "recv_cq"):
        cq = getattr(init_attr, name)
        if not isinstance(cq, Cq) or not cq.alive or cq.ctx is not ctx:
            raise VerbsError(errno.EINVAL, f"{name}: a live CQ of this context")
    pd = init_attr.pd
    if not isinstance(pd, ProtectionDomain) or not pd.alive or pd.device is not ctx.device:
        raise VerbsError(errno.EINVAL, "pd: a live PD of this context's device")
    ops = init_attr.send_ops_flags
    if not ops or ops & ~int(_MRC_SEND_OPS):
        raise VerbsError(
            errno.EOPNOTSUPP,
            f"send_ops_flags: 0x{int(ops):x}; an MRC QP posts WITH_RDMA_WRITE and "
            "WITH_RDMA_WRITE_WITH_IMM only",
        )
    if init_attr.protocol_version not in (ProtocolVersion.DEFAULT, ProtocolVersion.V1):
        raise VerbsError(
            errno.EPROTONOSUPPORT,
            f"protocol_version: {int(init_attr.protocol_version)}; this device speaks V1",
        )
    c = init_attr.cap
    for name, v, hi in (
        ("max_send_wr", c.max_send_wr, MAX_WR),
        ("max_recv_wr", c.max_recv_wr, MAX_WR),
        ("max_send_sge", c.max_send_sge, 1),
        ("max_recv_sge", c.max_recv_sge, 1),
        ("max_inline_data", c.max_inline_data, 0),
    ):
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= hi:
            raise VerbsError(errno.EINVAL, f"cap.{name}: {v!r} outside 0..{hi}")
    if c.max_send_wr < 1:
        raise VerbsError(errno.EINVAL, "cap.max_send_wr: at least 1")
    dev = ctx.dev
    core_init = CoreQpInitAttr(
        send_cq=init_attr.send_cq.core,
        recv_cq=init_attr.recv_cq.core,
        max_send_wr=c.max_send_wr,
        max_recv_wr=max(1, c.max_recv_wr),
        sq_sig_all=bool(init_attr.sq_sig_all),
    )
    with dev.lock:
        core = dev.create_qp(core_init)
        core.pd = pd
    qp = Qp(ctx, core, init_attr)
    ctx.qps.append(qp)
    pd.qps.append(qp)
    return qp


def get_security_domain(ctx: Context, sdi: int) -> SecurityDomain:
    """**[openmrc]** The security domain ``sdi`` the device's controller created (`openmrc.ctl`; or the
    node's, through the store the device uses, `UdpDevice.use_profile_store`), to bind a QP to in INIT
    (``MrcQpAttr(security=QpSecurity(domain))``). ENOENT if there is none."""
    ctx._check()
    if isinstance(sdi, bool) or not isinstance(sdi, int):
        raise VerbsError(errno.EINVAL, f"sdi: {sdi!r} is not a security domain identifier")
    nic = ctx.dev.nic
    dom = nic.domains.get(sdi)
    resolver = nic.profiles.resolver
    if dom is None and resolver is not None:  # a device that uses a node's store: the controller's domains
        with ctx.dev.lock:
            if resolver(2, sdi):
                dom = nic.domains.get(sdi)
    if dom is None:
        raise VerbsError(errno.ENOENT, f"no security domain {sdi!r} on this device")
    return dom


def get_qpn(qp: Qp) -> int:
    """mrc_get_qpn."""
    qp._check()
    return qp.qp_num


def destroy_qp(qp: Qp) -> None:
    """mrc_destroy_qp: its outstanding work requests complete with WR_FLUSH_ERR first (pollable on its
    CQs); EBUSY while its async events are unacknowledged."""
    qp._check()
    if any(ev.element is qp for ev in qp.ctx._unacked.values()):
        raise VerbsError(errno.EBUSY, "async event(s) of the QP not acknowledged (ack_async_event)")
    dev = qp.ctx.dev
    with dev.lock:
        if qp.core.state not in (QpState.RESET, QpState.ERROR):
            qp.core.modify(QpState.ERROR, now=dev.now())
        dev.destroy_qp(qp.core)
    hint = qp.mattr.qp_hint
    if hint is not None:
        hint.users -= 1
    qp.alive = False
    qp.ctx.qps.remove(qp)
    qp.pd.qps.remove(qp)


# Which attributes each transition requires (mrc.h's table, with the ibverbs ones an RC QP needs) and allows.
_V = QpAttrMask
_M = MrcQpAttrMask
_RULES: dict[tuple[QpState, QpState], tuple[int, int, int, int]] = {
    # (from, to): (verbs required, verbs optional, MRC required, MRC optional)
    (QpState.RESET, QpState.INIT): (
        0,
        _V.ACCESS_FLAGS | _V.PKEY_INDEX,
        _M.EV_PROFILE_ID | _M.CC_PROFILE_ID | _M.HINT,
        _M.VENDOR_CFG | _M.SECURITY,
    ),
    (QpState.INIT, QpState.INIT): (
        0,
        _V.ACCESS_FLAGS | _V.PKEY_INDEX,
        0,
        _M.EV_PROFILE_ID | _M.CC_PROFILE_ID | _M.HINT | _M.VENDOR_CFG | _M.SECURITY,
    ),
    (QpState.INIT, QpState.RTR): (
        _V.AV | _V.DEST_QPN | _V.RQ_PSN,
        _V.PATH_MTU | _V.ACCESS_FLAGS | _V.PKEY_INDEX,
        _M.MAX_WIMM_DEST | _M.MPR_DEST,
        _M.CAP | _M.HINT | _M.MPR | _M.MAX_WIMM | _M.VENDOR_CFG,
    ),
    (QpState.RTR, QpState.RTS): (
        _V.SQ_PSN,
        _V.ACCESS_FLAGS,
        _M.MAX_WIMM | _M.MPR | _M.RETRY_CNT | _M.TIMEOUT,
        _M.VENDOR_CFG,
    ),
    (QpState.RTS, QpState.RTS): (
        0,
        _V.ACCESS_FLAGS,
        0,
        _M.MAX_WIMM | _M.RETRY_CNT | _M.TIMEOUT | _M.VENDOR_CFG,
    ),
}


def _names(mask: int, kind: type[IntFlag]) -> str:
    return ", ".join(m.name or "?" for m in kind if m.value and mask & m.value)


def modify_qp(
    qp: Qp,
    attr: QpAttr | None = None,
    attr_mask: int = 0,
    mrc_attr: MrcQpAttr | None = None,
    mrc_attr_mask: int = 0,
) -> None:
    """mrc_modify_qp: the attributes the two masks name. With ``QpAttrMask.STATE`` the QP moves to
    ``attr.qp_state`` (RESET -> INIT -> RTR -> RTS, any -> ERROR, any -> RESET), and each transition takes
    the attributes mrc.h requires (INIT: EV_PROFILE_ID, CC_PROFILE_ID, HINT; RTR: MAX_WIMM_DEST, MPR_DEST and
    the verbs AV, DEST_QPN, RQ_PSN; RTS: MAX_WIMM, MPR, RETRY_CNT, TIMEOUT and SQ_PSN); without it, INIT
    and RTS QPs change attributes in place. The verbs attributes mrc.h does not support (PORT, TIMEOUT,
    RETRY_CNT, RNR, atomics, alternate path ...) are refused with EINVAL and what to use instead. Nothing
    changes when anything is refused."""
    qp._check()
    attr = attr if attr is not None else QpAttr()
    mrc_attr = mrc_attr if mrc_attr is not None else MrcQpAttr()
    for name, m in (("attr_mask", attr_mask), ("mrc_attr_mask", mrc_attr_mask)):
        if isinstance(m, bool) or not isinstance(m, int) or m < 0:
            raise VerbsError(errno.EINVAL, f"{name}: {m!r} is not a mask")
    bad = [f"{k.name}: {why}" for k, why in _UNSUPPORTED_VATTR.items() if attr_mask & k]
    if bad:
        raise VerbsError(errno.EINVAL, "unsupported verbs attribute(s): " + "; ".join(bad))
    unknown_v = attr_mask & ~sum(int(b) for b in QpAttrMask)
    unknown_m = mrc_attr_mask & ~sum(int(b) for b in MrcQpAttrMask)
    if unknown_v or unknown_m:
        raise VerbsError(errno.EINVAL, f"unknown mask bits: verbs 0x{unknown_v:x}, MRC 0x{unknown_m:x}")
    core = qp.core
    cur = core.state
    if attr_mask & _V.CUR_STATE and attr.cur_qp_state != cur:
        raise VerbsError(errno.EINVAL, f"cur_qp_state: {attr.cur_qp_state!r}, but the QP is in {cur.name}")
    new = cur
    if attr_mask & _V.STATE:
        if not isinstance(attr.qp_state, QpState):
            raise VerbsError(errno.EINVAL, f"qp_state: expected a QpState, got {attr.qp_state!r}")
        new = attr.qp_state
    vm = attr_mask & ~int(_V.STATE | _V.CUR_STATE)
    mm = mrc_attr_mask
    if new in (QpState.ERROR, QpState.RESET) and (cur, new) not in _RULES:
        rule: tuple[int, int, int, int] | None = (0, 0, 0, 0)
    else:
        rule = _RULES.get((cur, new))
    if rule is None:
        raise VerbsError(errno.EINVAL, f"illegal QP transition {cur.name} -> {new.name}")
    v_req, v_opt, m_req, m_opt = rule
    if cur == new and not (attr_mask & _V.STATE) and not vm and not mm:
        return
    missing = [_names(v_req & ~vm, QpAttrMask), _names(m_req & ~mm, MrcQpAttrMask)]
    if any(missing):
        what = "; ".join(
            x
            for x in (f"verbs {missing[0]}" if missing[0] else "", f"MRC {missing[1]}" if missing[1] else "")
            if x
        )
        raise VerbsError(errno.EINVAL, f"{cur.name} -> {new.name} needs {what}")
    extra = [_names(vm & ~(v_req | v_opt), QpAttrMask), _names(mm & ~(m_req | m_opt), MrcQpAttrMask)]
    if any(extra):
        what = "; ".join(
            x for x in (f"verbs {extra[0]}" if extra[0] else "", f"MRC {extra[1]}" if extra[1] else "") if x
        )
        raise VerbsError(errno.EINVAL, f"not allowed on {cur.name} -> {new.name}: {what}")
    kw, vnew, mnew = _collect(qp, attr, vm, mrc_attr, mm, cur, new)
    dev = qp.ctx.dev
    peer = kw.get("peer")
    with dev.lock:
        try:
            if peer is not None:
                dev.add_peer(peer)
            if new is QpState.INIT and "ev_profile_id" in kw:  # binding a profile: can the device carry it?
                before = core.attr.ev_profile_id
                core.modify(new, now=dev.now(), **kw)
                try:
                    dev.prepare_qp(core)
                except BaseException:
                    if cur is QpState.RESET:
                        core.modify(QpState.RESET, now=dev.now())
                    else:  # INIT -> INIT: the profile it had
                        core.modify(QpState.INIT, now=dev.now(), ev_profile_id=before)
                    raise
            else:
                core.modify(new, now=dev.now(), **kw)
        except LocalProtocolError as exc:
            raise _err(exc) from None
    # committed: record what the program set
    old_hint = qp.mattr.qp_hint
    for k, v in vnew.items():
        setattr(qp.vattr, k, v)
    for k, v in mnew.items():
        setattr(qp.mattr, k, v)
    if new is QpState.RESET and cur is not QpState.RESET:
        qp.vattr = QpAttr(path_mtu=None, qp_access_flags=Access.LOCAL_WRITE, pkey_index=0)
        qp.mattr = MrcQpAttr(cap=QpCapFlags.NONE, vendor_cfg=b"")
        qp.user_error = False
        qp.error_reported = False
    if new is QpState.ERROR and cur is not QpState.ERROR:
        qp.user_error = True
    new_hint = qp.mattr.qp_hint
    if new_hint is not old_hint:
        if old_hint is not None:
            old_hint.users -= 1
        if new_hint is not None:
            new_hint.users += 1


_RANGES = {
    "mpr": (1, 255),
    "mpr_dest": (1, 255),
    "max_wimm": (0, 0xFFFF),
    "max_wimm_dest": (0, 0xFFFF),
    "timeout": (0, 24),
    "linear_cnt": (0, 7),
    "exp_cnt": (0, 25),
    "ev_profile_id": (0, (1 << 64) - 1),
    "cc_profile_id": (0, (1 << 64) - 1),
    "dest_qp_num": (0, (1 << 24) - 1),
    "rq_psn": (0, (1 << 24) - 1),
    "sq_psn": (0, (1 << 24) - 1),
    "pkey_index": (0, 0),
    "path_mtu": (1, 5),
}
_MTU_ENUM = {256: 1, 512: 2, 1024: 3, 2048: 4, 4096: 5}


def _int_in(name: str, v: Any) -> int:
    lo, hi = _RANGES[name]
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise VerbsError(errno.EINVAL, f"{name}: {v!r} outside {lo}..{hi}")
    return v


def _collect(
    qp: Qp, attr: QpAttr, vm: int, m: MrcQpAttr, mm: int, cur: QpState, new: QpState
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """Check the named attributes; returns the core's keyword arguments and what to record."""
    kw: dict[str, Any] = {}
    vrec: dict[str, Any] = {}
    mrec: dict[str, Any] = {}
    if vm & _V.AV:
        if attr.ah_attr is None:
            raise VerbsError(
                errno.EINVAL, "ah_attr: the peer (for the UDP device, a Peer) is required with AV"
            )
        kw["peer"] = vrec["ah_attr"] = attr.ah_attr
    for bit, name, core_name in (
        (_V.DEST_QPN, "dest_qp_num", "dest_qp_num"),
        (_V.RQ_PSN, "rq_psn", "rq_psn"),
        (_V.SQ_PSN, "sq_psn", "sq_psn"),
    ):
        if vm & bit:
            kw[core_name] = vrec[name] = _int_in(name, getattr(attr, name))
    if vm & _V.PKEY_INDEX:
        vrec["pkey_index"] = _int_in("pkey_index", attr.pkey_index)
    if vm & _V.PATH_MTU:
        mtu = _int_in("path_mtu", attr.path_mtu)
        nic_mtu = _MTU_ENUM.get(qp.ctx.dev.nic.config.mtu, 5)
        if mtu > nic_mtu:
            raise VerbsError(
                errno.EINVAL, f"path_mtu: {mtu} is above the device's MTU ({qp.ctx.dev.nic.config.mtu} B)"
            )
        vrec["path_mtu"] = mtu
    if vm & _V.ACCESS_FLAGS:
        a = attr.qp_access_flags
        if a is None or isinstance(a, bool) or not isinstance(a, int) or a & ~int(_MR_ACCESS):
            raise VerbsError(
                errno.EINVAL, f"qp_access_flags: {a!r}; MRC QPs take LOCAL_WRITE and REMOTE_WRITE"
            )
        vrec["qp_access_flags"] = Access(a)
    mbit: MrcQpAttrMask
    for mbit, name, core_name in (
        (_M.MPR, "mpr", "mpr"),
        (_M.MPR_DEST, "mpr_dest", "mpr_dest"),
        (_M.MAX_WIMM, "max_wimm", "max_wimm"),
        (_M.MAX_WIMM_DEST, "max_wimm_dest", "max_wimm_dest"),
        (_M.TIMEOUT, "timeout", "timeout"),
        (_M.EV_PROFILE_ID, "ev_profile_id", "ev_profile_id"),
        (_M.CC_PROFILE_ID, "cc_profile_id", "cc_profile_id"),
    ):
        if mm & mbit:
            mrec[name] = v = _int_in(name, getattr(m, name))
            kw[core_name] = v
    if mm & _M.RETRY_CNT:
        mrec["linear_cnt"] = kw["retry_linear"] = _int_in("linear_cnt", m.linear_cnt)
        mrec["exp_cnt"] = kw["retry_exp"] = _int_in("exp_cnt", m.exp_cnt)
    if mm & _M.HINT:
        h = m.qp_hint
        if h is not None and (not isinstance(h, QpHint) or not h.alive or h.ctx is not qp.ctx):
            raise VerbsError(errno.EINVAL, "qp_hint: None or a live QP hint of this context")
        mrec["qp_hint"] = h
        kw["qp_hint"] = h
    if mm & _M.CAP:
        c = m.cap
        allowed = int(
            QpCapFlags.TRIM_NACK_DEST_UNSUPPORTED
            | QpCapFlags.DYNAMIC_MPR
            | QpCapFlags.SVC_TIME_DEST_UNSUPPORTED
        )
        if c is None or isinstance(c, bool) or not isinstance(c, int) or c & ~allowed:
            raise VerbsError(errno.EINVAL, f"cap: {c!r}; mrc_qp_cap flags only")
        mrec["cap"] = kw["cap"] = QpCapFlags(c)
    if mm & _M.SECURITY:
        sec = m.security
        if not isinstance(sec, QpSecurity):  # (None too: to the core it would mean "unchanged")
            raise VerbsError(errno.EINVAL, f"security: {sec!r}; expected an openmrc.transport.QpSecurity")
        mrec["security"] = kw["security"] = sec
    if mm & _M.VENDOR_CFG:
        vc = m.vendor_cfg
        if not isinstance(vc, bytes | bytearray) or len(vc) > MAX_VENDOR_CFG_SIZE:
            raise VerbsError(errno.EINVAL, f"vendor_cfg: at most {MAX_VENDOR_CFG_SIZE} bytes")
        mrec["vendor_cfg"] = bytes(vc)
    # mrc.h lets RTR carry the requester's MPR and WIMM (the OCP example does); the transport takes them
    # at RTS, where they are required again.
    if cur is QpState.INIT and new is QpState.RTR:
        kw.pop("mpr", None)
        kw.pop("max_wimm", None)
    # The core has no qp_hint in place changes on RTS; profile ids and hints it keeps as given.
    if cur is new is QpState.RTS:
        kw.pop("qp_hint", None)
    return kw, vrec, mrec


class QpQuery(NamedTuple):
    """`query_qp`: the verbs attributes, the MRC attributes and the creation attributes."""

    attr: QpAttr
    mrc_attr: MrcQpAttr
    init_attr: QpInitAttr


def query_qp(qp: Qp, attr_mask: int = int(QpAttrMask.STATE), mrc_attr_mask: int = 0) -> QpQuery:
    """mrc_query_qp: the attributes the masks name (the others None), in any state."""
    qp._check()
    unsupported = [k.name for k in _UNSUPPORTED_VATTR if attr_mask & k]
    if unsupported:
        raise VerbsError(
            errno.EINVAL, f"unsupported verbs attribute(s): {', '.join(str(u) for u in unsupported)}"
        )
    v = QpAttr()
    if attr_mask & (_V.STATE | _V.CUR_STATE):
        v.qp_state = v.cur_qp_state = qp.core.state
    for bit, name in (
        (_V.AV, "ah_attr"),
        (_V.DEST_QPN, "dest_qp_num"),
        (_V.RQ_PSN, "rq_psn"),
        (_V.SQ_PSN, "sq_psn"),
        (_V.PATH_MTU, "path_mtu"),
        (_V.ACCESS_FLAGS, "qp_access_flags"),
        (_V.PKEY_INDEX, "pkey_index"),
    ):
        if attr_mask & bit:
            setattr(v, name, getattr(qp.vattr, name))
    if attr_mask & _V.PATH_MTU and v.path_mtu is None:
        v.path_mtu = _MTU_ENUM.get(qp.ctx.dev.nic.config.mtu, 5)
    m = MrcQpAttr()
    mbit: MrcQpAttrMask
    for mbit, names in (
        (_M.MPR, ("mpr",)),
        (_M.MPR_DEST, ("mpr_dest",)),
        (_M.MAX_WIMM, ("max_wimm",)),
        (_M.MAX_WIMM_DEST, ("max_wimm_dest",)),
        (_M.TIMEOUT, ("timeout",)),
        (_M.EV_PROFILE_ID, ("ev_profile_id",)),
        (_M.CC_PROFILE_ID, ("cc_profile_id",)),
        (_M.RETRY_CNT, ("linear_cnt", "exp_cnt")),
        (_M.HINT, ("qp_hint",)),
        (_M.CAP, ("cap",)),
        (_M.SECURITY, ("security",)),
        (_M.VENDOR_CFG, ("vendor_cfg",)),
    ):
        if mrc_attr_mask & mbit:
            for name in names:
                setattr(m, name, getattr(qp.mattr, name))
    return QpQuery(v, m, qp.init)


# -- posting -------------------------------------------------------------------------------------------------
def post_send(qp: Qp, wr: SendWR | Iterable[SendWR]) -> None:
    """mrc_post_send of one work request or a list of them, in order. The first one refused raises
    `PostError` naming it (``bad_wr``, ``index``) with the reason: an opcode the QP was not created for,
    more SGEs than ``cap.max_send_sge``, an SGE outside its memory region, a full send queue (ENOMEM), a
    QP not in RTS ... The ones before it are posted."""
    qp._check()
    wrs = [wr] if isinstance(wr, SendWR) else list(wr)
    ops = qp.init.send_ops_flags
    max_sge = qp.init.cap.max_send_sge
    dev = qp.ctx.dev
    for i, w in enumerate(wrs):
        if not isinstance(w, SendWR):
            raise PostError(
                errno.EINVAL, f"work request {i}: expected a SendWR, got {type(w).__name__}", w, i
            )
        flag = _OP_FLAG.get(w.opcode)
        if flag is None or not ops & flag:
            raise PostError(
                errno.EINVAL, f"work request {i}: opcode {w.opcode!r} not in the QP's send_ops_flags", w, i
            )
        if len(w.sg_list) > max_sge:
            raise PostError(
                errno.EINVAL, f"work request {i}: {len(w.sg_list)} SGEs, cap.max_send_sge is {max_sge}", w, i
            )
        for s in w.sg_list:
            mr = _mr_of(qp, s)
            if mr is None:
                raise PostError(
                    errno.EINVAL, f"work request {i}: lkey 0x{s.lkey:x} is not a region of the QP's PD", w, i
                )
        try:
            dev.post_send(qp.core, w)
        except LocalProtocolError as exc:
            raise PostError(exc.errno, f"work request {i}: {exc.reason}", w, i) from None


def _mr_of(qp: Qp, s: Sge) -> MemoryRegion | None:
    for mr in qp.pd.mrs:
        if mr.lkey == s.lkey:
            return mr
    return None


def post_recv(qp: Qp, wr: RecvWR | Iterable[RecvWR]) -> None:
    """mrc_post_recv of one receive work request or a list (each consumed by one incoming Write with
    Immediate; MRC places the data by the Write's address, so SGEs are optional). Refusals as in
    `post_send`."""
    qp._check()
    wrs = [wr] if isinstance(wr, RecvWR) else list(wr)
    max_sge = qp.init.cap.max_recv_sge
    dev = qp.ctx.dev
    for i, w in enumerate(wrs):
        if not isinstance(w, RecvWR):
            raise PostError(
                errno.EINVAL, f"work request {i}: expected a RecvWR, got {type(w).__name__}", w, i
            )
        if len(w.sg_list) > max_sge:
            raise PostError(
                errno.EINVAL, f"work request {i}: {len(w.sg_list)} SGEs, cap.max_recv_sge is {max_sge}", w, i
            )
        try:
            dev.post_recv(qp.core, w)
        except LocalProtocolError as exc:
            raise PostError(exc.errno, f"work request {i}: {exc.reason}", w, i) from None


# -- asynchronous events -------------------------------------------------------------------------------------
def _scan(ctx: Context) -> None:
    """Queue the events that happened since the last look: QPs the transport moved to ERROR, CQs that
    overran, ports that went down or up."""
    dev = ctx.dev
    with dev.lock:
        for qp in ctx.qps:
            if qp.core.state is QpState.ERROR and not qp.user_error and not qp.error_reported:
                qp.error_reported = True
                ctx._events.append(AsyncEvent(AsyncEventType.QP_FATAL, qp, ctx))
        for cq in ctx.cqs:
            if cq.core.overrun and not cq.overrun_reported:
                cq.overrun_reported = True
                ctx._events.append(AsyncEvent(AsyncEventType.CQ_ERR, cq, ctx))
        up = dev.nic.ports_up
        for port in range(1, len(up)):
            if up[port] != ctx._ports_seen[port]:
                ctx._ports_seen[port] = up[port]
                kind = AsyncEventType.PORT_ACTIVE if up[port] else AsyncEventType.PORT_ERR
                ctx._events.append(AsyncEvent(kind, port, ctx))


def get_async_event(ctx: Context, timeout: float | None = None) -> AsyncEvent:
    """mrc_get_async_event: the next event (a QP the transport failed: QP_FATAL; a CQ overrun: CQ_ERR;
    a port down or up: PORT_ERR / PORT_ACTIVE), waiting up to ``timeout`` seconds (None: until one comes;
    EAGAIN when the time is up). Each must be acknowledged with `ack_async_event`."""
    ctx._check()
    end = None if timeout is None else time.monotonic() + max(0.0, timeout)
    while True:
        _scan(ctx)
        if ctx._events:
            ev = ctx._events.popleft()
            ctx._unacked[id(ev)] = ev
            return ev
        left = None if end is None else end - time.monotonic()
        if left is not None and left <= 0:
            raise VerbsError(errno.EAGAIN, "no async event within the timeout")
        step = 0.01 if left is None else min(left, 0.01)
        if ctx.dev.threaded:
            time.sleep(step)
        else:
            ctx.dev.progress(step)


def ack_async_event(event: AsyncEvent) -> None:
    """mrc_ack_async_event (EINVAL for an event not handed out, or acknowledged already)."""
    if not isinstance(event, AsyncEvent) or event.context._unacked.pop(id(event), None) is not event:
        raise VerbsError(errno.EINVAL, "the event was not handed out by get_async_event, or is acknowledged")
