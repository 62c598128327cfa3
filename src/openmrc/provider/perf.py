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

*A server that goes away.* While it measures, the client looks at the out-of-band connection every
``_OOB_CHECK_S`` (a non-blocking peek): the server never speaks unasked, so an end of file or a reset
there means its process is gone, and the client fails at once rather than waiting for the transport's
retries to run out (with the default connect attributes, 4.4 s of silence).

*Entropy.* ``ev_mode`` chooses the QPs' EV profiles, on both sides: ``udp`` (the device's default
profile: UDP source ports), ``stev`` (UDP source ports and IPv6 flow labels, for fabrics that hash on the
flow label) or ``srv6`` (one uSID path per EV over every plane and spine, from a fabric export written by
``openmrc topo plan --out`` or ``openmrc testbed up``: `PerfFabric`). With a fabric each side finds
itself among the export's hosts by its addresses and binds its port addresses and its uSID addresses.

*Duration runs.* With ``duration`` the client writes one message size for that long and reports every
``interval``: goodput, retransmissions and how many EVs are GOOD and ASSUMED_BAD (`IntervalReport`), the
figures of a failure experiment (``openmrc testbed``).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import select
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from openmrc import __version__
from openmrc.ev import EVField, EVFormatMode, EVFormatProfile, EVProfile, EVProfileMode, EVState
from openmrc.fabric.linux import LinuxFabric, load_export
from openmrc.provider.udp import Peer, UdpDevice, parse_endpoint, software_config
from openmrc.transport import (
    Access,
    LocalProtocolError,
    NicConfig,
    QpInitAttr,
    QpSecurity,
    RecvWR,
    SecurityDomain,
    SendFlags,
    SendWR,
    Sge,
    WcStatus,
    WrOpcode,
)

__all__ = [
    "EV_MODES",
    "OOB_PORT",
    "IntervalReport",
    "PerfError",
    "PerfFabric",
    "SizeResult",
    "default_iters",
    "perf_config",
    "run_client",
    "serve",
    "stev_profile",
    "sweep_sizes",
]

OOB_PORT = 18515
MAX_SIZE = 1 << 30
EV_MODES = ("udp", "stev", "srv6")
_PROFILE = 1  # the EV profile id perf installs for stev and srv6
_OOB_CHECK_S = 0.05  # how often a measuring client looks whether the server's connection closed


class PerfError(RuntimeError):
    """A perf session failed (the peer refused, went away, or the data did not arrive intact)."""


def perf_config(link_gbps: float = 25.0) -> NicConfig:
    """Transport settings for a software NIC: ``link_gbps`` per port, the RTT of a user-space stack
    (`openmrc.provider.udp.software_config`)."""
    return software_config(link_gbps)


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
    evs_marked_bad: int = 0
    """EV events of the run that marked an EV ASSUMED_BAD (``ev_state_changes`` counts those to GOOD too)."""


@dataclass
class IntervalReport:
    """One interval of a duration run: when it ended (``time.time()``), the goodput of the Writes that
    completed in it, the retransmissions in it, and the EVs of the client's QPs by state at its end:
    ``evs_good`` / ``evs_bad`` (GOOD, ASSUMED_BAD), and ``evs_held``: GOOD EVs of the rotation held out of
    use while a loss on them is judged (the sender routes around them before it blames them)."""

    t: float
    gbps: float
    retransmits: int
    evs_good: int
    evs_bad: int
    evs_held: int = 0


@dataclass
class ClientReport:
    results: list[SizeResult]
    hash_ok: bool
    planes: int
    qps: int
    device: dict[str, int] = field(default_factory=dict)
    nic: dict[str, int] = field(default_factory=dict)
    ev_mode: str = "udp"
    intervals: list[IntervalReport] = field(default_factory=list)

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

    def peer_closed(self) -> bool:
        """Whether the peer closed or reset the connection; never blocks. Only for a side that expects
        nothing unasked: bytes waiting to be read count as open."""
        try:
            readable, _, _ = select.select([self.sock], [], [], 0)
            # a peek (the line reader's buffer is empty between calls): b"" is the end of file
            return bool(readable) and not self.sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
        except BlockingIOError:
            return False
        except (OSError, ValueError):  # a reset, or the socket already closed here
            return True

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.rfile.close()
            self.sock.close()


@dataclass(frozen=True)
class PerfFabric:
    """This side's place in a fabric export: the fabric and the host index this process is."""

    fabric: LinuxFabric
    host: int

    @classmethod
    def locate(cls, directory: str, binds: Sequence[str] | None = None) -> PerfFabric:
        """Read the export in ``directory`` and find the host whose plane-0 address is ``binds[0]``, or,
        without binds, the one whose address this machine (namespace) owns."""
        fab = load_export(directory)
        n = fab.topo.num_hosts
        if binds:
            ip = parse_endpoint(binds[0])[0]
            for h in range(n):
                if fab.host_address(h, 0) == ip:
                    return cls(fab, h)
            raise PerfError(f"{ip} is not a host's plane-0 address in the fabric export {directory}")
        for h in range(n):
            with socket.socket(socket.AF_INET6, socket.SOCK_DGRAM) as s:
                try:
                    s.bind((fab.host_address(h, 0), 0))
                except OSError:
                    continue
                return cls(fab, h)
        raise PerfError(f"none of the {n} hosts of the fabric export {directory} has its address here")

    def binds(self) -> list[str]:
        return [self.fabric.host_address(self.host, p) for p in range(self.fabric.topo.planes)]

    def srv6_addresses(self) -> list[str | None] | None:
        f = self.fabric
        return [f.usid_address(self.host, p) for p in range(f.topo.planes)] if f.srv6 else None


def _device(binds: Sequence[str], link_gbps: float, fabric: PerfFabric | None) -> UdpDevice:
    extra = fabric.srv6_addresses() if fabric is not None else None
    return UdpDevice(binds, config=perf_config(link_gbps), srv6_addresses=extra)


def stev_profile(count: int) -> EVProfile:
    """Generated STEV EVs: a random flow label (high 16 bits) and a source port of the dynamic range."""
    fields = (
        EVField(16, min_val=1, max_val=0xFFFF, mask=0xFFFF),
        EVField(16, min_val=0xC000, max_val=0xFFFF, mask=0xFFFF),
    )
    fmt = EVFormatProfile(EVFormatMode.STEV, (16, 16))
    return EVProfile(EVProfileMode.GEN, fmt, fields, count, max(1, count // 8))


def _install_profile(
    dev: UdpDevice, mode: str, fabric: PerfFabric | None, peer_host: int | None, evs: int | None
) -> int:
    """Install the EV profile ``mode`` asks for towards the peer; returns its id (0: the default)."""
    if mode == "udp":
        return 0
    if mode == "stev":
        dev.add_ev_profile(_PROFILE, stev_profile(evs or 64))
        return _PROFILE
    if mode != "srv6":
        raise PerfError(f"EV mode {mode!r}: one of {', '.join(EV_MODES)}")
    if fabric is None or not fabric.fabric.srv6:
        raise PerfError("SRv6 EVs need the fabric's SRv6 export on both sides (--fabric DIR)")
    if peer_host is None or not 0 <= peer_host < fabric.fabric.topo.num_hosts or peer_host == fabric.host:
        raise PerfError(f"the peer's host {peer_host!r} is not another host of the fabric")
    try:
        prof, ports = fabric.fabric.plan.ev_profile(fabric.host, peer_host, evs)
    except ValueError as exc:
        raise PerfError(f"--evs: {exc}") from None
    dev.add_ev_profile(_PROFILE, prof, ports)
    return _PROFILE


def _peer(msg: dict[str, Any], n: int) -> Peer:
    eps = msg.get("endpoints")
    if not isinstance(eps, list) or len(eps) != n:
        raise PerfError(f"the peer has {len(eps) if isinstance(eps, list) else '?'} planes, this side {n}")
    return Peer.of(tuple(e) if isinstance(e, list) else e for e in eps)


# -- server ----------------------------------------------------------------------------------------------
def serve(
    binds: Sequence[str],
    *,
    oob: tuple[str, int] = ("::", OOB_PORT),
    once: bool = False,
    link_gbps: float = 25.0,
    log: Callable[[str], None] = print,
    ready: Callable[[tuple[str, int]], None] | None = None,
    stop: threading.Event | None = None,
    fabric: PerfFabric | None = None,
    security: SecurityDomain | None = None,
) -> None:
    """Serve perf clients on a device bound to ``binds`` (one endpoint per plane) until ``stop`` is set
    (or after one client with ``once``). ``ready`` is called with the TCP address once listening; ``oob``
    ``::`` listens on IPv6 and IPv4. ``fabric``: this host's place in a fabric export (SRv6 EVs).
    ``security``: take only clients of this security domain, their QPs authenticated (the client chooses
    whether payloads are encrypted too)."""
    stop = stop or threading.Event()
    with _device(binds, link_gbps, fabric) as dev, _listen(oob) as lsock:
        dev.start()
        lsock.settimeout(0.2)
        addr = lsock.getsockname()[:2]
        sec = "" if security is None else f", authenticated in security domain {security.sdi}"
        log(f"openmrc perf server: {len(binds)} planes on {', '.join(binds)}{sec}")
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
                _session(dev, ch, log, fabric, security)
                log(f"client {peer[0]} done")
            except (PerfError, LocalProtocolError, OSError, ValueError, KeyError, TypeError) as exc:
                log(f"client {peer[0]}: {exc}")
                with contextlib.suppress(OSError):
                    ch.send({"error": str(exc)})
            finally:
                ch.close()
            if once:
                return


def _listen(oob: tuple[str, int]) -> socket.socket:
    if oob[0] == "::" and socket.has_dualstack_ipv6():
        return socket.create_server(oob, family=socket.AF_INET6, dualstack_ipv6=True)
    return socket.create_server(oob, family=socket.AF_INET6 if ":" in oob[0] else socket.AF_INET)


def _session(
    dev: UdpDevice,
    ch: _Channel,
    log: Callable[[str], None],
    fabric: PerfFabric | None,
    security: SecurityDomain | None = None,
) -> None:
    hello = ch.recv()
    qp_security = _agree_security(security, hello.get("secure"))
    size = int(hello["buf_size"])
    nq = int(hello["qps"])
    if not 1 <= size <= MAX_SIZE:
        raise PerfError(f"buf_size {size} outside 1..{MAX_SIZE}")
    if not 1 <= nq <= 64:
        raise PerfError(f"qps {nq} outside 1..64")
    peer = _peer(hello, dev.num_ports)
    mode = str(hello.get("ev_mode", "udp"))
    evs = hello.get("evs")
    profile = _install_profile(
        dev, mode, fabric, hello.get("host"), int(evs) if isinstance(evs, int) and mode == "stev" else None
    )
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
                "host": None if fabric is None else fabric.host,
                "qpns": [q.qp_num for q in qps],
                "va": mr.addr,
                "rkey": mr.rkey,
            }
        )
        msg = ch.recv()
        for q, remote in zip(qps, msg["qpns"], strict=True):
            dev.connect(q, peer, int(remote), ev_profile_id=profile, security=qp_security)
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


def _agree_security(security: SecurityDomain | None, asked: object) -> QpSecurity | None:
    """The server's side of the agreement: the client's QPs are authenticated in the server's domain, or
    `PerfError` says why not."""
    if security is None:
        if asked:
            raise PerfError(
                "the client asks for authentication; this server has no security domain (--secure)"
            )
        return None
    if not isinstance(asked, dict):
        raise PerfError(
            f"this server takes only clients of security domain {security.sdi} (--secure KEYFILE)"
        )
    if asked.get("sdi") != security.sdi:
        raise PerfError(f"the client's security domain is {asked.get('sdi')}, the server's {security.sdi}")
    if asked.get("fingerprint") != security.fingerprint():
        raise PerfError(f"the client's key for security domain {security.sdi} is not the server's")
    epoch = asked.get("epoch")
    if not isinstance(epoch, int) or not 0 <= epoch <= 0xFF or not security.live(epoch):
        raise PerfError(
            f"the client's key epoch {asked.get('epoch')} is more than one from the server's {security.epoch}"
        )
    return QpSecurity(security, encrypt=bool(asked.get("encrypt")))


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
    ev_mode: str = "udp",
    evs: int | None = None,
    fabric: PerfFabric | None = None,
    duration: float | None = None,
    interval: float = 0.1,
    on_interval: Callable[[IntervalReport], None] | None = None,
    security: SecurityDomain | None = None,
    encrypt: bool = False,
    header_tag: bool = True,
) -> ClientReport:
    """Measure ``sizes`` against the server at ``server`` (its TCP address) from a device on ``binds``.
    With ``duration`` (seconds), write the single size in ``sizes`` for that long and report every
    ``interval`` seconds. ``security``: authenticate the QPs in this security domain (the server's),
    ``encrypt``: and encrypt their payloads; ``header_tag``: False leaves the data packets' header tags out
    (one AES-GCM call less per packet; a trimmed packet is then recovered as a loss)."""
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
            f"cannot reach the server at {server[0]}:{server[1]}: {exc.strerror or exc}"
        ) from None
    conn.settimeout(timeout)
    ch = _Channel(conn)
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
    )
    with _device(binds, link_gbps, fabric) as dev:
        try:
            return _client_session(dev, ch, sizes, biggest, run, fail_port, fabric, on_result, on_interval)
        finally:
            with contextlib.suppress(OSError, PerfError):
                ch.call({"op": "bye"})
            ch.close()


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
    header_tag: bool = True


def _client_session(
    dev: UdpDevice,
    ch: _Channel,
    sizes: Sequence[int],
    biggest: int,
    run: _Run,
    fail_port: tuple[int, float] | None,
    fabric: PerfFabric | None,
    on_result: Callable[[SizeResult], None] | None,
    on_interval: Callable[[IntervalReport], None] | None,
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
        }
    )
    peer = _peer(hello, dev.num_ports)
    qp_security = (
        None
        if run.security is None
        else QpSecurity(run.security, encrypt=run.encrypt, header_tag=run.header_tag)
    )
    profile = _install_profile(dev, run.ev_mode, fabric, hello.get("host"), run.evs)
    remote = hello["qpns"]
    va, rkey = int(hello["va"]), int(hello["rkey"])
    for q, r in zip(qps, remote, strict=True):
        dev.connect(q, peer, int(r), ev_profile_id=profile, security=qp_security)
    ch.call({"qpns": [q.qp_num for q in qps]})
    if loss:
        dev.impair(loss=loss)
    results = []
    failure = _PortFailure(dev, ch, fail_port)
    target = _Target(qps, cq, mr, va, rkey, region)
    intervals: list[IntervalReport] = []
    ticker = None
    if run.duration is not None:
        ticker = _Ticker(dev, qps, run.interval, intervals, on_interval)
    for size in sizes:
        n = run.iters or default_iters(size)
        if run.duration is not None:  # as many as the time allows at the ports' rate
            n = run.iters or max(16, int(run.duration * dev.num_ports * dev.config.link_bps / 8 / size))
        if imm:
            ch.call({"op": "recvs", "n": n})
        res = _measure(dev, target, size, n, imm, run, failure, ch, ticker)
        results.append(res)
        if on_result is not None:
            on_result(res)
    reply = ch.call({"op": "hash", "length": region * nq})
    expect = bytearray(region * nq)
    for k in range(nq):  # every QP wrote the first ``max(sizes)`` bytes of its region
        expect[k * region : k * region + max(sizes)] = src[k * region : k * region + max(sizes)]
    hash_ok = reply.get("sha256") == hashlib.sha256(expect).hexdigest()
    return ClientReport(
        results,
        hash_ok,
        dev.num_ports,
        nq,
        dev.stats.as_dict(),
        dev.nic.stats.as_dict(),
        run.ev_mode,
        intervals,
    )


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
        self.next = time.monotonic() + interval
        self.bytes = 0
        self.retx = dev.nic.stats.retransmits

    def completed(self, nbytes: int) -> None:
        self.bytes += nbytes

    def poll(self, final: bool = False) -> None:
        now = time.monotonic()
        if now < self.next and not final:
            return
        span = self.interval + (now - self.next)
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
            round(time.time(), 4), round(self.bytes * 8 / span / 1e9, 6), retx - self.retx, good, bad, held
        )
        self.out.append(rep)
        if self.notify is not None:
            self.notify(rep)
        self.bytes, self.retx, self.next = 0, retx, now + self.interval


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
    run: _Run,
    failure: _PortFailure,
    ch: _Channel,
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
