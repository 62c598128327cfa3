"""MRC 1.0 wire format: headers, packets, ICRC, IP/UDP/SRv6 framing and pcap files."""

from openmrc.wire.buffer import Buffer, WireError
from openmrc.wire.constants import (
    DATA_OPCODES,
    IMM_OPCODES,
    MRC_UDP_PORT,
    PSN_MASK,
    QPN_MASK,
    RESERVED_QP_ENDPOINT,
    AethSyndrome,
    EpOp,
    NackReason,
    Opcode,
    SackM,
)
from openmrc.wire.datagram import (
    Addressing,
    datagram_icrc,
    icrc_ok,
    seal,
    seal_header_parts,
    seal_parts,
    trim_datagram,
)
from openmrc.wire.framing import Frame, SRv6Encap, encapsulate, parse_frame, usid_final_address
from openmrc.wire.headers import AETH, BTH, EETH, ERTH, METH, NETH, PETH, RETH, SETH, TSETH, CcState, ImmDt
from openmrc.wire.icrc import compute_icrc
from openmrc.wire.packet import DataTemplate, Packet, parse

__all__ = [
    "AETH",
    "BTH",
    "DATA_OPCODES",
    "EETH",
    "ERTH",
    "IMM_OPCODES",
    "METH",
    "MRC_UDP_PORT",
    "NETH",
    "PETH",
    "PSN_MASK",
    "QPN_MASK",
    "RESERVED_QP_ENDPOINT",
    "RETH",
    "SETH",
    "TSETH",
    "Addressing",
    "AethSyndrome",
    "Buffer",
    "CcState",
    "DataTemplate",
    "EpOp",
    "Frame",
    "ImmDt",
    "NackReason",
    "Opcode",
    "Packet",
    "SRv6Encap",
    "SackM",
    "WireError",
    "compute_icrc",
    "datagram_icrc",
    "encapsulate",
    "icrc_ok",
    "parse",
    "parse_frame",
    "seal",
    "seal_header_parts",
    "seal_parts",
    "trim_datagram",
    "usid_final_address",
]
