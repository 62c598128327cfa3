"""ICRC against scapy's RoCEv2 implementation, IP/UDP/SRv6 framing, and frame-level strictness."""

from __future__ import annotations

import contextlib
import ipaddress
import random
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scapy.contrib.roce import BTH as ScapyBTH
from scapy.layers.inet import IP, UDP
from scapy.layers.inet6 import IPv6, IPv6ExtHdrSegmentRouting
from scapy.packet import Raw

from openmrc.wire import BTH, METH, RETH, Opcode, Packet, SRv6Encap, WireError, compute_icrc, parse_frame
from openmrc.wire.examples import example_conversation
from openmrc.wire.framing import _parse_frame, encapsulate, internet_checksum
from openmrc.wire.icrc import crc32, crc_from_bth, mask_correction

from .wire_strategies import packets

_V4 = ("10.1.2.3", "10.4.5.6")
_V6 = ("2001:db8:1::5", "2001:db8:2::9")


def _scapy_roce(raw: bytes, src: str, dst: str, sport: int, tc: int, ttl: int, flow: int) -> bytes:
    """The same packet built by scapy, which computes the RoCEv2 ICRC itself (icrc=None)."""
    b = raw[:12]
    bth = ScapyBTH(
        opcode=b[0],
        solicited=b[1] >> 7,
        migreq=(b[1] >> 6) & 1,
        padcount=(b[1] >> 4) & 3,
        version=b[1] & 15,
        pkey=int.from_bytes(b[2:4], "big"),
        fecn=b[4] >> 7,
        becn=(b[4] >> 6) & 1,
        resv6=b[4] & 0x3F,
        dqpn=int.from_bytes(b[5:8], "big"),
        ackreq=b[8] >> 7,
        resv7=b[8] & 0x7F,
        psn=int.from_bytes(b[9:12], "big"),
    ) / Raw(raw[12:-4])
    if ":" in src:
        ip = IPv6(src=src, dst=dst, tc=tc, fl=flow, hlim=ttl)
    else:
        ip = IP(src=src, dst=dst, tos=tc, ttl=ttl, flags="DF", id=0)
    return bytes(ip / UDP(sport=sport, dport=4791) / bth)


@settings(max_examples=120, deadline=None)
@given(
    pkt=packets(),
    v6=st.booleans(),
    sport=st.integers(0, 0xFFFF),
    tc=st.integers(0, 255),
    ttl=st.integers(1, 255),
    flow=st.integers(0, 0xFFFFF),
)
def test_icrc_and_checksums_match_scapy(
    pkt: Packet, v6: bool, sport: int, tc: int, ttl: int, flow: int
) -> None:
    src, dst = _V6 if v6 else _V4
    ours = encapsulate(
        pkt, src=src, dst=dst, sport=sport, traffic_class=tc, ttl=ttl, flow_label=flow if v6 else 0
    )
    theirs = _scapy_roce(pkt.encode(), src, dst, sport, tc, ttl, flow if v6 else 0)
    assert ours == theirs  # IP header, UDP checksum, BTH... and the ICRC trailer, byte for byte
    ip_len = 40 if v6 else 20
    assert compute_icrc(ours[:-4]) == int.from_bytes(ours[-4:], "little")
    assert parse_frame(ours).packet.icrc == compute_icrc(ours[:-4])
    assert len(ours) == ip_len + 8 + len(pkt.encode())


def test_icrc_ignores_variant_fields() -> None:
    pkt = Packet(BTH(Opcode.WRITE_ONLY, psn=3), meth=METH(), reth=RETH(0, 1, 4), payload=b"abcd")
    a = encapsulate(pkt, src=_V6[0], dst=_V6[1], sport=9, traffic_class=0, flow_label=0, ttl=64)
    b = encapsulate(pkt, src=_V6[0], dst=_V6[1], sport=9, traffic_class=3, flow_label=0xBEEF, ttl=3)
    assert a[-4:] == b[-4:]
    c = encapsulate(pkt, src=_V6[0], dst=_V6[1], sport=10)
    assert a[-4:] != c[-4:]  # the UDP source port (the EV) is invariant, so it is covered
    fecn = bytearray(a)
    fecn[40 + 8 + 4] |= 0x80  # FECN is masked out of the ICRC, and not covered by the UDP checksum check here
    assert parse_frame(bytes(fecn), check_udp=False).packet.bth.fecn


@given(st.binary(min_size=12, max_size=600), st.integers(0, 0xFFFFFFFF), st.data())
def test_one_pass_icrc_equals_masking_byte_4(transport: bytes, start: int, data: st.DataObject) -> None:
    """The ICRC runs one CRC pass over BTH as it is and corrects for byte 4 (`mask_correction`): the same
    value as masking the byte first, for every length, byte 4, starting CRC and split into parts."""
    masked = transport[:4] + b"\xff" + transport[5:]
    want = zlib.crc32(masked, start)
    assert crc_from_bth(start, transport, len(transport)) == want
    end = data.draw(st.integers(12, len(transport)))
    assert crc_from_bth(start, memoryview(transport), end) == zlib.crc32(masked[:end], start)
    cut = data.draw(st.integers(0, len(transport)))  # parts, as seal_parts feeds headers then payload
    two = crc32(transport[cut:], crc32(transport[:cut], start))
    assert two ^ mask_correction(len(transport), transport[4]) == want


def test_srv6_frame_round_trip_and_layout() -> None:
    pkt = Packet(
        BTH(Opcode.WRITE_ONLY, dest_qp=77, psn=1), meth=METH(), reth=RETH(0, 1, 8), payload=b"12345678"
    )
    encap = SRv6Encap("fc00:0:a::", "fc00:0:101:202:303:404::", ("fc00:0:b00::",), flow_label=0x1234)
    raw = encapsulate(pkt, src=_V6[0], dst=_V6[1], sport=0xC000, flow_label=0xABCD, srv6=encap, ether=True)
    s = IPv6(raw[14:])  # scapy's view of the outer header and SRH
    assert s.dst == "fc00:0:101:202:303:404::"
    assert s.nh == 43
    srh = s[IPv6ExtHdrSegmentRouting]
    assert srh.addresses == ["fc00:0:b00::"] and srh.segleft == 1 and srh.nh == 41
    inner = srh.payload
    assert inner.src == _V6[0] and inner.dst == _V6[1] and inner.fl == 0xABCD
    frame = parse_frame(raw, ether=True)
    assert frame.srv6 == encap
    assert frame.packet == parse_frame(raw, ether=True).packet
    assert frame.packet.bth.dest_qp == 77 and bytes(frame.packet.payload) == b"12345678"
    assert frame.flow_label == 0xABCD and frame.sport == 0xC000 and frame.segments_left == 1
    no_srh = encapsulate(pkt, src=_V6[0], dst=_V6[1], sport=1, srv6=SRv6Encap("fc00::1", "fc00:0:1::"))
    f2 = parse_frame(no_srh)
    assert f2.srv6 is not None and f2.srv6.segments == () and IPv6(no_srh).nh == 41


def test_ecn_and_addresses_exposed() -> None:
    pkt = Packet(BTH(Opcode.WRITE_ONLY), meth=METH(), reth=RETH(0, 0, 0))
    f = parse_frame(encapsulate(pkt, src=_V4[0], dst=_V4[1], sport=5, traffic_class=0b11))
    assert f.ecn == 3 and f.src == _V4[0] and f.dst == _V4[1] and f.dport == 4791 and f.srv6 is None
    assert ipaddress.ip_address(f.src).version == 4


def test_bad_icrc_and_checksums_raise() -> None:
    pkt = Packet(BTH(Opcode.WRITE_ONLY), meth=METH(), reth=RETH(0, 0, 4), payload=b"data")
    raw = bytearray(encapsulate(pkt, src=_V4[0], dst=_V4[1], sport=5))
    raw[-1] ^= 1
    with pytest.raises(WireError) as ei:
        parse_frame(bytes(raw), check_udp=False)
    assert ei.value.header == "ICRC" and ei.value.offset == len(raw) - 4
    assert not parse_frame(bytes(raw), check_udp=False, check_icrc=False).icrc_ok
    with pytest.raises(WireError, match="UDP checksum"):
        parse_frame(bytes(raw))
    raw[-1] ^= 1
    raw[11] ^= 0xFF
    with pytest.raises(WireError, match=r"IPv4\.checksum"):
        parse_frame(bytes(raw))


def test_wrong_port_rejected_unless_any_port() -> None:
    pkt = Packet(BTH(Opcode.WRITE_ONLY), meth=METH(), reth=RETH(0, 0, 0))
    raw = encapsulate(pkt, src=_V4[0], dst=_V4[1], sport=5, dport=4971)
    with pytest.raises(WireError, match="4971"):
        parse_frame(raw)
    assert parse_frame(raw, udp_port=4971).dport == 4971
    assert parse_frame(raw, udp_port=None).dport == 4971


@pytest.mark.parametrize("ex", example_conversation(), ids=lambda e: e.description)
def test_every_truncation_of_a_frame_raises(ex: object) -> None:
    frame: bytes = ex.frame  # type: ignore[attr-defined]
    for cut in range(len(frame)):
        with pytest.raises(WireError):
            _parse_frame(frame[:cut], True, True, True, 4791, False)


def test_bit_flipped_frames_raise_only_wire_error() -> None:
    rng = random.Random(3)
    frames = [e.frame for e in example_conversation()]
    for i in range(20_000):
        data = bytearray(frames[i % len(frames)])
        bit = rng.randrange(len(data) * 8)
        data[bit >> 3] ^= 1 << (bit & 7)
        with contextlib.suppress(WireError):
            _parse_frame(bytes(data), True, True, True, 4791, False)


def _reference_checksum(b: bytes) -> int:
    if len(b) & 1:
        b += b"\x00"
    s = 0
    for i in range(0, len(b), 2):
        s += (b[i] << 8) | b[i + 1]
        s = (s & 0xFFFF) + (s >> 16)
    return ~s & 0xFFFF


@given(st.one_of(st.binary(max_size=200), st.integers(0, 40).map(lambda n: b"\xff\xff\x00\x00" * n)))
def test_internet_checksum_matches_word_by_word_sum(data: bytes) -> None:
    assert internet_checksum(data) == _reference_checksum(data)
