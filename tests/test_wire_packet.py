"""Header and packet codecs: byte layouts, round trips, strictness, and robustness against any input."""

from __future__ import annotations

import contextlib
import dataclasses
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from openmrc.transport import Transmit
from openmrc.transport.types import SackTransmit, data_transmit, sack_of_words
from openmrc.wire import (
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
    Addressing,
    CcState,
    DataTemplate,
    ImmDt,
    NackReason,
    Opcode,
    Packet,
    SackM,
    WireError,
    parse,
    seal,
    seal_header_parts,
    seal_parts,
    service_time_code,
    service_time_ns,
)
from openmrc.wire.buffer import Buffer
from openmrc.wire.constants import DATA_OPCODES, is_data_opcode
from openmrc.wire.examples import example_conversation
from openmrc.wire.headers import Header, make_bth, range_test
from openmrc.wire.packet import _parse, data_packet, plain_data_fields

from .wire_strategies import HEADER_CLASSES, header, packets

# -- byte layouts, derived by hand from the layouts documented in openmrc.wire.headers -------------------


def test_bth_layout() -> None:
    bth = BTH(
        0xCA,
        se=True,
        m=False,
        pad=2,
        tver=0,
        p_key=0xFFFF,
        fecn=True,
        becn=False,
        dest_qp=0xABCDEF,
        ack_req=True,
        rtx=True,
        ts=True,
        psn=0x123456,
    )
    assert bth.encode().hex() == "ca a0 ffff 80abcdef b0123456".replace(" ", "")


def test_seth_cc_state_layout() -> None:
    seth = SETH(
        hdr_type=0x1,
        next_hdr=0x2,
        m=SackM.ALWAYS_SKIP,
        pr=True,
        ack_psn_offset=-2,
        entropy=0xDEADBEEF,
        src_qp=0x0123,
        dst_qp=0x4567,
        cack_psn=0x89ABCD,
        cc_type=0x1,
        cc_flags=0x3,
        mpr=8,
        sack_offset=-1,
        bitmap=0x0102030405060708,
    )
    assert seth.encode().hex() == ("12a0fffedeadbeef012345670089abcd1308ffff0102030405060708")
    cc = CcState(ts_echo=0xBEEF, ooo_count=0x7FFF, r_c=True, rcv_cwnd_pen=127, rcvd_256b=0x000102)
    assert cc.encode().hex() == "beef7fffff000102"


def test_neth_peth_erth_eeth_layouts() -> None:
    neth = NETH(
        reason=NackReason.TRIMMED,
        vendor_info=0x55,
        entropy=0x01020304,
        src_qp=1,
        dst_qp=2,
        psn=0xFFFFFF,
        cc_type=1,
        cc_flags=0,
        ts_echo=0x0A0B,
    )
    assert neth.encode().hex() == "00000155010203040001000200ffffff10000a0b"
    peth = PETH(probe_id=0x1234, src_qp=5, dst_qp=6, tx_timestamp=0x7788, tsr=1, format_type=2)
    assert peth.encode().hex() == "00000000123400000005000677888002"
    erth = ERTH(op=1, port_status=0x000000FF, tx_timestamp=0x0300)
    assert erth.encode().hex() == "00010000000000ff0000000003000000"
    eeth = EETH(op=1, service_time=850, port_status=0xEF, rx_port=3, ts_echo=0x0300, tsr=1)
    assert eeth.encode().hex() == ("0010000000000352000000ef03" + "00" * 15 + "03008000" + "00" * 4)
    assert [len(h.encode()) for h in (neth, peth, erth, eeth)] == [20, 16, 16, 36]


def test_small_header_layouts() -> None:
    assert METH(0x0102, 0x0304).encode() == bytes.fromhex("01020304")
    assert TSETH(0xABCD, 1, 0xF).encode() == bytes.fromhex("abcd800f")
    assert RETH(0x0102030405060708, 0xAABBCCDD, 0x1000).encode() == bytes.fromhex(
        "0102030405060708aabbccdd00001000"
    )
    assert ImmDt(0xFEEDF00D).encode() == bytes.fromhex("feedf00d")
    assert AETH(0x62, 0x000102).encode() == bytes.fromhex("62000102")


def test_write_only_packet_bytes() -> None:
    pkt = Packet(
        BTH(Opcode.WRITE_ONLY, dest_qp=0x12, psn=7),
        meth=METH(0, 1),
        reth=RETH(0x1000, 0x99, 5),
        payload=b"hello",
        icrc=0x11223344,
    )
    raw = pkt.encode()
    assert raw.hex() == (
        "ca30ffff00000012"
        "00000007"  # BTH, pad 3
        "00000001"  # METH
        "0000000000001000"
        "00000099"
        "00000005"  # RETH
        "68656c6c6f"
        "000000"  # payload + pad
        "44332211"  # ICRC, least significant byte first
    )
    assert pkt.bth.pad == 3


# -- round trips --------------------------------------------------------------------------------------


@pytest.mark.parametrize("cls", HEADER_CLASSES, ids=lambda c: c.NAME)
@settings(max_examples=60)
@given(data=st.data())
def test_every_header_round_trips(cls: type[Header], data: st.DataObject) -> None:
    hdr = data.draw(header(cls))
    raw = hdr.encode()
    assert len(raw) == cls.SIZE
    back = cls.pull(Buffer(raw))  # type: ignore[attr-defined]
    assert back == hdr


@settings(max_examples=400)
@given(packets())
def test_every_packet_round_trips(pkt: Packet) -> None:
    raw = pkt.encode()
    back = parse(raw)
    assert back == pkt
    assert back.encode() == raw
    assert len(raw) == pkt.header_size() + len(pkt.payload) + pkt.bth.pad + 4


@pytest.mark.parametrize("ex", example_conversation(), ids=lambda e: e.description)
def test_example_packets_round_trip(ex: object) -> None:
    pkt = ex.packet  # type: ignore[attr-defined]
    assert parse(pkt.encode()) == pkt


def test_payload_is_a_view_of_the_input() -> None:
    pkt = Packet(BTH(Opcode.WRITE_MIDDLE, psn=1), meth=METH(), reth=RETH(0, 1, 8192), payload=b"x" * 4096)
    raw = bytearray(pkt.encode())
    back = parse(raw)
    assert isinstance(back.payload, memoryview)
    raw[BTH.SIZE + METH.SIZE + RETH.SIZE] = ord("y")
    assert back.payload[0] == ord("y")  # no copy was made


def test_optional_tseth_follows_ts_bit() -> None:
    pkt = Packet(
        BTH(Opcode.WRITE_ONLY_WITH_IMM, ts=True),
        meth=METH(),
        tseth=TSETH(0x1234, 0, 1),
        reth=RETH(0, 0, 4),
        imm=ImmDt(9),
        payload=b"abcd",
    )
    back = parse(pkt.encode())
    assert back.tseth == TSETH(0x1234, 0, 1)
    assert back.imm == ImmDt(9)


# -- strictness ---------------------------------------------------------------------------------------


def _raises(data: bytes, header: str, field: str, **kw: bool) -> WireError:
    with pytest.raises(WireError) as ei:
        parse(data, **kw)
    assert (ei.value.header, ei.value.field) == (header, field), str(ei.value)
    return ei.value


def _write_only(n: int = 8, **bth: int) -> Packet:
    return Packet(BTH(Opcode.WRITE_ONLY, **bth), meth=METH(), reth=RETH(0, 0, n), payload=b"\x01" * n)


def test_unknown_and_reserved_opcodes() -> None:
    raw = bytearray(_write_only().encode())
    raw[0] = 0x04  # a RoCE RC opcode, not MRC
    err = _raises(bytes(raw), "BTH", "opcode")
    assert "unknown opcode 0x04" in str(err)
    raw[0] = 0xC0  # inside MRC's range, unassigned
    err = _raises(bytes(raw), "BTH", "opcode")
    assert "reserved MRC opcode 0xc0" in str(err)
    assert err.offset == 0


def test_ts_bit_without_room_for_tseth() -> None:
    raw = bytearray(
        Packet(BTH(Opcode.ACK, psn=1), aeth=AETH()).encode()
    )  # 12 + 4 + 4: flipping TS on ACK is rejected outright
    raw[8] |= 0x10
    _raises(bytes(raw), "BTH", "ts")
    # A data packet whose TS bit is set but which ends right after METH: no room for TSETH.
    head = bytearray(_write_only(0).encode()[: BTH.SIZE + METH.SIZE])
    head[8] |= 0x10
    err = _raises(bytes(head) + b"\0\0\0\0", "TSETH", "tx_timestamp")
    assert err.offset == BTH.SIZE + METH.SIZE


def test_payload_inconsistent_with_dma_length() -> None:
    pkt = _write_only(8)
    pkt.reth.dma_len = 9  # type: ignore[union-attr]
    with pytest.raises(WireError) as ei:
        pkt.encode()
    assert ei.value.header == "RETH"
    raw = bytearray(_write_only(8).encode())
    raw[BTH.SIZE + METH.SIZE + 15] = 12  # DMA length 12, payload 8
    err = _raises(bytes(raw), "RETH", "dma_len")
    assert err.offset == BTH.SIZE + METH.SIZE + 12
    # A Middle packet can never carry the whole DMA length, nor leave a pad.
    mid = Packet(BTH(Opcode.WRITE_MIDDLE), meth=METH(), reth=RETH(0, 0, 8), payload=b"\0" * 8)
    with pytest.raises(WireError):
        mid.encode()
    mid2 = Packet(BTH(Opcode.WRITE_MIDDLE), meth=METH(), reth=RETH(0, 0, 100), payload=b"\0" * 7)
    with pytest.raises(WireError) as ei:
        mid2.encode()
    assert ei.value.field == "pad"


def test_bad_pad() -> None:
    raw = bytearray(_write_only(8).encode())
    raw[1] |= 0x10  # pad 1 with an 8-byte payload: 7 + 1 ≠ DMA length / alignment
    with pytest.raises(WireError):
        parse(bytes(raw))
    ack = bytearray(Packet(BTH(Opcode.ACK), aeth=AETH()).encode())
    ack[1] |= 0x20
    _raises(bytes(ack), "BTH", "pad")


def test_trailing_bytes_after_control_headers() -> None:
    raw = Packet(BTH(Opcode.NACK), neth=NETH(reason=1)).encode()
    _raises(raw[:-4] + b"\0\0\0\0" + raw[-4:], "NACK", "length")


def test_reserved_sack_m() -> None:
    raw = bytearray(Packet(BTH(Opcode.SACK), seth=SETH(), cc_state=CcState()).encode())
    raw[BTH.SIZE + 1] |= 0xC0
    err = _raises(bytes(raw), "SETH", "m")
    assert err.offset == BTH.SIZE + 1


def test_trimmed_packet_keeps_headers_only() -> None:
    full = Packet(
        BTH(Opcode.WRITE_MIDDLE, psn=5), meth=METH(), reth=RETH(0x40, 1, 8192), payload=b"\0" * 4096
    )
    raw = full.encode()
    trimmed = raw[: full.header_size()] + raw[-4:]
    with pytest.raises(WireError):
        parse(trimmed)
    pkt = parse(trimmed, trimmed=True)
    assert pkt.bth.psn == 5 and len(pkt.payload) == 0 and pkt.reth == full.reth


@pytest.mark.parametrize(
    ("hdr", "field", "value"),
    [
        (BTH(Opcode.ACK), "psn", 1 << 24),
        (BTH(Opcode.ACK), "dest_qp", 1 << 24),
        (BTH(Opcode.ACK), "psn", -1),
        (BTH(Opcode.ACK), "p_key", 1 << 16),
        (BTH(Opcode.ACK), "rtx", 2),
        (CcState(), "r_c", 2),
        (METH(), "msn", 1 << 16),
        (RETH(), "va", 1 << 64),
        (SETH(), "cack_psn", 1 << 24),
        (SETH(), "sack_offset", 1 << 15),
        (CcState(), "rcv_cwnd_pen", 128),
        (NETH(), "psn", 1 << 24),
        (AETH(), "msn", 1 << 24),
    ],
)
def test_out_of_range_fields_raise_on_encode(hdr: Header, field: str, value: int) -> None:
    try:
        setattr(hdr, field, value)
    except TypeError:
        # compiled (mypyc), a bool field refuses an int at assignment: the value never reaches the wire
        assert isinstance(getattr(hdr, field), bool) and not isinstance(value, bool)
        return
    with pytest.raises(WireError) as ei:
        hdr.encode()
    assert ei.value.header == hdr.NAME and ei.value.field == field


def test_psn_out_of_range_in_packet_names_offset() -> None:
    pkt = _write_only(4, psn=1 << 24)
    with pytest.raises(WireError) as ei:
        pkt.encode()
    assert (ei.value.header, ei.value.field, ei.value.offset) == ("BTH", "psn", 9)


def test_header_chain_mismatch_raises_on_encode() -> None:
    with pytest.raises(WireError, match="RETH"):
        Packet(BTH(Opcode.WRITE_ONLY), meth=METH()).encode()
    with pytest.raises(WireError, match="ImmDt missing"):
        Packet(BTH(Opcode.WRITE_ONLY_WITH_IMM), meth=METH(), reth=RETH()).encode()
    with pytest.raises(WireError, match="TS"):
        Packet(BTH(Opcode.WRITE_ONLY), meth=METH(), tseth=TSETH(), reth=RETH()).encode()
    with pytest.raises(WireError, match="CC_STATE"):
        Packet(BTH(Opcode.SACK), seth=SETH()).encode()
    with pytest.raises(WireError, match="AETH"):
        Packet(BTH(Opcode.NACK), neth=NETH(), aeth=AETH()).encode()
    with pytest.raises(WireError, match="payload"):
        Packet(BTH(Opcode.PROBE), peth=PETH(), payload=b"x").encode()
    with pytest.raises(WireError, match="unknown opcode"):
        Packet(BTH(0x10)).encode()


# -- truncation and fuzzing ------------------------------------------------------------------------------

_FIXED_SIZE = (
    Opcode.ACK,
    Opcode.SACK,
    Opcode.NACK,
    Opcode.PROBE,
    Opcode.EP_REQUEST,
    Opcode.EP_RESPONSE,
    Opcode.WRITE_ONLY,
    Opcode.WRITE_ONLY_WITH_IMM,
)


@settings(max_examples=150)
@given(packets(_FIXED_SIZE))
def test_truncation_at_every_offset_raises(pkt: Packet) -> None:
    """Control packets have fixed sizes and Only packets carry their exact length in RETH."""
    raw = pkt.encode()
    for cut in range(len(raw)):
        with pytest.raises(WireError):
            parse(raw[:cut])


@settings(max_examples=100)
@given(packets())
def test_truncation_inside_the_headers_raises(pkt: Packet) -> None:
    """For multi-packet Writes only the UDP length and the ICRC bound the payload (see test_framing)."""
    raw = pkt.encode()
    for cut in range(pkt.header_size() + 4):
        with pytest.raises(WireError):
            parse(raw[:cut])


def _only_wire_errors(data: bytes) -> None:
    # The codec proper, without parse()'s last-resort wrapper, so that a codec bug shows up here.
    with contextlib.suppress(WireError):
        _parse(data, False)


def test_random_bytes_raise_only_wire_error() -> None:
    rng = random.Random(1)
    opcodes = list(range(256))
    for i in range(100_000):
        n = rng.randrange(0, 96)
        data = bytearray(rng.randbytes(n))
        if n and i % 2:
            data[0] = rng.choice(opcodes[0xC0:0xE0])  # bias towards MRC opcodes to reach deeper code
        _only_wire_errors(bytes(data))


def test_bit_flipped_packets_raise_only_wire_error() -> None:
    rng = random.Random(2)
    valid = [e.packet.encode() for e in example_conversation()]
    valid += [
        Packet(BTH(o), **kw).encode()
        for o, kw in (  # type: ignore[arg-type]
            (Opcode.ACK, {"aeth": AETH()}),
            (Opcode.SACK, {"seth": SETH(), "cc_state": CcState()}),
        )
    ]
    parsed = 0
    for i in range(100_000):
        data = bytearray(valid[i % len(valid)])
        for _ in range(rng.randrange(1, 4)):
            bit = rng.randrange(len(data) * 8)
            data[bit >> 3] ^= 1 << (bit & 7)
        try:
            _parse(bytes(data), False)
            parsed += 1
        except WireError:
            pass
    assert parsed > 0  # most flips land in fields any value of which is valid


def test_fast_constructors_build_what_the_dataclasses_build() -> None:
    """`make_bth` and `data_packet` (the transport core's per-packet builders) fill every field."""
    for op, dqp, a, rtx, psn in ((0xC6, 0, False, False, 0), (0xCB, 0xFFFFFF, True, True, 0xFFFFFF)):
        h = make_bth(op, dqp, a, rtx, psn)
        assert h == BTH(op, dest_qp=dqp, ack_req=a, rtx=rtx, psn=psn)
        assert h.encode() == BTH(op, dest_qp=dqp, ack_req=a, rtx=rtx, psn=psn).encode()
    meth, reth, imm, payload = METH(1, 2), RETH(0x1000, 7, 4), ImmDt(9), memoryview(b"abcd")
    p = data_packet(
        make_bth(Opcode.WRITE_ONLY_WITH_IMM, 5, True, False, 3), meth, None, reth, imm, payload, 11
    )
    q = Packet(
        BTH(Opcode.WRITE_ONLY_WITH_IMM, dest_qp=5, ack_req=True, psn=3),
        meth,
        None,
        reth,
        imm,
        payload=payload,
        icrc=11,
    )
    assert p == q and p.encode() == q.encode() and repr(p) == repr(q)


def test_data_opcode_range_is_the_data_opcode_set() -> None:
    assert {op for op in range(256) if is_data_opcode(op)} == {int(o) for o in DATA_OPCODES}


@pytest.mark.parametrize("cls", [*HEADER_CLASSES, Packet])
def test_written_out_init_matches_the_dataclass_fields(cls: type) -> None:
    """These classes spell their ``__init__`` out (compiled, the dataclass-made one would run interpreted):
    it must take every field, in field order, with the field's default."""
    fs = dataclasses.fields(cls)
    required = [f for f in fs if f.default is dataclasses.MISSING]
    if cls is Packet:  # typed attributes (compiled) take only values of their type
        values = {f.name: None for f in fs} | {"bth": BTH(1), "payload": memoryview(b"x"), "icrc": 7}
    else:
        values = {f.name: i + 2 if f.type == "int" else True for i, f in enumerate(fs)}
    by_position = cls(*values.values())
    by_keyword = cls(**values)
    for f in fs:
        assert getattr(by_position, f.name) == getattr(by_keyword, f.name) == values[f.name], f.name
    defaults = cls(**{f.name: values[f.name] for f in required})
    for f in fs:
        if f.default is not dataclasses.MISSING:
            assert getattr(defaults, f.name) == f.default, f.name


@pytest.mark.parametrize("cls", HEADER_CLASSES, ids=lambda c: c.NAME)
@settings(max_examples=300)
@given(data=st.data())
def test_written_out_range_test_agrees_with_the_field_layout(cls: type[Header], data: st.DataObject) -> None:
    """Every header's written-out `out_of_range` flags exactly the values `Header.check` rejects (and the
    test `range_test` compiles from the layout), for values in range, just past either end, and far off."""
    values: dict[str, object] = {}
    for name, _off, bits, _signed in cls.SPEC:
        if bits == 1:  # a flag: a bool, which the compiled classes insist on
            values[name] = data.draw(st.booleans(), label=name)
            continue
        values[name] = data.draw(
            st.one_of(
                st.integers(0, (1 << bits) - 1),
                st.sampled_from([-1, 1 << bits, (1 << bits) + 1, 1 << (bits + 7)]),
            ),
            label=name,
        )
    h = cls(**values)  # type: ignore[call-arg]
    rejected = False
    try:
        h.check()
    except WireError:
        rejected = True
    assert bool(h.out_of_range()) == rejected == bool(range_test(cls)(h))


def _as_fields(pkt: Packet) -> tuple[object, ...] | None:
    """What `plain_data_fields` must read from the bytes of ``pkt``: None unless a plain data packet (then
    it returns `NOT_PLAIN`, opcode 0)."""
    bth, reth = pkt.bth, pkt.reth
    if reth is None or pkt.tseth is not None or pkt.imm is not None:
        return None
    payload = bytes(pkt.payload)
    return (bth.opcode, bth.dest_qp, bth.psn, bth.ack_req, reth.va, reth.rkey, reth.dma_len, payload)


@settings(max_examples=300)
@given(packets(), st.data())
def test_plain_data_fields_read_what_parse_reads_and_reject_what_it_rejects(
    pkt: Packet, data: st.DataObject
) -> None:
    """The NIC's object-free read of a plain data packet gives exactly `parse`'s fields, and declines (leaving
    the packet to `parse`, which says why) every packet `parse` rejects: valid packets of every opcode,
    and the same with a few bits flipped."""
    raw = bytearray(pkt.encode())
    for _ in range(data.draw(st.integers(0, 3), label="flips")):
        bit = data.draw(st.integers(0, len(raw) * 8 - 1), label="bit")
        raw[bit >> 3] ^= 1 << (bit & 7)
    try:
        want = _as_fields(_parse(bytes(raw), False))
    except WireError:
        want = None
    got = plain_data_fields(memoryview(raw))
    assert (None if not got[0] else (*got[:7], bytes(got[7]))) == want


def test_transmit_takes_its_fields_by_position_and_by_keyword() -> None:
    pkt = Packet(BTH(1))
    values = {"port": 1, "peer": "p", "ev": b"e", "entropy": 2, "packet": pkt, "qp_num": 3, "size": 4}
    for t in (Transmit(*values.values()), Transmit(**values)):  # type: ignore[arg-type]
        assert [getattr(t, k) for k in values] == list(values.values())
        assert t.tpl is None
    t = Transmit(1, "p", b"e", 2, pkt)
    assert (t.qp_num, t.size) == (0, 0)


_OPS = sorted(int(o) for o in DATA_OPCODES)


@given(
    op=st.sampled_from(_OPS),
    dqp=st.integers(0, 0xFFFFFF),
    rqmsn=st.integers(0, 0xFFFF),
    msn=st.integers(0, 0xFFFF),
    rkey=st.integers(0, 0xFFFFFFFF),
    imm=st.none() | st.integers(0, 0xFFFFFFFF),
    ack=st.booleans(),
    rtx=st.booleans(),
    psn=st.integers(0, 0xFFFFFF),
    va=st.integers(0, (1 << 64) - 1),
    n=st.integers(0, 64),
)
def test_data_template_encodes_what_its_packet_encodes(
    op: int,
    dqp: int,
    rqmsn: int,
    msn: int,
    rkey: int,
    imm: int | None,
    ack: bool,
    rtx: bool,
    psn: int,
    va: int,
    n: int,
) -> None:
    """One struct.pack from a Write's template gives the bytes of the `Packet` it stands for (the DMA
    length chosen so that the packet is valid for its opcode), and the Transmit built from it seals the
    same datagram as the Packet does."""
    mtu = 64
    only = op in (int(Opcode.WRITE_ONLY), int(Opcode.WRITE_ONLY_WITH_IMM))
    if op in (int(Opcode.WRITE_FIRST), int(Opcode.WRITE_MIDDLE)):
        n, dma = mtu, 3 * mtu
    else:
        n = max(n, 1) if not only else n
        dma = n if only else 2 * mtu + n
    if imm is None and op in (int(Opcode.WRITE_LAST_WITH_IMM), int(Opcode.WRITE_ONLY_WITH_IMM)):
        imm = 0  # the requester uses these two opcodes only for Writes with an immediate
    tpl = DataTemplate(dqp, rqmsn, msn, rkey, dma, imm)
    payload = memoryview(bytes(range(n)))
    t = data_transmit(1, "peer", bytes(32), 7, dqp, tpl, op, ack, rtx, psn, va, payload)
    assert t.size == n and t.packet == tpl.packet(op, ack, rtx, psn, va, payload)
    pkt = tpl.packet(op, ack, rtx, psn, va, payload)
    assert tpl.header(op, ack, rtx, psn, va, n) == pkt.encode_headers()
    assert (pkt.imm is not None) == (imm is not None and op in (0xC9, 0xCB))
    addr = Addressing("10.0.0.1", "10.0.0.2", 49152)
    fast = seal_header_parts(tpl.header(op, ack, rtx, psn, va, n), payload, addr)
    assert b"".join(fast) == b"".join(seal_parts(pkt, addr)) == seal(pkt, addr)


@pytest.mark.parametrize(
    ("args", "field"),
    [
        ((1 << 24, 0, 0, 0, 8, None), "dest_qp"),
        ((0, 1 << 16, 0, 0, 8, None), "rqmsn"),
        ((0, 0, 1 << 16, 0, 8, None), "msn"),
        ((0, 0, 0, 1 << 32, 8, None), "rkey"),
        ((0, 0, 0, 0, 1 << 32, None), "dma_len"),
        ((0, 0, 0, 0, 8, 1 << 32), "imm_data"),
    ],
)
def test_data_template_names_the_field_that_does_not_fit(args: tuple[int, ...], field: str) -> None:
    with pytest.raises(WireError, match=field):
        DataTemplate(*args)  # type: ignore[arg-type]


def test_setting_a_transmits_packet_replaces_its_template() -> None:
    tpl = DataTemplate(5, 0, 1, 7, 8, None)
    t = data_transmit(
        1, "peer", bytes(32), 0, 5, tpl, int(Opcode.WRITE_ONLY), True, False, 3, 0, memoryview(bytes(8))
    )
    other = Packet(BTH(Opcode.PROBE, dest_qp=5), peth=PETH(probe_id=1))
    t.packet = other
    assert t.tpl is None and t.packet is other


# -- SETH svc: the responder's service time ([openmrc], a reserved byte of MRC 1.0) --------------------------
@given(st.integers(min_value=0, max_value=1 << 40))
def test_a_service_time_code_never_says_more_than_was_spent(ns: int) -> None:
    """Rounded down (a requester takes no more out of an RTT than the responder spent), within 1 µs or an
    eighth of it below 0.5 s, saturating above; codes order as the times they stand for."""
    code = service_time_code(ns)
    assert 0 <= code <= 0xFF
    back = service_time_ns(code)
    if ns >= 507_904_000:
        assert code == 0xFF and back == 507_904_000
        return
    assert back <= ns
    assert ns - back < max(1000, ns // 8 + 1000)
    assert service_time_code(back) == code  # a time a code says is said exactly
    assert code == 0 or service_time_ns(code - 1) < back


def test_svc_is_byte_12_of_seth_and_travels_in_a_sack_by_its_fields() -> None:
    """SETH byte 12 (reserved in MRC 1.0) carries the code; a SACK that leaves as its fields
    (`SackTransmit`) takes it from `stamp_service` and keeps it in its packed words (a split simulation
    ships those)."""
    seth = SETH(cack_psn=0x123456, svc=0xA7)
    buf = Buffer()
    seth.push(buf)
    raw = buf.data()
    assert raw[12] == 0xA7 and raw[13:16] == bytes.fromhex("123456")
    assert SETH.pull(Buffer(raw)).svc == 0xA7
    t = SackTransmit(0x42, 0x43, 7, 1, 0, 0b101, 0x1234, 0, False, 8, 9, 3, 77)
    assert t.svc == 0
    t.stamp_service(5_000_000)  # nothing known about its trigger: nothing said
    assert t.svc == 0
    t.arrived = 1_000_000
    t.stamp_service(1_450_000)  # 450 µs in the host
    assert service_time_ns(t.svc) <= 450_000 and t.svc == service_time_code(450_000)
    assert t.packet.seth is not None and t.packet.seth.svc == t.svc and t.rcvd_256b == 77
    back = sack_of_words(t.qp_num, t.psn, t.op, t.va, t.qps_word, t.sack_offset, t.pr)
    assert back.svc == t.svc and back.dest_qp == 0x43 and back.rcvd_256b == 77
