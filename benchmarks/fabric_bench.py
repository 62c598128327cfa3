"""Fabric model at production scale: the 131,072-host, 8-plane, 512×100G two-tier Clos.

Prints build time, link enumeration time, SRv6 table generation for every switch, and peak RSS.

    python benchmarks/fabric_bench.py [--json] [--tables]
"""

from __future__ import annotations

import argparse
import json
import resource
import time

from openmrc.fabric.clos import MultiPlaneClos
from openmrc.fabric.srv6 import UsidPlan


def measure(tables: bool) -> dict[str, float]:
    t0 = time.perf_counter()
    topo = MultiPlaneClos(8, 131072, 512, 512, 100_000_000_000, 500)
    plan = UsidPlan(topo)
    build = time.perf_counter() - t0
    t0 = time.perf_counter()
    links = sum(1 for _ in topo.links())
    enum = time.perf_counter() - t0
    res: dict[str, float] = {"scale_build_s": build, "links": links, "links_enumerate_s": enum}
    if tables:
        t0 = time.perf_counter()
        routes = sum(len(plan.table(s)) for s in range(topo.num_hosts, topo.num_nodes()))
        res["routes"] = routes
        res["tables_s"] = time.perf_counter() - t0
    res["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--tables", action="store_true", help="also build every switch's static table")
    args = ap.parse_args()
    r = measure(args.tables)
    if args.json:
        print(json.dumps({k: v if isinstance(v, int) else round(v, 3) for k, v in r.items()}))
        return
    for k, v in r.items():  # counts as whole numbers, times and sizes with three decimals
        print(f"{k:20s} {v:,}" if isinstance(v, int) else f"{k:20s} {v:,.3f}")


if __name__ == "__main__":
    main()
