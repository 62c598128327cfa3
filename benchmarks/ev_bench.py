"""EV expansion and generation speed (an SRv6 profile: 32-bit locator + 4 uSIDs with fixed parts).

python benchmarks/ev_bench.py [--json]
"""

from __future__ import annotations

import argparse
import json
import random
import time

from openmrc.ev import EVField, EVFormatMode, EVFormatProfile, EVProfile, EVProfileMode


def measure() -> dict[str, float]:
    fmt = EVFormatProfile(EVFormatMode.SRV6, (32, 16, 16, 16, 16))
    usids = [EVField(16, init_val=i << 8, min_val=1, max_val=0xF, mask=0xF) for i in range(1, 5)]
    fields = (EVField(32, init_val=0x13131313), *usids)
    prof = EVProfile(EVProfileMode.GEN, fmt, fields, ev_count=256, ev_min_active=8, event_mask=0)
    t0 = time.perf_counter()
    evs = prof.generate(random.Random(1))
    gen_us = (time.perf_counter() - t0) * 1e6
    n = 100_000
    t0 = time.perf_counter()
    for i in range(n):
        prof.expand(evs[i & 255])
    expand_ns = (time.perf_counter() - t0) / n * 1e9
    return {"expand_ns": expand_ns, "generate_256_us": gen_us}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", action="store_true")
    res = measure()
    if ap.parse_args().json:
        print(json.dumps({k: round(v, 1) for k, v in res.items()}))
    else:
        print(f"expand one EV        {res['expand_ns']:8.0f} ns")
        print(f"generate 256 EVs     {res['generate_256_us']:8.0f} µs")


if __name__ == "__main__":
    main()
