"""Simulator figures the fabric/simulator issue asks for, each part in its own process (own peak RSS).

Parts (``--only``):
  htsim-perm       scenario 1 (`htsim-perm-1024`), MRC with 128 EVs: wall time of the run (``wall_s``) and
                   of the whole process (``process_s``), packet-hops/s, events/s, peak RSS, tail and
                   median FCT (htsim: 200.5 / 194.5 µs in 15.7 s on a 2-core machine)
  htsim-perm-1ev   the same with 1 EV (htsim: tail 889.9 µs)
  htsim-perm-roce  the same with RoCEv2 over ECMP
  htsim-perm-2ranks  scenario 1, MRC with 128 EVs, split over 2 forked processes (`openmrc.sim.partition`,
                   ordered mode): ``wall_s_2ranks`` and the CPU time of both (``cpu_s_2ranks``); beside it
                   the same ordered run in 1 process (``wall_s_1rank``), whose results it must equal
                   (``speedup_2ranks``: run only, against that ordered run). Then, each in a fresh process
                   timed start to exit, the default one-process run (``process_s_1proc``) and the 2-rank
                   run (``process_s_2ranks``, its build ``build_s_2ranks``): ``speedup_2ranks_process``
                   (against the default run) and, at k=16, ``process_s_2ranks_vs_htsim`` (htsim: 18.1 s)
  link-failure     scenario 5: bypass time of a T0-T1 link failure and of a NIC port failure (MRC), and the
                   failed host's goodput after vs before (target: (k-1)/k)
  scale            the 131,072-host 8-plane Clos (512-port switches), permutation of 256 KiB per host:
                   build, set-up and run times (wall, and CPU: the machine may be shared), peak RSS after
                   build, after set-up and at the end (``scale_peak_rss_mb``), and per host; with
                   ``--scale-by-kind`` what is not a packet after set-up, KB per host by kind (ports, EV
                   entries, their bytes, EV tables, EV profiles, the NICs' random streams)
  scale-2ranks     the same in ordered mode split over 2 forked processes, each building and setting up
                   only its part (forked before building): ``scale_wall_s_2ranks`` (fork to results) and the
                   CPU time of both, and per rank its build, set-up and run loop times, its peak RSS after
                   build, after set-up and at the end (``scale_peak_rss_mb_per_rank_2ranks``), its
                   proportional set size at the end, the seconds before its loop (``scale_start_s_*``)
                   and for its share of the results, and rank 0's gathering and merging of the results;
                   the windows, the packets each rank received, and the CPU seconds each spent reading
                   them back and in the exchange
  qp-setup         setting up QP pairs between random hosts of the 8-plane Clos of 64-port switches of
                   `allreduce-hier-1k` (1,024 hosts, 32 EVs): CPU µs per pair (``qp_setup_us_per_pair``), the
                   collector paused as in a run; what an all-reduce pays for each pair at its first use
  clos-perm        a quick one: permutation on a 4-plane 64-host Clos
  allreduce        one hierarchical all-reduce step (`hierarchical_allreduce`, ``--allreduce-kib`` per GPU)
                   on the 8-plane Clos of 512-port switches with ``--allreduce-hosts`` GPUs: four cases (MRC,
                   MRC with a T0-T1 link failing in the first step, RoCEv2 with 8 QPs per message over the 8
                   planes, RoCEv2 with the failure), each in its own process: network step time, slowdown
                   vs the failure-free case, wall, CPU (``allreduce_gc_cpu_s``: the part spent in garbage
                   collections, and how many ran), peak RSS. ``allreduce_131k_step_us`` (a dict by
                   case) when run at 131,072 hosts, else ``allreduce_step_us``; the intra-server NVLink
                   phases are computed, not simulated (``allreduce_nvlink_us``). ``--allreduce-keep``:
                   every connection kept for the whole step instead of made and destroyed per use

    python benchmarks/sim_bench.py [--json] [--only PART] [--k 16] [--scale-hosts 131072] [--scale-evs 32]
                                   [--scale-ranks 2] [--scale-by-kind]
                                   [--allreduce-hosts 131072] [--allreduce-kib 1024] [--allreduce-keep]

Without ``--only`` every part but ``clos-perm``, ``scale-2ranks`` and ``allreduce`` runs (about 12 minutes
on a 2-core machine with the compiled core; ``scale`` is most of it). ``allreduce`` at 131,072 GPUs is four
runs of about 11–14 minutes and 4–6.5 GB each, and ``scale-2ranks`` at 131,072 hosts about 3.5 minutes and
5.7 GB per rank: they are asked for by name. ``--k 8`` (or 4) runs scenario 1's parts on a smaller fat tree
with htsim's matching permutation.
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import os
import random
import resource
import subprocess
import sys
import time
from typing import Any

from openmrc.sim import partition
from openmrc.sim.config import FabricSimConfig
from openmrc.sim.engine import PausedGc
from openmrc.sim.fabric_sim import FabricSim
from openmrc.sim.scenario import build_run, expand_runs, load_scenario
from openmrc.sim.workloads import hierarchical_allreduce, permutation
from openmrc.transport import QpInitAttr

HTSIM_PERM_S = 18.1
"""htsim's scenario 1 (k=16), whole process, on these machines."""
PERM_FILES = {16: "perm_1024n_1024c_0u_2000000b.cm", 8: "perm_128n_128c_2MB.cm", 4: "perm_16n_16c_2MB.cm"}
PARTS = (
    "htsim-perm",
    "htsim-perm-1ev",
    "htsim-perm-roce",
    "htsim-perm-2ranks",
    "link-failure",
    "scale",
    "scale-2ranks",
    "qp-setup",
    "clos-perm",
    "allreduce",
)
DEFAULT_PARTS = tuple(p for p in PARTS if p not in ("scale-2ranks", "clos-perm", "allreduce"))
AR_CASES = ("mrc", "mrc_failure", "roce", "roce_failure")
AR_FAIL_AT_NS = 2_000  # inside the first network step, the largest and the one that crosses the T1 tier
NVLINK_BPS = 3_600_000_000_000  # NVLink per GPU, one direction (450 GB/s, as H100 / B200 class servers)


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _huge_pages_mb() -> float | None:
    """This process's memory on transparent huge pages now (MB; `openmrc._native.huge_page_arenas`), or
    None where /proc does not tell."""
    try:
        with open("/proc/self/smaps_rollup") as f:
            for line in f:
                if line.startswith("AnonHugePages:"):
                    return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _process_s() -> float | None:
    """Wall time since this process started (interpreter start-up and imports included), or None where
    /proc does not tell."""
    try:
        with open("/proc/self/stat") as f:
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return uptime - start_ticks / os.sysconf("SC_CLK_TCK")


def _run(sim: FabricSim, until: int = 10**10) -> tuple[dict[str, Any], float]:
    t0, c0 = time.perf_counter(), time.process_time()
    res = sim.run(until=until)
    wall = time.perf_counter() - t0
    rep = res.report()
    rep["cpu_s"] = time.process_time() - c0  # on a shared machine, wall time includes others' load
    return rep, wall


def htsim_perm(variant: int, k: int) -> dict[str, Any]:
    """Variant 0: 128 EVs, 1: 1 EV, 2: RoCEv2 of the `htsim-perm-1024` scenario."""
    over = [f"fabric.k={k}", f'workload.file="{PERM_FILES[k]}"', "sample_us=0"]
    run = expand_runs(load_scenario("htsim-perm-1024", over))[variant]
    t0 = time.perf_counter()
    sim = build_run(run.doc)
    build = time.perf_counter() - t0
    rep, wall = _run(sim)
    suffix = ("128ev", "1ev", "roce")[variant]
    out = {
        f"tail_fct_us_{suffix}": rep.get("max_fct_us"),
        f"median_fct_us_{suffix}": rep.get("median_fct_us"),
        f"completed_{suffix}": rep["completed"],
        f"flows_{suffix}": rep["flows"],
        f"retransmits_{suffix}": rep["retransmits"],
        f"wall_s_{suffix}": wall,
        f"cpu_s_{suffix}": rep["cpu_s"],
    }
    if variant == 0:
        out |= {
            "wall_s": wall,
            "build_s": build,
            "packet_hops_per_s": rep["packet_hops"] / wall,
            "events_per_s": rep["events"] / wall,
            "peak_rss_mb": _rss_mb(),
            "huge_pages_mb": _huge_pages_mb(),
            "process_s": _process_s(),  # the whole process so far: what htsim's wall time compares with
            "trims": rep["trims"],
            "htsim_k": k,
        }
    return out


def htsim_perm_ranks(k: int) -> dict[str, Any]:
    """Scenario 1 (128 EVs) in ordered mode on 1 rank, then on 2 (forked): wall and CPU time of each run."""
    over = [f"fabric.k={k}", f'workload.file="{PERM_FILES[k]}"', "sample_us=0", "fabric.ordered=true"]
    out: dict[str, Any] = {}
    got = []
    for ranks in (1, 2):
        sim = build_run(expand_runs(load_scenario("htsim-perm-1024", over))[0].doc)
        t0, c0, kids0 = time.perf_counter(), time.process_time(), os.times().children_user
        res = partition.run_local(sim, ranks, 10**10)
        wall = time.perf_counter() - t0
        cpu = time.process_time() - c0 + os.times().children_user - kids0  # the forked ranks' too
        rep = res.report()
        name = "1rank" if ranks == 1 else "2ranks"
        out |= {f"wall_s_{name}": wall, f"cpu_s_{name}": cpu, f"tail_fct_us_{name}": rep.get("max_fct_us")}
        got.append([(f.finish, f.status) for f in res.flows] + [res.counters, res.events])
    out["speedup_2ranks"] = out["wall_s_1rank"] / out["wall_s_2ranks"]
    out["same_results_2ranks"] = got[0] == got[1]
    one, two = _whole_process(1, k), _whole_process(2, k)  # the same sitting: a ratio holds under load
    out |= {
        "process_s_1proc": one["process_s"],
        "cpu_s_1proc": one["cpu_s"],
        "process_s_2ranks": two["process_s"],
        "cpu_s_2ranks_process": two["cpu_s"],
        "build_s_2ranks": two["build_s"],
        "speedup_2ranks_process": one["process_s"] / two["process_s"],
    }
    if k == 16:  # htsim's figure is of the k=16 scenario
        out["process_s_2ranks_vs_htsim"] = two["process_s"] / HTSIM_PERM_S
    return out


def _whole_process(ranks: int, k: int) -> dict[str, Any]:
    """Scenario 1 start to exit in a fresh process: the default (unordered) run in one process, or the
    ordered run split over ``ranks`` forked ones; wall (``process_s``) and CPU of every process in it."""
    cmd = [sys.executable, __file__, "--json", "--process-ranks", str(ranks), "--k", str(k)]
    kids0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    done = subprocess.run(cmd, check=True, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    out: dict[str, Any] = json.loads(done.stdout)
    out["process_s"] = wall
    out["cpu_s"] = kids.ru_utime + kids.ru_stime - kids0.ru_utime - kids0.ru_stime  # its ranks' too
    return out


def whole_run(ranks: int, k: int, ordered: bool = False) -> dict[str, Any]:
    """One `_whole_process` run, in the process it times: its build and run times. ``ordered`` on 1 rank:
    the split run's way on one (`openmrc sim run --ranks 1`: ordered mode, through `partition`)."""
    over = [f"fabric.k={k}", f'workload.file="{PERM_FILES[k]}"', "sample_us=0"]
    if ranks > 1 or ordered:
        over.append("fabric.ordered=true")
    doc = expand_runs(load_scenario("htsim-perm-1024", over))[0].doc
    t0 = time.perf_counter()
    if ranks == 1 and not ordered:
        sim = build_run(doc)
        build = time.perf_counter() - t0
        res = sim.run(until=10**10)
    else:  # each rank builds its own part after the fork, as `openmrc sim run --ranks` does
        res = partition.run_local(functools.partial(_build_part, doc), ranks, 10**10)
        build = res.timings[0]["build_s"]
    return {
        "build_s": build,
        "run_s": time.perf_counter() - t0 - build,
        "tail_fct_us": res.report().get("max_fct_us"),
    }


def _build_part(doc: dict[str, Any], part: tuple[int, int] | None) -> FabricSim:
    return build_run(doc, part=part)


def link_failure() -> dict[str, Any]:
    """Scenario 5's two MRC variants: a T0-T1 link, then a NIC port, failing mid-permutation."""
    out: dict[str, Any] = {}
    runs = expand_runs(load_scenario("link-failure"))
    for run, key in ((runs[0], "link"), (runs[1], "nic_port")):
        sim = build_run(run.doc)
        rep, _wall = _run(sim, int(run.doc.get("until_us", 10_000) * 1000))
        (o,) = rep["outages"]
        out[f"bypass_us_{key}"] = o["bypass_us"]
        out[f"goodput_before_gbps_{key}"] = o.get("goodput_before_gbps")
        out[f"goodput_after_gbps_{key}"] = o.get("goodput_after_gbps")
        out[f"completed_{key}"] = f"{rep['completed']}/{rep['flows']}"
        if key == "nic_port":
            before, after = o.get("host_goodput_before_gbps"), o.get("host_goodput_after_gbps")
            planes = int(run.doc["fabric"]["planes"])
            out["host_goodput_before_gbps"] = before
            out["host_goodput_after_gbps"] = after
            out["host_goodput_after_vs_line_share"] = (
                None if after is None else after / (100 * (planes - 1))
            )  # vs (k-1)/k of the host's k × 100G
    out["bypass_us"] = out["bypass_us_link"]
    return out


def scale(
    hosts: int, evs: int, kib: int = 256, ranks: int | None = None, by_kind: bool = False
) -> dict[str, Any]:
    """The production shape (8 planes, 512-port switches) with ``hosts`` hosts; a permutation (in ordered
    mode split over ``ranks`` forked processes when given)."""
    t0 = time.perf_counter()
    cfg = FabricSimConfig(
        planes=8, hosts=hosts, t0_radix=512, t1_radix=512, evs_per_qp=evs, seed=1, ordered=ranks is not None
    )
    if ranks is not None:  # each rank builds its own part, after the fork
        return {"scale_hosts": hosts, "scale_evs_per_qp": evs} | _scale_split(cfg, kib, ranks)
    sim = FabricSim.clos(cfg)
    build = time.perf_counter() - t0
    rss_build = _rss_mb()
    c0 = time.process_time()
    permutation(sim, kib << 10, seed=1)
    setup = time.perf_counter() - t0 - build
    setup_cpu = time.process_time() - c0
    rss_setup = _rss_mb()
    kinds = _kinds_kb_per_host(sim) if by_kind else None  # its bookkeeping would raise the peak RSS
    rep, wall = _run(sim)
    peak = _rss_mb()
    huge = _huge_pages_mb()
    return {
        "scale_hosts": hosts,
        "scale_evs_per_qp": evs,
        "scale_build_s": build,
        "scale_setup_s": setup,
        "scale_setup_cpu_s": setup_cpu,
        "scale_wall_s": wall,
        "scale_cpu_s": rep["cpu_s"],
        "scale_process_s": _process_s(),
        "scale_rss_build_mb": rss_build,
        "scale_rss_setup_mb": rss_setup,
        "scale_peak_rss_mb": peak,
        "scale_huge_pages_mb": huge,
        "scale_peak_rss_kb_per_host": peak * 1024 / hosts,
        "scale_packet_hops_per_s": rep["packet_hops"] / wall,
        "scale_completed": rep["completed"],
        "scale_flows": rep["flows"],
        "scale_median_fct_us": rep.get("median_fct_us"),
        "scale_tail_fct_us": rep.get("max_fct_us"),
        "scale_ideal_fct_us": (kib << 10) * 8 / (8 * 100e9) * 1e6,
    } | ({} if kinds is None else {"scale_kb_per_host_by_kind": kinds})


def _kinds_kb_per_host(sim: FabricSim) -> dict[str, float]:
    """What is not a packet, after set-up, per host (KB): each object's ``sys.getsizeof``, counted once
    however many refer to it (ports share their `PortCold`, EV tables share their EVs' bytes with the
    profile)."""
    seen: set[int] = set()

    def size(*objs: object) -> int:
        n = 0
        for o in objs:
            if id(o) not in seen:
                seen.add(id(o))
                n += sys.getsizeof(o)
        return n

    out = dict.fromkeys(("ports", "ev_entries", "ev_bytes", "ev_tables", "ev_profiles", "nic_rng"), 0)
    for node in sim.nodes:
        out["ports"] += size(node.ports) + sum(size(p, p._cold) for p in node.ports)
    for h in sim.hosts:
        nic = getattr(h, "nic", None)
        if nic is None:
            continue
        out["nic_rng"] += size(nic.profiles.rng)
        for b in nic.profiles.ev.values():
            out["ev_bytes"] += sum(size(ev) for ev in b._evs)
            out["ev_profiles"] += size(b, b._evs, b._ports, b._echoes)
        for qp in nic.qps.values():
            t = qp.evs
            if t is None:
                continue
            out["ev_entries"] += sum(size(e) for e in t.entries)
            out["ev_bytes"] += sum(size(e.expanded) for e in t.entries)
            out["ev_tables"] += size(t, t.entries, t.rotation, t._backups, t._index, t.bad, t.doubted)
    return {k: round(v / 1024 / len(sim.hosts), 2) for k, v in out.items()}


def _scale_split(cfg: FabricSimConfig, kib: int, ranks: int) -> dict[str, Any]:
    """`scale` split over ``ranks`` forked processes, each building and setting up only its part: the whole
    (fork to results) wall and CPU time, and each rank's build, set-up, run loop and memory."""
    whole: dict[str, float] = {}  # one rank's phases (it builds the whole fabric, in this process)

    def build(part: tuple[int, int] | None) -> FabricSim:
        t0, c0 = time.perf_counter(), time.process_time()
        sim = FabricSim.clos(cfg, part=partition.assign(cfg.clos(), part))
        t1, c1 = time.perf_counter(), time.process_time()
        permutation(sim, kib << 10, seed=1)
        phases = {
            "fabric_s": t1 - t0,
            "fabric_cpu_s": c1 - c0,
            "fabric_rss_mb": _rss_mb(),
            "setup_s": time.perf_counter() - t1,
            "setup_cpu_s": time.process_time() - c1,
        }
        if sim.part is None:
            whole.update(phases)
        else:  # (they travel with the rank's timings)
            sim.part.build_times |= phases
        return sim

    t0, c0, kids0 = time.perf_counter(), time.process_time(), os.times().children_user
    res = partition.run_local(build, ranks, 10**10)
    wall = time.perf_counter() - t0
    cpu = time.process_time() - c0 + os.times().children_user - kids0
    rep = res.report()
    per = res.timings
    per[0] |= whole
    key = f"{ranks}ranks"

    def each(name: str, digits: int = 2) -> list[float]:
        return [round(t.get(name, 0.0), digits) for t in per]

    return {
        f"scale_wall_s_{key}": wall,
        f"scale_cpu_s_{key}": cpu,
        f"scale_build_s_per_rank_{key}": each("fabric_s"),
        f"scale_build_cpu_s_per_rank_{key}": each("fabric_cpu_s"),
        f"scale_setup_s_per_rank_{key}": each("setup_s"),
        f"scale_setup_cpu_s_per_rank_{key}": each("setup_cpu_s"),
        f"scale_run_s_per_rank_{key}": [
            round(t["run_s"] + t["pack_s"] + t["exchange_s"] + t["unpack_s"], 2) for t in per
        ],
        f"scale_run_cpu_s_per_rank_{key}": each("cpu_s"),
        f"scale_rss_fabric_mb_per_rank_{key}": each("fabric_rss_mb", 0),
        f"scale_rss_setup_mb_per_rank_{key}": each("build_rss_mb", 0),
        f"scale_crossing_cpu_s_per_rank_{key}": [  # unpacking (reading back) and the exchange (pickling)
            [round(t["unpack_cpu_s"], 2), round(t["exchange_cpu_s"], 2)] for t in per
        ],
        f"scale_windows_crossing_{key}": [per[0]["windows"], [int(t["crossing"]) for t in per]],
        f"scale_start_s_per_rank_{key}": each("start_s"),
        f"scale_results_s_per_rank_{key}": each("partial_s"),
        f"scale_gather_merge_s_rank0_{key}": [round(per[0]["gather_s"], 2), round(per[0]["merge_s"], 2)],
        f"scale_peak_rss_mb_per_rank_{key}": each("peak_rss_mb", 0),
        f"scale_pss_mb_per_rank_{key}": each("pss_mb", 0),
        f"scale_completed_{key}": rep["completed"],
        f"scale_tail_fct_us_{key}": rep.get("max_fct_us"),
        f"scale_median_fct_us_{key}": rep.get("median_fct_us"),
    }


def qp_setup(pairs: int = 4000) -> dict[str, Any]:
    sim = FabricSim.clos(
        FabricSimConfig(
            planes=8, hosts=1024, t0_radix=64, t1_radix=64, evs_per_qp=32, seed=1, latency_ns=1000
        )
    )
    rng = random.Random(5)
    todo: dict[tuple[int, int], None] = {}
    while len(todo) < pairs:
        a, b = rng.randrange(1024), rng.randrange(1024)
        if a != b:
            todo[a, b] = None
    hosts = [sim.host(i) for i in range(1024)]
    cqs = [h.create_cq() for h in hosts]
    c0 = time.process_time()
    with PausedGc():
        for a, b in todo:
            ha, hb = hosts[a], hosts[b]
            qa = ha.create_qp(QpInitAttr(send_cq=cqs[a], recv_cq=cqs[a]))
            qb = hb.create_qp(QpInitAttr(send_cq=cqs[b], recv_cq=cqs[b]))
            ha.connect(qa, b, qb.qp_num)
            hb.connect(qb, a, qa.qp_num)
    return {"qp_setup_us_per_pair": (time.process_time() - c0) / pairs * 1e6, "qp_setup_pairs": pairs}


def clos_perm() -> dict[str, Any]:
    sim = FabricSim.clos(FabricSimConfig(planes=4, hosts=64, t0_radix=16, t1_radix=16, seed=1))
    permutation(sim, 1 << 20, seed=1)
    rep, wall = _run(sim)
    return {
        "clos_wall_s": wall,
        "clos_packet_hops_per_s": rep["packet_hops"] / wall,
        "clos_median_fct_us": rep.get("median_fct_us"),
        "clos_tail_fct_us": rep.get("max_fct_us"),
    }


class _GcTime:
    """CPU time spent in garbage collections while installed (``with _GcTime() as g:``), and how many ran."""

    def __init__(self) -> None:
        self.cpu_s = 0.0
        self.collections = 0
        self._at = 0.0

    def _seen(self, phase: str, _info: dict[str, Any]) -> None:
        if phase == "start":
            self._at = time.process_time()
        else:
            self.cpu_s += time.process_time() - self._at
            self.collections += 1

    def __enter__(self) -> _GcTime:
        gc.callbacks.append(self._seen)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._seen)


def allreduce_case(case: str, hosts: int, kib: int, keep: bool = False) -> dict[str, Any]:
    """One all-reduce case (one of `AR_CASES`) in this process; ``keep``: every connection for the whole
    step (no transient connections)."""
    t0 = time.perf_counter()
    roce = case.startswith("roce")
    kw: dict[str, Any] = (
        {"transport": "roce", "routing": "ecmp", "trimming": False, "roce_qps": 8, "roce_planes": 0}
        if roce
        else {}
    )
    cfg = FabricSimConfig(planes=8, hosts=hosts, t0_radix=512, t1_radix=512, evs_per_qp=32, seed=1, **kw)
    sim = FabricSim.clos(cfg)
    build = time.perf_counter() - t0
    job = hierarchical_allreduce(sim, kib << 10, transient=not keep)
    if case.endswith("failure"):
        sim.faults.fail_link(*sim.faults.t0_uplink(0, 0, 0), AR_FAIL_AT_NS, None)
    with _GcTime() as gct:
        rep, wall = _run(sim)
    step = job.step_ns()
    return {
        "step_us": None if step is None else step / 1000,
        "build_s": build,
        "wall_s": wall,
        "cpu_s": rep["cpu_s"],
        "gc_cpu_s": gct.cpu_s,
        "gc_collections": gct.collections,
        "peak_rss_mb": _rss_mb(),
        "flows": rep["flows"],
        "completed": rep["completed"],
        "retransmits": rep["retransmits"],
        "packet_hops": rep["packet_hops"],
        "nvlink_us": job.nvlink_ns(NVLINK_BPS) / 1000,
        "network_bytes_per_gpu": job.network_bytes(),
        "steps": job.steps,
    }


def allreduce(hosts: int, kib: int, keep: bool = False) -> dict[str, Any]:
    """The four cases, each in a fresh process (its own peak RSS)."""
    got: dict[str, dict[str, Any]] = {}
    for case in AR_CASES:
        cmd = [sys.executable, __file__, "--json", "--allreduce-case", case]
        cmd += ["--allreduce-hosts", str(hosts), "--allreduce-kib", str(kib)]
        cmd += ["--allreduce-keep"] if keep else []
        done = subprocess.run(cmd, check=True, capture_output=True, text=True)
        got[case] = json.loads(done.stdout)
        print(f"# allreduce {case}: {got[case]}", file=sys.stderr)
    steps = {c: got[c]["step_us"] for c in AR_CASES}
    out: dict[str, Any] = {
        "allreduce_131k_step_us" if hosts == 131_072 else "allreduce_step_us": steps,
        "allreduce_hosts": hosts,
        "allreduce_kib_per_gpu": kib,
        "allreduce_network_steps": got["mrc"]["steps"],
        "allreduce_network_bytes_per_gpu": got["mrc"]["network_bytes_per_gpu"],
        "allreduce_nvlink_us": got["mrc"]["nvlink_us"],  # computed at NVLINK_BPS, not simulated
        "allreduce_connections": "kept" if keep else "transient",
    }
    for base in ("mrc", "roce"):
        ok, failed = steps[base], steps[f"{base}_failure"]
        out[f"allreduce_slowdown_{base}"] = None if not ok or failed is None else failed / ok
    for key in (
        "wall_s",
        "cpu_s",
        "gc_cpu_s",
        "gc_collections",
        "peak_rss_mb",
        "build_s",
        "retransmits",
        "packet_hops",
    ):
        out[f"allreduce_{key}"] = {c: got[c][key] for c in AR_CASES}
    return out


def part(name: str, a: argparse.Namespace) -> dict[str, Any]:
    if name == "htsim-perm-2ranks":
        return htsim_perm_ranks(a.k)
    if name.startswith("htsim-perm"):
        return htsim_perm({"htsim-perm": 0, "htsim-perm-1ev": 1, "htsim-perm-roce": 2}[name], a.k)
    if name == "link-failure":
        return link_failure()
    if name == "scale":
        return scale(a.scale_hosts, a.scale_evs, by_kind=a.scale_by_kind)
    if name == "scale-2ranks":
        return scale(a.scale_hosts, a.scale_evs, ranks=a.scale_ranks)
    if name == "allreduce":
        return allreduce(a.allreduce_hosts, a.allreduce_kib, a.allreduce_keep)
    if name == "qp-setup":
        return qp_setup()
    return clos_perm()


def _rounded(v: Any) -> Any:
    if isinstance(v, float):
        return round(v, 3)
    if isinstance(v, dict):
        return {k: _rounded(x) for k, x in v.items()}
    return v


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--only", choices=PARTS)
    ap.add_argument("--k", type=int, default=16, choices=sorted(PERM_FILES), help="fat tree for scenario 1")
    ap.add_argument("--scale-hosts", type=int, default=131_072)
    ap.add_argument("--scale-evs", type=int, default=32, help="EVs per QP in the scale run")
    ap.add_argument(
        "--scale-by-kind",
        action="store_true",
        help="scale: what is not a packet after set-up, KB per host by kind (raises the peak RSS)",
    )
    ap.add_argument("--scale-ranks", type=int, default=2, help="ranks of the scale-2ranks part (keys say it)")
    ap.add_argument("--allreduce-hosts", type=int, default=131_072)
    ap.add_argument("--allreduce-kib", type=int, default=1024, help="all-reduce buffer per GPU (KiB)")
    ap.add_argument(
        "--allreduce-keep", action="store_true", help="all-reduce: keep every connection for the whole step"
    )
    ap.add_argument("--allreduce-case", choices=AR_CASES, help=argparse.SUPPRESS)  # one case, in-process
    ap.add_argument("--process-ranks", type=int, help=argparse.SUPPRESS)  # one `_whole_process` run
    ap.add_argument("--ordered", action="store_true", help=argparse.SUPPRESS)  # on 1 rank, ordered
    a = ap.parse_args()
    only = a.only or a.allreduce_case or a.process_ranks
    if a.process_ranks:
        out = whole_run(a.process_ranks, a.k, a.ordered)
    elif a.allreduce_case:
        out = allreduce_case(a.allreduce_case, a.allreduce_hosts, a.allreduce_kib, a.allreduce_keep)
    elif a.only:
        out = part(a.only, a)
    else:
        out = {}
        for name in DEFAULT_PARTS:  # each in a fresh process, so peak RSS is the part's own
            cmd = [sys.executable, __file__, "--json", "--only", name, "--k", str(a.k)]
            cmd += ["--scale-hosts", str(a.scale_hosts), "--scale-evs", str(a.scale_evs)]
            done = subprocess.run(cmd, check=True, capture_output=True, text=True)
            out |= json.loads(done.stdout)
            if not a.json:
                print(f"# {name} done", file=sys.stderr)
    if a.json:
        print(json.dumps(_rounded(out)))
    else:
        for k, v in _rounded(out).items():
            print(f"{k:34s} {v:,.3f}" if isinstance(v, float) else f"{k:34s} {v}")
    if only:
        # a part's process ends here: the interpreter would free its heap object by object (about 40 s
        # after the 131,072-host run), the OS takes it back at once
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


if __name__ == "__main__":
    main()
