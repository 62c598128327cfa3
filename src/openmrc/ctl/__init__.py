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

The package follows the header's sections, one module each: `records` (limits, enums, attribute records,
`CtlError`), `machine` (the profile state machine, one table for the three kinds), `device` (versions,
device and port queries), `format_profiles`, `ev_profiles`, `ev_ops` (EV operations), `cc_profiles`,
`store` (publishing to the node-local profile store), `events` (EV event queues), `endpoint` (endpoint
requests), `security` (security domains). ``_state`` holds the controller's record of a device, which
lives on the device's NIC and goes with it, and the privilege check. Every name is importable from
`openmrc.ctl` itself.
"""

from __future__ import annotations

import os  # noqa: F401  (tests patch ctl.os.geteuid)

from openmrc.ctl._state import grant
from openmrc.ctl.cc_profiles import modify_cc_profile, query_cc_profile
from openmrc.ctl.device import modify_port, query_device, query_device_ex, query_port, query_version
from openmrc.ctl.endpoint import ep_batch_send_wait
from openmrc.ctl.ev_profiles import modify_ev_profile, query_ev_profile
from openmrc.ctl.events import EvEventCq, create_ev_event_cq, poll_ev_event
from openmrc.ctl.format_profiles import modify_ev_fmt_profile, query_ev_fmt_profile
from openmrc.ctl.records import (
    CTL_API_CURRENT_VERSION,
    CTL_API_LAST_SUPPORTED_VERSION,
    EV_UNPOPULATED,
    CcProfileAttr,
    CcProfileAttrMask,
    CtlAttrOpt,
    CtlDeviceAttr,
    CtlError,
    EpOpType,
    EpReq,
    EpRsp,
    Ev,
    EvFieldsOp,
    EvFmtOp,
    EvFmtProfileAttr,
    EvFmtProfileAttrMask,
    EvOp,
    EvOpEntry,
    EvOpFlags,
    EvProfileAttr,
    EvProfileAttrMask,
    PortAdminState,
    PortAttr,
    PortAttrMask,
    ProfileState,
)
from openmrc.ctl.records import (
    CTL_VENDOR_API_VERSION as CTL_VENDOR_API_VERSION,
)
from openmrc.ctl.records import (
    EV_MAX_BYTES as EV_MAX_BYTES,
)
from openmrc.ctl.records import (
    MAX_CC_PROFILES as MAX_CC_PROFILES,
)
from openmrc.ctl.records import (
    MAX_EV_PROFILES as MAX_EV_PROFILES,
)
from openmrc.ctl.records import (
    MAX_EVS as MAX_EVS,
)
from openmrc.ctl.records import (
    MAX_EVS_PER_PROFILE as MAX_EVS_PER_PROFILE,
)
from openmrc.ctl.records import (
    MAX_FMT_PROFILES as MAX_FMT_PROFILES,
)
from openmrc.ctl.records import (
    MAX_VENDOR_CFG_SIZE as MAX_VENDOR_CFG_SIZE,
)
from openmrc.ctl.records import (
    CtlEvEvent as CtlEvEvent,
)
from openmrc.ctl.security import (
    SecurityDomainAttr,
    create_security_domain,
    destroy_security_domain,
    query_security_domain,
    revoke_security_domain,
    rotate_security_domain,
    secure_endpoint,
)
from openmrc.ctl.store import attach_store
from openmrc.ev import EVState

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
