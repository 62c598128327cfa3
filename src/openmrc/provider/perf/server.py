"""The perf server: serves clients on its device, one after the other."""

from __future__ import annotations

import contextlib
import hashlib
import socket
import threading
from collections.abc import Callable, Sequence

from openmrc import __version__
from openmrc.provider.perf.entropy import PerfFabric, install_profile
from openmrc.provider.perf.exchange import MAX_SIZE, OOB_PORT, Channel, open_device, peer_of
from openmrc.provider.perf.report import PerfError
from openmrc.provider.udp import UdpDevice
from openmrc.transport import LocalProtocolError, QpSecurity, RecvWR, SecurityDomain

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
) -> None:
    """Serve perf clients on a device bound to ``binds`` (one endpoint per plane) until ``stop`` is set
    (or after one client with ``once``). ``ready`` is called with the TCP address once listening; ``oob``
    ``::`` listens on IPv6 and IPv4. ``fabric``: this host's place in a fabric export (SRv6 EVs).
    ``security``: take only clients of this security domain, their QPs authenticated (the client chooses
    whether payloads are encrypted too)."""
    stop = stop or threading.Event()
    with open_device(binds, link_gbps, fabric) as dev, _listen(oob) as lsock:
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
            ch = Channel(conn)
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
    ch: Channel,
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
    peer = peer_of(hello, dev.num_ports)
    mode = str(hello.get("ev_mode", "udp"))
    evs = hello.get("evs")
    profile = install_profile(
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
