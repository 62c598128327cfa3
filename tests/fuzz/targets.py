"""The fuzz targets: `openmrc.wire.parse`, `openmrc.wire.parse_frame` and the receive path of a live NIC pair.

Each target takes one fuzzer input and raises (an `AssertionError` naming the invariant, or whatever the code
under test let escape) when an invariant breaks; it returns normally for everything the code may
legitimately do, rejecting the input included. The same functions serve atheris (`tests.fuzz.run`) and the
plain in-process replay of the seed corpus (`tests/test_fuzz.py`), so a corpus or crash file reproduces
with an ordinary traceback: ``python -m tests.fuzz.run nic --replay FILE``.

Input layouts (everything after the layout's own bytes is the datagram or frame):

* ``parse``: byte 0 bit 0 = ``trimmed``; then one MRC UDP payload (BTH through ICRC).
* ``frame``: byte 0 bit 0 ``ether``, bit 1 ``check_icrc``, bit 2 ``trimmed``, bit 3 any UDP port,
  bit 4 no UDP checksum check; then one frame.
* ``nic``: see `NicInput` and `Record`: a small legitimate Write, then length-prefixed datagrams, each with
  a control header choosing the NIC, port, trim mark, ECN, sealing, a live destination QP and R_Key/VA.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from openmrc.provider.loopback import Impairments, Pair
from openmrc.transport import Access, MemoryRegion, NicConfig, Qp, RecvWR, TrimMark, WcStatus, unwrap_psn
from openmrc.wire import (
    DATA_OPCODES,
    MRC_UDP_PORT,
    RESERVED_QP_ENDPOINT,
    Addressing,
    EpOp,
    Frame,
    NackReason,
    Opcode,
    Packet,
    WireError,
    encapsulate,
    icrc_ok,
    parse,
    parse_frame,
    seal,
)

__all__ = [
    "TARGETS",
    "Live",
    "NicInput",
    "Outcome",
    "Record",
    "make_live",
    "nic_case",
    "target_frame",
    "target_nic",
    "target_parse",
]

OPCODES = frozenset(int(o) for o in Opcode)
DATA = frozenset(int(o) for o in DATA_OPCODES)

#: Known bugs in src/ the targets find, each with a reproducer in tests/test_fuzz.py (an xfail that turns
#: into a failure once the bug is fixed). While a bug is listed, an input that may hit it has the invariant
#: it breaks relaxed, so that the fuzzer keeps looking for other bugs; ``OPENMRC_FUZZ_STRICT=1`` turns
#: that off (a long run then stops at the first of them). Remove an entry once its reproducer passes.
KNOWN_BUGS: dict[str, str] = {}  # none open: W1 and K3 are fixed (tests/test_fuzz.py keeps them)
STRICT = os.environ.get("OPENMRC_FUZZ_STRICT", "") not in ("", "0")


def _known(bug: str) -> bool:
    return bug in KNOWN_BUGS and not STRICT


def _no_hidden_crash(err: WireError) -> None:
    """`parse` and `parse_frame` turn any internal exception into a WireError (a safety net for the NIC);
    the fuzzer must still see it: a WireError *caused by* another exception is a codec bug."""
    cause = err.__cause__
    if cause is not None and not isinstance(cause, WireError):
        raise AssertionError(f"codec bug behind a WireError: {cause!r}") from cause


# -- parse ---------------------------------------------------------------------------------------------------


def target_parse(data: bytes) -> None:
    """`parse` returns a Packet or raises WireError; a parsed packet re-encodes (or raises WireError only)
    to bytes that parse to an equal packet and encode to the same bytes again."""
    if not data:
        return
    trimmed = bool(data[0] & 1)
    try:
        pkt = parse(data[1:], trimmed=trimmed)
    except WireError as err:
        _no_hidden_crash(err)
        return
    assert pkt.bth.opcode in OPCODES, f"parse accepted opcode {pkt.bth.opcode:#04x}"
    try:
        enc = pkt.encode(trimmed=trimmed)
    except WireError as err:
        _no_hidden_crash(err)
        return
    if trimmed and pkt.bth.opcode in DATA and len(pkt.payload) % 4 and _known("W1"):
        return
    try:
        again = parse(enc, trimmed=trimmed)
    except WireError as err:
        raise AssertionError(f"round trip: encode() gave bytes parse() rejects: {err}") from err
    assert again == pkt, f"round trip: {again!r} != {pkt!r}"
    assert again.encode(trimmed=trimmed) == enc, "round trip: re-encoding changed the bytes"


# -- parse_frame ---------------------------------------------------------------------------------------------


def target_frame(data: bytes) -> None:
    """`parse_frame` returns a Frame or raises WireError, honours ``check_icrc`` and ``udp_port``; a frame it
    accepts (untrimmed) re-frames with `encapsulate` to one with the same addressing and packet."""
    if not data:
        return
    flags = data[0]
    ether, check_icrc, trimmed = bool(flags & 1), bool(flags & 2), bool(flags & 4)
    udp_port = None if flags & 8 else MRC_UDP_PORT
    try:
        fr = parse_frame(
            data[1:],
            ether=ether,
            check_icrc=check_icrc,
            check_udp=not flags & 16,
            udp_port=udp_port,
            trimmed=trimmed,
        )
    except WireError as err:
        _no_hidden_crash(err)
        return
    assert isinstance(fr.packet, Packet)
    assert fr.icrc_ok or not check_icrc or trimmed, "check_icrc accepted a bad ICRC"
    assert udp_port is None or fr.dport == udp_port, f"udp_port {udp_port} accepted dport {fr.dport}"
    if trimmed:
        return  # a trimmed data packet does not re-encode untrimmed
    pkt = fr.packet
    try:
        raw = encapsulate(
            pkt,
            src=fr.src,
            dst=fr.dst,
            sport=fr.sport,
            dport=fr.dport,
            flow_label=fr.flow_label,
            traffic_class=fr.traffic_class,
            srv6=fr.srv6,
            ether=ether,
        )
    except WireError as err:
        _no_hidden_crash(err)
        return
    try:
        again = parse_frame(raw, ether=ether, udp_port=None)
    except WireError as err:
        raise AssertionError(f"round trip: encapsulate() gave a frame parse_frame() rejects: {err}") from err
    assert again.icrc_ok
    assert _addressing_of(again) == _addressing_of(fr), f"round trip: {again!r} != {fr!r}"
    again.packet.icrc = pkt.icrc  # the original's ICRC may be wrong (check_icrc off); the rest must match
    assert again.packet == pkt, f"round trip: {again.packet!r} != {pkt!r}"


def _addressing_of(f: Frame) -> tuple[object, ...]:
    return (f.src, f.dst, f.sport, f.dport, f.traffic_class, f.flow_label, f.srv6)


# -- the NIC receive path ------------------------------------------------------------------------------------

#: Small packets keep the fuzzer's mutations on headers rather than payload bytes (any MTU is legitimate).
MTU = 256
REGION = 16 * MTU  # each NIC's remote-writable region
GUARD = 256
LOCAL = 2 * MTU  # NIC b's local-only region
SEED = 11
IMM = 0xC0FFEE
MAX_RECORDS = 48
MAX_STEPS = 20_000  # to the legitimate Write's completion; a real run needs a few hundred at most
DRAIN_STEPS = 64
NIC_CONFIG = NicConfig(mtu=MTU, default_ev_count=32)
_ADDR_SPORTS = (0xC000, 0xC001, 0x1234)


def _addressing(to: str, variant: int) -> Addressing:
    if variant == 3:
        return Addressing("192.0.2.15", "192.0.2.1" if to == "a" else "192.0.2.2", 0xC003)
    return Addressing("2001:db8::f", f"2001:db8::{to}", _ADDR_SPORTS[variant])


@dataclass
class Live:
    """A pair with guarded regions (see ``guarded_pair`` in tests/test_transport_robustness.py): each NIC's
    remote-writable region is a slice of a larger buffer with random guard bytes around it; NIC a's source
    buffer and a second region of NIC b are local-only, and the pair's original destination buffer is
    deregistered. None of those bytes may ever change."""

    p: Pair
    backing: dict[str, bytearray]
    guards: dict[str, bytes]
    remote: dict[str, MemoryRegion]
    local_b: bytearray
    local_b_mr: MemoryRegion
    local_b_copy: bytes
    src_copy: bytes
    old_dst: bytearray
    old_dst_mr: MemoryRegion

    def qp(self, nic: str) -> Qp:
        return self.p.qp_a if nic == "a" else self.p.qp_b

    def key_target(self, nic: str, which: int) -> MemoryRegion:
        """R_Key/VA targets for forged Writes to ``nic``: 1 its remote region, 2 its local-only region,
        3 a foreign key (the other NIC's region; for b, its deregistered region)."""
        if which == 1:
            return self.remote[nic]
        if which == 2:
            return self.p.mr_a if nic == "a" else self.local_b_mr
        return self.remote["b"] if nic == "a" else self.old_dst_mr

    def intact(self) -> str | None:
        """What was written that must not have been, or None."""
        for k, b in self.backing.items():
            if bytes(b[:GUARD]) + bytes(b[GUARD + REGION :]) != self.guards[k]:
                return f"guard bytes around NIC {k}'s region"
        if bytes(self.p.src) != self.src_copy:
            return "NIC a's local-only source buffer"
        if bytes(self.local_b) != self.local_b_copy:
            return "NIC b's local-only region"
        if any(self.old_dst):
            return "NIC b's deregistered region"
        return None


def make_live(imp: Impairments | None = None) -> Live:
    """Deterministic: every call gives the same QP numbers, keys and addresses (the corpus relies on it)."""
    p = Pair(
        seed=SEED,
        buf_size=REGION,
        imp=imp,
        config=NIC_CONFIG,
        timeout=6,  # 65 µs RTO and few retries: a QP that cannot finish fails within a bounded run
        retry_linear=3,
        retry_exp=2,
    )
    rng = random.Random(SEED)
    backing, guards, remote = {}, {}, {}
    for name, nic in (("a", p.a), ("b", p.b)):
        g1, g2 = rng.randbytes(GUARD), rng.randbytes(GUARD)
        backing[name] = bytearray(g1) + bytearray(REGION) + bytearray(g2)
        guards[name] = g1 + g2
        remote[name] = nic.register(memoryview(backing[name])[GUARD : GUARD + REGION])
    old_dst, old_dst_mr = p.dst, p.mr_b
    p.b.deregister(p.mr_b)
    p.mr_b = remote["b"]
    p.dst = remote["b"].view  # type: ignore[assignment]
    local_b = bytearray(rng.randbytes(LOCAL))
    local_b_mr = p.b.register(local_b, Access.LOCAL_WRITE)
    return Live(
        p, backing, guards, remote, local_b, local_b_mr, bytes(local_b), bytes(p.src), old_dst, old_dst_mr
    )


class Reader:
    """Consumes a fuzzer input; reads past its end give zeros / short byte strings, never an error."""

    __slots__ = ("data", "pos")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    @property
    def left(self) -> int:
        return len(self.data) - self.pos

    def u8(self) -> int:
        if self.pos >= len(self.data):
            return 0
        self.pos += 1
        return self.data[self.pos - 1]

    def take(self, n: int) -> bytes:
        out = self.data[self.pos : self.pos + n]
        self.pos += len(out)
        return out


_TRIMS = (TrimMark.NONE, TrimMark.NONE, TrimMark.TRIMMED, TrimMark.TRIMMED_LASTHOP)


@dataclass(frozen=True)
class Record:
    """One fuzzed datagram and how it is delivered.

    Bytes: ``c0`` (bits 0-1 pair steps before it, bit 2 to NIC b else a, bits 3-4 trim mark (0, 1 none,
    2 TRIMMED, 3 TRIMMED_LASTHOP), bit 5 sealed with the ICRC its addressing needs, bit 6 ECN, bit 7 ``src``
    is the real peer's name (else None: derived from the source IP)); ``c1`` (bits 0-1 port - 1, bits 2-3
    destination QP: 0 as in the bytes, 1 the receiving NIC's live QP, 2 the other NIC's QP, 3 the endpoint
    QP 2; bits 4-5 R_Key/VA of a data packet: 0 as in the bytes, else `Live.key_target`; bits 6-7 the
    addressing, three IPv6 source ports or IPv4); with a key, a signed 16-bit VA offset from the region's
    start; the datagram's length (one byte, 255: two more bytes follow) and its bytes.
    """

    datagram: bytes
    to: str = "b"
    steps: int = 0
    trim: TrimMark = TrimMark.NONE
    sealed: bool = True
    ecn: bool = False
    as_peer: bool = False
    port: int = 1
    qp: int = 0
    key: int = 0
    va_offset: int = 0
    addr: int = 0

    def encode(self) -> bytes:
        c0 = self.steps | (self.to == "b") << 2 | (0 if self.trim is TrimMark.NONE else self.trim + 1) << 3
        c0 |= self.sealed << 5 | self.ecn << 6 | self.as_peer << 7
        c1 = (self.port - 1) | self.qp << 2 | self.key << 4 | self.addr << 6
        out = bytes((c0, c1))
        if self.key:
            out += (self.va_offset & 0xFFFF).to_bytes(2, "big")
        n = len(self.datagram)
        out += bytes((n,)) if n < 255 else b"\xff" + n.to_bytes(2, "big")
        return out + self.datagram

    @classmethod
    def decode(cls, r: Reader) -> Record:
        c0, c1 = r.u8(), r.u8()
        key = (c1 >> 4) & 3
        off = 0
        if key:
            off = int.from_bytes(r.take(2).rjust(2, b"\0"), "big", signed=True)
        n = r.u8()
        if n == 255:
            n = int.from_bytes(r.take(2).rjust(2, b"\0"), "big")
        return cls(
            r.take(n),
            "b" if c0 & 4 else "a",
            c0 & 3,
            _TRIMS[(c0 >> 3) & 3],
            bool(c0 & 32),
            bool(c0 & 64),
            bool(c0 & 128),
            1 + (c1 & 3),
            (c1 >> 2) & 3,
            key,
            off,
            c1 >> 6,
        )


@dataclass(frozen=True)
class NicInput:
    """A whole ``nic`` input: the legitimate Write (``packets`` MTU-sized packets minus ``short`` bytes,
    with immediate data or not; header bytes ``h0`` = packets - 1 | imm << 2, ``h1`` = short), then the
    records."""

    packets: int = 3
    imm: bool = False
    short: int = 0
    records: tuple[Record, ...] = ()

    @property
    def length(self) -> int:
        return self.packets * MTU - self.short

    def encode(self) -> bytes:
        head = bytes(((self.packets - 1) | self.imm << 2, self.short))
        return head + b"".join(r.encode() for r in self.records)

    @classmethod
    def decode(cls, data: bytes) -> NicInput:
        r = Reader(data)
        h0, h1 = r.u8(), r.u8()
        records: list[Record] = []
        while r.left and len(records) < MAX_RECORDS:
            records.append(Record.decode(r))
        return cls(1 + (h0 & 3), bool(h0 & 4), h1, tuple(records))


@dataclass
class Outcome:
    """What one ``nic`` input did (for the corpus checks and statistics)."""

    records: int = 0
    delivered: int = 0  # past the ICRC gate and the parser
    potent: list[str] = field(default_factory=list)  # why (c) was relaxed, per potent datagram
    known: list[str] = field(default_factory=list)  # known src bugs it may hit (tolerated unless strict)
    b_key: bool = False  # a delivered forged Write carried NIC b's real R_Key (outside the destination)
    opcodes: set[int] = field(default_factory=set)  # of the delivered datagrams
    status: WcStatus | None = None
    steps: int = 0


def _outstanding(qp: Qp, psn: int) -> bool:
    """Whether wire PSN ``psn`` is one ``qp``'s requester has sent and not had acknowledged."""
    r = qp.requester  # cack/next_seq: the requester's unwrapped PSN range [oldest unacked, next new)
    return r.cack <= unwrap_psn(psn, r.cack) < r.next_seq


def _acks_outstanding(qp: Qp, pkt: Packet) -> bool:
    """Whether a SACK acknowledges a PSN ``qp`` has outstanding (cumulatively or in its bitmap)."""
    seth = pkt.seth
    assert seth is not None
    r = qp.requester
    lo, hi = r.cack, r.next_seq
    cack = unwrap_psn(seth.cack_psn, lo)
    if cack > hi + r.mpr * 128:  # beyond any window the responder can have: dropped
        return False
    if cack > hi:  # the responder took forged Writes beyond what was sent: everything sent is acknowledged
        return hi > lo
    if cack > lo:
        return True
    base, bm = cack + seth.sack_offset, seth.bitmap
    return any(bm >> i & 1 and lo <= base + i < hi for i in range(64))


def potency(live: Live, to: str, pkt: Packet, as_peer: bool, psns: tuple[int, int]) -> tuple[str, str]:
    """Why a delivered forged packet may legitimately change the Write's outcome ("" if it may not), and
    which `KNOWN_BUGS` it may hit ("" if none). ``psns``: the Write's unwrapped PSNs ``[first, end)``.

    The rule for invariant (c): the Write (on QP a, towards QP b) must complete with SUCCESS and bit-exact
    data unless some fuzzed datagram passed the ICRC gate (sealed, or trim-marked) and the parser, reached
    a live QP, and
    * is data for QP b with a PSN of the Write not yet acknowledged: it takes that PSN (or draws a NAK or
      an UNEXP_EVENT NACK that is legitimate for it); RDMA has no authentication; or with a PSN in QP b's
      window that QP a has not sent: QP b's SACKs then acknowledge a PSN never sent, which QP a refuses;
    * is a SACK acknowledging, or a NACK or AETH NAK naming, a PSN QP a has outstanding; or a NACK asking
      again (NO_PKT_BUFFER) for a PSN QP a's cumulative acknowledgement passed within its window;
    * is a port status update claiming to come from the real peer (it legitimately takes paths away).
    Then the Write may complete with any status, and with SUCCESS each of its packets' bytes are either the
    source's or untouched (a forged SACK can acknowledge a packet that never arrived) — never a hang.
    Anything else must leave the transfer exactly as it would have been: data for PSNs the Write does not
    use, for QP a (receives are posted there: a forged Write-with-Imm completes harmlessly), probes, SACKs
    for PSNs never sent, NACKs and NAKs for PSNs not outstanding, endpoint traffic from a stranger.
    """
    bth = pkt.bth
    op = bth.opcode
    if bth.dest_qp == RESERVED_QP_ENDPOINT:
        if as_peer and pkt.erth is not None and pkt.erth.op == EpOp.PORT_STATUS_UPDATE:
            return f"port status update {pkt.erth.port_status:#x} from the real peer", ""
        return "", ""
    qp = live.qp(to)
    if bth.dest_qp != qp.qp_num:
        return "", ""
    if op in DATA:
        if to == "a":
            return "", ""
        r = live.p.qp_a.requester
        seq = unwrap_psn(bth.psn, r.cack)
        if r.cack <= seq < psns[1]:
            return f"data for PSN {bth.psn} of the Write", ""
        s = qp.responder  # cack: the cumulative PSN; window: MPR · 128
        if 0 <= unwrap_psn(bth.psn, s.cack) - s.cack < s.window and seq >= psns[1]:
            # QP b takes it (no authentication), and from then on its SACKs acknowledge a PSN QP a never
            # sent: they cannot be believed, and QP a, hearing nothing it can believe, times out
            return f"data for PSN {bth.psn}, never sent: QP b's SACKs cannot be believed any more", ""
        return "", ""
    if to == "b":
        return "", ""  # QP b's requester has nothing outstanding
    if op == Opcode.SACK and _acks_outstanding(qp, pkt):
        return "SACK acknowledging outstanding PSNs of QP a", ""
    if op == Opcode.NACK and pkt.neth is not None and _outstanding(qp, pkt.neth.psn):
        return f"NACK (reason {pkt.neth.reason}) for outstanding PSN {pkt.neth.psn}", ""
    if op == Opcode.NACK and pkt.neth is not None and pkt.neth.reason == NackReason.NO_PKT_BUFFER:
        r = qp.requester
        if r.cack - r.mpr * 128 <= unwrap_psn(pkt.neth.psn, r.cack) < r.cack:
            # the peer asks again for a PSN the cumulative acknowledgement passed: what QP a believed
            # was wrong, and it fails its QP rather than leave Writes complete with data missing
            return f"NACK asking again for acknowledged PSN {pkt.neth.psn}", ""
    if (
        op == Opcode.ACK
        and pkt.aeth is not None
        and pkt.aeth.syndrome >> 5 == 3
        and _outstanding(qp, bth.psn)
    ):
        return f"AETH NAK {pkt.aeth.syndrome:#x} for outstanding PSN {bth.psn}", ""
    return "", ""


def _step(p: Pair) -> bool:
    """`Pair.step`, then the driver contract: after `handle_timer(now)` no timer is due at or before now."""
    more = p.step()
    for name, nic in (("a", p.a), ("b", p.b)):
        t = nic.get_timer()
        assert t is None or t > p.now, f"NIC {name}: get_timer() = {t} <= now = {p.now} after a step"
    return more


def _reth_offset(raw: bytes | bytearray) -> int:
    return 16 + (4 if raw[8] & 0x10 else 0)  # BTH, METH, [TSETH]


def _parsed(raw: bytes | bytearray, trimmed: bool) -> Packet | None:
    try:
        return parse(raw, trimmed=trimmed)
    except WireError:
        return None


def _inject(live: Live, rec: Record, dst: tuple[int, int], psns: tuple[int, int], out: Outcome) -> None:
    """Hand one fuzzed datagram to its NIC, judging first what it may legitimately do."""
    p = live.p
    to = rec.to
    raw = bytearray(rec.datagram)
    if rec.qp and len(raw) >= 8:
        qpn = {1: live.qp(to).qp_num, 2: live.qp("a" if to == "b" else "b").qp_num}.get(rec.qp, 2)
        raw[5:8] = qpn.to_bytes(3, "big")
    if len(raw) >= 12 and raw[0] in DATA:
        off = _reth_offset(raw)
        if rec.key and len(raw) >= off + 12:
            mr = live.key_target(to, rec.key)
            raw[off : off + 8] = ((mr.addr + rec.va_offset) & (1 << 64) - 1).to_bytes(8, "big")
            raw[off + 8 : off + 12] = mr.rkey.to_bytes(4, "big")
    trimmed = rec.trim is not TrimMark.NONE
    pkt = _parsed(raw, trimmed)
    if to == "b" and pkt is not None and pkt.reth is not None and pkt.reth.rkey == live.remote["b"].rkey:
        n = len(pkt.payload)
        if not trimmed and n and pkt.reth.va < dst[1] and dst[0] < pkt.reth.va + n:
            # A forged Write with the real R_Key may legitimately overwrite the transfer's bytes: withhold
            # the key (any other key must be refused) so that the destination stays checkable.
            off = _reth_offset(raw)
            raw[off + 8 : off + 12] = (pkt.reth.rkey ^ 0x80000001).to_bytes(4, "big")
            pkt = _parsed(raw, trimmed)
    addr = _addressing(to, rec.addr)
    data = seal(raw, addr) if rec.sealed and len(raw) >= 16 else bytes(raw)
    if pkt is not None and (trimmed or icrc_ok(data, addr)) and not (trimmed and pkt.bth.opcode not in DATA):
        out.delivered += 1
        out.opcodes.add(pkt.bth.opcode)
        out.b_key |= to == "b" and pkt.reth is not None and pkt.reth.rkey == live.remote["b"].rkey
        why, bug = potency(live, to, pkt, rec.as_peer, psns)
        if why:
            out.potent.append(why)
        if bug and _known(bug):
            out.known.append(bug)
    nic = p.a if to == "a" else p.b
    peer = ("b" if to == "a" else "a") if rec.as_peer else None
    nic.receive_datagram(data, rec.port, now=p.now, addr=addr, ecn=rec.ecn, trim=rec.trim, src=peer)
    out.records += 1


def nic_case(inp: NicInput, live: Live | None = None) -> Outcome:
    """Run one ``nic`` input; raises AssertionError naming the broken invariant:
    (a) nothing escapes `receive_datagram`, `datagrams_to_send`, `handle_timer` (nor the harness's step);
    (b) no byte outside a legitimate transfer changes: guards, local-only and deregistered buffers, and
        NIC b's region outside the Write's destination unless a forged Write carried its R_Key;
    (c) the Write completes exactly once: with SUCCESS and bit-exact data unless a potent datagram (see
        `potency`) was delivered, and in any case within a bounded number of steps."""
    live = live or make_live()
    p = live.p
    out = Outcome()
    p.post_recv(4)
    for i in range(MAX_RECORDS):  # forged Writes-with-Imm to QP a consume these, not the QP
        p.qp_a.post_recv(RecvWR(10_000 + i))
    length = inp.length
    first = p.qp_a.requester.next_seq  # the Write's first PSN (unwrapped)
    wr = p.write(0, length, imm=IMM if inp.imm else None)
    psns = (first, first + -(-length // MTU))
    region = live.remote["b"]
    dst = (region.addr, region.addr + length)
    for rec in inp.records:
        for _ in range(rec.steps):
            if not _step(p):
                break
        _inject(live, rec, dst, psns, out)
    wcs = p.completions()
    while not wcs:
        assert out.steps < MAX_STEPS, f"hang: no completion after {MAX_STEPS} steps (now={p.now})"
        more = _step(p)
        out.steps += 1
        wcs = p.completions()
        assert more or wcs, f"hang: nothing left to happen and no completion (now={p.now})"
    for _ in range(DRAIN_STEPS):
        if not _step(p):
            break
    wcs += p.completions()
    assert [w.wr_id for w in wcs] == [wr], f"the Write completed as {wcs}, expected once"
    wc = wcs[0]
    out.status = wc.status
    broken = live.intact()
    assert broken is None, f"memory outside any legitimate transfer changed: {broken}"
    got, want = bytes(region.view[:length]), bytes(p.src[:length])
    if not out.b_key:
        assert not any(region.view[length:]), "NIC b's region changed outside the Write's destination"
    if not out.potent and not out.known:
        assert wc.status is WcStatus.SUCCESS, f"the Write failed ({wc.status!r}) with no potent datagram"
        assert got == want, "the Write succeeded but its destination is not bit-exact"
        if inp.imm:  # the Write's immediate comes first (forged Writes-with-Imm beyond it may follow)
            recv = [(w.status, w.imm_data, w.byte_len) for w in p.recv_completions()]
            assert recv[:1] == [(WcStatus.SUCCESS, IMM, length)], f"receive completions {recv}"
    elif wc.status is WcStatus.SUCCESS:
        for i in range(0, length, MTU):
            chunk = got[i : i + MTU]
            assert chunk == want[i : i + MTU] or not any(chunk), f"packet at offset {i}: foreign bytes"
    return out


def target_nic(data: bytes) -> None:
    nic_case(NicInput.decode(data))


def iter_corpus(target: str) -> Iterator[tuple[str, bytes]]:
    """(file name, bytes) of every seed of ``target``, in name order."""
    d = Path(__file__).parent / "corpus" / target
    for f in sorted(d.iterdir()):
        if f.is_file():
            yield f.name, f.read_bytes()


TARGETS: dict[str, Callable[[bytes], None]] = {
    "parse": target_parse,
    "frame": target_frame,
    "nic": target_nic,
}
