"""Authenticated MRC: the CPU a sealed packet costs, per side, in one process (no sockets, no scheduler).

Where `security_bench.py` measures what `openmrc perf --secure` loses in goodput between two processes, this
takes the sockets and the scheduler out and asks what is left: a Write of ``--mib`` MiB between the pair
harness's two NICs (`openmrc.provider.loopback`, 4 planes, MPR 64, no loss) as bytes, driven tick by tick,
once plain (MRC 1.0) and once in each authenticated mode (``auth``: what ``perf --secure`` does, header
tags "auto", none where nothing trims; ``auth_htag``: a header tag on every data packet, what a fabric that
trims costs; ``encrypt``). Per data packet:

* ``send_us``: the sender's work: `Nic.datagrams_to_send` (sealing included) and what its driver does with
  each packet (encoding a plain packet, the RoCEv2 ICRC for either), and the SACKs it takes in;
* ``recv_us``: the receiver's work: `Nic.receive_datagram` (ICRC, opening, placement) and the SACKs it sends.

Beside them the floor that no Python change removes: one AES-GCM call of `cryptography` over a header
(``aead_header_us``) and over a 4 KiB packet (``aead_packet_us``); a sealed data packet costs two on the
sending side (one without header tags) and one on the receiving side.

    python benchmarks/seal_bench.py [--json] [--mib 32] [--repeat 3]

The figures are the medians of ``--repeat`` transfers. Compiled modules (``make native``) are used when
present; ``OPENMRC_PURE=1`` measures the interpreted core.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import timeit

from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from openmrc._native import compiled
from openmrc.provider.loopback import Pair, port_address
from openmrc.transport import Nic, QpSecurity
from openmrc.transport.security import SecurityDomain
from openmrc.transport.types import Transmit
from openmrc.wire import Addressing
from openmrc.wire.datagram import seal_into, seal_parts

MODES = ("plain", "auth", "auth_htag", "encrypt")
_EMPTY = memoryview(b"")
_ROUTES: dict[tuple[str, int, int], Addressing] = {}


def _wire(out: list[Transmit], src: str, dst: str) -> list[tuple[list[bytes | memoryview], int, Addressing]]:
    """What a driver sends for each of ``out``, as `openmrc.provider.udp` gathers it for ``sendmsg``: a data
    packet's headers from its Write's template and its payload as a view of registered memory (never copied),
    a sealed packet's bytes as they are, each with the RoCEv2 ICRC for its addressing."""
    sent: list[tuple[list[bytes | memoryview], int, Addressing]] = []
    for t in out:
        key = (src, t.port, t.entropy & 0xFFFF)
        addr = _ROUTES.get(key)
        if addr is None:  # (a driver keeps its routes: the addresses are parsed once)
            addr = _ROUTES[key] = Addressing(port_address(src, t.port), port_address(dst, t.port), key[2])
        parts: list[bytes | memoryview] = []
        tpl = t.tpl
        if t.body is not None:
            seal_into(parts, t.body, _EMPTY, addr)
        elif tpl is not None:
            seal_into(parts, tpl.header(t.op, t.ack_req, t.rtx, t.psn, t.va, t.size), t.payload, addr)
        else:
            parts = seal_parts(t.packet, addr)
        sent.append((parts, t.port, addr))
    return sent


def _arrivals(
    sent: list[tuple[list[bytes | memoryview], int, Addressing]],
) -> list[tuple[bytes, int, Addressing]]:
    """``sent`` as the far end's sockets read each datagram: one buffer (the kernel's copy, not timed)."""
    return [(b"".join(parts), port, addr) for parts, port, addr in sent]


def _deliver(nic: Nic, arrived: list[tuple[bytes, int, Addressing]], now: int, src: str) -> None:
    for raw, port, addr in arrived:
        nic.receive_datagram(raw, port, now, addr, src=src)


def transfer(mode: str, mib: int) -> tuple[float, float, int]:
    """(send µs, receive µs, data packets) of one ``mib`` MiB Write in ``mode``."""
    sec = None
    if mode != "plain":
        dom = SecurityDomain.generate(7)
        one = QpSecurity(dom, encrypt=mode == "encrypt", header_tag=True if mode == "auth_htag" else "auto")
        sec = (one, one)
    size = mib << 20
    p = Pair(seed=3, wire=True, buf_size=size, mpr=64, security=sec)
    p.post_recv(1)
    p.write(0, size, imm=5)
    clock = time.perf_counter
    send = recv = 0.0
    packets = now = 0
    while not len(p.qp_a.send_cq):
        now += 10_000  # (a driver's round: what the window allows leaves in one call, as on a busy host)
        t0 = clock()
        out = p.a.datagrams_to_send(now)
        data = _wire(out, "a", "b")
        send += clock() - t0
        packets += len(out)
        arrived = _arrivals(data)
        t0 = clock()
        _deliver(p.b, arrived, now, "a")
        acks = _wire(p.b.datagrams_to_send(now), "b", "a")
        recv += clock() - t0
        arrived = _arrivals(acks)
        t0 = clock()
        _deliver(p.a, arrived, now, "b")
        for nic in (p.a, p.b):
            due = nic.get_timer()
            if due is not None and due <= now:
                nic.handle_timer(now)
        send += clock() - t0
        if now > 10**11:
            raise RuntimeError(f"{mode}: the transfer did not finish")
    if bytes(p.dst) != bytes(p.src):
        raise RuntimeError(f"{mode}: the destination differs from the source")
    return send / packets * 1e6, recv / packets * 1e6, packets


def aead_call_us() -> tuple[float, float]:
    """One AES-GCM call (tag only) over a 64-byte header and over a 4 KiB packet, µs."""
    aead = AESGCM(os.urandom(32))
    nonce = os.urandom(12)
    header, packet = os.urandom(64), os.urandom(4096 + 80)
    n = 50_000
    return tuple(  # type: ignore[return-value]
        min(timeit.repeat(lambda d=d: aead.encrypt(nonce, b"", d), number=n, repeat=3)) / n * 1e6
        for d in (header, packet)
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--mib", type=int, default=32, help="size of the Write, MiB (1-1024)")
    ap.add_argument("--repeat", type=int, default=3, help="transfers per mode to take the median of (1-20)")
    a = ap.parse_args()
    if not 1 <= a.mib <= 1024 or not 1 <= a.repeat <= 20:
        print("seal_bench: --mib must be 1-1024 and --repeat 1-20", file=sys.stderr)
        return 2
    out: dict[str, float | int | str] = {"build": "compiled" if compiled else "interpreted", "mib": a.mib}
    for mode in MODES:
        runs = [transfer(mode, a.mib) for _ in range(a.repeat)]
        out[f"{mode}_send_us"] = round(statistics.median(r[0] for r in runs), 3)
        out[f"{mode}_recv_us"] = round(statistics.median(r[1] for r in runs), 3)
        out["data_packets"] = runs[0][2]
    for mode in MODES[1:]:
        for side in ("send", "recv"):
            out[f"{mode}_{side}_extra_us"] = round(
                float(out[f"{mode}_{side}_us"]) - float(out[f"plain_{side}_us"]), 3
            )
    out["aead_header_us"], out["aead_packet_us"] = (round(x, 3) for x in aead_call_us())
    if a.json:
        print(json.dumps(out))
        return 0
    head = f"{'mode':14s} {'send µs/pkt':>12s} {'recv µs/pkt':>12s}"
    print(f"{head}   ({out['data_packets']} data packets, {out['build']})")
    for mode in MODES:
        print(f"{mode:14s} {out[f'{mode}_send_us']:>12} {out[f'{mode}_recv_us']:>12}")
    print(
        f"one AES-GCM call: {out['aead_header_us']} µs over a header, {out['aead_packet_us']} µs over 4 KiB"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
