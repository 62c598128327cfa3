"""Classic libpcap files (Ethernet or raw-IP link type) so captures open in Wireshark and tshark."""

from __future__ import annotations

import struct
from collections.abc import Iterable
from pathlib import Path
from typing import BinaryIO

__all__ = ["LINKTYPE_ETHERNET", "LINKTYPE_RAW", "PcapWriter", "read_pcap", "write_pcap"]

LINKTYPE_ETHERNET = 1
LINKTYPE_RAW = 101
_MAGIC_NS = 0xA1B23C4D  # nanosecond-resolution timestamps
_GLOBAL = struct.Struct("<IHHiIII")
_RECORD = struct.Struct("<IIII")


class PcapWriter:
    """Writes a pcap global header, then one record per `write` (timestamps in integer nanoseconds)."""

    def __init__(self, stream: BinaryIO, *, linktype: int = LINKTYPE_ETHERNET, snaplen: int = 262144) -> None:
        self._stream = stream
        self._snaplen = snaplen
        stream.write(_GLOBAL.pack(_MAGIC_NS, 2, 4, 0, 0, snaplen, linktype))

    def write(self, frame: bytes, ts_ns: int = 0) -> None:
        sec, nsec = divmod(ts_ns, 1_000_000_000)
        cap = frame[: self._snaplen]
        self._stream.write(_RECORD.pack(sec, nsec, len(cap), len(frame)))
        self._stream.write(cap)


def write_pcap(
    path: str | Path, frames: Iterable[tuple[int, bytes]], *, linktype: int = LINKTYPE_ETHERNET
) -> int:
    """Write ``(ts_ns, frame)`` pairs to ``path``; returns the number of records."""
    n = 0
    with open(path, "wb") as f:
        w = PcapWriter(f, linktype=linktype)
        for ts, frame in frames:
            w.write(frame, ts)
            n += 1
    return n


def read_pcap(path: str | Path) -> tuple[int, list[tuple[int, bytes]]]:
    """Read a classic pcap written by any tool: ``(linktype, [(ts_ns, frame), ...])``."""
    data = Path(path).read_bytes()
    if len(data) < _GLOBAL.size:
        raise ValueError(f"{path}: too short for a pcap header")
    magic = int.from_bytes(data[:4], "little")
    if magic in (0xA1B2C3D4, _MAGIC_NS):
        endian = "<"
    elif magic in (0xD4C3B2A1, 0x4D3CB2A1):
        endian = ">"
        magic = int.from_bytes(data[:4], "big")
    else:
        raise ValueError(f"{path}: not a classic pcap file (magic 0x{magic:08x})")
    scale = 1 if magic == _MAGIC_NS else 1000
    linktype = struct.unpack_from(endian + "I", data, 20)[0]
    rec = struct.Struct(endian + "IIII")
    off, out = _GLOBAL.size, []
    while off + rec.size <= len(data):
        sec, frac, incl, _orig = rec.unpack_from(data, off)
        off += rec.size
        out.append((sec * 1_000_000_000 + frac * scale, data[off : off + incl]))
        off += incl
    return linktype, out
