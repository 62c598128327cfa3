"""`openmrc sim run` and `openmrc pcap` at their edges: Ctrl-C in the middle of a run (a real SIGINT to a
subprocess of this build, compiled or interpreted as the suite runs), and output paths that cannot be written,
refused before anything runs."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from openmrc.cli.main import app
from openmrc.testbed.experiment import openmrc_argv

runner = CliRunner()


def flat(text: str) -> str:
    """Rich's error box folded back into one line of words."""
    return " ".join(text.replace("│", " ").split())


# two variants: the first over in a moment, the second long enough (64 MiB per host) to be interrupted
TWO_VARIANTS = """
name = "interrupt-me"
description = "a short variant, then a long one"
until_us = 100000

[fabric]
planes = 2
hosts = 16
t0_radix = 8
t1_radix = 8
link_gbps = 100
latency_ns = 1000
trimming = true
evs_per_qp = 16

[workload]
kind = "permutation"
size_kib = 64
seed = 1

[[variants]]
name = "short"

[[variants]]
name = "long"
set = ["workload.size_kib=262144"]
"""


def _start(tmp_path: Path, scenario: str, out: Path) -> subprocess.Popen[str]:
    """``openmrc sim run`` of ``scenario`` (TOML text) with ``--out out``, in a subprocess."""
    toml = tmp_path / "s.toml"
    toml.write_text(scenario)
    return subprocess.Popen(
        [*openmrc_argv(), "sim", "run", str(toml), "--out", str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def test_ctrl_c_stops_the_run_cleanly_and_keeps_the_finished_variants(tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = _start(tmp_path, TWO_VARIANTS, out)
    assert proc.stdout is not None
    lines = []
    end = time.monotonic() + 120
    while time.monotonic() < end:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        if line.startswith("finished short"):
            break
    assert lines and lines[-1].startswith("finished short (1 of 2)"), "".join(lines)
    time.sleep(0.5)  # inside the long variant's simulation (compiled code, in the compiled build)
    proc.send_signal(signal.SIGINT)
    rest, _ = proc.communicate(timeout=60)
    text = "".join(lines) + rest
    assert proc.returncode == 130, text
    assert "fatal" not in text and "Traceback" not in text
    assert (
        "interrupted in variant 'long'" in text
        or "interrupted while building" in text
        or ("interrupted after variant 'short'" in text)
    ), text
    assert "1 of 2 variant(s) had finished" in text
    doc = json.loads((out / "results.json").read_text())
    assert [r["label"] for r in doc["runs"]] == ["short"] and "1 of 2" in doc["interrupted"]
    run = doc["runs"][0]
    assert run["completed"] == run["flows"] > 0  # the finished variant's results are whole
    assert (out / "short.flows.csv").is_file() and (out / "fct_cdf.png").stat().st_size > 10_000


def test_ctrl_c_before_anything_finished_leaves_no_empty_output(tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = _start(tmp_path, TWO_VARIANTS.replace("size_kib = 64", "size_kib = 262144"), out)
    time.sleep(4)
    proc.send_signal(signal.SIGINT)
    text, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "0 of 2 variant(s) had finished" in text, text
    assert "fatal" not in text and "Traceback" not in text
    assert not out.exists()  # made for the run, nothing to put in it


@pytest.mark.parametrize(
    ("where", "reason"),
    [
        ("afile", "exists and is not a directory"),
        ("/proc/openmrc-out", "cannot write to /proc/openmrc-out"),
        ("/dev/null/out", "Not a directory"),
    ],
)
def test_an_output_that_cannot_be_written_is_refused_before_the_run(
    tmp_path: Path, where: str, reason: str
) -> None:
    target = tmp_path / where if not where.startswith("/") else Path(where)
    if where == "afile":
        target.write_text("x")
    t0 = time.monotonic()
    for cmd in (["sim", "run", "clos-perm"], ["demo"]):
        res = runner.invoke(app, [*cmd, "--out", str(target)], terminal_width=200)
        assert res.exit_code == 2, res.output
        assert "--out" in flat(res.output) and reason in flat(res.output) and "Traceback" not in res.output
        assert "FCT" not in res.output  # no table: nothing ran
    assert time.monotonic() - t0 < 20


def test_pcap_refuses_paths_and_ports_it_cannot_use(tmp_path: Path) -> None:
    cases = [
        ([str(tmp_path / "missing" / "x.pcap")], 2, "does not exist"),
        ([str(tmp_path)], 2, "is a directory"),
        ([str(tmp_path / "x.pcap"), "--port", "70000"], 2, "--port"),
        ([str(tmp_path / "x.pcap"), "--port", "0"], 2, "--port"),
        (["/dev/full"], 1, "No space left on device"),
    ]
    for args, code, text in cases:
        res = runner.invoke(app, ["pcap", *args], terminal_width=200)
        assert res.exit_code == code, (args, res.output)
        assert text in flat(res.output) and "Traceback" not in res.output, res.output
    assert not (tmp_path / "x.pcap").exists()
