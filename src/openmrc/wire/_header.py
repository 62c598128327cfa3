"""The base of every MRC header class (`openmrc.wire.headers`): its size, name and field layout, and the range
check every encoder runs before it packs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar, Final

from openmrc.wire.buffer import Buffer, WireError

__all__ = ["Header", "Spec", "range_test"]

Spec = tuple[tuple[str, int, int, bool], ...]
"""(field name, byte offset of the field inside the header, width in bits, signed), in wire order."""

_RANGE_TESTS: Final[dict[type, Callable[[Any], int]]] = {}


def range_test(cls: type[Header]) -> Callable[[Any], int]:
    """The range test of every field of ``cls`` as one shift-or expression, compiled on first use
    (dataclasses-style): ``v >> bits`` is non-zero exactly when an unsigned field is negative or too wide."""
    test = _RANGE_TESTS.get(cls)
    if test is None:
        terms = [
            f"((h.{n} + {1 << (b - 1)}) >> {b})" if signed else f"(h.{n} >> {b})"
            for n, _o, b, signed in cls.SPEC
        ]
        ns: dict[str, Any] = {}
        exec(f"def out_of_range(h):\n    return {' | '.join(terms)}", ns)
        test = _RANGE_TESTS[cls] = ns["out_of_range"]
    return test


class Header:
    """Base of every header class: size, name, and the range check shared by all encoders."""

    __slots__ = ()
    NAME: ClassVar[str]
    SIZE: ClassVar[int]
    SPEC: ClassVar[Spec]

    def validate(self, base: int = 0) -> None:
        """Fast range test of every field; on failure `check` names the field. ``base``: header offset."""
        try:
            bad = self.out_of_range()
        except TypeError:
            bad = True
        if bad:
            self.check(base)

    def out_of_range(self) -> int:
        """Non-zero when a field does not fit its width (`range_test`; the generated headers write theirs
        out, so that the compiled build runs them natively)."""
        return range_test(type(self))(self)

    def check(self, base: int = 0) -> None:
        """Raise `WireError` if any field does not fit its width. ``base`` is the header's offset."""
        for name, off, bits, signed in self.SPEC:
            v = getattr(self, name)
            if not isinstance(v, int):
                ok = False
            elif signed:
                ok = -(1 << (bits - 1)) <= v < (1 << (bits - 1))
            else:
                ok = 0 <= v < (1 << bits)
            if not ok:
                kind = "signed" if signed else "unsigned"
                raise WireError(
                    self.NAME, name, base + off, f"value {v!r} does not fit {bits}-bit {kind} field"
                )

    def push(self, buf: Buffer) -> None:  # pragma: no cover - every subclass overrides
        raise NotImplementedError

    def encode(self) -> bytes:
        """The header alone, as bytes."""
        buf = Buffer()
        self.push(buf)
        return buf.data()
