"""Software MRC NIC over UDP: goodput on loopback, quiet and contended, and towards dead or stalled peers.

Issue 44's figures: goodput between two processes against plain-Python yardsticks, on a quiet machine and
beside a busy process, and what the NIC sends towards a peer that never answers.

    python benchmarks/perf_bench.py [--json] [--mib 64] [--iters 8] [--seconds 3] [--pairs 3]
                                    [--contended | --both] [--dead-peer | --no-dead-peer]

A default run measures the quiet goodput runs and the dead and stalled peers; ``--contended`` measures
the goodput runs with one busy-looping process beside them instead of quietly, ``--both`` quietly then
contended; ``--dead-peer`` only the dead and stalled peers (with ``--contended``/``--both``, those too).

Goodput runs: ``openmrc perf`` between a server process and a client process (one QP, 4 KiB MTU,
``--iters`` Writes of ``--mib`` MiB each: steady state rather than the first window's ramp), named
``1port`` (1 plane), ``4port`` (4 planes), ``loss1`` (4 planes, 1 % random loss both ways) and
``portfail`` (4 planes, plane 2 blackholed both ways a quarter of the 4-port run's time into the run, so
that it fails mid-run on any machine). Quiet runs give the keys below
as written; contended runs (``--contended``, ``--both``) the same keys with a ``_contended`` suffix
(``goodput_gbps_4port_contended``, ``loss1_fraction_contended``, ...), made while one process spins
(``while True: pass``) on a CPU of its own choosing. For each run RUN:

* ``goodput_gbps_RUN``: Gb/s of Writes completed, first post to last completion;
* ``retransmits_RUN``: data packets the client retransmitted;
* ``retransmit_fraction_RUN``: ``retransmits_RUN`` / data packets the client sent (NIC ``tx_data``);
* ``ev_changes_RUN``: EV events of the client that moved an EV to ASSUMED_BAD or back to GOOD;
* ``evs_marked_bad_RUN``: of those, the ones to ASSUMED_BAD;
* ``kernel_rcvbuf_errors_RUN``: datagrams the kernel dropped for a full socket buffer during the run
  (``/proc/net/snmp``, ``Udp: RcvbufErrors``; the whole machine's, both processes');
* ``rx_overflow_RUN``: the client device's ``rx_overflow`` (its own sockets' drops as ``SO_RXQ_OVFL``
  reports them; 0 where the device does not count them);
* ``intact_RUN``: the server's buffer hashed as what was written (``intact_4port``: every pair's run);
* ``error_RUN``: only when the run failed, why (its other figures are then 0 and ``intact_RUN`` false).

And for the whole set:

* ``retransmit_fraction``: ``retransmit_fraction_4port`` again, the figure issue 44 tracks;
* ``loss1_fraction``: ``goodput_gbps_loss1 / goodput_gbps_4port`` (what 1 % loss costs);
* ``portfail_fraction``: ``goodput_gbps_portfail / goodput_gbps_4port`` (what losing a plane costs);
* ``portfail_fault_dropped``: datagrams the client's fault injector dropped in the port-failure run (not
  0: the port did fail while the run went on).

Quiet runs only, the yardsticks:

* ``sendto_blast_gbps``: one process blasting 4 KiB datagrams with plain ``sendto`` at another that
  ``recv_into``s them (what arrives, per second of the sender's run);
* ``sendmmsg_blast_gbps``: the same with ``sendmmsg`` (64 datagrams per call, through ctypes);
* ``ratio_vs_sendto``: ``goodput_gbps_4port / sendto_blast_gbps``, measured as ``--pairs`` back-to-back
  pairs (a blast, then the 4-port run) and reported as the median of the pairs' ratios: the machine is
  shared and its speed drifts within seconds, so each ratio compares runs made moments apart;
  ``sendto_blast_gbps`` and ``goodput_gbps_4port`` are the medians of the pairs, ``ratios_vs_sendto`` lists
  every pair's ratio.

Dead and stalled peers (``UdpDevice``s of 4 planes in this process, one QP each way, one signaled 1 MiB
RDMA Write; about 25 s):

* ``dead_peer_error_s``: with default connect attributes and the peer device closed, seconds from the
  post to the Write's error completion (null: none in 30 s);
* ``dead_peer_status``: that completion's status (``WcStatus`` name; null: none);
* ``dead_peer_probes_per_s``: probes the sender sent per second meanwhile (NIC ``probes_sent``);
* ``dead_peer_datagrams_per_s``: datagrams it sent per second meanwhile (device ``tx_datagrams``);
* ``stalled_peer_probes_per_s``, ``stalled_peer_datagrams_per_s``: the same over 5 s when the peer
  device is open but never progressed (nothing answers) and the sender retries forever (``retry_exp``
  25);
* ``kernel_rcvbuf_errors_stalled_peer``: what the kernel dropped meanwhile (the stalled peer's sockets
  fill up).

Also ``build`` (compiled or interpreted core), ``mib`` and ``iters``.
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

from _busy import busy_process
from openmrc import _native
from openmrc.provider import Peer, UdpDevice
from openmrc.provider.perf import PerfError, run_client, serve
from openmrc.transport import Access, SendFlags, SendWR, Sge, WrOpcode

DGRAM = 4096 + 60  # an MRC data packet with a 4 KiB payload
_FIGURES = (  # the counts of a run, all 0 when it failed
    "seconds",
    "retransmits",
    "ev_changes",
    "evs_marked_bad",
    "kernel_rcvbuf_errors",
    "rx_overflow",
    "fault_dropped",
)
RUNS = ("1port", "4port", "loss1", "portfail")
FAIL_AT = 0.25  # when the port fails, as a fraction of the 4-port run's time: mid-run however fast it is
DEAD_PEER_LIMIT_S = 30.0
STALLED_PEER_S = 5.0
WRITE_BYTES = 1 << 20


def _server(binds: list[str], q: Any) -> None:
    serve(binds, oob=("127.0.0.1", 0), once=False, log=lambda s: None, ready=q.put)


def rcvbuf_errors() -> int:
    """The kernel's count of UDP datagrams dropped for a full receive buffer (0 where it cannot be read)."""
    try:
        with open("/proc/net/snmp") as f:
            udp = [line.split() for line in f if line.startswith("Udp:")]
        return int(udp[1][udp[0].index("RcvbufErrors")])
    except (OSError, IndexError, ValueError):
        return 0


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
        drops0 = rcvbuf_errors()
        rep = run_client(addr, binds_c, [mib << 20], iters=iters, **kw)
        drops = rcvbuf_errors() - drops0
    except PerfError as exc:  # one failed run is a finding, not a reason to lose the others
        failed = dict.fromkeys(_FIGURES, 0)
        return {**failed, "gbps": 0.0, "retransmit_fraction": 0.0, "ok": False, "error": str(exc)}
    finally:
        srv.terminate()
        srv.join(10)
    (r,) = rep.results
    return {
        "gbps": r.bw_avg_gbps,
        "seconds": r.seconds,
        "retransmits": r.retransmits,
        "retransmit_fraction": r.retransmits / max(rep.nic.get("tx_data", 0), 1),
        "ev_changes": r.ev_state_changes,
        "evs_marked_bad": r.evs_marked_bad,
        "kernel_rcvbuf_errors": drops,
        "rx_overflow": rep.device.get("rx_overflow", 0),
        "fault_dropped": rep.device.get("fault_dropped", 0),
        "ok": rep.hash_ok,
    }


def goodput_runs(a: argparse.Namespace, base: int, run4: dict[str, Any] | None = None) -> dict[str, Any]:
    """The 1-port, 4-port (unless given), loss and port-failure runs, on addresses from ``base`` up."""
    runs = {"1port": perf_goodput(1, a.mib, base, a.iters)}
    runs["4port"] = run4 = run4 if run4 is not None else perf_goodput(4, a.mib, base + 1, a.iters)
    runs["loss1"] = perf_goodput(4, a.mib, base + 2, a.iters, loss=0.01)
    fail = (2, FAIL_AT * run4["seconds"])
    runs["portfail"] = perf_goodput(4, a.mib, base + 3, a.iters, fail_port=fail)
    return runs


def report_runs(out: dict[str, Any], runs: dict[str, dict[str, Any]], sfx: str) -> None:
    """The keys of a set of goodput runs, each with the suffix ``sfx``."""
    for name, r in runs.items():
        out[f"goodput_gbps_{name}{sfx}"] = round(r["gbps"], 3)
        out[f"retransmits_{name}{sfx}"] = r["retransmits"]
        out[f"retransmit_fraction_{name}{sfx}"] = round(r["retransmit_fraction"], 6)
        out[f"ev_changes_{name}{sfx}"] = r["ev_changes"]
        out[f"evs_marked_bad_{name}{sfx}"] = r["evs_marked_bad"]
        out[f"kernel_rcvbuf_errors_{name}{sfx}"] = r["kernel_rcvbuf_errors"]
        out[f"rx_overflow_{name}{sfx}"] = r["rx_overflow"]
        out[f"intact_{name}{sfx}"] = r["ok"]
        if "error" in r:
            out[f"error_{name}{sfx}"] = r["error"]
    base = max(runs["4port"]["gbps"], 1e-9)
    out[f"retransmit_fraction{sfx}"] = round(runs["4port"]["retransmit_fraction"], 6)
    out[f"loss1_fraction{sfx}"] = round(runs["loss1"]["gbps"] / base, 3)
    out[f"portfail_fraction{sfx}"] = round(runs["portfail"]["gbps"] / base, 3)
    out[f"portfail_fault_dropped{sfx}"] = runs["portfail"]["fault_dropped"]


# -- dead and stalled peers ------------------------------------------------------------------------------
def unanswered_write(base: int, *, dead: bool, seconds: float) -> dict[str, Any]:
    """One signaled 1 MiB Write towards a peer that never answers: its device closed (``dead``, default
    connect attributes) or open but never progressed (infinite retries). Progresses the sender until the
    Write completes or ``seconds`` pass; what it sent meanwhile, per second."""
    a = UdpDevice([f"127.{base}.5.{p}" for p in range(1, 5)])
    b = UdpDevice([f"127.{base}.6.{p}" for p in range(1, 5)])
    try:
        src = a.register(bytearray(WRITE_BYTES), Access.LOCAL_WRITE)
        dst = b.register(bytearray(WRITE_BYTES))
        qa, qb = a.create_qp(), b.create_qp()
        a.connect(qa, Peer.of(b.endpoints()), qb.qp_num, **({} if dead else {"retry_exp": 25}))
        b.connect(qb, Peer.of(a.endpoints()), qa.qp_num)
        if dead:
            b.close()
        probes0, dgrams0, drops0 = a.nic.stats.probes_sent, a.stats.tx_datagrams, rcvbuf_errors()
        sge = [Sge(src.addr, WRITE_BYTES, src.lkey)]
        wr = SendWR(1, WrOpcode.RDMA_WRITE, sge, dst.addr, dst.rkey, None, SendFlags.SIGNALED)
        t0 = time.monotonic()
        a.post_send(qa, wr)
        wcs: list[Any] = []
        while not wcs and time.monotonic() - t0 < seconds:
            a.progress(0.001)
            wcs = qa.send_cq.poll(1)
        elapsed = time.monotonic() - t0
        return {
            "error_s": round(elapsed, 3) if wcs else None,
            "status": wcs[0].status.name if wcs else None,
            "probes_per_s": round((a.nic.stats.probes_sent - probes0) / elapsed, 1),
            "datagrams_per_s": round((a.stats.tx_datagrams - dgrams0) / elapsed, 1),
            "kernel_rcvbuf_errors": rcvbuf_errors() - drops0,
        }
    finally:
        a.close()
        b.close()


def dead_peers(out: dict[str, Any], base: int) -> None:
    d = unanswered_write(base, dead=True, seconds=DEAD_PEER_LIMIT_S)
    out["dead_peer_error_s"] = d["error_s"]
    out["dead_peer_status"] = d["status"]
    out["dead_peer_probes_per_s"] = d["probes_per_s"]
    out["dead_peer_datagrams_per_s"] = d["datagrams_per_s"]
    s = unanswered_write(base + 1, dead=False, seconds=STALLED_PEER_S)
    out["stalled_peer_probes_per_s"] = s["probes_per_s"]
    out["stalled_peer_datagrams_per_s"] = s["datagrams_per_s"]
    out["kernel_rcvbuf_errors_stalled_peer"] = s["kernel_rcvbuf_errors"]


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
    got: int = q.get(timeout=seconds + 30)
    rx.join(10)
    return got * 8 / elapsed / 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--mib", type=int, default=64, help="size of the Write, MiB")
    ap.add_argument("--iters", type=int, default=8, help="Writes per run")
    ap.add_argument("--seconds", type=float, default=3.0, help="length of each blast")
    ap.add_argument("--pairs", type=int, default=3, help="blast + 4-port pairs for the ratio")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument(
        "--contended", action="store_true", help="goodput runs beside a busy-looping process, not quietly"
    )
    mode.add_argument("--both", action="store_true", help="goodput runs quietly, then contended")
    peers = ap.add_mutually_exclusive_group()
    peers.add_argument(
        "--dead-peer",
        action="store_true",
        help="the dead and stalled peers only (with --contended or --both: those runs too)",
    )
    peers.add_argument("--no-dead-peer", action="store_true", help="leave out the dead and stalled peers")
    a = ap.parse_args()
    if a.pairs < 1:
        ap.error("--pairs: at least 1")
    quiet = a.both or not (a.contended or a.dead_peer)
    contended = a.both or a.contended
    base = 100 + os.getpid() % 100  # 127.base.x.y .. 127.(base + 13).x.y: addresses no other run holds
    out: dict[str, Any] = {
        "build": "compiled" if _native.compiled else "interpreted",
        "mib": a.mib,
        "iters": a.iters,
    }
    if quiet:
        pairs = []
        for _ in range(a.pairs):
            b = blast("sendto", a.seconds, base)
            r4 = perf_goodput(4, a.mib, base + 3, a.iters)
            pairs.append((r4["gbps"] / max(b, 1e-9), b, r4))
        pairs.sort(key=lambda x: x[0])
        ratio, sendto, run4 = pairs[len(pairs) // 2]
        out["sendto_blast_gbps"] = round(sendto, 3)
        out["sendmmsg_blast_gbps"] = round(blast("sendmmsg", a.seconds, base + 1), 3)
        report_runs(out, goodput_runs(a, base + 4, run4), "")
        out["intact_4port"] = all(r["ok"] for _, _, r in pairs)
        out["ratio_vs_sendto"] = round(ratio, 3)
        out["ratios_vs_sendto"] = [round(x[0], 3) for x in pairs]
    if contended:
        with busy_process():
            report_runs(out, goodput_runs(a, base + 8), "_contended")
    if a.dead_peer or not a.no_dead_peer:
        dead_peers(out, base + 12)
    if a.json:
        print(json.dumps(out, indent=2))
        return
    print_table(out, a)


_COLUMNS = (  # (key prefix, heading, width)
    ("goodput_gbps", "Gb/s", 8),
    ("retransmits", "retx", 7),
    ("retransmit_fraction", "retx/data", 10),
    ("ev_changes", "EV chg", 7),
    ("evs_marked_bad", "EVs bad", 8),
    ("kernel_rcvbuf_errors", "kernel drops", 13),
    ("rx_overflow", "rx_overflow", 12),
    ("intact", "intact", 7),
)


def print_table(out: dict[str, Any], a: argparse.Namespace) -> None:
    """The goodput runs as a table (a row per run, quiet and contended), then every other key."""
    print(
        f"software MRC NIC over UDP on loopback ({out['build']} core), {a.iters} x {a.mib} MiB Writes, "
        "4 KiB MTU"
    )
    shown = {"build", "mib", "iters"}
    rows = [(run, sfx) for sfx in ("", "_contended") for run in RUNS if f"goodput_gbps_{run}{sfx}" in out]
    if rows:
        print(f"  {'run':22s}" + "".join(f"{h:>{w}}" for _, h, w in _COLUMNS))
    for run, sfx in rows:
        cells = []
        for key, _, w in _COLUMNS:
            name = f"{key}_{run}{sfx}"
            shown.add(name)
            cells.append(f"{out[name]!s:>{w}}")
        print(f"  {run + sfx:22s}" + "".join(cells))
    for k, v in out.items():
        if k not in shown:
            print(f"  {k:36s} {v}")


if __name__ == "__main__":
    main()
