"""Rich renderings of MRC packets for the CLI."""

from __future__ import annotations

import dataclasses
import os

from rich.console import Console
from rich.table import Table

from openmrc.wire import Opcode, Packet
from openmrc.wire.packet import HEADER_ATTRS

__all__ = ["make_console", "opcode_name", "packet_table", "print_table"]


def make_console(*, stderr: bool = False) -> Console:
    """The CLI's console (``stderr``: the one for diagnostics; results go to stdout). Writing to a log or
    pipe, tables are laid out for 80 columns (or $COLUMNS) and lines of text are not broken (a path or a
    message stays whole for grep)."""
    console = Console(stderr=stderr)
    if console.is_terminal:
        return console
    return Console(width=int(os.environ.get("COLUMNS", 80)), soft_wrap=True, stderr=stderr)


def print_table(console: Console, table: Table) -> None:
    """Print ``table`` whole wherever it goes. When its cells cannot wrap at spaces into the console's width
    (a word or a number wider than its share), a log or a pipe gets the table at its natural width (lines
    longer than the console's, every column and heading intact, for grep and diff), and a terminal gets every
    cell folded onto more lines, rather than cut off with an ellipsis or a column dropped."""
    widths = console.measure(table, options=console.options.update(max_width=1 << 16))
    if widths.minimum <= console.width:
        console.print(table)
    elif not console.is_terminal:
        width = console.width
        console.width = widths.maximum
        try:
            console.print(table)
        finally:
            console.width = width
    else:
        for column in table.columns:
            column.overflow = "fold"
            column.no_wrap = False
        console.print(table)


def opcode_name(op: int) -> str:
    try:
        return Opcode(op).name
    except ValueError:
        return f"0x{op:02x}"


#: Queue pair numbers, always in hex (digits for their width): BTH carries 24 bits, SETH/NETH/PETH the low 16.
_QPN_DIGITS = {"dest_qp": 6, "src_qp": 4, "dst_qp": 4}


def _fmt(name: str, value: object) -> str:
    if isinstance(value, bool):
        return str(int(value))
    if isinstance(value, int) and name in _QPN_DIGITS:
        return f"0x{value:0{_QPN_DIGITS[name]}x}"
    if isinstance(value, int) and name in (
        "entropy",
        "bitmap",
        "va",
        "rkey",
        "imm_data",
        "port_status",
        "p_key",
    ):
        return f"0x{value:x}"
    if isinstance(value, int) and not isinstance(value, bool) and type(value) is not int:
        return f"{getattr(value, 'name', value)} ({int(value)})"
    return str(value)


def packet_table(pkt: Packet) -> Table:
    """One row per header with all its fields."""
    t = Table("header", "fields", title=f"{opcode_name(pkt.bth.opcode)} ({pkt.header_size()} B of headers)")
    for attr in ("bth", *HEADER_ATTRS):
        hdr = getattr(pkt, attr)
        if hdr is None:
            continue
        vals = []
        for f in dataclasses.fields(hdr):
            v = getattr(hdr, f.name)
            vals.append(f"{f.name}={opcode_name(v) if f.name == 'opcode' else _fmt(f.name, v)}")
        t.add_row(type(hdr).NAME, " ".join(vals))
    if pkt.is_data:
        t.add_row("payload", f"{len(pkt.payload)} B")
    t.add_row("ICRC", f"0x{pkt.icrc:08x}")
    return t
