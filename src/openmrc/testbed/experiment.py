"""Experiments on a testbed that is up: an `openmrc perf` run between two of its hosts, optionally with a
link blackholed and healed during it, and the figures that come out (`failover`)."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from openmrc.testbed.netns import Testbed, TestbedError

__all__ = ["FailoverResult", "failover", "openmrc_argv"]


def openmrc_argv() -> list[str]:
    """How to start this installation's ``openmrc`` in another namespace (same interpreter)."""
    exe = Path(sys.executable).with_name("openmrc")
    if exe.exists():
        return [str(exe)]
    found = shutil.which("openmrc")
    return [found] if found else [sys.executable, "-m", "openmrc.cli.main"]


@dataclass
class FailoverResult:
    """What a perf run between two testbed hosts showed. Times in seconds, goodput in Gb/s; ``during`` is
    while the link was blackholed. Times count from the moment the fault (or the heal) was in effect at
    both ends of the link (`Testbed.changed_at`). ``detect_s``: from the fault until the first report with
    an EV out of use (held while a loss on it is judged, or ASSUMED_BAD: the sender routes around it);
    ``blame_s``: until the first report with an EV ASSUMED_BAD; ``recover_s``: from the heal until every
    EV was GOOD and in use again (None: never seen)."""

    mode: str
    link: str | None
    hash_ok: bool
    goodput_before: float
    goodput_during: float
    goodput_after: float
    detect_s: float | None
    recover_s: float | None
    evs: int
    max_bad: int
    retransmits: int
    spine_packets: dict[str, int] = field(default_factory=dict)
    blame_s: float | None = None
    fault_apply_s: float | None = None
    """How long applying the fault took (both ends' rules at once): a bound on how much sooner than
    ``detect_s`` says the first direction may already have been dropped."""
    intervals: list[dict[str, Any]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _mean(xs: list[float]) -> float:
    return round(sum(xs) / len(xs), 4) if xs else 0.0


def _spines(bed: Testbed) -> dict[str, int]:
    fab = bed.fabric()
    t = fab.topo
    out = {}
    for p in range(t.planes):
        for j in range(t.t1_per_plane):
            name = t.node_name(t.t1(p, j))
            out[name] = sum(c["rx_packets"] for dev, c in bed.counters(name).items() if dev.startswith("eth"))
    return out


def failover(
    bed: Testbed,
    *,
    src: int = 0,
    dst: int | None = None,
    link: str | None = None,
    ev_mode: str | None = None,
    duration: float = 3.0,
    fail_at: float = 1.0,
    heal_at: float = 2.0,
    interval: float = 0.02,
    size: str = "64K",
    link_gbps: float = 2.0,
    timeout: float = 120.0,
) -> FailoverResult:
    """Run ``openmrc perf`` from host ``src`` to host ``dst`` (default: the last host) for ``duration``
    seconds; when ``link`` is given, blackhole it ``fail_at`` seconds in and heal it at ``heal_at``."""
    fab = bed.fabric()
    t = fab.topo
    dst = t.num_hosts - 1 if dst is None else dst
    mode = ev_mode or ("srv6" if fab.srv6 else "stev")
    exe = openmrc_argv()
    export = str(bed.export_dir)
    spines0 = _spines(bed)
    rate = ("--link-gbps", str(link_gbps))
    server = subprocess.Popen(
        [*bed.exec_argv(t.node_name(dst), exe), "perf", "server", "--fabric", export, "--once", *rate],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    client = None
    try:
        assert server.stdout is not None
        line = server.stdout.readline()  # the first line: the server is listening
        while line and "waiting for clients" not in line:
            line = server.stdout.readline()
        if not line:
            raise TestbedError(f"the perf server on host{dst} did not start: {server.stdout.read().strip()}")
        client = subprocess.Popen(
            [
                *bed.exec_argv(t.node_name(src), exe),
                *("perf", "client", fab.host_address(dst, 0), "--fabric", export, "--ev-mode", mode),
                *("--size", size, "--duration", str(duration), "--interval-ms", str(interval * 1000)),
                *("--json", *rate),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        # the fault times count from the first interval report, when data flows: starting a client (an
        # interpreted build on a busy machine, 64 EVs to set up) can take longer than ``fail_at`` itself
        assert client.stdout is not None
        first = client.stdout.readline()
        start = time.time()
        failed = healed = apply = None
        if link is not None and first:
            # times count from when the change was in effect at both ends of the link (applying it takes
            # 10-40 ms of `ip netns exec` on a busy machine: not the transport's time)
            time.sleep(max(0.0, start + fail_at - time.time()))
            bed.fail(link)
            failed = bed.changed_at
            if failed is not None and bed.changing_at is not None:
                apply = round(failed - bed.changing_at, 4)
            time.sleep(max(0.0, start + heal_at - time.time()))
            bed.heal(link)
            healed = bed.changed_at
        rest, err = client.communicate(timeout=timeout)
        out = first + rest
        if client.returncode != 0:
            raise TestbedError(f"perf client: exit {client.returncode}: {(err or out).strip()[-400:]}")
    finally:
        if link is not None:
            bed.heal()
        for p in (client, server):
            if p is not None and p.poll() is None:
                p.send_signal(signal.SIGINT)
                try:
                    p.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        if server.stdout is not None:
            server.stdout.close()
    spines1 = _spines(bed)
    intervals = [json.loads(x)["interval"] for x in out.splitlines() if x.startswith('{"interval"')]
    report = json.loads("\n".join(x for x in out.splitlines() if not x.startswith('{"interval"')))
    before, during, after = [], [], []
    detect = recover = blame = None
    for iv in intervals:
        out = iv["evs_bad"] + iv.get("evs_held", 0)
        if failed is None or iv["t"] < failed:
            before.append(iv["gbps"])
        elif healed is not None and iv["t"] < healed:
            during.append(iv["gbps"])
            if detect is None and out > 0:
                detect = round(iv["t"] - failed, 4)
            if blame is None and iv["evs_bad"] > 0:
                blame = round(iv["t"] - failed, 4)
        else:
            after.append(iv["gbps"])
            if healed is not None and recover is None and out == 0:
                recover = round(iv["t"] - healed, 4)
    return FailoverResult(
        mode,
        link,
        bool(report["hash_ok"]),
        _mean(before[1:] or before),  # the first interval includes the start
        _mean(during),
        _mean(after[:-1] or after),  # the last one the drain
        detect,
        recover,
        max((iv["evs_good"] + iv["evs_bad"] for iv in intervals), default=0),
        max((iv["evs_bad"] for iv in intervals), default=0),
        sum(r["retransmits"] for r in report["results"]),
        {k: spines1[k] - spines0.get(k, 0) for k in spines1},
        blame,
        apply,
        intervals,
    )
