"""benchmarks/perf_bench.py: its options, the keys of a set of goodput runs, and the stalled-peer figures."""

from __future__ import annotations

import importlib.util
import random
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "benchmarks" / "perf_bench.py"


def _bench() -> ModuleType:
    if str(BENCH.parent) not in sys.path:  # (as running the script puts its directory first: its helpers)
        sys.path.insert(0, str(BENCH.parent))
    spec = importlib.util.spec_from_file_location("perf_bench", BENCH)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_help_names_the_modes() -> None:
    out = subprocess.run([sys.executable, str(BENCH), "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert all(f in out.stdout for f in ("--json", "--contended", "--both", "--dead-peer"))


def test_every_key_of_a_set_of_runs_is_documented() -> None:
    bench = _bench()
    run = {
        "gbps": 2.0,
        "seconds": 0.5,
        "retransmits": 3,
        "retransmit_fraction": 0.01,
        "ev_changes": 2,
        "evs_marked_bad": 1,
        "kernel_rcvbuf_errors": 0,
        "rx_overflow": 0,
        "fault_dropped": 7,
        "ok": True,
    }
    out: dict[str, Any] = {}
    bench.report_runs(out, {name: dict(run) for name in bench.RUNS}, "_contended")
    assert out["loss1_fraction_contended"] == 1.0 and out["portfail_fault_dropped_contended"] == 7
    assert out["retransmit_fraction_contended"] == 0.01
    documented = set(re.findall(r"``([A-Za-z0-9_]+)``", bench.__doc__ or ""))
    for key in out:
        generic = re.sub(r"_(1port|4port|loss1|portfail)$", "_RUN", key.removesuffix("_contended"))
        assert generic in documented, key


def test_a_stalled_peer_is_measured_without_a_completion() -> None:
    bench = _bench()
    r = bench.unanswered_write(random.randrange(20, 250), dead=False, seconds=0.5)
    assert r["error_s"] is None and r["status"] is None
    assert r["probes_per_s"] >= 0 and r["datagrams_per_s"] > 0
