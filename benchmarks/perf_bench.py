"""Software MRC NIC over UDP: goodput between two processes on loopback, against plain-Python yardsticks.

In one run, on this machine:

* ``goodput_gbps_1port`` / ``goodput_gbps_4port``: ``openmrc perf`` (a server process and a client
  process, one QP, 4 KiB MTU, ``--iters`` Writes of ``--mib`` MiB each, steady state rather than the
  first window's ramp) over 1 and 4 planes (127.0.x.y addresses);
* ``goodput_gbps_loss1``: 4 planes with 1 % random loss both ways;
* ``goodput_gbps_portfail``: 4 planes, one plane blackholed both ways once the run has started;
* ``sendto_blast_gbps``: one process blasting 4 KiB datagrams with plain ``sendto`` at another that
  ``recv_into``s them (what arrives, per second of the sender's run);
* ``sendmmsg_blast_gbps``: the same with ``sendmmsg`` (64 datagrams per call, through ctypes);
* ``ratio_vs_sendto``: ``goodput_gbps_4port / sendto_blast_gbps``, measured as ``--pairs`` back-to-back
  pairs (a blast, then the 4-port run) and reported as the median of the pairs' ratios: the machine is
  shared and its speed drifts within seconds, so each ratio compares runs made moments apart;
  ``sendto_blast_gbps`` and ``goodput_gbps_4port`` are the medians of the pairs, ``ratios_vs_sendto`` lists
  every pair's ratio.

    python benchmarks/perf_bench.py [--json] [--mib 64] [--iters 8] [--seconds 3] [--pairs 3]
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import ctypes.util
import json
import multiprocessing as mp
import os
import socket
import time
from typing import Any

from openmrc import _native
from openmrc.provider.perf import run_client, serve

DGRAM = 4096 + 60  # an MRC data packet with a 4 KiB payload


def _server(binds: list[str], q: Any) -> None:
    serve(binds, oob=("127.0.0.1", 0), once=False, log=lambda s: None, ready=q.put)


def perf_goodput(planes: int, mib: int, base: int, iters: int = 1, **kw: Any) -> dict[str, Any]:
    """One ``openmrc perf`` run between two processes; the result of its single message size."""
    binds_s = [f"127.{base}.1.{p}" for p in range(1, planes + 1)]
    binds_c = [f"127.{base}.2.{p}" for p in range(1, planes + 1)]
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    srv = ctx.Process(target=_server, args=(binds_s, q), daemon=True)
    srv.start()
    try:
        addr = q.get(timeout=30)
        rep = run_client(addr, binds_c, [mib << 20], iters=iters, **kw)
    finally:
        srv.terminate()
        srv.join(10)
    (r,) = rep.results
    ok = rep.hash_ok
    return {"gbps": r.bw_avg_gbps, "retransmits": r.retransmits, "ev_changes": r.ev_state_changes, "ok": ok}


# -- the yardsticks --------------------------------------------------------------------------------------
class _Iovec(ctypes.Structure):
    _fields_ = [("iov_base", ctypes.c_void_p), ("iov_len", ctypes.c_size_t)]


class _Msghdr(ctypes.Structure):
    _fields_ = [
        ("msg_name", ctypes.c_void_p),
        ("msg_namelen", ctypes.c_uint32),
        ("msg_iov", ctypes.POINTER(_Iovec)),
        ("msg_iovlen", ctypes.c_size_t),
        ("msg_control", ctypes.c_void_p),
        ("msg_controllen", ctypes.c_size_t),
        ("msg_flags", ctypes.c_int),
    ]


class _Mmsghdr(ctypes.Structure):
    _fields_ = [("msg_hdr", _Msghdr), ("msg_len", ctypes.c_uint)]


def _receiver(addr: tuple[str, int], q: Any, seconds: float) -> None:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 << 20)
    s.bind(addr)
    s.settimeout(0.5)
    buf = bytearray(65536)
    q.put("ready")
    got = 0
    end = None
    while True:
        try:
            n = s.recv_into(buf)
        except TimeoutError:
            break
        if end is None:
            end = time.monotonic() + seconds + 2
        got += n
        if time.monotonic() > end:
            break
    q.put(got)


def blast(kind: str, seconds: float, base: int) -> float:
    """Gb/s that arrive when one process sends 4 KiB datagrams as fast as it can for ``seconds``."""
    dst = (f"127.{base}.3.1", 4791)
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    rx = ctx.Process(target=_receiver, args=(dst, q, seconds), daemon=True)
    rx.start()
    q.get(timeout=30)
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind((f"127.{base}.3.2", 0))
    payload = bytes(DGRAM)
    t0 = time.monotonic()
    end = t0 + seconds
    if kind == "sendto":
        while time.monotonic() < end:
            for _ in range(64):
                with contextlib.suppress(BlockingIOError):
                    s.sendto(payload, dst)
    else:
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        batch = 64
        sa = (ctypes.c_ubyte * 16)()
        packed = socket.inet_aton(dst[0])
        sa[0:2] = list(socket.AF_INET.to_bytes(2, "little"))
        sa[2:4] = list(dst[1].to_bytes(2, "big"))
        sa[4:8] = list(packed)
        buf = ctypes.create_string_buffer(payload)
        iovs = (_Iovec * batch)()
        msgs = (_Mmsghdr * batch)()
        for i in range(batch):
            iovs[i].iov_base = ctypes.addressof(buf)
            iovs[i].iov_len = DGRAM
            msgs[i].msg_hdr.msg_name = ctypes.addressof(sa)
            msgs[i].msg_hdr.msg_namelen = 16
            msgs[i].msg_hdr.msg_iov = ctypes.pointer(iovs[i])
            msgs[i].msg_hdr.msg_iovlen = 1
        fd = s.fileno()
        while time.monotonic() < end:
            libc.sendmmsg(fd, msgs, batch, 0)
    elapsed = time.monotonic() - t0
    s.close()
    got = q.get(timeout=seconds + 30)
    rx.join(10)
    return got * 8 / elapsed / 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--mib", type=int, default=64, help="size of the Write, MiB")
    ap.add_argument("--iters", type=int, default=8, help="Writes per run")
    ap.add_argument("--seconds", type=float, default=3.0, help="length of each blast")
    ap.add_argument("--pairs", type=int, default=3, help="blast + 4-port pairs for the ratio")
    a = ap.parse_args()
    if a.pairs < 1:
        ap.error("--pairs: at least 1")
    base = 100 + os.getpid() % 100
    out: dict[str, Any] = {
        "build": "compiled" if _native.compiled else "interpreted",
        "mib": a.mib,
        "iters": a.iters,
    }
    pairs = []
    for _ in range(a.pairs):
        b = blast("sendto", a.seconds, base)
        r4 = perf_goodput(4, a.mib, base + 3, a.iters)
        pairs.append((r4["gbps"] / max(b, 1e-9), b, r4))
    pairs.sort(key=lambda x: x[0])
    ratio, sendto, run4 = pairs[len(pairs) // 2]
    out["sendto_blast_gbps"] = round(sendto, 3)
    out["sendmmsg_blast_gbps"] = round(blast("sendmmsg", a.seconds, base + 1), 3)
    runs = {
        "1port": perf_goodput(1, a.mib, base + 2, a.iters),
        "4port": run4,
        "loss1": perf_goodput(4, a.mib, base + 4, a.iters, loss=0.01),
        "portfail": perf_goodput(4, a.mib, base + 5, a.iters, fail_port=(2, 0.2)),
    }
    for name, r in runs.items():
        out[f"goodput_gbps_{name}"] = round(r["gbps"], 3)
        out[f"retransmits_{name}"] = r["retransmits"]
        out[f"ev_changes_{name}"] = r["ev_changes"]
        out[f"intact_{name}"] = r["ok"]
    out["intact_4port"] = all(r["ok"] for _, _, r in pairs)
    out["ratio_vs_sendto"] = round(ratio, 3)
    out["ratios_vs_sendto"] = [round(x[0], 3) for x in pairs]
    if a.json:
        print(json.dumps(out, indent=2))
        return
    print(
        f"software MRC NIC over UDP on loopback ({out['build']} core), {a.iters} x {a.mib} MiB Writes, "
        "4 KiB MTU"
    )
    for k, v in out.items():
        if k not in ("build", "mib", "iters"):
            print(f"  {k:28s} {v}")


if __name__ == "__main__":
    main()
