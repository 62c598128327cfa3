"""Collectives over MRC: the figures, in one run on this machine.

    python benchmarks/collective_bench.py --json                # everything that can run here
    python benchmarks/collective_bench.py --only loopback,sim   # some sections

Sections:
- ``loopback``: 4 ranks on loopback, 2 planes: all_reduce bus bandwidth (float32) at 1 MiB and 64 MiB and the
  8-byte latency (the median of three runs each, the runs beside it) for mrc (`openmrc collective run`'s
  benchmark) and for torch's gloo in the same run (4 ranks under torchrun, TCP on loopback), and their
  ratios; all_gather bus bandwidth at 64 MiB (the gathered bytes), mrc with its large messages written
  straight into the receiving rank's buffer (the default), mrc through slots (``direct_bytes=None``) and
  gloo. Needs the torch extra for gloo.
- ``contended``: the loopback section's all_reduce figures (1 MiB, 64 MiB, 8 bytes; one run each) for mrc
  and gloo with one busy-looping process beside them, as on a host that is never idle, and their ratios.
- ``faults``: mrc's bus bandwidth at ``--fault-size`` with 1 % loss on every plane both ways, and with one
  plane blackholed mid-run, as fractions of the clean figure of the same run; gloo's with 1 % of its
  packets dropped (the loopback of a network namespace, nftables: root; the median of three runs, which
  differ widely, and each run's fraction). gloo has no planes on loopback to
  fail; what it does under a failed link is measured on the testbed.
- ``testbed``: DDP training on the 4 testbed hosts (`examples/testbed_train.py`): mean step time before,
  during and after a blackholed spine link, for gloo and mrc, and step_time.png. Needs root and torch.
- ``sim``: the real Communicator on simulated hosts (`SimWorld`): a ring all_reduce on 128 hosts against
  the simulator's flow model of the same ring, and halving-doubling on 1,024 hosts against the flow model's
  Rabenseifner steps; simulated times, wall times.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SECTIONS = ("loopback", "contended", "faults", "testbed", "sim")

GLOO_SCRIPT = """
import json, os, sys, time, torch, torch.distributed as dist
dist.init_process_group("gloo")
r, n = dist.get_rank(), dist.get_world_size()
out = {}
sizes = json.loads(os.environ.get("GLOO_SIZES", "[[8, 200], [1048576, 20], [67108864, 5]]"))
gather = os.environ.get("GLOO_OP") == "all_gather"
for nbytes, iters in sizes:
    x = torch.ones(max(nbytes // 4 // (n if gather else 1), 1))
    y = torch.empty(x.numel() * n)
    call = (lambda: dist.all_gather_into_tensor(y, x)) if gather else (lambda: dist.all_reduce(x))
    call(); dist.barrier()
    t = time.perf_counter()
    for _ in range(iters):
        call()
    dt = (time.perf_counter() - t) / iters
    out[nbytes] = (dt * 1e6, nbytes / dt / 1e9 * ((n - 1) / n if gather else 2 * (n - 1) / n))
dist.barrier()
if r == 0:
    print("RESULT " + json.dumps(out), flush=True)
dist.destroy_process_group()
"""


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _mrc_rows(ranks: int, comm: dict[str, Any] | None = None, **cfg: Any) -> list[Any]:
    from openmrc.collectives.bench import BenchConfig, bench
    from openmrc.collectives.launch import run_local

    conf = BenchConfig(check=False, json=True, **cfg)
    return list(run_local(ranks, bench, conf, timeout=900, comm_kwargs={"planes": 2, **(comm or {})})[0])


def _gather(ranks: int) -> dict[str, Any]:
    """all_gather of 64 MiB (gathered): mrc direct and through slots, alternating (two runs each: the
    better), and gloo."""
    _log(f"loopback: all_gather on {ranks} ranks, direct and through slots ...")
    runs: dict[str, list[float]] = {"direct": [], "slots": []}
    for _ in range(2):
        for name, kw in (("direct", {}), ("slots", {"direct_bytes": None})):
            row = _mrc_rows(ranks, kw, op="all_gather", minbytes=64 << 20, maxbytes=64 << 20, iters=5)[0]
            runs[name].append(round(row.out_of_place.busbw, 4))
    out: dict[str, Any] = {
        "mrc_busbw_GBps_64MiB": max(runs["direct"]),
        "mrc_slots_busbw_GBps_64MiB": max(runs["slots"]),
        "runs": runs,
        "ratio_direct_over_slots": round(max(runs["direct"]) / max(runs["slots"]), 3),
    }
    g = _gloo(ranks, [(64 << 20, 5)], op="all_gather")
    if g is not None:
        out["gloo_busbw_GBps_64MiB"] = round(g[64 << 20][1], 4)
        out["ratio_mrc_over_gloo_64MiB"] = round(out["mrc_busbw_GBps_64MiB"] / g[64 << 20][1], 3)
    return out


def _have_torch() -> bool:
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


def _mrc_all_reduce(ranks: int, runs: int) -> dict[str, Any]:
    """mrc's all_reduce bus bandwidth at 1 MiB and 64 MiB, and the median of ``runs`` 8-byte latencies."""
    big = _mrc_rows(ranks, minbytes=1 << 20, maxbytes=64 << 20, stepfactor=64, iters=5, warmup=1)
    # (a small all_reduce of 4 ranks on 2 cores is CPU-bound and one run's time varies by a third: the
    # median of three, both sides, each run's beside it)
    lat = [
        round(_mrc_rows(ranks, minbytes=8, maxbytes=8, iters=200, warmup=5)[0].out_of_place.time_us, 1)
        for _ in range(runs)
    ]
    return {
        "busbw_GBps_1MiB": round(big[0].out_of_place.busbw, 4),
        "busbw_GBps_64MiB": round(big[1].out_of_place.busbw, 4),
        "latency_us_8B": statistics.median(lat),
        "latency_us_8B_runs": lat,
    }


def _gloo_all_reduce(ranks: int, runs: int) -> dict[str, Any] | None:
    """The same of gloo's (None if it did not finish)."""
    g = _gloo(ranks, [(8, 200), (1 << 20, 20), (64 << 20, 5)])
    if g is None:
        return None
    lat = [round(g[8][0], 1)]
    for _ in range(runs - 1):
        more = _gloo(ranks, [(8, 200)])
        if more is not None:
            lat.append(round(more[8][0], 1))
    return {
        "busbw_GBps_1MiB": round(g[1 << 20][1], 4),
        "busbw_GBps_64MiB": round(g[64 << 20][1], 4),
        "latency_us_8B": statistics.median(lat),
        "latency_us_8B_runs": lat,
    }


def _ratios(mrc: dict[str, Any], gloo: dict[str, Any]) -> dict[str, float]:
    return {
        "ratio_mrc_over_gloo_1MiB": round(mrc["busbw_GBps_1MiB"] / gloo["busbw_GBps_1MiB"], 3),
        "ratio_mrc_over_gloo_64MiB": round(mrc["busbw_GBps_64MiB"] / gloo["busbw_GBps_64MiB"], 3),
        "latency_ratio_mrc_over_gloo_8B": round(mrc["latency_us_8B"] / gloo["latency_us_8B"], 3),
    }


def loopback(ranks: int) -> dict[str, Any]:
    _log(f"loopback: mrc all_reduce on {ranks} ranks ...")
    mrc = _mrc_all_reduce(ranks, 3)
    out: dict[str, Any] = {"ranks": ranks, "planes": 2, "dtype": "float32", "mrc": mrc}
    if not _have_torch():
        out["gloo"] = None
        out["note"] = "gloo: torch is not installed (make EXTRAS=dev,torch)"
        return out
    _log(f"loopback: gloo all_reduce on {ranks} ranks ...")
    out["gloo"] = gloo = _gloo_all_reduce(ranks, 3)
    if gloo is None:
        out["note"] = "gloo did not finish"
        return out
    out.update(_ratios(mrc, gloo))
    out["all_gather"] = _gather(ranks)
    return out


def contended(ranks: int) -> dict[str, Any]:
    """mrc's and gloo's all_reduce (1 MiB, 64 MiB, 8 bytes) beside one busy-looping process."""
    from _busy import busy_process

    out: dict[str, Any] = {"ranks": ranks, "planes": 2, "dtype": "float32", "beside": "one busy process"}
    with busy_process():
        _log(f"contended: mrc all_reduce on {ranks} ranks beside a busy process ...")
        out["mrc"] = mrc = _mrc_all_reduce(ranks, 1)
        out["gloo"] = gloo = None
        if _have_torch():
            _log(f"contended: gloo all_reduce on {ranks} ranks beside a busy process ...")
            out["gloo"] = gloo = _gloo_all_reduce(ranks, 1)
    if gloo is not None:
        out.update(_ratios(mrc, gloo))
    return out


def _gloo(
    ranks: int, sizes: list[tuple[int, int]], netns: str | None = None, op: str = "all_reduce"
) -> dict[int, Any] | None:
    """gloo's all_reduce (or all_gather: ``op``; time µs, busbw GB/s) per size, ``ranks`` ranks under
    torchrun (in ``netns``)."""
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(GLOO_SCRIPT)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}", f.name]
    if netns is not None:
        cmd = ["ip", "netns", "exec", netns, *cmd]
    env = dict(os.environ, GLOO_SIZES=json.dumps(sizes), GLOO_OP=op)
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)
    finally:
        os.unlink(f.name)
    line = next((x for x in p.stdout.splitlines() if x.startswith("RESULT ")), None)
    return None if line is None else {int(k): v for k, v in json.loads(line[7:]).items()}


GLOO_LOSS_RUNS = 3


def gloo_under_loss(ranks: int, size: int) -> dict[str, Any]:
    """gloo clean and with 1 % of the packets dropped (the loopback of a namespace, nftables): the median
    of `GLOO_LOSS_RUNS` lossy runs, and each run's fraction."""
    if not _have_torch():
        return {"skipped": "torch is not installed"}
    if os.geteuid() != 0 or not shutil.which("nft") or not shutil.which("ip"):
        return {"skipped": "needs root, ip and nft (a namespace whose loopback drops 1 %)"}
    ns = f"omrc-gloo-{os.getpid()}"
    rule = (
        "add table inet omrcloss\n"
        "add chain inet omrcloss input { type filter hook input priority 0; }\n"
        "add rule inet omrcloss input numgen random mod 100 < 1 counter drop\n"
    )
    _log(f"faults: gloo clean and with 1 % loss ({size >> 20} MiB, {ranks} ranks, in a namespace) ...")
    in_ns = ["ip", "netns", "exec", ns]
    try:
        subprocess.run(["ip", "netns", "add", ns], check=True, capture_output=True)
        subprocess.run([*in_ns, "ip", "link", "set", "lo", "up"], check=True, capture_output=True)
        clean = _gloo(ranks, [(size, 6)], ns)
        subprocess.run([*in_ns, "nft", "-f", "-"], input=rule, text=True, check=True)
        # three runs: with 64 KiB segments on loopback, 1 % of packets is a handful of drops a step, and
        # whether one waits for TCP's retransmission timer decides a run (0.3-1.0 of clean between runs)
        lossy_runs = [_gloo(ranks, [(size, 6)], ns) for _ in range(GLOO_LOSS_RUNS)]
    except (OSError, subprocess.CalledProcessError) as exc:
        return {"skipped": f"namespace set-up failed: {exc}"}
    finally:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)
    if clean is None or any(r is None for r in lossy_runs):
        return {"error": "gloo did not finish"}
    c = clean[size][1]
    runs = sorted(r[size][1] for r in lossy_runs if r is not None)
    lo = runs[len(runs) // 2]
    return {
        "busbw_GBps_clean": round(c, 4),
        "busbw_GBps_loss1": round(lo, 4),
        "loss1_fraction": round(lo / c, 3),
        "loss1_fractions": [round(x / c, 3) for x in runs],
    }


def faults(ranks: int, size: int) -> dict[str, Any]:
    common = {"minbytes": size, "maxbytes": size, "iters": 6, "warmup": 1}
    _log(f"faults: clean, 1 % loss, a plane blackholed ({size >> 20} MiB all_reduce, {ranks} ranks) ...")
    clean = _mrc_rows(ranks, **common)[0]
    lossy = _mrc_rows(ranks, loss=0.01, **common)[0]
    failed = _mrc_rows(ranks, fail_plane=(2, 0.3), **common)[0]

    def bw(r: Any) -> float:
        return float((r.out_of_place.busbw + r.in_place.busbw) / 2)

    c = bw(clean)
    return {
        "size": size,
        "ranks": ranks,
        "busbw_GBps_clean": round(c, 4),
        "busbw_GBps_loss1": round(bw(lossy), 4),
        "loss1_fraction": round(bw(lossy) / c, 3),
        "retransmits_loss1": lossy.retransmits,
        "busbw_GBps_plane_blackholed": round(bw(failed), 4),
        "plane_blackholed_fraction": round(bw(failed) / c, 3),
        "gloo_loss1": gloo_under_loss(ranks, size),
        "gloo_plane": "gloo has no planes on loopback: its behaviour under a failed link is the testbed's",
    }


def testbed(steps: int) -> dict[str, Any]:
    if not _have_torch():
        return {"skipped": "torch is not installed"}
    from openmrc.testbed.netns import missing

    why = missing()
    if why:
        return {"skipped": why}
    _log("testbed: DDP training, gloo then mrc, a spine link blackholed ...")
    out = ROOT / "build" / "collective_bench"
    out.mkdir(parents=True, exist_ok=True)
    p = subprocess.run(
        [
            sys.executable,
            str(ROOT / "examples" / "testbed_train.py"),
            "--steps",
            str(steps),
            "--fail-step",
            str(steps // 3),
            "--heal-after",
            "8",
            "--out",
            str(out),
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    if p.returncode not in (0, 1) or not p.stdout.strip():
        return {"error": p.stderr.strip().splitlines()[-3:]}
    res: dict[str, Any] = json.loads(p.stdout)
    res["plot"] = str(out / "step_time.png")
    return res


def _world_all_reduce(hosts: int, size: int, algo: str, **kw: Any) -> tuple[bool, int, float]:
    """(results right, simulated ns, wall s) of the Communicator's all_reduce on ``hosts`` simulated hosts."""
    import numpy as np

    from openmrc.collectives.simworld import SimWorld

    t = time.perf_counter()
    w = SimWorld(_sim_fabric(hosts), **kw)
    xs = [np.full(size // 4, r % 5, np.float32) for r in range(hosts)]
    ns = w.run(lambda c, r: c.all_reduce(xs[r], algo=algo))
    wall = time.perf_counter() - t
    w.close()
    want = sum(r % 5 for r in range(hosts))
    return all(bool((x == want).all()) for x in xs), ns, wall


def _sim_fabric(hosts: int) -> Any:
    from openmrc.sim.config import FabricSimConfig
    from openmrc.sim.fabric_sim import FabricSim

    return FabricSim.clos(FabricSimConfig(planes=2, hosts=hosts, t0_radix=min(hosts, 32), t1_radix=64))


def _model(f: Any, flows: list[Any]) -> tuple[int, float]:
    t = time.perf_counter()
    f.run()
    return max(x.finish for x in flows) - min(x.start for x in flows), time.perf_counter() - t


def sim() -> dict[str, Any]:
    from openmrc.sim import workloads

    out: dict[str, Any] = {}
    for name, hosts, size, algo in (("ring_128", 128, 1 << 20, "ring"), ("rhd_1024", 1024, 1 << 20, "rhd")):
        _log(f"sim: {algo} all_reduce, {hosts} hosts ...")
        if algo == "ring":
            ok, ns, wall = _world_all_reduce(hosts, size, algo, chunk_bytes=max(4096, size // hosts))
            f = _sim_fabric(hosts)
            model, model_wall = _model(f, workloads.ring_allreduce(f, size))
        else:
            ok, ns, wall = _world_all_reduce(hosts, size, algo, chunk_bytes=size // 2, slots=2)
            f = _sim_fabric(hosts)
            workloads.hierarchical_allreduce(f, size, gpus_per_server=1, transient=False)
            model, model_wall = _model(f, f.flows)
        out[name] = {
            "hosts": hosts,
            "bytes": size,
            "correct": ok,
            "sim_us": round(ns / 1e3, 2),
            "flow_model_us": round(model / 1e3, 2),
            "ratio": round(ns / model, 3),
            "wall_s": round(wall, 2),
            "flow_model_wall_s": round(model_wall, 2),
        }
    out["rhd_1024"]["note"] = (
        "the flow model starts step j+1 once step j's send has completed (an ACK round trip) and the "
        "partner's step j has arrived; the Communicator starts it once the data it sends is reduced"
    )
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", help=f"comma-separated sections ({', '.join(SECTIONS)}); default all")
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--fault-size", default="16M", help="all_reduce size of the faults section")
    ap.add_argument("--train-steps", type=int, default=120)
    ap.add_argument("--json", action="store_true", help="print the results as JSON (else indented text)")
    args = ap.parse_args()
    only = [s.strip() for s in (args.only or ",".join(SECTIONS)).split(",") if s.strip()]
    bad = [s for s in only if s not in SECTIONS]
    if bad:
        ap.error(f"--only {','.join(bad)}: sections are {', '.join(SECTIONS)}")
    if not 2 <= args.ranks <= 16:
        ap.error("--ranks: 2..16")
    if not 12 <= args.train_steps <= 10_000:
        ap.error("--train-steps: 12..10000")
    import typer

    from openmrc.cli.perf import parse_size

    try:
        fault_size = parse_size(args.fault_size)
    except typer.BadParameter as exc:
        ap.error(f"--fault-size {exc.message}")
    if not 1 << 16 <= fault_size <= 1 << 28:
        ap.error("--fault-size: 64K .. 256M")
    results: dict[str, Any] = {}
    if "loopback" in only:
        results["loopback"] = loopback(args.ranks)
    if "contended" in only:
        results["contended"] = contended(args.ranks)
    if "faults" in only:
        results["faults"] = faults(args.ranks, fault_size)
    if "testbed" in only:
        results["testbed"] = testbed(args.train_steps)
    if "sim" in only:
        results["sim"] = sim()
    print(json.dumps(results, indent=2 if not args.json else None))
    return 0


if __name__ == "__main__":
    sys.exit(main())
