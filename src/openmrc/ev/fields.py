"""Packet fields carried by an expanded EV (MRC spec notes §2, EV format modes; mrc_ctl.h ``mrc_ctl_ev_t``).

Theory of operation: an expanded EV is 32 bytes, left-aligned, and what reaches the packet depends on the
format mode.

* STEV: bytes 0-3 are a 32-bit EV; its low 16 bits are the UDP source port and its high 16 bits the low 16
  bits of the IPv6 flow label (the flow label's top 4 bits stay zero).
* UDP: bytes 0-1 are a 16-bit EV, the UDP source port. **[openmrc]** the flow label is 0.
* SRV6: bytes 0-15 are the outer IPv6 destination (the uSID path); bytes 16-31, if not all zero, are the
  single segment of an SRH. A 32-bit value still rides in the source port / flow label (split as in STEV)
  so that the responder can echo it. **[openmrc]** that value is the CRC-32 (``zlib.crc32``) of the 32
  expanded bytes. A plain XOR fold of the eight 32-bit words would map uSID lists that differ only by
  swapping two words to the same echo. CRC-32 cannot collide for two EVs whose differences all fall within
  one 32-bit window. Other collisions are still possible, so an EV table keyed by echo must check for them.

The responder copies ``(flow_label & 0xffff) << 16 | sport`` into the SACK/NACK ``entropy echo``.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from ipaddress import IPv6Address

from openmrc.ev.profile import EVConfigError, EVFormatMode, EVProfile

__all__ = ["EVFields", "ev_echo32", "packet_fields", "srv6_fields", "stev_fields", "udp_sport"]

_ZERO16 = bytes(16)


def _need(expanded: bytes, n: int) -> None:
    if len(expanded) < n:
        raise EVConfigError("expanded", f"expanded EV is {len(expanded)} bytes, need at least {n}")


def stev_fields(expanded: bytes) -> tuple[int, int]:
    """(UDP source port, IPv6 flow label) of a STEV expanded EV."""
    _need(expanded, 4)
    ev = int.from_bytes(expanded[:4], "big")
    return ev & 0xFFFF, ev >> 16


def udp_sport(expanded: bytes) -> int:
    """UDP source port of a UDP-mode expanded EV (its first 16 bits)."""
    _need(expanded, 2)
    return int.from_bytes(expanded[:2], "big")


def srv6_fields(expanded: bytes) -> tuple[IPv6Address, IPv6Address | None]:
    """(outer destination uSID address, SRH segment or None) of an SRV6 expanded EV."""
    _need(expanded, 32)
    srh = bytes(expanded[16:32])
    return IPv6Address(bytes(expanded[:16])), (None if srh == _ZERO16 else IPv6Address(srh))


def ev_echo32(expanded: bytes, mode: EVFormatMode) -> int:
    """The 32-bit value put in source port / flow label for the responder to echo (see module docstring)."""
    if mode is EVFormatMode.STEV:
        _need(expanded, 4)
        return int.from_bytes(expanded[:4], "big")
    if mode is EVFormatMode.UDP:
        return udp_sport(expanded)
    if mode is EVFormatMode.SRV6:
        _need(expanded, 32)
        return zlib.crc32(expanded[:32])
    raise EVConfigError("mode", f"{mode!r} is not an EV format mode")


@dataclass(frozen=True, slots=True)
class EVFields:
    """Everything an expanded EV puts in a packet, for any format mode."""

    mode: EVFormatMode
    """The format mode the EV was expanded for."""
    udp_sport: int
    """UDP source port."""
    flow_label: int
    """IPv6 flow label (20 bits; only the low 16 are EV-derived)."""
    echo32: int
    """The value the responder echoes: ``(flow_label & 0xffff) << 16 | udp_sport``."""
    dst: IPv6Address | None = None
    """SRV6 only: outer IPv6 destination (uSID path)."""
    srh_segment: IPv6Address | None = None
    """SRV6 only: the single SRH segment, if any."""


def packet_fields(profile_or_mode: EVProfile | EVFormatMode, expanded: bytes) -> EVFields:
    """All packet fields of ``expanded`` for a profile's format mode (or an explicit mode)."""
    if isinstance(profile_or_mode, EVProfile):
        if profile_or_mode.fmt is None:
            raise EVConfigError("fmt", "profile has no EV format profile, so no format mode")
        mode = profile_or_mode.fmt.mode
    else:
        mode = EVFormatMode(profile_or_mode)
    echo = ev_echo32(expanded, mode)
    if mode is EVFormatMode.UDP:
        return EVFields(mode, echo, 0, echo)
    sport, label = echo & 0xFFFF, echo >> 16
    if mode is EVFormatMode.STEV:
        return EVFields(mode, sport, label, echo)
    dst, srh = srv6_fields(expanded)
    return EVFields(mode, sport, label, echo, dst, srh)
