"""The out-of-band exchange both sides hold: the JSON-lines channel, the device, and what each side tells
the other of itself."""

from __future__ import annotations

import contextlib
import json
import select
import socket
from collections.abc import Sequence
from typing import Any

from openmrc.provider.perf.entropy import PerfFabric
from openmrc.provider.perf.report import PerfError
from openmrc.provider.udp import Peer, UdpDevice, software_config
from openmrc.transport import NicConfig

__all__ = ["MAX_SIZE", "OOB_PORT", "Channel", "open_device", "peer_of", "perf_config"]

OOB_PORT = 18515
MAX_SIZE = 1 << 30


def perf_config(link_gbps: float = 25.0) -> NicConfig:
    """Transport settings for a software NIC: ``link_gbps`` per port, the RTT of a user-space stack
    (`openmrc.provider.udp.software_config`)."""
    return software_config(link_gbps)


class Channel:
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


def open_device(binds: Sequence[str], link_gbps: float, fabric: PerfFabric | None) -> UdpDevice:
    extra = fabric.srv6_addresses() if fabric is not None else None
    return UdpDevice(binds, config=perf_config(link_gbps), srv6_addresses=extra)


def peer_of(msg: dict[str, Any], n: int) -> Peer:
    eps = msg.get("endpoints")
    if not isinstance(eps, list) or len(eps) != n:
        raise PerfError(f"the peer has {len(eps) if isinstance(eps, list) else '?'} planes, this side {n}")
    return Peer.of(tuple(e) if isinstance(e, list) else e for e in eps)
