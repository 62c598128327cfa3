"""The perf server: serves one client at a time on its device, tells others it is busy."""

from __future__ import annotations

import contextlib
import hashlib
import json
import random
import socket
import threading
from collections.abc import Callable, Sequence

from openmrc import __version__
from openmrc.provider.perf.entropy import PerfFabric, install_profile
from openmrc.provider.perf.exchange import (
    MAX_SIZE,
    OOB_PORT,
    Channel,
    local_side,
    open_device,
    peer_name,
    peer_of,
    remote_side,
)
from openmrc.provider.perf.report import Connection, PerfError, operation_name
from openmrc.provider.udp import UdpDevice, format_endpoint
from openmrc.transport import LocalProtocolError, QpSecurity, RecvWR, SecurityDomain
from openmrc.wire import PSN_MASK

__all__ = ["serve"]


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
    warn: Callable[[str], None] | None = None,
    rng: random.Random | None = None,
) -> None:
    """Serve perf clients on a device bound to ``binds`` (one endpoint per plane) until ``stop`` is set
    (or after one client with ``once``). ``ready`` is called with the TCP address once listening; ``oob``
    ``::`` listens on IPv6 and IPv4. ``fabric``: this host's place in a fabric export (SRv6 EVs).
    ``security``: take only clients of this security domain, their QPs authenticated (the client chooses
    whether payloads are encrypted too). ``log`` takes what the server does, ``warn`` (``log`` if not
    given) what went wrong: a client that failed or was refused. ``rng`` picks the QPs' first PSNs."""
    stop = stop or threading.Event()
    warn = warn or log
    rng = rng or random.Random()
    with open_device(binds, link_gbps, fabric) as dev, _listen(oob) as lsock:
        dev.start()
        lsock.settimeout(0.2)
        addr = lsock.getsockname()[:2]
        sec = "" if security is None else f", authenticated in security domain {security.sdi}"
        ends = ", ".join(format_endpoint(e) for e in dev.endpoints())
        log(f"openmrc perf server: {len(binds)} planes on {ends}{sec}")
        log(f"waiting for clients on TCP {format_endpoint(addr)}")
        if ready is not None:
            ready(addr)
        while not stop.is_set():
            try:
                conn, peer = lsock.accept()
            except TimeoutError:
                continue
            conn.settimeout(None)
            who = peer_name(peer)
            ch = Channel(conn, "client")
            others = _Refuser(lsock, who, warn)
            others.start()
            failed: Exception | None = None
            try:
                _session(dev, ch, log, fabric, security, rng, who)
            except (PerfError, LocalProtocolError, OSError, ValueError, KeyError, TypeError) as exc:
                failed = exc
                with contextlib.suppress(OSError):
                    ch.send({"error": str(exc)})
            finally:
                others.stop()  # (before the outcome is logged: a client that reacts to it is served)
                ch.close()
            if failed is None:
                log(f"client {who} done")
            else:
                warn(f"client {who}: {failed}")
            if once:
                return


class _Refuser(threading.Thread):
    """While the server serves ``serving``, tells every other client at once that it is busy, and says so
    on ``warn``."""

    def __init__(self, lsock: socket.socket, serving: str, warn: Callable[[str], None]) -> None:
        super().__init__(name="perf-refuser", daemon=True)
        self.lsock, self.serving, self.warn = lsock, serving, warn
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            try:
                conn, peer = self.lsock.accept()  # (its timeout: the loop sees ``done`` 5 times a second)
            except TimeoutError:
                continue
            except OSError:
                return
            self.warn(f"client {peer_name(peer)} refused: busy with client {self.serving}")
            why = f"the server is busy with another client ({self.serving}); try again when it is done"
            threading.Thread(target=_refuse, args=(conn, why), name="perf-refused", daemon=True).start()

    def stop(self) -> None:
        self.done.set()
        self.join()


def _refuse(conn: socket.socket, why: str) -> None:
    """Send ``why`` and read what the client says until it closes: closing first, with its hello unread,
    would reset the connection, and the client would read the reset instead of the reason."""
    with conn, contextlib.suppress(OSError):
        conn.settimeout(60)
        conn.sendall((json.dumps({"error": why}) + "\n").encode())
        conn.shutdown(socket.SHUT_WR)
        while conn.recv(1 << 16):
            pass


def _listen(oob: tuple[str, int]) -> socket.socket:
    if oob[0] == "::" and socket.has_dualstack_ipv6():
        return socket.create_server(oob, family=socket.AF_INET6, dualstack_ipv6=True)
    return socket.create_server(oob, family=socket.AF_INET6 if ":" in oob[0] else socket.AF_INET)


def _session(
    dev: UdpDevice,
    ch: Channel,
    log: Callable[[str], None],
    fabric: PerfFabric | None,
    security: SecurityDomain | None,
    rng: random.Random,
    who: str,
) -> None:
    hello = ch.recv()
    qp_security = _agree_security(security, hello.get("secure"))
    size = int(hello["buf_size"])
    nq = int(hello["qps"])
    if not 1 <= size <= MAX_SIZE:
        raise PerfError(f"buf_size {size} outside 1..{MAX_SIZE}")
    if not 1 <= nq <= 64:
        raise PerfError(f"qps {nq} outside 1..64")
    peer = peer_of(hello, dev.num_ports, "client", "server")
    mode = str(hello.get("ev_mode", "udp"))
    evs = hello.get("evs")
    profile = install_profile(
        dev, mode, fabric, hello.get("host"), int(evs) if isinstance(evs, int) and mode == "stev" else None
    )
    sec = "" if qp_security is None else f", {'encrypted' if qp_security.encrypt else 'authenticated'}"
    log(f"client {who}: {operation_name(bool(hello.get('imm')))}, {nq} QP(s), {mode} EVs{sec}")
    buf = bytearray(size)
    mr = dev.register(buf)
    qps = [dev.create_qp() for _ in range(nq)]
    psns = [rng.randrange(PSN_MASK + 1) for _ in qps]
    region = size // nq
    recv_posted = 0
    try:
        ch.send(
            {
                "ok": True,
                "version": __version__,
                "endpoints": dev.endpoints(),
                "host": None if fabric is None else fabric.host,
                "qpns": [q.qp_num for q in qps],
                "psns": psns,
                "va": mr.addr,
                "rkey": mr.rkey,
            }
        )
        msg = ch.recv()
        if "psns" not in msg:  # a client that says none sends from PSN 0 and expects the same
            psns = [0] * nq
        remote = remote_side(msg, hello["endpoints"], nq, int(msg.get("region", 0)))
        for q, r, psn in zip(qps, remote.qps, psns, strict=True):
            dev.connect(q, peer, r.qpn, rq_psn=r.psn, sq_psn=psn, ev_profile_id=profile, security=qp_security)
        if hello.get("loss"):
            dev.impair(loss=float(hello["loss"]))
        local = local_side(dev, qps, psns, mr.rkey, [mr.addr + k * region for k in range(nq)])
        for line in Connection(local, remote).lines():
            log(line)
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
