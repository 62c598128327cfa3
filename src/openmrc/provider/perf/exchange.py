"""The out-of-band exchange both sides hold: the JSON-lines channel, the device, and what each side tells
the other of itself (endpoints, QPs, first PSNs, buffer)."""

from __future__ import annotations

import contextlib
import ipaddress
import json
import select
import socket
from collections.abc import Sequence
from typing import Any

from openmrc.provider.perf.entropy import PerfFabric
from openmrc.provider.perf.report import PerfError, QpAddress, SideAddress
from openmrc.provider.udp import Peer, UdpDevice, format_endpoint, parse_endpoint, software_config
from openmrc.transport import NicConfig
from openmrc.wire import PSN_MASK

__all__ = [
    "MAX_SIZE",
    "OOB_PORT",
    "Channel",
    "local_side",
    "open_device",
    "peer_name",
    "peer_of",
    "peer_psns",
    "perf_config",
    "remote_side",
]

OOB_PORT = 18515
MAX_SIZE = 1 << 30


def perf_config(link_gbps: float = 25.0) -> NicConfig:
    """Transport settings for a software NIC: ``link_gbps`` per port, the RTT of a user-space stack
    (`openmrc.provider.udp.software_config`)."""
    return software_config(link_gbps)


class Channel:
    """JSON lines to and from ``peer`` (its role, "client" or "server", names it in errors)."""

    def __init__(self, sock: socket.socket, peer: str) -> None:
        self.sock, self.peer = sock, peer
        self.rfile = sock.makefile("r", encoding="utf-8")

    def send(self, msg: dict[str, Any]) -> None:
        self.sock.sendall((json.dumps(msg) + "\n").encode())

    def recv(self) -> dict[str, Any]:
        line = self.rfile.readline()
        if not line:
            raise PerfError(f"the {self.peer} closed the out-of-band connection")
        try:
            msg = json.loads(line)
        except ValueError:
            raise PerfError(f"the {self.peer} sent something that is not JSON: {line[:80]!r}") from None
        if not isinstance(msg, dict):
            raise PerfError(f"the {self.peer} sent a JSON value that is not an object")
        if "error" in msg:
            raise PerfError(f"the {self.peer} refused: {msg['error']}")
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


def open_device(binds: Sequence[str], link_gbps: float, fabric: PerfFabric | None) -> UdpDevice:
    extra = fabric.srv6_addresses() if fabric is not None else None
    return UdpDevice(binds, config=perf_config(link_gbps), srv6_addresses=extra)


def peer_of(msg: dict[str, Any], n: int, them: str, us: str) -> Peer:
    """The peer's endpoints (one per plane) from ``msg``; ``them`` and ``us`` name the two sides by role,
    so that the reason reads right on either side (the server sends its refusal to the client)."""
    eps = msg.get("endpoints")
    if not isinstance(eps, list) or len(eps) != n:
        k = len(eps) if isinstance(eps, list) else "?"
        raise PerfError(
            f"the {them} has {k} planes, the {us} {n}: both need as many (--planes, or one --bind per plane)"
        )
    return Peer.of(tuple(e) if isinstance(e, list) else e for e in eps)


def peer_name(addr: Sequence[Any]) -> str:
    """A TCP peer's ``ip:port`` (``[ip]:port`` for IPv6; an IPv4 client of a dual-stack server as IPv4)."""
    ip = ipaddress.ip_address(str(addr[0]).split("%")[0])
    mapped = ip.ipv4_mapped if isinstance(ip, ipaddress.IPv6Address) else None
    return format_endpoint((str(mapped or addr[0]), int(addr[1])))


def local_side(
    dev: UdpDevice, qps: Sequence[Any], psns: Sequence[int], rkey: int, vas: Sequence[int]
) -> SideAddress:
    return SideAddress(
        [format_endpoint(e) for e in dev.endpoints()],
        [QpAddress(q.qp_num, psn, rkey, va) for q, psn, va in zip(qps, psns, vas, strict=True)],
    )


def remote_side(msg: dict[str, Any], endpoints: Sequence[Any], n: int, region: int) -> SideAddress:
    """The peer's side from what it said: ``qpns``, ``psns``, ``rkey`` and ``va`` (of its first QP's region;
    QP k's is ``region`` bytes further per k)."""
    qpns = [int(x) for x in msg["qpns"]]
    psns = peer_psns(msg, n)
    rkey, va = int(msg.get("rkey", 0)), int(msg.get("va", 0))
    return SideAddress(
        [format_endpoint(parse_endpoint(tuple(e) if isinstance(e, list) else e)) for e in endpoints],
        [
            QpAddress(qpn, psn, rkey, va + k * region)
            for k, (qpn, psn) in enumerate(zip(qpns, psns, strict=True))
        ],
    )


def peer_psns(msg: dict[str, Any], n: int) -> list[int]:
    """The first PSNs the peer's ``n`` QPs send with (0s from a peer that says none: an older version)."""
    got = msg.get("psns")
    if got is None:
        return [0] * n
    if (
        not isinstance(got, list)
        or len(got) != n
        or not all(isinstance(x, int) and 0 <= x <= PSN_MASK for x in got)
    ):
        raise PerfError(f"the peer's first PSNs {got!r}: {n} numbers in 0..{PSN_MASK}")
    return got
