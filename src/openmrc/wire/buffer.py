"""A narrow, bounds-checked byte buffer for the MRC codecs.

Reads (`pull_*`) walk forward over a read-only view; writes (`push_*`) append to a growing `bytearray`.
Every integer is network byte order (big-endian) through a precompiled `struct.Struct`, except the
RoCE ICRC, which the codecs write little-endian themselves. A read past the end raises `WireError`
naming what was being read and where, so callers never see `struct.error` or `IndexError`.
The surface is deliberately small so that a faster implementation can replace it without touching callers.
"""

from __future__ import annotations

import struct
from typing import Final

__all__ = ["Buffer", "WireError"]


class WireError(ValueError):
    """Malformed or unencodable MRC bytes. Names the header, the field and the byte offset."""

    def __init__(self, header: str, field: str, offset: int, reason: str) -> None:
        self.header = header
        self.field = field
        self.offset = offset
        self.reason = reason
        super().__init__(f"{header}.{field} at byte {offset}: {reason}")


_U8: Final = struct.Struct("!B")
_U16: Final = struct.Struct("!H")
_U32: Final = struct.Struct("!I")
_U64: Final = struct.Struct("!Q")


class Buffer:
    """Cursor over bytes to parse (``data=``) or an empty growing buffer to encode into."""

    __slots__ = ("_data", "_end", "_out", "pos")

    def __init__(self, data: bytes | bytearray | memoryview | None = None) -> None:
        if data is None:
            self._out = bytearray()
            self._data = memoryview(b"")
        else:
            self._out = bytearray()
            self._data = memoryview(data).cast("B") if not isinstance(data, bytes) else memoryview(data)
        self._end = len(self._data)
        self.pos = 0

    # -- reading -------------------------------------------------------------------------------------
    @property
    def remaining(self) -> int:
        return self._end - self.pos

    def _need(self, n: int, header: str, field: str) -> int:
        pos = self.pos
        if pos + n > self._end:
            raise WireError(header, field, pos, f"truncated: need {n} byte(s), {self._end - pos} left")
        self.pos = pos + n
        return pos

    def pull_u8(self, header: str = "buffer", field: str = "u8") -> int:
        pos = self._need(1, header, field)
        return self._data[pos]

    def pull_u16(self, header: str = "buffer", field: str = "u16") -> int:
        pos = self._need(2, header, field)
        return int(_U16.unpack_from(self._data, pos)[0])

    def pull_u24(self, header: str = "buffer", field: str = "u24") -> int:
        pos = self._need(3, header, field)
        d = self._data
        return (d[pos] << 16) | (d[pos + 1] << 8) | d[pos + 2]

    def pull_u32(self, header: str = "buffer", field: str = "u32") -> int:
        pos = self._need(4, header, field)
        return int(_U32.unpack_from(self._data, pos)[0])

    def pull_u64(self, header: str = "buffer", field: str = "u64") -> int:
        pos = self._need(8, header, field)
        return int(_U64.unpack_from(self._data, pos)[0])

    def pull_bytes(self, n: int, header: str = "buffer", field: str = "bytes") -> memoryview:
        """A zero-copy view of the next ``n`` bytes."""
        pos = self._need(n, header, field)
        return self._data[pos : pos + n]

    def pull_struct(self, st: struct.Struct, header: str, field: str) -> tuple[int, ...]:
        """Unpack a whole precompiled header layout in one call (the codecs' fast path)."""
        pos = self._need(st.size, header, field)
        return st.unpack_from(self._data, pos)

    # -- writing -------------------------------------------------------------------------------------
    def push_u8(self, v: int) -> None:
        self._out += _U8.pack(v)

    def push_u16(self, v: int) -> None:
        self._out += _U16.pack(v)

    def push_u24(self, v: int) -> None:
        self._out += v.to_bytes(3, "big")

    def push_u32(self, v: int) -> None:
        self._out += _U32.pack(v)

    def push_u64(self, v: int) -> None:
        self._out += _U64.pack(v)

    def push_bytes(self, data: bytes | bytearray | memoryview) -> None:
        self._out += data

    def push_struct(self, st: struct.Struct, *values: int) -> None:
        self._out += st.pack(*values)

    def data(self) -> bytes:
        """Everything pushed so far."""
        return bytes(self._out)

    def __len__(self) -> int:
        return len(self._out)
