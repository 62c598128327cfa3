"""How ranks find each other: a key-value store, and the launchers' environments.

A communicator publishes each rank's device address and, per peer, its QP number and receive slots under
keys of the store, and waits for the peer's. Any object with ``set(key, value)`` and ``get(key)`` (blocking
until the key exists, bytes or str back) serves, torch's ``c10d`` stores included. Here: `HashStore` (ranks
as threads of one process), `TCPStore` (rank 0 serves it, the others connect: torchrun's ``MASTER_ADDR`` /
``MASTER_PORT``), and `from_env` / `from_mpi`, which read torchrun's or mpiexec's environment.
"""

from __future__ import annotations

import json
import os
import socket
import socketserver
import threading
import time
from dataclasses import dataclass
from typing import Any, Protocol

__all__ = ["HashStore", "Launch", "Store", "TCPStore", "from_env", "from_mpi", "store_get"]


class Store(Protocol):
    def set(self, key: str, value: Any) -> None: ...
    def get(self, key: str) -> Any: ...


def store_get(store: Store, key: str) -> str:
    v = store.get(key)
    return v.decode() if isinstance(v, bytes | bytearray) else str(v)


class HashStore:
    """A store for ranks that are threads of one process (or simulated hosts)."""

    def __init__(self, timeout: float = 60.0) -> None:
        self.timeout = timeout
        self._data: dict[str, str] = {}
        self._cond = threading.Condition()

    def set(self, key: str, value: Any) -> None:
        with self._cond:
            self._data[key] = value.decode() if isinstance(value, bytes) else str(value)
            self._cond.notify_all()

    def get(self, key: str) -> str:
        with self._cond:
            if not self._cond.wait_for(lambda: key in self._data, self.timeout):
                raise TimeoutError(f"store: no key {key!r} within {self.timeout:g} s")
            return self._data[key]


class _Handler(socketserver.StreamRequestHandler):
    server: _Server

    def handle(self) -> None:
        for line in self.rfile:
            try:
                req = json.loads(line)
                key = str(req["key"])
                if req["op"] == "set":
                    self.server.store.set(key, req["value"])
                    out: dict[str, Any] = {"ok": True}
                else:
                    out = {"ok": True, "value": self.server.store.get(key)}
            except (TimeoutError, ValueError, KeyError) as exc:
                out = {"ok": False, "error": str(exc)}
            try:
                self.wfile.write(json.dumps(out).encode() + b"\n")
            except OSError:
                return


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, addr: tuple[str, int], store: HashStore) -> None:
        self.store = store
        super().__init__(addr, _Handler)


class TCPStore:
    """A store served over TCP by the rank created with ``is_master`` (on ``port``; 0: any free port, see
    `port`), which must live while others still connect; the others connect to ``host``:``port``."""

    def __init__(self, host: str, port: int, *, is_master: bool = False, timeout: float = 60.0) -> None:
        self.timeout = timeout
        self._server: _Server | None = None
        if is_master:
            try:
                self._server = _Server(("", port), HashStore(timeout))
            except OSError as exc:
                raise OSError(f"store: cannot listen on TCP port {port}: {exc.strerror or exc}") from None
            port = self._server.server_address[1]
            threading.Thread(target=self._server.serve_forever, daemon=True, name="openmrc-store").start()
            host = "127.0.0.1" if host in ("", "0.0.0.0") else host
        self.host, self.port = host, port
        self._lock = threading.Lock()
        self._sock = self._connect()
        self._file = self._sock.makefile("rb")

    def _connect(self) -> socket.socket:
        end = time.monotonic() + self.timeout
        while True:
            try:
                s = socket.create_connection((self.host, self.port), timeout=5)
                s.settimeout(self.timeout + 5)
                return s
            except OSError as exc:
                if time.monotonic() >= end:
                    raise OSError(
                        f"store: cannot reach {self.host}:{self.port}: {exc.strerror or exc}"
                    ) from None
                time.sleep(0.1)

    def _ask(self, req: dict[str, Any]) -> Any:
        with self._lock:
            try:
                self._sock.sendall(json.dumps(req).encode() + b"\n")
                line = self._file.readline()
            except OSError as exc:
                raise OSError(f"store at {self.host}:{self.port}: {exc.strerror or exc}") from None
        if not line:
            raise OSError(f"store at {self.host}:{self.port}: the connection closed (rank 0 gone?)")
        out = json.loads(line)
        if not out["ok"]:
            raise TimeoutError(f"store: {out['error']}")
        return out.get("value")

    def set(self, key: str, value: Any) -> None:
        self._ask({"op": "set", "key": key, "value": value.decode() if isinstance(value, bytes) else value})

    def get(self, key: str) -> str:
        return str(self._ask({"op": "get", "key": key}))

    def close(self) -> None:
        self._file.close()
        self._sock.close()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()


@dataclass(frozen=True)
class Launch:
    """Who this process is: its rank, the world size, the local rank, and a store to meet the others."""

    rank: int
    size: int
    local_rank: int
    store: Store


def _int_env(name: str) -> int:
    v = os.environ.get(name)
    if v is None:
        raise KeyError(name)
    try:
        return int(v)
    except ValueError:
        raise ValueError(f"environment: {name}={v!r} is not an integer") from None


def from_env(timeout: float = 60.0) -> Launch:
    """torchrun's environment: ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` (default 0), ``MASTER_ADDR``,
    ``MASTER_PORT``. Under torchrun's agent store, torch's own TCP store client is used; otherwise rank 0
    serves a `TCPStore` on ``MASTER_PORT``. Raises `KeyError` naming a missing variable."""
    rank, size = _int_env("RANK"), _int_env("WORLD_SIZE")
    local = int(os.environ.get("LOCAL_RANK", "0"))
    host, port = os.environ.get("MASTER_ADDR", "127.0.0.1"), _int_env("MASTER_PORT")
    if not 0 <= rank < size:
        raise ValueError(f"environment: RANK={rank} outside 0..WORLD_SIZE-1 ({size})")
    store: Store
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        from datetime import timedelta

        from torch.distributed import TCPStore as TorchStore  # type: ignore[import-not-found,unused-ignore]

        store = TorchStore(host, port, size, False, timedelta(seconds=timeout))
    else:
        store = TCPStore(host, port, is_master=rank == 0, timeout=timeout)
    return Launch(rank, size, local, store)


def from_mpi(timeout: float = 60.0) -> Launch:
    """mpiexec's world (mpi4py): rank 0 serves a `TCPStore` on a free port and tells the others where."""
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    server = TCPStore("", 0, is_master=True, timeout=timeout) if rank == 0 else None
    where = comm.bcast(None if server is None else (socket.gethostname(), server.port), root=0)
    store = server if server is not None else TCPStore(where[0], where[1], timeout=timeout)
    local = comm.Split_type(MPI.COMM_TYPE_SHARED).Get_rank()
    return Launch(rank, size, local, store)
