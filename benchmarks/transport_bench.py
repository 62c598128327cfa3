"""Transport core CPU cost: µs per data packet on the requester and responder paths.

A 64 MiB RDMA Write between the pair harness's two NICs (openmrc.provider.loopback: 4 planes, connected
QPs, registered buffers; no impairments), driven the way a NIC driver runs its loop: every tick (1 µs of
virtual time) each side is handed what arrived for it as one receive burst (`Nic.receive_burst`), runs its
timers and sends what it may; packets reach the other side a fixed latency later. Each side's tick is timed
as a whole, so the figures are protocol processing: the requester path is NIC A (segmentation, spraying,
SACK processing, timers), the responder path NIC B (validation, placement, bitmap, SACK generation). The
harness's own work (the wire between the NICs) is not counted.

    python benchmarks/transport_bench.py [--json] [--mib 64] [--repeat 5] [--validate-wire]

The transfer runs ``--repeat`` times (a fresh pair each time); the figures are the medians, so one burst of
load from elsewhere on a shared machine does not decide them.

Compiled modules (``make native``) are used when present; ``OPENMRC_PURE=1`` measures the interpreted core.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections import deque

from openmrc import _native
from openmrc.provider.loopback import Pair
from openmrc.transport import Nic, NicConfig, TrimMark
from openmrc.transport.nic import Arrival

LATENCY_NS = 2_000
TICK_NS = 1_000


def drive(p: Pair, *, max_time_ns: int = 10**10) -> tuple[int, int]:
    """Run ``p``'s transfer to its first send completion; the CPU ns spent inside NIC A and NIC B."""
    a, b = p.a, p.b
    inbox: dict[Nic, deque[tuple[int, list[Arrival]]]] = {a: deque(), b: deque()}
    spent = {a: 0, b: 0}
    sides = ((a, b, "a"), (b, a, "b"))  # (nic, peer, the name the peer's QP knows the nic by)
    clock = time.perf_counter_ns
    cq = p.qp_a.send_cq
    untrimmed = TrimMark.NONE
    now = 0
    while not len(cq):
        if now > max_time_ns:
            raise AssertionError("transfer did not finish")
        for nic, peer, me in sides:
            box = inbox[nic]
            t0 = clock()
            while box and box[0][0] <= now:
                nic.receive_burst(box.popleft()[1], now)  # the tick's receive burst, as a driver polls
            timer = nic.get_timer()
            if timer is not None and timer <= now:
                nic.handle_timer(now)
            out = nic.datagrams_to_send(now)
            spent[nic] += clock() - t0
            if out:  # the wire: what arrives at the peer a latency later (not timed)
                burst = [(t.packet, t.port, False, t.entropy, untrimmed, me) for t in out]
                inbox[peer].append((now + LATENCY_NS, burst))
        now += TICK_NS
    p.now = now
    return spent[a], spent[b]


def measure(mib: int, validate_wire: bool = False) -> dict[str, float]:
    size = mib << 20
    p = Pair(seed=1, buf_size=size, config=NicConfig(validate_wire=validate_wire))
    p.dst[:] = bytes(size)  # a NIC's registered memory is pinned: fault its pages in before timing
    p.write(0, size)
    t0 = time.perf_counter()
    req_ns, rsp_ns = drive(p)
    wall = time.perf_counter() - t0
    wc = p.completions()
    assert wc and wc[0].status.name == "SUCCESS" and p.dst == p.src, "transfer failed"
    pkts = p.a.stats.tx_data
    return {
        "requester_us_per_pkt": req_ns / pkts / 1000,
        "responder_us_per_pkt": rsp_ns / pkts / 1000,
        # one core per side: the slower side bounds the rate
        "pair_goodput_gbps": size * 8 / max(req_ns, rsp_ns),
        "data_packets": pkts,
        "retransmits": p.a.stats.retransmits,
        "sacks": p.b.stats.sacks_sent,
        "sim_time_us": p.now / 1000,
        "wall_s": wall,
        "compiled": float(bool(_native.compiled)),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--mib", type=int, default=64)
    ap.add_argument("--validate-wire", action="store_true", help="encode and re-parse every packet")
    ap.add_argument("--repeat", type=int, default=5, help="transfers to take the median of")
    args = ap.parse_args()
    if args.repeat < 1:
        ap.error("--repeat: at least 1")
    runs = [measure(args.mib, args.validate_wire) for _ in range(args.repeat)]
    r = {k: statistics.median(run[k] for run in runs) for k in runs[0]}
    r["repeats"] = args.repeat
    if args.json:
        print(json.dumps({k: round(v, 3) for k, v in r.items()}))
        return
    core = "compiled (mypyc)" if r["compiled"] else "interpreted"
    print(f"{args.mib} MiB Write, {r['data_packets']:.0f} data packets, {r['sacks']:.0f} SACKs, {core} core")
    print(f"  (medians of {args.repeat} transfers)")
    print(f"  requester path   {r['requester_us_per_pkt']:6.2f} µs per data packet")
    print(f"  responder path   {r['responder_us_per_pkt']:6.2f} µs per data packet")
    print(f"  pair goodput     {r['pair_goodput_gbps']:6.2f} Gbit/s of protocol processing, one core a side")
    print(f"  simulated time   {r['sim_time_us']:.0f} µs; wall {r['wall_s']:.2f} s")


if __name__ == "__main__":
    main()
