"""`openmrc sim run` and `openmrc pcap` at their edges: Ctrl-C in the middle of a run (a real SIGINT to a
subprocess of this build, compiled or interpreted as the suite runs), and output paths that cannot be written,
refused before anything runs."""

from __future__ import annotations

import csv
import io
import json
import os
import platform
import re
import signal
import subprocess
import time
import tomllib
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from openmrc import __version__, _native
from openmrc.cli.main import app
from openmrc.cli.sim import results_table
from openmrc.fabric.clos import MultiPlaneClos
from openmrc.sim.scenario import builtin_scenarios, load_scenario, run_scenario
from openmrc.sim.scenario_schema import markdown
from openmrc.testbed.experiment import openmrc_argv
from tests.sim_tools import lines_until
from tests.test_sim_scenarios import SMALL

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


def _start(tmp_path: Path, scenario: str, out: Path, *more: str) -> subprocess.Popen[str]:
    """``openmrc sim run`` of ``scenario`` (TOML text) with ``--out out``, in a subprocess of its own
    session (so that a Ctrl-C can go to its whole process group, as a terminal sends it)."""
    toml = tmp_path / "s.toml"
    toml.write_text(scenario)
    return subprocess.Popen(
        [*openmrc_argv(), "sim", "run", str(toml), "--out", str(out), *more],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def test_ctrl_c_stops_the_run_cleanly_and_keeps_the_finished_variants(tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = _start(tmp_path, TWO_VARIANTS, out)
    lines = lines_until(proc, "finished short")
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


@pytest.mark.skipif(not hasattr(os, "fork"), reason="--ranks forks its ranks")
def test_ctrl_c_stops_every_rank_of_a_split_run(tmp_path: Path) -> None:
    """A terminal's Ctrl-C reaches every process of the group: rank 0 stops, the forked ranks stop after
    the same window, and none is left behind waiting for the others."""
    out = tmp_path / "out"
    proc = _start(tmp_path, TWO_VARIANTS, out, "--ranks", "2")
    lines = lines_until(proc, "finished short")
    assert lines and lines[-1].startswith("finished short (1 of 2)"), "".join(lines)
    time.sleep(1)
    os.killpg(proc.pid, signal.SIGINT)
    rest, _ = proc.communicate(timeout=60)
    text = "".join(lines) + rest
    assert proc.returncode == 130, text
    assert "fatal" not in text and "Traceback" not in text
    assert "1 of 2 variant(s) had finished" in text and text.count("interrupt: stopping") == 1, text
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # the forked rank is gone too
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        pytest.fail("a rank outlived the run")
    assert (out / "short.flows.csv").is_file()


def test_ctrl_c_before_anything_finished_leaves_no_empty_output(tmp_path: Path) -> None:
    out = tmp_path / "out"
    # 4 GiB flows (less 1 KiB: a Write's length is 32-bit): the first variant runs to until_us (100 ms
    # simulated), far longer than the 4 s (256 MiB ones finished in 3.6 s on a quiet machine)
    proc = _start(tmp_path, TWO_VARIANTS.replace("size_kib = 64", "size_kib = 4194303"), out)
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


def _sets(overrides: list[str]) -> list[str]:
    return [a for o in overrides for a in ("--set", o)]


def test_json_prints_the_results_document_with_its_provenance() -> None:
    res = runner.invoke(app, ["sim", "run", "clos-perm", *_sets(SMALL), "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)  # nothing but the document on stdout: no table, no progress
    prov = doc["provenance"]
    assert prov["openmrc"] == __version__ and prov["python"] == platform.python_version()
    assert prov["build"] == ("compiled" if _native.compiled else "interpreted")
    assert prov["seeds"] == [1] and prov["wall_s"] > 0 and prov["started"][:2] == "20"
    assert prov["git_commit"] is None or len(prov["git_commit"].removesuffix("-dirty")) == 40
    assert doc["scenario"]["fabric"]["hosts"] == 16 and doc["scenario"]["fabric"]["mtu"] == 4096  # resolved
    (run,) = doc["runs"]
    assert (
        run["status"] == f"all {run['flows']} flows finished"
        and run["fct_over"] == f"all {run['flows']} flows"
    )


def test_seeds_and_a_variant_give_mean_and_spread_and_files_named_by_label(tmp_path: Path) -> None:
    over = [*SMALL, "workload.size_kib=256", "failures.0.plane=1"]
    args = ["sim", "run", "link-failure", *_sets(over), "--variant", "MRC, T0-T1 link", "--seeds", "2"]
    res = runner.invoke(app, [*args, "--seed", "7", "--out", str(tmp_path), "--quiet"])
    assert res.exit_code == 0, res.output
    assert "±" in res.output and "wrote" not in res.output and "finished MRC" not in res.output
    doc = json.loads((tmp_path / "results.json").read_text())
    assert [r["label"] for r in doc["runs"]] == ["MRC, T0-T1 link seed=7", "MRC, T0-T1 link seed=8"]
    assert doc["provenance"]["seeds"] == [7, 8]
    summary = doc["seeds_summary"]["MRC, T0-T1 link"]["max_fct_us"]
    fcts = [r["max_fct_us"] for r in doc["runs"]]
    assert summary["mean"] == sum(fcts) / 2 and summary["min"] == min(fcts) and summary["n"] == 2
    topo = MultiPlaneClos(2, 16, 8, 8, 100 * 10**9, 1000)
    for seed in (7, 8):
        links = list(csv.DictReader((tmp_path / f"mrc-t0-t1-link-seed-{seed}.links.csv").open()))
        assert links and all(r["node_name"] == topo.node_name(int(r["node"])) for r in links)
        assert all(r["peer_name"] == topo.node_name(int(r["peer"])) for r in links)
        failures = list(csv.DictReader((tmp_path / f"mrc-t0-t1-link-seed-{seed}.failures.csv").open()))
        t1 = topo.node_name(topo.ports(topo.t0(1, 0))[4].peer)
        assert (float(failures[0]["at_us"]), failures[0]["what"]) == (
            20.0,
            f"plane 1: T0 0 ↔ T1 {t1.rsplit('-', 1)[1]} link (p1-t0-0 ↔ {t1}) down",
        )
    assert doc["runs"][0]["failures"][0]["at_us"] == 20.0


def test_cli_errors_are_one_line_each_and_name_the_key() -> None:
    cases = [
        (["sim", "run", "clos-perm", "--set", "fabric.hosts=abc", "--set", "until_us=-5"], 2),
        (["sim", "run", "clos-perm", "--variant", "nope"], 1),
        (["sim", "run", "clos-perm", "--set", "fabric.link_bps=1"], 1),
        (["sim", "show", "nope"], 1),
    ]
    for args, lines in cases:
        res = runner.invoke(app, args)
        assert res.exit_code == 2, (args, res.output)
        out = res.output.strip().splitlines()
        assert len(out) == lines and all(line.startswith("error: ") for line in out), res.output
        assert "Traceback" not in res.output
    res = runner.invoke(app, cases[0][0])
    assert "error: fabric.hosts: expected an integer, got 'abc'" in res.output
    assert "error: until_us: must be > 0, got -5" in res.output


def test_show_scenarios_schema_and_version() -> None:
    shown = runner.invoke(app, ["sim", "show", "demo"])
    assert shown.exit_code == 0 and tomllib.loads(shown.output)["name"] == "demo"
    listing = runner.invoke(app, ["sim", "scenarios"], terminal_width=200)
    for name, path in builtin_scenarios().items():
        wall = tomllib.loads(path.read_text())["expected_wall_s"]
        row = next(line for line in listing.output.splitlines() if line.split()[:1] == [name])
        assert row.split()[1] == (f"{wall:,.0f}" if wall >= 10 else f"{wall:.1f}"), row
    assert runner.invoke(app, ["sim", "schema", "--markdown"]).output == markdown()
    schema = json.loads(runner.invoke(app, ["sim", "schema"]).output)
    assert "fabric" in schema["properties"] and schema["additionalProperties"] is False
    version = runner.invoke(app, ["--version"])
    assert version.exit_code == 0 and version.output.strip() == __version__


def test_an_incast_is_rated_against_its_receiver_not_its_senders() -> None:
    """htsim's incast, 15 senders into one 100G host: the figure is near 1 of what that host can take (over
    the 15 senders' line rate it read 6.5 %)."""
    got = subprocess.run(
        [*openmrc_argv(), "sim", "run", "htsim-incast-15", "--variant", "MRC 128 EVs", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert got.returncode == 0, got.stderr
    (run,) = json.loads(got.stdout)["runs"]
    assert run["bottleneck_gbps"] == 100 and run["flows"] == 15
    assert 0.9 < run["goodput_fraction"] <= 1
    assert run["goodput_fraction"] == pytest.approx(run["job_goodput_gbps"] / 100)


def test_each_failure_says_what_its_figures_measure() -> None:
    """link-failure, shrunk: the bypass time says over which connections (MRC: one per host pair with a
    path through the link; RoCEv2: the QPs hashed through it, of those pairs' QPs) and that MRC's 0 µs is
    none falling below 90 %; the NIC port's connections that only finished are not "back"; the goodput
    line names its windows, and the note says it is the whole job's."""
    sets = _sets([*SMALL, "workload.size_kib=512", "failures.0.at_us=10"])
    got = subprocess.run(
        [*openmrc_argv(), "sim", "run", "link-failure", "--quiet", *sets],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "400"},
    )
    assert got.returncode == 0 and not got.stderr, got.stderr
    lines = got.stdout.splitlines()
    mrc = lines.index("  MRC, T0-T1 link: plane 0: T0 0 ↔ T1 0 link (p0-t0-0 ↔ p0-t1-0) down at 10 µs")
    assert lines[mrc + 1].startswith(
        "    bypass time 0 µs: none of its 8 MRC connections (a QP per host pair"
    )
    assert "fell below 90 % of their goodput before it" in lines[mrc + 1]
    assert lines[mrc + 2].startswith("    last data packet into it: +")
    port = lines.index("  MRC, NIC port: host 5 NIC port 1 down at 20 µs")
    assert lines[port + 1].startswith("    bypass: not back: its 2 MRC connections")
    assert "until the last finished its flows, +" in lines[port + 1]
    roce = next(i for i, x in enumerate(lines) if x.startswith("  RoCEv2 + ECMP, T0-T1 link: plane 0"))
    qps = lines[roce + 1]
    assert (
        qps.startswith("    bypass time ")
        and " RoCEv2 QP" in qps
        and "hashed through it (of the 8 QPs" in qps
    )
    assert "of the 8 host pairs with a path through it" in qps
    goodput = next(x for x in lines[roce:] if x.startswith("    all flows "))
    assert re.fullmatch(
        r"    all flows [\d,]+ Gb/s over 5–10 µs → [\d,]+ Gb/s over [\d,]+–[\d,]+ µs", goodput
    )
    assert "(all flows: the whole job's goodput" in lines[-1] and "--set 'failures=[]'" in lines[-1]


def test_htsim_figures_are_printed_beside_ours_and_the_table_fits_80_columns() -> None:
    res = runner.invoke(app, ["sim", "run", "htsim-incast-15", "--variant", "MRC 128 EVs", "--quiet"])
    assert res.exit_code == 0, res.output
    line = next(x for x in res.output.splitlines() if "max_fct_us htsim" in x)
    ours = float(line.split("openmrc ")[1].split()[0].replace(",", ""))
    assert "2,478.5" in line and f"({ours / 2478.5:.2f}×)" in line
    assert "max_fct_us ideal 2,400.0" in res.output
    doc = load_scenario("paper-incast-victim", [*SMALL, "workload.senders=3"])
    runs = run_scenario(doc)
    narrow = Console(width=80, file=io.StringIO(), soft_wrap=False)
    narrow.print(results_table(runs, "paper-incast-victim"))
    text = narrow.file.getvalue()  # type: ignore[attr-defined]
    assert max(len(x) for x in text.splitlines()) <= 80 and "…" not in text, text
    assert "RoCEv2 + DCQCN + PFC" in text and "victim" in text
