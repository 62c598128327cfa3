"""What ``openmrc decode`` reads (hex text, stdin, pcap files) and the lines it prints about a frame."""

from __future__ import annotations

import re
import sys
from pathlib import Path

from rich.console import Console

from openmrc.cli.render import packet_table, print_table
from openmrc.wire import WireError, parse_frame
from openmrc.wire.framing import Frame
from openmrc.wire.pcap import LINKTYPE_ETHERNET, LINKTYPE_RAW, read_pcap

__all__ = ["decode_pcap", "endpoint", "frame_lines", "hex_bytes", "read_hex", "unseal"]

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
        lines = frame_lines(fr)
        if fr.sealed is not None:
            try:
                lines += unseal(fr.udp_payload(), None, None)[1][:1]
            except ValueError as exc:
                lines.append(f"sealed, malformed trailer: {exc}")
        for line in lines:
            console.print(f"{head}  {line}", markup=False, emoji=False, highlight=False)
            head = " " * len(head)
        print_table(console, packet_table(fr.packet))
    return mrc, other


def unseal(raw: bytes, domain: object | None, src_qpn: int | None) -> tuple[bytes, list[str]]:
    """**[openmrc]** A sealed packet (BTH's S bit; `openmrc.wire.security`) as the MRC packet inside it, and
    lines about its security trailer: its fields, and with ``domain`` (a `SecurityDomain`) and the sending
    QP's number whether its tags verify (an encrypted payload comes back decrypted). Any other packet comes
    back as it is, with no lines. Raises ValueError when the trailer cannot be there."""
    from openmrc.transport import NicStats, QpSecurity, SealState, SecurityDomain
    from openmrc.wire import WireError
    from openmrc.wire.constants import is_data_opcode
    from openmrc.wire.datagram import data_header_length
    from openmrc.wire.security import BTH_SEALED, SEAL_OVERHEAD, SECH_SIZE, trailer_length, unpack_sech

    if len(raw) < 12 or not raw[8] & BTH_SEALED:
        return raw, []
    body = raw[:-4]
    if len(body) < 12 + SEAL_OVERHEAD:
        raise ValueError(f"sealed (S) but {len(raw)} bytes leave no room for the security trailer")
    sech_at = len(body) - SEAL_OVERHEAD
    try:
        h = unpack_sech(body[sech_at : sech_at + SECH_SIZE])
    except WireError as exc:
        raise ValueError(f"sealed (S), but its SECH is malformed: {exc}") from None
    end = len(body) - trailer_length(body)
    if end < 12:
        raise ValueError(f"sealed (S) but {len(raw)} bytes leave no room for the security trailer")
    lines = [
        f"sealed [openmrc]: SDI {h.sdi}, epoch {h.epoch}, SSI 0x{h.ssi:08x}, counter {h.counter}"
        + (", payload encrypted" if h.encrypted else "")
        + (", header tag" if h.header_tag else "")
        + (", wants header tags" if h.wants_header_tag else "")
    ]
    data = is_data_opcode(raw[0])
    trimmed = data and h.header_tag and end == data_header_length(body)  # headers and trailer only
    inner = body[:end] + raw[-4:]
    if domain is None or src_qpn is None:
        lines.append("tags not verified (give --key KEYFILE and --src-qpn, the sending QP's number)")
        return inner, lines
    assert isinstance(domain, SecurityDomain)
    stats = NicStats()
    state = SealState(0, QpSecurity(domain, encrypt=h.encrypted), peer_qpn=src_qpn)
    opened = state.open(memoryview(body), stats, trimmed)
    if opened is None:
        why = [k for k, v in stats.as_dict().items() if v]
        lines.append(f"tags do NOT verify under this key and QP {src_qpn:#x} ({', '.join(why)})")
        return inner, lines
    lines.append("header tag verifies (trimmed packet)" if trimmed else "tags verify")
    out = bytes(opened)
    if trimmed:
        return inner, lines
    return out[:-4] + raw[-4:], lines
