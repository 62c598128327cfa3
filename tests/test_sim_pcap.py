"""Captures of simulated runs (`openmrc.sim.pcap`, ``openmrc sim run --pcap``): every frame a valid MRC frame
with its ICRC, simulated timestamps, the chosen flows only, and a failure's retransmissions in the trace."""

from __future__ import annotations

import io
import ipaddress
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from openmrc.cli.main import app
from openmrc.contrib.wireshark import DISSECTOR_PATH
from openmrc.sim import workloads
from openmrc.sim.config import FabricSimConfig
from openmrc.sim.fabric_sim import FabricSim
from openmrc.sim.flows import Flow
from openmrc.sim.network import Host
from openmrc.sim.pcap import SimCapture, host_address, parse_capture_point, parse_flow_ids
from openmrc.wire import WireError, parse_frame
from openmrc.wire.constants import is_data_opcode
from openmrc.wire.framing import Frame
from openmrc.wire.icrc import compute_icrc
from openmrc.wire.pcap import LINKTYPE_ETHERNET, read_pcap

FAIL_AT = 5_000
SMALL = dict(planes=2, hosts=16, t0_radix=8, t1_radix=8)
runner = CliRunner()


def flat(output: str) -> str:
    """CLI output as one line of words (rich wraps long lines, and error messages inside a box)."""
    return " ".join(output.replace("│", " ").split())


def failing_run(tmp_path: Path, **capture: object) -> tuple[FabricSim, list[Flow], list[tuple[int, Frame]]]:
    """A 16-host permutation of 256 KiB whose plane-0 T0-T1 link above host 0 fails at 5 µs, captured."""
    sim = FabricSim.clos(FabricSimConfig(**SMALL))  # type: ignore[arg-type]
    flows = workloads.permutation(sim, 256 << 10, seed=2)
    node, port = sim.faults.t0_uplink(0, 0, 0)
    sim.faults.fail_link(node, port, FAIL_AT)
    path = tmp_path / "run.pcap"
    with open(path, "wb") as f:
        cap = SimCapture(sim, f, **capture)  # type: ignore[arg-type]
        sim.run(until=10_000_000)
        cap.detach()
    linktype, records = read_pcap(path)
    assert linktype == LINKTYPE_ETHERNET
    assert cap.packets == len(records)
    return sim, flows, [(ts, parse_frame(frame, ether=True)) for ts, frame in records]  # checks every ICRC


def is_rtx_data(fr: Frame) -> bool:
    return is_data_opcode(fr.packet.bth.opcode) and fr.packet.bth.rtx


def test_every_packet_once_at_its_sender(tmp_path: Path) -> None:
    sim, flows, frames = failing_run(tmp_path)
    assert all(f.finish is not None for f in flows)
    stamps = [ts for ts, _ in frames]
    assert stamps == sorted(stamps) and stamps[0] >= 0 and stamps[-1] <= sim.sim.now
    assert stamps[0] == min(f.start or 0 for f in flows)
    nics = [n.nic for n in sim.nodes[: sim.topo.num_hosts] if isinstance(n, Host)]
    sent = sum(n.stats.tx_packets for n in nics)
    assert len(frames) == sent
    # the failure's recovery, packet by packet: retransmissions, all after the link went down
    rtx = [ts for ts, fr in frames if is_rtx_data(fr)]
    assert len(rtx) == sum(n.stats.retransmits for n in nics) > 0
    assert min(rtx) > FAIL_AT
    data = [fr for _, fr in frames if is_data_opcode(fr.packet.bth.opcode)]
    assert sum(len(fr.packet.payload) for fr in data if not fr.packet.bth.rtx) == sum(f.size for f in flows)
    for fr in data:  # SRv6 uSID paths, the EV's entropy in source port and flow label
        assert fr.srv6 is not None and sim.plan is not None
        assert int(ipaddress.IPv6Address(fr.srv6.dst)) >> 96 == sim.plan.locator
        assert fr.srv6.src == fr.src and fr.dport == 4791 and fr.ecn == 2


def test_chosen_flows_only(tmp_path: Path) -> None:
    _sim, flows, frames = failing_run(tmp_path, flows=[0, 3])
    chosen = [flows[0], flows[3]]
    ends = {host_address(h, p) for f in chosen for h in (f.src, f.dst) for p in (1, 2)}
    assert frames and all(fr.src in ends and fr.dst in ends for _, fr in frames)
    for f in chosen:
        assert f.qp is not None
        to_dst = [fr for _, fr in frames if fr.packet.bth.dest_qp == f.qp.attr.dest_qp_num]
        acks = [fr for _, fr in frames if fr.packet.bth.dest_qp == f.qp.qp_num]
        assert sum(len(fr.packet.payload) for fr in to_dst if not fr.packet.bth.rtx) == f.size
        assert acks and all(fr.packet.seth is not None for fr in acks)


def test_a_capture_point_sees_both_directions_of_one_port(tmp_path: Path) -> None:
    sim, _flows, frames = failing_run(tmp_path, at=(0, 2))
    me = host_address(0, 2)
    out = [fr for _, fr in frames if fr.src == me]
    into = [fr for _, fr in frames if fr.dst == me]
    assert out and into and len(out) + len(into) == len(frames)
    received_data = [fr for fr in into if is_data_opcode(fr.packet.bth.opcode)]
    assert received_data  # host 0 is some flow's receiver
    # on arrival the switches have shifted the uSID path down to the host's own uSID
    assert sim.plan is not None
    for fr in received_data:
        assert fr.srv6 is not None
        usids = int(ipaddress.IPv6Address(fr.srv6.dst)) >> 80 & 0xFFFF
        assert usids == sim.plan.host_usid(0, 1)


def test_an_authenticated_run_is_captured_sealed_and_every_packet_verifies(tmp_path: Path) -> None:
    """**[openmrc]** ``[fabric] security = "auth"``: each frame is the sealed packet that crossed the wire (S
    set, its security trailer; a trimmed one its headers and trailer), and `openmrc decode` with the run's
    key verifies every one, each flow's under its QP: an incast seen at its receiver, full buffers trim."""
    sim = FabricSim.clos(FabricSimConfig(**SMALL, security="auth"))  # type: ignore[arg-type]
    flows = [sim.add_flow(s, 0, 64_000) for s in range(1, 9)]
    path = tmp_path / "auth.pcap"
    with open(path, "wb") as f:
        cap = SimCapture(sim, f, at=(0, None))
        sim.run(until=10**9)
        cap.detach()
    assert all(fl.finish is not None for fl in flows)
    _, records = read_pcap(path)
    for _, frame in records:
        try:
            fr = parse_frame(frame, ether=True)
        except WireError:
            fr = parse_frame(frame, ether=True, trimmed=True)
        assert fr.sealed is not None and len(fr.sealed) in (32, 48)  # (48: with a header tag)
    qp = flows[0].qp
    assert qp is not None and qp.attr.security is not None
    key = tmp_path / "domain.key"
    key.write_text(qp.attr.security.domain.spec())
    key.chmod(0o600)
    verified = trimmed = 0
    for fl in flows:
        assert fl.qp is not None
        res = runner.invoke(
            app, ["decode", "--pcap", str(path), "--key", str(key), "--src-qpn", hex(fl.qp.qp_num)]
        )
        assert res.exit_code == 0 and "do NOT verify" not in res.output, res.output
        verified += res.output.count("tags verify")
        trimmed += res.output.count("header tag verifies (trimmed packet)")
    assert verified + trimmed == len(records) and trimmed > 0


def test_capture_errors() -> None:
    sim = FabricSim.clos(FabricSimConfig(**SMALL))  # type: ignore[arg-type]
    workloads.permutation(sim, 4096)
    with pytest.raises(ValueError, match="flow 99"):
        SimCapture(sim, io.BytesIO(), flows=[99])
    with pytest.raises(ValueError, match="host 16"):
        SimCapture(sim, io.BytesIO(), at=(16, None))
    with pytest.raises(ValueError, match=r"NIC ports 1\.\.2"):
        SimCapture(sim, io.BytesIO(), at=(0, 3))
    roce = FabricSim.clos(FabricSimConfig(**SMALL, transport="roce", routing="ecmp"))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="RoCEv2"):
        SimCapture(roce, io.BytesIO())
    assert all(n.tap is None for n in sim.nodes[:16] if isinstance(n, Host))


def test_option_parsing() -> None:
    assert parse_flow_ids("0, 5,12") == [0, 5, 12]
    assert parse_capture_point("3:2") == (3, 2) and parse_capture_point("7") == (7, None)
    for bad in ("", "1,,2", "-1", "a"):
        with pytest.raises(ValueError):
            parse_flow_ids(bad)
    for bad in ("", "3:", "3:0", "x:1", ":1"):
        with pytest.raises(ValueError):
            parse_capture_point(bad)


# -- the command line ------------------------------------------------------------------------------------
SCENARIO = [
    "sim",
    "run",
    "link-failure",
    *("--set", "fabric.hosts=16", "--set", "fabric.planes=2"),
    *("--set", "fabric.t0_radix=8", "--set", "fabric.t1_radix=8"),
    *("--set", "workload.size_kib=256", "--set", f"failures.0.at_us={FAIL_AT // 1000}"),
]
ONE_RUN = [*SCENARIO, "--set", 'variants=[{name="MRC"}]']


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--pcap", "{tmp}/no/such/dir/x.pcap"], "does not exist"),
        (["--pcap", "{tmp}"], "is a directory"),
        (["--pcap", "{tmp}/x.pcap", "--pcap-flows", "0,x"], "flow ids"),
        (["--pcap", "{tmp}/x.pcap", "--pcap-port", "1:0"], "HOST or HOST:PORT"),
        (["--pcap", "{tmp}/x.pcap", "--pcap-flows", "500"], "flow 500"),
        (["--pcap", "{tmp}/x.pcap", "--pcap-port", "99"], "host 99"),
    ],
)
def test_cli_refuses_before_running(tmp_path: Path, extra: list[str], message: str) -> None:
    res = runner.invoke(app, [*ONE_RUN, *(a.replace("{tmp}", str(tmp_path)) for a in extra)])
    assert res.exit_code == 2, res.output
    assert message in flat(res.output) and "Traceback" not in res.output
    assert "job µs" not in res.output  # nothing ran
    assert not (tmp_path / "x.pcap").exists()


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes anywhere")
def test_cli_refuses_an_unwritable_directory(tmp_path: Path) -> None:
    ro = tmp_path / "ro"
    ro.mkdir(mode=0o500)
    res = runner.invoke(app, [*ONE_RUN, "--pcap", str(ro / "x.pcap")])
    assert res.exit_code == 2 and "cannot write" in res.output


def test_cli_one_file_per_mrc_run(tmp_path: Path) -> None:
    res = runner.invoke(app, [*SCENARIO, "--pcap", str(tmp_path / "lf.pcap"), "--pcap-flows", "0"])
    assert res.exit_code == 0, res.output
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["lf-mrc-nic-port.pcap", "lf-mrc-t0-t1-link.pcap"]
    assert "no capture of 'RoCEv2 + ECMP, T0-T1 link'" in res.output
    for name in names:
        _, records = read_pcap(tmp_path / name)
        assert f"wrote {len(records):,} packets to {tmp_path / name}" in flat(res.output)


# -- tshark and the shipped dissector --------------------------------------------------------------------
TSHARK = shutil.which("tshark")


@pytest.mark.skipif(TSHARK is None, reason="tshark is not installed (apt-get install tshark)")
def test_tshark_decodes_a_simulated_failure(tmp_path: Path) -> None:
    path = tmp_path / "lf.pcap"
    res = runner.invoke(app, [*ONE_RUN, "--pcap", str(path)])
    assert res.exit_code == 0, res.output
    _, records = read_pcap(path)
    home = tmp_path / "home"
    env = {**os.environ, "HOME": str(home), "XDG_CONFIG_HOME": str(home / ".config")}
    fields = ["frame.time_epoch", "frame.protocols", "mrc.bth.psn", "mrc.bth.rtx", "mrc.icrc", "udp.dstport"]
    cmd = [str(TSHARK), "-n", "-X", f"lua_script:{DISSECTOR_PATH}", "-r", str(path), "-T", "fields"]
    cmd += ["-E", "separator=/t", "-E", "occurrence=l", *(a for f in fields for a in ("-e", f))]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env, check=False)
    assert proc.returncode == 0, proc.stderr
    rows = [dict(zip(fields, line.split("\t"), strict=True)) for line in proc.stdout.splitlines()]
    assert len(rows) == len(records) > 0
    rtx_times = []
    for row, (ts, frame) in zip(rows, records, strict=True):
        assert row["frame.protocols"].endswith(":mrc"), row
        sec, _, frac = row["frame.time_epoch"].partition(".")
        assert int(sec) * 10**9 + int(frac.ljust(9, "0")[:9]) == ts  # the simulated nanosecond
        # the ICRC tshark shows is the one the inner IP packet calls for
        fr = parse_frame(frame, ether=True, check_icrc=False)
        inner = frame[-(8 + 40 + len(fr.packet.encode())) : -4]
        assert int(row["mrc.icrc"], 16) == fr.packet.icrc == compute_icrc(inner)
        if row["mrc.bth.rtx"] in ("1", "True"):
            rtx_times.append(ts)
    assert rtx_times and min(rtx_times) > FAIL_AT
