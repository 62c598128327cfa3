"""Devices and MRC contexts: the device list (`add_device`, `get_device_list`), `open_device` /
`close_device`, the API versions (`api_ver`, `query_version`), `query_device`, and `create_context`, the
parent of a program's MRC objects on one device."""

from __future__ import annotations

import errno
import threading
from collections import deque
from contextlib import AbstractContextManager
from dataclasses import dataclass
from enum import IntFlag
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from openmrc.transport import Access, CompletionQueue, MemoryRegion, Nic, RecvWR, SendWR
from openmrc.transport import Qp as CoreQp
from openmrc.transport import QpInitAttr as CoreQpInitAttr
from openmrc.verbs._errors import VerbsError

if TYPE_CHECKING:
    from openmrc.verbs.cq import CompChannel, Cq
    from openmrc.verbs.events import AsyncEvent
    from openmrc.verbs.pd import ProtectionDomain
    from openmrc.verbs.qp import Qp, QpHint


def api_ver(major: int, minor: int, sub_minor: int) -> int:
    """An API version as mrc_api_ver.h encodes it: major in bits 31..24, minor 23..16, sub-minor 15..0."""
    if not (0 <= major <= 0xFF and 0 <= minor <= 0xFF and 0 <= sub_minor <= 0xFFFF):
        raise VerbsError(errno.EINVAL, f"API version {major}.{minor}.{sub_minor} out of range")
    return major << 24 | minor << 16 | sub_minor


def _ver_text(v: int) -> str:
    return f"{v >> 24}.{(v >> 16) & 0xFF}.{v & 0xFFFF}"


API_CURRENT_VERSION = 1 << 24 | 0 << 16 | 1
"""The mrc.h API version openmrc.verbs implements (1.0.1: `query_device_ex`)."""
API_LAST_SUPPORTED_VERSION = 1 << 24
"""The oldest API version it still serves (1.0.0)."""
VENDOR_API_CURRENT_VERSION = 1 << 24
"""openmrc's provider (vendor) API version."""
VENDOR_API_LAST_SUPPORTED_VERSION = 1 << 24


# -- versions, capabilities and attributes ------------------------------------------------------------------
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
