"""MRC 1.0 code points: opcodes, NACK reasons, SACK M values, AETH syndromes, endpoint operations."""

from __future__ import annotations

from enum import IntEnum
from typing import Final

__all__ = [
    "DATA_OPCODES",
    "IMM_OPCODES",
    "MRC_OPCODE_RANGE",
    "MRC_UDP_PORT",
    "PSN_MASK",
    "QPN_MASK",
    "RESERVED_QP_ENDPOINT",
    "AethSyndrome",
    "EpOp",
    "NackReason",
    "Opcode",
    "SackM",
    "is_data_opcode",
]

#: UDP destination port. Sources disagree (4791, the RoCEv2 port, or 4971); openmrc defaults to 4791.
MRC_UDP_PORT: Final = 4791

PSN_MASK: Final = 0xFFFFFF
QPN_MASK: Final = 0xFFFFFF

#: Endpoint requests and responses (EV probes, port status updates) go to this reserved QP number.
RESERVED_QP_ENDPOINT: Final = 0x2

#: Opcodes 0xC0..0xDF form MRC's own range; any value there not listed in `Opcode` is reserved.
MRC_OPCODE_RANGE: Final = range(0xC0, 0xE0)


# The opcode values as plain constants too: compiled, a literal constant is inlined where an enum member is
# looked up. The data opcodes are contiguous, OP_WRITE_FIRST ... OP_WRITE_ONLY_WITH_IMM.
OP_WRITE_FIRST: Final = 0xC6
OP_WRITE_MIDDLE: Final = 0xC7
OP_WRITE_LAST: Final = 0xC8
OP_WRITE_LAST_WITH_IMM: Final = 0xC9
OP_WRITE_ONLY: Final = 0xCA
OP_WRITE_ONLY_WITH_IMM: Final = 0xCB
OP_ACK: Final = 0xD1
OP_EP_REQUEST: Final = 0xD8
OP_EP_RESPONSE: Final = 0xD9
OP_SACK: Final = 0xDC
OP_NACK: Final = 0xDD
OP_PROBE: Final = 0xDE


class Opcode(IntEnum):
    """BTH opcodes of MRC 1.0 (not interoperable with RoCE RC opcodes)."""

    WRITE_FIRST = OP_WRITE_FIRST
    WRITE_MIDDLE = OP_WRITE_MIDDLE
    WRITE_LAST = OP_WRITE_LAST
    WRITE_LAST_WITH_IMM = OP_WRITE_LAST_WITH_IMM
    WRITE_ONLY = OP_WRITE_ONLY
    WRITE_ONLY_WITH_IMM = OP_WRITE_ONLY_WITH_IMM
    ACK = OP_ACK
    EP_REQUEST = OP_EP_REQUEST
    EP_RESPONSE = OP_EP_RESPONSE
    SACK = OP_SACK
    NACK = OP_NACK
    PROBE = OP_PROBE


DATA_OPCODES: Final = frozenset(
    {
        Opcode.WRITE_FIRST,
        Opcode.WRITE_MIDDLE,
        Opcode.WRITE_LAST,
        Opcode.WRITE_LAST_WITH_IMM,
        Opcode.WRITE_ONLY,
        Opcode.WRITE_ONLY_WITH_IMM,
    }
)
IMM_OPCODES: Final = frozenset({Opcode.WRITE_LAST_WITH_IMM, Opcode.WRITE_ONLY_WITH_IMM})


def is_data_opcode(op: int) -> bool:
    """``op in DATA_OPCODES`` as one range test (the data opcodes are contiguous), for per-packet paths."""
    return OP_WRITE_FIRST <= op <= OP_WRITE_ONLY_WITH_IMM


class NackReason(IntEnum):
    """NETH reason codes. Every reason but UNEXP_EVENT is retriable and counts against the retry counter."""

    TRIMMED = 0x01
    TRIMMED_LASTHOP = 0x02
    NO_BITMAP = 0x06
    NO_PKT_BUFFER = 0x07
    NO_RESOURCE = 0x0A
    PSN_OOR_WINDOW = 0x0B
    UNEXP_EVENT = 0x19


class SackM(IntEnum):
    """The 2-bit M field of SETH: what the responder says about the path of the triggering packet."""

    NONE = 0
    SKIP_ONCE = 1  # the triggering packet arrived ECN-marked
    ALWAYS_SKIP = 2  # the responder judges the path persistently bad


class AethSyndrome(IntEnum):
    """AETH syndrome values, as in RoCE (high three bits: 000 ACK, 011 NAK)."""

    ACK = 0x00
    NAK_PSN_SEQUENCE_ERROR = 0x60
    NAK_INVALID_REQUEST = 0x61
    NAK_REMOTE_ACCESS_ERROR = 0x62
    NAK_REMOTE_OPERATIONAL_ERROR = 0x63


class EpOp(IntEnum):
    """Endpoint operation carried in ERTH/EETH (2 bits)."""

    PORT_STATUS_UPDATE = 0
    EV_PROBE = 1
