"""``openmrc decode`` on captures as a host takes them: unfinished UDP checksums (checksum offload), UDP GSO
batches (several MRC datagrams in one captured frame), sealed packets verified in a capture and in both
directions, and its exit status and refusals around --key / --src-qpn."""

from __future__ import annotations

import ipaddress
import struct
from pathlib import Path

import pytest
from typer.testing import CliRunner

from openmrc.cli.main import app
from openmrc.wire import encapsulate
from openmrc.wire.constants import is_data_opcode
from openmrc.wire.datagram import Addressing, seal
from openmrc.wire.framing import ETH_P_IPV4, ethernet, internet_checksum, ipv4_header, udp_header
from openmrc.wire.pcap import write_pcap

runner = CliRunner()
SRC, DST = "127.0.0.1", "127.0.0.1"
SPORT = 49152


class Conversation:
    """A sealed Write of three data packets from QP a to QP b, and b's replies, as UDP payloads whose ICRCs
    are for ``SRC``:``SPORT`` → ``DST``:4791 and back (each side sends to port 4791, as RoCEv2 does)."""

    def __init__(self, tmp_path: Path, sdi: int = 5) -> None:
        from openmrc.provider.loopback import Pair
        from openmrc.transport import QpSecurity, SecurityDomain

        dom = SecurityDomain(sdi, bytes(range(32)))
        self.key = tmp_path / "k"
        self.key.write_text(dom.spec())
        self.key.chmod(0o600)
        p = Pair(seed=2, wire=True, security=(QpSecurity(dom), QpSecurity(dom)))
        sent: list[tuple[str, bytes]] = []

        def observe(dst: object, obj: bytes, port: int, now: int, kw: dict[str, object]) -> None:
            sent.append((str(kw["src"]), bytes(obj)))

        p.fabric.observers.append(observe)  # type: ignore[arg-type]
        p.src[:9000] = bytes(range(256)) * 35 + bytes(40)
        p.write(0, 9000)
        p.run(lambda: len(p.qp_a.send_cq) >= 1)
        self.qpn_a, self.qpn_b = p.qp_a.qp_num, p.qp_b.qp_num
        there, back = Addressing(SRC, DST, SPORT), Addressing(DST, SRC, SPORT)
        data = [seal(raw, there) for src, raw in sent if src == "a" and is_data_opcode(raw[0])]
        self.data = sorted(data, key=lambda raw: raw[9:12])  # (in PSN order: planes deliver out of it)
        self.replies = [seal(raw, back) for src, raw in sent if src == "b"]
        assert len(self.data) == 3 and self.replies and all(raw[8] & 0x40 for raw in self.data + self.replies)


def udp_frame(payload: bytes, *, partial: bool = False) -> bytes:
    """An Ethernet/IPv4/UDP frame of ``payload`` as it is (its ICRCs untouched), the UDP checksum right or,
    with ``partial``, as checksum offload leaves it: the pseudo-header's sum only."""
    s, d = ipaddress.IPv4Address(SRC).packed, ipaddress.IPv4Address(DST).packed
    udp = udp_header(SPORT, 4791, payload, s, d)
    if partial:
        pseudo = s + d + struct.pack("!BBH", 0, 17, len(udp) + len(payload))
        udp = udp[:6] + struct.pack("!H", ~internet_checksum(pseudo) & 0xFFFF)
    return ethernet(ETH_P_IPV4) + ipv4_header(s, d, 8 + len(payload)) + udp + payload


def decode(*args: str) -> tuple[int, str]:
    res = runner.invoke(app, ["decode", *args])
    return res.exit_code, res.output


@pytest.fixture
def conv(tmp_path: Path) -> Conversation:
    return Conversation(tmp_path)


def test_a_loopback_capture_with_unfinished_udp_checksums_decodes(conv: Conversation, tmp_path: Path) -> None:
    frames = [udp_frame(raw, partial=True) for raw in conv.data] + [
        udp_frame(raw, partial=True) for raw in conv.replies
    ]
    write_pcap(tmp_path / "lo.pcap", list(enumerate(frames)))
    code, out = decode("--pcap", str(tmp_path / "lo.pcap"))
    assert code == 0, out
    assert "not MRC" not in out and "ICRC BAD" not in out
    assert f"{len(frames)} MRC packet(s), 0 other frame(s)" in out
    assert out.count("bad UDP checksum") == 0 and out.count("unfinished or wrong UDP checksum") == 1
    assert f"{len(frames)} frame(s) with an unfinished" in out
    # one frame, given whole: decoded too, the checksum noted
    code, out = decode("--frame", frames[0].hex())
    assert code == 0 and "WRITE_FIRST" in out and "UDP checksum is unfinished or wrong" in out, out


def gso_frame(conv: Conversation) -> bytes:
    """The three data packets as a sender batches them with UDP_SEGMENT: one UDP payload, one frame."""
    size = len(conv.data[0])
    assert len(conv.data[1]) == size > len(conv.data[2])
    return udp_frame(b"".join(conv.data), partial=True)


def test_a_gso_batch_is_split_into_its_datagrams_and_their_tags_verify(
    conv: Conversation, tmp_path: Path
) -> None:
    size, last = len(conv.data[0]), len(conv.data[2])
    frames = [gso_frame(conv)] + [udp_frame(raw) for raw in conv.replies]
    write_pcap(tmp_path / "gso.pcap", list(enumerate(frames)))
    key = ("--key", str(conv.key), "--src-qpn", hex(conv.qpn_a))
    code, out = decode("--pcap", str(tmp_path / "gso.pcap"), *key)
    assert code == 0, out
    assert f"GSO batch: 3 MRC datagrams of {size} B (the last {last} B)" in out
    assert "ICRC BAD" not in out and "do NOT verify" not in out and "not verified" not in out
    for op in ("WRITE_FIRST", "WRITE_MIDDLE", "WRITE_LAST"):
        assert op in out
    # each datagram and each reply (b's, verified under b's number, learned from a's packets)
    n = 3 + len(conv.replies)
    assert out.count("tags verify") == n and f"{n} MRC packet(s), 0 other" in out
    assert "1 frame(s) held several MRC datagrams" in out
    # the batch given as one frame's hex
    code, out = decode("--frame", frames[0].hex(), *key)
    assert code == 0 and out.count("tags verify") == 3 and "GSO batch: 3" in out, out


def test_a_gso_batch_whose_first_datagram_was_damaged_is_split_all_the_same(
    conv: Conversation, tmp_path: Path
) -> None:
    batch = bytearray(gso_frame(conv))
    batch[-sum(map(len, conv.data)) + 100] ^= 1  # a byte of the first datagram's payload
    write_pcap(tmp_path / "d.pcap", [(0, bytes(batch))])
    code, out = decode(
        "--pcap", str(tmp_path / "d.pcap"), "--key", str(conv.key), "--src-qpn", str(conv.qpn_a)
    )
    assert code == 1, out
    assert "GSO batch: 3 MRC datagrams" in out and f"datagram 1/3: {len(conv.data[0])} B  ICRC BAD" in out
    assert out.count("ICRC BAD") == 1 and out.count("tags verify") == 2 and out.count("do NOT verify") == 2


def test_a_capture_whose_tags_fail_exits_1(conv: Conversation, tmp_path: Path) -> None:
    forged = bytearray(conv.data[1])
    forged[100] ^= 1  # a payload byte, the ICRC made right again: only the tags can tell
    frames = [udp_frame(conv.data[0]), udp_frame(seal(bytes(forged), Addressing(SRC, DST, SPORT)))]
    write_pcap(tmp_path / "f.pcap", list(enumerate(frames)))
    key = ("--key", str(conv.key), "--src-qpn", str(conv.qpn_a))
    code, out = decode("--pcap", str(tmp_path / "f.pcap"), *key)
    assert code == 1, out
    assert out.count("tags verify") == 1 and out.count("tags do NOT verify under this key") == 1
    assert "ICRC BAD" not in out and "1 sealed packet(s) whose tags do NOT verify" in out
    code, out = decode(forged.hex(), *key)
    assert code == 1 and "do NOT verify" in out, out
    code, out = decode(conv.data[1].hex(), *key)
    assert code == 0 and "tags verify" in out, out


def test_a_key_of_another_domain_names_the_sdis(conv: Conversation, tmp_path: Path) -> None:
    from openmrc.transport import SecurityDomain

    other = tmp_path / "other"
    other.write_text(SecurityDomain(6, bytes(range(32))).spec())
    other.chmod(0o600)
    code, out = decode(conv.data[0].hex(), "--key", str(other), "--src-qpn", str(conv.qpn_a))
    assert code == 1, out
    assert "the packet's SDI 5 differs from the key's (SDI 6)" in " ".join(out.split())


@pytest.mark.parametrize("spelling", [hex, str, lambda n: f"0X{n:08X}"])
def test_src_qpn_in_hex_or_decimal(conv: Conversation, spelling: object) -> None:
    qpn = spelling(conv.qpn_a)  # type: ignore[operator]
    code, out = decode(conv.data[0].hex(), "--key", str(conv.key), "--src-qpn", qpn)
    assert code == 0 and "tags verify" in out, out


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--src-qpn", "0x10"], "--src-qpn needs --key"),
        (["--key", "K"], "--key needs --src-qpn"),
        (["--key", "K", "--src-qpn", "0x1000000"], "24 bits"),
        (["--key", "K", "--src-qpn", "-1"], "24 bits"),
        (["--key", "K", "--src-qpn", "qp7"], "not a QP number"),
    ],
)
def test_key_and_src_qpn_refusals_are_one_line(
    conv: Conversation, tmp_path: Path, extra: list[str], message: str
) -> None:
    args = [str(conv.key) if a == "K" else a for a in extra]
    for source in ([conv.data[0].hex()], ["--pcap", str(tmp_path / "none.pcap")]):
        res = runner.invoke(app, ["decode", *source, *args])
        assert res.exit_code == 2, res.output
        assert res.stdout == "" and res.stderr.count("\n") == 1 and message in res.stderr, res.stderr


def test_help_documents_the_exit_status() -> None:
    res = runner.invoke(app, ["decode", "--help"], env={"COLUMNS": "200"})
    text = " ".join(res.output.replace("│", " ").split())
    assert "Exit status: 0 decoded; 1 a sealed packet's tags do not verify" in text
    assert "2 bad arguments or malformed bytes" in text


def test_an_ipv6_frame_with_a_bad_icrc_is_not_taken_for_a_gso_batch(conv: Conversation) -> None:
    frame = bytearray(
        encapsulate(conv.data[0], src="2001:db8::a", dst="2001:db8::b", sport=SPORT, ether=True)
    )
    frame[-1] ^= 0xFF
    frame[14 + 40 + 6 : 14 + 40 + 8] = b"\x00\x00"  # (a checksum of 0: not checked)
    res = runner.invoke(app, ["decode", "--frame", bytes(frame).hex()])
    assert res.exit_code == 2 and "ICRC mismatch" in res.output and "GSO" not in res.output
