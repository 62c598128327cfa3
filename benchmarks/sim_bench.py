"""Simulator speed and results (the parts that exist so far; see the fabric/simulator issue for the rest).

``clos-perm``: a permutation on a multi-plane two-tier Clos (default 8 planes, 256 hosts, 32-port switches,
1 MiB per host), MRC spraying over up to 128 SRv6 paths. ``htsim-perm``: htsim's 2 MB permutation on its
k-ary fat tree (default k=16: 1,024 hosts), MRC with 128 (or ``--evs``) ECMP-hashed EVs. Both print wall
time, packet-hops per second, peak RSS and the flow completion times.

    python benchmarks/sim_bench.py [--json] [--only clos-perm|htsim-perm] [--hosts 256] [--planes 8]
                                   [--radix 32] [--kib 1024] [--k 16] [--evs 128]
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import time

from openmrc.fabric import FatTree
from openmrc.sim.clos_sim import ClosSim, ClosSimConfig, FabricSim, fat_tree_sim


def _permutation(sim: FabricSim, size: int, seed: int) -> None:
    hosts = sim.topo.num_hosts
    perm = list(range(hosts))
    random.Random(seed).shuffle(perm)
    for s, d in enumerate(perm):
        if s != d:
            sim.add_flow(s, d, size)


def clos_perm(hosts: int, planes: int, radix: int, kib: int, seed: int = 1) -> dict[str, float]:
    t0 = time.perf_counter()
    sim = ClosSim(ClosSimConfig(planes=planes, hosts=hosts, t0_radix=radix, t1_radix=radix, seed=seed))
    _permutation(sim, kib << 10, seed)
    build = time.perf_counter() - t0
    return _run(sim, build, (kib << 10) * 8 / (planes * 100e9) * 1e6)


def htsim_perm(
    k: int, size: int = 2_000_000, evs: int = 128, seed: int = 1, roce_qps: int = 0
) -> dict[str, float]:
    """htsim's permutation on its k-ary fat tree (k=16: 1,024 hosts), 100 Gb/s, 1 µs links, ECMP-hashed
    EVs. Differences from htsim: 4,084-byte payloads (multiple of 4) + 64 B of headers = 4,148 B."""
    t0 = time.perf_counter()
    if roce_qps:  # the RoCEv2 baseline: go-back-N, one path per QP, drop-tail (no trimming, no PFC)
        cfg = ClosSimConfig(
            routing="ecmp", mtu=4084, seed=seed, transport="roce", roce_qps=roce_qps, trimming=False
        )
    else:
        cfg = ClosSimConfig(routing="ecmp", mtu=4084, evs_per_qp=evs, seed=seed)
    sim = fat_tree_sim(FatTree.from_k(k), cfg)
    _permutation(sim, size, seed)
    build = time.perf_counter() - t0
    return _run(sim, build, size * 8 / 100e9 * 1e6)


def _run(sim: FabricSim, build: float, ideal_us: float) -> dict[str, float]:
    t0 = time.perf_counter()
    res = sim.run(until=10**10)
    wall = time.perf_counter() - t0
    s = res.summary()
    return {
        "build_s": build,
        "wall_s": wall,
        "packet_hops_per_s": s["packet_hops"] / wall,
        "events_per_s": s["events"] / wall,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "median_fct_us": s.get("median_fct_us", float("nan")),
        "tail_fct_us": s.get("max_fct_us", float("nan")),
        "ideal_fct_us": ideal_us,
        "completed": s["completed"],
        "flows": s["flows"],
        "retransmits": s["retransmits"],
        "trims": s["trims"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--hosts", type=int, default=256)
    ap.add_argument("--planes", type=int, default=8)
    ap.add_argument("--radix", type=int, default=32)
    ap.add_argument("--kib", type=int, default=1024)
    ap.add_argument("--only", choices=["clos-perm", "htsim-perm"], default="clos-perm")
    ap.add_argument("--k", type=int, default=16, help="fat-tree k for htsim-perm (16 = 1,024 hosts)")
    ap.add_argument("--evs", type=int, default=128, help="EVs per QP for htsim-perm")
    ap.add_argument("--roce-qps", type=int, default=0, help="htsim-perm with the RoCEv2 baseline and N QPs")
    a = ap.parse_args()
    r = (
        clos_perm(a.hosts, a.planes, a.radix, a.kib)
        if a.only == "clos-perm"
        else htsim_perm(a.k, evs=a.evs, roce_qps=a.roce_qps)
    )
    if a.json:
        print(json.dumps({k: round(v, 3) for k, v in r.items()}))
        return
    for k, v in r.items():
        print(f"{k:20s} {v:,.3f}")


if __name__ == "__main__":
    main()
