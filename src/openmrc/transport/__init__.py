"""The sans-IO MRC transport core: NIC, QPs, EV tables, reliability and congestion control."""

from openmrc.transport.cc import CongestionControl, cc_algorithms, create_cc, register_cc
from openmrc.transport.config import NicConfig
from openmrc.transport.cq import CompletionQueue
from openmrc.transport.endpoint import Endpoint, EpResponse
from openmrc.transport.evtable import EvEntry, EvEvent, EvStatus, EvTable
from openmrc.transport.mr import MemoryRegion
from openmrc.transport.nic import Arrival, Nic
from openmrc.transport.nscc import Nscc, NsccConfig
from openmrc.transport.profiles import EvProfileBinding, ProfileTable
from openmrc.transport.qp import TRANSITIONS, Qp, QpAttr, QpInitAttr
from openmrc.transport.security import KeyFileWarning, QpSecurity, SealState, SecurityDomain
from openmrc.transport.stats import NicStats
from openmrc.transport.types import (
    Access,
    AckTimeoutWarning,
    LocalProtocolError,
    QpCapFlags,
    QpState,
    RecvWR,
    SackTransmit,
    SendFlags,
    SendWR,
    Sge,
    Transmit,
    TrimMark,
    WcOpcode,
    WcStatus,
    WorkCompletion,
    WrOpcode,
    psn_diff,
    unwrap_psn,
)

__all__ = [
    "TRANSITIONS",
    "Access",
    "AckTimeoutWarning",
    "Arrival",
    "CompletionQueue",
    "CongestionControl",
    "Endpoint",
    "EpResponse",
    "EvEntry",
    "EvEvent",
    "EvProfileBinding",
    "EvStatus",
    "EvTable",
    "KeyFileWarning",
    "LocalProtocolError",
    "MemoryRegion",
    "Nic",
    "NicConfig",
    "NicStats",
    "Nscc",
    "NsccConfig",
    "ProfileTable",
    "Qp",
    "QpAttr",
    "QpCapFlags",
    "QpInitAttr",
    "QpSecurity",
    "QpState",
    "RecvWR",
    "SackTransmit",
    "SealState",
    "SecurityDomain",
    "SendFlags",
    "SendWR",
    "Sge",
    "Transmit",
    "TrimMark",
    "WcOpcode",
    "WcStatus",
    "WorkCompletion",
    "WrOpcode",
    "cc_algorithms",
    "create_cc",
    "psn_diff",
    "register_cc",
    "unwrap_psn",
]
