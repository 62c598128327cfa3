"""``openmrc perf``: a server and a client exchange QPN, R_Key, VA and endpoints over TCP, then Write."""

from __future__ import annotations

import os
import random
import select
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest
from typer.testing import CliRunner

from openmrc.cli.main import app
from openmrc.provider.perf import PerfError, run_client, serve

_RNG = random.Random()
CLI = [sys.executable, "-m", "openmrc.cli.main", "perf"]


@pytest.fixture
def server() -> Iterator[tuple[tuple[str, int], list[str]]]:
    x = _RNG.randrange(1, 250)
    binds = [f"127.{x}.1.{p}" for p in (1, 2)]
    ready: list[tuple[str, int]] = []
    got = threading.Event()
    stop = threading.Event()

    def on_ready(addr: tuple[str, int]) -> None:
        ready.append(addr)
        got.set()

    t = threading.Thread(
        target=serve,
        args=(binds,),
        kwargs={"oob": ("127.0.0.1", 0), "log": lambda s: None, "ready": on_ready, "stop": stop},
    )
    t.start()
    assert got.wait(10)
    yield ready[0], [f"127.{x}.2.{p}" for p in (1, 2)]
    stop.set()
    t.join(10)
    assert not t.is_alive()


def test_a_sweep_of_sizes_arrives_intact(server: tuple[tuple[str, int], list[str]]) -> None:
    addr, binds = server
    rep = run_client(addr, binds, [2, 4096, 65536], iters=20, qps=2)
    assert rep.hash_ok
    assert [r.bytes for r in rep.results] == [2, 4096, 65536]
    assert all(r.completions_ok and r.bw_avg_gbps > 0 and r.iterations == 20 for r in rep.results)


def test_imm_loss_and_a_failing_port(server: tuple[tuple[str, int], list[str]]) -> None:
    addr, binds = server
    rep = run_client(addr, binds, [256 << 10], iters=10, imm=True, loss=0.01, fail_port=(2, 0.0))
    assert rep.hash_ok
    (r,) = rep.results
    assert r.retransmits > 0 and r.ev_state_changes > 0


def test_a_plane_count_mismatch_is_refused(server: tuple[tuple[str, int], list[str]]) -> None:
    addr, binds = server
    with pytest.raises(PerfError, match="planes"):
        run_client(addr, binds[:1], [4096], iters=2)


def test_an_unreachable_server_is_a_clear_error() -> None:
    with pytest.raises(PerfError, match="cannot reach"):
        run_client(("127.0.0.1", 1), ["127.0.0.9"], [4096])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--size", "abc"], "is not a size"),
        (["--loss", "150%"], "loss rate"),
        (["--fail-port", "x"], "PORT@TIME"),
        (["--qps", "0"], "--qps"),
        (["--bind", "300.1.1.1"], "not an IPv4 or IPv6"),
    ],
)
def test_client_arguments_are_checked(args: list[str], message: str) -> None:
    res = CliRunner().invoke(app, ["perf", "client", "127.0.0.1", *args])
    assert res.exit_code == 2 and message in res.output


def test_cli_end_to_end_over_two_processes() -> None:
    x = _RNG.randrange(1, 250)
    port = _RNG.randrange(30000, 40000)
    srv = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "openmrc.cli.main",
            "perf",
            "server",
            "--once",
            "-p",
            "2",
            "--oob-port",
            str(port),
            "--oob-bind",
            "127.0.0.1",
            "--bind",
            f"127.{x}.1.1",
            "--bind",
            f"127.{x}.1.2",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert srv.stdout is not None
        assert "waiting" in srv.stdout.readline() + srv.stdout.readline()
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "openmrc.cli.main",
                "perf",
                "client",
                "127.0.0.1",
                "--oob-port",
                str(port),
                "--bind",
                f"127.{x}.2.1",
                "--bind",
                f"127.{x}.2.2",
                "-s",
                "64K",
                "-n",
                "10",
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert out.returncode == 0, out.stdout + out.stderr
        assert "BW average" in out.stdout and "matches" in out.stdout
        assert srv.wait(30) == 0
    finally:
        srv.kill()


_read: dict[int, list[str]] = {}  # per process: what `_line_with` has read of its stdout, and what is left


def _line_with(proc: subprocess.Popen[str], text: str, timeout: float) -> str:
    """The first line of ``proc``'s stdout holding ``text`` (fails after ``timeout`` seconds). Reads the
    pipe itself (os.read): a text file's readline may buffer the next lines, where select no longer sees
    them."""
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    seen = _read.setdefault(proc.pid, ["", ""])  # [everything read, the part not yet split into lines]
    end = time.monotonic() + timeout
    while True:
        while "\n" in seen[1]:
            line, seen[1] = seen[1].split("\n", 1)
            if text in line:
                return line + "\n"
        left = end - time.monotonic()
        if left <= 0:
            raise AssertionError(f"no line with {text!r} in {timeout} s")
        if select.select([fd], [], [], left)[0]:
            chunk = os.read(fd, 1 << 16).decode()
            assert chunk, f"the process ended (code {proc.wait()}) before printing {text!r}"
            seen[0] += chunk
            seen[1] += chunk


def _output(proc: subprocess.Popen[str]) -> str:
    """Everything ``proc`` printed: what `_line_with` read, then the rest (it must have ended)."""
    return _read.pop(proc.pid, ["", ""])[0] + proc.communicate()[0]


def _perf_server(*args: str) -> tuple[int, int, subprocess.Popen[str]]:
    """A ``perf server`` process on two planes of 127.X.1.* (and a TCP port), listening."""
    x = _RNG.randrange(1, 250)
    port = _RNG.randrange(30000, 40000)
    srv = subprocess.Popen(
        [*CLI, "server", *args, "--oob-port", str(port), "--oob-bind", "127.0.0.1"]
        + [a for p in (1, 2) for a in ("--bind", f"127.{x}.1.{p}")],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        _line_with(srv, "waiting", 15)
    except BaseException:
        srv.kill()  # (not left running, a child of the test process, when it does not start)
        srv.wait()
        raise
    return x, port, srv


def _perf_client(x: int, port: int, *args: str) -> subprocess.Popen[str]:
    """A 20 s ``perf client`` process towards `_perf_server`'s, measuring."""
    cli = subprocess.Popen(
        [*CLI, "client", "127.0.0.1", "--oob-port", str(port), "-s", "64K", "--duration", "20", *args]
        + [a for p in (1, 2) for a in ("--bind", f"127.{x}.2.{p}")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _line_with(cli, "bits/sec", 15)
    except BaseException:
        cli.kill()
        cli.wait()
        raise
    return cli


def test_a_client_notices_a_killed_server_at_once() -> None:
    """SIGKILL the server mid-run: the client sees its TCP connection close and fails in well under the
    transport's retries (4.4 s), with one line saying so."""
    x, port, srv = _perf_server("--once")
    cli = None
    try:
        cli = _perf_client(x, port, "--interval-ms", "100")
        time.sleep(0.5)
        srv.kill()
        killed = time.monotonic()
        out, err = cli.communicate(timeout=10)
        took = time.monotonic() - killed
        out = _read.pop(cli.pid, ["", ""])[0] + out  # (with what `_line_with` read of it)
        assert cli.returncode == 1, out + err
        assert took < 4, f"the client took {took:.1f} s to notice"
        assert "server went away" in err and "Traceback" not in out + err, out + err  # (stderr: a diagnostic)
    finally:
        srv.kill()
        srv.wait()
        if cli is not None:
            cli.kill()
            cli.wait()


def test_a_server_outlives_a_killed_client() -> None:
    """SIGKILL a client mid-run: the server logs it in one line and serves the next client."""
    x, port, srv = _perf_server()
    cli = None
    try:
        cli = _perf_client(x, port)
        cli.kill()
        assert "client 127.0.0.1:" in _line_with(srv, "closed", 5)
        rep = run_client(("127.0.0.1", port), [f"127.{x}.2.{p}" for p in (1, 2)], [65536], iters=20)
        assert rep.hash_ok and rep.results[0].completions_ok
        assert srv.poll() is None
    finally:
        srv.kill()
        srv_out = _output(srv)
        if cli is not None:
            cli.kill()
            cli.wait()
    assert "Traceback" not in srv_out, srv_out
