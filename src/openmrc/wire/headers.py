"""One class per MRC 1.0 header, each with a precompiled `struct.Struct` layout.

Theory of operation
-------------------
Every header is a small ``__slots__`` dataclass whose fields carry the spec's names in snake_case. A header
knows its size, how to pull itself from a `Buffer` (one ``unpack_from`` call) and how to push itself (one
``pack`` call after a range check of every field). Reserved bits are written as zero and ignored on parse.

Layouts (byte offsets within the header, network byte order; ``[openmrc]`` marks a choice made where the
MRC 1.0 tables are not public, kept here so that a correction is a one-line change):

* **BTH** (12): 0 opcode; 1 SE(7) M(6) Pad(5:4) TVer(3:0); 2-3 P_Key; 4 FECN(7) BECN(6) resv(5:0);
  5-7 DestQP; 8 A(7) resv(6) RTX(5) TS(4) resv(3:0); 9-11 PSN.
* **METH** (4): 0-1 RQMSN; 2-3 MSN.
* **TSETH** (4): 0-1 tx_timestamp; 2-3 TSR(15) resv(14:4) format_type(3:0).
  ``[openmrc]`` timestamp units: TSR=0 → 128 ns, TSR=1 → 1.024 µs (16-bit, wrapping).
* **RETH** (16): 0-7 VA; 8-11 R_Key; 12-15 DMA length (of the whole operation).
* **ImmDt** (4): 0-3 immediate data.
* **AETH** (4): 0 syndrome; 1-3 MSN.
* Extension headers (SETH, NETH, PETH, ERTH, EETH) open with two bytes "type/next". ``[openmrc]`` byte 0 is
  hdr_type(7:4) next_hdr(3:0); byte 1 holds the header's own flag bits, the rest of byte 1 is reserved.
* **SETH** (28): 0 type/next; 1 M(7:6) PR(5); 2-3 ack_psn_offset (signed, PSN of the triggering packet minus
  cack_psn); 4-7 entropy (EV echo); 8-9 src_qp; 10-11 dst_qp (low 16 bits of the QPNs);
  12 ``[openmrc]`` svc: the responder's service time, how long the triggering packet had been in its host
  when the SACK left (reserved in MRC 1.0, so 0 from a peer that does not fill it: nothing known), in the
  8-bit log scale of `service_time_code`; 13-15 cack_psn; 16 cc_type(7:4) cc_flags(3:0); 17 MPR (128-PSN
  units, 0 = not advertised);
  18-19 sack_offset (signed, bitmap base minus cack_psn); 20-27 bitmap (bit i, LSB first, = PSN base+i).
  ``[openmrc]`` bit order inside byte 1 and of the bitmap.
* **CC_STATE** (8, follows SETH): 0-1 ts_echo; 2-3 resv(15) ooo_count(14:0); 4 R_C(7) rcv_cwnd_pen(6:0);
  5-7 received bytes in 256-byte units (``rcvd_256b``).
* **NETH** (20): 0 type/next; 1 resv; 2 reason; 3 vendor_info; 4-7 entropy echo; 8-9 src_qp; 10-11 dst_qp;
  12 resv; 13-15 NACK PSN; 16 cc_type(7:4) cc_flags(3:0); 17 resv; 18-19 ts_echo.
* **PETH** (16): 0 type/next; 1 resv; 2 resv; 3 vendor_info; 4-5 probe_id; 6-7 resv; 8-9 src_qp;
  10-11 dst_qp; 12-13 tx_timestamp; 14-15 TSR(15) resv(14:4) format_type(3:0).
* **ERTH** (16): 0 type/next; 1 resv(7:2) op(1:0); 2 resv; 3 vendor_info; 4-7 port_status (bit N = port
  N+1 up); 8-11 resv; 12-13 tx_timestamp; 14-15 TSR(15) resv(14:4) format_type(3:0).
* **EETH** (36): 0 type/next; 1 resv(7:6) op(5:4) resv(3:0); 2 resv; 3 vendor_info; ``[openmrc]`` response
  body in 4-27: 4-7 service_time (ns the responder held the request), 8-11 port_status (responder's port
  mask, bit N = port N+1 up), 12 rx_port (1-based port the request arrived on), 13-27 resv;
  28-29 ts_echo (the request's tx_timestamp); 30-31 TSR(15) resv(14:4) format_type(3:0) of the echo;
  32-35 resv.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Final

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
    "Header",
    "ImmDt",
    "make_bth",
    "range_test",
    "service_time_code",
    "service_time_ns",
]

_SVC_MANTISSA: Final = 5  # bits of a service time code's mantissa; the other 3 are its exponent
_SVC_MAX_US: Final = 31 << 14  # the largest service time a code says: 507,904 µs


def service_time_code(ns: int) -> int:
    """``ns`` of responder service time as SETH's 8-bit ``svc`` code ``e << 5 | m``, which means ``m << 2e``
    µs (exact to 31 µs, then 4, 16, 64, 256 µs, 1, 4, 16 ms steps, up to 0.5 s): rounded down, so that a
    requester never takes more out of an RTT sample than the responder spent; longer saturates."""
    us = ns // 1000
    if us <= 0:
        return 0
    if us >= _SVC_MAX_US:
        return 0xFF
    e = 0
    while us >> (2 * e) > 31:
        e += 1
    return e << _SVC_MANTISSA | us >> (2 * e)


def service_time_ns(code: int) -> int:
    """The service time (ns) an ``svc`` code stands for (`service_time_code`)."""
    return ((code & 31) << (2 * (code >> _SVC_MANTISSA))) * 1000


# (field name, byte offset of the field inside the header, width in bits, signed)
_Spec = tuple[tuple[str, int, int, bool], ...]

_RANGE_TESTS: Final[dict[type, Callable[[Any], int]]] = {}


def range_test(cls: type[Header]) -> Callable[[Any], int]:
    """The range test of every field of ``cls`` as one shift-or expression, compiled on first use
    (dataclasses-style): ``v >> bits`` is non-zero exactly when an unsigned field is negative or too wide."""
    test = _RANGE_TESTS.get(cls)
    if test is None:
        terms = [
            f"((h.{n} + {1 << (b - 1)}) >> {b})" if signed else f"(h.{n} >> {b})"
            for n, _o, b, signed in cls.SPEC
        ]
        ns: dict[str, Any] = {}
        exec(f"def out_of_range(h):\n    return {' | '.join(terms)}", ns)
        test = _RANGE_TESTS[cls] = ns["out_of_range"]
    return test


class Header:
    """Base of every header class: size, name, and the range check shared by all encoders."""

    __slots__ = ()
    NAME: ClassVar[str]
    SIZE: ClassVar[int]
    SPEC: ClassVar[_Spec]

    def validate(self, base: int = 0) -> None:
        """Fast range test of every field; on failure `check` names the field. ``base``: header offset."""
        try:
            bad = self.out_of_range()
        except TypeError:
            bad = True
        if bad:
            self.check(base)

    def out_of_range(self) -> int:
        """Non-zero when a field does not fit its width (`range_test`; the headers of the per-packet path
        write theirs out, so that the compiled build runs them natively)."""
        return range_test(type(self))(self)

    def check(self, base: int = 0) -> None:
        """Raise `WireError` if any field does not fit its width. ``base`` is the header's offset."""
        for name, off, bits, signed in self.SPEC:
            v = getattr(self, name)
            if not isinstance(v, int):
                ok = False
            elif signed:
                ok = -(1 << (bits - 1)) <= v < (1 << (bits - 1))
            else:
                ok = 0 <= v < (1 << bits)
            if not ok:
                kind = "signed" if signed else "unsigned"
                raise WireError(
                    self.NAME, name, base + off, f"value {v!r} does not fit {bits}-bit {kind} field"
                )

    def push(self, buf: Buffer) -> None:  # pragma: no cover - every subclass overrides
        raise NotImplementedError

    def encode(self) -> bytes:
        """The header alone, as bytes."""
        buf = Buffer()
        self.push(buf)
        return buf.data()


_SACK_M: Final = (SackM.NONE, SackM.SKIP_ONCE, SackM.ALWAYS_SKIP)


def _prefix(hdr_type: int, next_hdr: int) -> int:
    return (hdr_type << 4) | next_hdr


class _BTHLayout(Header):
    """BTH: name, size, struct and field layout (a base class, so mypyc cannot take them for fields)."""

    NAME: ClassVar[str] = "BTH"
    SIZE: ClassVar[int] = 12
    ST: ClassVar[struct.Struct] = struct.Struct("!BBHII")
    SPEC: ClassVar[_Spec] = (
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
        # written out: compiled, the dataclass-generated __init__ would run interpreted
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
        op, b1, pkey, w4, w8 = buf.pull_struct(cls.ST, "BTH", "opcode")
        return cls.from_words(op, b1, pkey, w4, w8)

    @classmethod
    def from_words(cls, op: int, b1: int, pkey: int, w4: int, w8: int) -> BTH:
        """Build from the values `ST` unpacks to (the inverse of `words`). Every ``pull`` names its class
        rather than ``cls``: compiled, that is a direct native constructor call on the per-packet path."""
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
        """Non-zero when a field does not fit its width: `range_test` written out, so that the compiled build
        runs the per-packet test natively."""
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

    def words(self, base: int = 0) -> tuple[int, int, int, int, int]:
        """The values of `ST`, range-checked (``base``: BTH's offset, for error messages)."""
        self.validate(base)
        return self.unchecked_words()

    def unchecked_words(self) -> tuple[int, int, int, int, int]:
        """`words` for callers that have range-checked already."""
        return (
            self.opcode,
            (self.se << 7) | (self.m << 6) | (self.pad << 4) | self.tver,
            self.p_key,
            (self.fecn << 31) | (self.becn << 30) | self.dest_qp,
            (self.ack_req << 31) | (self.rtx << 29) | (self.ts << 28) | self.psn,
        )

    def push(self, buf: Buffer) -> None:
        buf.push_struct(self.ST, *self.words(len(buf)))


def make_bth(opcode: int, dest_qp: int, ack_req: bool, rtx: bool, psn: int) -> BTH:
    """``BTH(opcode, dest_qp=dest_qp, ack_req=ack_req, rtx=rtx, psn=psn)``, every other field at its default,
    without keyword handling (the core builds one per packet)."""
    return BTH(opcode, False, False, 0, 0, 0xFFFF, False, False, dest_qp, ack_req, rtx, False, psn)


class _METHLayout(Header):
    """METH: name, size, struct and field layout (a base class, so mypyc cannot take them for fields)."""

    NAME: ClassVar[str] = "METH"
    SIZE: ClassVar[int] = 4
    ST: ClassVar[struct.Struct] = struct.Struct("!HH")
    SPEC: ClassVar[_Spec] = (("rqmsn", 0, 16, False), ("msn", 2, 16, False))


@dataclass(slots=True)
class METH(_METHLayout):
    """MRC Extended Transport Header: message sequence numbers, in every request packet."""

    rqmsn: int = 0
    msn: int = 0

    def __init__(self, rqmsn: int = 0, msn: int = 0) -> None:
        # written out: compiled, the dataclass-generated __init__ would run interpreted
        self.rqmsn = rqmsn
        self.msn = msn

    def out_of_range(self) -> int:
        """Non-zero when a field does not fit its width (`range_test`, written out)."""
        return self.rqmsn >> 16 | self.msn >> 16

    @classmethod
    def pull(cls, buf: Buffer) -> METH:
        rqmsn, msn = buf.pull_struct(cls.ST, "METH", "rqmsn")
        return METH(rqmsn, msn)

    def push(self, buf: Buffer) -> None:
        self.validate(len(buf))
        buf.push_struct(self.ST, self.rqmsn, self.msn)


class _TSETHLayout(Header):
    """TSETH: name, size, struct and field layout (a base class, so mypyc cannot take them for fields)."""

    NAME: ClassVar[str] = "TSETH"
    SIZE: ClassVar[int] = 4
    ST: ClassVar[struct.Struct] = struct.Struct("!HH")
    SPEC: ClassVar[_Spec] = (
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
        # written out: compiled, the dataclass-generated __init__ would run interpreted
        self.tx_timestamp = tx_timestamp
        self.tsr = tsr
        self.format_type = format_type

    @classmethod
    def pull(cls, buf: Buffer) -> TSETH:
        ts, w = buf.pull_struct(cls.ST, "TSETH", "tx_timestamp")
        return TSETH(ts, w >> 15, w & 0xF)

    def push(self, buf: Buffer) -> None:
        self.validate(len(buf))
        buf.push_struct(self.ST, self.tx_timestamp, (self.tsr << 15) | self.format_type)


class _RETHLayout(Header):
    """RETH: name, size, struct and field layout (a base class, so mypyc cannot take them for fields)."""

    NAME: ClassVar[str] = "RETH"
    SIZE: ClassVar[int] = 16
    ST: ClassVar[struct.Struct] = struct.Struct("!QII")
    SPEC: ClassVar[_Spec] = (("va", 0, 64, False), ("rkey", 8, 32, False), ("dma_len", 12, 32, False))


@dataclass(slots=True)
class RETH(_RETHLayout):
    """RDMA Extended Transport Header, in every data packet (VA advanced by one MTU per packet)."""

    va: int = 0
    rkey: int = 0
    dma_len: int = 0

    def __init__(self, va: int = 0, rkey: int = 0, dma_len: int = 0) -> None:
        # written out: compiled, the dataclass-generated __init__ would run interpreted
        self.va = va
        self.rkey = rkey
        self.dma_len = dma_len

    def out_of_range(self) -> int:
        """Non-zero when a field does not fit its width (`range_test`, written out)."""
        return self.va >> 64 | self.rkey >> 32 | self.dma_len >> 32

    @classmethod
    def pull(cls, buf: Buffer) -> RETH:
        va, rkey, dma_len = buf.pull_struct(cls.ST, "RETH", "va")
        return RETH(va, rkey, dma_len)

    def push(self, buf: Buffer) -> None:
        self.validate(len(buf))
        buf.push_struct(self.ST, self.va, self.rkey, self.dma_len)


class _ImmDtLayout(Header):
    """ImmDt: name, size, struct and field layout (a base class, so mypyc cannot take them for fields)."""

    NAME: ClassVar[str] = "ImmDt"
    SIZE: ClassVar[int] = 4
    ST: ClassVar[struct.Struct] = struct.Struct("!I")
    SPEC: ClassVar[_Spec] = (("imm_data", 0, 32, False),)


@dataclass(slots=True)
class ImmDt(_ImmDtLayout):
    """Immediate data of a Write-with-Immediate (the last packet of the message)."""

    imm_data: int = 0

    def __init__(self, imm_data: int = 0) -> None:
        # written out: compiled, the dataclass-generated __init__ would run interpreted
        self.imm_data = imm_data

    @classmethod
    def pull(cls, buf: Buffer) -> ImmDt:
        return ImmDt(buf.pull_struct(cls.ST, "ImmDt", "imm_data")[0])

    def push(self, buf: Buffer) -> None:
        self.validate(len(buf))
        buf.push_struct(self.ST, self.imm_data)


class _AETHLayout(Header):
    """AETH: name, size, struct and field layout (a base class, so mypyc cannot take them for fields)."""

    NAME: ClassVar[str] = "AETH"
    SIZE: ClassVar[int] = 4
    ST: ClassVar[struct.Struct] = struct.Struct("!I")
    SPEC: ClassVar[_Spec] = (("syndrome", 0, 8, False), ("msn", 1, 24, False))


@dataclass(slots=True)
class AETH(_AETHLayout):
    """ACK Extended Transport Header (Transport ACK / NAK, RoCE syndromes)."""

    syndrome: int = 0
    msn: int = 0

    def __init__(self, syndrome: int = 0, msn: int = 0) -> None:
        # written out: compiled, the dataclass-generated __init__ would run interpreted
        self.syndrome = syndrome
        self.msn = msn

    @classmethod
    def pull(cls, buf: Buffer) -> AETH:
        w = buf.pull_struct(cls.ST, "AETH", "syndrome")[0]
        return AETH(w >> 24, w & 0xFFFFFF)

    def push(self, buf: Buffer) -> None:
        self.validate(len(buf))
        buf.push_struct(self.ST, (self.syndrome << 24) | self.msn)


class _SETHLayout(Header):
    """SETH: name, size, struct and field layout (a base class, so mypyc cannot take them for fields)."""

    NAME: ClassVar[str] = "SETH"
    SIZE: ClassVar[int] = 28
    ST: ClassVar[struct.Struct] = struct.Struct("!BBhIHHIBBhQ")
    SPEC: ClassVar[_Spec] = (
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
        # written out: compiled, the dataclass-generated __init__ would run interpreted
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
        start = buf.pos
        b0, b1, apo, ent, sqp, dqp, w12, cc, mpr, so, bm = buf.pull_struct(cls.ST, "SETH", "hdr_type")
        return SETH.from_words(b0, b1, apo, ent, sqp, dqp, w12, cc, mpr, so, bm, start)

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
        """Build from the values `ST` unpacks to (``at``: SETH's offset, for the error of a reserved M)."""
        m = b1 >> 6
        if m == 3:
            raise WireError("SETH", "m", at + 1, "reserved M value 3")
        return SETH(
            b0 >> 4,
            b0 & 0xF,
            _SACK_M[m],
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
        """`range_test` written out (a SACK answers every few data packets: compiled, it runs natively)."""
        return (
            self.hdr_type >> 4
            | self.next_hdr >> 4
            | self.m >> 2
            | self.pr >> 1
            | (self.ack_psn_offset + 0x8000) >> 16
            | self.entropy >> 32
            | self.src_qp >> 16
            | self.dst_qp >> 16
            | self.cack_psn >> 24
            | self.cc_type >> 4
            | self.cc_flags >> 4
            | self.mpr >> 8
            | (self.sack_offset + 0x8000) >> 16
            | self.bitmap >> 64
            | self.svc >> 8
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
            self.svc << 24 | self.cack_psn,
            (self.cc_type << 4) | self.cc_flags,
            self.mpr,
            self.sack_offset,
            self.bitmap,
        )

    def push(self, buf: Buffer) -> None:
        self.validate(len(buf))
        if self.m == 3:
            raise WireError("SETH", "m", len(buf) + 1, "reserved M value 3")
        buf.push_struct(self.ST, *self.words())


class _CcStateLayout(Header):
    """CcState: name, size, struct and field layout (a base class, so mypyc cannot take them for fields)."""

    NAME: ClassVar[str] = "CC_STATE"
    SIZE: ClassVar[int] = 8
    ST: ClassVar[struct.Struct] = struct.Struct("!HHI")
    SPEC: ClassVar[_Spec] = (
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
        # written out: compiled, the dataclass-generated __init__ would run interpreted
        self.ts_echo = ts_echo
        self.ooo_count = ooo_count
        self.r_c = r_c
        self.rcv_cwnd_pen = rcv_cwnd_pen
        self.rcvd_256b = rcvd_256b

    @classmethod
    def pull(cls, buf: Buffer) -> CcState:
        ts, w2, w4 = buf.pull_struct(cls.ST, "CC_STATE", "ts_echo")
        return CcState(ts, w2 & 0x7FFF, bool(w4 & 0x80000000), (w4 >> 24) & 0x7F, w4 & 0xFFFFFF)

    def out_of_range(self) -> int:
        """`range_test` written out (see `SETH.out_of_range`)."""
        return (
            self.ts_echo >> 16
            | self.ooo_count >> 15
            | self.r_c >> 1
            | self.rcv_cwnd_pen >> 7
            | self.rcvd_256b >> 24
        )

    def word(self) -> int:
        """The last value of `ST` (R_C, the penalty and the byte count), unchecked."""
        return (self.r_c << 31) | (self.rcv_cwnd_pen << 24) | self.rcvd_256b

    def push(self, buf: Buffer) -> None:
        self.validate(len(buf))
        buf.push_struct(self.ST, self.ts_echo, self.ooo_count, self.word())


class _NETHLayout(Header):
    """NETH: name, size, struct and field layout (a base class, so mypyc cannot take them for fields)."""

    NAME: ClassVar[str] = "NETH"
    SIZE: ClassVar[int] = 20
    ST: ClassVar[struct.Struct] = struct.Struct("!BBBBIHHIBBH")
    SPEC: ClassVar[_Spec] = (
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

    @classmethod
    def pull(cls, buf: Buffer) -> NETH:
        b0, _b1, reason, vend, ent, sqp, dqp, w12, cc, _r17, ts = buf.pull_struct(cls.ST, "NETH", "hdr_type")
        return NETH(b0 >> 4, b0 & 0xF, reason, vend, ent, sqp, dqp, w12 & 0xFFFFFF, cc >> 4, cc & 0xF, ts)

    def push(self, buf: Buffer) -> None:
        self.validate(len(buf))
        buf.push_struct(
            self.ST,
            _prefix(self.hdr_type, self.next_hdr),
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


class _PETHLayout(Header):
    """PETH: name, size, struct and field layout (a base class, so mypyc cannot take them for fields)."""

    NAME: ClassVar[str] = "PETH"
    SIZE: ClassVar[int] = 16
    ST: ClassVar[struct.Struct] = struct.Struct("!BBBBHHHHHH")
    SPEC: ClassVar[_Spec] = (
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

    @classmethod
    def pull(cls, buf: Buffer) -> PETH:
        b0, _b1, _b2, vend, pid, _r6, sqp, dqp, ts, w14 = buf.pull_struct(cls.ST, "PETH", "hdr_type")
        return PETH(b0 >> 4, b0 & 0xF, vend, pid, sqp, dqp, ts, w14 >> 15, w14 & 0xF)

    def push(self, buf: Buffer) -> None:
        self.validate(len(buf))
        buf.push_struct(
            self.ST,
            _prefix(self.hdr_type, self.next_hdr),
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


class _ERTHLayout(Header):
    """ERTH: name, size, struct and field layout (a base class, so mypyc cannot take them for fields)."""

    NAME: ClassVar[str] = "ERTH"
    SIZE: ClassVar[int] = 16
    ST: ClassVar[struct.Struct] = struct.Struct("!BBBBIIHH")
    SPEC: ClassVar[_Spec] = (
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

    @classmethod
    def pull(cls, buf: Buffer) -> ERTH:
        b0, b1, _b2, vend, ps, _r8, ts, w14 = buf.pull_struct(cls.ST, "ERTH", "hdr_type")
        return ERTH(b0 >> 4, b0 & 0xF, b1 & 3, vend, ps, ts, w14 >> 15, w14 & 0xF)

    def push(self, buf: Buffer) -> None:
        self.validate(len(buf))
        buf.push_struct(
            self.ST,
            _prefix(self.hdr_type, self.next_hdr),
            self.op,
            0,
            self.vendor_info,
            self.port_status,
            0,
            self.tx_timestamp,
            (self.tsr << 15) | self.format_type,
        )


class _EETHLayout(Header):
    """EETH: name, size, struct and field layout (a base class, so mypyc cannot take them for fields)."""

    NAME: ClassVar[str] = "EETH"
    SIZE: ClassVar[int] = 36
    ST: ClassVar[struct.Struct] = struct.Struct("!BBBBIIB15xHH4x")
    SPEC: ClassVar[_Spec] = (
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

    @classmethod
    def pull(cls, buf: Buffer) -> EETH:
        b0, b1, _b2, vend, svc, ps, rxp, ts, w30 = buf.pull_struct(cls.ST, "EETH", "hdr_type")
        return EETH(b0 >> 4, b0 & 0xF, (b1 >> 4) & 3, vend, svc, ps, rxp, ts, w30 >> 15, w30 & 0xF)

    def push(self, buf: Buffer) -> None:
        self.validate(len(buf))
        buf.push_struct(
            self.ST,
            _prefix(self.hdr_type, self.next_hdr),
            self.op << 4,
            0,
            self.vendor_info,
            self.service_time,
            self.port_status,
            self.rx_port,
            self.ts_echo,
            (self.tsr << 15) | self.format_type,
        )
