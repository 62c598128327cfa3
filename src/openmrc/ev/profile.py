"""EV format profiles, EV profiles, EV expansion and generation (MRC spec notes §2; mrc_ctl.h).

Theory of operation
-------------------
A *compact* EV is what the controller hands the NIC (EXP mode) or what the NIC draws itself (GEN mode): a
short byte string. The EV profile expands it into the up-to-32-byte value that goes on the wire, following
the ``mrc_ctl_ev_profile_attr`` comment of mrc_ctl.h and OCP's ``ev_expansion`` example:

* the compact EV is a bit stream read most-significant bit first (byte 0 bit 7 first);
* field ``i`` starts from ``init_val`` and, if its ``mask`` is non-zero, takes the next ``popcount(mask)``
  bits of the stream as an integer ``x`` and writes ``x`` into the set bit positions of the mask, the lowest
  set mask bit receiving the least significant bit of ``x``;
* the field value is written MSB-first into the ``fmt.field_widths[i]``-bit slot of the EV format (left
  zero-filled); slots follow each other from bit 0 of a zeroed 32-byte output, and format slots without a
  profile field stay zero;
* compact bits after the consumed ones must be zero.

The mapping is fixed per profile, so ``__post_init__`` compiles it into a constant ``base`` (every init_val
bit no mask overwrites, already in place) and a list of *runs* ``(src_shift, run_mask, dst_shift)``: each
maximal run of consecutive set mask bits copies one contiguous slice of the compact integer to one contiguous
slice of the 256-bit output. Expanding is then one ``int.from_bytes``, a few shifts and one ``to_bytes``.

openmrc rules beyond the mrc_ctl.h list (each marked **[openmrc]** where it applies):

* a profile field may not be wider than its format field, which would make packing drop bits silently;
* EXP and GEN profiles need at least one field; AUTO profiles need no format and no fields;
* in GEN mode a masked field with ``min_val == max_val == 0`` is unconstrained (its whole masked range), as
  in OCP's own generated-EV examples; ``min_val``/``max_val`` are ignored for unmasked (fixed) fields;
* explicit EVs may repeat (mrc_ctl.h's REPLACE_EV "all copies" flag implies duplicates are allowed).
"""

from __future__ import annotations

import functools
import random
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from typing import NamedTuple

from openmrc.ev.state import EVENT_MASK_ALLOWED, EVState

__all__ = [
    "EV_FIELD_MAX_BITS",
    "EV_MAX_BYTES",
    "EVConfigError",
    "EVField",
    "EVFormatMode",
    "EVFormatProfile",
    "EVProfile",
    "EVProfileMode",
]

EV_MAX_BYTES = 32
"""Size of an expanded EV, and the largest compact EV (mrc_ctl.h ``MRC_CTL_EV_MAX_BYTES``)."""
EV_FIELD_MAX_BITS = 32
"""Widest EV field or EV format field (``uint32_t`` field values)."""
_U32_MAX = 0xFFFFFFFF
_OUT_BITS = EV_MAX_BYTES * 8


class EVConfigError(ValueError):
    """An invalid EV format profile, EV profile or compact EV. ``field`` names the offending field."""

    def __init__(self, field: str, reason: str) -> None:
        self.field = field
        self.reason = reason
        super().__init__(f"{field}: {reason}")


class EVFormatMode(IntEnum):
    """How an expanded EV is carried (mrc_ctl.h ``mrc_ctl_ev_fmt_mode``)."""

    STEV = 1 << 0
    """Structured 32-bit EV: low 16 bits in the UDP source port, high 16 bits in the IPv6 flow label."""
    SRV6 = 1 << 1
    """SRv6 uSID destination address (bytes 0-15), optionally a single-segment SRH address (bytes 16-31)."""
    UDP = 1 << 2
    """16-bit EV carried entirely in the UDP source port."""

    @property
    def max_width_bits(self) -> int:
        """Largest total format width this mode can carry."""
        return _MODE_MAX_BITS[self]


_MODE_MAX_BITS = {EVFormatMode.STEV: 32, EVFormatMode.UDP: 16, EVFormatMode.SRV6: 256}


class EVProfileMode(IntEnum):
    """Where a profile's EVs come from (mrc_ctl.h ``mrc_ctl_ev_mode``)."""

    AUTO = 1 << 0
    """No EVs from the controller: the device manages them (e.g. ECMP)."""
    EXP = 1 << 1
    """Explicit compact EVs given by the controller."""
    GEN = 1 << 2
    """The device generates ``ev_count`` EVs within each field's [min_val, max_val]."""


def _check_uint(name: str, value: object, limit: int = _U32_MAX) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise EVConfigError(name, f"expected an integer, got {type(value).__name__}")
    if not 0 <= value <= limit:
        raise EVConfigError(name, f"{value} outside 0..{limit}")
    return value


def _check_width(name: str, width: object) -> int:
    if not isinstance(width, int) or isinstance(width, bool):
        raise EVConfigError(name, f"expected an integer width, got {type(width).__name__}")
    if width < 1:
        raise EVConfigError(name, f"width {width} is below 1 bit")
    if width > EV_FIELD_MAX_BITS:
        raise EVConfigError(name, f"width {width} exceeds {EV_FIELD_MAX_BITS} bits")
    return width


@dataclass(frozen=True)
class EVFormatProfile:
    """An EV format profile: the on-wire slots an expanded EV is packed into."""

    mode: EVFormatMode
    """How the expanded EV is carried; bounds the total width."""
    field_widths: tuple[int, ...]
    """Width in bits of each format slot, in wire order (1..32 each)."""

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "mode", EVFormatMode(self.mode))
        except ValueError:
            raise EVConfigError("mode", f"{self.mode!r} is not an EV format mode") from None
        widths = tuple(self.field_widths)
        object.__setattr__(self, "field_widths", widths)
        if not widths:
            raise EVConfigError("field_widths", "at least one format field is required")
        for i, w in enumerate(widths):
            _check_width(f"field_widths[{i}]", w)
        total = sum(widths)
        if total > self.max_width_bits:
            raise EVConfigError(
                "field_widths",
                f"total width {total} bits exceeds the {self.max_width_bits}-bit limit of {self.mode.name}",
            )

    @property
    def max_width_bits(self) -> int:
        """Largest total width the format's mode allows (STEV 32, UDP 16, SRV6 256)."""
        return self.mode.max_width_bits

    @property
    def total_width_bits(self) -> int:
        """Sum of the format field widths."""
        return sum(self.field_widths)


@dataclass(frozen=True)
class EVField:
    """One EV profile field (mrc_ctl.h ``mrc_ctl_ev_field``); validated by the `EVProfile` holding it."""

    width: int
    """Field width in bits (1..32, and at most the width of its format field)."""
    init_val: int = 0
    """Value before the compact EV's bits are overlaid; a fixed part has only this set."""
    min_val: int = 0
    """Smallest masked value for generated EVs."""
    max_val: int = 0
    """Largest masked value for generated EVs; must fit in popcount(mask) bits."""
    mask: int = 0
    """Bit positions (within the width) that take bits from the compact EV."""


_Run = tuple[int, int, int]


class _Layout(NamedTuple):
    """What a profile's fields compile to (`EVProfile` keeps each as ``_<name>``)."""

    compact_bits: int
    field_bits: tuple[int, ...]
    slot_lsb: tuple[int, ...]
    slot_masks: tuple[int, ...]
    base: int
    runs: tuple[_Run, ...]
    gen_ranges: tuple[tuple[int, int], ...]
    gen_total: int


def _layout_of(mode: EVProfileMode, fmt: EVFormatProfile | None, fields: tuple[EVField, ...]) -> _Layout:
    """The checked, compiled layout of ``fields`` in ``fmt``. A fabric installs thousands of profiles that
    differ only in their explicit EVs, so layouts are memoised by value (fields and formats are frozen)."""
    for i, f in enumerate(fields):
        if not isinstance(f, EVField):
            raise EVConfigError(f"fields[{i}]", f"expected an EVField, got {type(f).__name__}")
        if not all(type(v) is int for v in (f.width, f.init_val, f.min_val, f.max_val, f.mask)):
            # True == 1 and 1.0 == 1 would share a cache entry with a valid field: check without it
            return _layout(mode, fmt, fields)
    return _cached_layout(mode, fmt, fields)


def _layout(mode: EVProfileMode, fmt: EVFormatProfile | None, fields: tuple[EVField, ...]) -> _Layout:
    _check_fields(mode, fields, fmt)
    return _compile(fields, fmt)


_cached_layout = functools.lru_cache(maxsize=256)(_layout)


def _check_fields(mode: EVProfileMode, fields: tuple[EVField, ...], fmt: EVFormatProfile | None) -> None:
    if fmt is None:
        return
    widths = fmt.field_widths
    if len(fields) > len(widths):
        raise EVConfigError("fields", f"{len(fields)} fields but the format has only {len(widths)}")
    for i, f in enumerate(fields):
        _check_width(f"fields[{i}].width", f.width)
    total = sum(f.width for f in fields)
    if total > fmt.total_width_bits:
        raise EVConfigError(
            "fields", f"total width {total} bits exceeds the format's {fmt.total_width_bits} bits"
        )
    gen = mode is EVProfileMode.GEN
    for i, f in enumerate(fields):
        name = f"fields[{i}]"
        if f.width > widths[i]:
            raise EVConfigError(
                f"{name}.width",
                f"width {f.width} exceeds the {widths[i]}-bit format field {i} "
                "(openmrc rule: packing would drop bits)",
            )
        limit = (1 << f.width) - 1
        init_val = _check_uint(f"{name}.init_val", f.init_val)
        if init_val > limit:
            raise EVConfigError(f"{name}.init_val", f"{init_val:#x} does not fit the {f.width}-bit width")
        mask = _check_uint(f"{name}.mask", f.mask)
        if mask & ~limit:
            raise EVConfigError(f"{name}.mask", f"bits {mask & ~limit:#x} outside the {f.width}-bit width")
        min_val = _check_uint(f"{name}.min_val", f.min_val)
        max_val = _check_uint(f"{name}.max_val", f.max_val)
        if mask == 0:
            continue
        k = mask.bit_count()
        if max_val >> k:
            raise EVConfigError(
                f"{name}.max_val", f"{max_val:#x} does not fit the {k} set bits of mask {mask:#x}"
            )
        if gen and min_val > max_val:
            raise EVConfigError(f"{name}.min_val", f"{min_val:#x} exceeds max_val {max_val:#x}")


def _compile(fields: tuple[EVField, ...], fmt: EVFormatProfile | None) -> _Layout:
    field_bits = tuple(f.mask.bit_count() for f in fields)
    total_bits = sum(field_bits)
    slot_widths = fmt.field_widths[: len(fields)] if fmt is not None else ()
    slot_lsb: list[int] = []
    d = 0
    for width in slot_widths:
        d += width
        slot_lsb.append(_OUT_BITS - d)
    base = 0
    runs: list[_Run] = []
    s = 0
    for f, k, lsb in zip(fields, field_bits, slot_lsb, strict=True):
        base |= (f.init_val & ~f.mask) << lsb
        t = 0  # index of the next bit of x, counted from its least significant bit
        src_lsb = total_bits - s - k  # where x's bit 0 sits in the normalized compact integer
        for pos, length in _bit_runs(f.mask):
            runs.append((src_lsb + t, (1 << length) - 1, lsb + pos))
            t += length
        s += k
    gen_ranges: list[tuple[int, int]] = []
    gen_total = 1
    for f, k in zip(fields, field_bits, strict=True):
        if k == 0:
            continue
        lo, hi = (0, (1 << k) - 1) if f.min_val == f.max_val == 0 else (f.min_val, f.max_val)
        gen_ranges.append((lo, hi - lo + 1))
        gen_total *= max(hi - lo + 1, 0)
    return _Layout(
        total_bits,
        field_bits,
        tuple(slot_lsb),
        tuple((1 << w) - 1 for w in slot_widths),
        base,
        _merge_runs(runs),
        tuple(gen_ranges),
        gen_total,
    )


@dataclass(frozen=True)
class EVProfile:
    """An EV profile: fields that expand compact EVs into wire EVs, plus the profile's EV set parameters."""

    mode: EVProfileMode
    """AUTO, EXP or GEN."""
    fmt: EVFormatProfile | None
    """The EV format profile; required for EXP and GEN, optional for AUTO."""
    fields: tuple[EVField, ...] = ()
    """Fields in order; field ``i`` is packed into format slot ``i``."""
    ev_count: int = 0
    """Number of EVs (at least 1 for EXP and GEN)."""
    ev_min_active: int = 0
    """Floor below which EVs are not marked ASSUMED_BAD; at most ``ev_count``."""
    event_mask: int = 0
    """EV state changes reported to the controller: only `EVState.GOOD` and `EVState.ASSUMED_BAD` bits."""
    evs: tuple[bytes, ...] | None = None
    """EXP mode only: the ``ev_count`` compact EVs."""

    _compact_bits: int = field(init=False, repr=False, compare=False)
    _field_bits: tuple[int, ...] = field(init=False, repr=False, compare=False)
    _slot_lsb: tuple[int, ...] = field(init=False, repr=False, compare=False)
    _slot_masks: tuple[int, ...] = field(init=False, repr=False, compare=False)
    _base: int = field(init=False, repr=False, compare=False)
    _runs: tuple[_Run, ...] = field(init=False, repr=False, compare=False)
    _gen_ranges: tuple[tuple[int, int], ...] = field(init=False, repr=False, compare=False)
    _gen_total: int = field(init=False, repr=False, compare=False)

    # -- validation ------------------------------------------------------------------------------------
    def __post_init__(self) -> None:
        try:
            mode = EVProfileMode(self.mode)
        except ValueError:
            raise EVConfigError("mode", f"{self.mode!r} is not an EV profile mode") from None
        object.__setattr__(self, "mode", mode)
        fields = tuple(self.fields)
        object.__setattr__(self, "fields", fields)
        fmt = self.fmt
        if fmt is not None and not isinstance(fmt, EVFormatProfile):
            raise EVConfigError("fmt", f"expected an EVFormatProfile, got {type(fmt).__name__}")
        if fmt is None and mode is not EVProfileMode.AUTO:
            raise EVConfigError("fmt", f"{mode.name} profiles need an EV format profile")
        if fmt is None and fields:
            raise EVConfigError("fmt", "fields given without an EV format profile")
        if not fields and mode is not EVProfileMode.AUTO:
            raise EVConfigError("fields", f"{mode.name} profiles need at least one field")
        lay = _layout_of(mode, fmt, fields)
        ev_count = _check_uint("ev_count", self.ev_count)
        if ev_count < 1 and mode is not EVProfileMode.AUTO:
            raise EVConfigError("ev_count", f"{mode.name} profiles need at least 1 EV")
        if _check_uint("ev_min_active", self.ev_min_active) > ev_count:
            raise EVConfigError("ev_min_active", f"{self.ev_min_active} exceeds ev_count {ev_count}")
        event_mask = _check_uint("event_mask", self.event_mask)
        if event_mask & ~EVENT_MASK_ALLOWED:
            raise EVConfigError(
                "event_mask",
                f"bits {event_mask & ~EVENT_MASK_ALLOWED:#x} not allowed "
                f"(only GOOD {EVState.GOOD:#x} and ASSUMED_BAD {EVState.ASSUMED_BAD:#x})",
            )
        for name, value in zip(_Layout._fields, lay, strict=True):
            object.__setattr__(self, "_" + name, value)
        if mode is EVProfileMode.GEN and ev_count > self._gen_total:
            raise EVConfigError(
                "ev_count",
                f"{ev_count} exceeds the {self._gen_total} distinct EVs the fields' [min_val, max_val] allow",
            )
        self._check_evs(mode, ev_count)

    def _check_evs(self, mode: EVProfileMode, ev_count: int) -> None:
        if mode is not EVProfileMode.EXP:
            if self.evs is not None:
                raise EVConfigError("evs", f"{mode.name} profiles take no explicit EVs")
            return
        if self.evs is None:
            raise EVConfigError("evs", "EXP profiles need their explicit EVs")
        evs = tuple(self.evs)
        if len(evs) != ev_count:
            raise EVConfigError("evs", f"{len(evs)} EVs given but ev_count is {ev_count}")
        n = self._compact_bits >> 3
        if n << 3 == self._compact_bits and all(type(ev) is bytes and len(ev) == n for ev in evs):
            object.__setattr__(self, "evs", evs)  # whole bytes of exactly the consumed bits: valid as given
            return
        for i, ev in enumerate(evs):
            if not isinstance(ev, (bytes, bytearray, memoryview)):
                raise EVConfigError(f"evs[{i}]", f"expected bytes, got {type(ev).__name__}")
            self._normalize(ev, f"evs[{i}]")
        object.__setattr__(self, "evs", tuple(bytes(ev) for ev in evs))

    # -- compact EVs -----------------------------------------------------------------------------------
    @property
    def compact_bits(self) -> int:
        """Bits of compact EV the profile consumes (the sum of the fields' mask popcounts)."""
        return self._compact_bits

    @property
    def compact_bytes(self) -> int:
        """Length of the shortest valid compact EV."""
        return (self._compact_bits + 7) // 8

    @property
    def combinations(self) -> int:
        """Number of distinct EVs a GEN profile can draw (the product of its masked value ranges)."""
        return self._gen_total

    def _normalize(self, compact: bytes | bytearray | memoryview, name: str) -> int:
        """The consumed compact bits as an integer; raises on bad length or non-zero spare bits."""
        n = len(compact)
        if n > EV_MAX_BYTES:
            raise EVConfigError(name, f"compact EV is {n} bytes, more than {EV_MAX_BYTES}")
        bits = self._compact_bits
        spare = n * 8 - bits
        if spare < 0:
            raise EVConfigError(
                name, f"compact EV is {n} byte(s), shorter than the {(bits + 7) // 8} the profile needs"
            )
        x = int.from_bytes(compact, "big")
        if x & ((1 << spare) - 1):
            raise EVConfigError(
                name, f"compact EV has non-zero bits beyond the {bits} bits the profile consumes"
            )
        return x >> spare

    def expand(self, compact: bytes) -> bytes:
        """The 32-byte expanded EV of ``compact`` (OCP semantics; see the module docstring)."""
        spare = len(compact) * 8 - self._compact_bits
        c = int.from_bytes(compact, "big")
        if spare < 0 or spare > _OUT_BITS - self._compact_bits or c & ((1 << spare) - 1):
            self._normalize(compact, "compact")  # raises with the precise reason
        c >>= spare
        out = self._base
        for src, mask, dst in self._runs:
            out |= ((c >> src) & mask) << dst
        return out.to_bytes(EV_MAX_BYTES, "big")

    def compact(self, values: Sequence[int]) -> bytes:
        """Pack one masked value per field (0 for unmasked fields) MSB-first into the shortest compact EV."""
        if len(values) != len(self.fields):
            raise EVConfigError("values", f"{len(values)} values for {len(self.fields)} fields")
        acc = 0
        for i, (v, k) in enumerate(zip(values, self._field_bits, strict=True)):
            if not isinstance(v, int) or not 0 <= v < (1 << k):
                raise EVConfigError(f"values[{i}]", f"{v!r} does not fit the field's {k} mask bits")
            acc = (acc << k) | v
        nbytes = (self._compact_bits + 7) // 8
        return (acc << (nbytes * 8 - self._compact_bits)).to_bytes(nbytes, "big")

    def field_values(self, expanded: bytes) -> tuple[int, ...]:
        """Each field's value as it sits in its format slot of a 32-byte expanded EV."""
        out = self._expanded_int(expanded)
        return tuple((out >> lsb) & mask for lsb, mask in zip(self._slot_lsb, self._slot_masks, strict=True))

    def compact_values(self, expanded: bytes) -> tuple[int, ...]:
        """Inverse of `compact` after `expand`: each field's masked bits gathered back into an integer."""
        result = []
        for f, value in zip(self.fields, self.field_values(expanded), strict=True):
            x = 0
            t = 0
            for pos, length in _bit_runs(f.mask):
                x |= ((value >> pos) & ((1 << length) - 1)) << t
                t += length
            result.append(x)
        return tuple(result)

    @staticmethod
    def _expanded_int(expanded: bytes) -> int:
        if len(expanded) != EV_MAX_BYTES:
            raise EVConfigError("expanded", f"expanded EV is {len(expanded)} bytes, not {EV_MAX_BYTES}")
        return int.from_bytes(expanded, "big")

    # -- generation ------------------------------------------------------------------------------------
    def generate(self, rng: random.Random, count: int | None = None) -> list[bytes]:
        """``count`` (default ``ev_count``) distinct compact EVs, each masked value uniform in its range.

        Deterministic for a seeded ``rng``; only ``rng`` is used. Raises `EVConfigError` if the profile
        is not GEN or if ``count`` exceeds `combinations`.
        """
        if self.mode is not EVProfileMode.GEN:
            raise EVConfigError("mode", f"generate() needs a GEN profile, not {self.mode.name}")
        n = self.ev_count if count is None else _check_uint("count", count, sys.maxsize)
        total = self._gen_total
        if n > total:
            raise EVConfigError("count", f"{n} exceeds the {total} distinct EVs the profile allows")
        # Drawing distinct indices into the product space gives each field a uniform value in its range.
        if total <= sys.maxsize:
            indices = rng.sample(range(total), n)
        else:
            seen: set[int] = set()
            indices = []
            while len(indices) < n:
                i = rng.randrange(total)
                if i not in seen:
                    seen.add(i)
                    indices.append(i)
        bits = self._compact_bits
        nbytes = (bits + 7) // 8
        pad = nbytes * 8 - bits
        masked = [k for k in self._field_bits if k]
        ranges = self._gen_ranges
        out = []
        for idx in indices:
            acc = 0
            for k, (lo, size) in zip(masked, ranges, strict=True):
                idx, r = divmod(idx, size)
                acc = (acc << k) | (lo + r)
            out.append((acc << pad).to_bytes(nbytes, "big"))
        return out


def _bit_runs(mask: int) -> list[tuple[int, int]]:
    """Maximal runs of set bits in ``mask`` as (lowest position, length), lowest run first."""
    runs = []
    pos = 0
    while mask:
        if mask & 1:
            length = (~mask & (mask + 1)).bit_length() - 1  # trailing ones
            runs.append((pos, length))
            mask >>= length
            pos += length
        else:
            zeros = (mask & -mask).bit_length() - 1  # trailing zeros
            mask >>= zeros
            pos += zeros
    return runs


def _merge_runs(runs: list[_Run]) -> tuple[_Run, ...]:
    """Join runs that are contiguous in both the compact and the expanded bits (e.g. adjacent full masks)."""
    merged: list[_Run] = []
    for src, mask, dst in sorted(runs):
        if merged:
            psrc, pmask, pdst = merged[-1]
            plen = pmask.bit_length()
            if psrc + plen == src and pdst + plen == dst:
                merged[-1] = (psrc, (1 << (plen + mask.bit_length())) - 1, pdst)
                continue
        merged.append((src, mask, dst))
    return tuple(merged)
