"""The openmrc command line: pcap, decode, wireshark-plugin, the tour and the demo."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import click
import pytest
import typer
from typer.testing import CliRunner

from openmrc.cli import main as cli_main
from openmrc.cli.main import app
from openmrc.wire import parse_frame
from openmrc.wire.examples import example_conversation
from openmrc.wire.pcap import LINKTYPE_ETHERNET, read_pcap

runner = CliRunner()


def test_pcap_writes_the_example_conversation(tmp_path: Path) -> None:
    out = tmp_path / "mrc.pcap"
    res = runner.invoke(app, ["pcap", str(out)])
    assert res.exit_code == 0, res.output
    linktype, records = read_pcap(out)
    examples = example_conversation()
    assert linktype == LINKTYPE_ETHERNET
    assert [ts for ts, _ in records] == [e.ts_ns for e in examples]
    assert [parse_frame(f, ether=True).packet for _, f in records] == [e.packet for e in examples]


def test_pcap_on_another_port(tmp_path: Path) -> None:
    out = tmp_path / "mrc.pcap"
    assert runner.invoke(app, ["pcap", str(out), "--port", "4971"]).exit_code == 0
    _, records = read_pcap(out)
    frames = [parse_frame(f, ether=True, udp_port=4971) for _, f in records]
    assert {f.dport for f in frames} == {4971}
    # Same packets; only the ICRC differs, since it covers the UDP header.
    assert [f.packet.encode_headers() for f in frames] == [
        e.packet.encode_headers() for e in example_conversation()
    ]
    assert all(f.icrc_ok for f in frames)


def test_decode_payload_and_frame() -> None:
    ex = example_conversation()[0]
    res = runner.invoke(app, ["decode", ex.packet.encode().hex()])
    assert res.exit_code == 0, res.output
    assert "WRITE_ONLY" in res.output and "psn=100" in res.output
    res = runner.invoke(app, ["decode", "--frame", ex.frame.hex()])
    assert res.exit_code == 0 and "192.0.2.1" in res.output


def test_decode_reports_malformed_input() -> None:
    res = runner.invoke(app, ["decode", "c0ffee"])
    assert res.exit_code == 2
    assert "malformed" in res.output and "BTH" in res.output
    assert runner.invoke(app, ["decode", "zz"]).exit_code != 0


def test_wireshark_plugin_path_exists() -> None:
    res = runner.invoke(app, ["wireshark-plugin"])
    assert res.exit_code == 0
    path = Path(res.output.strip())
    assert path.name == "mrc.lua" and path.is_file()
    assert 'Proto("mrc"' in path.read_text()


def test_tour_runs() -> None:
    res = runner.invoke(app, ["tour"])
    assert res.exit_code == 0, res.output
    assert "WRITE_ONLY" in res.output and "fc00:0:1" in res.output


def test_demo_runs_small(tmp_path: Path) -> None:
    """The demo's scenario shrunk: both transports, with and without the failure, finish every flow, the link
    failure is reported, and the plots are written."""
    small = ["fabric.hosts=16", "fabric.planes=2", "fabric.t0_radix=8", "fabric.t1_radix=8"]
    small += ["workload.size_kib=128", "failures.0.at_us=20"]
    args = ["demo", "--out", str(tmp_path)]
    for s in small:
        args += ["--set", s]
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    assert "MRC" in res.output and "RoCEv2 + ECMP" in res.output and "down at 20 µs" in res.output
    assert (tmp_path / "timeline.png").stat().st_size > 10_000
    data = json.loads((tmp_path / "results.json").read_text())
    flows = [r["flows"] for r in data["runs"]]
    assert [r["completed"] for r in data["runs"]] == flows and len(flows) == 4 and flows[0] > 0


def test_an_interrupted_testbed_command_says_so_and_exits_130(capsys: pytest.CaptureFixture[str]) -> None:
    from openmrc.cli.testbed import _do

    def interrupted() -> None:
        raise KeyboardInterrupt

    with pytest.raises(typer.Exit) as exc:
        _do("testbed up", interrupted, undone="what it had made is removed")
    assert exc.value.exit_code == 130
    assert "interrupted: testbed up (what it had made is removed)" in capsys.readouterr().err  # diagnostics


@pytest.mark.parametrize(
    ("locator", "reason"), [("zz", "'zz' is not a hexadecimal number"), ("100000000", "a locator is 32 bits")]
)
def test_topo_plan_names_a_bad_locator(locator: str, reason: str) -> None:
    res = runner.invoke(app, ["topo", "plan", "--hosts", "64", "--locator", locator], terminal_width=200)
    assert res.exit_code == 2 and "--locator" in res.output and reason in res.output, res.output
    assert "Traceback" not in res.output


class _Exited(Exception):
    pass


@pytest.mark.parametrize(
    ("argv", "code", "said"),
    [
        (["version"], 0, "0."),
        (["sim", "run", "no-such-scenario"], 2, "no scenario 'no-such-scenario'"),
        (["sim", "run", "missing.toml"], 2, "scenario file 'missing.toml' not found"),
        (["perf", "client", "127.0.0.1", "--link-gbps", "0"], 2, "--link-gbps 0: a port rate in"),
        (["perf", "client", "127.0.0.1", "--link-gbps", "nan"], 2, "--link-gbps nan"),
        (["perf", "server", "--link-gbps", "1e9"], 2, "--link-gbps 1e+09"),
        (["perf", "server", "--link-gbps", "-3"], 2, "--link-gbps -3"),
        (["sim", "run", "demo", "--pcap-flows", "0"], 2, "give --pcap"),
        (
            ["topo", "plan", "--hosts", "64", "--out", str(Path(__file__).parents[1] / "README.md")],
            2,
            "not a dir",
        ),
        (["--no-such-option"], 2, "No such option"),
    ],
)
def test_the_console_entry_point_leaves_with_the_commands_exit_code(
    argv: list[str], code: int, said: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    codes: list[int] = []

    def exit_now(c: int) -> None:
        codes.append(c)
        raise _Exited

    monkeypatch.setattr(os, "_exit", exit_now)
    monkeypatch.setattr(sys, "argv", ["openmrc", *argv])
    with pytest.raises(_Exited):
        cli_main.run()
    assert codes == [code]
    out = capsys.readouterr()
    assert said in out.out + out.err


def _commands(
    group: click.Command, path: tuple[str, ...] = ()
) -> list[tuple[tuple[str, ...], click.Command]]:
    found = [(path, group)]
    for name, sub in getattr(group, "commands", {}).items():
        found += _commands(sub, (*path, name))
    return found


def _flat(text: str) -> str:
    return " ".join(text.replace("│", " ").split())


def test_help_keeps_every_square_bracket_it_was_written_with() -> None:
    """Help is rendered through rich markup, which takes `[word]` for a style and drops it: every bracketed
    part of every command's and option's help (`[sweep]`, `PLANE@TIME[+DURATION]`) shows in --help."""
    seen = 0
    for path, cmd in _commands(typer.main.get_command(app)):
        texts = [cmd.help or ""] + [
            getattr(p, a, None) or "" for p in cmd.params for a in ("help", "metavar")
        ]
        wanted = [_flat(m.replace("\\[", "[")) for t in texts for m in re.findall(r"\\?\[[^\]\n]*\]", t)]
        if not wanted:
            continue
        res = runner.invoke(app, [*path, "--help"], env={"COLUMNS": "200"})
        assert res.exit_code == 0, res.output
        for part in wanted:
            assert part in _flat(res.output), (path, part)
            seen += 1
    assert seen >= 4  # the check ran over the help that has brackets


def _run_piped(*argv: str) -> str:
    env = {**os.environ, "COLUMNS": "80"}
    res = subprocess.run(
        [sys.executable, "-m", "openmrc.cli.main", *argv],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    return res.stdout


def test_tables_stay_whole_in_a_pipe() -> None:
    """Piped at 80 columns, a table too wide to wrap at spaces is printed at its own width, every column and
    heading whole (no ellipsis, no column dropped), and the tour's tables fit 80 columns where they can."""
    wide = _run_piped("sim", "run", "clos-incast", "--wide")
    head = " ".join(wide.split())
    for word in (
        "run",
        "FCT p50",
        "FCT p99",
        "FCT max",
        "trims",
        "drops",
        "wall",
        "bottleneck",
        "clos-incast 7",
    ):
        assert word in head, word
    assert "…" not in wide
    tour = _run_piped("tour")
    assert "WRITE_LAST_WITH_IMM" in tour and "(retransmission)" in tour and "packets resent" not in tour
    transport = tour[tour.index("Transport: one QP") : tour.index("Four 100 Gb/s")].splitlines()[1:]
    assert max(len(line) for line in transport) <= 80
    transport = "\n".join(transport)
    assert "…" not in transport and "resent" in transport and "bad" in transport


def test_a_table_on_a_narrow_terminal_folds_rather_than_cuts() -> None:
    from rich.console import Console
    from rich.table import Table

    from openmrc.cli.render import print_table

    console = Console(width=40, force_terminal=True, color_system=None, record=True)
    t = Table("retransmissions", "a_long_identifier_name", "value")
    t.add_row("1234567890123", "0x123456789abcdef0123", "x")
    print_table(console, t)
    lines = console.export_text().splitlines()
    assert max(len(line) for line in lines) <= 40
    columns = ["", "", ""]
    for line in lines:
        cells = re.split("[│┃]", line)[1:-1]
        for i, cell in enumerate(cells):
            columns[i] += cell.strip()
    assert columns == [
        "retransmissions1234567890123",
        "a_long_identifier_name0x123456789abcdef0123",
        "valuex",
    ]
