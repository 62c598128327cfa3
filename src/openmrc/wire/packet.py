"""Whole MRC UDP payloads: ``BTH, extension headers..., payload, pad, ICRC`` <-> `Packet`.

The opcode chooses the header chain (MRC-SPEC-NOTES §3):

========================================  ===============================================
opcode                                    headers after BTH
========================================  ===============================================
WRITE_FIRST / MIDDLE / LAST / ONLY        METH, [TSETH if BTH.TS], RETH, payload
WRITE_LAST_WITH_IMM / WRITE_ONLY_WITH_IMM METH, [TSETH if BTH.TS], RETH, ImmDt, payload
ACK                                       AETH
SACK                                      SETH, CC_STATE
NACK                                      NETH
PROBE                                     PETH
EP_REQUEST / EP_RESPONSE                  ERTH / EETH
========================================  ===============================================

`parse` accepts any bytes and raises only `WireError`. On parse the payload is a zero-copy `memoryview` of
the input (pad bytes excluded) and the 4-byte ICRC trailer is exposed as ``pkt.icrc`` (read little-endian,
as RoCEv2 stores it) without being checked: checking needs the IP and UDP headers, see
`openmrc.wire.framing.parse_frame`. A packet trimmed by the fabric (payload cut off) is parsed with
``trimmed=True``, which skips the payload-length checks.
"""

from __future__ import annotations

import struct
from builtins import memoryview  # a global: compiled, the dataclass annotation is looked up there
from dataclasses import dataclass
from typing import Final

from openmrc.wire.buffer import Buffer, WireError
from openmrc.wire.constants import (
    DATA_OPCODES,
    IMM_OPCODES,
    MRC_OPCODE_RANGE,
    OP_WRITE_FIRST,
    OP_WRITE_LAST,
    OP_WRITE_LAST_WITH_IMM,
    OP_WRITE_ONLY,
    OP_WRITE_ONLY_WITH_IMM,
    Opcode,
)
from openmrc.wire.headers import (
    AETH,
    BTH,
    EETH,
    ERTH,
    METH,
    NETH,
    PETH,
    RETH,
    SETH,
    TSETH,
    CcState,
    ImmDt,
    make_bth,
)

__all__ = [
    "HEADER_ATTRS",
    "NOT_PLAIN",
    "DataTemplate",
    "Packet",
    "PlainData",
    "data_packet",
    "parse",
    "plain_data_fields",
]

ICRC_SIZE: Final = 4
_ICRC: Final = struct.Struct("<I")
_ZERO_PAD: Final = (b"", b"\x00", b"\x00\x00", b"\x00\x00\x00")
_EMPTY: Final = memoryview(b"")
_ONLY: Final = frozenset({Opcode.WRITE_ONLY, Opcode.WRITE_ONLY_WITH_IMM})
_OPCODE_VALUES: Final = frozenset(int(o) for o in Opcode)
_DATA_INTS: Final = frozenset(int(o) for o in DATA_OPCODES)
_IMM_INTS: Final = frozenset(int(o) for o in IMM_OPCODES)
_ONLY_INTS: Final = frozenset(int(o) for o in _ONLY)
_FM_INTS: Final = frozenset((int(Opcode.WRITE_FIRST), int(Opcode.WRITE_MIDDLE)))
_PLAIN_INTS: Final = _DATA_INTS - _IMM_INTS
# bit ``op - OP_WRITE_FIRST`` set for a data opcode without ImmDt (a small mask: a shift of it stays native)
_PLAIN_MASK: Final = sum(1 << (o - OP_WRITE_FIRST) for o in _PLAIN_INTS)
# BTH + METH + [TSETH] + RETH + [ImmDt] in one layout, keyed by (TSETH present, ImmDt present).
_DATA_ST: Final = {
    (ts, imm): struct.Struct("!BBHIIHH" + ("HH" if ts else "") + "QII" + ("I" if imm else ""))
    for ts in (False, True)
    for imm in (False, True)
}
_PLAIN_DATA_ST: Final = _DATA_ST[False, False]
_PLAIN_DATA_PACK: Final = _PLAIN_DATA_ST.pack  # bound once: see _PLAIN_READ
_IMM_DATA_PACK: Final = _DATA_ST[False, True].pack
_PLAIN_DATA_SIZE: Final = _PLAIN_DATA_ST.size
# BTH + SETH + CC_STATE: a SACK, in one layout
_SACK_ST: Final = struct.Struct(
    "!" + BTH.ST.format.lstrip("!") + SETH.ST.format.lstrip("!") + CcState.ST.format.lstrip("!")
)
_SACK_SIZE: Final = _SACK_ST.size
_OP_SACK: Final = int(Opcode.SACK)

# Non-data opcodes: which optional attributes each one carries, in wire order.
_ControlChain = tuple[tuple[str, type[AETH | SETH | CcState | NETH | PETH | ERTH | EETH]], ...]
_CONTROL_CHAIN: Final[dict[int, _ControlChain]] = {
    Opcode.ACK: (("aeth", AETH),),
    Opcode.SACK: (("seth", SETH), ("cc_state", CcState)),
    Opcode.NACK: (("neth", NETH),),
    Opcode.PROBE: (("peth", PETH),),
    Opcode.EP_REQUEST: (("erth", ERTH),),
    Opcode.EP_RESPONSE: (("eeth", EETH),),
}
HEADER_ATTRS: Final = (
    "meth",
    "tseth",
    "reth",
    "imm",
    "aeth",
    "seth",
    "cc_state",
    "neth",
    "peth",
    "erth",
    "eeth",
)
# Which optional headers each control opcode carries, as `Packet._presence` reports them.
_CONTROL_PRESENCE: Final = {
    op: tuple(a in {x for x, _ in chain} for a in HEADER_ATTRS) for op, chain in _CONTROL_CHAIN.items()
}


def _opcode_error(op: int) -> WireError:
    if op in MRC_OPCODE_RANGE:
        return WireError("BTH", "opcode", 0, f"reserved MRC opcode 0x{op:02x}")
    return WireError("BTH", "opcode", 0, f"unknown opcode 0x{op:02x} (not an MRC opcode)")


@dataclass(slots=True, eq=False)
class Packet:
    """One MRC packet. Header attributes are ``None`` when the opcode does not carry that header."""

    bth: BTH
    meth: METH | None = None
    tseth: TSETH | None = None
    reth: RETH | None = None
    imm: ImmDt | None = None
    aeth: AETH | None = None
    seth: SETH | None = None
    cc_state: CcState | None = None
    neth: NETH | None = None
    peth: PETH | None = None
    erth: ERTH | None = None
    eeth: EETH | None = None
    payload: memoryview = _EMPTY
    icrc: int = 0

    def __init__(
        self,
        bth: BTH,
        meth: METH | None = None,
        tseth: TSETH | None = None,
        reth: RETH | None = None,
        imm: ImmDt | None = None,
        aeth: AETH | None = None,
        seth: SETH | None = None,
        cc_state: CcState | None = None,
        neth: NETH | None = None,
        peth: PETH | None = None,
        erth: ERTH | None = None,
        eeth: EETH | None = None,
        payload: memoryview | bytes | bytearray = _EMPTY,
        icrc: int = 0,
    ) -> None:
        # written out: compiled, the dataclass-generated __init__ would run interpreted
        self.bth = bth
        self.meth = meth
        self.tseth = tseth
        self.reth = reth
        self.imm = imm
        self.aeth = aeth
        self.seth = seth
        self.cc_state = cc_state
        self.neth = neth
        self.peth = peth
        self.erth = erth
        self.eeth = eeth
        self.payload = payload if isinstance(payload, memoryview) else memoryview(payload)
        self.icrc = icrc

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Packet):
            return NotImplemented
        return (
            self.bth == other.bth
            and all(getattr(self, a) == getattr(other, a) for a in HEADER_ATTRS)
            and self.payload == other.payload
            and self.icrc == other.icrc
        )

    @property
    def opcode(self) -> int:
        return self.bth.opcode

    @property
    def is_data(self) -> bool:
        return self.bth.opcode in DATA_OPCODES

    def header_size(self) -> int:
        """Bytes from the start of BTH to the start of the payload."""
        n = BTH.SIZE
        for a in HEADER_ATTRS:
            h = getattr(self, a)
            if h is not None:
                n += h.SIZE
        return n

    # -- encoding --------------------------------------------------------------------------------------
    def encode_headers(self, *, trimmed: bool = False) -> bytes:
        """BTH and every extension header, ready to be followed by the payload, pad and ICRC.

        BTH.Pad is set from the payload length. Raises `WireError` if a field is out of range or the
        headers present do not match the opcode's chain. ``trimmed``: a data packet whose payload the fabric
        cut off (its length is not checked against the DMA length).
        """
        bth = self.bth
        op = bth.opcode
        if op not in _OPCODE_VALUES:
            raise _opcode_error(op)
        if op in DATA_OPCODES:
            return self._encode_data_headers(bth, trimmed)
        if op == _OP_SACK:
            sack = self._encode_sack_headers(bth)
            if sack is not None:
                return sack
        chain = _CONTROL_CHAIN[op]
        if self._presence() != _CONTROL_PRESENCE[op]:
            self._check_control_chain(chain)
        if bth.ts:
            raise WireError("BTH", "ts", 8, f"TS bit set on {Opcode(op).name}, which carries no TSETH")
        if len(self.payload):
            raise WireError(
                Opcode(op).name, "payload", self.header_size(), "control packets carry no payload"
            )
        bth.pad = 0
        buf = Buffer()
        bth.push(buf)
        for attr, _cls in chain:
            getattr(self, attr).push(buf)
        return buf.data()

    def encode(self, *, trimmed: bool = False) -> bytes:
        """The whole UDP payload: headers, payload, pad and the ICRC trailer (``self.icrc``, LSB first)."""
        hdr = self.encode_headers(trimmed=trimmed)
        return b"".join((hdr, self.payload, _ZERO_PAD[self.bth.pad], _ICRC.pack(self.icrc & 0xFFFFFFFF)))

    def _encode_data_headers(self, bth: BTH, trimmed: bool = False) -> bytes:
        # Hot path: one struct.pack for BTH, METH, [TSETH], RETH, [ImmDt]; a shift-or range test per field
        # and the detailed per-header check only when that test fails.
        meth, tseth, reth, imm = self.meth, self.tseth, self.reth, self.imm
        if (
            meth is None
            or reth is None
            or bth.ts != (tseth is not None)
            or (bth.opcode in _IMM_INTS) != (imm is not None)
            or self.aeth is not None
            or self.seth is not None
            or self.cc_state is not None
            or self.neth is not None
            or self.peth is not None
            or self.erth is not None
            or self.eeth is not None
        ):
            self._check_data_chain()
        assert meth is not None and reth is not None
        n = len(self.payload)
        bth.pad = -n & 3
        try:
            bad = bth.out_of_range() | meth.out_of_range() | reth.out_of_range()
        except TypeError:
            bad = 1
        if bad:  # name the first offending field
            off = 0
            for h in (bth, meth, tseth, reth):
                if h is not None:
                    h.check(off)
                    off += h.SIZE
        if tseth is None and imm is None:  # the common layout, packed without a star-call
            _check_payload(bth, reth, n, _PLAIN_DATA_SIZE, trimmed)
            w = bth.unchecked_words()
            return _PLAIN_DATA_ST.pack(
                w[0],
                w[1],
                w[2],
                w[3],
                w[4],
                meth.rqmsn,
                meth.msn,
                reth.va,
                reth.rkey,
                reth.dma_len,
            )
        head: tuple[int, ...] = (
            *bth.unchecked_words(),
            meth.rqmsn,
            meth.msn,
        )
        if tseth is not None:
            tseth.validate(BTH.SIZE + METH.SIZE)
            head += (tseth.tx_timestamp, (tseth.tsr << 15) | tseth.format_type)
        head += (reth.va, reth.rkey, reth.dma_len)
        if imm is not None:
            imm.validate(BTH.SIZE + METH.SIZE + (TSETH.SIZE if tseth is not None else 0) + RETH.SIZE)
            head += (imm.imm_data,)
        st = _DATA_ST[tseth is not None, imm is not None]
        _check_payload(bth, reth, n, st.size, trimmed)
        return st.pack(*head)

    def _encode_sack_headers(self, bth: BTH) -> bytes | None:
        """A well-formed SACK's headers in one struct.pack (SACKs answer every few data packets); None sends
        anything else down the generic path, which names what is wrong."""
        seth, cc = self.seth, self.cc_state
        if (
            seth is None
            or cc is None
            or bth.ts
            or len(self.payload)
            or self.meth is not None
            or self.tseth is not None
            or self.reth is not None
            or self.imm is not None
            or self.aeth is not None
            or self.neth is not None
            or self.peth is not None
            or self.erth is not None
            or self.eeth is not None
        ):
            return None
        bth.pad = 0
        try:
            bad = bth.out_of_range() | seth.out_of_range() | cc.out_of_range()
        except TypeError:
            bad = 1
        if bad or seth.m == 3:
            return None
        w = bth.unchecked_words()
        v = seth.words()
        return _SACK_ST.pack(
            w[0],
            w[1],
            w[2],
            w[3],
            w[4],
            v[0],
            v[1],
            v[2],
            v[3],
            v[4],
            v[5],
            v[6],
            v[7],
            v[8],
            v[9],
            v[10],
            cc.ts_echo,
            cc.ooo_count,
            cc.word(),
        )

    def _check_data_chain(self) -> None:
        name = Opcode(self.bth.opcode).name
        off = BTH.SIZE
        if self.meth is None:
            raise WireError(name, "meth", off, "data packets carry METH")
        off += METH.SIZE
        if self.bth.ts != (self.tseth is not None):
            why = "BTH.TS set but no TSETH" if self.bth.ts else "TSETH present but BTH.TS clear"
            raise WireError(name, "tseth", off, why)
        if self.reth is None:
            raise WireError(name, "reth", off, "data packets carry RETH in every packet")
        want_imm = self.bth.opcode in IMM_OPCODES
        if want_imm != (self.imm is not None):
            raise WireError(name, "imm", off, "ImmDt " + ("missing" if want_imm else "not allowed"))
        for a in ("aeth", "seth", "cc_state", "neth", "peth", "erth", "eeth"):
            if getattr(self, a) is not None:
                raise WireError(name, a, off, f"{a.upper()} does not belong in a data packet")

    def _presence(self) -> tuple[bool, ...]:
        """Which optional headers are present, in `HEADER_ATTRS` order."""
        return (
            self.meth is not None,
            self.tseth is not None,
            self.reth is not None,
            self.imm is not None,
            self.aeth is not None,
            self.seth is not None,
            self.cc_state is not None,
            self.neth is not None,
            self.peth is not None,
            self.erth is not None,
            self.eeth is not None,
        )

    def _check_control_chain(self, chain: tuple[tuple[str, type], ...]) -> None:
        name = Opcode(self.bth.opcode).name
        wanted = {a for a, _ in chain}
        for a in HEADER_ATTRS:
            present = getattr(self, a) is not None
            if present != (a in wanted):
                why = "missing" if a in wanted else "does not belong here"
                raise WireError(name, a, BTH.SIZE, f"{a.upper()} {why}")


def data_packet(
    bth: BTH,
    meth: METH,
    tseth: TSETH | None,
    reth: RETH,
    imm: ImmDt | None,
    payload: memoryview,
    icrc: int = 0,
) -> Packet:
    """``Packet(bth, meth, tseth, reth, imm, payload=payload, icrc=icrc)`` without keyword handling, for
    callers that build a data packet per packet sent or parsed."""
    return Packet(bth, meth, tseth, reth, imm, None, None, None, None, None, None, None, payload, icrc)


class DataTemplate:
    """What every packet of one RDMA Write repeats (DestQP, METH, R_Key, DMA length, ImmDt), range-checked
    once: a data packet is then encoded with one `struct.pack` of the fields that change from packet to
    packet (opcode, AckReq, RTX, PSN, VA, pad), and becomes a `Packet` only where a driver wants one.
    Raises `WireError` naming the field that does not fit. Packets from a template carry no TSETH."""

    __slots__ = ("dest_qp", "dma_len", "immdt", "meth", "rkey")

    def __init__(
        self, dest_qp: int, rqmsn: int, msn: int, rkey: int, dma_len: int, imm_data: int | None
    ) -> None:
        meth = METH(rqmsn, msn)
        reth = RETH(0, rkey, dma_len)
        immdt = ImmDt(imm_data) if imm_data is not None else None
        make_bth(OP_WRITE_ONLY, dest_qp, False, False, 0).validate()
        meth.validate(BTH.SIZE)
        reth.validate(BTH.SIZE + METH.SIZE)
        if immdt is not None:
            immdt.validate(BTH.SIZE + METH.SIZE + RETH.SIZE)
        self.dest_qp = dest_qp
        self.meth = meth
        self.rkey = rkey
        self.dma_len = dma_len
        self.immdt = immdt

    def header(
        self, op: int, ack_req: bool, rtx: bool, psn: int, va: int, n: int, sealed: bool = False
    ) -> bytes:
        """BTH, METH, RETH and (for the two opcodes that carry it) ImmDt of the data packet ``op`` with
        ``n`` payload bytes: what `Packet.encode_headers` gives for `packet`'s result. ``op`` is a data
        opcode, ``psn`` 24 bits and ``va`` 64 bits (the caller's: the core checks a Write's VA range when
        it is posted). ``sealed``: BTH's bit S set (**[openmrc]**, `openmrc.wire.security`), for a packet
        of an authenticated QP."""
        meth = self.meth
        w8 = (ack_req << 31) | (sealed << 30) | (rtx << 29) | psn
        imm = self.immdt
        if imm is not None and op in (OP_WRITE_LAST_WITH_IMM, OP_WRITE_ONLY_WITH_IMM):
            return _IMM_DATA_PACK(
                op,
                (-n & 3) << 4,
                0xFFFF,
                self.dest_qp,
                w8,
                meth.rqmsn,
                meth.msn,
                va,
                self.rkey,
                self.dma_len,
                imm.imm_data,
            )
        return _PLAIN_DATA_PACK(
            op, (-n & 3) << 4, 0xFFFF, self.dest_qp, w8, meth.rqmsn, meth.msn, va, self.rkey, self.dma_len
        )

    def packet(self, op: int, ack_req: bool, rtx: bool, psn: int, va: int, payload: memoryview) -> Packet:
        """The data packet ``op`` as a `Packet` (METH and ImmDt shared by the Write's packets)."""
        imm = self.immdt if op in (OP_WRITE_LAST_WITH_IMM, OP_WRITE_ONLY_WITH_IMM) else None
        return data_packet(
            make_bth(op, self.dest_qp, ack_req, rtx, psn),
            self.meth,
            None,
            RETH(va, self.rkey, self.dma_len),
            imm,
            payload,
        )


def _check_payload(bth: BTH, reth: RETH, n: int, off: int, trimmed: bool) -> None:
    """Payload length against opcode, pad and RETH.DMA_length. ``off`` is where the payload starts."""
    if trimmed:
        return
    op = bth.opcode
    if (n + bth.pad) & 3:
        raise WireError("BTH", "pad", 1, f"payload {n} B + pad {bth.pad} B is not a multiple of 4")
    dma = reth.dma_len
    if op in _ONLY_INTS:
        if n != dma:
            raise WireError(
                "RETH", "dma_len", off - 4, f"{Opcode(op).name} carries {n} B but DMA length is {dma}"
            )
        return
    if op in _FM_INTS and bth.pad:
        raise WireError("BTH", "pad", 1, f"{Opcode(op).name} must be a whole number of words (pad {bth.pad})")
    if not 0 < n < dma:
        raise WireError(
            "RETH", "dma_len", off - 4, f"{Opcode(op).name} carries {n} B, outside (0, DMA length {dma})"
        )


def _payload_fits(op: int, n: int, pad: int, dma: int) -> bool:
    """Whether an untrimmed data packet's payload of ``n`` bytes agrees with its opcode, pad and DMA
    length (`_check_payload` says what is wrong when it does not)."""
    if (n + pad) & 3:
        return False
    if op in _ONLY_INTS:
        return n == dma
    return not (pad and op in _FM_INTS) and 0 < n < dma


PlainData = tuple[int, int, int, bool, int, int, int, memoryview]
"""(opcode, destination QP, PSN, AckReq, VA, R_Key, DMA length, payload) of a plain data packet; opcode 0
(no data opcode) when the packet is not one."""

NOT_PLAIN: Final[PlainData] = (0, 0, 0, False, 0, 0, 0, _EMPTY)
# What a plain data packet's responder reads of BTH, METH and RETH: P_Key and METH skipped. The bound
# method, not the Struct: compiled, calling it skips a method lookup by name per packet.
_PLAIN_READ: Final = struct.Struct("!BB2xII4xQII").unpack_from


def plain_data_fields(view: memoryview) -> PlainData:
    """What a responder needs of an untrimmed data packet without TSETH or ImmDt (nearly every packet of a
    transfer), read with one unpack and no header objects; ``view``: its bytes from BTH through the ICRC,
    a one-dimensional byte view. `NOT_PLAIN` (opcode 0) for any other packet, and for one that `parse`
    would reject: those take the full decode, which says what is wrong. (Never None: compiled, a tuple of
    fixed shape comes back in registers, not as an object.)"""
    total = len(view)
    if total < _PLAIN_DATA_SIZE + ICRC_SIZE:
        return NOT_PLAIN
    rel = view[0] - OP_WRITE_FIRST
    if rel < 0 or rel > 7 or not (_PLAIN_MASK >> rel) & 1:
        return NOT_PLAIN
    r = _PLAIN_READ(view, 0)
    op: int = r[0]  # (typed: compiled, what follows is native integer arithmetic, not object calls)
    b1: int = r[1]
    w4: int = r[2]
    w8: int = r[3]
    va: int = r[4]
    rkey: int = r[5]
    dma: int = r[6]
    if w8 & 0x10000000:  # BTH.TS: a TSETH follows
        return NOT_PLAIN
    pad = (b1 >> 4) & 3
    n = total - ICRC_SIZE - _PLAIN_DATA_SIZE - pad
    if n < 0 or (n + pad) & 3:
        return NOT_PLAIN
    if op == OP_WRITE_ONLY:
        if n != dma:
            return NOT_PLAIN
    elif (pad and op != OP_WRITE_LAST) or not 0 < n < dma:  # FIRST, MIDDLE: whole words; LAST: inside
        return NOT_PLAIN
    return (
        op,
        w4 & 0xFFFFFF,
        w8 & 0xFFFFFF,
        bool(w8 & 0x80000000),
        va,
        rkey,
        dma,
        view[_PLAIN_DATA_SIZE : _PLAIN_DATA_SIZE + n],
    )


def parse(data: bytes | bytearray | memoryview, *, trimmed: bool = False) -> Packet:
    """Decode one MRC UDP payload (BTH through ICRC). Raises only `WireError`."""
    try:
        return _parse(data, trimmed)
    except WireError:
        raise
    except Exception as exc:  # a codec bug must still surface as malformed input, never as a crash
        raise WireError("packet", "?", 0, f"undecodable: {exc!r}") from exc


def _parse(data: bytes | bytearray | memoryview, trimmed: bool) -> Packet:
    view = memoryview(data)
    if view.ndim != 1 or view.itemsize != 1:
        view = view.cast("B")
    total = len(view)
    if total < BTH.SIZE + ICRC_SIZE:
        hdr = "BTH" if total < BTH.SIZE else "ICRC"
        raise WireError(hdr, "length", total, f"truncated: {total} B is shorter than BTH + ICRC (16 B)")
    icrc = _ICRC.unpack_from(view, total - ICRC_SIZE)[0]
    op = view[0]
    if op in _DATA_INTS:
        ts = bool(view[8] & 0x10)
        imm_op = op in _IMM_INTS
        st = _DATA_ST[ts, imm_op]
        hlen = st.size
        if total - ICRC_SIZE >= hlen:  # hot path: every header in one unpack
            v = st.unpack_from(view, 0)
            bth = BTH.from_words(op, v[1], v[2], v[3], v[4])
            i = 7
            tseth = None
            if ts:
                tseth = TSETH(v[7], v[8] >> 15, v[8] & 0xF)
                i = 9
            reth = RETH(v[i], v[i + 1], v[i + 2])
            imm = ImmDt(v[i + 3]) if imm_op else None
            rest = total - ICRC_SIZE - hlen
            if trimmed:  # whatever the fabric left of the payload, less its pad when it is there
                n = rest - bth.pad if bth.pad <= rest else rest
            else:
                if bth.pad > rest:
                    raise WireError("BTH", "pad", 1, f"pad {bth.pad} B but only {rest} B follow the headers")
                n = rest - bth.pad
                if not _payload_fits(op, n, bth.pad, reth.dma_len):
                    _check_payload(bth, reth, n, hlen, False)  # raises with the precise reason
            return data_packet(bth, METH(v[5], v[6]), tseth, reth, imm, view[hlen : hlen + n], icrc)
    if op == _OP_SACK and total - ICRC_SIZE == _SACK_SIZE:  # hot path: a SACK in one unpack
        v = _SACK_ST.unpack_from(view, 0)
        if not v[1] & 0x30 and not v[4] & 0x10000000 and v[6] >> 6 != 3:  # no pad, no TS, M not reserved
            pkt = Packet(BTH.from_words(op, v[1], v[2], v[3], v[4]), icrc=icrc)
            pkt.seth = SETH.from_words(
                v[5], v[6], v[7], v[8], v[9], v[10], v[11], v[12], v[13], v[14], v[15], BTH.SIZE
            )
            w = v[18]
            pkt.cc_state = CcState(
                v[16], v[17] & 0x7FFF, bool(w & 0x80000000), (w >> 24) & 0x7F, w & 0xFFFFFF
            )
            return pkt
    buf = Buffer(view[: total - ICRC_SIZE])
    bth = BTH.pull(buf)
    if op in DATA_OPCODES:  # too short for its headers: pull them one by one to name the one cut off
        meth = METH.pull(buf)
        tseth = TSETH.pull(buf) if bth.ts else None
        reth = RETH.pull(buf)
        imm = ImmDt.pull(buf) if op in IMM_OPCODES else None
        start = buf.pos
        rest = buf.remaining
        if bth.pad > rest and not trimmed:
            raise WireError("BTH", "pad", 1, f"pad {bth.pad} B but only {rest} B follow the headers")
        n = max(rest - bth.pad, 0) if not trimmed or bth.pad <= rest else rest
        _check_payload(bth, reth, n, start, trimmed)
        payload = buf.pull_bytes(n, "payload", "data")
        return Packet(bth, meth, tseth, reth, imm, payload=payload, icrc=icrc)
    chain = _CONTROL_CHAIN.get(op)
    if chain is None:
        raise _opcode_error(op)
    if bth.ts:
        raise WireError("BTH", "ts", 8, f"TS bit set on {Opcode(op).name}, which carries no TSETH")
    if bth.pad:
        raise WireError("BTH", "pad", 1, f"pad {bth.pad} on {Opcode(op).name}, which carries no payload")
    pkt = Packet(bth, icrc=icrc)
    for attr, cls in chain:
        setattr(pkt, attr, cls.pull(buf))
    if buf.remaining:
        raise WireError(
            Opcode(op).name, "length", buf.pos, f"{buf.remaining} unexpected byte(s) after the headers"
        )
    return pkt
