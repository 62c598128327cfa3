"""EV format profiles, EV profiles: validation, byte-exact expansion, generation, EV states."""

from __future__ import annotations

import dataclasses
import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from openmrc.ev import (
    CONTROLLER_VISIBLE,
    EVConfigError,
    EVField,
    EVFormatMode,
    EVFormatProfile,
    EVProfile,
    EVProfileMode,
    EVState,
    controller_state,
)

STEV, SRV6, UDP = EVFormatMode.STEV, EVFormatMode.SRV6, EVFormatMode.UDP
AUTO, EXP, GEN = EVProfileMode.AUTO, EVProfileMode.EXP, EVProfileMode.GEN
Z = "00"  # one zero byte, hex


def hx(s: str) -> bytes:
    return bytes.fromhex(s.replace(" ", ""))


# -- reference expansion: literal, bit by bit, from the mrc_ctl.h description ------------------------------
def ref_expand(fmt_widths: tuple[int, ...], fields: tuple[EVField, ...], compact: bytes) -> bytes:
    """Spec-style expansion: walk every bit; mask bits from high to low each pull the next compact bit."""
    stream = [(compact[i // 8] >> (7 - i % 8)) & 1 for i in range(len(compact) * 8)]
    out = [0] * 256
    s = 0
    d = 0
    for i, f in enumerate(fields):
        bits = [(f.init_val >> j) & 1 for j in range(f.width)]  # bits[j] is value bit j (LSB = 0)
        for j in reversed(range(f.width)):
            if (f.mask >> j) & 1:
                if s >= len(stream):
                    raise ValueError("compact EV too short")
                bits[j] = stream[s]
                s += 1
        fw = fmt_widths[i]
        for b in range(fw):  # MSB first, left zero-filled
            j = fw - 1 - b
            out[d + b] = bits[j] if j < f.width else 0
        d += fw
    if any(stream[s:]):
        raise ValueError("unused compact bits set")
    return bytes(sum(out[8 * n + b] << (7 - b) for b in range(8)) for n in range(32))


def ref_gather(value: int, mask: int) -> int:
    """Collect the bits of ``value`` at the set bits of ``mask``, lowest mask bit -> result bit 0."""
    result = 0
    t = 0
    for j in range(32):
        if (mask >> j) & 1:
            result |= ((value >> j) & 1) << t
            t += 1
    return result


def slot(expanded: bytes, fmt_widths: tuple[int, ...], i: int) -> int:
    """Value of format slot ``i`` of an expanded EV, read bit by bit."""
    start = sum(fmt_widths[:i])
    v = 0
    for b in range(start, start + fmt_widths[i]):
        v = (v << 1) | ((expanded[b // 8] >> (7 - b % 8)) & 1)
    return v


def test_reference_agrees_with_itself_on_a_hand_case() -> None:
    fields = (EVField(16, 0x1000, mask=0x0F0F),)
    assert ref_expand((16,), fields, hx("a5")) == hx("1a05") + bytes(30)


# -- the OCP example configurations, hand-derived vectors --------------------------------------------------
def exp(fmt: EVFormatProfile, fields: tuple[EVField, ...], evs: tuple[bytes, ...]) -> EVProfile:
    return EVProfile(EXP, fmt, fields, len(evs), 1, 0, evs)


def stev_explicit() -> EVProfile:
    return exp(EVFormatProfile(STEV, (16, 16)), (EVField(16, mask=0xFFFF),) * 2, (hx("12345678"),))


def stev_gen_32() -> EVProfile:
    return EVProfile(GEN, EVFormatProfile(STEV, (32,)), (EVField(32, mask=0xFFFFFFFF),), 8)


def stev_gen_fixed() -> EVProfile:
    fields = tuple(EVField(16, (i + 1) << 8, 1, 0xF, 0x000F) for i in range(2))
    return EVProfile(GEN, EVFormatProfile(STEV, (16, 16)), fields, 8)


def stev_gen_weird() -> EVProfile:
    fields = tuple(EVField(16, (i + 1) << 12, 1, 0xFF, 0x0F0F) for i in range(2))
    return EVProfile(GEN, EVFormatProfile(STEV, (16, 16)), fields, 8)


SRV6_FMT = EVFormatProfile(SRV6, (32, 16, 16, 16, 16))
SRH_FMT = EVFormatProfile(SRV6, (32, 16, 16, 16, 16, 16, 16, 32, 16, 16))


def srv6_explicit() -> EVProfile:
    fields = (EVField(32, 0xCAFECAFE),) + (EVField(16, mask=0xFFFF),) * 4
    return exp(SRV6_FMT, fields, (hx("0001000200030004"),))


def srv6_subset() -> EVProfile:
    fields = (EVField(32, 0xDEADDEAD),) + (EVField(16, mask=0xFFFF),) * 2
    return exp(SRV6_FMT, fields, (hx("abcd1234"),))


def srv6_gen() -> EVProfile:
    fields = (EVField(32, 0x42424242),) + (EVField(4, 0, 1, 0xF, 0xF),) * 4
    return EVProfile(GEN, SRV6_FMT, fields, 8)


def srv6_gen_fixed() -> EVProfile:
    usids = (EVField(16, i << 8, 1, 0xF, 0x000F) for i in range(1, 5))
    fields = (EVField(32, 0x13131313), *usids)
    return EVProfile(GEN, SRV6_FMT, fields, 8)


def srv6_srh_explicit() -> EVProfile:
    usid = EVField(16, mask=0xFFFF)
    fields = (EVField(32, 0xCAFECAFE),) + (usid,) * 6 + (EVField(32, 0xDECAFBAD),) + (usid,) * 2
    return exp(SRH_FMT, fields, (hx("0001000200030004000500060007 0008"),))


VECTORS: list[tuple[str, EVProfile, str, str]] = [
    # (a) both 16-bit full masks: the 4 compact bytes are copied verbatim into bytes 0-3.
    ("stev_exp", stev_explicit(), "12345678", "12345678" + Z * 28),
    ("stev_exp", stev_explicit(), "abcd0001", "abcd0001" + Z * 28),
    # A compact EV may be longer than needed if the extra bits are zero (a 32-byte buffer, as in the API).
    ("stev_exp", stev_explicit(), "abcd0001" + Z * 28, "abcd0001" + Z * 28),
    # (b) one 32-bit field, full mask: identity on the first 4 bytes.
    ("stev_gen_32", stev_gen_32(), "deadbeef", "deadbeef" + Z * 28),
    # (c) fixed 0x0100/0x0200 with a 4-bit low nibble each; compact 0xa5 = val1 0xa, val2 0x5:
    #     field0 = 0x0100 | 0xa = 0x010a, field1 = 0x0200 | 0x5 = 0x0205.
    ("stev_gen_fixed", stev_gen_fixed(), "a5", "010a0205" + Z * 28),
    #     compact 0x3c: 0x0103, 0x020c.
    ("stev_gen_fixed", stev_gen_fixed(), "3c", "0103020c" + Z * 28),
    # (d) init 0x1000/0x2000, mask 0x0f0f. val1 0xa5: low nibble 5 -> bits 0-3, high nibble a -> bits 8-11,
    #     so field0 = 0x1000 | 0x0a05 = 0x1a05; val2 0x3c -> 0x030c, field1 = 0x2000 | 0x030c = 0x230c.
    ("stev_gen_weird", stev_gen_weird(), "a53c", "1a05230c" + Z * 28),
    #     val1 0xff -> 0x0f0f, field0 0x1f0f; val2 0x01 -> 0x0001, field1 0x2001.
    ("stev_gen_weird", stev_gen_weird(), "ff01", "1f0f2001" + Z * 28),
    # (e) locator cafecafe (fixed) then four 16-bit uSIDs taken verbatim; 12 bytes used, 20 zero.
    ("srv6_exp", srv6_explicit(), "0001000200030004", "cafecafe 0001 0002 0003 0004" + Z * 20),
    ("srv6_exp", srv6_explicit(), "1111222233334444", "cafecafe 1111 2222 3333 4444" + Z * 20),
    # (f) only locator + 2 uSIDs: slots 3 and 4 of the format stay zero (bytes 8-31).
    ("srv6_subset", srv6_subset(), "abcd1234", "deaddead abcd 1234" + Z * 24),
    # (g) four 4-bit fields in 16-bit slots: each nibble lands left-zero-filled, 0x000v.
    ("srv6_gen", srv6_gen(), "1234", "42424242 0001 0002 0003 0004" + Z * 20),
    ("srv6_gen", srv6_gen(), "f9a1", "42424242 000f 0009 000a 0001" + Z * 20),
    # (h) 16-bit uSIDs 0x0i00 with the low nibble from the compact EV: 0x0101 0x0202 0x0303 0x0404.
    ("srv6_gen_fixed", srv6_gen_fixed(), "1234", "13131313 0101 0202 0303 0404" + Z * 20),
    ("srv6_gen_fixed", srv6_gen_fixed(), "fedc", "13131313 010f 020e 030d 040c" + Z * 20),
    # (i) 128-bit uSID address (locator + 6 uSIDs) in bytes 0-15; SRH locator decafbad + 2 uSIDs in
    #     bytes 16-23; the format totals 192 bits, so bytes 24-31 stay zero.
    (
        "srv6_srh_exp",
        srv6_srh_explicit(),
        "0001000200030004000500060007 0008",
        "cafecafe 0001 0002 0003 0004 0005 0006 decafbad 0007 0008" + Z * 8,
    ),
    (
        "srv6_srh_exp",
        srv6_srh_explicit(),
        "a1a2b1b2c1c2d1d2e1e2f1f20102 0304",
        "cafecafe a1a2 b1b2 c1c2 d1d2 e1e2 f1f2 decafbad 0102 0304" + Z * 8,
    ),
]


@pytest.mark.parametrize(("name", "profile", "compact", "expected"), VECTORS, ids=[v[0] for v in VECTORS])
def test_ocp_example_vectors(name: str, profile: EVProfile, compact: str, expected: str) -> None:
    out = profile.expand(hx(compact))
    assert len(out) == 32
    assert out == hx(expected)
    assert out == ref_expand(profile.fmt.field_widths, profile.fields, hx(compact))  # type: ignore[union-attr]


def test_compact_bits_and_bytes_of_the_examples() -> None:
    assert (stev_explicit().compact_bits, stev_explicit().compact_bytes) == (32, 4)
    assert stev_gen_32().compact_bits == 32
    assert (stev_gen_fixed().compact_bits, stev_gen_fixed().compact_bytes) == (8, 1)
    assert stev_gen_weird().compact_bits == 16
    assert srv6_explicit().compact_bits == 64
    assert srv6_subset().compact_bits == 32
    assert (srv6_gen().compact_bits, srv6_gen_fixed().compact_bits) == (16, 16)
    assert srv6_srh_explicit().compact_bits == 128


def test_compact_packs_values_msb_first() -> None:
    assert stev_gen_fixed().compact([0xA, 0x5]) == hx("a5")
    assert stev_gen_weird().compact([0xA5, 0x3C]) == hx("a53c")
    assert srv6_gen().compact([0, 1, 2, 3, 4]) == hx("1234")
    assert srv6_explicit().compact([0, 1, 2, 3, 4]) == hx("0001000200030004")
    # 12 bits round up to 2 bytes, left-aligned.
    p = EVProfile(EXP, EVFormatProfile(SRV6, (4, 4, 4)), (EVField(4, mask=0xF),) * 3, 1, evs=(hx("abc0"),))
    assert p.compact([0xA, 0xB, 0xC]) == hx("abc0")
    assert p.expand(hx("abc0")) == hx("abc0") + bytes(30)


@pytest.mark.parametrize(
    ("values", "where"),
    [([0xA], "values"), ([0x10, 0], "values[0]"), ([0, -1], "values[1]"), ([1, 2, 3], "values")],
)
def test_compact_rejects_bad_values(values: list[int], where: str) -> None:
    with pytest.raises(EVConfigError) as e:
        stev_gen_fixed().compact(values)
    assert e.value.field == where


def test_compact_requires_zero_for_unmasked_fields() -> None:
    with pytest.raises(EVConfigError, match=r"values\[0\]"):
        srv6_explicit().compact([1, 1, 2, 3, 4])


def test_field_values_and_compact_values() -> None:
    p = srv6_gen_fixed()
    e = p.expand(hx("fedc"))
    assert p.field_values(e) == (0x13131313, 0x010F, 0x020E, 0x030D, 0x040C)
    assert p.compact_values(e) == (0, 0xF, 0xE, 0xD, 0xC)
    w = stev_gen_weird()
    assert w.compact_values(w.expand(hx("a53c"))) == (0xA5, 0x3C)
    with pytest.raises(EVConfigError, match="expanded"):
        p.field_values(e[:31])


# -- bad compact EVs ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("profile", "compact"),
    [
        (stev_gen_fixed(), "a501"),  # second byte unused
        (stev_gen_weird(), "a53c80"),  # a single stray bit right after the consumed 16
        (srv6_gen(), "1234" + Z * 29 + "01"),  # last bit of a 32-byte buffer
        (stev_explicit(), "12345678" + Z * 27 + "01"),
    ],
)
def test_nonzero_unused_bits_raise(profile: EVProfile, compact: str) -> None:
    with pytest.raises(EVConfigError, match=r"non-zero bits beyond the \d+ bits"):
        profile.expand(hx(compact))


def test_unused_bits_within_the_last_consumed_byte() -> None:
    p = EVProfile(EXP, EVFormatProfile(STEV, (12,)), (EVField(12, mask=0xFFF),), 1, evs=(hx("abc0"),))
    assert p.expand(hx("abc0")) == hx("abc0") + bytes(30)
    with pytest.raises(EVConfigError, match="beyond the 12 bits"):
        p.expand(hx("abc1"))
    with pytest.raises(EVConfigError, match="beyond the 12 bits"):
        p.expand(hx("abc8"))


@pytest.mark.parametrize(
    ("profile", "compact"),
    [(stev_explicit(), "123456"), (srv6_srh_explicit(), "00" * 15), (stev_gen_fixed(), "")],
)
def test_short_compact_raises(profile: EVProfile, compact: str) -> None:
    with pytest.raises(EVConfigError, match="shorter than"):
        profile.expand(hx(compact))


def test_compact_longer_than_32_bytes_raises() -> None:
    with pytest.raises(EVConfigError, match="more than 32"):
        stev_explicit().expand(bytes(33))


def test_auto_profile_without_format() -> None:
    p = EVProfile(AUTO, None)
    assert p.compact_bits == 0
    assert p.expand(b"") == bytes(32)
    assert p.field_values(bytes(32)) == ()
    with pytest.raises(EVConfigError, match="non-zero"):
        p.expand(b"\x01")


# -- hypothesis: expand == literal reference --------------------------------------------------------------
@st.composite
def profiles_and_compacts(draw: st.DrawFn) -> tuple[EVProfile, bytes]:
    mode = draw(st.sampled_from([STEV, UDP, SRV6]))
    limit = mode.max_width_bits
    widths: list[int] = []
    for w in draw(st.lists(st.integers(1, 32), min_size=1, max_size=12)):
        if sum(widths) + w <= limit:
            widths.append(w)
    if not widths:
        widths = [min(limit, 16)]
    fmt = EVFormatProfile(mode, tuple(widths))
    n = draw(st.integers(1, len(widths)))
    fields = []
    for i in range(n):
        width = draw(st.integers(1, widths[i]))
        top = (1 << width) - 1
        mask = draw(st.one_of(st.just(0), st.just(top), st.integers(0, top)))
        k = mask.bit_count()
        max_val = draw(st.integers(0, (1 << k) - 1))
        min_val = draw(st.integers(0, max_val))
        fields.append(EVField(width, draw(st.integers(0, top)), min_val, max_val, mask))
    k_total = sum(f.mask.bit_count() for f in fields)
    x = draw(st.integers(0, (1 << k_total) - 1))
    nbytes = (k_total + 7) // 8
    extra = draw(st.integers(0, 32 - nbytes))
    compact = (x << (nbytes * 8 - k_total)).to_bytes(nbytes, "big") + bytes(extra)
    profile = EVProfile(EXP, fmt, tuple(fields), 1, 0, 0, (compact,))
    return profile, compact


@settings(max_examples=400)
@given(profiles_and_compacts())
def test_expand_matches_reference(case: tuple[EVProfile, bytes]) -> None:
    profile, compact = case
    assert profile.fmt is not None
    out = profile.expand(compact)
    assert out == ref_expand(profile.fmt.field_widths, profile.fields, compact)
    # The inverse helpers agree with the reference's view of the slots and masks.
    assert profile.field_values(out) == tuple(
        slot(out, profile.fmt.field_widths, i) for i in range(len(profile.fields))
    )
    values = profile.compact_values(out)
    assert values == tuple(
        ref_gather(v, f.mask) for v, f in zip(profile.field_values(out), profile.fields, strict=True)
    )
    assert profile.compact(list(values)) == compact[: profile.compact_bytes]


@settings(max_examples=200)
@given(profiles_and_compacts(), st.data())
def test_any_stray_bit_raises(case: tuple[EVProfile, bytes], data: st.DataObject) -> None:
    profile, compact = case
    spare = len(compact) * 8 - profile.compact_bits
    if spare == 0:
        compact += b"\x00"
        spare = 8
    bit = profile.compact_bits + data.draw(st.integers(0, spare - 1))
    bad = bytearray(compact)
    bad[bit // 8] |= 0x80 >> (bit % 8)
    with pytest.raises(EVConfigError, match="non-zero bits"):
        profile.expand(bytes(bad))
    with pytest.raises(ValueError):
        assert profile.fmt is not None
        ref_expand(profile.fmt.field_widths, profile.fields, bytes(bad))


# -- format profile validation ----------------------------------------------------------------------------
def test_format_limits() -> None:
    assert (STEV.max_width_bits, UDP.max_width_bits, SRV6.max_width_bits) == (32, 16, 256)
    assert EVFormatProfile(SRV6, (32,) * 8).max_width_bits == 256
    assert EVFormatProfile(UDP, (16,)).total_width_bits == 16
    assert (int(STEV), int(SRV6), int(UDP)) == (1, 2, 4)


@pytest.mark.parametrize(
    ("mode", "widths", "message"),
    [
        (STEV, (), "field_widths: at least one"),
        (STEV, (8, 8, 8, 40), "field_widths[3]: width 40 exceeds 32 bits"),
        (SRV6, (16, 0), "field_widths[1]: width 0 is below 1 bit"),
        (STEV, (16, 17), "field_widths: total width 33 bits exceeds the 32-bit limit of STEV"),
        (UDP, (17,), "field_widths: total width 17 bits exceeds the 16-bit limit of UDP"),
        (UDP, (8, 8, 1), "field_widths: total width 17"),
        (SRV6, (32,) * 8 + (1,), "field_widths: total width 257"),
    ],
)
def test_format_profile_errors(mode: EVFormatMode, widths: tuple[int, ...], message: str) -> None:
    with pytest.raises(EVConfigError) as e:
        EVFormatProfile(mode, widths)
    assert str(e.value).startswith(message)


def test_format_profile_bad_mode() -> None:
    with pytest.raises(EVConfigError, match=r"^mode:"):
        EVFormatProfile(3, (16,))  # type: ignore[arg-type]
    assert EVFormatProfile(1, [16, 16]).mode is STEV  # type: ignore[arg-type]


# -- EV profile validation --------------------------------------------------------------------------------
def gen_base(**changes: Any) -> EVProfile:
    """A valid GEN profile (OCP's SRv6 generated w/ fixed) with some constructor arguments replaced."""
    args: dict[str, Any] = {
        "mode": GEN,
        "fmt": SRV6_FMT,
        "fields": srv6_gen_fixed().fields,
        "ev_count": 8,
        "ev_min_active": 2,
        "event_mask": EVState.GOOD | EVState.ASSUMED_BAD,
        "evs": None,
    }
    args.update(changes)
    return EVProfile(**args)


def with_field(i: int, **changes: Any) -> tuple[EVField, ...]:
    fields = list(srv6_gen_fixed().fields)
    fields[i] = dataclasses.replace(fields[i], **changes)
    return tuple(fields)


U16 = EVField(16, mask=0xFFFF)

BAD_PROFILES: list[tuple[str, dict[str, Any], str]] = [
    ("mode", {"mode": 8}, "mode"),
    ("fmt missing", {"fmt": None}, "fmt"),
    ("fmt type", {"fmt": (16, 16)}, "fmt"),
    ("no fields", {"fields": ()}, "fields"),
    ("not a field", {"fields": ((16, 0, 0, 0, 0xF),)}, "fields[0]"),
    ("too many fields", {"fields": (*srv6_gen_fixed().fields, U16)}, "fields"),
    ("sum of widths", {"fmt": EVFormatProfile(STEV, (16, 16)), "fields": (EVField(17), U16)}, "fields"),
    ("width 0", {"fields": with_field(1, width=0)}, "fields[1].width"),
    ("width 33", {"fmt": EVFormatProfile(SRV6, (32, 32)), "fields": (EVField(33),)}, "fields[0].width"),
    ("wider than format", {"fmt": EVFormatProfile(STEV, (8, 24)), "fields": (U16, U16)}, "fields[0].width"),
    ("init_val wide", {"fields": with_field(2, init_val=0x10000)}, "fields[2].init_val"),
    ("init_val < 0", {"fields": with_field(0, init_val=-1)}, "fields[0].init_val"),
    ("mask outside", {"fields": with_field(1, mask=0x1000F)}, "fields[1].mask"),
    ("max_val wide", {"fields": with_field(3, max_val=0x10)}, "fields[3].max_val"),
    ("max_val > 32 bits", {"fields": with_field(3, max_val=1 << 32)}, "fields[3].max_val"),
    ("min > max", {"fields": with_field(4, min_val=9, max_val=8)}, "fields[4].min_val"),
    ("min_val < 0", {"fields": with_field(4, min_val=-1)}, "fields[4].min_val"),
    ("ev_count 0", {"ev_count": 0, "ev_min_active": 0}, "ev_count"),
    ("ev_count < 0", {"ev_count": -1}, "ev_count"),
    ("ev_count too many", {"ev_count": 15**4 + 1}, "ev_count"),
    ("min_active", {"ev_min_active": 9}, "ev_min_active"),
    ("event_mask DENIED", {"event_mask": EVState.GOOD | EVState.DENIED}, "event_mask"),
    ("event_mask UNKNOWN", {"event_mask": EVState.UNKNOWN}, "event_mask"),
    ("event_mask SKIP", {"event_mask": EVState.SKIP}, "event_mask"),
    ("GEN with evs", {"evs": (hx("1234"),) * 8}, "evs"),
]


@pytest.mark.parametrize(("label", "changes", "where"), BAD_PROFILES, ids=[b[0] for b in BAD_PROFILES])
def test_profile_validation(label: str, changes: dict[str, Any], where: str) -> None:
    with pytest.raises(EVConfigError) as e:
        gen_base(**changes)
    assert e.value.field == where
    assert str(e.value).startswith(where + ": ")


def test_profile_validation_messages() -> None:
    with pytest.raises(EVConfigError, match=r"^fields\[1\]\.mask: bits 0x10000 outside the 16-bit width$"):
        gen_base(fields=with_field(1, mask=0x1000F))
    with pytest.raises(EVConfigError, match="openmrc rule"):
        gen_base(fmt=EVFormatProfile(STEV, (8, 24)), fields=(U16, U16))
    with pytest.raises(EVConfigError, match="exceeds the 50625 distinct EVs"):
        gen_base(ev_count=50626)


def test_valid_profiles_do_not_raise() -> None:
    gen_base()
    gen_base(ev_count=15**4, ev_min_active=15**4, event_mask=0)
    gen_base(event_mask=EVState.ASSUMED_BAD)
    # A masked field with min == max is a single value; GEN needs min <= max only where a mask is set.
    gen_base(fields=with_field(1, min_val=3, max_val=3), ev_count=15**3)
    gen_base(fields=with_field(0, min_val=5, max_val=1))  # fixed field: min/max ignored
    # EXP does not constrain min/max ordering.
    exp(SRV6_FMT, with_field(1, min_val=9, max_val=8), (hx("1234"),))
    # AUTO: no format, fields, count or EVs needed; a format and counts are allowed.
    EVProfile(AUTO, None)
    EVProfile(AUTO, EVFormatProfile(STEV, (32,)), ev_count=128, ev_min_active=16)
    # Positional and keyword construction; lists are accepted and frozen into tuples.
    fields: Any = list(srv6_explicit().fields)
    evs: Any = [bytes(8)] * 2
    p = EVProfile(mode=EXP, fmt=SRV6_FMT, fields=fields, ev_count=2, ev_min_active=1, evs=evs)
    assert isinstance(p.fields, tuple) and isinstance(p.evs, tuple)
    assert p == exp(SRV6_FMT, srv6_explicit().fields, (bytes(8), bytes(8)))
    assert hash(p) == hash(exp(SRV6_FMT, srv6_explicit().fields, (bytes(8), bytes(8))))


def test_unconstrained_generated_fields() -> None:
    """[openmrc] min_val == max_val == 0 on a masked GEN field means its whole masked range."""
    assert stev_gen_32().combinations == 1 << 32
    one = gen_base(fields=with_field(1, min_val=0, max_val=0))
    assert one.combinations == 16 * 15**3


BAD_EXPLICIT: list[tuple[str, Any, int, str]] = [
    ("missing", None, 2, "evs"),
    ("count mismatch", (hx("0001000200030004"),), 2, "evs"),
    ("too long", (bytes(8), bytes(33)), 2, "evs[1]"),
    ("short", (hx("00010002000300"), bytes(8)), 2, "evs[0]"),
    ("stray bits", (bytes(8), hx("0001000200030004 01")), 2, "evs[1]"),
    ("not bytes", (bytes(8), "0001000200030004"), 2, "evs[1]"),
]


@pytest.mark.parametrize(("label", "evs", "count", "where"), BAD_EXPLICIT, ids=[b[0] for b in BAD_EXPLICIT])
def test_explicit_ev_validation(label: str, evs: Any, count: int, where: str) -> None:
    with pytest.raises(EVConfigError) as e:
        EVProfile(EXP, SRV6_FMT, srv6_explicit().fields, count, 0, 0, evs)
    assert e.value.field == where


def test_explicit_evs_may_repeat() -> None:
    p = EVProfile(EXP, SRV6_FMT, srv6_explicit().fields, 3, 0, 0, (bytes(8),) * 3)
    assert p.evs == (bytes(8),) * 3


def test_auto_rejects_evs() -> None:
    with pytest.raises(EVConfigError, match=r"^evs:"):
        EVProfile(AUTO, None, evs=(b"\x01",))
    with pytest.raises(EVConfigError, match=r"^fmt:"):
        EVProfile(AUTO, None, (U16,))


# -- generation -------------------------------------------------------------------------------------------
GEN_CASES = [stev_gen_fixed(), stev_gen_weird(), srv6_gen(), srv6_gen_fixed(), stev_gen_32()]


@pytest.mark.parametrize(
    "profile", GEN_CASES, ids=["stev_fixed", "stev_weird", "srv6", "srv6_fixed", "stev32"]
)
def test_generate_distinct_and_in_range(profile: EVProfile) -> None:
    assert profile.fmt is not None
    widths = profile.fmt.field_widths
    evs = profile.generate(random.Random(1234))
    assert len(evs) == profile.ev_count
    assert len(set(evs)) == len(evs)
    for c in evs:
        assert len(c) == profile.compact_bytes
        out = profile.expand(c)
        for i, f in enumerate(profile.fields):
            v = slot(out, widths, i)
            assert v & ~f.mask == f.init_val & ~f.mask  # fixed bits untouched
            if f.mask:
                unconstrained = f.min_val == f.max_val == 0
                lo, hi = (0, (1 << f.mask.bit_count()) - 1) if unconstrained else (f.min_val, f.max_val)
                assert lo <= ref_gather(v, f.mask) <= hi


def test_generate_many_in_range_and_covering() -> None:
    p = gen_base(ev_count=5000)
    evs = p.generate(random.Random(5))
    assert len(set(evs)) == 5000
    seen: list[set[int]] = [set() for _ in p.fields]
    for c in evs:
        out = p.expand(c)
        for i, f in enumerate(p.fields):
            if f.mask:
                x = ref_gather(slot(out, SRV6_FMT.field_widths, i), f.mask)
                assert f.min_val <= x <= f.max_val
                seen[i].add(x)
    assert all(seen[i] == set(range(1, 16)) for i in range(1, 5))  # every value of [1, 15] drawn


def test_generate_exhausts_small_space_exactly() -> None:
    fields = (EVField(8, 0xA0, 3, 7, 0x0F),)
    p = EVProfile(GEN, EVFormatProfile(UDP, (8,)), fields, 5)
    evs = p.generate(random.Random(0))
    assert sorted(p.expand(c)[0] for c in evs) == [0xA3, 0xA4, 0xA5, 0xA6, 0xA7]
    with pytest.raises(EVConfigError, match=r"^ev_count:"):
        EVProfile(GEN, EVFormatProfile(UDP, (8,)), fields, 6)
    with pytest.raises(EVConfigError, match=r"^count:"):
        p.generate(random.Random(0), 6)
    assert len(p.generate(random.Random(0), 3)) == 3


def test_generate_is_deterministic_and_seed_dependent() -> None:
    p = gen_base(ev_count=64)
    a = p.generate(random.Random(42))
    assert a == p.generate(random.Random(42))
    assert a != p.generate(random.Random(43))


def test_generate_uses_only_the_injected_rng() -> None:
    random.seed(99)
    state = random.getstate()
    gen_base(ev_count=64).generate(random.Random(1))
    stev_gen_32().generate(random.Random(1))
    assert random.getstate() == state


def test_generate_huge_space() -> None:
    """Above sys.maxsize combinations generation switches to rejection sampling; still distinct, in range."""
    fmt = EVFormatProfile(SRV6, (32, 32, 32, 32))
    fields = (EVField(32, 0xFC000000),) + (EVField(32, 0, 5, 0xFFFFFFF0, 0xFFFFFFFF),) * 3
    p = EVProfile(GEN, fmt, fields, 256)
    evs = p.generate(random.Random(3))
    assert len(set(evs)) == 256
    assert evs == p.generate(random.Random(3))
    for c in evs:
        for v in p.field_values(p.expand(c))[1:]:
            assert 5 <= v <= 0xFFFFFFF0


def test_generate_requires_gen_mode() -> None:
    with pytest.raises(EVConfigError, match=r"^mode:"):
        srv6_explicit().generate(random.Random(0))


# -- EV states --------------------------------------------------------------------------------------------
def test_ev_state_values_match_mrc_ctl() -> None:
    assert (EVState.GOOD, EVState.ASSUMED_BAD, EVState.DENIED, EVState.UNKNOWN) == (1, 2, 4, 1 << 31)
    internal = EVState.SKIP
    assert not internal & (EVState.GOOD | EVState.ASSUMED_BAD | EVState.DENIED | EVState.UNKNOWN)
    assert (int(AUTO), int(EXP), int(GEN)) == (1, 2, 4)


def test_controller_visible_states() -> None:
    assert set(CONTROLLER_VISIBLE) == set(EVState)
    assert controller_state(EVState.SKIP) is EVState.GOOD
    assert EVState.SKIP not in set(CONTROLLER_VISIBLE.values())
    for s in (EVState.GOOD, EVState.ASSUMED_BAD, EVState.DENIED, EVState.UNKNOWN):
        assert controller_state(s) is s
    with pytest.raises(TypeError):
        CONTROLLER_VISIBLE[EVState.SKIP] = EVState.DENIED  # type: ignore[index]


@pytest.mark.parametrize("attr", ["width", "init_val", "mask", "min_val", "max_val"])
def test_a_field_equal_to_a_valid_one_but_not_an_int_is_still_refused(attr: str) -> None:
    """Layouts are memoised by value and True == 1: a bool or float must not borrow a valid field's entry."""
    fmt = EVFormatProfile(STEV, (16, 16))
    good = EVField(1, init_val=1, min_val=1, max_val=1, mask=1)
    EVProfile(GEN, fmt, (good,), ev_count=1)  # its layout is cached now
    for odd in (True, 1.0):
        bad = dataclasses.replace(good, **{attr: odd})
        assert bad == good and hash(bad) == hash(good)
        with pytest.raises(EVConfigError, match=attr):
            EVProfile(GEN, fmt, (bad,), ev_count=1)
