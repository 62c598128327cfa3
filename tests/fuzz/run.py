"""Run the fuzz targets with atheris, or replay files through them without it.

    python -m tests.fuzz.run nic --seconds 600          # coverage-guided, ten minutes
    python -m tests.fuzz.run --seconds 600              # every target in turn, ten minutes each
    python -m tests.fuzz.run parse --runs 5000 --seed 1 # a bounded, reproducible run (what the tests do)
    python -m tests.fuzz.run nic --replay crash-1234    # a crash file (or a directory), plain traceback
    python -m tests.fuzz.run frame -- -jobs=2 -dict=x   # anything after -- goes to libFuzzer

The seed corpus ``tests/fuzz/corpus/<target>/`` is read, never written: new inputs go to
``build/fuzz/corpus/<target>/`` and crash, timeout and slow-input artifacts to ``build/fuzz/artifacts/``
(``--work`` moves both). The interpreted sources are fuzzed (``OPENMRC_PURE=1`` unless set): atheris measures
coverage on Python bytecode, which the mypyc-compiled modules do not run. One target runs in this
process (``atheris.Fuzz`` ends it); several run one after another in subprocesses.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

NAMES = ("parse", "frame", "nic")
HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent


def _args(argv: list[str]) -> argparse.Namespace:
    extra: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1 :]
    ap = argparse.ArgumentParser(prog="python -m tests.fuzz.run", description=(__doc__ or "").split("\n")[0])
    ap.add_argument("targets", nargs="*", metavar="TARGET", help=f"{', '.join(NAMES)} (default: all)")
    budget = ap.add_mutually_exclusive_group()
    budget.add_argument("--seconds", type=int, help="stop each target after this long (libFuzzer time)")
    budget.add_argument("--runs", type=int, help="stop each target after this many executions")
    ap.add_argument("--seed", type=int, help="libFuzzer's random seed (default: from the clock)")
    ap.add_argument("--work", type=Path, default=ROOT / "build" / "fuzz", help="new corpus and artifacts")
    ap.add_argument("--timeout", type=int, default=30, help="seconds one input may take before it is a hang")
    ap.add_argument(
        "--replay", nargs="+", type=Path, metavar="PATH", help="run files or directories through (no atheris)"
    )
    ns = ap.parse_args(argv)
    bad = [t for t in ns.targets if t not in NAMES]
    if bad:
        ap.error(f"unknown target(s) {', '.join(bad)}; choose from {', '.join(NAMES)}")
    ns.targets = ns.targets or list(NAMES)
    ns.libfuzzer = extra
    return ns


def _forward(ns: argparse.Namespace) -> list[str]:
    """The options of ``ns`` again, for a subprocess fuzzing one target."""
    out = ["--work", str(ns.work), "--timeout", str(ns.timeout)]
    for opt in ("seconds", "runs", "seed"):
        if getattr(ns, opt) is not None:
            out += [f"--{opt}", str(getattr(ns, opt))]
    return out + (["--", *ns.libfuzzer] if ns.libfuzzer else [])


def replay(target: str, paths: list[Path]) -> int:
    """Run every file under ``paths`` through ``target`` in this process; the first failure propagates."""
    from tests.fuzz.targets import TARGETS

    fn = TARGETS[target]
    files = sorted(f for p in paths for f in ([p] if p.is_file() else p.rglob("*")) if f.is_file())
    t0 = time.perf_counter()
    for f in files:
        try:
            fn(f.read_bytes())
        except BaseException:
            print(f"{target}: {f} FAILED", file=sys.stderr)
            raise
    print(f"{target}: {len(files)} input(s) replayed clean in {time.perf_counter() - t0:.2f} s")
    return 0


def fuzz(ns: argparse.Namespace, target: str) -> None:
    """Fuzz ``target`` with atheris in this process; does not return (libFuzzer exits)."""
    os.environ.setdefault("OPENMRC_PURE", "1")  # read when openmrc is first imported, just below
    import atheris

    import openmrc  # noqa: F401  (first, so that its source-only finder sits behind atheris' import hook)

    with atheris.instrument_imports(include=["openmrc", "tests"]):
        from tests.fuzz.targets import TARGETS

    work = ns.work / "corpus" / target
    artifacts = ns.work / "artifacts"
    work.mkdir(parents=True, exist_ok=True)
    artifacts.mkdir(parents=True, exist_ok=True)
    argv = [
        sys.argv[0],
        str(work),
        str(HERE / "corpus" / target),
        f"-artifact_prefix={artifacts}/{target}-",
        f"-timeout={ns.timeout}",
        "-print_final_stats=1",
    ]
    if ns.seconds is not None:
        argv.append(f"-max_total_time={ns.seconds}")
    if ns.runs is not None:
        argv.append(f"-runs={ns.runs}")
    if ns.seed is not None:
        argv.append(f"-seed={ns.seed}")
    argv += ns.libfuzzer
    atheris.Setup(argv, TARGETS[target])
    atheris.Fuzz()


def main(argv: list[str] | None = None) -> int:
    ns = _args(sys.argv[1:] if argv is None else argv)
    if ns.replay:
        for t in ns.targets:
            replay(t, ns.replay)
        return 0
    if len(ns.targets) == 1:
        fuzz(ns, ns.targets[0])
        return 0  # not reached
    worst = 0
    for t in ns.targets:
        print(f"== fuzzing {t}", flush=True)
        rc = subprocess.call([sys.executable, "-m", "tests.fuzz.run", t, *_forward(ns)], cwd=ROOT)
        print(f"== {t}: exit {rc}", flush=True)
        worst = worst or rc
    return worst


if __name__ == "__main__":
    sys.exit(main())
