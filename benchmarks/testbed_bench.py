"""Failure bypass on the real kernel: a namespace testbed (2 planes × 2 spines, 4 hosts), ``openmrc perf``
from host0 to host3 for ``--seconds``, host0's plane-0 link to the second spine blackholed 1 s in and
healed 1 s later. Once in SRv6 mode (one uSID path per EV) and once in ECMP mode (STEV flow labels).

Per mode: ``goodput_before`` / ``goodput_during`` / ``goodput_after`` (Gb/s, per report: every 5 ms, which
is the resolution of the times below; times count from the moment the fault, or the heal, was in effect
at both ends of the link: ``fault_apply_s`` says how long applying it took, a bound on how much sooner
the first direction may have been dropped),
``detect_s`` (fault → the first report with an EV out of use, held or ASSUMED_BAD: the time to route
around the blackholed spine link), ``blame_s`` (→ the first EV ASSUMED_BAD), ``recover_s`` (heal → every
EV GOOD and in use again, by probes), ``retransmits``, ``max_bad`` of ``evs``, the packets each spine
received, and whether the buffer arrived bit-exact. Needs root.

    sudo python benchmarks/testbed_bench.py [--json] [--seconds 4] [--gbps 2] [--interval-ms 5]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile

from openmrc import _native
from openmrc.testbed import Testbed, missing
from openmrc.testbed.experiment import failover

LINK = "p0-t0-0--p0-t1-1"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--gbps", type=float, default=2.0, help="rate of one port (pacing)")
    ap.add_argument(
        "--interval-ms", type=float, default=5.0, help="perf's report interval: the times' resolution"
    )
    args = ap.parse_args()
    why = missing()
    if why:
        print(f"testbed_bench: {why}", file=sys.stderr)
        return 1
    out: dict[str, object] = {"build": "compiled" if _native.compiled else "interpreted", "link": LINK}
    for mode in ("srv6", "ecmp"):
        with tempfile.TemporaryDirectory() as tmp:
            bed = Testbed(prefix=f"omrcb-{mode[0]}-", state_dir=tmp)
            bed.down()
            bed.up(2, 4, 2, mode=mode)
            try:
                r = failover(
                    bed,
                    link=LINK,
                    duration=args.seconds,
                    fail_at=1.0,
                    heal_at=2.0,
                    link_gbps=args.gbps,
                    interval=args.interval_ms / 1000,
                )
            finally:
                bed.down()
        d = r.as_dict()
        d.pop("intervals")
        out[mode] = d
        if not args.json:
            print(
                f"{mode:5} ({r.mode} EVs, {r.evs} per QP): goodput before {r.goodput_before:.3f} / during "
                f"{r.goodput_during:.3f} / after {r.goodput_after:.3f} Gb/s; blackhole detected in "
                f"{_ms(r.detect_s)} (applying it took {_ms(r.fault_apply_s)}), EVs back {_ms(r.recover_s)} "
                f"after the heal; {r.retransmits} "
                f"retransmissions, at most {r.max_bad} EVs bad; bit-exact {r.hash_ok}; "
                f"spines {r.spine_packets}"
            )
    if args.json:
        print(json.dumps(out, indent=2))
    return 0


def _ms(s: float | None) -> str:
    return "never" if s is None else f"{s * 1000:.0f} ms"


if __name__ == "__main__":
    sys.exit(main())
