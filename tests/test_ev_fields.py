"""Packet fields of expanded EVs: STEV port/flow label, UDP port, SRv6 addresses, the 32-bit echo."""

from __future__ import annotations

from collections.abc import Callable
from ipaddress import IPv6Address

import pytest
from hypothesis import given
from hypothesis import strategies as st

from openmrc.ev import (
    EVConfigError,
    EVField,
    EVFields,
    EVFormatMode,
    EVFormatProfile,
    EVProfile,
    EVProfileMode,
    ev_echo32,
    packet_fields,
    srv6_fields,
    stev_fields,
    udp_sport,
)

STEV, SRV6, UDP = EVFormatMode.STEV, EVFormatMode.SRV6, EVFormatMode.UDP


def hx(s: str) -> bytes:
    return bytes.fromhex(s.replace(" ", ""))


def crc32_ref(data: bytes) -> int:
    """Bitwise CRC-32 (IEEE 802.3, reflected polynomial 0xEDB88320), written out independently."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0xEDB88320 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def test_crc_reference_check_value() -> None:
    assert crc32_ref(b"123456789") == 0xCBF43926


STEV_EV = hx("12345678") + bytes(28)
UDP_EV = hx("abcd") + bytes(30)
# OCP's "SRv6 explicit" example expanded with uSIDs 1..4: locator cafe:cafe, no SRH.
SRV6_EV = hx("cafecafe 0001 0002 0003 0004") + bytes(20)
# OCP's "SRv6+SRH explicit" example expanded with uSIDs 1..8: 6 uSIDs, then SRH locator decafbad + 2 uSIDs.
SRH_EV = hx("cafecafe 0001 0002 0003 0004 0005 0006 decafbad 0007 0008") + bytes(8)


def test_stev_fields() -> None:
    # Low 16 bits of the 32-bit EV -> UDP source port; high 16 bits -> low 16 bits of the flow label.
    assert stev_fields(STEV_EV) == (0x5678, 0x1234)
    assert stev_fields(hx("ffff0001") + bytes(28)) == (0x0001, 0xFFFF)
    assert stev_fields(hx("00000000ffff")) == (0, 0)  # only bytes 0-3 count


def test_udp_sport() -> None:
    assert udp_sport(UDP_EV) == 0xABCD
    assert udp_sport(hx("0102ff")) == 0x0102


def test_srv6_fields() -> None:
    assert srv6_fields(SRV6_EV) == (IPv6Address("cafe:cafe:1:2:3:4::"), None)
    dst, srh = srv6_fields(SRH_EV)
    assert dst == IPv6Address("cafe:cafe:1:2:3:4:5:6")
    assert srh == IPv6Address("deca:fbad:7:8::")
    # Any non-zero bit in bytes 16-31 makes an SRH segment, even the very last one.
    assert srv6_fields(bytes(31) + b"\x01") == (IPv6Address("::"), IPv6Address("::1"))


def test_ev_echo32() -> None:
    assert ev_echo32(STEV_EV, STEV) == 0x12345678
    assert ev_echo32(UDP_EV, UDP) == 0xABCD
    assert ev_echo32(SRV6_EV, SRV6) == crc32_ref(SRV6_EV)
    assert ev_echo32(SRH_EV, SRV6) == crc32_ref(SRH_EV)
    assert ev_echo32(SRV6_EV, SRV6) != ev_echo32(SRH_EV, SRV6)


def test_srv6_echo_distinguishes_swapped_words() -> None:
    """A plain XOR fold of the u32 words would give these two EVs the same echo."""
    a = hx("fc000000 00010002 00030004") + bytes(20)
    b = hx("fc000000 00030004 00010002") + bytes(20)
    assert ev_echo32(a, SRV6) != ev_echo32(b, SRV6)


@given(st.binary(min_size=32, max_size=32), st.integers(0, 255 - 31), st.integers(1, (1 << 32) - 1))
def test_srv6_echo_never_collides_within_a_32_bit_window(base: bytes, at: int, delta: int) -> None:
    """EVs that differ only inside one 32-bit window (e.g. one or two adjacent uSIDs) never share an echo."""
    other = (int.from_bytes(base, "big") ^ (delta << (256 - 32 - at))).to_bytes(32, "big")
    assert ev_echo32(base, SRV6) != ev_echo32(other, SRV6)


def test_packet_fields_stev() -> None:
    f = packet_fields(STEV, STEV_EV)
    assert f == EVFields(STEV, udp_sport=0x5678, flow_label=0x1234, echo32=0x12345678)
    assert f.dst is None and f.srh_segment is None


def test_packet_fields_udp() -> None:
    assert packet_fields(UDP, UDP_EV) == EVFields(UDP, udp_sport=0xABCD, flow_label=0, echo32=0xABCD)


def test_packet_fields_srv6() -> None:
    echo = crc32_ref(SRH_EV)
    f = packet_fields(SRV6, SRH_EV)
    assert f.udp_sport == echo & 0xFFFF
    assert f.flow_label == echo >> 16
    assert f.echo32 == echo
    assert f.dst == IPv6Address("cafe:cafe:1:2:3:4:5:6")
    assert f.srh_segment == IPv6Address("deca:fbad:7:8::")
    assert packet_fields(SRV6, SRV6_EV).srh_segment is None


@pytest.mark.parametrize("mode", [STEV, UDP, SRV6])
@given(ev=st.binary(min_size=32, max_size=32))
def test_echo_is_what_a_responder_reads_back(mode: EVFormatMode, ev: bytes) -> None:
    f = packet_fields(mode, ev)
    assert 0 <= f.udp_sport <= 0xFFFF
    assert 0 <= f.flow_label <= 0xFFFF  # EV bits fill only the low 16 bits of the 20-bit label
    assert ((f.flow_label & 0xFFFF) << 16) | f.udp_sport == f.echo32


def test_packet_fields_from_a_profile() -> None:
    fmt = EVFormatProfile(SRV6, (32, 16, 16, 16, 16))
    fields = (EVField(32, 0xCAFECAFE),) + (EVField(16, mask=0xFFFF),) * 4
    compact = hx("0001000200030004")
    p = EVProfile(EVProfileMode.EXP, fmt, fields, 1, evs=(compact,))
    expanded = p.expand(compact)
    assert expanded == SRV6_EV
    assert packet_fields(p, expanded) == packet_fields(SRV6, SRV6_EV)
    stev = EVProfile(EVProfileMode.GEN, EVFormatProfile(STEV, (16, 16)), (EVField(16, mask=0xFFFF),) * 2, 4)
    assert packet_fields(stev, stev.expand(hx("12345678"))).udp_sport == 0x5678
    with pytest.raises(EVConfigError, match=r"^fmt:"):
        packet_fields(EVProfile(EVProfileMode.AUTO, None), bytes(32))


@pytest.mark.parametrize(
    ("call", "n"),
    [
        (lambda b: stev_fields(b), 3),
        (lambda b: udp_sport(b), 1),
        (lambda b: srv6_fields(b), 31),
        (lambda b: ev_echo32(b, SRV6), 31),
        (lambda b: ev_echo32(b, STEV), 3),
        (lambda b: packet_fields(SRV6, b), 31),
    ],
)
def test_short_expanded_raises(call: Callable[[bytes], object], n: int) -> None:
    with pytest.raises(EVConfigError, match=r"^expanded:"):
        call(bytes(n))


def test_bad_mode_raises() -> None:
    with pytest.raises(ValueError):
        packet_fields(8, bytes(32))  # type: ignore[arg-type]
    with pytest.raises(EVConfigError, match=r"^mode:"):
        ev_echo32(bytes(32), 8)  # type: ignore[arg-type]
