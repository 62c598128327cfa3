"""What ``openmrc perf`` prints, on both sides: the header, the table, the connection block, a duration run's
intervals and summary (also after Ctrl-C), the endpoints (IPv6 in brackets), and what a refused client and
the server say. Every command runs as a user runs it, in its own process, against one server process."""

from __future__ import annotations

import itertools
import json
import random
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO

import pytest

from tests.helpers import has_ipv6_loopback

CLI = [sys.executable, "-m", "openmrc.cli.main", "perf"]
_RNG = random.Random()


class _Lines:
    """The lines a process writes to one of its pipes, read as they come (by a thread)."""

    def __init__(self, pipe: IO[str]) -> None:
        self.lines: list[str] = []
        self.cond = threading.Condition()
        threading.Thread(target=self._read, args=(pipe,), daemon=True).start()

    def _read(self, pipe: IO[str]) -> None:
        for line in pipe:
            with self.cond:
                self.lines.append(line.rstrip("\n"))
                self.cond.notify_all()

    def wait_for(self, text: str, timeout: float = 15, after: int = 0) -> str:
        """The first line from the ``after``-th on that holds ``text``."""
        end = time.monotonic() + timeout
        with self.cond:
            while True:
                for line in self.lines[after:]:
                    if text in line:
                        return line
                left = end - time.monotonic()
                assert left > 0, f"no line with {text!r} in {timeout} s: {self.lines}"
                self.cond.wait(left)


@dataclass
class _Server:
    proc: subprocess.Popen[str]
    out: _Lines
    err: _Lines
    port: int
    host: str
    """The address clients connect to: ``::1`` where this machine has IPv6, else 127.0.0.1."""
    x: int
    """Clients bind 127.x.N.1 and 127.x.N.2 (N >= 2; the server has 127.x.1.*)."""


@pytest.fixture(scope="module")
def server() -> Iterator[_Server]:
    x, port = _RNG.randrange(1, 250), _RNG.randrange(30000, 40000)
    host = "::1" if has_ipv6_loopback() else "127.0.0.1"
    proc = subprocess.Popen(
        [*CLI, "server", "--oob-port", str(port), "--oob-bind", host]
        + [a for p in (1, 2) for a in ("--bind", f"127.{x}.1.{p}")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stderr is not None
    srv = _Server(proc, _Lines(proc.stdout), _Lines(proc.stderr), port, host, x)
    try:
        srv.out.wait_for("waiting for clients")
        yield srv
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    assert "Traceback" not in "\n".join(srv.out.lines + srv.err.lines)


_net = iter(range(2, 250))


def _client_argv(srv: _Server, *args: str, planes: int = 2) -> list[str]:
    n = next(_net)  # a client's own addresses: two clients at once never share them
    binds = [a for p in range(1, planes + 1) for a in ("--bind", f"127.{srv.x}.{n}.{p}")]
    return [*CLI, "client", srv.host, "--oob-port", str(srv.port), *binds, *args]


def _client(srv: _Server, *args: str, planes: int = 2) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        _client_argv(srv, *args, planes=planes), capture_output=True, text=True, timeout=60, check=False
    )


def _endpoint(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _row(out: str, size: int) -> list[str]:
    return next(line.split() for line in out.splitlines() if line.split()[:1] == [str(size)])


def test_the_table_tells_4_from_8_mib_and_the_header_names_the_operation(server: _Server) -> None:
    """MsgRate with 6 decimals (4 MiB and 8 MiB were both 0.0001 Mpps with 4), consistent with the average
    bandwidth; the header says "with Immediate" with --imm and shows the server's endpoint as one."""
    seen = len(server.out.lines)
    rates = {}
    for size, imm in ((4 << 20, ["--imm"]), (8 << 20, [])):
        r = _client(server, "-s", str(size), "-n", "4", *imm)
        assert r.returncode == 0, r.stdout + r.stderr
        header = r.stdout.splitlines()[0]
        op = "RDMA Write with Immediate," if imm else "RDMA Write, 2 planes"
        assert op in header and f"server {_endpoint(server.host, server.port)}" in header, header
        row = _row(r.stdout, size)
        avg, mpps = float(row[3]), row[4]
        assert re.fullmatch(r"\d+\.\d{6}", mpps), row
        rates[size] = float(mpps)
        assert float(mpps) > 0 and abs(float(mpps) * size * 8 / 1e3 - avg) <= 0.1 * avg + 0.05, row
    assert rates[4 << 20] != rates[8 << 20]
    said = server.out.wait_for("RDMA Write with Immediate, 1 QP(s)", after=seen)
    assert said.startswith(f"client {_endpoint(server.host, 0)[:-1]}"), said  # its TCP endpoint


def test_an_ipv6_server_is_shown_in_brackets_even_where_rich_sees_markup() -> None:
    """``[fe80::1]`` would be a style tag to rich; it stays, in the header (stdout) and the error (stderr)."""
    r = subprocess.run(
        [*CLI, "client", "fe80::1", "--oob-port", "5", "-p", "1"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert "server [fe80::1]:5" in r.stdout
    assert "error: cannot reach the server at [fe80::1]:5: " in r.stderr


_ADDRESS = re.compile(
    r"^ (local|remote) address: (QPN 0x[0-9a-f]{6} PSN 0x[0-9a-f]{6} RKey 0x[0-9a-f]{8} VA 0x[0-9a-f]{16})$"
)


def _block(lines: list[str]) -> dict[str, list[str]]:
    got: dict[str, list[str]] = {"local": [], "remote": []}
    for line in lines:
        m = _ADDRESS.match(line)
        if m:
            got[m.group(1)].append(m.group(2))
        elif line.startswith((" local planes: ", " remote planes: ")):
            got[line.split()[0] + " planes"] = [line.split(": ", 1)[1]]
    return got


def test_both_sides_print_the_connection_block_and_json_carries_it(server: _Server) -> None:
    seen = len(server.out.lines)
    argv = _client_argv(server, "-s", "64K", "-n", "5", "--qps", "2")
    r = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    mine = _block(r.stdout.splitlines())
    assert len(mine["local"]) == len(mine["remote"]) == 2  # a line per QP
    me = f"127.{server.x}.{argv[argv.index('--bind') + 1].split('.')[2]}"
    assert mine["local planes"] == [f"{me}.1:4791, {me}.2:4791"]
    assert mine["remote planes"] == [f"127.{server.x}.1.1:4791, 127.{server.x}.1.2:4791"]
    server.out.wait_for(mine["remote"][1], after=seen)
    start = next(i for i, line in enumerate(server.out.lines) if i >= seen and "2 QP(s)" in line)
    theirs = _block(server.out.lines[start : start + 9])
    assert theirs["local"] == mine["remote"] and theirs["remote"] == mine["local"]
    assert theirs["local planes"] == mine["remote planes"] and theirs["remote planes"] == mine["local planes"]

    r = _client(server, "-s", "4K", "-n", "5", "--json")
    assert r.returncode == 0, r.stderr
    conn = json.loads(r.stdout)["connection"]
    (q,) = conn["local"]["qps"]
    assert 0 <= q["psn"] < 1 << 24 and conn["remote"]["qps"][0]["va"] > 0
    line = f"QPN 0x{q['qpn']:06x} PSN 0x{q['psn']:06x} RKey 0x{q['rkey']:08x} VA 0x{q['va']:016x}"
    assert server.out.wait_for(line) == f" remote address: {line}"


def test_a_plane_count_mismatch_reads_right_on_both_sides(server: _Server) -> None:
    r = _client(server, "-s", "4K", "-n", "2", planes=3)
    why = "the client has 3 planes, the server 2"
    assert r.returncode == 1 and f"error: the server refused: {why}" in r.stderr, r.stderr
    assert why in server.err.wait_for("3 planes")


_INTERVAL = re.compile(
    r"^\[  1\]\s+(\d+\.\d\d)-(\d+\.\d\d)\s+sec\s+([\d.]+) (|K|M|G)Bytes\s+([\d.]+) (|K|M|G)bits/sec"
    r"\s+(\d+)\s+(\d+)/(\d+)/(\d+)(  sender)?$"
)


def _intervals(out: str) -> tuple[list[re.Match[str]], list[re.Match[str]]]:
    got = [m for m in map(_INTERVAL.match, out.splitlines()) if m]
    return [m for m in got if not m.group(11)], [m for m in got if m.group(11)]


def test_a_duration_run_prints_iperf3_intervals_and_a_summary(server: _Server) -> None:
    r = _client(server, "-s", "64K", "--duration", "0.5", "--interval-ms", "150")
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("[ ID] Interval           Transfer     Bitrate         Retr") == 2
    ticks, (total,) = _intervals(r.stdout)
    assert len(ticks) >= 3 and ticks[0].group(1) == "0.00"
    assert all(a.group(2) == b.group(1) for a, b in itertools.pairwise(ticks))  # back to back
    assert total.group(1) == "0.00" and 0 <= float(total.group(2)) - float(ticks[-1].group(2)) < 0.03
    assert all(float(m.group(3)) > 0 for m in [*ticks, total])

    r = _client(server, "-s", "64K", "--duration", "0.3", "--interval-ms", "100", "--json")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    ivs = [json.loads(x)["interval"] for x in lines if x.startswith('{"interval"')]
    rep = json.loads("\n".join(x for x in lines if not x.startswith('{"interval"')))
    assert rep["intervals"] == ivs and ivs[0]["start"] == 0.0
    assert rep["summary"]["bytes"] == sum(iv["bytes"] for iv in ivs) > 0
    assert rep["summary"]["end"] == ivs[-1]["end"] and rep["hash_ok"] is True and not rep["interrupted"]
    for iv in ivs:
        assert iv["gbps"] == pytest.approx(iv["bytes"] * 8 / (iv["end"] - iv["start"]) / 1e9, rel=0.05)


def _measuring(srv: _Server) -> tuple[subprocess.Popen[str], _Lines, _Lines]:
    """A 20 s duration client, once it has reported its first interval."""
    cli = subprocess.Popen(
        _client_argv(srv, "-s", "64K", "--duration", "20", "--interval-ms", "100"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert cli.stdout is not None and cli.stderr is not None
    out, err = _Lines(cli.stdout), _Lines(cli.stderr)
    try:
        out.wait_for("[  1]")
    except BaseException:
        cli.kill()
        cli.wait()
        raise
    return cli, out, err


def test_ctrl_c_prints_the_summary_of_what_ran_then_exits_130(server: _Server) -> None:
    cli, out, err = _measuring(server)
    cli.send_signal(signal.SIGINT)
    assert cli.wait(10) == 130
    time.sleep(0.1)  # (the readers take the last lines)
    ticks, (total,) = _intervals("\n".join(out.lines))
    assert total.group(1) == "0.00" and 0 <= float(total.group(2)) - float(ticks[-1].group(2)) < 0.03
    assert err.lines == ["interrupted"], err.lines


def test_a_second_client_is_told_at_once_that_the_server_is_busy(server: _Server) -> None:
    first, _, _ = _measuring(server)
    try:
        t0 = time.monotonic()
        r = _client(server, "-s", "4K", "-n", "2")
        took = time.monotonic() - t0
    finally:
        first.send_signal(signal.SIGINT)
        first.wait(10)
    assert (
        r.returncode == 1
        and "error: the server refused: the server is busy with another client (" in r.stderr
    )
    assert took < 8, f"the refused client took {took:.1f} s"
    assert "refused: busy with client" in server.err.wait_for("refused")
