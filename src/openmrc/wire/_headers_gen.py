# Generated, do not edit: regenerate with `python -m openmrc.wire._layouts` from the layouts in _layouts.py.
"""The MRC 1.0 header classes, generated from their layouts (`openmrc.wire._layouts`); see
`openmrc.wire.headers`, which re-exports them."""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import ClassVar, Final

from openmrc.wire._header import Header, Spec
from openmrc.wire.buffer import Buffer, WireError
from openmrc.wire.constants import SackM

__all__ = [
    "AETH",
    "BTH",
    "EETH",
    "ERTH",
    "METH",
    "NETH",
    "PETH",
    "RETH",
    "SETH",
    "TSETH",
    "CcState",
    "ImmDt",
    "make_bth",
]


_BTH_ST: Final = struct.Struct("!BBHII")


class _BTHLayout(Header):
    """BTH, 12 bytes: 0 OpCode; 1 SE(7) M(6) Pad(5:4) TVer(3:0); 2-3 P_Key; 4-7 FECN(31) BECN(30)
    DestQP(23:0); 8-11 A(31) RTX(29) TS(28) PSN(23:0)."""

    NAME: ClassVar[str] = "BTH"
    SIZE: ClassVar[int] = 12
    ST: ClassVar[struct.Struct] = _BTH_ST
    SPEC: ClassVar[Spec] = (
        ("opcode", 0, 8, False),
        ("se", 1, 1, False),
        ("m", 1, 1, False),
        ("pad", 1, 2, False),
        ("tver", 1, 4, False),
        ("p_key", 2, 16, False),
        ("fecn", 4, 1, False),
        ("becn", 4, 1, False),
        ("dest_qp", 5, 24, False),
        ("ack_req", 8, 1, False),
        ("rtx", 8, 1, False),
        ("ts", 8, 1, False),
        ("psn", 9, 24, False),
    )


@dataclass(slots=True)
class BTH(_BTHLayout):
    """Base Transport Header (RoCE layout; MRC adds RTX and TS in the byte after DestQP)."""

    opcode: int
    se: bool = False
    m: bool = False
    pad: int = 0
    tver: int = 0
    p_key: int = 0xFFFF
    fecn: bool = False
    becn: bool = False
    dest_qp: int = 0
    ack_req: bool = False
    rtx: bool = False
    ts: bool = False
    psn: int = 0

    def __init__(
        self,
        opcode: int,
        se: bool = False,
        m: bool = False,
        pad: int = 0,
        tver: int = 0,
        p_key: int = 0xFFFF,
        fecn: bool = False,
        becn: bool = False,
        dest_qp: int = 0,
        ack_req: bool = False,
        rtx: bool = False,
        ts: bool = False,
        psn: int = 0,
    ) -> None:
        self.opcode = opcode
        self.se = se
        self.m = m
        self.pad = pad
        self.tver = tver
        self.p_key = p_key
        self.fecn = fecn
        self.becn = becn
        self.dest_qp = dest_qp
        self.ack_req = ack_req
        self.rtx = rtx
        self.ts = ts
        self.psn = psn

    @classmethod
    def pull(cls, buf: Buffer) -> BTH:
        """A BTH parsed from ``buf`` (one unpack)."""
        op, b1, pkey, w4, w8 = buf.pull_struct(_BTH_ST, "BTH", "opcode")
        return BTH(
            op,
            bool(b1 & 0x80),
            bool(b1 & 0x40),
            (b1 >> 4) & 3,
            b1 & 0xF,
            pkey,
            bool(w4 & 0x80000000),
            bool(w4 & 0x40000000),
            w4 & 0xFFFFFF,
            bool(w8 & 0x80000000),
            bool(w8 & 0x20000000),
            bool(w8 & 0x10000000),
            w8 & 0xFFFFFF,
        )

    @classmethod
    def from_words(cls, op: int, b1: int, pkey: int, w4: int, w8: int) -> BTH:
        """Build from the values `ST` unpacks to."""
        return BTH(
            op,
            bool(b1 & 0x80),
            bool(b1 & 0x40),
            (b1 >> 4) & 3,
            b1 & 0xF,
            pkey,
            bool(w4 & 0x80000000),
            bool(w4 & 0x40000000),
            w4 & 0xFFFFFF,
            bool(w8 & 0x80000000),
            bool(w8 & 0x20000000),
            bool(w8 & 0x10000000),
            w8 & 0xFFFFFF,
        )

    def out_of_range(self) -> int:
        """Non-zero when a field does not fit its width (`range_test`, written out)."""
        return (
            self.opcode >> 8
            | self.se >> 1
            | self.m >> 1
            | self.pad >> 2
            | self.tver >> 4
            | self.p_key >> 16
            | self.fecn >> 1
            | self.becn >> 1
            | self.dest_qp >> 24
            | self.ack_req >> 1
            | self.rtx >> 1
            | self.ts >> 1
            | self.psn >> 24
        )

    def unchecked_words(self) -> tuple[int, int, int, int, int]:
        """The values of `ST`, unchecked (the caller has range-tested)."""
        return (
            self.opcode,
            (self.se << 7) | (self.m << 6) | (self.pad << 4) | self.tver,
            self.p_key,
            (self.fecn << 31) | (self.becn << 30) | self.dest_qp,
            (self.ack_req << 31) | (self.rtx << 29) | (self.ts << 28) | self.psn,
        )

    def words(self, base: int = 0) -> tuple[int, int, int, int, int]:
        """The values of `ST`, range-checked (``base``: BTH's offset, for error messages)."""
        self.validate(base)
        return self.unchecked_words()

    def push(self, buf: Buffer) -> None:
        """Append this BTH, range-checked, its reserved bits zero."""
        self.validate(len(buf))
        buf.push_struct(
            _BTH_ST,
            self.opcode,
            (self.se << 7) | (self.m << 6) | (self.pad << 4) | self.tver,
            self.p_key,
            (self.fecn << 31) | (self.becn << 30) | self.dest_qp,
            (self.ack_req << 31) | (self.rtx << 29) | (self.ts << 28) | self.psn,
        )


def make_bth(opcode: int, dest_qp: int, ack_req: bool, rtx: bool, psn: int) -> BTH:
    """``BTH(opcode, dest_qp=dest_qp, ack_req=ack_req, rtx=rtx, psn=psn)``, every other field at its default,
    without keyword handling (the core builds one per packet)."""
    return BTH(opcode, False, False, 0, 0, 0xFFFF, False, False, dest_qp, ack_req, rtx, False, psn)


_METH_ST: Final = struct.Struct("!HH")


class _METHLayout(Header):
    """METH, 4 bytes: 0-1 RQMSN; 2-3 MSN."""

    NAME: ClassVar[str] = "METH"
    SIZE: ClassVar[int] = 4
    ST: ClassVar[struct.Struct] = _METH_ST
    SPEC: ClassVar[Spec] = (("rqmsn", 0, 16, False), ("msn", 2, 16, False))


@dataclass(slots=True)
class METH(_METHLayout):
    """MRC Extended Transport Header: message sequence numbers, in every request packet."""

    rqmsn: int = 0
    msn: int = 0

    def __init__(self, rqmsn: int = 0, msn: int = 0) -> None:
        self.rqmsn = rqmsn
        self.msn = msn

    @classmethod
    def pull(cls, buf: Buffer) -> METH:
        """A METH parsed from ``buf`` (one unpack)."""
        rqmsn, msn = buf.pull_struct(_METH_ST, "METH", "rqmsn")
        return METH(rqmsn, msn)

    def out_of_range(self) -> int:
        """Non-zero when a field does not fit its width (`range_test`, written out)."""
        return self.rqmsn >> 16 | self.msn >> 16

    def push(self, buf: Buffer) -> None:
        """Append this METH, range-checked, its reserved bits zero."""
        self.validate(len(buf))
        buf.push_struct(_METH_ST, self.rqmsn, self.msn)


_TSETH_ST: Final = struct.Struct("!HH")


class _TSETHLayout(Header):
    """TSETH, 4 bytes: 0-1 Timestamp; 2-3 TSR(15) Format(3:0)."""

    NAME: ClassVar[str] = "TSETH"
    SIZE: ClassVar[int] = 4
    ST: ClassVar[struct.Struct] = _TSETH_ST
    SPEC: ClassVar[Spec] = (
        ("tx_timestamp", 0, 16, False),
        ("tsr", 2, 1, False),
        ("format_type", 3, 4, False),
    )


@dataclass(slots=True)
class TSETH(_TSETHLayout):
    """Timestamp Extended Transport Header (present when BTH.TS is set)."""

    tx_timestamp: int = 0
    tsr: int = 0
    format_type: int = 0

    def __init__(self, tx_timestamp: int = 0, tsr: int = 0, format_type: int = 0) -> None:
        self.tx_timestamp = tx_timestamp
        self.tsr = tsr
        self.format_type = format_type

    @classmethod
    def pull(cls, buf: Buffer) -> TSETH:
        """A TSETH parsed from ``buf`` (one unpack)."""
        ts, w = buf.pull_struct(_TSETH_ST, "TSETH", "tx_timestamp")
        return TSETH(ts, w >> 15, w & 0xF)

    def out_of_range(self) -> int:
        """Non-zero when a field does not fit its width (`range_test`, written out)."""
        return self.tx_timestamp >> 16 | self.tsr >> 1 | self.format_type >> 4

    def push(self, buf: Buffer) -> None:
        """Append this TSETH, range-checked, its reserved bits zero."""
        self.validate(len(buf))
        buf.push_struct(_TSETH_ST, self.tx_timestamp, (self.tsr << 15) | self.format_type)


_RETH_ST: Final = struct.Struct("!QII")


class _RETHLayout(Header):
    """RETH, 16 bytes: 0-7 VA; 8-11 R_Key; 12-15 DMA_Length."""

    NAME: ClassVar[str] = "RETH"
    SIZE: ClassVar[int] = 16
    ST: ClassVar[struct.Struct] = _RETH_ST
    SPEC: ClassVar[Spec] = (("va", 0, 64, False), ("rkey", 8, 32, False), ("dma_len", 12, 32, False))


@dataclass(slots=True)
class RETH(_RETHLayout):
    """RDMA Extended Transport Header, in every data packet (VA advanced by one MTU per packet)."""

    va: int = 0
    rkey: int = 0
    dma_len: int = 0

    def __init__(self, va: int = 0, rkey: int = 0, dma_len: int = 0) -> None:
        self.va = va
        self.rkey = rkey
        self.dma_len = dma_len

    @classmethod
    def pull(cls, buf: Buffer) -> RETH:
        """A RETH parsed from ``buf`` (one unpack)."""
        va, rkey, dma_len = buf.pull_struct(_RETH_ST, "RETH", "va")
        return RETH(va, rkey, dma_len)

    def out_of_range(self) -> int:
        """Non-zero when a field does not fit its width (`range_test`, written out)."""
        return self.va >> 64 | self.rkey >> 32 | self.dma_len >> 32

    def push(self, buf: Buffer) -> None:
        """Append this RETH, range-checked, its reserved bits zero."""
        self.validate(len(buf))
        buf.push_struct(_RETH_ST, self.va, self.rkey, self.dma_len)


_IMMDT_ST: Final = struct.Struct("!I")


class _ImmDtLayout(Header):
    """ImmDt, 4 bytes: 0-3 Immediate."""

    NAME: ClassVar[str] = "ImmDt"
    SIZE: ClassVar[int] = 4
    ST: ClassVar[struct.Struct] = _IMMDT_ST
    SPEC: ClassVar[Spec] = (("imm_data", 0, 32, False),)


@dataclass(slots=True)
class ImmDt(_ImmDtLayout):
    """Immediate data of a Write-with-Immediate (the last packet of the message)."""

    imm_data: int = 0

    def __init__(self, imm_data: int = 0) -> None:
        self.imm_data = imm_data

    @classmethod
    def pull(cls, buf: Buffer) -> ImmDt:
        """A ImmDt parsed from ``buf`` (one unpack)."""
        imm_data = buf.pull_struct(_IMMDT_ST, "ImmDt", "imm_data")[0]
        return ImmDt(imm_data)

    def out_of_range(self) -> int:
        """Non-zero when a field does not fit its width (`range_test`, written out)."""
        return self.imm_data >> 32

    def push(self, buf: Buffer) -> None:
        """Append this ImmDt, range-checked, its reserved bits zero."""
        self.validate(len(buf))
        buf.push_struct(_IMMDT_ST, self.imm_data)


_AETH_ST: Final = struct.Struct("!I")


class _AETHLayout(Header):
    """AETH, 4 bytes: 0-3 Syndrome(31:24) MSN(23:0)."""

    NAME: ClassVar[str] = "AETH"
    SIZE: ClassVar[int] = 4
    ST: ClassVar[struct.Struct] = _AETH_ST
    SPEC: ClassVar[Spec] = (("syndrome", 0, 8, False), ("msn", 1, 24, False))


@dataclass(slots=True)
class AETH(_AETHLayout):
    """ACK Extended Transport Header (Transport ACK / NAK, RoCE syndromes)."""

    syndrome: int = 0
    msn: int = 0

    def __init__(self, syndrome: int = 0, msn: int = 0) -> None:
        self.syndrome = syndrome
        self.msn = msn

    @classmethod
    def pull(cls, buf: Buffer) -> AETH:
        """A AETH parsed from ``buf`` (one unpack)."""
        w = buf.pull_struct(_AETH_ST, "AETH", "syndrome")[0]
        return AETH(w >> 24, w & 0xFFFFFF)

    def out_of_range(self) -> int:
        """Non-zero when a field does not fit its width (`range_test`, written out)."""
        return self.syndrome >> 8 | self.msn >> 24

    def push(self, buf: Buffer) -> None:
        """Append this AETH, range-checked, its reserved bits zero."""
        self.validate(len(buf))
        buf.push_struct(_AETH_ST, (self.syndrome << 24) | self.msn)


_SETH_ST: Final = struct.Struct("!BBhIHHIBBhQ")
_SETH_M: Final = (SackM.NONE, SackM.SKIP_ONCE, SackM.ALWAYS_SKIP)


class _SETHLayout(Header):
    """SETH, 28 bytes: 0 Type(7:4) Next(3:0); 1 M(7:6) PR(5); 2-3 ACK_PSN_Offset; 4-7 Entropy; 8-9 SrcQP;
    10-11 DstQP; 12-15 SVC(31:24) CACK_PSN(23:0); 16 CC_Type(7:4) CC_Flags(3:0); 17 MPR; 18-19 SACK_Offset;
    20-27 Bitmap."""

    NAME: ClassVar[str] = "SETH"
    SIZE: ClassVar[int] = 28
    ST: ClassVar[struct.Struct] = _SETH_ST
    SPEC: ClassVar[Spec] = (
        ("hdr_type", 0, 4, False),
        ("next_hdr", 0, 4, False),
        ("m", 1, 2, False),
        ("pr", 1, 1, False),
        ("ack_psn_offset", 2, 16, True),
        ("entropy", 4, 32, False),
        ("src_qp", 8, 16, False),
        ("dst_qp", 10, 16, False),
        ("svc", 12, 8, False),
        ("cack_psn", 13, 24, False),
        ("cc_type", 16, 4, False),
        ("cc_flags", 16, 4, False),
        ("mpr", 17, 8, False),
        ("sack_offset", 18, 16, True),
        ("bitmap", 20, 64, False),
    )


@dataclass(slots=True)
class SETH(_SETHLayout):
    """Selective-ACK Extended Transport Header: cumulative PSN plus a 64-bit bitmap and the EV echo."""

    hdr_type: int = 0
    next_hdr: int = 0
    m: int = SackM.NONE
    pr: bool = False
    ack_psn_offset: int = 0
    entropy: int = 0
    src_qp: int = 0
    dst_qp: int = 0
    cack_psn: int = 0
    cc_type: int = 0
    cc_flags: int = 0
    mpr: int = 0
    sack_offset: int = 0
    bitmap: int = 0
    svc: int = 0

    def __init__(
        self,
        hdr_type: int = 0,
        next_hdr: int = 0,
        m: int = SackM.NONE,
        pr: bool = False,
        ack_psn_offset: int = 0,
        entropy: int = 0,
        src_qp: int = 0,
        dst_qp: int = 0,
        cack_psn: int = 0,
        cc_type: int = 0,
        cc_flags: int = 0,
        mpr: int = 0,
        sack_offset: int = 0,
        bitmap: int = 0,
        svc: int = 0,
    ) -> None:
        self.hdr_type = hdr_type
        self.next_hdr = next_hdr
        self.m = m
        self.pr = pr
        self.ack_psn_offset = ack_psn_offset
        self.entropy = entropy
        self.src_qp = src_qp
        self.dst_qp = dst_qp
        self.cack_psn = cack_psn
        self.cc_type = cc_type
        self.cc_flags = cc_flags
        self.mpr = mpr
        self.sack_offset = sack_offset
        self.bitmap = bitmap
        self.svc = svc

    @classmethod
    def pull(cls, buf: Buffer) -> SETH:
        """A SETH parsed from ``buf`` (one unpack)."""
        at = buf.pos
        b0, b1, apo, ent, sqp, dqp, w12, cc, mpr, so, bm = buf.pull_struct(_SETH_ST, "SETH", "hdr_type")
        m = b1 >> 6
        if m >= 3:
            raise WireError("SETH", "m", at + 1, f"reserved M value {m}")
        return SETH(
            b0 >> 4,
            b0 & 0xF,
            _SETH_M[m],
            bool(b1 & 0x20),
            apo,
            ent,
            sqp,
            dqp,
            w12 & 0xFFFFFF,
            cc >> 4,
            cc & 0xF,
            mpr,
            so,
            bm,
            w12 >> 24,
        )

    @staticmethod
    def from_words(
        b0: int,
        b1: int,
        apo: int,
        ent: int,
        sqp: int,
        dqp: int,
        w12: int,
        cc: int,
        mpr: int,
        so: int,
        bm: int,
        at: int,
    ) -> SETH:
        """Build from the values `ST` unpacks to (``at``: the header's offset, for the error of a reserved
        value)."""
        m = b1 >> 6
        if m >= 3:
            raise WireError("SETH", "m", at + 1, f"reserved M value {m}")
        return SETH(
            b0 >> 4,
            b0 & 0xF,
            _SETH_M[m],
            bool(b1 & 0x20),
            apo,
            ent,
            sqp,
            dqp,
            w12 & 0xFFFFFF,
            cc >> 4,
            cc & 0xF,
            mpr,
            so,
            bm,
            w12 >> 24,
        )

    def out_of_range(self) -> int:
        """Non-zero when a field does not fit its width (`range_test`, written out)."""
        return (
            self.hdr_type >> 4
            | self.next_hdr >> 4
            | self.m >> 2
            | self.pr >> 1
            | (self.ack_psn_offset + 0x8000) >> 16
            | self.entropy >> 32
            | self.src_qp >> 16
            | self.dst_qp >> 16
            | self.svc >> 8
            | self.cack_psn >> 24
            | self.cc_type >> 4
            | self.cc_flags >> 4
            | self.mpr >> 8
            | (self.sack_offset + 0x8000) >> 16
            | self.bitmap >> 64
        )

    def words(self) -> tuple[int, int, int, int, int, int, int, int, int, int, int]:
        """The values of `ST`, unchecked (the caller has range-tested)."""
        return (
            (self.hdr_type << 4) | self.next_hdr,
            (self.m << 6) | (self.pr << 5),
            self.ack_psn_offset,
            self.entropy,
            self.src_qp,
            self.dst_qp,
            (self.svc << 24) | self.cack_psn,
            (self.cc_type << 4) | self.cc_flags,
            self.mpr,
            self.sack_offset,
            self.bitmap,
        )

    def push(self, buf: Buffer) -> None:
        """Append this SETH, range-checked, its reserved bits zero."""
        self.validate(len(buf))
        if self.m >= 3:
            raise WireError("SETH", "m", len(buf) + 1, f"reserved M value {self.m}")
        buf.push_struct(
            _SETH_ST,
            (self.hdr_type << 4) | self.next_hdr,
            (self.m << 6) | (self.pr << 5),
            self.ack_psn_offset,
            self.entropy,
            self.src_qp,
            self.dst_qp,
            (self.svc << 24) | self.cack_psn,
            (self.cc_type << 4) | self.cc_flags,
            self.mpr,
            self.sack_offset,
            self.bitmap,
        )


_CCSTATE_ST: Final = struct.Struct("!HHI")


class _CcStateLayout(Header):
    """CC_STATE, 8 bytes: 0-1 TS_Echo; 2-3 OOO_Count(14:0); 4-7 R_C(31) Rcv_Cwnd_Pen(30:24)
    Rcvd_Bytes(23:0)."""

    NAME: ClassVar[str] = "CC_STATE"
    SIZE: ClassVar[int] = 8
    ST: ClassVar[struct.Struct] = _CCSTATE_ST
    SPEC: ClassVar[Spec] = (
        ("ts_echo", 0, 16, False),
        ("ooo_count", 2, 15, False),
        ("r_c", 4, 1, False),
        ("rcv_cwnd_pen", 4, 7, False),
        ("rcvd_256b", 5, 24, False),
    )


@dataclass(slots=True)
class CcState(_CcStateLayout):
    """Congestion-control state that follows SETH in every SACK."""

    ts_echo: int = 0
    ooo_count: int = 0
    r_c: bool = False
    rcv_cwnd_pen: int = 0
    rcvd_256b: int = 0

    def __init__(
        self,
        ts_echo: int = 0,
        ooo_count: int = 0,
        r_c: bool = False,
        rcv_cwnd_pen: int = 0,
        rcvd_256b: int = 0,
    ) -> None:
        self.ts_echo = ts_echo
        self.ooo_count = ooo_count
        self.r_c = r_c
        self.rcv_cwnd_pen = rcv_cwnd_pen
        self.rcvd_256b = rcvd_256b

    @classmethod
    def pull(cls, buf: Buffer) -> CcState:
        """A CC_STATE parsed from ``buf`` (one unpack)."""
        ts, w2, w4 = buf.pull_struct(_CCSTATE_ST, "CC_STATE", "ts_echo")
        return CcState(ts, w2 & 0x7FFF, bool(w4 & 0x80000000), (w4 >> 24) & 0x7F, w4 & 0xFFFFFF)

    def out_of_range(self) -> int:
        """Non-zero when a field does not fit its width (`range_test`, written out)."""
        return (
            self.ts_echo >> 16
            | self.ooo_count >> 15
            | self.r_c >> 1
            | self.rcv_cwnd_pen >> 7
            | self.rcvd_256b >> 24
        )

    def word(self) -> int:
        """The value of `ST` at byte 4 (R_C, Rcv_Cwnd_Pen, Rcvd_Bytes), unchecked."""
        return (self.r_c << 31) | (self.rcv_cwnd_pen << 24) | self.rcvd_256b

    def push(self, buf: Buffer) -> None:
        """Append this CC_STATE, range-checked, its reserved bits zero."""
        self.validate(len(buf))
        buf.push_struct(
            _CCSTATE_ST,
            self.ts_echo,
            self.ooo_count,
            (self.r_c << 31) | (self.rcv_cwnd_pen << 24) | self.rcvd_256b,
        )


_NETH_ST: Final = struct.Struct("!BBBBIHHIBBH")


class _NETHLayout(Header):
    """NETH, 20 bytes: 0 Type(7:4) Next(3:0); 2 Reason; 3 Vendor_Info; 4-7 Entropy; 8-9 SrcQP; 10-11 DstQP;
    12-15 PSN(23:0); 16 CC_Type(7:4) CC_Flags(3:0); 18-19 TS_Echo."""

    NAME: ClassVar[str] = "NETH"
    SIZE: ClassVar[int] = 20
    ST: ClassVar[struct.Struct] = _NETH_ST
    SPEC: ClassVar[Spec] = (
        ("hdr_type", 0, 4, False),
        ("next_hdr", 0, 4, False),
        ("reason", 2, 8, False),
        ("vendor_info", 3, 8, False),
        ("entropy", 4, 32, False),
        ("src_qp", 8, 16, False),
        ("dst_qp", 10, 16, False),
        ("psn", 13, 24, False),
        ("cc_type", 16, 4, False),
        ("cc_flags", 16, 4, False),
        ("ts_echo", 18, 16, False),
    )


@dataclass(slots=True)
class NETH(_NETHLayout):
    """NACK Extended Transport Header: reason, NACKed PSN and the EV echo."""

    hdr_type: int = 0
    next_hdr: int = 0
    reason: int = 0
    vendor_info: int = 0
    entropy: int = 0
    src_qp: int = 0
    dst_qp: int = 0
    psn: int = 0
    cc_type: int = 0
    cc_flags: int = 0
    ts_echo: int = 0

    def __init__(
        self,
        hdr_type: int = 0,
        next_hdr: int = 0,
        reason: int = 0,
        vendor_info: int = 0,
        entropy: int = 0,
        src_qp: int = 0,
        dst_qp: int = 0,
        psn: int = 0,
        cc_type: int = 0,
        cc_flags: int = 0,
        ts_echo: int = 0,
    ) -> None:
        self.hdr_type = hdr_type
        self.next_hdr = next_hdr
        self.reason = reason
        self.vendor_info = vendor_info
        self.entropy = entropy
        self.src_qp = src_qp
        self.dst_qp = dst_qp
        self.psn = psn
        self.cc_type = cc_type
        self.cc_flags = cc_flags
        self.ts_echo = ts_echo

    @classmethod
    def pull(cls, buf: Buffer) -> NETH:
        """A NETH parsed from ``buf`` (one unpack)."""
        b0, _r1, reason, vend, ent, sqp, dqp, w12, cc, _r17, ts = buf.pull_struct(
            _NETH_ST, "NETH", "hdr_type"
        )
        return NETH(b0 >> 4, b0 & 0xF, reason, vend, ent, sqp, dqp, w12 & 0xFFFFFF, cc >> 4, cc & 0xF, ts)

    def out_of_range(self) -> int:
        """Non-zero when a field does not fit its width (`range_test`, written out)."""
        return (
            self.hdr_type >> 4
            | self.next_hdr >> 4
            | self.reason >> 8
            | self.vendor_info >> 8
            | self.entropy >> 32
            | self.src_qp >> 16
            | self.dst_qp >> 16
            | self.psn >> 24
            | self.cc_type >> 4
            | self.cc_flags >> 4
            | self.ts_echo >> 16
        )

    def push(self, buf: Buffer) -> None:
        """Append this NETH, range-checked, its reserved bits zero."""
        self.validate(len(buf))
        buf.push_struct(
            _NETH_ST,
            (self.hdr_type << 4) | self.next_hdr,
            0,
            self.reason,
            self.vendor_info,
            self.entropy,
            self.src_qp,
            self.dst_qp,
            self.psn,
            (self.cc_type << 4) | self.cc_flags,
            0,
            self.ts_echo,
        )


_PETH_ST: Final = struct.Struct("!BBBBHHHHHH")


class _PETHLayout(Header):
    """PETH, 16 bytes: 0 Type(7:4) Next(3:0); 3 Vendor_Info; 4-5 Probe_ID; 8-9 SrcQP; 10-11 DstQP; 12-13
    Timestamp; 14-15 TSR(15) Format(3:0)."""

    NAME: ClassVar[str] = "PETH"
    SIZE: ClassVar[int] = 16
    ST: ClassVar[struct.Struct] = _PETH_ST
    SPEC: ClassVar[Spec] = (
        ("hdr_type", 0, 4, False),
        ("next_hdr", 0, 4, False),
        ("vendor_info", 3, 8, False),
        ("probe_id", 4, 16, False),
        ("src_qp", 8, 16, False),
        ("dst_qp", 10, 16, False),
        ("tx_timestamp", 12, 16, False),
        ("tsr", 14, 1, False),
        ("format_type", 15, 4, False),
    )


@dataclass(slots=True)
class PETH(_PETHLayout):
    """Probe Extended Transport Header (reliability probe to the peer QP; consumes no PSN)."""

    hdr_type: int = 0
    next_hdr: int = 0
    vendor_info: int = 0
    probe_id: int = 0
    src_qp: int = 0
    dst_qp: int = 0
    tx_timestamp: int = 0
    tsr: int = 0
    format_type: int = 0

    def __init__(
        self,
        hdr_type: int = 0,
        next_hdr: int = 0,
        vendor_info: int = 0,
        probe_id: int = 0,
        src_qp: int = 0,
        dst_qp: int = 0,
        tx_timestamp: int = 0,
        tsr: int = 0,
        format_type: int = 0,
    ) -> None:
        self.hdr_type = hdr_type
        self.next_hdr = next_hdr
        self.vendor_info = vendor_info
        self.probe_id = probe_id
        self.src_qp = src_qp
        self.dst_qp = dst_qp
        self.tx_timestamp = tx_timestamp
        self.tsr = tsr
        self.format_type = format_type

    @classmethod
    def pull(cls, buf: Buffer) -> PETH:
        """A PETH parsed from ``buf`` (one unpack)."""
        b0, _r1, _r2, vend, pid, _r6, sqp, dqp, ts, w14 = buf.pull_struct(_PETH_ST, "PETH", "hdr_type")
        return PETH(b0 >> 4, b0 & 0xF, vend, pid, sqp, dqp, ts, w14 >> 15, w14 & 0xF)

    def out_of_range(self) -> int:
        """Non-zero when a field does not fit its width (`range_test`, written out)."""
        return (
            self.hdr_type >> 4
            | self.next_hdr >> 4
            | self.vendor_info >> 8
            | self.probe_id >> 16
            | self.src_qp >> 16
            | self.dst_qp >> 16
            | self.tx_timestamp >> 16
            | self.tsr >> 1
            | self.format_type >> 4
        )

    def push(self, buf: Buffer) -> None:
        """Append this PETH, range-checked, its reserved bits zero."""
        self.validate(len(buf))
        buf.push_struct(
            _PETH_ST,
            (self.hdr_type << 4) | self.next_hdr,
            0,
            0,
            self.vendor_info,
            self.probe_id,
            0,
            self.src_qp,
            self.dst_qp,
            self.tx_timestamp,
            (self.tsr << 15) | self.format_type,
        )


_ERTH_ST: Final = struct.Struct("!BBBBIIHH")


class _ERTHLayout(Header):
    """ERTH, 16 bytes: 0 Type(7:4) Next(3:0); 1 Op(1:0); 3 Vendor_Info; 4-7 Port_Status; 12-13 Timestamp;
    14-15 TSR(15) Format(3:0)."""

    NAME: ClassVar[str] = "ERTH"
    SIZE: ClassVar[int] = 16
    ST: ClassVar[struct.Struct] = _ERTH_ST
    SPEC: ClassVar[Spec] = (
        ("hdr_type", 0, 4, False),
        ("next_hdr", 0, 4, False),
        ("op", 1, 2, False),
        ("vendor_info", 3, 8, False),
        ("port_status", 4, 32, False),
        ("tx_timestamp", 12, 16, False),
        ("tsr", 14, 1, False),
        ("format_type", 15, 4, False),
    )


@dataclass(slots=True)
class ERTH(_ERTHLayout):
    """Endpoint Request Transport Header (EV probe or port status update, to reserved QP 0x2)."""

    hdr_type: int = 0
    next_hdr: int = 0
    op: int = 0
    vendor_info: int = 0
    port_status: int = 0
    tx_timestamp: int = 0
    tsr: int = 0
    format_type: int = 0

    def __init__(
        self,
        hdr_type: int = 0,
        next_hdr: int = 0,
        op: int = 0,
        vendor_info: int = 0,
        port_status: int = 0,
        tx_timestamp: int = 0,
        tsr: int = 0,
        format_type: int = 0,
    ) -> None:
        self.hdr_type = hdr_type
        self.next_hdr = next_hdr
        self.op = op
        self.vendor_info = vendor_info
        self.port_status = port_status
        self.tx_timestamp = tx_timestamp
        self.tsr = tsr
        self.format_type = format_type

    @classmethod
    def pull(cls, buf: Buffer) -> ERTH:
        """A ERTH parsed from ``buf`` (one unpack)."""
        b0, b1, _r2, vend, ps, _r8, ts, w14 = buf.pull_struct(_ERTH_ST, "ERTH", "hdr_type")
        return ERTH(b0 >> 4, b0 & 0xF, b1 & 3, vend, ps, ts, w14 >> 15, w14 & 0xF)

    def out_of_range(self) -> int:
        """Non-zero when a field does not fit its width (`range_test`, written out)."""
        return (
            self.hdr_type >> 4
            | self.next_hdr >> 4
            | self.op >> 2
            | self.vendor_info >> 8
            | self.port_status >> 32
            | self.tx_timestamp >> 16
            | self.tsr >> 1
            | self.format_type >> 4
        )

    def push(self, buf: Buffer) -> None:
        """Append this ERTH, range-checked, its reserved bits zero."""
        self.validate(len(buf))
        buf.push_struct(
            _ERTH_ST,
            (self.hdr_type << 4) | self.next_hdr,
            self.op,
            0,
            self.vendor_info,
            self.port_status,
            0,
            self.tx_timestamp,
            (self.tsr << 15) | self.format_type,
        )


_EETH_ST: Final = struct.Struct("!BBBBIIB15xHH4x")


class _EETHLayout(Header):
    """EETH, 36 bytes: 0 Type(7:4) Next(3:0); 1 Op(5:4); 3 Vendor_Info; 4-7 Service_Time; 8-11 Port_Status; 12
    Rx_Port; 28-29 TS_Echo; 30-31 TSR(15) Format(3:0)."""

    NAME: ClassVar[str] = "EETH"
    SIZE: ClassVar[int] = 36
    ST: ClassVar[struct.Struct] = _EETH_ST
    SPEC: ClassVar[Spec] = (
        ("hdr_type", 0, 4, False),
        ("next_hdr", 0, 4, False),
        ("op", 1, 2, False),
        ("vendor_info", 3, 8, False),
        ("service_time", 4, 32, False),
        ("port_status", 8, 32, False),
        ("rx_port", 12, 8, False),
        ("ts_echo", 28, 16, False),
        ("tsr", 30, 1, False),
        ("format_type", 31, 4, False),
    )


@dataclass(slots=True)
class EETH(_EETHLayout):
    """Endpoint Response Transport Header; the response body in bytes 4-27 is openmrc's."""

    hdr_type: int = 0
    next_hdr: int = 0
    op: int = 0
    vendor_info: int = 0
    service_time: int = 0
    port_status: int = 0
    rx_port: int = 0
    ts_echo: int = 0
    tsr: int = 0
    format_type: int = 0

    def __init__(
        self,
        hdr_type: int = 0,
        next_hdr: int = 0,
        op: int = 0,
        vendor_info: int = 0,
        service_time: int = 0,
        port_status: int = 0,
        rx_port: int = 0,
        ts_echo: int = 0,
        tsr: int = 0,
        format_type: int = 0,
    ) -> None:
        self.hdr_type = hdr_type
        self.next_hdr = next_hdr
        self.op = op
        self.vendor_info = vendor_info
        self.service_time = service_time
        self.port_status = port_status
        self.rx_port = rx_port
        self.ts_echo = ts_echo
        self.tsr = tsr
        self.format_type = format_type

    @classmethod
    def pull(cls, buf: Buffer) -> EETH:
        """A EETH parsed from ``buf`` (one unpack)."""
        b0, b1, _r2, vend, svc, ps, rxp, ts, w30 = buf.pull_struct(_EETH_ST, "EETH", "hdr_type")
        return EETH(b0 >> 4, b0 & 0xF, (b1 >> 4) & 3, vend, svc, ps, rxp, ts, w30 >> 15, w30 & 0xF)

    def out_of_range(self) -> int:
        """Non-zero when a field does not fit its width (`range_test`, written out)."""
        return (
            self.hdr_type >> 4
            | self.next_hdr >> 4
            | self.op >> 2
            | self.vendor_info >> 8
            | self.service_time >> 32
            | self.port_status >> 32
            | self.rx_port >> 8
            | self.ts_echo >> 16
            | self.tsr >> 1
            | self.format_type >> 4
        )

    def push(self, buf: Buffer) -> None:
        """Append this EETH, range-checked, its reserved bits zero."""
        self.validate(len(buf))
        buf.push_struct(
            _EETH_ST,
            (self.hdr_type << 4) | self.next_hdr,
            self.op << 4,
            0,
            self.vendor_info,
            self.service_time,
            self.port_status,
            self.rx_port,
            self.ts_echo,
            (self.tsr << 15) | self.format_type,
        )
