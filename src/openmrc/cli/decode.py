"""``openmrc decode``: what it reads (hex text, stdin, pcap files) and the lines it prints about a frame.

A frame is checked the way a receiving NIC checks it: by its ICRC (and a sealed packet by its tags), not by
its UDP checksum, which a capture on the sending host (or on ``lo``) often holds unfinished: with checksum
offload the field carries only the pseudo-header's partial sum, for the NIC to complete. A frame whose
UDP payload fails the ICRC as a whole may be several MRC datagrams a sender batched with UDP GSO
(``UDP_SEGMENT``: datagrams of one size, the last maybe shorter, captured before the NIC split them): the
segment size is the one whose first datagram carries a valid ICRC for the frame's addresses, and each
datagram is decoded on its own."""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, NoReturn

import typer
from rich.console import Console

from openmrc.cli.render import make_console, packet_table, print_table
from openmrc.wire import MRC_UDP_PORT, WireError, parse, parse_frame
from openmrc.wire.constants import MRC_OPCODE_RANGE
from openmrc.wire.datagram import Addressing, icrc_ok
from openmrc.wire.framing import Frame
from openmrc.wire.pcap import LINKTYPE_ETHERNET, LINKTYPE_RAW, read_pcap
from openmrc.wire.security import BTH_SEALED

__all__ = [
    "Decoder",
    "decode",
    "endpoint",
    "frame_lines",
    "gso_segment",
    "hex_bytes",
    "open_sealed",
    "parse_qpn",
    "read_hex",
]

_SEPARATORS = re.compile(r"[\s:,.-]+")
_MIN_DATAGRAM = 16  # BTH + ICRC


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


def parse_qpn(text: str) -> int:
    """A QP number as the tools print it (``0x3b479c``) or in decimal. Raises ValueError."""
    try:
        qpn = int(text.strip(), 0)
    except ValueError:
        raise ValueError(f"{text!r} is not a QP number (decimal or 0x-hex)") from None
    if not 0 <= qpn <= 0xFFFFFF:
        raise ValueError(f"{text!r} is not a QP number: QP numbers are 24 bits (0..0xffffff)")
    return qpn


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


def gso_segment(payload: bytes, addr: Addressing) -> int:
    """The segment size of ``payload`` (a UDP payload with addressing ``addr``) when it is several MRC
    datagrams batched by UDP GSO: datagrams of that size, the last maybe shorter, the first (or, when it
    was damaged, the second) carrying a valid ICRC for a UDP length of its size + 8. 0 when no size checks
    out.

    Sizes are multiples of 4 (an MRC packet's length is), tried from the smallest; only those at whose every
    multiple a BTH could start (an MRC opcode, the first packet's P_Key) have their ICRC computed."""
    n = len(payload)
    pkey = payload[2:4]
    view = memoryview(payload)
    for s in range(_MIN_DATAGRAM, n - _MIN_DATAGRAM + 1, 4):
        if (n - 1) % s < _MIN_DATAGRAM - 1:  # the last datagram would be shorter than BTH + ICRC
            continue
        if not all(payload[j] in MRC_OPCODE_RANGE and payload[j + 2 : j + 4] == pkey for j in range(s, n, s)):
            continue
        if icrc_ok(view[:s], addr) or icrc_ok(view[s : 2 * s], addr):
            return s
    return 0


@dataclass(slots=True)
class _Datagram:
    raw: bytes
    icrc_ok: bool


@dataclass(slots=True)
class _Split:
    """A frame taken apart: its addressing and the MRC datagrams its UDP payload holds."""

    fr: Frame
    trimmed: bool
    datagrams: list[_Datagram] = field(default_factory=list)
    segment: int = 0  # GSO segment size, 0 for one datagram


def open_sealed(
    raw: bytes, domain: object | None, src_qpn: int | None, why: str = ""
) -> tuple[bytes, list[str], bool | None]:
    """**[openmrc]** A sealed packet (BTH's S bit; `openmrc.wire.security`) as the MRC packet inside it
    (an encrypted payload decrypted when its tags verify), lines about its security trailer, and whether
    its tags verify under ``domain`` (a `SecurityDomain`) and the sending QP ``src_qpn``: True, False (they
    do not under this key, or the packet is of another domain), None (not checked: a plain packet, which
    comes back as it is with no lines, or no key or sending QP; ``why`` then says why not, instead of the
    hint to give them). Raises ValueError when the trailer cannot be there."""
    from openmrc.transport import NicStats, QpSecurity, SealState, SecurityDomain
    from openmrc.wire.constants import is_data_opcode
    from openmrc.wire.datagram import data_header_length
    from openmrc.wire.security import SEAL_OVERHEAD, SECH_SIZE, trailer_length, unpack_sech

    if len(raw) < 12 or not raw[8] & BTH_SEALED:
        return raw, [], None
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
        lines.append(
            f"tags not verified ({why})"
            if why
            else "tags not verified (give --key KEYFILE and --src-qpn, the sending QP's number)"
        )
        return inner, lines, None
    assert isinstance(domain, SecurityDomain)
    if h.sdi != domain.sdi:
        lines.append(
            f"tags do NOT verify: the packet's SDI {h.sdi} differs from the key's (SDI {domain.sdi}): "
            "a key of another security domain"
        )
        return inner, lines, False
    stats = NicStats()
    state = SealState(0, QpSecurity(domain, encrypt=h.encrypted), peer_qpn=src_qpn)
    opened = state.open(memoryview(body), stats, trimmed)
    if opened is None:
        why = ", ".join(k for k, v in stats.as_dict().items() if v)
        lines.append(f"tags do NOT verify under this key and QP {src_qpn:#x} ({why})")
        return inner, lines, False
    lines.append("header tag verifies (trimmed packet)" if trimmed else "tags verify")
    out = bytes(opened)
    if trimmed:
        return inner, lines, True
    return out[:-4] + raw[-4:], lines, True


def _print(console: Console, head: str, lines: list[str]) -> None:
    for line in lines:
        console.print(f"{head}{line}", markup=False, emoji=False, highlight=False)
        head = " " * len(head)


class Decoder:
    """Decodes MRC frames onto ``console`` and counts what it saw, for the closing notes and the exit status.

    With ``domain`` (a `SecurityDomain`) and ``src_qpn`` a sealed packet's tags are verified. In a capture
    (`pcap`) the packets QP ``src_qpn`` sent are verified under its number and those its peer sent back
    under the peer's, learned from the destination QP of ``src_qpn``'s packets; packets of other QP pairs
    are left unverified."""

    def __init__(
        self,
        console: Console,
        udp_port: int = MRC_UDP_PORT,
        domain: object | None = None,
        src_qpn: int | None = None,
    ) -> None:
        self.console = console
        self.udp_port = udp_port
        self.domain = domain
        self.src_qpn = src_qpn
        self.peer_qpn: int | None = None
        """The QP ``src_qpn`` sends to, once a packet of a capture verified under ``src_qpn`` shows it."""
        self._capture = False
        self.packets = 0
        """MRC packets decoded (each datagram of a GSO batch counts)."""
        self.other = 0
        """Frames of a capture that are not MRC."""
        self.failed = 0
        """Sealed packets whose tags do not verify."""
        self.unverified = 0
        """Sealed packets whose tags were not checked."""
        self.partial_udp = 0
        """Frames whose UDP checksum does not check (unfinished: checksum offload), decoded all the same."""
        self.gso_frames = 0
        """Frames split into the datagrams of a GSO batch."""
        self.malformed = 0
        """Datagrams that could not be decoded."""

    def split(self, raw: bytes, ether: bool) -> _Split:
        """``raw`` (a frame from its Ethernet or IP header) as its MRC datagrams: one, a GSO batch's, or a
        data packet a switch trimmed to its headers. Raises `WireError` when it is not an MRC frame."""
        port = self.udp_port
        try:
            fr = parse_frame(raw, ether=ether, check_icrc=False, check_udp=False, udp_port=port)
            trimmed = False
        except WireError as exc:
            try:  # a data packet whose payload a switch cut off (or a GSO batch, read as one packet)
                fr = parse_frame(
                    raw, ether=ether, check_icrc=False, check_udp=False, udp_port=port, trimmed=True
                )
                trimmed = True
            except WireError:
                raise exc from None
        payload = fr.udp_data
        addr = Addressing(fr.src, fr.dst, fr.sport, fr.dport)
        out = _Split(fr, trimmed)
        # (an IPv4 header's identification is in the frame's ICRC; a socket's ICRC counts it as 0)
        ok = fr.icrc_ok or icrc_ok(payload, addr)
        s = 0 if ok else gso_segment(payload, addr)
        if s:
            out.segment, out.trimmed = s, False
            out.datagrams = [
                _Datagram(payload[i : i + s], icrc_ok(payload[i : i + s], addr))
                for i in range(0, len(payload), s)
            ]
        else:
            out.datagrams = [_Datagram(payload, ok)]
        fr.icrc_ok = ok or bool(s)
        return out

    def show(self, head: str, f: _Split) -> None:
        """Print a frame taken apart by `split`: its addressing, then each datagram's trailer and headers."""
        fr = f.fr
        lines = frame_lines(fr)
        if f.trimmed:
            head += "trimmed  "
        if not fr.udp_ok:
            self.partial_udp += 1
        n = len(f.datagrams)
        if f.segment:
            self.gso_frames += 1
            last = len(f.datagrams[-1].raw)
            lines.append(
                f"GSO batch: {n} MRC datagrams of {f.segment} B"
                + (f" (the last {last} B)" if last != f.segment else "")
                + " in one UDP payload, split where their ICRCs check"
            )
        _print(self.console, head, lines)
        indent = " " * len(head)
        for i, dg in enumerate(f.datagrams, 1):
            self.packets += 1
            lines = []
            if n > 1:
                lines.append(f"datagram {i}/{n}: {len(dg.raw)} B" + ("" if dg.icrc_ok else "  ICRC BAD"))
            pkt = None if n > 1 else fr.packet
            try:
                inner, more, _ = self.open(dg.raw)
                lines += more
                if n > 1 or more:
                    pkt = parse(inner, trimmed=f.trimmed)
            except (ValueError, WireError) as exc:
                self.malformed += 1
                lines.append(f"malformed: {exc}")
            _print(self.console, indent, lines)
            if pkt is not None:
                print_table(self.console, packet_table(pkt))

    def open(self, raw: bytes) -> tuple[bytes, list[str], bool | None]:
        """`open_sealed` of the UDP payload ``raw`` under the options' key and sending QP, counted."""
        qpn, why = self._sender(raw)
        inner, lines, verdict = open_sealed(raw, self.domain, qpn, why)
        if lines:
            if verdict is None:
                self.unverified += 1
                if self.domain is None and self._capture:
                    lines = lines[:1]  # (the hint to give a key: once, in the notes)
            elif not verdict:
                self.failed += 1
        return inner, lines, verdict

    def _sender(self, raw: bytes) -> tuple[int | None, str]:
        """The QP number that sent ``raw`` as far as the options tell, or None and why not."""
        n = self.src_qpn
        if n is None or not self._capture:
            return n, ""
        dest = int.from_bytes(raw[5:8], "big")
        if self.peer_qpn is not None:
            if dest == self.peer_qpn:
                return n, ""
            if dest == n:
                return self.peer_qpn, ""
            return None, f"neither sent by QP {n:#x} nor to it"
        if dest == n:
            return None, f"sent to QP {n:#x} by its peer, whose number no verified packet of QP {n:#x} shows"
        return n, ""

    def _learn_peer(self, splits: list[_Split]) -> None:
        """The QP that ``src_qpn`` sends to: the destination of the first packet that verifies under it."""
        if self.domain is None or self.src_qpn is None:
            return
        for f in splits:
            for dg in f.datagrams:
                dest = int.from_bytes(dg.raw[5:8], "big")
                if dest == self.src_qpn or len(dg.raw) < 12 or not dg.raw[8] & BTH_SEALED:
                    continue
                try:
                    if open_sealed(dg.raw, self.domain, self.src_qpn)[2]:
                        self.peer_qpn = dest
                        return
                except ValueError:
                    continue

    def pcap(self, path: Path) -> None:
        """Print every MRC packet of a capture and each other frame's reason. Raises ValueError when the file
        is not a classic pcap of Ethernet or raw-IP frames, OSError when it cannot be read."""
        linktype, records = read_pcap(path)
        if linktype not in (LINKTYPE_ETHERNET, LINKTYPE_RAW):
            raise ValueError(f"{path}: link type {linktype} is neither Ethernet (1) nor raw IP (101)")
        self._capture = True
        ether = linktype == LINKTYPE_ETHERNET
        t0 = records[0][0] if records else 0
        frames: list[tuple[str, _Split | str]] = []
        for i, (ts, frame) in enumerate(records, 1):
            head = f"#{i}  {(ts - t0) / 1000:.3f} µs  "
            try:
                frames.append((head, self.split(frame, ether)))
            except WireError as exc:
                frames.append((head, f"not MRC: {exc}"))
        self._learn_peer([f for _, f in frames if not isinstance(f, str)])
        for head, f in frames:
            if isinstance(f, str):
                self.other += 1
                _print(self.console, head, [f])
            else:
                self.show(head, f)

    def notes(self) -> list[str]:
        """What the output as a whole should say: frames split or not fully checked, tags not verified (of a
        capture; of one frame, only that its UDP checksum was not checked)."""
        offload = (
            "not checked (checksum offload leaves a partial sum in a capture on the sending host or on lo; "
            "the ICRC is checked)"
        )
        if not self._capture:
            return [f"the UDP checksum is unfinished or wrong, {offload}"] if self.partial_udp else []
        out = []
        if self.gso_frames:
            out.append(
                f"{self.gso_frames} frame(s) held several MRC datagrams: a sender's UDP GSO batch, captured "
                "before it was split (decoded one by one)"
            )
        if self.partial_udp:
            out.append(f"{self.partial_udp} frame(s) with an unfinished or wrong UDP checksum, {offload}")
        if self.unverified and self.domain is None:
            out.append(
                f"{self.unverified} sealed packet(s), tags not verified "
                "(give --key KEYFILE and --src-qpn, the sending QP's number)"
            )
        if self.failed:
            out.append(f"{self.failed} sealed packet(s) whose tags do NOT verify")
        return out


def _fail(msg: str) -> NoReturn:
    """A bad argument: one line on stderr, exit status 2."""
    print(f"openmrc decode: error: {msg}", file=sys.stderr)
    raise typer.Exit(2)


def decode(
    data: Annotated[
        str | None,
        typer.Argument(help="hex bytes (0x prefixes and separators allowed), or - to read them from stdin"),
    ] = None,
    frame: Annotated[bool, typer.Option(help="the bytes start at an Ethernet header")] = False,
    ip: Annotated[bool, typer.Option(help="the bytes start at an IP header")] = False,
    pcap_file: Annotated[
        Path | None, typer.Option("--pcap", help="decode every MRC packet of this capture instead")
    ] = None,
    port: Annotated[
        int, typer.Option(min=1, max=65535, help="UDP destination port of the MRC packets")
    ] = MRC_UDP_PORT,
    key: Annotated[
        Path | None,
        typer.Option(
            help="a sealed packet's security domain key file (openmrc perf keygen): verify its tags"
        ),
    ] = None,
    src_qpn: Annotated[
        str | None,
        typer.Option(
            metavar="QPN",
            help="with --key: the QP number that sent the packet, decimal or 0x-hex (in a capture: the "
            "packets it sent, and those its peer sent back to it)",
        ),
    ] = None,
) -> None:
    """Decode one MRC packet (a UDP payload, or a whole frame with --frame / --ip) or a capture. A sealed
    packet (an authenticated QP's) shows its security trailer; with --key and --src-qpn its tags are
    verified and an encrypted payload decrypted. A frame holding a UDP GSO batch is split into its
    datagrams; UDP checksums are not checked (the ICRC is).

    Exit status: 0 decoded; 1 a sealed packet's tags do not verify under --key (or the capture cannot be
    read); 2 bad arguments or malformed bytes."""
    console = make_console()
    errors = make_console(stderr=True)
    if frame and ip:
        _fail("give --frame (Ethernet) or --ip (IP header first), not both")
    if (pcap_file is None) == (data is None):
        _fail("give hex bytes (- for stdin) or --pcap FILE")
    if key is not None and src_qpn is None:
        _fail("--key needs --src-qpn, the sending QP's number (in the tags' nonce)")
    if src_qpn is not None and key is None:
        _fail("--src-qpn needs --key, the key file of the packets' security domain")
    qpn = None
    domain = None
    if src_qpn is not None and key is not None:
        from openmrc.transport import SecurityDomain

        try:
            qpn = parse_qpn(src_qpn)
        except ValueError as exc:
            _fail(f"--src-qpn {exc}")
        try:
            domain = SecurityDomain.load(key)
        except ValueError as exc:
            _fail(f"--key {exc}")
    dec = Decoder(console, port, domain, qpn)
    if pcap_file is not None:
        try:
            dec.pcap(pcap_file)
        except (OSError, ValueError) as exc:
            errors.print(f"error: {exc}", markup=False, emoji=False, highlight=False)
            raise typer.Exit(1) from None
        console.print(f"{dec.packets} MRC packet(s), {dec.other} other frame(s)")
        _print(console, "", dec.notes())
        raise typer.Exit(1 if dec.failed else 0)
    assert data is not None
    try:
        raw = hex_bytes(read_hex(data))
    except ValueError as exc:
        _fail(f"not hex: {exc}")
    try:
        if frame or ip:
            split = dec.split(raw, frame)
            if not (split.fr.icrc_ok or split.trimmed):
                raise WireError("ICRC", "icrc", len(raw) - 4, "ICRC mismatch")
            dec.show("", split)
            _print(console, "", dec.notes())
            if dec.malformed:
                raise typer.Exit(2)
        else:
            inner, lines, _ = dec.open(raw)
            _print(console, "", lines)
            print_table(console, packet_table(parse(inner)))
    except (ValueError, WireError) as exc:
        errors.print(f"malformed: {exc}", markup=False, emoji=False, highlight=False, style="red")
        raise typer.Exit(2) from None
    raise typer.Exit(1 if dec.failed else 0)
