"""``openmrc perf``: RDMA Write bandwidth between two UDP devices, shaped like perftest's ``ib_write_bw``.

The server opens a `UdpDevice` on its plane endpoints and waits for clients on a TCP port (18515, as
perftest). Out of band, over that TCP connection, each side tells the other what RDMA needs: its
per-port endpoints, QP numbers and first PSNs, and the server the remote address (VA) and R_Key of the
buffer the client writes into. Then the client posts Writes (``iters`` of each message size, at most
``tx_depth`` outstanding, round-robin over ``qps`` QPs) and measures from the first post to the last
completion; the server's device completes them with a progress thread. At the end the client sends the
SHA-256 of what it wrote and the server compares it with its buffer.

Messages are JSON lines; the client speaks first (``hello``), the server answers each message with one
line (``ok`` or ``error`` with a reason). Impairments asked for by the client (``--loss``, a port that
fails at a time) apply to both directions: the client impairs what it sends and asks the server to do
the same for what it sends.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from openmrc import __version__
from openmrc.ev import EVState
from openmrc.provider.udp import Peer, UdpDevice
from openmrc.transport import (
    Access,
    LocalProtocolError,
    NicConfig,
    QpInitAttr,
    RecvWR,
    SendFlags,
    SendWR,
    Sge,
    WcStatus,
    WrOpcode,
)

__all__ = [
    "OOB_PORT",
    "PerfError",
    "SizeResult",
    "default_iters",
    "perf_config",
    "run_client",
    "serve",
    "sweep_sizes",
]

OOB_PORT = 18515
MAX_SIZE = 1 << 30


class PerfError(RuntimeError):
    """A perf session failed (the peer refused, went away, or the data did not arrive intact)."""


def perf_config(link_gbps: float = 25.0) -> NicConfig:
    """Transport settings for a software NIC: ``link_gbps`` per port, the RTT of a user-space stack."""
    return NicConfig(
        link_bps=int(link_gbps * 1e9),
        base_rtt_ns=200_000,
        sack_delay_ns=20_000,
        sack_every=8,
        reorder_allowance=128,
        default_ev_sports=(0xC000, 0x10000),
        max_send_wr=8192,
        max_recv_wr=8192,
    )


def sweep_sizes(max_size: int = 8 << 20) -> list[int]:
    """2 B .. ``max_size`` in powers of two (``ib_write_bw -a``)."""
    out, s = [], 2
    while s <= max_size:
        out.append(s)
        s <<= 1
    return out


def default_iters(size: int) -> int:
    """Iterations of one message size when none is given: about 64 MiB of data, 5 .. 2000 messages."""
    return max(5, min(2000, (64 << 20) // max(size, 1)))


@dataclass
class SizeResult:
    """One row of the table: a message size and what it achieved."""

    bytes: int
    iterations: int
    bw_peak_gbps: float
    bw_avg_gbps: float
    msg_rate_mpps: float
    seconds: float
    retransmits: int
    ev_state_changes: int
    completions_ok: bool


@dataclass
class ClientReport:
    results: list[SizeResult]
    hash_ok: bool
    planes: int
    qps: int
    device: dict[str, int] = field(default_factory=dict)
    nic: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


# -- the out-of-band channel -----------------------------------------------------------------------------
class _Channel:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.rfile = sock.makefile("r", encoding="utf-8")

    def send(self, msg: dict[str, Any]) -> None:
        self.sock.sendall((json.dumps(msg) + "\n").encode())

    def recv(self) -> dict[str, Any]:
        line = self.rfile.readline()
        if not line:
            raise PerfError("the peer closed the out-of-band connection")
        try:
            msg = json.loads(line)
        except ValueError:
            raise PerfError(f"the peer sent something that is not JSON: {line[:80]!r}") from None
        if not isinstance(msg, dict):
            raise PerfError("the peer sent a JSON value that is not an object")
        if "error" in msg:
            raise PerfError(f"the peer refused: {msg['error']}")
        return msg

    def call(self, msg: dict[str, Any]) -> dict[str, Any]:
        self.send(msg)
        return self.recv()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.rfile.close()
            self.sock.close()


def _peer(msg: dict[str, Any], n: int) -> Peer:
    eps = msg.get("endpoints")
    if not isinstance(eps, list) or len(eps) != n:
        raise PerfError(f"the peer has {len(eps) if isinstance(eps, list) else '?'} planes, this side {n}")
    return Peer.of(tuple(e) if isinstance(e, list) else e for e in eps)


# -- server ----------------------------------------------------------------------------------------------
def serve(
    binds: Sequence[str],
    *,
    oob: tuple[str, int] = ("0.0.0.0", OOB_PORT),
    once: bool = False,
    link_gbps: float = 25.0,
    log: Callable[[str], None] = print,
    ready: Callable[[tuple[str, int]], None] | None = None,
    stop: threading.Event | None = None,
) -> None:
    """Serve perf clients on a device bound to ``binds`` (one endpoint per plane) until ``stop`` is set
    (or after one client with ``once``). ``ready`` is called with the TCP address once listening."""
    stop = stop or threading.Event()
    with UdpDevice(binds, config=perf_config(link_gbps)) as dev, socket.create_server(oob) as lsock:
        dev.start()
        lsock.settimeout(0.2)
        addr = lsock.getsockname()[:2]
        log(f"openmrc perf server: {len(binds)} planes on {', '.join(binds)}")
        log(f"waiting for clients on TCP {addr[0]}:{addr[1]}")
        if ready is not None:
            ready(addr)
        while not stop.is_set():
            try:
                conn, peer = lsock.accept()
            except TimeoutError:
                continue
            conn.settimeout(None)
            ch = _Channel(conn)
            try:
                _session(dev, ch, log)
                log(f"client {peer[0]} done")
            except (PerfError, LocalProtocolError, OSError, ValueError, KeyError, TypeError) as exc:
                log(f"client {peer[0]}: {exc}")
                with contextlib.suppress(OSError):
                    ch.send({"error": str(exc)})
            finally:
                ch.close()
            if once:
                return


def _session(dev: UdpDevice, ch: _Channel, log: Callable[[str], None]) -> None:
    hello = ch.recv()
    size = int(hello["buf_size"])
    nq = int(hello["qps"])
    if not 1 <= size <= MAX_SIZE:
        raise PerfError(f"buf_size {size} outside 1..{MAX_SIZE}")
    if not 1 <= nq <= 64:
        raise PerfError(f"qps {nq} outside 1..64")
    peer = _peer(hello, dev.num_ports)
    buf = bytearray(size)
    mr = dev.register(buf)
    qps = [dev.create_qp() for _ in range(nq)]
    recv_posted = 0
    try:
        ch.send(
            {
                "ok": True,
                "version": __version__,
                "endpoints": dev.endpoints(),
                "qpns": [q.qp_num for q in qps],
                "va": mr.addr,
                "rkey": mr.rkey,
            }
        )
        msg = ch.recv()
        for q, remote in zip(qps, msg["qpns"], strict=True):
            dev.connect(q, peer, int(remote))
        if hello.get("loss"):
            dev.impair(loss=float(hello["loss"]))
        ch.send({"ok": True})
        while True:
            msg = ch.recv()
            op = msg.get("op")
            if op == "recvs":  # post receives for Write-with-Imm messages
                for q in qps:
                    for _ in range(int(msg["n"])):
                        recv_posted += 1
                        dev.post_recv(q, RecvWR(recv_posted))
                ch.send({"ok": True})
            elif op == "fail_port":
                dev.blackhole_port(int(msg["port"]))
                ch.send({"ok": True})
            elif op == "heal":
                dev.heal()
                ch.send({"ok": True})
            elif op == "hash":
                n = int(msg["length"])
                with dev.lock:  # a consistent view while the progress thread runs
                    digest = hashlib.sha256(memoryview(buf)[:n]).hexdigest()
                ch.send({"ok": True, "sha256": digest, "nic": dev.nic.stats.as_dict()})
            elif op == "bye":
                ch.send({"ok": True})
                return
            else:
                raise PerfError(f"unknown request {op!r}")
    finally:
        dev.heal()
        for q in qps:
            dev.destroy_qp(q)
        dev.deregister(mr)


# -- client ----------------------------------------------------------------------------------------------
def run_client(
    server: tuple[str, int],
    binds: Sequence[str],
    sizes: Sequence[int],
    *,
    iters: int | None = None,
    qps: int = 1,
    imm: bool = False,
    loss: float = 0.0,
    fail_port: tuple[int, float] | None = None,
    tx_depth: int = 128,
    link_gbps: float = 25.0,
    timeout: float = 120.0,
    on_result: Callable[[SizeResult], None] | None = None,
) -> ClientReport:
    """Measure ``sizes`` against the server at ``server`` (its TCP address) from a device on ``binds``."""
    if not sizes or any(not 1 <= s <= MAX_SIZE for s in sizes):
        raise PerfError(f"message sizes must be 1..{MAX_SIZE} bytes")
    if fail_port is not None and not 1 <= fail_port[0] <= len(binds):
        raise PerfError(f"--fail-port {fail_port[0]}: the device has ports 1..{len(binds)}")
    biggest = max(sizes)
    try:
        conn = socket.create_connection(server, timeout=10)
    except OSError as exc:
        raise PerfError(
            f"cannot reach the server at {server[0]}:{server[1]}: {exc.strerror or exc}"
        ) from None
    conn.settimeout(timeout)
    ch = _Channel(conn)
    with UdpDevice(binds, config=perf_config(link_gbps)) as dev:
        try:
            return _client_session(
                dev, ch, sizes, biggest, iters, qps, imm, loss, fail_port, tx_depth, timeout, on_result
            )
        finally:
            with contextlib.suppress(OSError, PerfError):
                ch.call({"op": "bye"})
            ch.close()


def _client_session(
    dev: UdpDevice,
    ch: _Channel,
    sizes: Sequence[int],
    biggest: int,
    iters: int | None,
    nq: int,
    imm: bool,
    loss: float,
    fail_port: tuple[int, float] | None,
    tx_depth: int,
    timeout: float,
    on_result: Callable[[SizeResult], None] | None,
) -> ClientReport:
    region = biggest
    src = bytearray(region * nq)
    fill = hashlib.sha256(b"openmrc perf").digest()
    src[:] = (fill * (len(src) // len(fill) + 1))[: len(src)]
    for i in range(0, len(src), 4096):  # pages that differ, so a misplaced packet changes the hash
        src[i : i + 8] = i.to_bytes(8, "little")
    mr = dev.register(src, Access.LOCAL_WRITE)
    cq = dev.create_cq(1 << 16)
    qps = [dev.create_qp(QpInitAttr(send_cq=cq, recv_cq=dev.create_cq())) for _ in range(nq)]
    hello = ch.call(
        {
            "hello": __version__,
            "endpoints": dev.endpoints(),
            "qps": nq,
            "buf_size": region * nq,
            "loss": loss,
        }
    )
    peer = _peer(hello, dev.num_ports)
    remote = hello["qpns"]
    va, rkey = int(hello["va"]), int(hello["rkey"])
    for q, r in zip(qps, remote, strict=True):
        dev.connect(q, peer, int(r))
    ch.call({"qpns": [q.qp_num for q in qps]})
    if loss:
        dev.impair(loss=loss)
    results = []
    failure = _PortFailure(dev, ch, fail_port)
    target = _Target(qps, cq, mr, va, rkey, region)
    for size in sizes:
        n = iters or default_iters(size)
        if imm:
            ch.call({"op": "recvs", "n": n})
        res = _measure(dev, target, size, n, imm, tx_depth, timeout, failure)
        results.append(res)
        if on_result is not None:
            on_result(res)
    reply = ch.call({"op": "hash", "length": region * nq})
    expect = bytearray(region * nq)
    for k in range(nq):  # every QP wrote the first ``max(sizes)`` bytes of its region
        expect[k * region : k * region + max(sizes)] = src[k * region : k * region + max(sizes)]
    hash_ok = reply.get("sha256") == hashlib.sha256(expect).hexdigest()
    return ClientReport(results, hash_ok, dev.num_ports, nq, dev.stats.as_dict(), dev.nic.stats.as_dict())


@dataclass(frozen=True)
class _Target:
    """The client's QPs, their send CQ and source MR, and where the server's buffer is."""

    qps: list[Any]
    cq: Any
    mr: Any
    va: int
    rkey: int
    region: int
    """Bytes of the buffer (on both sides) each QP writes into."""


class _PortFailure:
    """Blackholes a plane, on both sides, once ``fail_port``'s time since the start of the run has come."""

    def __init__(self, dev: UdpDevice, ch: _Channel, fail_port: tuple[int, float] | None) -> None:
        self.dev, self.ch, self.fail_port = dev, ch, fail_port
        self.start = time.monotonic()

    def poll(self) -> None:
        f = self.fail_port
        if f is not None and time.monotonic() - self.start >= f[1]:
            self.dev.blackhole_port(f[0])
            self.ch.call({"op": "fail_port", "port": f[0]})
            self.fail_port = None


def _measure(
    dev: UdpDevice,
    target: _Target,
    size: int,
    n: int,
    imm: bool,
    tx_depth: int,
    timeout: float,
    failure: _PortFailure,
) -> SizeResult:
    qps, cq, mr, region = target.qps, target.cq, target.mr, target.region
    stats = dev.nic.stats
    retx0 = stats.retransmits
    events0 = _ev_changes(dev)
    op = WrOpcode.RDMA_WRITE_WITH_IMM if imm else WrOpcode.RDMA_WRITE
    posted = done = 0
    ok = True
    stamps: list[float] = []
    t0 = time.perf_counter()
    deadline = time.monotonic() + timeout
    while done < n:
        failure.poll()
        while posted < n and posted - done < tx_depth:
            k = posted % len(qps)
            wr = SendWR(
                posted + 1,
                op,
                [Sge(mr.addr + k * region, size, mr.lkey)],
                target.va + k * region,
                target.rkey,
                posted & 0xFFFFFFFF if imm else None,
                SendFlags.SIGNALED,
            )
            dev.post_send(qps[k], wr)
            posted += 1
        dev.progress(0.001)
        for wc in cq.poll(1024):
            done += 1
            stamps.append(time.perf_counter())
            if wc.status is not WcStatus.SUCCESS:
                ok = False
        if time.monotonic() > deadline:
            raise PerfError(f"{size} B: {done} of {n} Writes completed in {timeout:.0f} s")
        if not ok:
            raise PerfError(f"{size} B: a Write failed ({wc.status.name})")
    secs = time.perf_counter() - t0
    total = size * n
    avg = total * 8 / secs / 1e9
    peak = avg
    if n >= 20 and secs > 0:  # the best tenth of the run's time (completions arrive in bursts)
        slices = [0] * 10
        for t in stamps:
            slices[min(9, int((t - t0) / secs * 10))] += 1
        peak = max(avg, max(slices) * size * 8 / (secs / 10) / 1e9)
    return SizeResult(
        size,
        n,
        round(peak, 6),
        round(avg, 6),
        round(n / secs / 1e6, 6),
        round(secs, 4),
        stats.retransmits - retx0,
        _ev_changes(dev) - events0,
        ok,
    )


def _ev_changes(dev: UdpDevice) -> int:
    return sum(1 for e in dev.nic.ev_events if e.state in (EVState.ASSUMED_BAD, EVState.GOOD))
