"""Transport core CPU cost: µs per data packet on the requester and responder paths.

A 64 MiB RDMA Write through the scripted loopback (openmrc.transport.loopback: two NICs, 4 planes, no
impairments). Every call into each NIC is timed, the fabric model's own work is not, so the figures are
protocol processing: the requester path is NIC A (segmentation, spraying, SACK processing, timers),
the responder path NIC B (validation, placement, bitmap, SACK generation).

    python benchmarks/transport_bench.py [--json] [--mib 64] [--validate-wire]
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from typing import Any

from openmrc.transport import Nic, NicConfig
from openmrc.transport.loopback import Pair


class _Timed:
    """Wraps a NIC's driver-facing methods and adds up the time spent in them."""

    def __init__(self, nic: Nic) -> None:
        self.ns = 0
        for name in ("receive", "datagrams_to_send", "handle_timer", "get_timer"):
            setattr(nic, name, self._wrap(getattr(nic, name)))

    def _wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter_ns()
            try:
                return fn(*args, **kwargs)
            finally:
                self.ns += time.perf_counter_ns() - t0

        return timed


def measure(mib: int, validate_wire: bool = False) -> dict[str, float]:
    size = mib << 20
    p = Pair(seed=1, buf_size=size, config=NicConfig(validate_wire=validate_wire))
    ta, tb = _Timed(p.a), _Timed(p.b)
    p.write(0, size)
    t0 = time.perf_counter()
    p.run(lambda: len(p.qp_a.send_cq) > 0, max_time=10**12, max_steps=10**8)
    wall = time.perf_counter() - t0
    wc = p.completions()
    assert wc and wc[0].status.name == "SUCCESS" and p.dst == p.src, "transfer failed"
    pkts = p.a.stats.tx_data
    req_us = ta.ns / pkts / 1000
    rsp_us = tb.ns / pkts / 1000
    return {
        "requester_us_per_pkt": req_us,
        "responder_us_per_pkt": rsp_us,
        # one core per side: the slower side bounds the rate
        "pair_goodput_gbps": size * 8 / (max(ta.ns, tb.ns)),
        "data_packets": pkts,
        "sacks": p.b.stats.sacks_sent,
        "sim_time_us": p.now / 1000,
        "wall_s": wall,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--mib", type=int, default=64)
    ap.add_argument("--validate-wire", action="store_true", help="encode and re-parse every packet")
    args = ap.parse_args()
    r = measure(args.mib, args.validate_wire)
    if args.json:
        print(json.dumps({k: round(v, 3) for k, v in r.items()}))
        return
    print(f"{args.mib} MiB Write, {r['data_packets']:.0f} data packets, {r['sacks']:.0f} SACKs")
    print(f"  requester path   {r['requester_us_per_pkt']:6.2f} µs per data packet")
    print(f"  responder path   {r['responder_us_per_pkt']:6.2f} µs per data packet")
    print(f"  pair goodput     {r['pair_goodput_gbps']:6.2f} Gbit/s of protocol processing, one core a side")
    print(f"  simulated time   {r['sim_time_us']:.0f} µs; wall {r['wall_s']:.2f} s")


if __name__ == "__main__":
    main()
