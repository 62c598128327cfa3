"""IP/UDP framing around MRC packets, for raw sockets and captures.

A frame is ``[Ethernet] [outer IPv6 [SRH]] IPv4|IPv6 / UDP / MRC packet / ICRC``:

* the inner IP/UDP header is the RoCEv2 one (destination port 4791 unless configured otherwise), with a
  correct UDP checksum and, for IPv4, a correct header checksum;
* in SRv6 mode the inner packet is carried IPv6-in-IPv6 (RFC 8986 H.Encaps): the outer destination is the
  uSID path address, and an optional Segment Routing Header (RFC 8754, routing type 4) holds further
  segments, e.g. the single SRH address of an expanded 256-bit EV;
* the ICRC is computed over the inner IP packet (see `openmrc.wire.icrc`).
"""

from __future__ import annotations

import ipaddress
import socket
import struct
from dataclasses import dataclass, field

from openmrc.wire.buffer import WireError
from openmrc.wire.constants import MRC_UDP_PORT
from openmrc.wire.headers import BTH
from openmrc.wire.icrc import compute_icrc, icrc_bytes
from openmrc.wire.packet import ICRC_SIZE, Packet, parse
from openmrc.wire.security import BTH_SEALED, SEAL_OVERHEAD, trailer_length

__all__ = [
    "ETH_P_IPV4",
    "ETH_P_IPV6",
    "Frame",
    "SRv6Encap",
    "encapsulate",
    "ethernet",
    "internet_checksum",
    "ipv4_header",
    "ipv6_header",
    "parse_frame",
    "srh",
    "udp_header",
    "usid_final_address",
]

ETH_P_IPV4 = 0x0800
ETH_P_IPV6 = 0x86DD
_ETH_P_VLAN = 0x8100
IPPROTO_UDP = 17
IPPROTO_IPV6 = 41
IPPROTO_ROUTING = 43
SRH_ROUTING_TYPE = 4

_IPV4 = struct.Struct("!BBHHHBBH4s4s")
_IPV6 = struct.Struct("!IHBB16s16s")
_UDP = struct.Struct("!HHHH")


def internet_checksum(data: bytes | bytearray | memoryview) -> int:
    """RFC 1071 one's-complement sum, as used by IPv4 and UDP."""
    b = bytes(data)
    if len(b) & 1:
        b += b"\x00"
    # 2**16 ≡ 1 (mod 0xFFFF), so the end-around-carry sum of the 16-bit words is the whole number mod 0xFFFF,
    # except that one's complement arithmetic writes a non-zero multiple of 0xFFFF as 0xFFFF.
    x = int.from_bytes(b, "big")
    s = x % 0xFFFF
    if s == 0 and x:
        s = 0xFFFF
    return ~s & 0xFFFF


def usid_final_address(
    addr: str | bytes | int | ipaddress.IPv6Address, lblen: int = 32, nflen: int = 16
) -> str:
    """The address a uSID destination ends as after every NEXT-CSID shift: the locator block followed by
    its last non-zero uSID (RFC 9800 §6.5: the address an upper-layer checksum, and openmrc's ICRC, cover)."""
    if isinstance(addr, int):
        a = addr
    elif isinstance(addr, (str, ipaddress.IPv6Address)):
        a = int(ipaddress.IPv6Address(addr))
    else:
        a = int.from_bytes(addr[:16], "big")
    rest = 128 - lblen
    block, carrier = a >> rest, a & ((1 << rest) - 1)
    last = 0
    for shift in range(rest - nflen, -1, -nflen):
        u = (carrier >> shift) & ((1 << nflen) - 1)
        if u == 0:
            break
        last = u
    return str(ipaddress.IPv6Address((block << rest) | (last << (rest - nflen))))


def _addr(a: str | bytes, version: int) -> bytes:
    if isinstance(a, bytes):
        want = 4 if version == 4 else 16
        if len(a) != want:
            raise ValueError(f"address {a!r} is not {want} bytes")
        return a
    ip = ipaddress.ip_address(a)
    if ip.version != version:
        raise ValueError(f"address {a} is not IPv{version}")
    return ip.packed


def ipv4_header(
    src: str | bytes,
    dst: str | bytes,
    payload_len: int,
    *,
    tos: int = 0,
    ttl: int = 64,
    ident: int = 0,
    proto: int = IPPROTO_UDP,
) -> bytes:
    """A 20-byte IPv4 header (DF set, no options) with a correct header checksum."""
    hdr = bytearray(
        _IPV4.pack(0x45, tos, 20 + payload_len, ident, 0x4000, ttl, proto, 0, _addr(src, 4), _addr(dst, 4))
    )
    hdr[10:12] = internet_checksum(hdr).to_bytes(2, "big")
    return bytes(hdr)


def ipv6_header(
    src: str | bytes,
    dst: str | bytes,
    payload_len: int,
    *,
    next_header: int = IPPROTO_UDP,
    traffic_class: int = 0,
    flow_label: int = 0,
    hop_limit: int = 64,
) -> bytes:
    """A 40-byte IPv6 header."""
    if not 0 <= flow_label < 1 << 20:
        raise ValueError(f"flow_label {flow_label} does not fit 20 bits")
    w0 = (6 << 28) | (traffic_class << 20) | flow_label
    return _IPV6.pack(w0, payload_len, next_header, hop_limit, _addr(src, 6), _addr(dst, 6))


def udp_header(sport: int, dport: int, payload: bytes, src: bytes, dst: bytes) -> bytes:
    """An 8-byte UDP header with its checksum over the IPv4 or IPv6 pseudo-header (by address length)."""
    length = 8 + len(payload)
    if len(src) == 4:
        pseudo = src + dst + struct.pack("!BBH", 0, IPPROTO_UDP, length)
    else:
        pseudo = src + dst + struct.pack("!IxxxB", length, IPPROTO_UDP)
    csum = internet_checksum(pseudo + _UDP.pack(sport, dport, length, 0) + payload)
    return _UDP.pack(sport, dport, length, csum or 0xFFFF)


def srh(segments: list[str] | tuple[str, ...], *, next_header: int = IPPROTO_IPV6) -> bytes:
    """A Segment Routing Header whose segment list holds ``segments`` (the final segment first)."""
    if not segments:
        raise ValueError("an SRH needs at least one segment")
    n = len(segments)
    head = struct.pack("!BBBBBBH", next_header, 2 * n, SRH_ROUTING_TYPE, n, n - 1, 0, 0)
    return head + b"".join(_addr(s, 6) for s in segments)


def ethernet(
    ethertype: int, *, dst: bytes = b"\x02\x00\x00\x00\x00\x02", src: bytes = b"\x02\x00\x00\x00\x00\x01"
) -> bytes:
    return dst + src + ethertype.to_bytes(2, "big")


@dataclass(frozen=True, slots=True)
class SRv6Encap:
    """The outer IPv6 header (and optional SRH) of an SRv6-steered MRC packet."""

    #: Outer source address (the sending NIC port's SRv6 address).
    src: str
    #: Outer destination: the uSID path address (the expanded EV's first 16 bytes).
    dst: str
    #: SRH segment list, final segment first (e.g. the expanded EV's SRH address); empty → no SRH.
    segments: tuple[str, ...] = ()
    hop_limit: int = 64
    traffic_class: int = 0
    flow_label: int = 0


def encapsulate(
    packet: Packet | bytes,
    *,
    src: str,
    dst: str,
    sport: int,
    dport: int = MRC_UDP_PORT,
    flow_label: int = 0,
    traffic_class: int = 0,
    ttl: int = 64,
    srv6: SRv6Encap | None = None,
    ether: bool = False,
) -> bytes:
    """Frame an MRC packet; the ICRC trailer is computed and written. Returns the outermost bytes.

    ``src``/``dst`` choose IPv4 or IPv6 for the inner (RoCE) header; ``traffic_class`` is the IPv4 TOS or
    the IPv6 traffic class (its low two bits are ECN).
    """
    raw = packet.encode() if isinstance(packet, Packet) else bytes(packet)
    if len(raw) < ICRC_SIZE:
        raise WireError("packet", "length", 0, "an MRC packet is at least BTH + ICRC")
    body = raw[:-ICRC_SIZE]
    version = ipaddress.ip_address(src).version
    s, d = _addr(src, version), _addr(dst, version)
    udp_payload = body + b"\x00\x00\x00\x00"  # the ICRC is part of the UDP payload
    # The UDP checksum covers the ICRC, and the ICRC covers the UDP header with its checksum masked:
    # compute the ICRC first (checksum field is masked anyway), then the checksum over the final bytes.
    ulen = 8 + len(udp_payload)
    if version == 4:
        ip = ipv4_header(s, d, ulen, tos=traffic_class, ttl=ttl)
    else:
        ip = ipv6_header(s, d, ulen, traffic_class=traffic_class, flow_label=flow_label, hop_limit=ttl)
    provisional = ip + _UDP.pack(sport, dport, ulen, 0) + body
    trailer = icrc_bytes(compute_icrc(provisional))
    udp_payload = body + trailer
    inner = ip + udp_header(sport, dport, udp_payload, s, d) + udp_payload
    if srv6 is not None:
        if version != 6:
            raise ValueError("SRv6 encapsulation carries an inner IPv6 packet")
        ext = srh(list(srv6.segments)) if srv6.segments else b""
        nh = IPPROTO_ROUTING if ext else IPPROTO_IPV6
        outer = ipv6_header(
            srv6.src,
            srv6.dst,
            len(ext) + len(inner),
            next_header=nh,
            traffic_class=srv6.traffic_class,
            flow_label=srv6.flow_label,
            hop_limit=srv6.hop_limit,
        )
        inner = outer + ext + inner
    if ether:
        return ethernet(ETH_P_IPV6 if (version == 6 or srv6) else ETH_P_IPV4) + inner
    return inner


@dataclass(slots=True)
class Frame:
    """A decoded frame: the RoCE addressing, any SRv6 outer header, and the MRC packet."""

    src: str
    dst: str
    sport: int
    dport: int
    traffic_class: int
    flow_label: int
    packet: Packet
    srv6: SRv6Encap | None = None
    icrc_ok: bool = True
    segments_left: int = field(default=0)
    sealed: bytes | None = None
    """**[openmrc]** a sealed packet's security trailer (`openmrc.wire.security`; ``packet`` is the MRC
    packet inside it), None for a plain one."""
    udp_data: bytes = b""
    """The UDP payload as it was captured (trailer and ICRC included; a GSO batch's every datagram)."""
    udp_ok: bool = True
    """The UDP checksum is absent or right (with ``check_udp`` False, a capture's may be unfinished)."""

    def udp_payload(self) -> bytes:
        """The MRC UDP payload as it was on the wire (a sealed packet's trailer back in place)."""
        raw = self.packet.encode()
        if self.sealed is None:
            return raw
        head = bytearray(raw[:-ICRC_SIZE])
        head[8] |= BTH_SEALED  # (S is no field of the decoded BTH)
        return bytes(head) + self.sealed + raw[-ICRC_SIZE:]

    @property
    def ecn(self) -> int:
        return self.traffic_class & 3


def parse_frame(
    data: bytes | bytearray | memoryview,
    *,
    ether: bool = False,
    check_icrc: bool = True,
    check_udp: bool = True,
    udp_port: int | None = MRC_UDP_PORT,
    trimmed: bool = False,
) -> Frame:
    """Decode ``[Ethernet] [IPv6 [SRH]] IP / UDP / MRC``. Raises only `WireError`.

    With ``check_icrc`` a bad ICRC raises; without it ``Frame.icrc_ok`` tells. ``udp_port=None``
    accepts any destination port.
    """
    try:
        return _parse_frame(bytes(data), ether, check_icrc, check_udp, udp_port, trimmed)
    except WireError:
        raise
    except Exception as exc:
        raise WireError("frame", "?", 0, f"undecodable: {exc!r}") from exc


def _need(b: bytes, off: int, n: int, header: str) -> None:
    if off + n > len(b):
        raise WireError(header, "length", off, f"truncated: need {n} B, {len(b) - off} left")


def _parse_frame(
    b: bytes, ether: bool, check_icrc: bool, check_udp: bool, udp_port: int | None, trimmed: bool
) -> Frame:
    off = 0
    if ether:
        _need(b, 0, 14, "Ethernet")
        etype = int.from_bytes(b[12:14], "big")
        off = 14
        if etype == _ETH_P_VLAN:
            _need(b, 14, 4, "VLAN")
            etype = int.from_bytes(b[16:18], "big")
            off = 18
        if etype not in (ETH_P_IPV4, ETH_P_IPV6):
            raise WireError("Ethernet", "ethertype", 12, f"ethertype 0x{etype:04x} is not IP")
    _need(b, off, 1, "IP")
    encap: SRv6Encap | None = None
    seg_left = 0
    if b[off] >> 4 == 6:
        _need(b, off, 40, "IPv6")
        nh = b[off + 6]
        if nh in (IPPROTO_IPV6, IPPROTO_ROUTING):  # SRv6 outer header
            w0, _plen, _, hlim, osrc, odst = _IPV6.unpack_from(b, off)
            segs: tuple[str, ...] = ()
            p = off + 40
            if nh == IPPROTO_ROUTING:
                _need(b, p, 8, "SRH")
                nnh, ext_len, rtype, seg_left, last = b[p], b[p + 1], b[p + 2], b[p + 3], b[p + 4]
                if rtype != SRH_ROUTING_TYPE:
                    raise WireError("SRH", "routing_type", p + 2, f"routing type {rtype} is not SRH (4)")
                if nnh != IPPROTO_IPV6:
                    raise WireError("SRH", "next_header", p, f"next header {nnh} is not IPv6")
                _need(b, p, 8 + ext_len * 8, "SRH")
                if (last + 1) * 16 > ext_len * 8:
                    raise WireError("SRH", "last_entry", p + 4, "segment list longer than the header")
                segs = tuple(
                    str(ipaddress.IPv6Address(b[p + 8 + 16 * i : p + 24 + 16 * i])) for i in range(last + 1)
                )
                p += 8 + ext_len * 8
            encap = SRv6Encap(
                str(ipaddress.IPv6Address(osrc)),
                str(ipaddress.IPv6Address(odst)),
                segs,
                hlim,
                (w0 >> 20) & 0xFF,
                w0 & 0xFFFFF,
            )
            off = p
            _need(b, off, 40, "IPv6")
            if b[off] >> 4 != 6:
                raise WireError("IPv6", "version", off, "SRv6 inner packet is not IPv6")
    _need(b, off, 1, "IP")
    version = b[off] >> 4
    if version == 4:
        _need(b, off, 20, "IPv4")
        vihl, tos, tot_len, _id, _frag, _ttl, proto, _ck, s, d = _IPV4.unpack_from(b, off)
        ihl = (vihl & 0xF) * 4
        if ihl < 20:
            raise WireError("IPv4", "ihl", off, f"header length {ihl} < 20")
        _need(b, off, ihl, "IPv4")
        if internet_checksum(b[off : off + ihl]) != 0:
            raise WireError("IPv4", "checksum", off + 10, "bad header checksum")
        if proto != IPPROTO_UDP:
            raise WireError("IPv4", "protocol", off + 9, f"protocol {proto} is not UDP")
        end = off + tot_len
        tc, fl = tos, 0
        src, dst = socket.inet_ntop(socket.AF_INET, s), socket.inet_ntop(socket.AF_INET, d)
    elif version == 6:
        _need(b, off, 40, "IPv6")
        w0, plen, nh, _hl, s, d = _IPV6.unpack_from(b, off)
        if nh != IPPROTO_UDP:
            raise WireError("IPv6", "next_header", off + 6, f"next header {nh} is not UDP")
        ihl = 40
        end = off + 40 + plen
        tc, fl = (w0 >> 20) & 0xFF, w0 & 0xFFFFF
        src, dst = socket.inet_ntop(socket.AF_INET6, s), socket.inet_ntop(socket.AF_INET6, d)
    else:
        raise WireError("IP", "version", off, f"IP version {version} is neither 4 nor 6")
    if end > len(b):
        raise WireError("IP", "length", off + 2, f"IP length says {end - off} B, {len(b) - off} present")
    u = off + ihl
    _need(b[:end], u, 8, "UDP")
    sport, dport, ulen, ucsum = _UDP.unpack_from(b, u)
    if ulen < 8 or u + ulen > end:
        raise WireError("UDP", "length", u + 4, f"UDP length {ulen} does not fit the IP packet")
    if udp_port is not None and dport != udp_port:
        raise WireError("UDP", "dport", u + 2, f"destination port {dport} is not the MRC port {udp_port}")
    payload = b[u + 8 : u + ulen]
    udp_ok = not ucsum or udp_header(sport, dport, payload, s, d)[6:8] == ucsum.to_bytes(2, "big")
    if check_udp and not udp_ok:
        raise WireError("UDP", "checksum", u + 6, "bad UDP checksum")
    inner, sealed = payload, None
    if len(payload) >= BTH.SIZE + SEAL_OVERHEAD + ICRC_SIZE and payload[8] & BTH_SEALED:
        n = trailer_length(payload[:-ICRC_SIZE])
        if len(payload) - ICRC_SIZE - n >= BTH.SIZE:  # [openmrc] the packet inside its security trailer
            sealed = bytes(payload[len(payload) - ICRC_SIZE - n : len(payload) - ICRC_SIZE])
            inner = payload[: len(payload) - ICRC_SIZE - n] + payload[len(payload) - ICRC_SIZE :]
    pkt = parse(inner, trimmed=trimmed)
    icrc_ok = compute_icrc(b[off : u + ulen - ICRC_SIZE]) == pkt.icrc
    if check_icrc and not icrc_ok and not trimmed:
        raise WireError("ICRC", "icrc", u + ulen - ICRC_SIZE, "ICRC mismatch")
    return Frame(src, dst, sport, dport, tc, fl, pkt, encap, icrc_ok, seg_left, sealed, payload, udp_ok)
