"""The example conversation decoded by tshark: the built-in RRoCE dissector, and our Lua dissector (mrc.lua).

Every test runs tshark once or twice on a pcap written from `openmrc.wire.examples.example_conversation`
and compares its field output with the Python `Packet` objects. Skipped when tshark is not installed.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import random
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

import pytest

from openmrc.contrib.wireshark import DISSECTOR_PATH
from openmrc.wire.examples import ExampleFrame, example_conversation
from openmrc.wire.framing import (
    ETH_P_IPV4,
    encapsulate,
    ethernet,
    internet_checksum,
    ipv4_header,
    parse_frame,
    udp_header,
)
from openmrc.wire.headers import AETH, BTH, EETH, ERTH, METH, NETH, PETH, RETH, SETH, TSETH, CcState, ImmDt
from openmrc.wire.packet import Packet
from openmrc.wire.pcap import PcapWriter, write_pcap

TSHARK = shutil.which("tshark")
pytestmark = pytest.mark.skipif(TSHARK is None, reason="tshark is not installed (apt-get install tshark)")

# Dissector header key -> (Packet attribute, header class).
HEADERS: dict[str, tuple[str, type]] = {
    "bth": ("bth", BTH),
    "meth": ("meth", METH),
    "tseth": ("tseth", TSETH),
    "reth": ("reth", RETH),
    "imm": ("imm", ImmDt),
    "aeth": ("aeth", AETH),
    "seth": ("seth", SETH),
    "ccstate": ("cc_state", CcState),
    "neth": ("neth", NETH),
    "peth": ("peth", PETH),
    "erth": ("erth", ERTH),
    "eeth": ("eeth", EETH),
}
# Field names that are not mrc.<header>.<python attribute>.
RENAMED = {("reth", "dma_len"): "mrc.reth.dmalen", ("imm", "imm_data"): "mrc.imm"}


def field_name(hdr: str, attr: str) -> str:
    return RENAMED.get((hdr, attr), f"mrc.{hdr}.{attr}")


def header_fields(hdr: str) -> list[tuple[str, str]]:
    """(python attribute, tshark field) for every field of the header, from the dataclass itself."""
    cls = HEADERS[hdr][1]
    return [(f.name, field_name(hdr, f.name)) for f in dataclasses.fields(cls)]


ALL_FIELDS = [name for hdr in HEADERS for _, name in header_fields(hdr)]


# -- helpers -----------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tshark_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """An environment with an empty Wireshark profile, so user prefs and plugins cannot interfere."""
    home = tmp_path_factory.mktemp("wshome")
    return {**os.environ, "HOME": str(home), "XDG_CONFIG_HOME": str(home / ".config")}


@pytest.fixture(scope="module")
def conversation() -> list[ExampleFrame]:
    return example_conversation()


@pytest.fixture(scope="module")
def capture(conversation: list[ExampleFrame], tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("pcap") / "example.pcap"
    write_pcap(path, [(e.ts_ns, e.frame) for e in conversation])
    return path


def run_tshark(
    env: dict[str, str], pcap: Path, *args: str, lua: bool = False
) -> subprocess.CompletedProcess[str]:
    cmd = [str(TSHARK), "-n"]
    if lua:
        cmd += ["-X", f"lua_script:{DISSECTOR_PATH}"]
    cmd += ["-r", str(pcap), *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env, check=False)
    assert proc.returncode == 0, f"tshark exited {proc.returncode}: {proc.stderr}"
    assert "Lua: Error" not in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    assert "Lua Error" not in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    return proc


def tshark_fields(
    env: dict[str, str], pcap: Path, fields: Sequence[str], *extra: str, lua: bool = False
) -> list[dict[str, str]]:
    """One dict per frame: field name -> tshark's text for the first occurrence ('' when absent)."""
    args = ["-T", "fields", "-E", "separator=/t", "-E", "occurrence=f", *extra]
    for f in fields:
        args += ["-e", f]
    out = run_tshark(env, pcap, *args, lua=lua).stdout
    rows = []
    for line in out.splitlines():
        values = line.split("\t")
        assert len(values) == len(fields), line
        rows.append(dict(zip(fields, values, strict=True)))
    return rows


def as_int(text: str) -> int:
    """tshark's rendering of an integer or boolean field: 0x-hex, signed decimal, True/False or 1/0."""
    t = text.strip()
    if t in ("True", "False"):
        return int(t == "True")
    if t.lower().startswith(("0x", "-0x")):
        return int(t, 16)
    return int(t, 10)


def udp_frame(body: bytes, dport: int = 4791) -> bytes:
    """Ethernet/IPv4/UDP around arbitrary bytes (no ICRC computed: the bytes need not be an MRC packet)."""
    src, dst = ipaddress.ip_address("192.0.2.1").packed, ipaddress.ip_address("192.0.2.2").packed
    return (
        ethernet(ETH_P_IPV4)
        + ipv4_header(src, dst, 8 + len(body))
        + udp_header(0xC000, dport, body, src, dst)
        + body
    )


# -- A: Wireshark's own RRoCE dissector --------------------------------------------------------------------
def test_builtin_rroce_dissector(
    tshark_env: dict[str, str], capture: Path, conversation: list[ExampleFrame]
) -> None:
    fields = ["frame.protocols", "infiniband.bth.destqp", "infiniband.bth.psn", "ipv6.routing.type",
              "ipv6.routing.srh.addr"]  # fmt: skip
    rows = tshark_fields(tshark_env, capture, fields)
    assert len(rows) == len(conversation)
    for row, e in zip(rows, conversation, strict=True):
        assert "infiniband" in row["frame.protocols"].split(":"), (e.description, row)
        assert as_int(row["infiniband.bth.destqp"]) == e.packet.bth.dest_qp, e.description
        assert as_int(row["infiniband.bth.psn"]) == e.packet.bth.psn, e.description
        if e.srv6 is not None and e.srv6.segments:
            assert as_int(row["ipv6.routing.type"]) == 4, e.description
            seg = row["ipv6.routing.srh.addr"].split(",")[0]
            assert ipaddress.ip_address(seg) == ipaddress.ip_address(e.srv6.segments[0]), e.description
        else:
            assert row["ipv6.routing.type"] == "", e.description


# -- B: mrc.lua, every field of every header ----------------------------------------------------------------
def test_dissector_path_is_packaged() -> None:
    assert DISSECTOR_PATH.name == "mrc.lua"
    assert DISSECTOR_PATH.is_file()
    assert 'Proto("mrc"' in DISSECTOR_PATH.read_text()


def test_lua_dissector_every_field(
    tshark_env: dict[str, str], capture: Path, conversation: list[ExampleFrame]
) -> None:
    fields = ["frame.protocols", "_ws.col.Info", "_ws.expert.message", *ALL_FIELDS, "mrc.icrc", "mrc.payload"]
    rows = tshark_fields(tshark_env, capture, fields, lua=True)
    assert len(rows) == len(conversation)
    for row, e in zip(rows, conversation, strict=True):
        pkt: Packet = e.packet
        what = e.description
        assert row["frame.protocols"].endswith(":udp:mrc"), (what, row["frame.protocols"])
        assert row["_ws.expert.message"] == "", (what, row["_ws.expert.message"])
        for hdr, (attr, _cls) in HEADERS.items():
            header = getattr(pkt, attr)
            for py_name, ts_name in header_fields(hdr):
                got = row[ts_name]
                if header is None:
                    assert got == "", f"{what}: {ts_name} should be absent, got {got!r}"
                    continue
                assert got != "", f"{what}: {ts_name} missing"
                want = int(getattr(header, py_name))
                assert as_int(got) == want, f"{what}: {ts_name} = {got!r}, expected {want:#x} ({want})"
        assert as_int(row["mrc.icrc"]) == pkt.icrc, what
        assert row["mrc.payload"].replace(":", "") == bytes(pkt.payload).hex(), what
        assert row["_ws.col.Info"].startswith("MRC "), row["_ws.col.Info"]

    info = [r["_ws.col.Info"] for r in rows]
    assert info[0].startswith("MRC WRITE_ONLY QP=0x000456 PSN=100")
    assert info[1].startswith("MRC SACK cack=101")
    assert info[5].startswith("MRC NACK TRIMMED psn=102")


# -- C: the mrc.udp_port preference ------------------------------------------------------------------------
def test_udp_port_preference(
    tshark_env: dict[str, str], capture: Path, conversation: list[ExampleFrame], tmp_path: Path
) -> None:
    moved = tmp_path / "port4971.pcap"
    frames = [
        encapsulate(e.packet, src=e.src, dst=e.dst, sport=e.sport, dport=4971, srv6=e.srv6, ether=True)
        for e in conversation
    ]
    write_pcap(moved, [(e.ts_ns, f) for e, f in zip(conversation, frames, strict=True)])
    fields = ["frame.protocols", "mrc.bth.psn"]
    rows = tshark_fields(tshark_env, moved, fields, "-o", "mrc.udp_port:4971", lua=True)
    assert [as_int(r["mrc.bth.psn"]) for r in rows] == [e.packet.bth.psn for e in conversation]
    # Without the preference nothing decodes port 4971 as MRC ...
    rows = tshark_fields(tshark_env, moved, fields, lua=True)
    assert all(r["mrc.bth.psn"] == "" for r in rows)
    # ... and moving MRC away from 4791 gives that port back to the built-in RRoCE dissector.
    rows = tshark_fields(tshark_env, capture, fields, "-o", "mrc.udp_port:4971", lua=True)
    assert all(r["mrc.bth.psn"] == "" and "infiniband" in r["frame.protocols"] for r in rows)


# -- D: truncated and garbage input never breaks the dissector ---------------------------------------------
def test_truncated_and_garbage_frames(
    tshark_env: dict[str, str], conversation: list[ExampleFrame], tmp_path: Path
) -> None:
    rng = random.Random(4791)
    frames: list[bytes] = []
    short: list[tuple[int, int]] = []  # (frame index, cut) of MRC packets cut inside their headers/ICRC
    for e in conversation:
        raw = e.packet.encode()
        full = e.packet.header_size() + 4
        cuts = sorted({*range(1, min(len(raw), full + 8)), len(raw) - 5, len(raw) - 1})
        for cut in cuts:
            if cut < full:
                short.append((len(frames), cut))
            frames.append(udp_frame(raw[:cut]))
        # Ethernet frames cut anywhere (IP/UDP lengths then exceed what is there).
        frames += [e.frame[:cut] for cut in (14, 30, 42, 50, 62, 70, 90, len(e.frame) - 3)]
    # Every opcode value followed by random bytes, then fully random UDP payloads.
    for op in range(256):
        frames.append(udp_frame(bytes([op]) + rng.randbytes(rng.randrange(0, 64))))
    frames += [udp_frame(rng.randbytes(rng.randrange(1, 96))) for _ in range(200)]
    bad = tmp_path / "bad.pcap"
    write_pcap(bad, [(1000 * (i + 1), f) for i, f in enumerate(frames)])

    # A capture with a small snap length: UDP payloads whose end (and ICRC) was not captured.
    snapped = tmp_path / "snapped.pcap"
    with open(snapped, "wb") as fh:
        w = PcapWriter(fh, snaplen=80)
        for e in conversation:
            w.write(e.frame, e.ts_ns)

    fields = ["frame.protocols", "_ws.expert.message", "mrc.bth.opcode"]
    rows = tshark_fields(tshark_env, bad, fields, lua=True)
    assert len(rows) == len(frames)
    for row in rows:
        assert "internal error" not in row["_ws.expert.message"], row
    for i, cut in short:
        msg = rows[i]["_ws.expert.message"]
        assert rows[i]["frame.protocols"].endswith(":mrc"), (cut, rows[i])
        assert "Truncated" in msg or "shorter than BTH" in msg, (cut, msg)
    for row in tshark_fields(tshark_env, snapped, fields, lua=True):
        assert "internal error" not in row["_ws.expert.message"], row


# -- E: the dissector verifies the ICRC ----------------------------------------------------------------------
def test_icrc_status(tshark_env: dict[str, str], conversation: list[ExampleFrame], tmp_path: Path) -> None:
    """Every example packet (IPv4, IPv6, SRv6 with and without an SRH) checks out; one changed byte of the
    payload, of the BTH or of an ICRC-covered IP field turns it Bad with the right ICRC shown, a changed
    variant field (hop limit, flow label) does not; the preference turns verification off."""
    ipv6 = next(e for e in conversation if e.srv6 is None and ":" in e.src and e.packet.payload)
    ipv4 = next(e for e in conversation if "." in e.src)
    ip_at = 14 + (40 if ipv6.srv6 else 0)
    changed: list[tuple[bytes, bool]] = []  # (frame, ICRC still good)
    for at, good in (
        (len(ipv6.frame) - 10, False),  # payload
        (ip_at + 40 + 8 + 7, False),  # BTH PSN
        (ip_at + 39, False),  # last byte of the destination address
        (ip_at + 7, True),  # hop limit: variant
        (ip_at + 3, True),  # flow label: variant
        (ip_at + 40 + 8 + 4, True),  # BTH byte 4 (FECN, BECN): variant
    ):
        f = bytearray(ipv6.frame)
        f[at] ^= 0x01
        changed.append((bytes(f), good))
    f = bytearray(ipv4.frame)
    f[14 + 16] ^= 0x01  # IPv4 destination address, with the header checksum made right again
    f[24:26] = b"\x00\x00"
    f[24:26] = internet_checksum(f[14:34]).to_bytes(2, "big")
    changed.append((bytes(f), False))
    path = tmp_path / "icrc.pcap"
    frames = [e.frame for e in conversation] + [f for f, _ in changed]
    write_pcap(path, [(i, f) for i, f in enumerate(frames)])
    fields = ["mrc.icrc.status", "mrc.icrc", "mrc.icrc.computed", "_ws.expert.message"]
    rows = tshark_fields(tshark_env, path, fields, lua=True)
    assert [r["mrc.icrc.status"] for r in rows[: len(conversation)]] == ["1"] * len(conversation)
    for row, (frame, good) in zip(rows[len(conversation) :], changed, strict=True):
        want = parse_frame(frame, ether=True, check_icrc=False, check_udp=False)
        assert want.icrc_ok == good  # the Python side agrees on which changes matter
        assert row["mrc.icrc.status"] == ("1" if good else "0"), row
        if not good:
            trailer = int.from_bytes(frame[-4:], "little")
            assert as_int(row["mrc.icrc"]) == trailer != as_int(row["mrc.icrc.computed"])
            assert "Bad ICRC" in row["_ws.expert.message"]
    rows = tshark_fields(tshark_env, path, fields, "-o", "mrc.check_icrc:FALSE", lua=True)
    assert {r["mrc.icrc.status"] for r in rows} == {"2"}


# -- F: [openmrc] authenticated packets: S, the security trailer ---------------------------------------------
def test_sealed_packets_show_their_security_trailer(tshark_env: dict[str, str], tmp_path: Path) -> None:
    """Packets of an authenticated transfer (data, trimmed data, SACKs; payloads encrypted): S set, SECH's
    fields as sealed, the payload without the trailer, the ICRC good."""
    from openmrc.provider.loopback import Pair
    from openmrc.transport import QpSecurity, SecurityDomain
    from openmrc.wire import trim_datagram
    from openmrc.wire.security import unpack_sech

    dom = SecurityDomain(77, bytes(range(32)), epoch=5)
    sec = QpSecurity(dom, encrypt=True, header_tag=True)
    p = Pair(seed=2, wire=True, security=(sec, sec))
    p.b.secure[p.qp_b.qp_num].wants_header_tag = True  # (as after a trimmed packet without a header tag)
    sent: list[bytes] = []
    p.fabric.observers.append(lambda dst, obj, port, now, kw: sent.append(bytes(obj)))  # type: ignore[arg-type]
    p.write(0, 3 * 4096 + 100)
    p.run(lambda: len(p.qp_a.send_cq) >= 1)
    data = [x for x in sent if 0xC6 <= x[0] <= 0xCB]
    sacks = [x for x in sent if x[0] == 0xDC]
    assert data and sacks
    packets = [*data, trim_datagram(data[0]), sacks[0]]
    frames = [encapsulate(x, src="2001:db8::a", dst="2001:db8::b", sport=0xC000, ether=True) for x in packets]
    path = tmp_path / "sealed.pcap"
    write_pcap(path, [(i, f) for i, f in enumerate(frames)])
    fields = [
        "mrc.bth.sealed",
        "mrc.sech.encrypted",
        "mrc.sech.epoch",
        "mrc.sech.sdi",
        "mrc.sech.counter",
        "mrc.sech.header_tag",
        "mrc.sech.wants_header_tag",
        "mrc.payload",
        "mrc.icrc.status",
        "_ws.expert.message",
    ]
    rows = tshark_fields(tshark_env, path, fields, lua=True)
    assert len(rows) == len(packets)
    for raw, row in zip(packets, rows, strict=True):
        is_data = 0xC6 <= raw[0] <= 0xCB
        h = unpack_sech(raw[-36:-20])  # (SECH and the tag: the last 32 bytes before the ICRC)
        assert h.header_tag == is_data
        assert as_int(row["mrc.bth.sealed"]) == 1 and as_int(row["mrc.sech.encrypted"]) == 1, row
        assert (as_int(row["mrc.sech.epoch"]), as_int(row["mrc.sech.sdi"])) == (5, 77)
        assert as_int(row["mrc.sech.counter"]) == h.counter
        assert bool(row["mrc.sech.header_tag"]) == is_data
        assert h.wants_header_tag == (raw[0] == 0xDC) == (as_int(row["mrc.sech.wants_header_tag"]) == 1), row
        assert "internal error" not in row["_ws.expert.message"]
    for raw, row in zip(data, rows, strict=False):
        n = len(raw) - 4 - 48 - 32  # BTH, METH and RETH before the payload (no pad: whole words)
        assert len(row["mrc.payload"].replace(":", "")) == 2 * n, row
        assert row["mrc.icrc.status"] == "1"
