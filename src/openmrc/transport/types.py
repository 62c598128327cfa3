"""Verbs-level types of the transport core: work requests, completions, QP attributes, errors, PSN math."""

from __future__ import annotations

import errno
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from enum import IntEnum, IntFlag
from typing import Final

from mypy_extensions import mypyc_attr

from openmrc.wire import PSN_MASK, SETH, CcState, DataTemplate, Packet, SackM
from openmrc.wire.constants import OP_SACK, is_data_opcode
from openmrc.wire.headers import make_bth, service_time_code

__all__ = [
    "Access",
    "LocalProtocolError",
    "QpCapFlags",
    "QpState",
    "RecvWR",
    "SackTransmit",
    "SendFlags",
    "SendWR",
    "Sge",
    "Transmit",
    "TrimMark",
    "WcOpcode",
    "WcStatus",
    "WorkCompletion",
    "WrOpcode",
    "data_transmit",
    "psn_diff",
    "unwrap_psn",
]

_HALF: Final = 1 << 23
_EMPTY: Final = memoryview(b"")
_NO_EV: Final = bytes(32)
_QP_MASK: Final = 0xFFFFFF


def psn_diff(a: int, b: int) -> int:
    """Signed distance ``a - b`` between two 24-bit PSNs (wrap-aware, in [-2^23, 2^23))."""
    return ((a - b + _HALF) & PSN_MASK) - _HALF


def unwrap_psn(psn: int, near: int) -> int:
    """The unwrapped sequence number whose low 24 bits are ``psn`` and that lies nearest ``near``."""
    # psn_diff(psn, near & PSN_MASK) inlined (per packet): near and its low 24 bits agree modulo 2^24.
    return near + ((psn - near + _HALF) & PSN_MASK) - _HALF


@mypyc_attr(native_class=False)  # plain Python: openmrc.verbs.VerbsError extends it
class LocalProtocolError(ValueError):
    """API misuse (illegal transition, missing attribute, bad work request, bad argument), raised at once
    with nothing changed. ``errno`` as in verbs (EINVAL, ENOENT, ENOMEM ...); ``reason`` says what is wrong.
    A `ValueError`, so callers that only check arguments may catch that."""

    def __init__(self, err: int, reason: str) -> None:
        self.errno = err
        self.reason = reason
        super().__init__(f"[{errno.errorcode.get(err, err)}] {reason}")


@mypyc_attr(native_class=False)
class AckTimeoutWarning(UserWarning):
    """A QP asked for an ACK timeout (``timeout``: 1.024 µs · 2^timeout) below its NIC's floor
    (`NicConfig.min_ack_timeout_ns`), which it gets instead: a software NIC is descheduled for
    milliseconds, and a shorter timeout only fires for nothing."""


class QpState(IntEnum):
    RESET = 0
    INIT = 1
    RTR = 2
    RTS = 3
    ERROR = 6


class Access(IntFlag):
    """Memory-region access rights (ibv_access_flags values)."""

    LOCAL_WRITE = 1 << 0
    REMOTE_WRITE = 1 << 1


class WrOpcode(IntEnum):
    """Send work-request opcodes MRC supports (ibv_wr_opcode values)."""

    RDMA_WRITE = 0
    RDMA_WRITE_WITH_IMM = 1


class SendFlags(IntFlag):
    NONE = 0
    SIGNALED = 1 << 1  # IBV_SEND_SIGNALED


class WcStatus(IntEnum):
    """Work-completion status (ibv_wc_status values)."""

    SUCCESS = 0
    LOC_LEN_ERR = 1
    LOC_QP_OP_ERR = 2
    LOC_PROT_ERR = 4
    WR_FLUSH_ERR = 5
    REM_INV_REQ_ERR = 9
    REM_ACCESS_ERR = 10
    REM_OP_ERR = 11
    RETRY_EXC_ERR = 12
    FATAL_ERR = 19


class WcOpcode(IntEnum):
    RDMA_WRITE = 1
    RECV_RDMA_WITH_IMM = 129


class TrimMark(IntEnum):
    """How the fabric marked a received packet: intact, trimmed, or trimmed at the last hop."""

    NONE = 0
    TRIMMED = 1
    TRIMMED_LASTHOP = 2


_TRIM_NONE: Final = TrimMark.NONE
_TRIM_TRIMMED: Final = TrimMark.TRIMMED
_TRIM_LASTHOP: Final = TrimMark.TRIMMED_LASTHOP
_ADDR_END: Final = 1 << 128
_ADDR_MASK: Final = _ADDR_END - 1


class QpCapFlags(IntFlag):
    """mrc.h ``mrc_qp_cap``."""

    NONE = 0
    TRIM_NACK_DEST_UNSUPPORTED = 1 << 0
    DYNAMIC_MPR = 1 << 1
    SVC_TIME_DEST_UNSUPPORTED = 1 << 2


@dataclass(frozen=True, slots=True)
class Sge:
    """A scatter/gather element: local virtual address, length and the lkey of its memory region."""

    addr: int
    length: int
    lkey: int


@dataclass(frozen=True, slots=True)
class SendWR:
    """An RDMA Write (optionally with immediate) work request."""

    wr_id: int
    opcode: WrOpcode
    sg_list: Sequence[Sge]
    remote_addr: int
    rkey: int
    imm_data: int | None = None
    send_flags: SendFlags = SendFlags.SIGNALED


@dataclass(frozen=True, slots=True)
class RecvWR:
    """A receive work request, consumed by one incoming Write-with-Immediate (MRC needs no buffers)."""

    wr_id: int
    sg_list: Sequence[Sge] = ()


@dataclass(frozen=True, slots=True)
class WorkCompletion:
    wr_id: int
    status: WcStatus
    opcode: WcOpcode
    byte_len: int = 0
    imm_data: int | None = None
    qp_num: int = 0


# acyclic: no cyclic-GC header (16 bytes a packet in flight, millions of them); a Transmit refers to
# nothing that refers back to it (a PFC queue's packet can keep a fabric it outlives from the collector)
@mypyc_attr(acyclic=True)
class Transmit:
    """One packet the driver must send: on NIC ``port`` (1-based plane), towards ``peer`` along ``ev``.

    ``ev`` is the expanded EV (32 bytes; the driver turns it into UDP source port / flow label / SRv6
    addresses with `openmrc.ev.packet_fields`), ``entropy`` the 32-bit value the peer echoes back (for
    UDP and STEV EVs ``flow_label << 16 | udp_sport``). ``packet`` is the decoded `Packet`: the core never
    emits bytes; the driver encodes it (and seals it with the ICRC of its addressing). ``size`` is the
    payload bytes of a data packet (0 for control packets), for a driver's pacing.

    A data packet leaves the core as its Write's `DataTemplate` (``tpl``) and the fields that change per
    packet (``op``, ``ack_req``, ``rtx``, ``psn``, ``va``, ``payload``): a driver that sends bytes encodes
    those with one ``tpl.header(...)`` call; ``packet`` builds the `Packet` on first use. Setting
    ``packet`` replaces what the driver sends (the template is dropped). A SACK leaves the core the same
    way, as its fields (`SackTransmit`). A packet of an authenticated QP leaves sealed: ``body`` holds its
    bytes from BTH through the security trailer (`openmrc.transport.security`), which a driver sends as they
    are (adding the ICRC) and an in-process fabric hands to `Nic.receive_transmit`; None for every other.

    The rest are the fields a simulated fabric uses while the packet is in flight, so that a packet in
    flight is this one object (a large simulation has millions; a sans-IO driver ignores them):
    ``wire_size`` the bytes on the wire (headers included; a trim cuts it to the headers), ``src`` the
    sending node, ``addr`` the destination address (an SRv6 uSID carrier a switch shifts, as an int;
    held as an offset into ``ev`` after `route_by_ev`), ``seg`` the segment of its one SRH entry (0:
    none), ``flow_crc`` the switch-independent part of the ECMP hash (-1: not computed yet), ``ecn`` its
    CE mark, ``trim`` how a switch trimmed it, ``epoch`` the epoch of the link it travels (a link that
    went down since loses it), ``hop`` the port that delivered it to the node it is at (lossless
    fabrics), ``is_data`` whether it is a data packet (no `Packet` is built to tell). The packet's
    destination is ``peer``, its plane ``port``.
    """

    __slots__ = (
        "_lasthop",
        "_packet",
        "_route",
        "_trimmed",
        "ack_req",
        "body",
        "ecn",
        "entropy",
        "epoch",
        "ev",
        "flow_crc",
        "hop",
        "is_data",
        "op",
        "payload",
        "peer",
        "port",
        "psn",
        "qp_num",
        "rtx",
        "size",
        "src",
        "tpl",
        "va",
        "wire_size",
    )

    def __init__(
        self,
        port: int,
        peer: Hashable,
        ev: bytes,
        entropy: int,
        packet: Packet | None,
        qp_num: int = 0,
        size: int = 0,
    ) -> None:
        self.port = port
        self.peer = peer
        self.ev = ev
        self.entropy = entropy
        self._packet = packet
        self.qp_num = qp_num
        self.size = size
        self.tpl: DataTemplate | None = None
        self.op = 0
        # the flags side by side: the compiled build packs them into one word
        self.ack_req = False
        self.rtx = False
        self.ecn = False
        self.is_data = packet is not None and is_data_opcode(packet.bth.opcode)
        self._trimmed = False  # `trim`, as two more flags in their word
        self._lasthop = False
        self.psn = 0
        self.va = 0
        self.payload = _EMPTY
        self.wire_size = 0
        self.src = 0
        self._route = 0
        self.flow_crc = -1
        self.epoch = 0
        self.hop: object = None
        self.body: bytes | None = None

    # The address and segment share one slot, ``_route``: at or above 0 the address int, the segment int
    # above its 128 bits; below 0 the EV's address (`route_by_ev`) with its active uSID at byte -_route & 31.
    @property
    def addr(self) -> int:
        r = self._route
        if r >= 0:
            return r if r < _ADDR_END else r & _ADDR_MASK
        ev, at = self.ev, -r & 31  # the EV's address, its uSIDs shifted left to the one at byte `at` (a
        # fabric may keep more than the offset in the bits above: `openmrc.sim.routing`)
        return int.from_bytes(ev[:4], "big") << 96 | int.from_bytes(ev[at:16], "big") << 8 * (at - 4)

    @addr.setter
    def addr(self, v: int) -> None:
        if not 0 <= v < _ADDR_END:
            raise ValueError(f"address {v} is not a 128-bit value")
        r = self._route
        self._route = v if r < _ADDR_END else v | r >> 128 << 128  # (r < 0: the EV's, no segment)

    @property
    def seg(self) -> int:
        r = self._route
        return r >> 128 if r >= 0 else 0

    @seg.setter
    def seg(self, v: int) -> None:
        if v < 0:
            raise ValueError(f"segment {v} is negative")
        self._route = self.addr | v << 128

    def route_by_ev(self) -> None:
        """Make the packet's destination address its EV's (the first 16 of its 32 bytes, no SRH
        segment) without an int of it: a fabric then reads the active uSID from the EV at byte
        ``-_route`` and a shift moves that offset on (a 128-bit int is 48 bytes a packet in flight, and a
        shift made a new one at every hop)."""
        self._route = -4

    @property
    def trim(self) -> TrimMark:
        if self._lasthop:
            return _TRIM_LASTHOP
        return _TRIM_TRIMMED if self._trimmed else _TRIM_NONE

    @trim.setter
    def trim(self, v: TrimMark) -> None:
        self.trim_code = int(v)

    @property
    def trim_code(self) -> int:
        """`trim` as its plain int value (0, 1 or 2), made of its two flags without an enum: what a
        simulator ships across processes per packet."""
        return 2 if self._lasthop else 1 if self._trimmed else 0

    @trim_code.setter
    def trim_code(self, n: int) -> None:
        self._trimmed = n != 0
        self._lasthop = n == 2

    @property
    def packet(self) -> Packet:
        pkt = self._packet
        if pkt is None:
            pkt = self._packet = self._build()
        return pkt

    @packet.setter
    def packet(self, pkt: Packet) -> None:
        self._packet = pkt
        self.tpl = None
        self.is_data = is_data_opcode(pkt.bth.opcode)

    def has_packet(self) -> bool:
        """Whether a `Packet` exists for this transmission (given, built on demand, or set): until then it
        is carried by its fields."""
        return self._packet is not None

    def payload_len(self) -> int:
        """The payload bytes of the packet (no `Packet` is built to tell)."""
        pkt = self._packet
        if pkt is not None:
            return len(pkt.payload)
        return len(self.payload)

    def _build(self) -> Packet:
        tpl = self.tpl
        assert tpl is not None, "a Transmit holds a packet or a data template"
        return tpl.packet(self.op, self.ack_req, self.rtx, self.psn, self.va, self.payload)

    def __repr__(self) -> str:
        return (
            f"Transmit(port={self.port}, peer={self.peer!r}, entropy=0x{self.entropy:08x}, "
            f"packet={self.packet!r}, qp_num=0x{self.qp_num:06x}, size={self.size})"
        )


def data_transmit(
    port: int,
    peer: Hashable,
    ev: bytes,
    entropy: int,
    qp_num: int,
    tpl: DataTemplate,
    op: int,
    ack_req: bool,
    rtx: bool,
    psn: int,
    va: int,
    payload: memoryview,
) -> Transmit:
    """A data packet's `Transmit`, by its Write's template and the fields of this packet (no `Packet`)."""
    t = Transmit(port, peer, ev, entropy, None, qp_num, len(payload))
    t.tpl = tpl
    t.is_data = True
    t.op = op
    t.ack_req = ack_req
    t.rtx = rtx
    t.psn = psn
    t.va = va
    t.payload = payload
    return t


@mypyc_attr(acyclic=True)
class SackTransmit(Transmit):
    """A SACK leaving the core as its fields (SETH and CC_STATE values, 24-bit QP numbers): the simulator
    carries them to the peer's `Nic.receive_transmit`, which hands them to `Requester.on_sack_fields`, so
    no `Packet` is built; ``packet`` builds it (BTH + SETH + CC_STATE) for a driver that needs bytes.

    ``cack_psn`` is the cumulative PSN (low 24 bits, the BTH PSN too), ``ack_psn_offset`` the triggering
    packet's PSN minus it, ``sack_offset`` the bitmap's base minus it, ``echo`` the triggering packet's
    entropy, ``m`` the SETH M field, ``pr`` the probe-reply flag, ``qp_num`` / ``dest_qp`` the sending and
    receiving QP numbers (SETH carries their low 16 bits), ``mpr`` the advertised MPR; ``ts_echo``,
    ``ooo_count`` and ``rcvd_256b`` the CC_STATE values.

    A large simulation has millions of SACKs in flight, so the fields live, packed by their widths, in
    the slots of a data packet's fields that a SACK does not use (``psn``, ``op``, ``va``: the bitmap,
    ``ack_req``: the probe-reply flag) and in two of its own: a SACK is 16 bytes more than a data
    packet's `Transmit` instead of 96 (a `Packet` with its BTH, SETH and CC_STATE would be about 500
    more). A field outside its width is a ValueError."""

    __slots__ = ("_qps", "sack_offset")

    def __init__(
        self,
        qp_num: int,
        dest_qp: int,
        cack_psn: int,
        ack_psn_offset: int,
        sack_offset: int,
        bitmap: int,
        echo: int,
        m: int,
        pr: bool,
        mpr: int,
        ts_echo: int,
        ooo_count: int,
        rcvd_256b: int,
    ) -> None:
        super().__init__(0, None, _NO_EV, 0, None, qp_num, 0)  # the NIC sets port, peer, ev, entropy
        if not (
            0 <= dest_qp <= _QP_MASK
            and 0 <= cack_psn <= PSN_MASK
            and -0x8000 <= ack_psn_offset <= 0x7FFF
            and 0 <= echo <= 0xFFFFFFFF
            and 0 <= m <= 3
            and 0 <= mpr <= 0xFF
            and 0 <= ts_echo <= 0xFFFF
            and 0 <= ooo_count <= 0x7FFF
            and 0 <= rcvd_256b <= 0xFFFFFF
        ):
            raise ValueError("a SACK field is outside its width")
        self.va = bitmap
        self.ack_req = pr
        self.sack_offset = sack_offset
        # packed below 2**62 (the compiled build keeps such ints unboxed): cack_psn 24 | ts_echo 16 |
        # ooo_count 15, echo 32 | mpr 8 | m 2 | ack_psn_offset 16, dest_qp 24 | rcvd_256b 24 | svc 8
        self.psn = cack_psn | ts_echo << 24 | ooo_count << 40
        self.op = echo | mpr << 32 | m << 40 | (ack_psn_offset & 0xFFFF) << 42
        self._qps = dest_qp | rcvd_256b << 24

    @property
    def cack_psn(self) -> int:
        return self.psn & PSN_MASK

    @property
    def ts_echo(self) -> int:
        return (self.psn >> 24) & 0xFFFF

    @property
    def ooo_count(self) -> int:
        return self.psn >> 40

    @property
    def bitmap(self) -> int:
        return self.va

    @property
    def pr(self) -> bool:
        return self.ack_req

    @property
    def echo(self) -> int:
        return self.op & 0xFFFFFFFF

    @property
    def mpr(self) -> int:
        return (self.op >> 32) & 0xFF

    @property
    def m(self) -> int:
        return (self.op >> 40) & 3

    @property
    def ack_psn_offset(self) -> int:
        off = self.op >> 42
        return off - 0x10000 if off & 0x8000 else off

    @property
    def dest_qp(self) -> int:
        return self._qps & _QP_MASK

    @property
    def rcvd_256b(self) -> int:
        return (self._qps >> 24) & 0xFFFFFF

    @property
    def arrived(self) -> int:
        """When the packet that triggered it reached the responder's host (ns of the NIC's clock; 0: not
        told). A driver that knows when the SACK leaves stamps the service time from it (`stamp_service`).
        Kept in the slot of ``src`` until the SACK leaves the NIC (a simulated fabric sets ``src`` as it
        takes a packet, and stamps none: a SACK is the size it was without it)."""
        return self.src

    @arrived.setter
    def arrived(self, at: int) -> None:
        self.src = at

    @property
    def svc(self) -> int:
        """SETH's ``svc`` code: the responder's service time (`openmrc.wire.service_time_code`; 0: none)."""
        return self._qps >> 48

    def stamp_service(self, now: int) -> None:
        """The SACK leaves at ``now``: its service time is how long its trigger had been in the host
        (nothing when `arrived` was not told)."""
        arrived = self.arrived
        if arrived <= 0:
            return
        code = service_time_code(now - arrived)
        self._qps = (self._qps & 0xFFFFFFFFFFFF) | code << 48
        pkt = self._packet
        if pkt is not None and pkt.seth is not None:
            pkt.seth.svc = code

    @property
    def qps_word(self) -> int:
        """``dest_qp | rcvd_256b << 24 | svc << 48``: with ``psn``, ``op`` and ``va``, the words the fields
        are packed in (`sack_of_words` makes a SACK of them again)."""
        return self._qps

    def payload_len(self) -> int:
        pkt = self._packet
        return 0 if pkt is None else len(pkt.payload)

    def _build(self) -> Packet:
        cack = self.cack_psn
        dqp = self.dest_qp
        return Packet(
            make_bth(OP_SACK, dqp, False, False, cack),
            None,
            None,
            None,
            None,
            None,
            SETH(
                0,
                0,
                SackM(self.m),
                self.pr,
                self.ack_psn_offset,
                self.echo,
                self.qp_num & 0xFFFF,
                dqp & 0xFFFF,
                cack,
                1,
                0,
                self.mpr,
                self.sack_offset,
                self.bitmap,
                self.svc,
            ),
            CcState(self.ts_echo, self.ooo_count, False, 0, self.rcvd_256b),
        )


def sack_of_words(
    qp_num: int, psn: int, op: int, va: int, qps: int, sack_offset: int, pr: bool
) -> SackTransmit:
    """The `SackTransmit` whose packed words (``psn``, ``op``, ``va``, `SackTransmit.qps_word`) these are,
    as another SACK holds them: what a split simulation ships of a SACK (`openmrc.sim.crossing`), read
    back without taking the fields apart. A word beyond its fields' widths is a ValueError."""
    if not (
        0 <= psn < 1 << 55 and 0 <= op < 1 << 58 and 0 <= va <= 0xFFFFFFFFFFFFFFFF and 0 <= qps < 1 << 56
    ):
        raise ValueError("a SACK word is outside its fields' widths")
    t = SackTransmit(qp_num, 0, 0, 0, sack_offset, 0, 0, 0, pr, 0, 0, 0, 0)
    t.psn = psn
    t.op = op
    t.va = va
    t._qps = qps
    return t
