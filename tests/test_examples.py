"""The programs under ``examples/`` run as a user runs them (a subprocess with this interpreter) and say
what went wrong when given bad input."""

from __future__ import annotations

import os
import random
import re
import subprocess
import sys
from pathlib import Path

from .test_provider_udp import needs_ipv6

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def _run(name: str, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(EXAMPLES / name), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
        check=False,
    )


def test_verbs_qp_example_writes_and_cleans_up() -> None:
    r = _run("verbs_qp.py", "--size", "300000")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "mrc API 1.0.1" in out and "RTS towards" in out
    assert "Write with Imm of 300000 B: SUCCESS / SUCCESS, imm 0x1234" in out and "data intact" in out
    assert "destroyed" in out and "Traceback" not in r.stderr


def test_verbs_qp_example_refuses_bad_input_clearly() -> None:
    r = _run("verbs_qp.py", env={"MRC_QP_EV_PROFILE_ID": "abc"})
    assert r.returncode != 0 and "MRC_QP_EV_PROFILE_ID='abc'" in r.stderr and "Traceback" not in r.stderr
    r = _run("verbs_qp.py", env={"MRC_QP_EV_PROFILE_ID": "7"})  # no controller installed profile 7
    assert r.returncode == 1 and "EV profile 7" in r.stderr and "Traceback" not in r.stderr
    r = _run("verbs_qp.py", "--size", "0")
    assert r.returncode == 2 and "--size" in r.stderr


def test_ctl_example_runs_every_section() -> None:
    r = _run("ctl_ev.py")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "ONLINE with 64 explicit EVs" in out and "1 MiB Write over profile 1: SUCCESS, data intact" in out
    assert "the bound QP now has 30 denied EVs" in out
    assert "E2BIG, 128 needed" in out and "32 DENIED; first four: DENIED, GOOD, GOOD, GOOD" in out
    bad, good = (int(x) for x in re.search(r"(\d+) ASSUMED_BAD and (\d+) GOOD", out).groups())  # type: ignore[union-attr]
    assert bad > 0 and good > 0  # the EVs the blackhole took were probed back
    assert out.count("answered on port") == 2


@needs_ipv6
def test_ctl_example_probes_alone_over_stev() -> None:
    """The probes section by itself, STEV EVs on IPv6 loopback ports: the far end answers at the prober's
    ports, and each RTT is one of its own (sent -> answered, not a progress round's time)."""
    r = _run("ctl_ev.py", "probes", "--stev")
    assert r.returncode == 0, r.stderr
    rtts = [float(x) for x in re.findall(r"answered on port \d: rtt ([\d.]+) us \(probe sent", r.stdout)]
    assert len(rtts) == 2 and all(0 < x < 100_000 for x in rtts), r.stdout


def test_srv6_example_routes_by_uSID_addresses_and_by_an_srh_segment() -> None:
    r = _run("ctl_srv6.py")
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout
    for section, ev_id in (("srv6", 31), ("srh", 32)):
        assert f"{section}: EV profile {ev_id} ONLINE, 8 EVs" in out
        line = next(x for x in out.splitlines() if x.startswith(f"{section}: 1 MiB Write with Imm"))
        assert "data intact" in line
        counts = [int(n) for n in re.findall(r"p\d-t1-\d (\d+)", line)]
        assert len(counts) == 8  # 2 planes x 4 spines; each QP sprays 3 of a plane's 4 paths (one backup)
        assert all(sum(n > 0 for n in counts[p * 4 : p * 4 + 4]) >= 3 for p in range(2)), line
    assert "SRH segment fc00:0:" in out
    bad = _run("ctl_srv6.py", "srv7")
    assert bad.returncode == 2 and "section 'srv7'" in bad.stderr and "Traceback" not in bad.stderr


def test_ctl_example_refuses_an_unknown_section() -> None:
    r = _run("ctl_ev.py", "bogus")
    assert r.returncode == 2 and "section 'bogus'" in r.stderr and "Traceback" not in r.stderr


def _write_bw_server(port: int, net: int, *args: str) -> subprocess.Popen[str]:
    """A ``verbs_write_bw.py`` server on two planes of 127.NET.9.*, listening (its first line read)."""
    server = subprocess.Popen(
        [
            *(sys.executable, str(EXAMPLES / "verbs_write_bw.py"), "-p", str(port), *args),
            *("--bind", f"127.{net}.9.1", "--bind", f"127.{net}.9.2"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert server.stdout is not None
    assert "waiting for a client" in server.stdout.readline()
    return server


def _write_bw_client(port: int, net: int, *args: str) -> subprocess.CompletedProcess[str]:
    binds = ("--bind", f"127.{net}.10.1", "--bind", f"127.{net}.10.2")
    return _run("verbs_write_bw.py", "127.0.0.1", "-p", str(port), *args, *binds)


def test_write_bw_example_sweeps_between_two_processes() -> None:
    """A server started bare serves the sizes the client asks for (the client tells it)."""
    rng = random.Random()
    port, net = rng.randrange(20000, 30000), rng.randrange(2, 250)
    server = _write_bw_server(port, net)
    try:
        r = _write_bw_client(port, net, "-s", "131072", "-n", "8", "--min-size", "4")
        assert r.returncode == 0, r.stderr
        rows = [line.split() for line in r.stdout.splitlines() if line.strip()[:1].isdigit()]
        assert [int(row[0]) for row in rows] == [1 << k for k in range(2, 18)]  # 4 B .. 128 KiB
        assert all(int(row[1]) == 8 and float(row[3]) > 0 for row in rows)
        out, err = server.communicate(timeout=30)
        assert server.returncode == 0 and "served 127.0.0.1: 16 sizes, 4 .. 131072 B, 1 + 8" in out, err
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    r = _run("verbs_write_bw.py", "127.0.0.1", "-p", str(port), "-s", "64")  # nobody listens any more
    assert r.returncode == 1 and "cannot reach the server" in r.stderr and "Traceback" not in r.stderr
    r = _run("verbs_write_bw.py", "--min-size", "0")
    assert r.returncode == 2 and "--min-size" in r.stderr


def test_write_bw_example_refusals_say_why_on_both_sides() -> None:
    """A server's --size caps what it takes: a client asking more is told why, and the server says so."""
    rng = random.Random()
    port, net = rng.randrange(20000, 30000), rng.randrange(2, 250)
    server = _write_bw_server(port, net, "-s", "4096")
    try:
        r = _write_bw_client(port, net, "-s", "8192", "-n", "2")
        out, err = server.communicate(timeout=30)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    why = "the client asks for 8192 B messages; this server takes 1..4096 B (--size)"
    assert r.returncode == 1 and f"the exchange with the server failed: the peer refused: {why}" in r.stderr
    assert server.returncode == 1 and f"error: client 127.0.0.1: {why}" in err, out + err
    assert "Traceback" not in r.stderr + err
