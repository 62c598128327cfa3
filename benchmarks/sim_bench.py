"""Simulator speed and results (the parts that exist so far; see the fabric/simulator issue for the rest).

``clos-perm``: a permutation on a multi-plane two-tier Clos (default 8 planes, 256 hosts, 32-port switches,
1 MiB per host), MRC spraying over up to 128 SRv6 paths. Prints wall time, packet-hops per second, peak
RSS and the flow completion times.

    python benchmarks/sim_bench.py [--json] [--hosts 256] [--planes 8] [--radix 32] [--kib 1024]
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import time

from openmrc.sim.clos_sim import ClosSim, ClosSimConfig


def clos_perm(hosts: int, planes: int, radix: int, kib: int, seed: int = 1) -> dict[str, float]:
    t0 = time.perf_counter()
    sim = ClosSim(ClosSimConfig(planes=planes, hosts=hosts, t0_radix=radix, t1_radix=radix, seed=seed))
    perm = list(range(hosts))
    random.Random(seed).shuffle(perm)
    for s, d in enumerate(perm):
        if s != d:
            sim.add_flow(s, d, kib << 10)
    build = time.perf_counter() - t0
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
        "ideal_fct_us": (kib << 10) * 8 / (planes * 100e9) * 1e6,
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
    a = ap.parse_args()
    r = clos_perm(a.hosts, a.planes, a.radix, a.kib)
    if a.json:
        print(json.dumps({k: round(v, 3) for k, v in r.items()}))
        return
    for k, v in r.items():
        print(f"{k:20s} {v:,.3f}")


if __name__ == "__main__":
    main()
