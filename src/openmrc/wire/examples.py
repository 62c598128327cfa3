"""A short example MRC conversation, framed for captures (`openmrc pcap`) and used by the decode tests.

Every kind of packet appears once or more: Write Only, Write First/Middle/Last-with-Imm, Write Only with
Imm and a TSETH, SACK, NACK TRIMMED, ACK, reliability probe, and endpoint request/response (EV probe and
port status update), over IPv4, IPv6 and SRv6 (outer IPv6 with an SRH, IPv6-in-IPv6).
"""

from __future__ import annotations

from dataclasses import dataclass

from openmrc.wire.constants import RESERVED_QP_ENDPOINT, AethSyndrome, EpOp, NackReason, Opcode, SackM
from openmrc.wire.framing import SRv6Encap, encapsulate
from openmrc.wire.headers import AETH, BTH, EETH, ERTH, METH, NETH, PETH, RETH, SETH, TSETH, CcState, ImmDt
from openmrc.wire.packet import Packet

__all__ = ["ExampleFrame", "example_conversation"]

_A4, _B4 = "192.0.2.1", "192.0.2.2"
_A6, _B6 = "2001:db8::a", "2001:db8::b"
#: SRv6 outer addresses: locator fc00:0::/32 followed by 16-bit uSIDs (T0 uplink, T1, T0, host port).
_SRV6_FWD = SRv6Encap("fc00:0:a::", "fc00:0:101:201:301:401::", ("fc00:0:b00::",))
_SRV6_REV = SRv6Encap("fc00:0:b::", "fc00:0:102:202:302:402::", ("fc00:0:a00::",))
_QP_A, _QP_B = 0x000123, 0x000456
_VA, _RKEY = 0x7F00_0000_1000, 0x5EED_CAFE


@dataclass(frozen=True, slots=True)
class ExampleFrame:
    """One frame of the example conversation with the packet it carries."""

    ts_ns: int
    description: str
    packet: Packet
    frame: bytes  # Ethernet frame, ICRC and checksums filled in
    src: str
    dst: str
    sport: int
    srv6: SRv6Encap | None


def _data(
    op: Opcode,
    qp: int,
    psn: int,
    msn: int,
    off: int,
    total: int,
    payload: bytes,
    *,
    rqmsn: int = 0,
    imm: int | None = None,
    ts: int | None = None,
    rtx: bool = False,
    ack: bool = False,
) -> Packet:
    return Packet(
        BTH(op, dest_qp=qp, psn=psn, ack_req=ack, rtx=rtx, ts=ts is not None),
        meth=METH(rqmsn, msn),
        tseth=TSETH(ts, 0, 0) if ts is not None else None,
        reth=RETH(_VA + off, _RKEY, total),
        imm=ImmDt(imm) if imm is not None else None,
        payload=memoryview(payload),
    )


def _sack(
    qp: int,
    psn: int,
    cack: int,
    entropy: int,
    *,
    m: SackM = SackM.NONE,
    bitmap: int = 0,
    sack_offset: int = 0,
    rcvd: int = 0,
    ts_echo: int = 0,
) -> Packet:
    return Packet(
        BTH(Opcode.SACK, dest_qp=qp, psn=psn),
        seth=SETH(
            m=m,
            entropy=entropy,
            src_qp=_QP_B & 0xFFFF,
            dst_qp=_QP_A & 0xFFFF,
            cack_psn=cack,
            ack_psn_offset=psn - cack,
            cc_type=1,
            mpr=8,
            sack_offset=sack_offset,
            bitmap=bitmap,
        ),
        cc_state=CcState(ts_echo=ts_echo, ooo_count=bitmap.bit_count(), rcv_cwnd_pen=0, rcvd_256b=rcvd),
    )


def example_conversation() -> list[ExampleFrame]:
    """The example frames in time order (1 µs apart)."""
    body = bytes(range(256)) * 16  # 4 KiB
    pkts: list[tuple[str, Packet, str, str, int, SRv6Encap | None]] = []

    def add(desc: str, pkt: Packet, fwd: bool, family: str, sport: int) -> None:
        if family == "4":
            src, dst, srv6 = (_A4, _B4, None) if fwd else (_B4, _A4, None)
        else:
            src, dst = (_A6, _B6) if fwd else (_B6, _A6)
            srv6 = (_SRV6_FWD if fwd else _SRV6_REV) if family == "srv6" else None
        pkts.append((desc, pkt, src, dst, sport, srv6))

    add(
        "Write Only, 64 B",
        _data(Opcode.WRITE_ONLY, _QP_B, 100, 1, 0, 64, body[:64], ack=True),
        True,
        "4",
        0xC001,
    )
    add("SACK for PSN 100", _sack(_QP_A, 100, 101, 0xC001, rcvd=1, ts_echo=0), False, "4", 0xC001)
    add("Write First", _data(Opcode.WRITE_FIRST, _QP_B, 101, 2, 0, 9000, body), True, "6", 0xC002)
    add(
        "Write Middle (retransmission)",
        _data(Opcode.WRITE_MIDDLE, _QP_B, 102, 2, 4096, 9000, body, rtx=True),
        True,
        "6",
        0xC003,
    )
    add(
        "Write Last with Imm",
        _data(
            Opcode.WRITE_LAST_WITH_IMM,
            _QP_B,
            103,
            2,
            8192,
            9000,
            body[:808],
            rqmsn=1,
            imm=0xFEEDF00D,
            ack=True,
        ),
        True,
        "6",
        0xC004,
    )
    add(
        "NACK TRIMMED for PSN 102",
        Packet(
            BTH(Opcode.NACK, dest_qp=_QP_A, psn=102),
            neth=NETH(
                reason=NackReason.TRIMMED,
                entropy=0xC003,
                src_qp=_QP_B & 0xFFFF,
                dst_qp=_QP_A & 0xFFFF,
                psn=102,
                cc_type=1,
                ts_echo=0x1234,
            ),
        ),
        False,
        "6",
        0xC003,
    )
    add(
        "SACK, ECN echo, hole at 102",
        _sack(_QP_A, 103, 102, 0xC004, m=SackM.SKIP_ONCE, bitmap=0b10, sack_offset=0, rcvd=52),
        False,
        "6",
        0xC004,
    )
    add(
        "Reliability probe",
        Packet(
            BTH(Opcode.PROBE, dest_qp=_QP_B, psn=104),
            peth=PETH(probe_id=7, src_qp=_QP_A & 0xFFFF, dst_qp=_QP_B & 0xFFFF, tx_timestamp=0x0200),
        ),
        True,
        "srv6",
        0xC005,
    )
    add(
        "Write Only with Imm + TSETH over SRv6",
        _data(
            Opcode.WRITE_ONLY_WITH_IMM, _QP_B, 104, 3, 0, 100, body[:100], rqmsn=2, imm=0xABCD0123, ts=0x0A0B
        ),
        True,
        "srv6",
        0xC006,
    )
    add(
        "ACK",
        Packet(BTH(Opcode.ACK, dest_qp=_QP_A, psn=104), aeth=AETH(AethSyndrome.ACK, 3)),
        False,
        "srv6",
        0xC006,
    )
    add(
        "EP request: EV probe",
        Packet(
            BTH(Opcode.EP_REQUEST, dest_qp=RESERVED_QP_ENDPOINT, psn=0x0042),
            erth=ERTH(op=EpOp.EV_PROBE, port_status=0xFF, tx_timestamp=0x0300),
        ),
        True,
        "srv6",
        0xC007,
    )
    add(
        "EP response: EV probe",
        Packet(
            BTH(Opcode.EP_RESPONSE, dest_qp=RESERVED_QP_ENDPOINT, psn=0x0042),
            eeth=EETH(op=EpOp.EV_PROBE, service_time=850, port_status=0xFF, rx_port=3, ts_echo=0x0300),
        ),
        False,
        "srv6",
        0xC007,
    )
    add(
        "EP request: port status update (port 5 down)",
        Packet(
            BTH(Opcode.EP_REQUEST, dest_qp=RESERVED_QP_ENDPOINT, psn=0x0043),
            erth=ERTH(op=EpOp.PORT_STATUS_UPDATE, port_status=0xEF, tx_timestamp=0x0310),
        ),
        True,
        "4",
        0xC008,
    )
    out = []
    for i, (desc, pkt, src, dst, sport, srv6) in enumerate(pkts):
        frame = encapsulate(pkt, src=src, dst=dst, sport=sport, srv6=srv6, ether=True)
        pkt.icrc = int.from_bytes(frame[-4:], "little")
        out.append(ExampleFrame(1_000 * (i + 1), desc, pkt, frame, src, dst, sport, srv6))
    return out
