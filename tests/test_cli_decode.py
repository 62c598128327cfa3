"""``openmrc decode``: hex in its usual spellings, stdin, whole frames, captures, and its refusals."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from openmrc.cli.decode import endpoint, hex_bytes
from openmrc.cli.main import app
from openmrc.wire.examples import ExampleFrame, example_conversation
from openmrc.wire.pcap import LINKTYPE_RAW, write_pcap

runner = CliRunner()


@pytest.fixture(scope="module")
def examples() -> list[ExampleFrame]:
    return example_conversation()


def _ipv6(examples: list[ExampleFrame]) -> ExampleFrame:
    return next(e for e in examples if ":" in e.src and e.srv6 is None)


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("0a0b0c", b"\x0a\x0b\x0c"),
        ("0x0a0b0c", b"\x0a\x0b\x0c"),
        ("0x0a, 0x0b, 0X0c", b"\x0a\x0b\x0c"),
        ("0a:0b:0c\n", b"\x0a\x0b\x0c"),
        ("  0a 0b-0c ", b"\x0a\x0b\x0c"),
    ],
)
def test_hex_spellings(text: str, want: bytes) -> None:
    assert hex_bytes(text) == want


@pytest.mark.parametrize("text", ["", "0x", "abc", "zz", "0a 0xg1"])
def test_hex_refusals(text: str) -> None:
    with pytest.raises(ValueError):
        hex_bytes(text)


def test_endpoint_brackets_ipv6_only() -> None:
    assert endpoint("2001:db8::a", 49158) == "[2001:db8::a]:49158"
    assert endpoint("192.0.2.1", 4791) == "192.0.2.1:4791"


def test_frame_prints_ipv6_endpoints_verbatim(examples: list[ExampleFrame]) -> None:
    ex = _ipv6(examples)
    fr_sport = int.from_bytes(ex.frame[14 + 40 : 14 + 42], "big")
    res = runner.invoke(app, ["decode", "--frame", ex.frame.hex()])
    assert res.exit_code == 0, res.output
    # rich would turn ':a:' into an emoji if the line went through its markup
    assert f"[{ex.src}]:{fr_sport} → [{ex.dst}]:4791" in res.output


def test_qpns_print_in_hex(examples: list[ExampleFrame]) -> None:
    sack = next(e for e in examples if e.packet.seth is not None)
    res = runner.invoke(app, ["decode", "0x" + sack.packet.encode().hex()])
    assert res.exit_code == 0, res.output
    assert f"dest_qp=0x{sack.packet.bth.dest_qp:06x}" in res.output
    assert f"src_qp=0x{sack.packet.seth.src_qp:04x}" in res.output
    assert f"dst_qp=0x{sack.packet.seth.dst_qp:04x}" in res.output


def test_stdin(examples: list[ExampleFrame]) -> None:
    ex = examples[0]
    res = runner.invoke(app, ["decode", "--frame", "-"], input=ex.frame.hex(" ", 1) + "\n")
    assert res.exit_code == 0, res.output
    assert f"psn={ex.packet.bth.psn}" in res.output and ex.src in res.output


def test_ip_start(examples: list[ExampleFrame]) -> None:
    ex = _ipv6(examples)
    res = runner.invoke(app, ["decode", "--ip", ex.frame[14:].hex()])
    assert res.exit_code == 0, res.output
    assert f"[{ex.src}]" in res.output


@pytest.mark.parametrize(
    "args",
    [
        ["decode", "--frame", "--ip", "00"],
        ["decode"],
        ["decode", "00", "--pcap", "x.pcap"],
    ],
)
def test_refused_combinations(args: list[str]) -> None:
    res = runner.invoke(app, args)
    assert res.exit_code == 2
    assert "Traceback" not in res.output


def test_pcap(examples: list[ExampleFrame], tmp_path: Path) -> None:
    path = tmp_path / "c.pcap"
    write_pcap(path, [(e.ts_ns, e.frame) for e in examples] + [(99_000, b"\x00" * 60)])
    res = runner.invoke(app, ["decode", "--pcap", str(path)])
    assert res.exit_code == 0, res.output
    assert f"{len(examples)} MRC packet(s), 1 other frame(s)" in res.output
    assert f"#{len(examples) + 1} " in res.output and "not MRC" in res.output
    for e in examples:
        assert f"psn={e.packet.bth.psn}" in res.output
    assert "ICRC BAD" not in res.output


def test_pcap_raw_ip_and_a_bad_icrc(examples: list[ExampleFrame], tmp_path: Path) -> None:
    ex = examples[0]
    bad = bytearray(ex.frame[14:])
    bad[-1] ^= 0xFF
    bad[26:28] = b"\x00\x00"  # no UDP checksum (IPv4 allows it), so only the ICRC is wrong
    path = tmp_path / "raw.pcap"
    write_pcap(path, [(0, ex.frame[14:]), (1, bytes(bad))], linktype=LINKTYPE_RAW)
    res = runner.invoke(app, ["decode", "--pcap", str(path)])
    assert res.exit_code == 0, res.output
    assert "2 MRC packet(s), 0 other" in res.output
    assert res.output.count("ICRC BAD") == 1


def test_pcap_errors_are_one_line(tmp_path: Path) -> None:
    junk = tmp_path / "junk.pcap"
    junk.write_bytes(b"not a capture at all, not at all")
    for path in (junk, tmp_path / "missing.pcap"):
        res = runner.invoke(app, ["decode", "--pcap", str(path)])
        assert res.exit_code == 1
        assert res.output.startswith("error: ") and res.output.count("\n") == 1, res.output


def test_decode_shows_a_sealed_packets_trailer_and_verifies_it_with_the_key(tmp_path: Path) -> None:
    """**[openmrc]** a sealed (authenticated, encrypted) Write: SECH shown; with the right key and sending
    QP the tags verify; a wrong key says so; --key alone is a usage error."""
    from openmrc.provider.loopback import Pair
    from openmrc.transport import QpSecurity, SecurityDomain

    dom = SecurityDomain(5, bytes(range(32)))
    (tmp_path / "k").write_text(dom.spec())
    (tmp_path / "wrong").write_text(SecurityDomain(5, bytes(32)).spec())
    p = Pair(seed=2, wire=True, security=(QpSecurity(dom, encrypt=True), QpSecurity(dom, encrypt=True)))
    sent: list[bytes] = []
    p.fabric.observers.append(
        lambda dst, obj, port, now, kw: sent.append(bytes(obj)) if kw["src"] == "a" else None
    )  # type: ignore[arg-type]
    p.src[:300] = b"Z" * 300
    p.write(0, 300)
    p.run(lambda: len(p.qp_a.send_cq) >= 1)
    hexed = sent[0].hex()
    qpn = str(p.qp_a.qp_num)
    plain = runner.invoke(app, ["decode", hexed])
    assert (
        plain.exit_code == 0 and "sealed [openmrc]: SDI 5" in plain.output and "not verified" in plain.output
    )
    good = runner.invoke(app, ["decode", hexed, "--key", str(tmp_path / "k"), "--src-qpn", qpn])
    assert good.exit_code == 0 and "tags verify" in good.output and "300 B" in good.output
    bad = runner.invoke(app, ["decode", hexed, "--key", str(tmp_path / "wrong"), "--src-qpn", qpn])
    assert bad.exit_code == 1 and "do NOT verify" in bad.output  # (a forgery, or the wrong key)
    usage = runner.invoke(app, ["decode", hexed, "--key", str(tmp_path / "k")])
    assert usage.exit_code == 2
    # as a whole frame and in a capture: the packet inside its trailer, the trailer shown
    from openmrc.wire import encapsulate

    frame = encapsulate(sent[0], src="2001:db8::a", dst="2001:db8::b", sport=0xC000, ether=True)
    whole = runner.invoke(
        app, ["decode", "--frame", frame.hex(), "--key", str(tmp_path / "k"), "--src-qpn", qpn]
    )
    assert whole.exit_code == 0 and "tags verify" in whole.output and "WRITE_ONLY" in whole.output
    write_pcap(tmp_path / "s.pcap", [(0, frame), (1, frame[: -4 - 100])])
    cap = runner.invoke(app, ["decode", "--pcap", str(tmp_path / "s.pcap")])
    assert cap.exit_code == 0 and cap.output.count("sealed [openmrc]: SDI 5") >= 1, cap.output


def test_the_readmes_decode_command_decodes_a_packet() -> None:
    """The README's `openmrc decode <hex>` line, as written, decodes a whole packet (it used to be cut)."""
    readme = (Path(__file__).parents[1] / "README.md").read_text()
    line = next(
        x for x in readme.splitlines() if x.startswith(".venv/bin/openmrc decode ") and "--pcap" not in x
    )
    res = runner.invoke(app, line.split()[1:])
    assert res.exit_code == 0 and "SACK" in res.output, res.output
