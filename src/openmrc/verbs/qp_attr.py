"""The attributes of `modify_qp` and `query_qp`: the ibverbs and MRC mask bits, the records they name
(`QpAttr`, `MrcQpAttr`), and which bits each QP transition requires and allows.

Theory of operation. The transport's `openmrc.transport.qp.TRANSITIONS` is the one QP state machine: for
each legal (from, to) pair, the transport attributes required and those allowed. `ATTR_BITS` maps each
transport attribute to the mask bit that carries it in mrc.h and the field it is in (``retry_linear`` is
``linear_cnt`` under RETRY_CNT); `_MRC_H` adds what mrc.h asks on top of the transport, each addition tied
to a transport attribute, so that it follows wherever the table takes that attribute: a QP hint with the
profiles, the requester's window already at RTR, and the ibverbs attributes the transport never sees
(ACCESS_FLAGS, PKEY_INDEX, PATH_MTU) and VENDOR_CFG. `RULES` is derived from the two at import: a rule
added to ``TRANSITIONS`` reaches `modify_qp` with no edit here. Moving to ERROR or RESET takes nothing,
from any state, because the table says so (mrc.h's additions follow only transitions that take
attributes). Values are checked against the transport's `openmrc.transport.qp.ATTR_RANGES`, named by
their mrc.h field.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from enum import IntFlag
from typing import TYPE_CHECKING, Final

from openmrc.transport import Access, QpCapFlags, QpSecurity, QpState
from openmrc.transport.qp import TRANSITIONS

if TYPE_CHECKING:
    from openmrc.verbs.qp import QpHint

MAX_VENDOR_CFG_SIZE = 128
"""mrc.h's bound on ``vendor_cfg``, in bytes."""


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


AttrBit = QpAttrMask | MrcQpAttrMask

#: Each transport attribute (a field of `openmrc.transport.QpAttr`, as `TRANSITIONS` names it): the mask bit
#: that carries it in `modify_qp` / `query_qp`, and the field of `QpAttr` / `MrcQpAttr` it is in.
ATTR_BITS: Final[dict[str, tuple[AttrBit, str]]] = {
    "peer": (QpAttrMask.AV, "ah_attr"),
    "dest_qp_num": (QpAttrMask.DEST_QPN, "dest_qp_num"),
    "rq_psn": (QpAttrMask.RQ_PSN, "rq_psn"),
    "sq_psn": (QpAttrMask.SQ_PSN, "sq_psn"),
    "mpr": (MrcQpAttrMask.MPR, "mpr"),
    "mpr_dest": (MrcQpAttrMask.MPR_DEST, "mpr_dest"),
    "max_wimm": (MrcQpAttrMask.MAX_WIMM, "max_wimm"),
    "max_wimm_dest": (MrcQpAttrMask.MAX_WIMM_DEST, "max_wimm_dest"),
    "timeout": (MrcQpAttrMask.TIMEOUT, "timeout"),
    "ev_profile_id": (MrcQpAttrMask.EV_PROFILE_ID, "ev_profile_id"),
    "cc_profile_id": (MrcQpAttrMask.CC_PROFILE_ID, "cc_profile_id"),
    "retry_linear": (MrcQpAttrMask.RETRY_CNT, "linear_cnt"),
    "retry_exp": (MrcQpAttrMask.RETRY_CNT, "exp_cnt"),
    "qp_hint": (MrcQpAttrMask.HINT, "qp_hint"),
    "cap": (MrcQpAttrMask.CAP, "cap"),
    "security": (MrcQpAttrMask.SECURITY, "security"),
}

#: The attributes only mrc.h has (the transport never sees them), with the bit that names each.
OWN_FIELDS: Final[tuple[tuple[AttrBit, str], ...]] = (
    (QpAttrMask.PKEY_INDEX, "pkey_index"),
    (QpAttrMask.PATH_MTU, "path_mtu"),
    (QpAttrMask.ACCESS_FLAGS, "qp_access_flags"),
    (MrcQpAttrMask.VENDOR_CFG, "vendor_cfg"),
)

_ANY: Final = "*"
"""In `_MRC_H`: every transition that takes attributes at all."""
_WITH: Final = "required with"
"""In `_MRC_H`: the bit is required where the attribute is, allowed where it is allowed."""
_ALONG: Final = "allowed with"
"""In `_MRC_H`: the bit is allowed wherever the attribute is taken."""

#: What mrc.h asks on top of the transport's table: (transport attribute or _ANY, bit, _WITH or _ALONG).
_MRC_H: Final[tuple[tuple[str, AttrBit, str], ...]] = (
    # INIT binds a QP hint (None: none) with the profiles: EV_PROFILE_ID, CC_PROFILE_ID and HINT
    ("ev_profile_id", MrcQpAttrMask.HINT, _WITH),
    # RTR may carry the requester's MPR and WIMM too (the OCP example does); the transport takes them at RTS
    ("mpr_dest", MrcQpAttrMask.MPR, _ALONG),
    ("max_wimm_dest", MrcQpAttrMask.MAX_WIMM, _ALONG),
    ("peer", QpAttrMask.PATH_MTU, _ALONG),  # a property of the path, given with it
    ("security", QpAttrMask.PKEY_INDEX, _ALONG),  # the partition, set where the QP's domain is
    (_ANY, QpAttrMask.ACCESS_FLAGS, _ALONG),
    (_ANY, MrcQpAttrMask.VENDOR_CFG, _ALONG),
)

Rule = tuple[int, int, int, int]
"""What a transition takes: (verbs required, verbs optional, MRC required, MRC optional) mask bits."""


def _derive(required: frozenset[str], optional: frozenset[str]) -> Rule:
    """The mask bits of a transition that takes the transport attributes ``required`` and ``optional``."""
    req = {QpAttrMask: 0, MrcQpAttrMask: 0}
    opt = {QpAttrMask: 0, MrcQpAttrMask: 0}
    for names, into in ((required, req), (optional, opt)):
        for name in names:
            bit = ATTR_BITS[name][0]
            into[type(bit)] |= bit
    for anchor, bit, how in _MRC_H:
        if anchor == _ANY:
            if required or optional:
                opt[type(bit)] |= bit
        elif anchor in required:
            (req if how == _WITH else opt)[type(bit)] |= bit
        elif anchor in optional:
            opt[type(bit)] |= bit
    v, m = QpAttrMask, MrcQpAttrMask
    return req[v], opt[v] & ~req[v], req[m], opt[m] & ~req[m]


#: (from, to) -> the mask bits `modify_qp` requires and allows, derived from `TRANSITIONS` (absent: illegal).
RULES: Final[dict[tuple[QpState, QpState], Rule]] = {
    pair: _derive(required, optional) for pair, (required, optional) in TRANSITIONS.items()
}
