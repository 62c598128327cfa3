"""Scenario 1 side by side with htsim: whole-process wall time and peak RSS, paired rounds, one machine.

Each round runs htsim's validation permutation (``htsim_uec -tm perm_1024n_1024c_0u_2000000b.cm
-sender_cc_only -end 400 -paths 128``) and then openmrc's (``benchmarks/sim_bench.py --only htsim-perm``),
each in a process of its own, timed from spawn to exit (interpreter start-up and imports included) with the
peak RSS the kernel reports for it. Pairing the rounds and taking the median of the per-round ratios keeps
the comparison fair on a shared, noisy machine.

    python benchmarks/htsim_pair.py --htsim PATH/TO/htsim_uec [--rounds 3] [--ranks 2 [--one-rank]
                                    [--side-by-side]] [--json]

With ``--ranks N`` each round also runs scenario 1 split over N forked ranks (ordered mode, each rank
building its part after the fork: ``sim_bench.py --process-ranks N``), start to exit, right after the
other two: ``ranks_ratio_vs_htsim`` and ``speedup_ranks_vs_one_process`` (the one-process run of the same
round over the split one), each the median of the rounds' ratios. With ``--one-rank`` too, each round
also runs the split run's way on one rank (ordered mode through the same machinery: `openmrc sim run
--ranks 1`): ``speedup_ranks_vs_1rank`` (what splitting the same run gains) and ``ordered_cost`` (that run
over the one-process one: what the partition-independent order costs in one process).

With ``--side-by-side`` too, each round also runs N one-process runs at once (independent, nothing shared):
``side_by_side_slowdown`` is how much longer each takes than the round's one-process run alone (the
machine's own cost of running N busy processes: shared caches, memory bandwidth, a host's other guests),
and ``speedup_ceiling`` N over it, what a split over N ranks could gain here with no cost of its own.

With ``--htsim-huge-pages`` each round also runs htsim with glibc's heap on transparent huge pages
(``GLIBC_TUNABLES=glibc.malloc.hugetlb=1``), as openmrc keeps its objects
(`openmrc._native.huge_page_arenas`): ``wall_ratio_vs_htsim_huge_pages`` compares like with like.

htsim is not a dependency: build it from UEC's uet-htsim sources (``cmake -S htsim/sim -B build
-DCMAKE_BUILD_TYPE=Release && cmake --build build --target htsim_uec``; the binary is
``build/datacenter/htsim_uec``) and pass its path, or put it on PATH or in ``$HTSIM_UEC``. The tail FCT
of both runs is printed too, so the pair is known to have simulated the same thing.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CM = ROOT / "src" / "openmrc" / "sim" / "scenarios" / "data" / "perm_1024n_1024c_0u_2000000b.cm"
_FINISHED = re.compile(r"finished at ([0-9.]+)")
SIM_BENCH = [sys.executable, str(ROOT / "benchmarks" / "sim_bench.py"), "--json"]
"""openmrc's side of a round, each part of it a fresh process (its JSON on the last line)."""


def timed(cmd: list[str], env: dict[str, str] | None = None) -> tuple[float, float, str]:
    """Run ``cmd`` to its end in a scratch directory (htsim writes its log file where it runs), with
    ``env`` added to the environment: (wall seconds from spawn to exit, its own peak RSS in MB, its
    stdout)."""
    with tempfile.TemporaryFile("w+") as err, tempfile.TemporaryDirectory() as scratch:
        t0 = time.perf_counter()
        full = None if env is None else {**os.environ, **env}
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True, cwd=scratch, env=full)
        assert proc.stdout is not None
        out = proc.stdout.read()
        _pid, status, usage = os.wait4(proc.pid, 0)  # this child's own rusage, not all children's maximum
        wall = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        proc.stdout.close()
        if proc.returncode:
            err.seek(0)
            raise SystemExit(f"{cmd[0]} failed (exit {proc.returncode}): {err.read().strip()[-300:]}")
    return wall, usage.ru_maxrss / 1024, out


def htsim_binary(given: str | None) -> str:
    for cand in (given, os.environ.get("HTSIM_UEC"), shutil.which("htsim_uec")):
        if cand and Path(cand).is_file() and os.access(cand, os.X_OK):
            return cand
    raise SystemExit(
        "htsim_uec not found: pass --htsim PATH (or set HTSIM_UEC); see --help for how to build it"
    )


def pair(
    htsim: str,
    rounds: int,
    ranks: int = 1,
    huge: bool = False,
    one_rank: bool = False,
    side_by_side: bool = False,
) -> dict[str, Any]:
    ratios: list[float] = []
    huge_walls: list[float] = []
    huge_ratios: list[float] = []
    h_walls: list[float] = []
    o_walls: list[float] = []
    r_walls: list[float] = []
    r_ratios: list[float] = []
    speedups: list[float] = []
    one_walls: list[float] = []
    one_speedups: list[float] = []
    one_costs: list[float] = []
    slowdowns: list[float] = []
    r_tail = None
    r_rss = 0.0
    h_tail = o_tail = None
    h_rss = o_rss = 0.0
    for _ in range(rounds):
        htsim_cmd = [htsim, "-tm", str(CM), "-sender_cc_only", "-end", "400", "-paths", "128"]
        wall, rss, out = timed(htsim_cmd)
        h_walls.append(wall)
        h_rss = max(h_rss, rss)
        h_tail = max(float(x) for x in _FINISHED.findall(out))
        bench = [*SIM_BENCH, "--only", "htsim-perm"]
        wall_o, rss_o, out_o = timed(bench)
        o_walls.append(wall_o)
        got = json.loads(out_o.strip().splitlines()[-1])
        o_tail = got["tail_fct_us_128ev"]
        o_rss = max(o_rss, rss_o)
        ratios.append(wall_o / wall)
        if huge:
            wall_h, _rss, _out = timed(htsim_cmd, {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"})
            huge_walls.append(wall_h)
            huge_ratios.append(wall_o / wall_h)
        if ranks > 1:
            wall_r, rss_r, out_r = timed(
                [*SIM_BENCH, "--process-ranks", str(ranks), "--k", "16"]
            )  # (rss: rank 0's, the process spawned)
            r_walls.append(wall_r)
            r_rss = max(r_rss, rss_r)
            r_tail = json.loads(out_r.strip().splitlines()[-1])["tail_fct_us"]
            r_ratios.append(wall_r / wall)
            speedups.append(wall_o / wall_r)
            if one_rank:
                wall_1, _rss, _out = timed([*SIM_BENCH, "--process-ranks", "1", "--ordered", "--k", "16"])
                one_walls.append(wall_1)
                one_speedups.append(wall_1 / wall_r)
                one_costs.append(wall_1 / wall_o)
            if side_by_side:
                with ThreadPoolExecutor(ranks) as pool:
                    walls = [w for w, _rss, _out in pool.map(timed, [bench] * ranks)]
                slowdowns.append(statistics.mean(walls) / wall_o)
    split_figures: dict[str, Any] = {}
    if huge:
        split_figures |= {
            "htsim_huge_pages_wall_s": statistics.median(huge_walls),
            "wall_ratio_vs_htsim_huge_pages": statistics.median(huge_ratios),
        }
    if ranks > 1:
        split_figures |= {
            "ranks": ranks,
            "openmrc_ranks_wall_s": statistics.median(r_walls),
            "ranks_ratio_vs_htsim": statistics.median(r_ratios),
            "speedup_ranks_vs_one_process": statistics.median(speedups),
            "speedups": [round(r, 3) for r in speedups],
            "openmrc_ranks_rank0_peak_rss_mb": r_rss,
            "openmrc_ranks_tail_fct_us": r_tail,
        }
        if one_rank:
            split_figures |= {
                "openmrc_1rank_wall_s": statistics.median(one_walls),
                "speedup_ranks_vs_1rank": statistics.median(one_speedups),
                "speedups_vs_1rank": [round(r, 3) for r in one_speedups],
                "ordered_cost": statistics.median(one_costs),
            }
        if side_by_side:
            slowdown = statistics.median(slowdowns)
            split_figures |= {
                "side_by_side_slowdown": slowdown,
                "side_by_side_slowdowns": [round(r, 3) for r in slowdowns],
                "speedup_ceiling": ranks / slowdown,
            }
        if huge:
            pairs = zip(r_walls, huge_walls, strict=True)
            split_figures["ranks_ratio_vs_htsim_huge_pages"] = statistics.median(r / h for r, h in pairs)
    return split_figures | {
        "htsim_wall_s": statistics.median(h_walls),
        "openmrc_wall_s": statistics.median(o_walls),
        "wall_ratio_vs_htsim": statistics.median(ratios),
        "ratios": [round(r, 3) for r in ratios],
        "htsim_peak_rss_mb": h_rss,
        "openmrc_peak_rss_mb": o_rss,
        "htsim_tail_fct_us": h_tail,
        "openmrc_tail_fct_us": o_tail,
        "rounds": rounds,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--htsim", help="path of htsim_uec (default: $HTSIM_UEC, then PATH)")
    ap.add_argument("--rounds", type=int, default=3, help="paired rounds (median of their ratios)")
    ap.add_argument("--ranks", type=int, default=1, help="also run openmrc split over this many ranks")
    ap.add_argument(
        "--htsim-huge-pages", action="store_true", help="also run htsim with glibc's heap on huge pages"
    )
    ap.add_argument(
        "--one-rank", action="store_true", help="with --ranks: also run the split run's way on 1 rank"
    )
    ap.add_argument(
        "--side-by-side",
        action="store_true",
        help="with --ranks N: also run N one-process runs at once (what the machine allows a split)",
    )
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    a = ap.parse_args()
    if a.rounds < 1:
        ap.error("--rounds must be at least 1")
    if a.ranks < 1:
        ap.error("--ranks must be at least 1")
    if a.one_rank and a.ranks < 2:
        ap.error("--one-rank compares with a split run: give --ranks 2 or more")
    if a.side_by_side and a.ranks < 2:
        ap.error("--side-by-side runs as many processes as ranks: give --ranks 2 or more")
    out = pair(htsim_binary(a.htsim), a.rounds, a.ranks, a.htsim_huge_pages, a.one_rank, a.side_by_side)
    if a.json:
        print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in out.items()}))
        return
    for k, v in out.items():
        if isinstance(v, list):
            v = ", ".join(f"{x:.3f}" for x in v)
        print(f"{k:24s} {v:,.3f}" if isinstance(v, float) else f"{k:24s} {v}")


if __name__ == "__main__":
    main()
