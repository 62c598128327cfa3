"""MRC datagrams as a UDP socket sends and receives them: the ICRC from the datagram's addressing.

Theory of operation (RoCEv2, IBTA Annex A17; MRC-SPEC-NOTES §3)
----------------------------------------------------------------
The ICRC that ends every MRC packet covers the IP and UDP headers with their variant fields masked, then
BTH (byte 4 masked) and everything after it. A socket never shows the IP and UDP headers, but everything
the ICRC covers in them follows from what it does show: the source and destination addresses, the UDP
ports and the datagram's length. `Addressing` holds those four; `seal` writes the ICRC a datagram must
carry, `icrc_ok` checks one that arrived. The masked pseudo-header is the one
`openmrc.wire.icrc.compute_icrc` builds from a real header, so a sealed datagram framed by
`openmrc.wire.encapsulate` carries the same ICRC.

**[openmrc]** The IPv4 header's identification and flags are not masked by RoCEv2, and a socket cannot see
them: openmrc computes the ICRC as if they were 0 and DF (what Linux sends on a socket with path-MTU
discovery on, and what `encapsulate` writes).

Trimming: a switch that trims a packet rewrites the IP and UDP lengths, which the ICRC covers, so a trimmed
packet's ICRC cannot match. `trim_datagram` cuts a data packet to its headers (keeping the trailer) the way
the fabric does; a receiver accepts trimmed headers without the ICRC check (they carry no payload to
corrupt, and their worst effect is a retransmission request, which the requester checks against what it
has outstanding).
"""

from __future__ import annotations

import ipaddress
import struct
from typing import Final

from openmrc.wire.buffer import WireError
from openmrc.wire.constants import (
    MRC_UDP_PORT,
    OP_WRITE_LAST_WITH_IMM,
    OP_WRITE_ONLY_WITH_IMM,
    is_data_opcode,
)
from openmrc.wire.headers import BTH
from openmrc.wire.icrc import LRH_CRC, crc32, crc_from_bth, mask_correction
from openmrc.wire.packet import _ZERO_PAD, ICRC_SIZE, Packet
from openmrc.wire.security import BTH_SEALED, SEAL_OVERHEAD, trailer_length

__all__ = [
    "Addressing",
    "data_header_length",
    "datagram_icrc",
    "icrc_ok",
    "icrc_view_ok",
    "seal",
    "seal_header_parts",
    "seal_into",
    "seal_parts",
    "trim_datagram",
]

_MASKED_V4: Final = struct.Struct("!BBHHHBBH4s4sHHHH")  # IPv4 header + UDP header
_MASKED_V6: Final = struct.Struct("!IHBB16s16sHHHH")  # IPv6 header + UDP header
_ICRC: Final = struct.Struct("<I")
_ICRC_PACK: Final = _ICRC.pack  # bound once: compiled, calling it skips a method lookup per packet
_CRC32_RESIDUE: Final = (
    0x2144DF1C  # CRC-32 of any message followed by its own CRC, least significant byte first
)
_UDP: Final = 17


class Addressing:
    """The addressing of one datagram, as a socket gives it: source and destination IP, UDP ports.

    ``src``/``dst`` are IPv4 or IPv6 addresses (text, `ipaddress` objects or packed bytes), both of one
    family. Raises `ValueError` naming the argument that is wrong."""

    __slots__ = ("_pseudo", "dport", "dst", "sport", "src", "version")

    def __init__(
        self,
        src: str | bytes | ipaddress.IPv4Address | ipaddress.IPv6Address,
        dst: str | bytes | ipaddress.IPv4Address | ipaddress.IPv6Address,
        sport: int,
        dport: int = MRC_UDP_PORT,
    ) -> None:
        s, d = _packed(src, "src"), _packed(dst, "dst")
        if len(s) != len(d):
            raise ValueError(f"src and dst must be of one IP family, got {src!r} and {dst!r}")
        for name, port in (("sport", sport), ("dport", dport)):
            if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 0xFFFF:
                raise ValueError(f"{name}: {port!r} is not a UDP port (0..65535)")
        self.src = s
        self.dst = d
        self.sport = sport
        self.dport = dport
        self.version = 4 if len(s) == 4 else 6
        self._pseudo: dict[int, int] = {}  # UDP length -> CRC of the LRH stand-in and masked IP/UDP headers

    def pseudo_crc(self, udp_length: int) -> int:
        """The ICRC's running CRC after the 8 bytes standing for the LRH and the masked IP and UDP headers of
        a datagram of ``udp_length`` bytes with this addressing (computed once per length: a flow's data
        packets have one length, so the per-packet ICRC starts at BTH)."""
        crc = self._pseudo.get(udp_length)
        if crc is None:
            if len(self._pseudo) >= 64:
                self._pseudo.clear()
            crc = self._pseudo[udp_length] = crc32(_masked_headers(self, udp_length), LRH_CRC)
        return crc

    def reply(self, sport: int | None = None) -> Addressing:
        """The addressing of a datagram going back: addresses and ports swapped (source port ``sport``)."""
        return Addressing(self.dst, self.src, self.dport if sport is None else sport, self.sport)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Addressing):
            return NotImplemented
        return (self.src, self.dst, self.sport, self.dport) == (
            other.src,
            other.dst,
            other.sport,
            other.dport,
        )

    def __hash__(self) -> int:
        return hash((self.src, self.dst, self.sport, self.dport))

    def __repr__(self) -> str:
        ip = ipaddress.ip_address
        return f"Addressing({str(ip(self.src))!r}, {str(ip(self.dst))!r}, {self.sport}, {self.dport})"


def _packed(a: object, name: str) -> bytes:
    if isinstance(a, bytes | bytearray):
        if len(a) not in (4, 16):
            raise ValueError(f"{name}: a packed address is 4 or 16 bytes, got {len(a)}")
        return bytes(a)
    try:
        return ipaddress.ip_address(a).packed  # type: ignore[arg-type]
    except ValueError:
        raise ValueError(f"{name}: {a!r} is not an IPv4 or IPv6 address") from None


def _masked_headers(addr: Addressing, n: int) -> bytes:
    """The IP and UDP headers of a datagram of UDP length ``n``, variant fields masked as the ICRC wants."""
    if addr.version == 4:
        return _MASKED_V4.pack(
            0x45,
            0xFF,
            20 + n,
            0,
            0x4000,
            0xFF,
            _UDP,
            0xFFFF,
            addr.src,
            addr.dst,
            addr.sport,
            addr.dport,
            n,
            0xFFFF,
        )
    return _MASKED_V6.pack(0x6FFFFFFF, n, _UDP, 0xFF, addr.src, addr.dst, addr.sport, addr.dport, n, 0xFFFF)


def datagram_icrc(
    body: bytes | bytearray | memoryview, addr: Addressing, *more: bytes | bytearray | memoryview
) -> int:
    """The ICRC of an MRC UDP payload whose bytes before the ICRC trailer are ``body`` (at least BTH)
    followed by the parts ``more`` (e.g. a payload straight from registered memory, and its pad: a
    driver that sends scatter/gather never joins them)."""
    n = len(body) + ICRC_SIZE + 8  # UDP length
    for part in more:
        n += len(part)
    crc = crc_from_bth(addr.pseudo_crc(n), body, len(body))
    for part in more:
        crc = crc32(part, crc)
    return crc & 0xFFFFFFFF


def seal(data: Packet | bytes | bytearray | memoryview, addr: Addressing) -> bytes:
    """The MRC UDP payload of ``data`` (a `Packet`, or encoded bytes whose trailer is replaced) with the ICRC
    it must carry when sent with addressing ``addr``."""
    raw = data.encode() if isinstance(data, Packet) else bytes(data)
    if len(raw) < BTH.SIZE + ICRC_SIZE:
        raise WireError("packet", "length", len(raw), "an MRC packet is at least BTH + ICRC (16 B)")
    body = memoryview(raw)[:-ICRC_SIZE]
    return b"".join((body, _ICRC.pack(datagram_icrc(body, addr))))


def seal_parts(pkt: Packet, addr: Addressing) -> list[bytes | memoryview]:
    """`seal` as scatter/gather parts for ``sendmsg``: headers, the payload as the packet holds it (a view
    of registered memory is never copied), the pad if any, and the ICRC for ``addr``."""
    return seal_header_parts(pkt.encode_headers(), pkt.payload, addr)


def seal_header_parts(hdr: bytes, payload: memoryview, addr: Addressing) -> list[bytes | memoryview]:
    """`seal_parts` of a packet already encoded as its headers ``hdr`` (BTH through ImmDt, BTH.Pad set for
    ``payload``, e.g. by `openmrc.wire.DataTemplate.header`) and its payload."""
    out: list[bytes | memoryview] = []
    seal_into(out, hdr, payload, addr)
    return out


def seal_into(out: list[bytes | memoryview], hdr: bytes, payload: memoryview, addr: Addressing) -> None:
    """`seal_header_parts`, appended to ``out`` (a driver gathering several datagrams for one send)."""
    size = len(payload)
    pad = -size & 3
    length = len(hdr) + size + pad  # BTH up to the ICRC
    crc = crc32(hdr, addr.pseudo_crc(length + ICRC_SIZE + 8))
    out.append(hdr)
    if size:
        out.append(payload)
        crc = crc32(payload, crc)
        if pad:
            out.append(_ZERO_PAD[pad])
            crc = crc32(_ZERO_PAD[pad], crc)
    out.append(_ICRC_PACK((crc ^ mask_correction(length, hdr[4])) & 0xFFFFFFFF))


def icrc_ok(data: bytes | bytearray | memoryview, addr: Addressing) -> bool:
    """Whether the MRC UDP payload ``data``, received with addressing ``addr``, carries the right ICRC."""
    view = data if type(data) is memoryview else memoryview(data)
    if view.ndim != 1 or view.itemsize != 1:
        view = view.cast("B")
    return icrc_view_ok(view, addr)


def icrc_view_ok(view: memoryview, addr: Addressing) -> bool:
    """`icrc_ok` of a one-dimensional byte view (a receive path has one already).

    One CRC pass over the whole datagram, trailer included: a CRC-32 run over a message followed by its
    own CRC (little-endian, as RoCEv2 stores the ICRC) always ends at the same residue, so no slice of
    the body and no read of the trailer are needed."""
    total = len(view)
    if total < BTH.SIZE + ICRC_SIZE:
        return False
    crc = crc32(view, addr.pseudo_crc(total + 8)) ^ mask_correction(total, view[4])
    return crc & 0xFFFFFFFF == _CRC32_RESIDUE


def trim_datagram(data: bytes | bytearray | memoryview) -> bytes:
    """A data packet as a trimming switch forwards it: its headers (BTH through ImmDt) and the trailer (the
    ICRC, and the security trailer of a sealed packet, `openmrc.wire.security`), payload and pad cut off.
    Raises `WireError` for a control packet (never trimmed) or truncated input."""
    view = memoryview(data)
    if len(view) < BTH.SIZE + ICRC_SIZE:
        raise WireError("BTH", "length", len(view), "truncated: shorter than BTH + ICRC")
    op = view[0]
    if not is_data_opcode(op):
        raise WireError("BTH", "opcode", 0, f"opcode 0x{op:02x} is not a data packet; only data is trimmed")
    hlen = data_header_length(view)
    keep = ICRC_SIZE  # [openmrc] and a sealed packet's trailer (its length in SECH, 32 bytes from the end)
    if view[8] & BTH_SEALED and len(view) >= hlen + ICRC_SIZE + SEAL_OVERHEAD:
        keep += trailer_length(view[: len(view) - ICRC_SIZE])
    if len(view) < hlen + keep:
        raise WireError(
            "RETH", "length", len(view), f"truncated: {len(view)} B, headers need {hlen} B + {keep} B"
        )
    return b"".join((view[:hlen], view[-keep:]))


def data_header_length(view: bytes | bytearray | memoryview) -> int:
    """Where the payload of the data packet ``view`` (from BTH, at least its first 12 bytes) starts: BTH,
    METH, TSETH if BTH.TS says so, RETH, and ImmDt for the two opcodes that carry it."""
    op = view[0]
    hlen = BTH.SIZE + 4 + (4 if view[8] & 0x10 else 0) + 16
    if op in (OP_WRITE_LAST_WITH_IMM, OP_WRITE_ONLY_WITH_IMM):
        hlen += 4
    return hlen
