"""``openmrc collective run``: nccl-tests' table and JSON from real local ranks; bad arguments; Ctrl-C."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest

from openmrc.collectives import LOOPBACK_MTU

CMD = [sys.executable, "-m", "openmrc.cli.main", "collective", "run"]


def _run(*args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CMD, *args], capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--op", "gather"], "--op 'gather'"),
        (["-b", "1M", "-e", "1K"], "min <= max"),
        (["-b", "ten"], "not a size"),
        (["-n", "0"], "--ranks 0"),
        (["--dtype", "complex64"], "--dtype"),
        (["--redop", "xor"], "--redop"),
        (["--op", "sendrecv", "--algo", "ring"], "no choice"),
        (["--loss", "150%"], "loss rate"),
        (["--fail-plane", "3@1s"], "plane 3 outside 1..2"),
        (["--fail-plane", "soon"], "PLANE@TIME"),
        (["-p", "1", "--fail-plane", "1@1s"], "--fail-plane 1@1s: blackholing the only plane cuts the ranks"),
        (["-f", "1"], "--stepfactor 1: at least 2"),
        (["-b", "0", "-e", "0"], "--minbytes 0: a geometric sweep (--stepfactor) needs --minbytes > 0"),
        (["--root", "5", "-n", "2"], "--root 5"),
        (["--chunk", "100"], "--chunk"),
        (["--encrypt"], "--encrypt needs --secure"),
        (["--secure", "/nonexistent/key"], "--secure /nonexistent/key"),
    ],
)
def test_bad_arguments_are_one_line_and_exit_2(args: list[str], message: str) -> None:
    p = _run(*args, timeout=60)
    assert p.returncode == 2, p.stderr
    assert p.stdout == ""
    assert len(p.stderr.strip().splitlines()) == 1 and message in p.stderr, p.stderr


def test_table_as_nccl_tests_prints_it() -> None:
    p = _run("-n", "3", "--op", "all_reduce", "-b", "8", "-e", "512K", "-f", "64", "--iters", "3")
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert any(
        re.match(r"#\s+size\s+count\s+type\s+redop\s+root\s+time\s+algbw\s+busbw\s+#wrong", x) for x in lines
    )
    rows = [x for x in lines if not x.startswith("#") and x.strip()]
    assert [int(r.split()[0]) for r in rows] == [8, 512, 32768]
    for r in rows:  # size count type redop root | time algbw busbw #wrong | time algbw busbw #wrong
        f = r.split()
        assert f[2:5] == ["float", "sum", "-1"] and f[8] == "0" and f[12] == "0", r
    assert int(rows[2].split()[1]) == 32768 // 4
    devices = [
        re.match(r"#  Rank +(\d+) Group  0 Pid +(\d+) on +\S+ device  0 \[mrc\] (.*)$", x) for x in lines
    ]
    seen = [m.groups() for m in devices if m]  # one line per rank, as nccl-tests prints them
    assert [int(r) for r, _, _ in seen] == [0, 1, 2] and len({pid for _, pid, _ in seen}) == 3, p.stdout
    assert all(len(ends.split()) == 2 for _, _, ends in seen) and len({e for _, _, e in seen}) == 3
    assert re.search(r"# Out of bounds values : 0 OK", p.stdout)
    assert re.search(r"# Avg bus bandwidth    : [\d.e+-]+", p.stdout)


@pytest.mark.parametrize(
    "op", ["all_gather", "reduce_scatter", "alltoall", "broadcast", "reduce", "sendrecv"]
)
def test_every_op_checks_out_in_json(op: str) -> None:
    p = _run(
        "-n",
        "3",
        "--op",
        op,
        "-b",
        "1K",
        "-e",
        "256K",
        "-f",
        "16",
        "--iters",
        "2",
        "--dtype",
        "bf16",
        "--json",
    )
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["op"] == op and out["ranks"] == 3 and out["out_of_bounds"] == 0
    assert out["results"][0]["size"] <= 1024 and len(out["results"]) == 3
    assert all(r["type"] == "bfloat16" and r["in_place"]["busbw"] > 0 for r in out["results"])
    conf = out["config"]  # as the rows say it, with what the run used: the defaults, as resolved
    assert all((r["redop"], r["root"]) == (conf["redop"], conf["root"]) for r in out["results"]), conf
    assert conf["redop"] == ("sum" if op in ("reduce_scatter", "reduce") else "none")
    assert (conf["planes"], conf["mtu"], conf["chunk_bytes"]) == (2, LOOPBACK_MTU, 1 << 20)


def test_json_config_has_the_planes_mtu_and_chunk_given() -> None:
    p = _run(
        "-n",
        "2",
        "-p",
        "3",
        "--mtu",
        "1K",
        "--chunk",
        "64K",
        "-b",
        "256K",
        "-e",
        "256K",
        "--iters",
        "2",
        "--json",
    )
    assert p.returncode == 0, p.stderr
    conf = json.loads(p.stdout)["config"]
    assert (conf["planes"], conf["mtu"], conf["chunk_bytes"], conf["redop"]) == (3, 1024, 65536, "sum")


def test_the_only_plane_may_fail_for_a_while() -> None:
    """For good it would cut the ranks apart (refused above); for 0.3 s the transport rides it out."""
    p = _run(
        "-n", "2", "-p", "1", "-b", "4M", "-e", "4M", "--iters", "4", "--fail-plane", "1@0.05s+0.3s", "--json"
    )
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["out_of_bounds"] == 0 and out["results"][0]["retransmits"] > 0


def _help(*args: str) -> list[str]:
    """``openmrc ARGS --help`` on a terminal wide enough for any help text on one line."""
    env = {**os.environ, "COLUMNS": "1000", "NO_COLOR": "1"}
    p = subprocess.run(
        [sys.executable, "-m", "openmrc.cli.main", *args, "--help"], capture_output=True, text=True, env=env
    )
    assert p.returncode == 0, p.stderr
    return p.stdout.splitlines()


@pytest.mark.parametrize("args", [[], ["collective"]])
def test_help_lists_each_command_on_one_line(args: list[str]) -> None:
    """No line break of a docstring's survives into the commands list (typer's rich mode keeps them)."""
    lines = _help(*args)
    start = next(i for i, x in enumerate(lines) if "Commands" in x)
    entries = [x.rstrip("│ ") for x in lines[start + 1 :] if x.startswith("│")]
    assert entries and all(x[2] != " " for x in entries), "\n".join(entries)  # (no continuation line)


def test_help_of_run_is_one_paragraph_on_one_line() -> None:
    lines = _help("collective", "run")
    usage = next(i for i, x in enumerate(lines) if "Usage:" in x)
    panel = next(i for i, x in enumerate(lines) if "╭" in x)
    text = [x.strip() for x in lines[usage + 1 : panel] if x.strip()]
    assert len(text) == 1 and "under torchrun or mpiexec each process is one rank instead" in text[0], text


def test_ctrl_c_stops_every_rank() -> None:
    p = subprocess.Popen(
        [*CMD, "-n", "3", "-b", "64M", "-e", "64M", "--iters", "1000"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        # (as a terminal starts it: a suite run in the background inherits SIGINT ignored)
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    time.sleep(4)
    os.killpg(p.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: the whole process group
    _, err = p.communicate(timeout=30)
    assert p.returncode == 130, err
    assert "interrupted" in err and "Traceback" not in err
    time.sleep(0.5)
    left = subprocess.run(["pgrep", "-a", "-g", str(p.pid)], capture_output=True, text=True).stdout
    assert [x for x in left.splitlines() if "<defunct>" not in x] == []  # (exited, not yet reaped: fine)


def _one_table(out: str) -> list[str]:
    return [x for x in out.splitlines() if x.strip() and not x.startswith("#")]


def test_each_process_is_one_rank_under_mpiexec() -> None:
    mpiexec = shutil.which("mpiexec", path=os.path.dirname(sys.executable)) or shutil.which("mpiexec")
    if mpiexec is None or importlib.util.find_spec("mpi4py") is None:
        pytest.skip("no mpiexec / mpi4py (the mpi extra)")
    openmrc = os.path.join(os.path.dirname(sys.executable), "openmrc")
    cmd = [
        mpiexec,
        "-n",
        "3",
        openmrc,
        "collective",
        "run",
        "-b",
        "1K",
        "-e",
        "8K",
        "-f",
        "8",
        "--iters",
        "2",
    ]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout[-1500:] + p.stderr[-1500:]
    assert "over MRC (3 ranks)" in p.stdout and "BAD TERMINATION" not in p.stdout + p.stderr
    rows = _one_table(p.stdout)  # rank 0 alone prints the table
    assert [int(r.split()[0]) for r in rows] == [1024, 8192] and all(r.split()[8] == "0" for r in rows)


def test_each_process_is_one_rank_under_torchrun() -> None:
    if importlib.util.find_spec("torch") is None:
        pytest.skip("no torch (the torch extra)")
    openmrc = os.path.join(os.path.dirname(sys.executable), "openmrc")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", openmrc]
    p = subprocess.run(
        [*cmd, "collective", "run", "-b", "1K", "-e", "1K", "--iters", "2", "--op", "all_gather", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr[-2000:]
    out = json.loads(p.stdout)
    assert out["ranks"] == 2 and out["op"] == "all_gather" and out["out_of_bounds"] == 0


def test_a_reader_that_goes_away_stops_the_job_quietly() -> None:
    """``… | head -3``: rank 0 finds its table's reader gone, aborts the others, and nothing complains."""
    cmd = " ".join(
        [sys.executable, "-m", "openmrc.cli.main", "collective", "run", "-n", "3", "-b", "8", "-e", "1M"]
    )
    p = subprocess.run(
        ["bash", "-c", f"set -o pipefail; {cmd} | head -3"], capture_output=True, text=True, timeout=60
    )
    assert p.returncode == 0, p.stderr
    assert len(p.stdout.splitlines()) == 3 and p.stderr == ""


def test_an_authenticated_and_encrypted_all_reduce_checks_out(tmp_path: pytest.TempPathFactory) -> None:
    """**[openmrc]** --secure/--encrypt: every rank's QPs in one security domain, results right."""
    from openmrc.transport import SecurityDomain

    key = os.path.join(str(tmp_path), "k")
    dom = SecurityDomain.generate(3)
    with open(key, "w") as f:
        f.write(dom.spec())
    os.chmod(key, 0o644)  # (taken, with a warning: a domain key is a secret)
    p = _run(
        "-n",
        "3",
        "--op",
        "all_reduce",
        "-b",
        "64K",
        "-e",
        "1M",
        "-f",
        "4",
        "--secure",
        key,
        "--encrypt",
        "--json",
    )
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["ranks"] == 3 and out["out_of_bounds"] == 0 and len(out["results"]) == 3
    assert all(r["out_of_place"]["wrong"] == 0 and r["in_place"]["wrong"] == 0 for r in out["results"])
    assert out["config"]["security"] == {"sdi": 3, "fingerprint": dom.fingerprint(), "encrypt": True}
    assert p.stderr.count("others may read this key file") == 1, p.stderr  # (one line, from the launcher)
    os.chmod(key, 0o600)
    p = _run("-n", "2", "-b", "64K", "-e", "64K", "--secure", key)  # the table says so too
    assert p.returncode == 0 and not p.stderr.strip(), p.stderr
    assert f"# Security: every packet authenticated, domain 3 (key {dom.fingerprint()})" in p.stdout
