import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from openmrc.wire import Buffer, WireError


@given(
    st.integers(0, 0xFF),
    st.integers(0, 0xFFFF),
    st.integers(0, 0xFFFFFF),
    st.integers(0, 0xFFFFFFFF),
    st.integers(0, (1 << 64) - 1),
    st.binary(max_size=40),
)
def test_push_pull_round_trip(u8: int, u16: int, u24: int, u32: int, u64: int, blob: bytes) -> None:
    out = Buffer()
    out.push_u8(u8)
    out.push_u16(u16)
    out.push_u24(u24)
    out.push_u32(u32)
    out.push_u64(u64)
    out.push_bytes(blob)
    data = out.data()
    assert len(out) == 18 + len(blob)
    inp = Buffer(data)
    assert inp.pull_u8() == u8
    assert inp.pull_u16() == u16
    assert inp.pull_u24() == u24
    assert inp.pull_u32() == u32
    assert inp.pull_u64() == u64
    assert bytes(inp.pull_bytes(len(blob))) == blob
    assert inp.remaining == 0


def test_network_byte_order() -> None:
    out = Buffer()
    out.push_u24(0x010203)
    out.push_u16(0x0405)
    assert out.data() == b"\x01\x02\x03\x04\x05"


@pytest.mark.parametrize(
    ("method", "size"), [("pull_u8", 1), ("pull_u16", 2), ("pull_u24", 3), ("pull_u32", 4), ("pull_u64", 8)]
)
def test_read_past_end_names_field_and_offset(method: str, size: int) -> None:
    short = Buffer(b"\xaa" * (size - 1))
    with pytest.raises(WireError) as ei:
        getattr(short, method)("HDR", "fld")
    assert ei.value.header == "HDR"
    assert ei.value.field == "fld"
    assert ei.value.offset == 0
    assert "truncated" in str(ei.value)
    assert isinstance(ei.value, ValueError)


def test_pull_bytes_is_zero_copy() -> None:
    data = bytearray(b"abcdef")
    view = Buffer(data).pull_bytes(3)
    data[0] = ord("z")
    assert bytes(view) == b"zbc"


def test_pull_struct_advances_and_checks() -> None:
    st2 = struct.Struct("!HH")
    buf = Buffer(b"\x00\x01\x00\x02\x00")
    assert buf.pull_struct(st2, "X", "a") == (1, 2)
    with pytest.raises(WireError) as ei:
        buf.pull_struct(st2, "X", "a")
    assert ei.value.offset == 4
