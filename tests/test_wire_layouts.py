"""The header classes are generated from their layout descriptions (`openmrc.wire._layouts`): the committed
module must be exactly what the descriptions generate, and the descriptions must say what the classes do."""

from __future__ import annotations

import dataclasses
import struct
from pathlib import Path

import pytest

import openmrc.wire
from openmrc.wire import _layouts, headers
from openmrc.wire._layouts import COMMAND, LAYOUTS, generate

GENERATED = Path(openmrc.wire.__file__).with_name("_headers_gen.py")


def test_generated_module_is_up_to_date() -> None:
    assert GENERATED.read_text() == generate(), f"{GENERATED.name} is stale or edited by hand: run {COMMAND}"


def test_generated_module_says_it_is_generated() -> None:
    first = GENERATED.read_text().splitlines()[0]
    assert first.startswith("# Generated, do not edit") and COMMAND in first


@pytest.mark.parametrize("lay", LAYOUTS, ids=lambda lay: lay.cls)
def test_each_layout_is_one_public_header(lay: _layouts.Layout) -> None:
    cls = getattr(headers, lay.cls)
    assert (cls.NAME, cls.SIZE, cls.ST.size) == (lay.name, lay.size, lay.size)
    assert [f.name for f in dataclasses.fields(cls)] == [f.name for f in lay.fields]
    assert cls.__doc__ == lay.doc
    # a field's bits start in the byte SPEC's offset says, and no two fields share a bit
    zero = cls(**{f.name: False if f.flag else 0 for f in lay.fields})
    seen = 0
    wire_order = (f for it in lay.items for f in it.fields)
    for (name, off, bits, signed), f in zip(cls.SPEC, wire_order, strict=True):
        assert (name, bits) == (f.name, f.bits)
        probe = dataclasses.replace(zero, **{name: _all_ones(f, signed)})
        ones = int.from_bytes(probe.encode()) ^ int.from_bytes(zero.encode())
        assert ones.bit_count() == (1 if f.enum else bits) and not ones & seen, name
        assert lay.size - 1 - (ones.bit_length() - 1) // 8 == off, name  # the byte of its first bit
        seen |= ones


def _all_ones(f: _layouts.Field, signed: bool) -> int:
    """Every bit of ``f`` set (its last enum value for an enum: the others are reserved)."""
    if f.flag:
        return True
    if f.enum is not None:
        return len(f.enum) - 1
    return -1 if signed else (1 << f.bits) - 1


def test_every_header_is_generated() -> None:
    classes = {n for n in headers.__all__ if isinstance(getattr(headers, n), type)} - {"Header"}
    assert classes == {lay.cls for lay in LAYOUTS}


def test_struct_formats_are_the_layouts() -> None:
    for lay in LAYOUTS:
        assert getattr(headers, lay.cls).ST.format == "!" + "".join(it.fmt for it in lay.items)
        assert struct.calcsize(getattr(headers, lay.cls).ST.format) == lay.size
