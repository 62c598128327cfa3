"""The RoCEv2 invariant CRC (ICRC) that ends every MRC packet.

RoCEv2 (IBTA Annex A17) computes a CRC-32 (the Ethernet polynomial, as `zlib.crc32`) over::

    8 bytes of 0xFF (stands for the InfiniBand LRH)
    the IP header with its variant fields set to all ones:
        IPv4: TOS, TTL, header checksum          IPv6: traffic class, flow label, hop limit
    the UDP header with its checksum set to all ones
    BTH with byte 4 (FECN, BECN, reserved) set to all ones
    everything after BTH up to, not including, the ICRC

and stores the result least-significant byte first. In SRv6 mode the ICRC covers the inner (RoCE) IP
packet only; outer encapsulation is variant by nature.

The CRC-32 itself comes from zlib-ng's SIMD implementation when the ``zlib-ng`` package is installed
(``pip install openmrc[fast]``; about 3.5 times faster than the system zlib on a 4 KiB packet, which is
what a software NIC spends most of a packet's time on), else from `zlib`; both give the same values.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from typing import Final

from openmrc.wire.buffer import WireError

crc32: Callable[[bytes | bytearray | memoryview, int], int]
try:
    from zlib_ng.zlib_ng import crc32
except ImportError:  # pragma: no cover - the accelerator is optional
    crc32 = zlib.crc32

__all__ = ["LRH_CRC", "compute_icrc", "crc32", "crc_from_bth", "icrc_bytes", "icrc_over", "mask_correction"]

LRH_CRC: Final = zlib.crc32(b"\xff" * 8)
"""The CRC so far after the 8 bytes of all ones standing for the LRH (where every ICRC starts)."""
_UDP = 17


def crc_from_bth(crc: int, transport: bytes | bytearray | memoryview, end: int) -> int:
    """Continue the ICRC's running ``crc`` over ``transport[:end]``, which starts at BTH (at least its 12
    bytes), with BTH byte 4 (FECN, BECN, reserved) masked to all ones."""
    body = transport if end == len(transport) else memoryview(transport)[:end]
    return crc32(body, crc) ^ mask_correction(end, transport[4])


_CORRECTIONS: dict[int, int] = {}


def mask_correction(length: int, byte4: int) -> int:
    """What to XOR into ``crc32(T, c)`` of ``length`` bytes ``T`` starting at BTH whose byte 4 is ``byte4``
    to get the CRC of ``T`` with that byte masked to all ones (any ``c``).

    CRC-32 is affine: for messages of one length from one starting value, ``crc32(A, c) ^ crc32(B, c)``
    is ``crc32(A ^ B, 0) ^ crc32(zeros, 0)``. The masked and the real message differ only in byte 4, so
    the difference depends on the length and that byte alone, and it is cached: the per-packet ICRC is
    one pass of the SIMD CRC over the bytes as they are (several parts in a row), not a pass broken up
    around byte 4."""
    key = length << 8 | byte4
    corr = _CORRECTIONS.get(key)
    if corr is None:
        if length < 5:
            raise WireError("BTH", "length", length, "shorter than BTH's first 5 bytes")
        diff = bytearray(length)
        diff[4] = byte4 ^ 0xFF
        corr = zlib.crc32(diff, 0) ^ zlib.crc32(bytes(length), 0)
        if len(_CORRECTIONS) >= 1024:
            _CORRECTIONS.clear()
        _CORRECTIONS[key] = corr
    return corr


def icrc_over(masked_ip_udp: bytes | bytearray, transport: bytes | bytearray | memoryview) -> int:
    """The ICRC given the IP and UDP headers with their variant fields already masked, and the bytes from
    BTH up to (not including) the ICRC (at least BTH's 12 bytes); BTH byte 4 is masked here."""
    view = memoryview(transport)
    return crc_from_bth(crc32(masked_ip_udp, LRH_CRC), view, len(view)) & 0xFFFFFFFF


def compute_icrc(ip_packet: bytes | bytearray | memoryview) -> int:
    """ICRC of an IPv4 or IPv6 RoCE packet given from the IP header up to (not including) the ICRC."""
    pkt = bytes(ip_packet)
    if not pkt:
        raise WireError("IP", "version", 0, "empty packet")
    version = pkt[0] >> 4
    if version == 4:
        ihl = (pkt[0] & 0xF) * 4
        if ihl < 20 or len(pkt) < ihl + 8 + 12:
            raise WireError("IPv4", "ihl", 0, f"header length {ihl} B leaves no room for UDP and BTH")
        if pkt[9] != _UDP:
            raise WireError("IPv4", "protocol", 9, f"protocol {pkt[9]} is not UDP")
        ip = bytearray(pkt[:ihl])
        ip[1] = 0xFF  # TOS
        ip[8] = 0xFF  # TTL
        ip[10:12] = b"\xff\xff"  # header checksum
    elif version == 6:
        ihl = 40
        if len(pkt) < ihl + 8 + 12:
            raise WireError("IPv6", "payload_length", 4, "too short for UDP and BTH")
        if pkt[6] != _UDP:
            raise WireError("IPv6", "next_header", 6, f"next header {pkt[6]} is not UDP")
        ip = bytearray(pkt[:ihl])
        ip[0:4] = b"\x6f\xff\xff\xff"  # version stays; traffic class and flow label all ones
        ip[7] = 0xFF  # hop limit
    else:
        raise WireError("IP", "version", 0, f"IP version {version} is neither 4 nor 6")
    ip += pkt[ihl : ihl + 6] + b"\xff\xff"  # the UDP header, checksum masked
    return icrc_over(ip, memoryview(pkt)[ihl + 8 :])


def icrc_bytes(icrc: int) -> bytes:
    """The 4-byte trailer as it appears on the wire."""
    return (icrc & 0xFFFFFFFF).to_bytes(4, "little")
