"""Figures of the transport-robustness work: multi-port line rate, integrity under bit flips, ICRC cost.

    python benchmarks/robustness_bench.py [--json] [--mib 16] [--flip 0.01]

1. *Line rate*: a clean 4 MiB Write through the pair harness (openmrc.provider.loopback: 100 Gbit/s per
   port, 2 µs latency) over 1, 2, 4 and 8 ports: goodput over simulated time as a share of the aggregate
   line rate (``NicConfig.link_bps`` is one port's rate; the default CC profile sizes its window for all).
2. *Integrity*: a ``--mib`` Write whose every packet travels as bytes sealed with the real RoCEv2 ICRC,
   ``--flip`` of them with one random bit flipped: how many flips there were, how many datagrams the NICs
   dropped for a wrong ICRC, whether the result is bit-exact, and what it cost in retransmissions.
3. *ICRC cost*: CPU µs per 4 KiB data packet to seal it and to receive it as a datagram (ICRC check +
   parse + placement), against receiving the same packet as a decoded `Packet`, measured in one run as a
   ratio (the machine is shared and noisy). The CRC-32 itself is zlib's (about 2.3 µs per 4 KiB here).

Compiled modules (``make native``) are used when present; ``OPENMRC_PURE=1`` measures the interpreted core.
"""

from __future__ import annotations

import argparse
import json
import time

from openmrc import _native
from openmrc.provider.loopback import Impairments, Pair
from openmrc.wire import BTH, METH, RETH, Addressing, Opcode, Packet, seal

MTU = 4096


def line_rate(ports: int, size: int = 4 << 20) -> float:
    p = Pair(seed=1, buf_size=size, ports=ports)
    p.write(0, size)
    p.run(lambda: len(p.qp_a.send_cq) >= 1)
    assert p.completions()[0].status.name == "SUCCESS" and p.dst == p.src
    return size * 8 / (p.now * 1e-9) / (ports * p.fabric.link_bps)


def integrity(mib: int, flip: float) -> dict[str, float]:
    size = mib << 20
    p = Pair(seed=11, buf_size=size, wire=True, imp=Impairments(corrupt=flip))
    p.write(0, size)
    p.run(lambda: len(p.qp_a.send_cq) >= 1)
    ok = p.completions()[0].status.name == "SUCCESS" and p.dst == p.src
    p.run(max_time=p.now + 1_000_000)  # what is still in flight
    return {
        "flipped": p.fabric.corrupted,
        "flipped_in_masked_bth_byte4": p.fabric.corrupted_variant,
        "dropped_bad_icrc": p.a.stats.rx_bad_icrc + p.b.stats.rx_bad_icrc,
        "bit_exact": float(ok),
        "retransmits": p.a.stats.retransmits,
        "data_packets": p.a.stats.tx_data,
    }


def write_packets(p: Pair, n: int) -> list[Packet]:
    """The ``n`` packets of one ``n``·4 KiB Write to ``p``'s NIC b, as its requester would send them."""
    out = []
    for i in range(n):
        op = Opcode.WRITE_FIRST if i == 0 else (Opcode.WRITE_LAST if i == n - 1 else Opcode.WRITE_MIDDLE)
        out.append(
            Packet(
                BTH(op, dest_qp=p.qp_b.qp_num, psn=i, ack_req=i == n - 1),
                METH(0, 1),
                None,
                RETH(p.mr_b.addr + i * MTU, p.mr_b.rkey, n * MTU),
                payload=p.src[i * MTU : (i + 1) * MTU],
            )
        )
    return out


def icrc_cost(n: int = 1000) -> dict[str, float]:
    """µs per 4 KiB data packet: seal; receive_datagram (ICRC + parse + place); receive(Packet)."""
    pairs = [Pair(seed=3, buf_size=n * MTU) for _ in range(2)]
    for pair in pairs:
        pair.dst[:] = bytes(n * MTU)  # a NIC's registered memory is pinned: fault its pages in first
    pkts = write_packets(pairs[0], n)
    addr = Addressing("2001:db8::a", "2001:db8::b", 0xC000)
    clock = time.perf_counter_ns
    t0 = clock()
    raws = [seal(pkt, addr) for pkt in pkts]
    t_seal = clock() - t0
    nic_d, nic_p = pairs[0].b, pairs[1].b
    t0 = clock()
    for i, raw in enumerate(raws):
        nic_d.receive_datagram(raw, 1, i, addr)
    t_dgram = clock() - t0
    decoded = write_packets(pairs[1], n)
    t0 = clock()
    for i, pkt in enumerate(decoded):
        nic_p.receive(pkt, 1, i, False, 0xC000)
    t_pkt = clock() - t0
    assert nic_d.stats.rx_data == nic_p.stats.rx_data == n and nic_d.stats.rx_bad_icrc == 0
    assert pairs[0].dst == pairs[0].src and pairs[1].dst == pairs[1].src
    return {
        "seal_us_per_pkt": t_seal / n / 1000,
        "receive_datagram_us_per_pkt": t_dgram / n / 1000,
        "receive_packet_us_per_pkt": t_pkt / n / 1000,
        "datagram_over_packet": t_dgram / t_pkt,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--mib", type=int, default=16, help="size of the bit-flip transfer")
    ap.add_argument("--flip", type=float, default=0.01, help="share of packets with one bit flipped")
    args = ap.parse_args()
    if args.mib < 1 or not 0 <= args.flip <= 1:
        ap.error("--mib at least 1, --flip in [0, 1]")
    rates = {n: line_rate(n) for n in (1, 2, 4, 8)}
    g = integrity(args.mib, args.flip)
    c = icrc_cost()
    if args.json:
        out = {"line_rate_fraction": {str(n): round(f, 3) for n, f in rates.items()}, "integrity": g}
        print(
            json.dumps(
                {**out, "icrc_cost": {k: round(v, 3) for k, v in c.items()}, "compiled": _native.compiled}
            )
        )
        return
    core = "compiled (mypyc)" if _native.compiled else "interpreted"
    print(f"transport robustness figures, {core} core")
    print("  clean 4 MiB Write, share of aggregate line rate (100 Gbit/s per port):")
    for n, f in rates.items():
        print(f"    {n} port(s)  {f:.3f}")
    print(f"  {args.mib} MiB as sealed datagrams, {args.flip:.1%} with a bit flipped:")
    print(f"    flips the ICRC covers {g['flipped']:.0f}; dropped for a bad ICRC {g['dropped_bad_icrc']:.0f}")
    print(f"    flips in BTH byte 4 (FECN/BECN, masked by RoCEv2) {g['flipped_in_masked_bth_byte4']:.0f}")
    print(f"    bit-exact: {bool(g['bit_exact'])}; retransmits {g['retransmits']:.0f}", end="")
    print(f" of {g['data_packets']:.0f} data packets")
    print("  per 4 KiB data packet (µs):")
    print(f"    seal (encode + ICRC)                 {c['seal_us_per_pkt']:.2f}")
    print(f"    receive_datagram (ICRC+parse+place)  {c['receive_datagram_us_per_pkt']:.2f}")
    print(f"    receive(Packet) (place)              {c['receive_packet_us_per_pkt']:.2f}")
    print(f"    datagram / decoded packet            {c['datagram_over_packet']:.2f}x")


if __name__ == "__main__":
    main()
