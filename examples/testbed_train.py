"""MRC's promise on real kernels: DDP training across the 4 hosts of `openmrc testbed`, a spine link
blackholed mid-training (it stays up, as a bad optic does) and healed later -- over MRC, and over gloo on the
same fabric to compare.

    sudo python examples/testbed_train.py                 # brings the testbed up (and down) if needed
    sudo python examples/testbed_train.py --steps 200 --out results/

Each backend trains `examples/train_ddp.py` with one rank per namespace host (4 ranks). gloo runs first, over
TCP on plane 0's address; at step ``--fail-step`` the plane-0 spine link that carried most of its packets so
far is blackholed, and ``--heal-after`` seconds later it is healed. MRC then trains over the same fabric
(every plane, SRv6 or flow-label paths from the export) with the same link failed at the same step. Writes
``step_time.png`` (step time per step for both, failure and heal marked) and ``testbed_train.json`` (per
backend: mean step time before, during and after the failure, the slowest step, whether it finished) to
``--out``, and prints the summary. Needs root (network namespaces), ip, nft and the torch extra.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TRAIN = ROOT / "examples" / "train_ddp.py"


def _busiest_spine_link(bed: Any, before: dict[str, int]) -> str:
    """The plane-0 T0--T1 link that carried the most packets since ``before`` (a `status` snapshot)."""
    best, most = None, -1
    for row in bed.status():
        a, _, b = row["link"].partition("--")
        if row["plane"] != 0 or not any("-t1-" in n for n in (a, b)):
            continue
        n = row["a_to_b"] + row["b_to_a"] - before.get(row["link"], 0)
        if n > most:
            best, most = row["link"], n
    if best is None:
        raise RuntimeError("no plane-0 spine link in the testbed")
    return str(best)


def _snapshot(bed: Any) -> dict[str, int]:
    return {r["link"]: r["a_to_b"] + r["b_to_a"] for r in bed.status()}


def run_backend(
    bed: Any, backend: str, args: argparse.Namespace, out: Path, link: str | None, log: Any
) -> dict[str, Any]:
    """Train on every testbed host with ``backend``; fail ``link`` (None: the busiest plane-0 spine link)
    at ``--fail-step`` for ``--heal-after`` s. Returns the run's record."""
    fab = bed.fabric()
    n = fab.topo.num_hosts
    master = fab.host_address(0, 0)
    result = out / f"train_{backend}.json"
    result.unlink(missing_ok=True)
    procs = []
    base_env = {k: v for k, v in os.environ.items() if not k.startswith(("RANK", "WORLD_SIZE", "MASTER_"))}
    before = _snapshot(bed)
    for r in range(n):
        env = dict(base_env)
        env.update(
            RANK=str(r),
            WORLD_SIZE=str(n),
            LOCAL_RANK="0",
            MASTER_ADDR=master,
            MASTER_PORT="29511",
            OPENMRC_FABRIC=str(bed.export_dir),
            GLOO_SOCKET_IFNAME="eth0",  # gloo: TCP over plane 0's address
        )
        argv = [sys.executable, str(TRAIN), "--backend", backend, "--steps", str(args.steps)]
        argv += ["--width", str(args.width), "--batch", str(args.batch)]
        if r == 0:
            argv += ["--out", str(result)]
        procs.append(
            subprocess.Popen(
                bed.exec_argv(f"host{r}", argv),
                env=env,
                stdout=subprocess.PIPE if r == 0 else subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    record: dict[str, Any] = {"backend": backend, "link": link, "fail_time": None, "heal_time": None}
    step = [-1]
    last_at = [time.time()]

    def follow() -> None:
        assert procs[0].stdout is not None
        for line in procs[0].stdout:
            if line.startswith("step"):
                step[0] = int(line.split()[1])
                last_at[0] = time.time()

    reader = threading.Thread(target=follow, daemon=True)
    reader.start()
    deadline = time.time() + args.timeout
    try:
        while any(p.poll() is None for p in procs) and time.time() < deadline:
            now = time.time()
            if record["fail_time"] is None and step[0] >= args.fail_step:
                if link is None:
                    link = _busiest_spine_link(bed, before)
                    record["link"] = link
                bed.fail(link)
                record["fail_time"] = now
                log(f"  {backend}: step {step[0]}: {link} blackholed")
            fail_time = record["fail_time"]
            due = fail_time is not None and now >= fail_time + args.heal_after
            if due and record["heal_time"] is None and link is not None:
                bed.heal(link)
                record["heal_time"] = now
                log(f"  {backend}: step {step[0]}: {link} healed")
            if any(p.poll() not in (None, 0) for p in procs):
                break  # a rank failed: the others would wait for it
            time.sleep(0.02)
    finally:
        bed.heal()
        stalled = any(p.poll() is None for p in procs)
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
    errs = [p.stderr.read() if p.stderr else "" for p in procs]
    record["finished"] = result.exists() and all(p.returncode == 0 for p in procs)
    record["exit_codes"] = [p.returncode for p in procs]
    record["last_step"] = step[0]
    if stalled:
        record["stalled_for_s"] = round(time.time() - last_at[0], 1)
    if result.exists():
        data = json.loads(result.read_text())
        record.update(losses=data["losses"], step_s=data["step_s"], ends=data["ends"])
    if not record["finished"]:
        tail = [line for e in errs for line in e.splitlines() if line.strip() and "Warning" not in line][-6:]
        record["error"] = "\n".join(tail)
    return record


def summarise(rec: dict[str, Any]) -> dict[str, Any]:
    """Mean step time (ms) of the steps that started before, during and after the failure, and the
    slowest step."""
    ends, secs = rec.get("ends") or [], rec.get("step_s") or []
    f, h = rec.get("fail_time"), rec.get("heal_time")
    parts: dict[str, list[float]] = {"before": [], "during": [], "after": []}
    for i, (end, s) in enumerate(zip(ends, secs, strict=False)):
        if i < 2:
            continue  # warm-up
        start = end - s
        key = "before" if f is None or start < f else "during" if h is None or start < h else "after"
        parts[key].append(s * 1000)
    out: dict[str, Any] = {k + "_ms": (round(sum(v) / len(v), 2) if v else None) for k, v in parts.items()}
    out["slowest_ms"] = round(max(secs) * 1000, 1) if secs else None
    out["finished"] = rec["finished"]
    out["steps"] = len(secs)
    out["link"] = rec.get("link")
    if f is not None and h is not None:
        out["failure_s"] = round(h - f, 2)
    if "stalled_for_s" in rec:
        out["stalled_at_step"] = rec["last_step"]
        out["stalled_for_s"] = rec["stalled_for_s"]
    if "error" in rec:
        out["error"] = rec["error"]
    return out


def plot(records: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(
        len(records), 1, figsize=(10, 2.6 * len(records) + 0.6), sharex=True, squeeze=False
    )
    colors = {"mrc": "tab:blue", "gloo": "tab:orange"}
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    top = max((max(r.get("step_s") or [0]) for r in records), default=1) * 1000 * 1.5
    low = min((min(r.get("step_s") or [1]) for r in records), default=0.001) * 1000 * 0.7
    for ax, rec in zip(axes[:, 0], records, strict=True):
        secs, ends = rec.get("step_s") or [], rec.get("ends") or []
        c = colors.get(rec["backend"], "gray")
        if secs:
            ax.plot(range(len(secs)), [s * 1000 for s in secs], color=c, lw=1.2, marker=".", ms=3)
        marks = {}
        for key in ("fail_time", "heal_time"):
            t = rec.get(key)
            if t is not None and ends:
                marks[key] = next((i for i, e in enumerate(ends) if e >= t), len(ends) - 1)
        if "fail_time" in marks:
            ax.axvspan(marks["fail_time"], marks.get("heal_time", len(secs)), color="red", alpha=0.12, lw=0)
            ax.axvline(marks["fail_time"], color="red", ls="--", lw=1, label="link blackholed")
        if "heal_time" in marks:
            ax.axvline(marks["heal_time"], color="green", ls="--", lw=1, label="healed")
        state = "finished" if rec["finished"] else "did not finish"
        ax.set_title(f"{rec['backend']}: {state}", loc="left", fontsize=10)
        ax.set_yscale("log")
        ax.set_ylim(low, top)  # the same scale on every panel: the backends compare at a glance
        ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _p: f"{v:g}"))
        ax.yaxis.set_minor_formatter(NullFormatter())
        ax.set_ylabel("step time (ms)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(loc="upper right", fontsize=8)
    axes[-1, 0].set_xlabel("training step")
    link = next((r.get("link") for r in records if r.get("link")), "a spine link")
    fig.suptitle(f"DDP on 4 testbed hosts: spine link {link} blackholed, then healed")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--fail-step", type=int, default=40)
    ap.add_argument("--heal-after", type=float, default=8.0, help="seconds from the failure to the heal")
    ap.add_argument("--width", type=int, default=512)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument(
        "--mode",
        choices=["ecmp", "srv6"],
        default="ecmp",
        help="testbed mode if brought up (srv6 puts uSID addresses on the host ports, where gloo binds)",
    )
    ap.add_argument(
        "--backends", default="gloo,mrc", help="comma-separated, in order (gloo first picks the link)"
    )
    ap.add_argument("--timeout", type=float, default=240.0, help="seconds a backend's run may take")
    ap.add_argument("--out", default=".", help="directory for step_time.png and testbed_train.json")
    ap.add_argument("--json", action="store_true", help="print the summary as JSON")
    args = ap.parse_args()
    if not 4 <= args.steps <= 100_000 or not 1 <= args.fail_step < args.steps or args.heal_after <= 0:
        ap.error("--steps 4..100000, 1 <= --fail-step < --steps, --heal-after > 0")
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    if not backends or any(b not in ("mrc", "gloo") for b in backends):
        ap.error("--backends: mrc and/or gloo")
    out = Path(args.out)
    try:
        out.mkdir(parents=True, exist_ok=True)
        (out / ".write-test").write_text("")
        (out / ".write-test").unlink()
    except OSError as exc:
        print(f"error: --out {out}: {exc.strerror or exc}", file=sys.stderr)
        return 2

    from openmrc.testbed.netns import Testbed, TestbedError, missing

    why = missing()
    if why:
        print(f"error: {why}", file=sys.stderr)
        return 1
    bed = Testbed()
    log = (lambda m: print(m, file=sys.stderr)) if args.json else print
    brought_up = not bed.namespaces()
    records = []
    try:
        if brought_up:
            log(f"testbed up: 2 planes, 4 hosts, 2 spines per plane, {args.mode}")
            bed.up(2, 4, 2, mode=args.mode)
        link = None
        for b in backends:
            log(f"training with {b} ...")
            rec = run_backend(bed, b, args, out, link, log)
            link = link or rec.get("link")
            records.append(rec)
    except (TestbedError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    finally:
        if brought_up:
            bed.down()
    summary = {r["backend"]: summarise(r) for r in records}
    (out / "testbed_train.json").write_text(json.dumps({"summary": summary, "runs": records}, indent=1))
    plot(records, out / "step_time.png")
    if args.json:
        json.dump(summary, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        for b, s in summary.items():
            print(
                f"{b:5s} before {s['before_ms']} ms  during {s['during_ms']} ms  after {s['after_ms']} ms  "
                f"slowest {s['slowest_ms']} ms  finished {s['finished']}"
                + (
                    f"  (stalled at step {s['stalled_at_step']} for {s['stalled_for_s']} s)"
                    if "stalled_for_s" in s
                    else ""
                )
            )
        print(f"wrote {out / 'step_time.png'} and {out / 'testbed_train.json'}")
    return 0 if all(r["finished"] for r in records if r["backend"] == "mrc") else 1


if __name__ == "__main__":
    sys.exit(main())
