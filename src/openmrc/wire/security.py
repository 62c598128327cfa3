"""**[openmrc]** The security trailer of an authenticated MRC packet: its layout, its codec and its nonce.

Theory of operation
-------------------
MRC 1.0 has no authentication (see docs/security.md). openmrc offers it as an extension both ends of a QP
agree on when the QP is set up (`openmrc.transport.QpSecurity`), modelled on the public concepts of the
Ultra Ethernet transport security sublayer: security domains, keys derived per domain and epoch, a sender
identity and a counter in every packet, replay windows per sender, two epochs live while keys rotate.
Nothing of it is in MRC 1.0; the layout below is openmrc's own.

An authenticated packet is an ordinary MRC packet with a trailer between its pad and its ICRC, and BTH's
reserved bit 6 of byte 8 (between A and RTX) set: **S**, sealed. The trailer ends with SECH and the tag,
always the last 32 bytes before the ICRC; a data packet may carry a header tag before them (flag H)::

    data:     BTH ... headers ... | payload | pad | [header tag (16)] | SECH (16) | tag (16) | ICRC (4)
    control:  BTH ... headers ...                                     | SECH (16) | tag (16) | ICRC (4)

so every header stays where MRC 1.0 puts it, an MRC 1.0 receiver ignores S, and the ICRC still covers
everything (a receiver checks it first, as for any packet). SECH, the security extension header, in
network byte order:

    ====== ====== ===================================================================================
    byte   bits   field
    ====== ====== ===================================================================================
    0      7..4   version: 1
    0      3..0   flags: bit 0 E (the payload is encrypted), bit 1 H (a header tag precedes SECH),
                  bit 2 W (the sender wants header tags on the data packets it receives); bit 3 0
    1      7..0   key epoch (mod 256): which of the domain's keys sealed the packet
    2..5          SDI, the security domain identifier (1 .. 2^32-1)
    6..9          SSI, the sending QP's secure source identifier (random per QP, never 0)
    10            reserved, 0
    11..15        counter: 40 bits, one more for every packet the sending QP seals (from 1)
    ====== ====== ===================================================================================

Both tags are AES-128-GCM's (the `cryptography` package), under two keys of the epoch (one for whole
packets, one for header tags), with the 96-bit nonce SSI (32 bits) | the sending QP's number (24) |
counter (40): no two packets of a domain share one while QP identities differ (a QP draws its SSI at
random; QP numbers are unique on a NIC).

- The tag covers the whole packet. Authentication only (E = 0): everything from BTH through SECH is
  authenticated data (no ciphertext). Encrypted (E = 1): a data packet's payload is encrypted in place
  (GCM keeps its length) and the headers, the pad, the header tag and SECH are authenticated with it.
- The header tag covers the headers (BTH through ImmDt) and SECH: what a trimming switch forwards. A switch
  that trims a packet with S set keeps its trailer, as it keeps the ICRC (`openmrc.wire.trim_datagram`
  reads H to know its length): the receiver verifies a trimmed packet's header tag and acts on it as on
  any trimmed packet (a fast NACK), and takes nothing else from it. A sender on a fabric that never
  trims may leave header tags out (one AES-GCM call less per packet); a trimmed packet without one is
  unverifiable, and recovered as a loss.
- W asks for header tags: a QP that received a trimmed packet without one (which it could not verify)
  sets W on every packet it seals from then on, and a peer QP whose header tags are ``"auto"`` (the
  default) puts them on its data packets from the first packet with W that verifies. So a QP pays for
  header tags only on a fabric that trims, from its first trimmed packet on (recovered as a loss).
"""

from __future__ import annotations

import struct
from typing import Final, NamedTuple

from openmrc.wire.buffer import WireError

__all__ = [
    "BTH_SEALED",
    "DATA_SEAL_OVERHEAD",
    "NONCE_LAYOUT",
    "SEAL_OVERHEAD",
    "SECH_FLAG_ENCRYPTED",
    "SECH_FLAG_HEADER_TAG",
    "SECH_FLAG_WANTS_HEADER_TAG",
    "SECH_LAYOUT",
    "SECH_SIZE",
    "SECH_VERSION",
    "TAG_SIZE",
    "SecurityHeader",
    "pack_sech",
    "seal_nonce",
    "trailer_length",
    "unpack_sech",
]

SECH_SIZE: Final = 16
TAG_SIZE: Final = 16
SEAL_OVERHEAD: Final = SECH_SIZE + TAG_SIZE
"""Bytes every authenticated packet carries beyond the MRC 1.0 packet: SECH and the tag (the last 32 bytes
before the ICRC)."""
DATA_SEAL_OVERHEAD: Final = SECH_SIZE + 2 * TAG_SIZE
"""Bytes an authenticated data packet with a header tag carries beyond the MRC 1.0 packet."""
BTH_SEALED: Final = 0x40
"""BTH byte 8's bit S: the packet carries a security trailer."""
SECH_VERSION: Final = 1
SECH_FLAG_ENCRYPTED: Final = 0x1
SECH_FLAG_HEADER_TAG: Final = 0x2
SECH_FLAG_WANTS_HEADER_TAG: Final = 0x4
COUNTER_MAX: Final = (1 << 40) - 1

SECH_LAYOUT: Final = struct.Struct("!BBIIBBI")
"""SECH as ``struct`` packs it: version/flags, epoch, SDI, SSI, reserved, counter >> 32, counter's low 32."""
NONCE_LAYOUT: Final = struct.Struct("!III")
"""The nonce as ``struct`` packs it: SSI, QP number << 8 | counter >> 32, counter's low 32 (each below
2^32: a compiled caller packs them unboxed)."""


class SecurityHeader(NamedTuple):
    """SECH's fields (see the module's table)."""

    encrypted: bool
    epoch: int
    sdi: int
    ssi: int
    counter: int
    header_tag: bool = False
    wants_header_tag: bool = False


def pack_sech(
    encrypted: bool,
    epoch: int,
    sdi: int,
    ssi: int,
    counter: int,
    header_tag: bool = False,
    wants_header_tag: bool = False,
) -> bytes:
    """The 16 bytes of SECH."""
    if not 0 <= epoch <= 0xFF or not 0 < sdi <= 0xFFFFFFFF or not 0 < ssi <= 0xFFFFFFFF:
        raise WireError("SECH", "field", 0, f"epoch {epoch}, SDI {sdi}, SSI {ssi} out of range")
    if not 0 < counter <= COUNTER_MAX:
        raise WireError("SECH", "counter", counter, "the counter is 40 bits, from 1")
    flags = (
        (SECH_FLAG_ENCRYPTED if encrypted else 0)
        | (SECH_FLAG_HEADER_TAG if header_tag else 0)
        | (SECH_FLAG_WANTS_HEADER_TAG if wants_header_tag else 0)
    )
    return SECH_LAYOUT.pack(
        SECH_VERSION << 4 | flags, epoch, sdi, ssi, 0, counter >> 32, counter & 0xFFFFFFFF
    )


def unpack_sech(data: bytes | bytearray | memoryview) -> SecurityHeader:
    """SECH's fields from its 16 bytes; `WireError` for a wrong version, unknown flags or reserved bits."""
    if len(data) != SECH_SIZE:
        raise WireError("SECH", "length", len(data), f"SECH is {SECH_SIZE} bytes")
    vf, epoch, sdi, ssi, rsvd, hi, lo = SECH_LAYOUT.unpack(data)
    if vf >> 4 != SECH_VERSION:
        raise WireError("SECH", "version", vf >> 4, f"only version {SECH_VERSION} is known")
    if vf & 0xF & ~(SECH_FLAG_ENCRYPTED | SECH_FLAG_HEADER_TAG | SECH_FLAG_WANTS_HEADER_TAG) or rsvd:
        raise WireError("SECH", "flags", vf & 0xF, "unknown flags or reserved bits set")
    if not sdi or not ssi:
        raise WireError("SECH", "sdi", sdi, "SDI and SSI are never 0")
    counter = hi << 32 | lo
    if not counter:
        raise WireError("SECH", "counter", 0, "the counter starts at 1")
    return SecurityHeader(
        bool(vf & SECH_FLAG_ENCRYPTED),
        epoch,
        sdi,
        ssi,
        counter,
        bool(vf & SECH_FLAG_HEADER_TAG),
        bool(vf & SECH_FLAG_WANTS_HEADER_TAG),
    )


def seal_nonce(ssi: int, qpn: int, counter: int) -> bytes:
    """The AES-GCM nonce of the packet ``counter`` of the QP ``qpn`` whose SSI is ``ssi``."""
    return NONCE_LAYOUT.pack(ssi, (qpn & 0xFFFFFF) << 8 | (counter >> 32 & 0xFF), counter & 0xFFFFFFFF)


def trailer_length(body: bytes | bytearray | memoryview) -> int:
    """The security trailer's length of the sealed packet ``body`` (BTH up to its ICRC, at least 32
    bytes): SECH and the tag, and the header tag if SECH's H says so."""
    return SEAL_OVERHEAD + (TAG_SIZE if body[len(body) - SEAL_OVERHEAD] & SECH_FLAG_HEADER_TAG else 0)
