"""The MRC 1.0 header layouts, each described once, and the generator of their classes.

Every header is one `Layout`: the values its precompiled `struct.Struct` packs, in wire order (`Item`), and
the fields inside each value with their bit positions, types, defaults and spec names (`Field`). From these,
``python -m openmrc.wire._layouts`` writes ``_headers_gen.py``: per header a class with typed attributes, a
written-out ``__init__``, ``pull`` (one unpack), ``push`` (one range test, one pack) and ``out_of_range``,
each as direct code, as mypyc needs to compile them natively. `openmrc.wire.headers` tells how they work and
re-exports them. ``tests/test_wire_layouts.py`` checks that the generated module is what this one writes.

Generation happens at build time: this module is not imported when openmrc runs. It imports `openmrc.wire`,
and so the generated module as it stands: should that no longer import, check it out again first.
"""

from __future__ import annotations

import struct
import sys
import textwrap
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import IntEnum
from pathlib import Path
from typing import Literal

from openmrc.wire.constants import SackM

__all__ = ["LAYOUTS", "Field", "Item", "Layout", "generate", "main"]

TARGET = Path(__file__).with_name("_headers_gen.py")
COMMAND = "python -m openmrc.wire._layouts"
WIDTH = 110  # the project's line length (ruff)


@dataclass(frozen=True)
class Field:
    """One field: ``bits`` wide, its least significant bit at ``lo`` inside the value of its `Item`."""

    name: str
    """The attribute: the spec's name in snake_case."""
    spec: str
    """The spec's name, for layout tables and error messages."""
    bits: int
    lo: int = 0
    flag: bool = False
    """A one-bit field typed ``bool`` (the others are ``int``)."""
    default: int | None = 0
    """None: a required constructor argument."""
    enum: type[IntEnum] | None = None
    """Decode to this enum's members (values 0..n-1); the values after them are reserved, rejected both
    ways."""


def uint(name: str, spec: str, bits: int, lo: int = 0, default: int | None = 0) -> Field:
    return Field(name, spec, bits, lo, default=default)


def flag(name: str, spec: str, bit: int) -> Field:
    return Field(name, spec, 1, bit, flag=True, default=False)


@dataclass(frozen=True)
class Item:
    """One value of the header's struct: ``fmt`` is its struct code (``h`` signed, ``15x`` padding), its
    fields the bits it carries (none: reserved, written as zero and ignored on parse)."""

    fmt: str
    fields: tuple[Field, ...] = ()
    name: str = ""
    """The value's local name in the generated code (default: its field's, else b<offset> / w<offset>)."""
    method: str = ""
    """If set, a method of that name returns this value, packed and unchecked."""


def item(fmt: str, *fields: Field, name: str = "", method: str = "") -> Item:
    return Item(fmt, fields, name, method)


@dataclass(frozen=True)
class Layout:
    """One header class: its name, spec name (``NAME``), docstring and values, plus the extra entry points the
    per-packet paths of `openmrc.wire.packet` call."""

    cls: str
    name: str
    doc: str
    items: tuple[Item, ...]
    order: tuple[str, ...] = ()
    """Constructor (and dataclass field) order, when not wire order: new fields go last."""
    from_words: Literal["", "classmethod", "staticmethod"] = ""
    """If set, ``from_words``, a method of that kind building the header from the unpacked values."""
    values: str = ""
    """If set, a method of that name returns every value of the struct, packed and unchecked."""
    checked_values: str = ""
    """If set, a method of that name returns them range-checked."""
    maker: tuple[str, tuple[str, ...], str] = ("", (), "")
    """(name, arguments, why): a function building the header positionally from these arguments, every other
    field at its default."""
    fields: tuple[Field, ...] = field(init=False)
    size: int = field(init=False)

    def __post_init__(self) -> None:
        wire = tuple(f for it in self.items for f in it.fields)
        if self.order:
            by_name = {f.name: f for f in wire}
            assert sorted(self.order) == sorted(by_name), self.cls
            object.__setattr__(self, "fields", tuple(by_name[n] for n in self.order))
        else:
            object.__setattr__(self, "fields", wire)
        object.__setattr__(self, "size", struct.calcsize("!" + "".join(it.fmt for it in self.items)))
        for it in self.items:
            _check_item(self.cls, it)


def _check_item(cls: str, it: Item) -> None:
    width = 8 * struct.calcsize("!" + it.fmt)
    used = 0
    for f in it.fields:
        mask = ((1 << f.bits) - 1) << f.lo
        assert f.lo + f.bits <= width and not used & mask, (cls, f.name)
        used |= mask
    if it.fmt.islower() and it.fmt[-1] != "x":  # a signed value is one whole field
        assert len(it.fields) == 1 and it.fields[0].bits == width, (cls, it)
    assert [f.lo for f in it.fields] == sorted((f.lo for f in it.fields), reverse=True), (cls, it)


# -- the layouts (``[openmrc]`` choices are explained in openmrc.wire.headers) -------------------------------


def _ext_prefix() -> Item:
    """Byte 0 of every extension header: its type and the next header's."""
    return item("B", uint("hdr_type", "Type", 4, 4), uint("next_hdr", "Next", 4), name="b0")


def _ts_format(name: str) -> Item:
    """The 16 bits after a timestamp: its resolution and format."""
    return item("H", uint("tsr", "TSR", 1, 15), uint("format_type", "Format", 4), name=name)


def _cc_bits() -> Item:
    return item("B", uint("cc_type", "CC_Type", 4, 4), uint("cc_flags", "CC_Flags", 4), name="cc")


LAYOUTS: tuple[Layout, ...] = (
    Layout(
        "BTH",
        "BTH",
        "Base Transport Header (RoCE layout; MRC adds RTX and TS in the byte after DestQP).",
        (
            item("B", uint("opcode", "OpCode", 8, default=None), name="op"),
            item(
                "B",
                flag("se", "SE", 7),
                flag("m", "M", 6),
                uint("pad", "Pad", 2, 4),
                uint("tver", "TVer", 4),
                name="b1",
            ),
            item("H", uint("p_key", "P_Key", 16, default=0xFFFF), name="pkey"),
            item("I", flag("fecn", "FECN", 31), flag("becn", "BECN", 30), uint("dest_qp", "DestQP", 24)),
            item(
                "I",
                flag("ack_req", "A", 31),
                flag("rtx", "RTX", 29),
                flag("ts", "TS", 28),
                uint("psn", "PSN", 24),
            ),
        ),
        from_words="classmethod",
        values="unchecked_words",
        checked_values="words",
        maker=("make_bth", ("opcode", "dest_qp", "ack_req", "rtx", "psn"), "the core builds one per packet"),
    ),
    Layout(
        "METH",
        "METH",
        "MRC Extended Transport Header: message sequence numbers, in every request packet.",
        (item("H", uint("rqmsn", "RQMSN", 16)), item("H", uint("msn", "MSN", 16))),
    ),
    Layout(
        "TSETH",
        "TSETH",
        "Timestamp Extended Transport Header (present when BTH.TS is set).",
        (item("H", uint("tx_timestamp", "Timestamp", 16), name="ts"), _ts_format("w")),
    ),
    Layout(
        "RETH",
        "RETH",
        "RDMA Extended Transport Header, in every data packet (VA advanced by one MTU per packet).",
        (
            item("Q", uint("va", "VA", 64)),
            item("I", uint("rkey", "R_Key", 32)),
            item("I", uint("dma_len", "DMA_Length", 32)),
        ),
    ),
    Layout(
        "ImmDt",
        "ImmDt",
        "Immediate data of a Write-with-Immediate (the last packet of the message).",
        (item("I", uint("imm_data", "Immediate", 32)),),
    ),
    Layout(
        "AETH",
        "AETH",
        "ACK Extended Transport Header (Transport ACK / NAK, RoCE syndromes).",
        (item("I", uint("syndrome", "Syndrome", 8, 24), uint("msn", "MSN", 24), name="w"),),
    ),
    Layout(
        "SETH",
        "SETH",
        "Selective-ACK Extended Transport Header: cumulative PSN plus a 64-bit bitmap and the EV echo.",
        (
            _ext_prefix(),
            item("B", Field("m", "M", 2, 6, default=SackM.NONE, enum=SackM), flag("pr", "PR", 5), name="b1"),
            item("h", uint("ack_psn_offset", "ACK_PSN_Offset", 16), name="apo"),
            item("I", uint("entropy", "Entropy", 32), name="ent"),
            item("H", uint("src_qp", "SrcQP", 16), name="sqp"),
            item("H", uint("dst_qp", "DstQP", 16), name="dqp"),
            item("I", uint("svc", "SVC", 8, 24), uint("cack_psn", "CACK_PSN", 24), name="w12"),
            _cc_bits(),
            item("B", uint("mpr", "MPR", 8)),
            item("h", uint("sack_offset", "SACK_Offset", 16), name="so"),
            item("Q", uint("bitmap", "Bitmap", 64), name="bm"),
        ),
        order=(
            *("hdr_type", "next_hdr", "m", "pr", "ack_psn_offset", "entropy", "src_qp", "dst_qp", "cack_psn"),
            *("cc_type", "cc_flags", "mpr", "sack_offset", "bitmap", "svc"),
        ),
        from_words="staticmethod",
        values="words",
    ),
    Layout(
        "CcState",
        "CC_STATE",
        "Congestion-control state that follows SETH in every SACK.",
        (
            item("H", uint("ts_echo", "TS_Echo", 16), name="ts"),
            item("H", uint("ooo_count", "OOO_Count", 15), name="w2"),
            item(
                "I",
                flag("r_c", "R_C", 31),
                uint("rcv_cwnd_pen", "Rcv_Cwnd_Pen", 7, 24),
                uint("rcvd_256b", "Rcvd_Bytes", 24),
                name="w4",
                method="word",
            ),
        ),
    ),
    Layout(
        "NETH",
        "NETH",
        "NACK Extended Transport Header: reason, NACKed PSN and the EV echo.",
        (
            _ext_prefix(),
            item("B"),
            item("B", uint("reason", "Reason", 8)),
            item("B", uint("vendor_info", "Vendor_Info", 8), name="vend"),
            item("I", uint("entropy", "Entropy", 32), name="ent"),
            item("H", uint("src_qp", "SrcQP", 16), name="sqp"),
            item("H", uint("dst_qp", "DstQP", 16), name="dqp"),
            item("I", uint("psn", "PSN", 24), name="w12"),
            _cc_bits(),
            item("B"),
            item("H", uint("ts_echo", "TS_Echo", 16), name="ts"),
        ),
    ),
    Layout(
        "PETH",
        "PETH",
        "Probe Extended Transport Header (reliability probe to the peer QP; consumes no PSN).",
        (
            _ext_prefix(),
            item("B"),
            item("B"),
            item("B", uint("vendor_info", "Vendor_Info", 8), name="vend"),
            item("H", uint("probe_id", "Probe_ID", 16), name="pid"),
            item("H"),
            item("H", uint("src_qp", "SrcQP", 16), name="sqp"),
            item("H", uint("dst_qp", "DstQP", 16), name="dqp"),
            item("H", uint("tx_timestamp", "Timestamp", 16), name="ts"),
            _ts_format("w14"),
        ),
    ),
    Layout(
        "ERTH",
        "ERTH",
        "Endpoint Request Transport Header (EV probe or port status update, to reserved QP 0x2).",
        (
            _ext_prefix(),
            item("B", uint("op", "Op", 2), name="b1"),
            item("B"),
            item("B", uint("vendor_info", "Vendor_Info", 8), name="vend"),
            item("I", uint("port_status", "Port_Status", 32), name="ps"),
            item("I"),
            item("H", uint("tx_timestamp", "Timestamp", 16), name="ts"),
            _ts_format("w14"),
        ),
    ),
    Layout(
        "EETH",
        "EETH",
        "Endpoint Response Transport Header; the response body in bytes 4-27 is openmrc's.",
        (
            _ext_prefix(),
            item("B", uint("op", "Op", 2, 4), name="b1"),
            item("B"),
            item("B", uint("vendor_info", "Vendor_Info", 8), name="vend"),
            item("I", uint("service_time", "Service_Time", 32), name="svc"),
            item("I", uint("port_status", "Port_Status", 32), name="ps"),
            item("B", uint("rx_port", "Rx_Port", 8), name="rxp"),
            item("15x"),
            item("H", uint("ts_echo", "TS_Echo", 16), name="ts"),
            _ts_format("w30"),
            item("4x"),
        ),
    ),
)


# -- the generator -----------------------------------------------------------------------------------------


def _hex(v: int) -> str:
    return str(v) if v < 10 else f"0x{v:X}"


def _literal(f: Field) -> str:
    d = f.default
    assert d is not None
    if f.enum is not None:
        return f"{f.enum.__name__}.{f.enum(d).name}"
    if f.flag:
        return repr(bool(d))
    return _hex(d) if d > 0xFF else str(d)


def _bracketed(head: str, parts: list[str], tail: str, indent: int, literal: bool = False) -> list[str]:
    """``head`` + ``parts`` + ``tail`` as ruff formats it (``head`` ends with the opening bracket, ``tail``
    starts with the closing one): on one line if it fits, else (arguments, not a ``literal`` tuple or list)
    the parts on one line of their own, else one part a line with a trailing comma."""
    pad, inner = " " * indent, " " * (indent + 4)
    one = f"{pad}{head}{', '.join(parts)}{tail}"
    if len(one) <= WIDTH:
        return [one]
    if not literal and len(inner) + len(", ".join(parts)) <= WIDTH:
        return [f"{pad}{head}", inner + ", ".join(parts), pad + tail]
    return [f"{pad}{head}", *(f"{inner}{p}," for p in parts), pad + tail]


def _ors(head: str, terms: list[str], indent: int) -> list[str]:
    """``head`` followed by ``terms`` joined by ``|``, as ruff formats it."""
    pad, inner = " " * indent, " " * (indent + 4)
    one = " | ".join(terms)
    if len(pad + head + one) <= WIDTH:
        return [pad + head + one]
    if len(inner + one) <= WIDTH:
        return [f"{pad}{head}(", inner + one, f"{pad})"]
    return [f"{pad}{head}(", inner + terms[0], *(f"{inner}| {t}" for t in terms[1:]), f"{pad})"]


def _doc(text: str, indent: int) -> list[str]:
    pad = " " * indent
    if len(pad) + len(text) + 6 <= WIDTH:
        return [f'{pad}"""{text}"""']
    lines = textwrap.wrap(text, WIDTH - indent, initial_indent='"""', break_on_hyphens=False)
    if len(lines[-1]) + 3 > WIDTH - indent:  # no room for the closing quotes
        lines = textwrap.wrap(text, WIDTH - indent - 3, initial_indent='"""', break_on_hyphens=False)
    lines[-1] += '"""'
    return [pad + ln for ln in lines]


class _Gen:
    """The text of one header's generated code."""

    def __init__(self, lay: Layout) -> None:
        self.lay = lay
        self.st = f"_{lay.cls.upper()}_ST"
        self.offsets: list[int] = []
        off = 0
        for it in lay.items:
            self.offsets.append(off)
            off += struct.calcsize("!" + it.fmt)
        self.names = [self._local(i, it) for i, it in enumerate(lay.items)]
        self.values = [(i, it) for i, it in enumerate(lay.items) if not it.fmt.endswith("x")]

    def _local(self, i: int, it: Item) -> str:
        off = self.offsets[i]
        if it.name:
            return it.name
        if not it.fields:
            return f"_r{off}"
        if len(it.fields) == 1 and it.fields[0].bits == 8 * struct.calcsize("!" + it.fmt):
            return it.fields[0].name
        return f"b{off}" if it.fmt == "B" else f"w{off}"

    def width(self, i: int) -> int:
        return 8 * struct.calcsize("!" + self.lay.items[i].fmt)

    def byte_of(self, i: int, f: Field) -> int:
        """The byte offset (in the header) of the byte holding ``f``'s most significant bit."""
        return self.offsets[i] + (self.width(i) - f.lo - f.bits) // 8

    def wire_fields(self) -> Iterable[tuple[int, Field]]:
        for i, it in enumerate(self.lay.items):
            for f in it.fields:
                yield i, f

    def enum_fields(self) -> list[tuple[int, Field]]:
        return [(i, f) for i, f in self.wire_fields() if f.enum is not None]

    def reserved_values(self) -> list[tuple[int, Field]]:
        """The enum fields that have values after their enum's (reserved)."""
        return [(i, f) for i, f in self.enum_fields() if f.enum is not None and len(f.enum) < 1 << f.bits]

    # -- expressions ---------------------------------------------------------------------------------------
    def decode(self, i: int, f: Field) -> str:
        """``f``'s value from the unpacked value of item ``i`` (its local name)."""
        v, mask = self.names[i], (1 << f.bits) - 1
        if f.flag:
            return f"bool({v} & {_hex(1 << f.lo)})"
        if f.enum is not None:
            return f"_{self.lay.cls.upper()}_{f.name.upper()}[{f.name}]"
        if f.bits == self.width(i):
            return v
        if f.lo + f.bits == self.width(i):
            return f"{v} >> {f.lo}"
        if f.lo == 0:
            return f"{v} & {_hex(mask)}"
        return f"({v} >> {f.lo}) & {_hex(mask)}"

    def raw(self, i: int, f: Field) -> str:
        """An enum field's value before its table (`decode` of the same field, unmapped)."""
        plain = Field(f.name, f.spec, f.bits, f.lo)
        return self.decode(i, plain)

    def encode(self, i: int) -> str:
        terms = [f"(self.{f.name} << {f.lo})" if f.lo else f"self.{f.name}" for f in self.lay.items[i].fields]
        if not terms:
            return "0"
        if len(terms) == 1:
            return terms[0].removeprefix("(").removesuffix(")")
        return " | ".join(terms)

    def out_of_range_terms(self) -> list[str]:
        terms = []
        for i, f in self.wire_fields():
            if self.lay.items[i].fmt.islower():
                terms.append(f"(self.{f.name} + {_hex(1 << (f.bits - 1))}) >> {f.bits}")
            else:
                terms.append(f"self.{f.name} >> {f.bits}")
        return terms

    def construct(self) -> list[str]:
        """The end of ``pull`` and ``from_words``: the header from its unpacked values (``at``: offset)."""
        out = [f"        {f.name} = {self.raw(i, f)}" for i, f in self.enum_fields()]
        out += self.check_reserved("at", "{}", 8)
        by_name = {f.name: self.decode(i, f) for i, f in self.wire_fields()}
        return out + _bracketed(f"return {self.lay.cls}(", [by_name[f.name] for f in self.lay.fields], ")", 8)

    def check_reserved(self, at: str, value: str, indent: int) -> list[str]:
        """Raise on a reserved value of an enum field (``value``: how to read it, given its name)."""
        pad, out = " " * indent, []
        for i, f in self.reserved_values():
            assert f.enum is not None
            v = value.format(f.name)
            n = len(f.enum)
            out += [
                f"{pad}if {v} >= {n}:",
                f'{pad}    raise WireError("{self.lay.name}", "{f.name}", {at} + {self.byte_of(i, f)}, '
                f'f"reserved {f.spec} value {{{v}}}")',
            ]
        return out

    def enum_table(self, f: Field) -> str:
        """The members an enum field decodes to, by value."""
        assert f.enum is not None
        members = [f"{f.enum.__name__}.{f.enum(v).name}" for v in range(len(f.enum))]
        one = "," if len(members) == 1 else ""
        return f"_{self.lay.cls.upper()}_{f.name.upper()}: Final = ({', '.join(members)}{one})"

    # -- the class -------------------------------------------------------------------------------------------
    def layout_doc(self) -> str:
        parts = []
        for i, it in enumerate(self.lay.items):
            if not it.fields:
                continue
            start, end = self.offsets[i], self.offsets[i] + self.width(i) // 8 - 1
            where = str(start) if start == end else f"{start}-{end}"
            bits = []
            for f in it.fields:
                if f.bits == self.width(i):
                    bits.append(f.spec)
                elif f.bits == 1:
                    bits.append(f"{f.spec}({f.lo})")
                else:
                    bits.append(f"{f.spec}({f.lo + f.bits - 1}:{f.lo})")
            parts.append(f"{where} {' '.join(bits)}")
        return f"{self.lay.name}, {self.lay.size} bytes: {'; '.join(parts)}."

    def text(self) -> list[str]:
        lay, cls = self.lay, self.lay.cls
        spec = [
            f'("{f.name}", {self.byte_of(i, f)}, {f.bits}, {self.lay.items[i].fmt.islower()})'
            for i, f in self.wire_fields()
        ]
        spec_lines = (
            [f"    SPEC: ClassVar[Spec] = ({spec[0]},)"]
            if len(spec) == 1
            else _bracketed("SPEC: ClassVar[Spec] = (", spec, ")", 4, literal=True)
        )
        fmt = "!" + "".join(it.fmt for it in lay.items)
        out = [
            f'{self.st}: Final = struct.Struct("{fmt}")',
            *(self.enum_table(f) for _, f in self.enum_fields()),
            "",
            "",
            f"class _{cls}Layout(Header):",
            *_doc(self.layout_doc(), 4),
            "",
            f'    NAME: ClassVar[str] = "{lay.name}"',
            f"    SIZE: ClassVar[int] = {lay.size}",
            f"    ST: ClassVar[struct.Struct] = {self.st}",
            *spec_lines,
            "",
            "",
            "@dataclass(slots=True)",
            f"class {cls}(_{cls}Layout):",
            *_doc(lay.doc, 4),
            "",
        ]
        params = []
        for f in lay.fields:
            typ = "bool" if f.flag else "int"
            decl = f"{f.name}: {typ}" if f.default is None else f"{f.name}: {typ} = {_literal(f)}"
            out.append(f"    {decl}")
            params.append(decl)
        out += ["", *_bracketed("def __init__(", ["self", *params], ") -> None:", 4)]
        out += [f"        self.{f.name} = {f.name}" for f in lay.fields]
        out += self.pull()
        if lay.from_words:
            out += self.from_words()
        out += [
            "",
            "    def out_of_range(self) -> int:",
            *_doc("Non-zero when a field does not fit its width (`range_test`, written out).", 8),
            *_ors("return ", self.out_of_range_terms(), 8),
        ]
        out += self.value_methods()
        out += self.push()
        if lay.maker[0]:
            out += self.maker()
        return out

    def pull(self) -> list[str]:
        lay = self.lay
        names = ", ".join(self.names[i] for i, _ in self.values)
        first = next(iter(self.wire_fields()))[1].name  # what a truncated header is reported as
        out = [
            "",
            "    @classmethod",
            f"    def pull(cls, buf: Buffer) -> {lay.cls}:",
            *_doc(f"A {lay.name} parsed from ``buf`` (one unpack).", 8),
        ]
        checks = self.reserved_values()
        if checks:
            out.append("        at = buf.pos")
        unpack = f'buf.pull_struct({self.st}, "{lay.name}", "{first}")'
        if len(self.values) == 1:
            out.append(f"        {names} = {unpack}[0]")
        else:
            out += _bracketed(f"{names} = buf.pull_struct(", [self.st, f'"{lay.name}"', f'"{first}"'], ")", 8)
        return out + self.construct()

    def from_words(self) -> list[str]:
        lay = self.lay
        params = [f"{self.names[i]}: int" for i, _ in self.values]
        at = self.reserved_values()
        if at:
            params.append("at: int")
        first = ["cls"] if lay.from_words == "classmethod" else []
        doc = "Build from the values `ST` unpacks to"
        doc += " (``at``: the header's offset, for the error of a reserved value)." if at else "."
        out = ["", f"    @{lay.from_words}"]
        out += _bracketed("def from_words(", [*first, *params], f") -> {lay.cls}:", 4)
        out += _doc(doc, 8)
        return out + self.construct()

    def value_methods(self) -> list[str]:
        lay, out = self.lay, []
        n = len(self.values)
        typ = f"tuple[{', '.join(['int'] * n)}]"
        if lay.values:
            out += ["", f"    def {lay.values}(self) -> {typ}:"]
            out += _doc("The values of `ST`, unchecked (the caller has range-tested).", 8)
            out += _bracketed("return (", [self.encode(i) for i, _ in self.values], ")", 8, literal=True)
        if lay.checked_values:
            assert lay.values
            out += ["", f"    def {lay.checked_values}(self, base: int = 0) -> {typ}:"]
            doc = f"The values of `ST`, range-checked (``base``: {lay.name}'s offset, for error messages)."
            out += _doc(doc, 8)
            out += ["        self.validate(base)", f"        return self.{lay.values}()"]
        for i, it in self.values:
            if it.method:
                specs = ", ".join(f.spec for f in it.fields)
                out += ["", f"    def {it.method}(self) -> int:"]
                out += _doc(f"The value of `ST` at byte {self.offsets[i]} ({specs}), unchecked.", 8)
                out.append(f"        return {self.encode(i)}")
        return out

    def push(self) -> list[str]:
        out = [
            "",
            "    def push(self, buf: Buffer) -> None:",
            *_doc(f"Append this {self.lay.name}, range-checked, its reserved bits zero.", 8),
            "        self.validate(len(buf))",
        ]
        out += self.check_reserved("len(buf)", "self.{}", 8)
        out += _bracketed("buf.push_struct(", [self.st, *(self.encode(i) for i, _ in self.values)], ")", 8)
        return out

    def maker(self) -> list[str]:
        name, args, why = self.lay.maker
        fields = {f.name: f for f in self.lay.fields}
        params = [f"{a}: {'bool' if fields[a].flag else 'int'}" for a in args]
        call = [a if a in args else _literal(f) for a, f in fields.items()]
        keywords = ", ".join([args[0], *(f"{a}={a}" for a in args[1:])])
        doc = f"``{self.lay.cls}({keywords})``, every other field at its default, without keyword handling"
        doc += f" ({why})."
        return [
            "",
            "",
            *_bracketed(f"def {name}(", params, f") -> {self.lay.cls}:", 0),
            *_doc(doc, 4),
            *_bracketed(f"return {self.lay.cls}(", call, ")", 4),
        ]


def generate() -> str:
    """The text of ``_headers_gen.py``."""
    names = sorted(
        [lay.cls for lay in LAYOUTS] + [lay.maker[0] for lay in LAYOUTS if lay.maker[0]],
        key=lambda n: (0 if n.isupper() else 1 if n[0].isupper() else 2, n),  # as ruff sorts __all__
    )
    enums = sorted({f.enum.__name__ for lay in LAYOUTS for f in lay.fields if f.enum is not None})
    out = [
        f"# Generated, do not edit: regenerate with `{COMMAND}` from the layouts in _layouts.py.",
        '"""The MRC 1.0 header classes, generated from their layouts (`openmrc.wire._layouts`); see',
        '`openmrc.wire.headers`, which re-exports them."""',
        "",
        "from __future__ import annotations",
        "",
        "import struct",
        "from dataclasses import dataclass",
        "from typing import ClassVar, Final",
        "",
        "from openmrc.wire._header import Header, Spec",
        "from openmrc.wire.buffer import Buffer, WireError",
        f"from openmrc.wire.constants import {', '.join(enums)}",
        "",
        *_bracketed("__all__ = [", [f'"{n}"' for n in names], "]", 0, literal=True),
    ]
    for lay in LAYOUTS:
        out += ["", "", *_Gen(lay).text()]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Write ``_headers_gen.py`` (``--check``: only say whether it is up to date)."""
    args = sys.argv[1:] if argv is None else argv
    text = generate()
    if "--check" in args:
        fresh = TARGET.exists() and TARGET.read_text() == text
        print(f"{TARGET.name} is {'up to date' if fresh else f'stale: run {COMMAND}'}")
        return 0 if fresh else 1
    if not TARGET.exists() or TARGET.read_text() != text:
        TARGET.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
