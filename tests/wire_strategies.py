"""Hypothesis strategies for MRC headers and packets (shared by the wire tests)."""

from __future__ import annotations

import dataclasses
from typing import Any

from hypothesis import strategies as st

from openmrc.wire import (
    AETH,
    BTH,
    DATA_OPCODES,
    EETH,
    ERTH,
    IMM_OPCODES,
    METH,
    NETH,
    PETH,
    RETH,
    SETH,
    TSETH,
    CcState,
    ImmDt,
    Opcode,
    Packet,
)
from openmrc.wire.headers import Header

HEADER_CLASSES: list[type[Header]] = [
    BTH,
    METH,
    TSETH,
    RETH,
    ImmDt,
    AETH,
    SETH,
    CcState,
    NETH,
    PETH,
    ERTH,
    EETH,
]


def header(cls: type[Header], **fixed: Any) -> st.SearchStrategy[Any]:
    """Any valid instance of ``cls``: every field over its whole range (``fixed`` pins some)."""
    spec = {name: (bits, signed) for name, _off, bits, signed in cls.SPEC}
    kwargs: dict[str, st.SearchStrategy[Any]] = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if f.name in fixed:
            kwargs[f.name] = st.just(fixed[f.name])
        elif f.name in spec:
            bits, signed = spec[f.name]
            lo, hi = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (0, (1 << bits) - 1)
            if cls is SETH and f.name == "m":
                hi = 2  # M=3 is reserved
            flag = bits == 1 and f.type in (bool, "bool")
            kwargs[f.name] = st.booleans() if flag else st.integers(lo, hi)
        else:
            kwargs[f.name] = st.booleans()
    return st.builds(cls, **kwargs)


_CONTROL = {
    Opcode.ACK: ("aeth",),
    Opcode.SACK: ("seth", "cc_state"),
    Opcode.NACK: ("neth",),
    Opcode.PROBE: ("peth",),
    Opcode.EP_REQUEST: ("erth",),
    Opcode.EP_RESPONSE: ("eeth",),
}
_CLS = {
    "aeth": AETH,
    "seth": SETH,
    "cc_state": CcState,
    "neth": NETH,
    "peth": PETH,
    "erth": ERTH,
    "eeth": EETH,
}


@st.composite
def packets(draw: st.DrawFn, opcodes: tuple[Opcode, ...] = tuple(Opcode)) -> Packet:
    """Any valid packet: a consistent header chain and a payload consistent with RETH.DMA_length."""
    op = draw(st.sampled_from(opcodes))
    icrc = draw(st.integers(0, 0xFFFFFFFF))
    if op in DATA_OPCODES:
        ts = draw(st.booleans())
        bth = draw(header(BTH, opcode=int(op), ts=ts, pad=0))
        if op in (Opcode.WRITE_ONLY, Opcode.WRITE_ONLY_WITH_IMM):
            n = draw(st.integers(0, 300))
            dma = n
        elif op in (Opcode.WRITE_FIRST, Opcode.WRITE_MIDDLE):
            n = 4 * draw(st.integers(1, 64))
            dma = draw(st.integers(n + 1, 0xFFFFFFFF))
        else:
            n = draw(st.integers(1, 300))
            dma = draw(st.integers(n + 1, 0xFFFFFFFF))
        reth = draw(header(RETH, dma_len=dma))
        return Packet(
            bth,
            meth=draw(header(METH)),
            tseth=draw(header(TSETH)) if ts else None,
            reth=reth,
            imm=draw(header(ImmDt)) if op in IMM_OPCODES else None,
            payload=draw(st.binary(min_size=n, max_size=n)),
            icrc=icrc,
        )
    bth = draw(header(BTH, opcode=int(op), ts=False, pad=0))
    hdrs = {a: draw(header(_CLS[a])) for a in _CONTROL[op]}
    return Packet(bth, icrc=icrc, **hdrs)
