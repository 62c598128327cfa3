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

The package follows mrc.h's sections: `device` (device list, open/close, API versions, device queries,
MRC contexts), `pd` (protection domains, memory registration), `cq` (completion channels, CQs), `qp` (QPs
and QP hints: create, modify, query, destroy, post), `qp_attr` (the attribute records and masks, and the
attributes each QP transition takes, derived from the transport's state machine) and `events` (async
events); every name is also here, as ``openmrc.verbs.X``.
"""

from __future__ import annotations

from openmrc.transport import (
    Access,
    MemoryRegion,
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
from openmrc.transport import CompletionQueue as CompletionQueue
from openmrc.transport import LocalProtocolError as LocalProtocolError
from openmrc.transport import Nic as Nic
from openmrc.transport import Qp as CoreQp  # noqa: F401 (names the flat module had)
from openmrc.transport import QpInitAttr as CoreQpInitAttr  # noqa: F401
from openmrc.verbs._errors import PostError, VerbsError
from openmrc.verbs.cq import MAX_CQE as MAX_CQE
from openmrc.verbs.cq import (
    CompChannel,
    Cq,
    ack_cq_events,
    create_comp_channel,
    create_cq,
    destroy_comp_channel,
    destroy_cq,
    get_comp_channel_fd,
    get_cq_event,
    poll_cq,
    req_notify_cq,
)
from openmrc.verbs.device import (
    API_CURRENT_VERSION,
    API_LAST_SUPPORTED_VERSION,
    VENDOR_API_CURRENT_VERSION,
    VENDOR_API_LAST_SUPPORTED_VERSION,
    ApiVersions,
    Context,
    Device,
    DeviceAttr,
    DeviceCap,
    ProtocolVersion,
    VerbsDevice,
    add_device,
    api_ver,
    close_device,
    create_context,
    destroy_context,
    get_device_list,
    open_device,
    query_device,
    query_device_ex,
    query_version,
    remove_device,
)
from openmrc.verbs.device import MAX_QP_HINTS as MAX_QP_HINTS
from openmrc.verbs.events import AsyncEvent, AsyncEventType, ack_async_event, get_async_event
from openmrc.verbs.pd import ProtectionDomain, alloc_pd, dealloc_pd, dereg_mr, reg_mr
from openmrc.verbs.qp import MAX_WR as MAX_WR
from openmrc.verbs.qp import (
    Qp,
    QpCap,
    QpHint,
    QpHintAttr,
    QpHintAttrMask,
    QpInitAttr,
    QpQuery,
    SendOpsFlags,
    create_qp,
    create_qp_hint,
    destroy_qp,
    destroy_qp_hint,
    get_qpn,
    get_security_domain,
    modify_qp,
    modify_qp_hint,
    post_recv,
    post_send,
    query_qp,
    query_qp_hint,
)
from openmrc.verbs.qp_attr import MAX_VENDOR_CFG_SIZE, MrcQpAttr, MrcQpAttrMask, QpAttr, QpAttrMask

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
