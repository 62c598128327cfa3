"""The perf client: connects, writes, measures (a sweep of sizes, or one size for a duration)."""

from __future__ import annotations

import contextlib
import hashlib
import random
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from openmrc import __version__
from openmrc.ev import EVState
from openmrc.provider.perf.entropy import EV_MODES, PerfFabric, install_profile
from openmrc.provider.perf.exchange import MAX_SIZE, Channel, local_side, open_device, peer_of, remote_side
from openmrc.provider.perf.report import (
    ClientReport,
    Connection,
    IntervalReport,
    PerfError,
    PerfInterrupted,
    SizeResult,
    summarize,
)
from openmrc.provider.udp import UdpDevice, format_endpoint
from openmrc.transport import (
    Access,
    QpInitAttr,
    QpSecurity,
    SecurityDomain,
    SendFlags,
    SendWR,
    Sge,
    WcStatus,
    WrOpcode,
)
from openmrc.wire import PSN_MASK

__all__ = ["default_iters", "run_client", "sweep_sizes"]

_OOB_CHECK_S = 0.05  # how often a measuring client looks whether the server's connection closed


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
    ev_mode: str = "udp",
    evs: int | None = None,
    fabric: PerfFabric | None = None,
    duration: float | None = None,
    interval: float = 0.1,
    on_interval: Callable[[IntervalReport], None] | None = None,
    security: SecurityDomain | None = None,
    encrypt: bool = False,
    header_tag: bool | str = "auto",
    on_connect: Callable[[Connection], None] | None = None,
    rng: random.Random | None = None,
) -> ClientReport:
    """Measure ``sizes`` against the server at ``server`` (its TCP address) from a device on ``binds``.
    With ``duration`` (seconds), write the single size in ``sizes`` for that long and report every
    ``interval`` seconds. ``security``: authenticate the QPs in this security domain (the server's),
    ``encrypt``: and encrypt their payloads; ``header_tag``: the data packets' header tags
    (`QpSecurity`'s: "auto", from the first trimmed packet the server could not verify; True: always;
    False: never). ``on_connect`` is told the connection once the QPs are connected; ``rng`` picks their
    first PSNs. Ctrl-C while measuring raises `PerfInterrupted` with what ran so far."""
    if encrypt and security is None:
        raise PerfError("encryption needs a security domain (--secure KEYFILE)")
    if not sizes or any(not 1 <= s <= MAX_SIZE for s in sizes):
        raise PerfError(f"message sizes must be 1..{MAX_SIZE} bytes")
    if ev_mode not in EV_MODES:
        raise PerfError(f"EV mode {ev_mode!r}: one of {', '.join(EV_MODES)}")
    if duration is not None and (len(sizes) != 1 or not 0 < duration <= 3600 or interval < 0.001):
        raise PerfError("a duration run takes one message size, 0 < duration <= 3600 s, interval >= 1 ms")
    if fail_port is not None and not 1 <= fail_port[0] <= len(binds):
        raise PerfError(f"--fail-port {fail_port[0]}: the device has ports 1..{len(binds)}")
    biggest = max(sizes)
    try:
        conn = socket.create_connection(server, timeout=10)
    except OSError as exc:
        raise PerfError(
            f"cannot reach the server at {format_endpoint(server)}: {exc.strerror or exc}"
        ) from None
    conn.settimeout(timeout)
    ch = Channel(conn, "server")
    run = _Run(
        iters,
        qps,
        imm,
        loss,
        tx_depth,
        timeout,
        ev_mode,
        evs,
        duration,
        interval,
        security,
        encrypt,
        header_tag,
        rng or random.Random(),
    )
    calls = _Calls(on_result, on_interval, on_connect)
    with open_device(binds, link_gbps, fabric) as dev:
        try:
            return _client_session(dev, ch, sizes, biggest, run, fail_port, fabric, calls)
        finally:
            with contextlib.suppress(OSError, PerfError):
                ch.call({"op": "bye"})
            ch.close()


def _secure_hello(security: SecurityDomain | None, encrypt: bool) -> dict[str, Any] | None:
    """What a client says of its security domain (never the key: a fingerprint of it)."""
    if security is None:
        return None
    return {
        "sdi": security.sdi,
        "epoch": security.epoch,
        "fingerprint": security.fingerprint(),
        "encrypt": encrypt,
    }


@dataclass(frozen=True)
class _Run:
    """What the client was asked to do."""

    iters: int | None
    qps: int
    imm: bool
    loss: float
    tx_depth: int
    timeout: float
    ev_mode: str
    evs: int | None
    duration: float | None
    interval: float
    security: SecurityDomain | None = None
    encrypt: bool = False
    header_tag: bool | str = "auto"
    rng: random.Random = field(default_factory=random.Random)


@dataclass(frozen=True)
class _Calls:
    """What the client's caller is told, as it happens."""

    result: Callable[[SizeResult], None] | None
    interval: Callable[[IntervalReport], None] | None
    connect: Callable[[Connection], None] | None


def _client_session(
    dev: UdpDevice,
    ch: Channel,
    sizes: Sequence[int],
    biggest: int,
    run: _Run,
    fail_port: tuple[int, float] | None,
    fabric: PerfFabric | None,
    calls: _Calls,
) -> ClientReport:
    nq, imm, loss = run.qps, run.imm, run.loss
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
            "ev_mode": run.ev_mode,
            "evs": run.evs,
            "host": None if fabric is None else fabric.host,
            "secure": _secure_hello(run.security, run.encrypt),
            "imm": imm,
        }
    )
    peer = peer_of(hello, dev.num_ports, "server", "client")
    qp_security = (
        None
        if run.security is None
        else QpSecurity(run.security, encrypt=run.encrypt, header_tag=run.header_tag)
    )
    profile = install_profile(dev, run.ev_mode, fabric, hello.get("host"), run.evs)
    # a server that says no PSNs sends from 0 and expects the same
    psns = [run.rng.randrange(PSN_MASK + 1) if "psns" in hello else 0 for _ in qps]
    remote = remote_side(hello, hello["endpoints"], nq, region)
    for q, r, psn in zip(qps, remote.qps, psns, strict=True):
        dev.connect(q, peer, r.qpn, rq_psn=r.psn, sq_psn=psn, ev_profile_id=profile, security=qp_security)
    local = local_side(dev, qps, psns, mr.rkey, [mr.addr + k * region for k in range(nq)])
    ch.call({"qpns": [q.qp_num for q in qps], "psns": psns, "rkey": mr.rkey, "va": mr.addr, "region": region})
    connection = Connection(local, remote)
    if calls.connect is not None:
        calls.connect(connection)
    if loss:
        dev.impair(loss=loss)
    results: list[SizeResult] = []
    failure = _PortFailure(dev, ch, fail_port)
    target = _Target(qps, cq, mr, remote.qps[0].va, remote.qps[0].rkey, region)
    intervals: list[IntervalReport] = []
    ticker = None
    if run.duration is not None:
        ticker = _Ticker(dev, qps, run.interval, intervals, calls.interval)

    def report(hash_ok: bool | None) -> ClientReport:
        return ClientReport(
            results,
            hash_ok,
            dev.num_ports,
            nq,
            dev.stats.as_dict(),
            dev.nic.stats.as_dict(),
            run.ev_mode,
            intervals,
            connection,
            summarize(intervals),
            interrupted=hash_ok is None,
        )

    try:
        for size in sizes:
            n = run.iters or default_iters(size)
            if run.duration is not None:  # as many as the time allows at the ports' rate
                n = run.iters or max(16, int(run.duration * dev.num_ports * dev.config.link_bps / 8 / size))
            if imm:
                ch.call({"op": "recvs", "n": n})
            res = _measure(dev, target, size, n, imm, run, failure, ch, ticker)
            results.append(res)
            if calls.result is not None:
                calls.result(res)
    except KeyboardInterrupt:
        if ticker is not None:
            ticker.poll(final=True)  # the interval under way, up to now
        raise PerfInterrupted(report(None)) from None
    reply = ch.call({"op": "hash", "length": region * nq})
    expect = bytearray(region * nq)
    for k in range(nq):  # every QP wrote the first ``max(sizes)`` bytes of its region
        expect[k * region : k * region + max(sizes)] = src[k * region : k * region + max(sizes)]
    return report(reply.get("sha256") == hashlib.sha256(expect).hexdigest())


class _Ticker:
    """Collects an `IntervalReport` every ``interval`` seconds of a duration run."""

    def __init__(
        self,
        dev: UdpDevice,
        qps: list[Any],
        interval: float,
        out: list[IntervalReport],
        notify: Callable[[IntervalReport], None] | None,
    ) -> None:
        self.dev, self.qps, self.interval, self.out, self.notify = dev, qps, interval, out, notify
        self.start = self.last = time.monotonic()
        self.next = self.start + interval
        self.bytes = 0
        self.retx = dev.nic.stats.retransmits

    def completed(self, nbytes: int) -> None:
        self.bytes += nbytes

    def poll(self, final: bool = False) -> None:
        now = time.monotonic()
        if now < self.next and not final:
            return
        span = max(now - self.last, 1e-9)
        good = bad = held = 0
        for q in self.qps:
            for e in q.ev_states():
                if e.state is EVState.GOOD:
                    good += 1
                    if e.active and not e.usable:
                        held += 1
                elif e.state is EVState.ASSUMED_BAD:
                    bad += 1
        retx = self.dev.nic.stats.retransmits
        rep = IntervalReport(
            round(time.time(), 4),
            round(self.bytes * 8 / span / 1e9, 6),
            retx - self.retx,
            good,
            bad,
            held,
            round(self.last - self.start, 4),
            round(now - self.start, 4),
            self.bytes,
        )
        self.out.append(rep)
        if self.notify is not None:
            self.notify(rep)
        self.bytes, self.retx, self.last, self.next = 0, retx, now, now + self.interval


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

    def __init__(self, dev: UdpDevice, ch: Channel, fail_port: tuple[int, float] | None) -> None:
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
    run: _Run,
    failure: _PortFailure,
    ch: Channel,
    ticker: _Ticker | None = None,
) -> SizeResult:
    tx_depth, timeout = run.tx_depth, run.timeout
    qps, cq, mr, region = target.qps, target.cq, target.mr, target.region
    stats = dev.nic.stats
    retx0 = stats.retransmits
    events0 = _ev_changes(dev)
    bad0 = _ev_changes(dev, (EVState.ASSUMED_BAD,))
    op = WrOpcode.RDMA_WRITE_WITH_IMM if imm else WrOpcode.RDMA_WRITE
    posted = done = 0
    ok = True
    failed: WcStatus | None = None  # the first error: the flushes that follow it say less
    stamps: list[float] = []
    t0 = time.perf_counter()
    deadline = time.monotonic() + timeout + (run.duration or 0.0)
    until = None if run.duration is None else time.monotonic() + run.duration
    check_oob = time.monotonic() + _OOB_CHECK_S
    while done < n:
        failure.poll()
        if time.monotonic() >= check_oob:
            if ch.peer_closed():
                of = f"{done} of {n}" if until is None else f"{done} (in {time.perf_counter() - t0:.1f} s)"
                raise PerfError(
                    f"{size} B: the server went away (its out-of-band connection closed) after {of} Writes"
                    " completed"
                )
            check_oob = time.monotonic() + _OOB_CHECK_S
        if until is not None and posted < n and time.monotonic() >= until:
            n = posted  # the time is up: wait for what is in flight
            continue
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
                failed = failed or wc.status
            elif ticker is not None:
                ticker.completed(size)
        if ticker is not None:
            ticker.poll()
        if time.monotonic() > deadline:
            raise PerfError(f"{size} B: {done} of {n} Writes completed in {timeout:.0f} s")
        if failed is not None:
            why = "; ".join(sorted({q.error_detail for q in qps if q.error_detail}))
            raise PerfError(
                f"{size} B: a Write failed ({why or failed.name}) after {done - 1} of {n} completed"
            )
    if ticker is not None:
        ticker.poll(final=True)
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
        _ev_changes(dev, (EVState.ASSUMED_BAD,)) - bad0,
    )


def _ev_changes(dev: UdpDevice, states: tuple[EVState, ...] = (EVState.ASSUMED_BAD, EVState.GOOD)) -> int:
    """EV events (of the queue, 65,536 deep) that moved an EV to one of ``states``."""
    return sum(1 for e in dev.nic.ev_events if e.state in states)
