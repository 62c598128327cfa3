"""What ``openmrc decode`` reads (hex text, stdin, pcap files) and the lines it prints about a frame."""

from __future__ import annotations

import re
import sys
from pathlib import Path

from rich.console import Console

from openmrc.cli.render import packet_table
from openmrc.wire import WireError, parse_frame
from openmrc.wire.framing import Frame
from openmrc.wire.pcap import LINKTYPE_ETHERNET, LINKTYPE_RAW, read_pcap

__all__ = ["decode_pcap", "endpoint", "frame_lines", "hex_bytes", "read_hex"]

_SEPARATORS = re.compile(r"[\s:,.-]+")


def read_hex(data: str) -> str:
    """The hex text of the argument, or of standard input when it is ``-``."""
    return sys.stdin.read() if data == "-" else data


def hex_bytes(text: str) -> bytes:
    """Bytes from hex text: whitespace, ':', ',', '.' or '-' between bytes, and a ``0x`` before any group,
    are allowed (as `xxd -p`, Wireshark's "Copy as Hex" and C arrays print them). Raises ValueError."""
    groups = [g[2:] if g[:2].lower() == "0x" else g for g in _SEPARATORS.split(text.strip())]
    joined = "".join(groups)
    if not joined:
        raise ValueError("no hex digits given")
    if len(joined) % 2:
        raise ValueError(f"{len(joined)} hex digits: an odd number cannot be whole bytes")
    return bytes.fromhex(joined)


def endpoint(addr: str, port: int) -> str:
    """``addr:port``, with an IPv6 address in brackets (RFC 3986) so the port stays readable."""
    return f"[{addr}]:{port}" if ":" in addr else f"{addr}:{port}"


def frame_lines(fr: Frame) -> list[str]:
    """The addressing of a decoded frame: endpoints, ECN, flow label, and any SRv6 encapsulation."""
    lines = [
        f"{endpoint(fr.src, fr.sport)} → {endpoint(fr.dst, fr.dport)}  "
        f"ECN={fr.ecn} flow_label=0x{fr.flow_label:05x}" + ("" if fr.icrc_ok else "  ICRC BAD")
    ]
    if fr.srv6 is not None:
        segs = fr.srv6.segments
        srh = f"  SRH {', '.join(segs)} (segments left {fr.segments_left})" if segs else ""
        lines.append(f"SRv6 outer {fr.srv6.src} → {fr.srv6.dst}{srh}")
    return lines


def decode_pcap(console: Console, path: Path, udp_port: int) -> tuple[int, int]:
    """Print every MRC packet of a capture; returns (MRC packets, other frames). Raises ValueError when
    the file is not a classic pcap of Ethernet or raw-IP frames."""
    linktype, records = read_pcap(path)
    if linktype not in (LINKTYPE_ETHERNET, LINKTYPE_RAW):
        raise ValueError(f"{path}: link type {linktype} is neither Ethernet (1) nor raw IP (101)")
    mrc = other = 0
    t0 = records[0][0] if records else 0
    for i, (ts, frame) in enumerate(records, 1):
        head = f"#{i}  {(ts - t0) / 1000:.3f} µs"
        ether = linktype == LINKTYPE_ETHERNET
        try:
            fr = parse_frame(frame, ether=ether, check_icrc=False, udp_port=udp_port)
        except WireError as exc:
            try:  # a data packet whose payload a switch cut off
                fr = parse_frame(frame, ether=ether, check_icrc=False, udp_port=udp_port, trimmed=True)
                head += "  trimmed"
            except WireError:
                other += 1
                console.print(f"{head}  not MRC: {exc}", markup=False, emoji=False, highlight=False)
                continue
        mrc += 1
        for line in frame_lines(fr):
            console.print(f"{head}  {line}", markup=False, emoji=False, highlight=False)
            head = " " * len(head)
        console.print(packet_table(fr.packet))
    return mrc, other
