"""The torch.distributed backend "mrc" on real ranks (torchrun), and DDP training against gloo."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parent.parent


def _torchrun(n: int, *args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={n}", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def test_every_process_group_call_on_three_ranks() -> None:
    p = _torchrun(3, "tests/torch_ops_worker.py")
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-4000:]
    assert sorted(line for line in p.stdout.splitlines() if line.startswith("ok")) == ["ok 0", "ok 1", "ok 2"]


def _train(tmp_path: Path, backend: str, *args: str) -> list[float]:
    """`examples/train_ddp.py` on 2 ranks over ``backend``: its losses."""
    out = tmp_path / f"{backend}.json"
    p = _torchrun(2, "examples/train_ddp.py", "--backend", backend, "--quiet", "--out", str(out), *args)
    # torch 2.13's gloo sometimes aborts in its own teardown ("terminate called without an active
    # exception", about one run in six on a loaded 2-core machine) after the run wrote its results: gloo
    # is the reference here, its teardown is not what is tested
    gloo_teardown = backend == "gloo" and "terminate called without an active exception" in p.stderr
    ok = p.returncode == 0 or (gloo_teardown and out.exists())
    assert ok, "\n".join(x for x in p.stderr.splitlines() if "arn" not in x)[:5000]
    losses: list[float] = json.loads(out.read_text())["losses"]
    return losses


def test_ddp_training_matches_gloo(tmp_path: Path) -> None:
    g, m = (_train(tmp_path, b, "--steps", "25") for b in ("gloo", "mrc"))
    assert len(g) == len(m) == 25
    assert g[-1] < g[0] * 0.9  # it learns
    assert m == pytest.approx(g, rel=1e-5, abs=1e-7)


def test_fsdp2_training_matches_gloo(tmp_path: Path) -> None:
    """FSDP2 (`fully_shard`: parameters sharded, all-gathered for each step, gradients reduce-scattered)
    over the Python process group: its DeviceMesh needs the group's name, which torch keeps on C++
    backends only, so the group keeps its own."""
    g, m = (_train(tmp_path, b, "--steps", "10", "--wrap", "fsdp") for b in ("gloo", "mrc"))
    assert len(g) == len(m) == 10
    assert m == pytest.approx(g, rel=1e-5, abs=1e-7)
