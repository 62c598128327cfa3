"""`Communicator`: collectives over MRC, shaped like mpi4py's buffer API and nccl4py.

    with Communicator.from_env() as comm:          # torchrun's environment (or from_mpi(), or a store)
        comm.all_reduce(grad)                      # in place, sum
        comm.all_reduce(x, out, op="max")          # out of place

Buffers are numpy arrays or any C-contiguous buffer-protocol object (its format gives the type); types and
operators: `openmrc.collectives.ops`. Each call builds the rank's `Program` (`openmrc.collectives.algorithms`;
``algo=`` picks one, otherwise the size does), connects to the peers it needs on first use (one QP per peer,
through the store), and runs it with an `Engine` until done. The device makes its own progress on a thread
(`UdpDevice.start`), so a rank that is busy elsewhere still acknowledges what its peers send; the calling
thread sleeps on the completion channel between completions.
"""

from __future__ import annotations

import contextlib
import ipaddress
import itertools
import json
import operator
import os
import random
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from openmrc import verbs
from openmrc.collectives import algorithms as algs
from openmrc.collectives.bootstrap import Store, from_env, from_mpi, store_get
from openmrc.collectives.engine import REG_CACHE_BYTES, CollectiveError, Engine, Link
from openmrc.collectives.ops import dtype_of, ufunc_of
from openmrc.collectives.program import Program, Schedule
from openmrc.transport import SecurityDomain

__all__ = ["LOOPBACK_MTU", "Communicator", "default_binds", "loopback_device", "rank_device"]

_names = itertools.count()
_KIB = 1024

# all_reduce: recursive doubling up to RD_MAX on 4, 8, 16 ... ranks, binomial tree up to TREE_MAX,
# halving-doubling up to RHD_MAX, ring above. Measured with local ranks of 2 planes (`openmrc collective run
# --algo`): the tree is the fastest up to 256 KiB and halving-doubling from there to a few MiB, but on 4
# ranks recursive doubling takes 15-20 % less than the tree from 8 B to 32 KiB (log2 p steps, not 2 log2 p,
# each a piece both ways that carries the slots the last one freed); on 2 ranks the tree is as fast, and
# where the world is no power of two doubling's fold costs more than it saves (3 ranks: 30 % slower).
RD_MAX = 32 * _KIB
TREE_MAX = 256 * _KIB
RHD_MAX = 2048 * _KIB
DIRECT_PIECES = 2  # direct_bytes="auto": messages of at least this many pieces (see Communicator)

LOOPBACK_MTU = 32 * _KIB
"""Payload bytes per packet between ranks of one machine: the loopback interface carries 64 KiB
datagrams, and a software NIC's cost is per packet (4 local ranks, 2 planes, 64 MiB all_reduce: busbw
0.32 GB/s with MRC's 4 KiB packets, 0.57 with 32 KiB). Over a real interface the device keeps MRC's
4096 (a fabric's path MTU)."""
_MAX_MTU = 60 * _KIB  # a UDP datagram is at most 65,507 bytes: the payload and MRC's headers


def default_binds(rank: int, planes: int, port: int = 4791) -> list[str]:
    """One loopback address per plane for ``rank`` (127.100+plane.x.y): ranks of one host never share."""
    if not 0 <= rank < 254 * 256:
        raise ValueError(f"rank {rank}: loopback addresses for ranks 0..{254 * 256 - 1}")
    hi, lo = divmod(rank, 254)
    return [f"127.{100 + p}.{hi}.{lo + 1}:{port}" for p in range(planes)]


def _is_loopback(endpoint: str) -> bool:
    from openmrc.provider.udp import parse_endpoint

    try:
        return ipaddress.ip_address(parse_endpoint(endpoint)[0]).is_loopback
    except ValueError:
        return False


def _check_mtu(mtu: int) -> None:
    if isinstance(mtu, bool) or not isinstance(mtu, int) or not 256 <= mtu <= _MAX_MTU or mtu % 4:
        raise ValueError(f"mtu: {mtu!r}, a multiple of 4 in 256 .. {_MAX_MTU} bytes")


def rank_device(
    rank: int,
    planes: int,
    binds: Sequence[str] | None = None,
    seed: int | None = None,
    mtu: int | None = None,
) -> Any:
    """The `UdpDevice` a rank makes for itself: on ``binds`` (one ``ip[:port]`` per plane), or on
    `default_binds` with ``planes`` planes (`loopback_device`). ``mtu``: payload bytes per packet, the same
    on every rank; default `LOOPBACK_MTU` when every endpoint is a loopback address, else MRC's 4096."""
    from openmrc.provider import UdpDevice
    from openmrc.provider.udp import software_config

    if not binds:
        return loopback_device(rank, planes, seed, LOOPBACK_MTU if mtu is None else mtu)
    if mtu is None:
        mtu = LOOPBACK_MTU if all(_is_loopback(b) for b in binds) else 4096
    _check_mtu(mtu)
    return UdpDevice(list(binds), seed=seed, config=software_config(mtu=mtu))


def loopback_device(rank: int, planes: int, seed: int | None, mtu: int = LOOPBACK_MTU) -> Any:
    """A `UdpDevice` on `default_binds`: port 4791, or (another job of this machine has it) a free one;
    ``mtu`` payload bytes per packet."""
    import errno

    from openmrc.provider import UdpDevice
    from openmrc.provider.udp import software_config
    from openmrc.transport import LocalProtocolError

    _check_mtu(mtu)
    rng = random.Random()
    port = 4791
    for _ in range(32):
        try:
            return UdpDevice(default_binds(rank, planes, port), seed=seed, config=software_config(mtu=mtu))
        except LocalProtocolError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise
            port = rng.randrange(20_000, 60_000)
    raise OSError(errno.EADDRINUSE, f"rank {rank}: no free UDP port for its loopback endpoints")


def _as_array(buf: Any, what: str, writable: bool = False) -> np.ndarray[Any, Any]:
    if isinstance(buf, np.ndarray):
        a = buf
    else:
        try:
            a = np.asarray(memoryview(buf))
        except TypeError:
            raise TypeError(
                f"{what}: expected a numpy array or a buffer-protocol object, got {type(buf).__name__}"
            ) from None
    if not a.flags.c_contiguous:
        raise ValueError(f"{what}: the buffer must be C-contiguous")
    if writable and not a.flags.writeable:
        raise ValueError(f"{what}: the buffer is read-only")
    dtype_of(a.dtype)  # a supported type, or a clear error
    return a.reshape(-1)


def _same(a: np.ndarray[Any, Any], b: np.ndarray[Any, Any]) -> bool:
    return bool(a.ctypes.data == b.ctypes.data and a.nbytes == b.nbytes)


DOMAIN_KEY_ENV = "OPENMRC_DOMAIN_KEY"
"""The environment variable `Communicator.from_env` / `from_mpi` read a security domain's key file from."""


def _domain_from_env(kwargs: dict[str, Any]) -> None:
    """``security`` from the key file ``$OPENMRC_DOMAIN_KEY`` names, unless the caller gave one."""
    path = os.environ.get(DOMAIN_KEY_ENV)
    if path and kwargs.get("security") is None:
        try:
            kwargs["security"] = SecurityDomain.load(path)
        except ValueError as exc:
            raise ValueError(f"${DOMAIN_KEY_ENV} {exc}") from None


def _secure_text(info: Any) -> str:
    if not isinstance(info, dict):
        return "unauthenticated"
    how = "encrypted" if info.get("encrypt") else "authenticated"
    return f"in security domain {info.get('sdi')} with key {info.get('fingerprint')} ({how})"


_MUST_AGREE: tuple[tuple[tuple[str, ...], Callable[..., str], str], ...] = (
    (
        ("mtu",),
        lambda mtu: f"sends packets of {mtu} B",
        "a QP's path MTU is one: give every rank the same mtu, or the same kind of binds",
    ),
    (
        ("secure",),
        lambda sec: f"is {_secure_text(sec)}",
        "every rank needs the same security domain key and encryption",
    ),
    (
        ("slots", "chunk"),
        lambda slots, chunk: f"has {slots} slots of {chunk} B",
        "give every rank the same chunk_bytes and slots",
    ),
    (
        ("direct",),
        lambda direct: f"has direct_bytes={direct}",
        "every rank needs the same: a message goes direct on both sides of a pair or on neither",
    ),
)
"""What the two ranks of a link must agree on (`Communicator._settings`): the keys, how a rank's values read,
and what to do about a difference."""


class Communicator:
    """Rank ``rank`` of ``size``, meeting the others through ``store``.

    ``device``: a verbs device object (`openmrc.provider.UdpDevice`, a simulated host from
    ``FabricSim.verbs_device``); without one, a `UdpDevice` on ``binds`` (one ``ip[:port]`` per plane;
    default `default_binds`, loopback) with ``planes`` planes and packets of ``mtu`` bytes (`rank_device`:
    `LOOPBACK_MTU` on loopback, else 4096; every rank's must be the same), owned and closed by the
    communicator.
    ``chunk_bytes``: the unit of pipelining, one Write with Immediate; ``slots``: receive slots per peer
    (the credits). 1 MiB × 4 slots (4 MiB of slots per peer it exchanges with): a 16-64 MiB all_reduce of
    4 local ranks moves 15-20 % more than with 256 KiB × 8 (each piece costs a completion, a schedule step
    and a ufunc call on top of its bytes), and a 4 MiB one as much.
    ``direct_bytes``: a message of at least this many bytes that its receiver only places (all_gather,
    alltoall(v), broadcast, send and recv, the gathering half of an all_reduce) is written straight into
    the receiving rank's buffer once that rank has advertised its region (`openmrc.collectives.engine`:
    direct messages), instead of into slots it would be copied out of; None: always through slots.
    "auto" (the default): messages of two pieces or more (``2 × chunk_bytes``): a direct message waits for
    its receiver's advert, a round trip the copy of one piece does not repay (on 4 local ranks, alternating
    runs: an all_gather of 16 MiB moves 0.64-0.69 GB/s direct against 0.56-0.60 through slots, of 4 MiB,
    whose blocks are one piece, no more; a ring all_reduce of 4 MiB somewhat less direct).
    ``ping_s``: how long a peer this rank waits for may be silent before its NIC is pinged; a dead rank
    is reported after that plus the QP's retry time (`openmrc.transport.Qp.time_to_error`, 4.4 s with
    the defaults here): within ``ping_s`` + 4.4 s. ``prefix``: store keys' prefix (several
    communicators on one store). ``ev_profile(peer_address)``: the EV profile id (installed on the device)
    for the QP towards the rank with that device address (`openmrc.collectives.fabric`: the fabric's
    paths); default 0, the device's UDP source ports (a simulated host: its fabric's routes).
    ``timeout``: seconds a collective may take before this rank gives up with a `CollectiveError` and
    tells the other ranks, which stop too (ranks that call different collectives, or one away from the
    library for longer); None (the default): as long as it takes (a dead rank is found all the same).
    ``blocking``: False for a rank an event loop drives (`SimWorld`): no completion channel.
    ``security``: **[openmrc]** authenticate every packet between the ranks in this security domain (a
    `openmrc.transport.SecurityDomain`, or its spec as a key file holds it; `docs/security.md`), and with
    ``encrypt`` encrypt the payloads too; every rank must give the same. `from_env` and `from_mpi` read
    the key file named by ``$OPENMRC_DOMAIN_KEY`` when no ``security`` is given."""

    def __init__(
        self,
        rank: int,
        size: int,
        store: Store,
        *,
        device: Any = None,
        binds: Sequence[str] | None = None,
        planes: int = 2,
        chunk_bytes: int = 1024 * _KIB,
        slots: int = 4,
        direct_bytes: int | str | None = "auto",
        ping_s: float = 1.0,
        prefix: str = "openmrc",
        seed: int | None = None,
        ev_profile: Callable[[Any], int] | None = None,
        blocking: bool = True,
        mtu: int | None = None,
        security: SecurityDomain | str | None = None,
        encrypt: bool = False,
        timeout: float | None = None,
    ) -> None:
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"size: {size!r}, expected an integer >= 1")
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < size:
            raise ValueError(f"rank: {rank!r} outside 0..{size - 1}")
        if not 4 * _KIB <= chunk_bytes <= 64 * _KIB * _KIB or chunk_bytes % 16:
            raise ValueError(f"chunk_bytes: {chunk_bytes!r}, a multiple of 16 in 4 KiB .. 64 MiB")
        if not 2 <= slots <= 1024:
            raise ValueError(f"slots: {slots!r} outside 2..1024")
        if direct_bytes == "auto":
            direct_bytes = DIRECT_PIECES * chunk_bytes
        if direct_bytes is not None and (
            isinstance(direct_bytes, bool) or not isinstance(direct_bytes, int) or direct_bytes < 1
        ):
            raise ValueError(f'direct_bytes: {direct_bytes!r}, a byte count >= 1, "auto" or None')
        if not 0.01 <= ping_s <= 3600:
            raise ValueError(f"ping_s: {ping_s!r} outside 0.01..3600 s")
        if timeout is not None and (
            isinstance(timeout, bool) or not isinstance(timeout, int | float) or not 0.01 <= timeout <= 1e6
        ):
            raise ValueError(f"timeout: {timeout!r} outside 0.01..1e6 s (or None: no limit)")
        self.timeout: float | None = None if timeout is None else float(timeout)
        if mtu is not None and device is not None:
            raise ValueError("mtu: for the device the communicator makes (a given device has its own)")
        if isinstance(security, str):
            security = SecurityDomain.from_spec(security)
        if security is not None and not isinstance(security, SecurityDomain):
            raise ValueError(f"security: {security!r}, expected a SecurityDomain or its spec")
        if encrypt and security is None:
            raise ValueError("encrypt: needs a security domain (security=)")
        self.security: SecurityDomain | None = security
        self.encrypt = bool(encrypt)
        self.rank, self.size = rank, size
        self._ev_profile = ev_profile
        self.store = store
        self.prefix = prefix
        self._owned = device is None
        if device is None:
            device = rank_device(rank, planes, binds, seed, mtu)
            device.start()
        elif hasattr(device, "start") and not device.threaded:
            device.start()
        self.device = device
        nic = getattr(device, "nic", None)
        self.mtu: int = nic.config.mtu if nic is not None else 4096
        """Payload bytes per packet of this rank's device (every rank's is the same)."""
        self._dev_name = f"openmrc-coll-{os.getpid()}-{rank}-{next(_names)}"
        verbs.add_device(self._dev_name, device)
        self.engine = Engine(
            rank, self._dev_name, chunk_bytes=chunk_bytes, slots=slots, ping_s=ping_s, channel=blocking
        )
        self.chunk_bytes = chunk_bytes
        self.direct_bytes: int | None = direct_bytes
        self._lock = threading.Lock()
        self._scratches: dict[tuple[int, np.dtype[Any]], np.ndarray[Any, Any]] = {}
        self._programs: dict[Any, Program] = {}
        self._closed = False
        self.captured: list[tuple[Program, list[np.ndarray[Any, Any]], str | None]] | None = None
        """When a list: each call is planned and appended here instead of run (`SimWorld` runs them)."""
        self.close_timeout = 10.0  # how long close() answers peers that have not said goodbye
        self._owned_store = False  # a store from from_env / from_mpi is closed with the communicator
        self.store.set(f"{prefix}/dev/{rank}", json.dumps(self._address()))

    @classmethod
    def from_env(cls, **kwargs: Any) -> Communicator:
        """A communicator from torchrun's environment (`openmrc.collectives.bootstrap.from_env`)."""
        _domain_from_env(kwargs)
        launch = from_env()
        comm = cls(launch.rank, launch.size, launch.store, **kwargs)
        comm._owned_store = True
        return comm

    @classmethod
    def from_mpi(cls, **kwargs: Any) -> Communicator:
        """A communicator for mpiexec's world (mpi4py)."""
        _domain_from_env(kwargs)
        launch = from_mpi()
        comm = cls(launch.rank, launch.size, launch.store, **kwargs)
        comm._owned_store = True
        return comm

    def __repr__(self) -> str:
        return f"Communicator(rank {self.rank} of {self.size}, {self.device!r})"

    def __enter__(self) -> Communicator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- connections ---------------------------------------------------------------------------------------
    def _address(self) -> Any:
        dev = self.device
        if hasattr(dev, "endpoints"):
            return [f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}" for ip, port in dev.endpoints()]
        return int(dev.host_id)

    def _connect(self, peers: set[int]) -> None:
        self._join(self._open(peers))

    def _open(self, peers: set[int]) -> list[Link]:
        """Links (QPs in INIT, receives posted) towards ``peers`` not linked yet, published in the store."""
        eng = self.engine
        new = sorted(p for p in peers if p not in eng.links and p != self.rank)
        made: list[Link] = []
        for p in new:
            if not 0 <= p < self.size:
                raise ValueError(f"peer {p}: outside 0..{self.size - 1}")
            link = eng.new_link(p)
            self._init_qp(link, self._peer_address(p))
            eng.post_receives(link)
            info: dict[str, Any] = {**eng.link_info(link), **self._settings()}
            self.store.set(f"{self.prefix}/qp/{self.rank}/{p}", json.dumps(info))
            made.append(link)
        return made

    def _join(self, made: list[Link]) -> None:
        """Each new link to RTS once its peer has published its side (waits in the store)."""
        for link in made:
            try:
                info = json.loads(store_get(self.store, f"{self.prefix}/qp/{link.peer}/{self.rank}"))
                addr = self._peer_address(link.peer)
            except (TimeoutError, OSError) as exc:
                raise CollectiveError(
                    f"rank {self.rank}: rank {link.peer} never connected ({exc})", link.peer
                ) from None
            mine = self._settings()
            for keys, say, fix in _MUST_AGREE:
                theirs, ours = [info.get(k) for k in keys], [mine[k] for k in keys]
                if theirs != ours:
                    raise CollectiveError(
                        f"rank {self.rank}: rank {link.peer} {say(*theirs)}, this rank {say(*ours)} ({fix})",
                        link.peer,
                    )
            link.remote_addr, link.remote_rkey = info["addr"], info["rkey"]
            link.remote_mailbox = info["mailbox"]
            self._rts(link, addr, info["qpn"])

    def _peer_address(self, peer: int) -> Any:
        try:
            return json.loads(store_get(self.store, f"{self.prefix}/dev/{peer}"))
        except (TimeoutError, OSError) as exc:
            raise CollectiveError(f"rank {self.rank}: rank {peer} never came ({exc})", peer) from None

    def _settings(self) -> dict[str, Any]:
        """What this rank publishes with each link for its peer to compare (`_MUST_AGREE`)."""
        eng = self.engine
        return {
            "mtu": self.mtu,
            "secure": self._secure_info(),
            "slots": eng.nslots,
            "chunk": eng.chunk_bytes,
            "direct": self.direct_bytes,
        }

    def _secure_info(self) -> dict[str, Any] | None:
        """What the ranks compare of their security settings (never the key: its fingerprint)."""
        dom = self.security
        if dom is None:
            return None
        return {"sdi": dom.sdi, "fingerprint": dom.fingerprint(), "encrypt": self.encrypt}

    def _init_qp(self, link: Link, addr: Any) -> None:
        M = verbs.MrcQpAttrMask
        if self._ev_profile is not None:
            ev = self._ev_profile(addr)
        elif hasattr(self.device, "ev_profile_for"):  # a simulated host: its fabric's routes
            ev = self.device.ev_profile_for(link.peer)
        else:
            ev = 0
        sec = None if self.security is None else verbs.QpSecurity(self.security, encrypt=self.encrypt)
        verbs.modify_qp(
            link.qp,
            verbs.QpAttr(qp_state=verbs.QpState.INIT),
            verbs.QpAttrMask.STATE,
            verbs.MrcQpAttr(ev_profile_id=ev, cc_profile_id=0, security=sec),
            M.EV_PROFILE_ID | M.CC_PROFILE_ID | M.HINT | (M.SECURITY if sec is not None else 0),
        )

    def _rts(self, link: Link, addr: Any, qpn: int) -> None:
        from openmrc.provider import Peer

        Q, M = verbs.QpAttrMask, verbs.MrcQpAttrMask
        ah = Peer.of(addr) if isinstance(addr, list) else addr
        verbs.modify_qp(
            link.qp,
            verbs.QpAttr(qp_state=verbs.QpState.RTR, ah_attr=ah, dest_qp_num=qpn, rq_psn=0),
            Q.STATE | Q.AV | Q.DEST_QPN | Q.RQ_PSN,
            verbs.MrcQpAttr(
                mpr=8, mpr_dest=8, max_wimm=128, max_wimm_dest=128, cap=verbs.QpCapFlags.DYNAMIC_MPR
            ),
            M.MPR | M.MPR_DEST | M.MAX_WIMM | M.MAX_WIMM_DEST | M.CAP,
        )
        verbs.modify_qp(
            link.qp,
            verbs.QpAttr(qp_state=verbs.QpState.RTS, sq_psn=0),
            Q.STATE | Q.SQ_PSN,
            verbs.MrcQpAttr(mpr=8, max_wimm=128, timeout=14, linear_cnt=7, exp_cnt=7),
            M.MPR | M.MAX_WIMM | M.TIMEOUT | M.RETRY_CNT,
        )

    # -- running a program ---------------------------------------------------------------------------------
    def _run(self, prog: Program, bufs: list[np.ndarray[Any, Any]], op: str | None = None) -> None:
        if self._closed:
            raise CollectiveError("the communicator is closed")
        dtype = bufs[1].dtype
        bufs = bufs + [self._scratch(n, dtype) for n in prog.sizes[len(bufs) :]]  # the scratch it asks for
        if self.captured is not None:  # a driver that runs many ranks at once (SimWorld) runs it
            self.captured.append((prog, bufs, op))
            return
        eng = self.engine
        if eng.failed is not None:
            raise CollectiveError(f"the communicator failed earlier: {eng.failed}", eng.failed.rank)
        with self._lock:
            self._connect(prog.peers)
            sched = Schedule(prog, bufs, ufunc_of(op) if op else None, self.size if op == "avg" else 1)
            try:
                eng.begin(sched, bufs)  # (it may find a disagreeing piece that waited: told as any other)
                limit = self.timeout
                eng.settle(lambda: sched.done, None if limit is None else eng.clock() + limit)
                if not sched.done:
                    assert limit is not None
                    eng.give_up("the collective", limit)
            except CollectiveError:
                eng.flush_aborts(1.0)  # the other ranks learn who failed before this one's QPs go
                raise
            finally:
                eng.end()

    def _scratch(self, n: int, dtype: np.dtype[Any]) -> np.ndarray[Any, Any]:
        """Scratch of ``n`` elements, the same array for the same size and type from one collective to
        the next (a collective's scratch is written before it is read; one runs at a time): registered
        once (the engine's registration cache), not per call."""
        if n * dtype.itemsize > REG_CACHE_BYTES:
            return np.empty(n, dtype)  # (registering weighs little beside moving it)
        key = (n, dtype)
        a = self._scratches.get(key)
        if a is None:
            if len(self._scratches) >= 8:
                self._scratches.pop(next(iter(self._scratches)))
            a = self._scratches[key] = np.empty(n, dtype)
        return a

    def _plan(self, build: Callable[..., Program], *args: Any, **kwargs: Any) -> Program:
        """``build(*args, **kwargs)``: the same `Program` for the same call (a program is only read once it
        is built, and one collective runs at a time: a loop of one collective plans it once)."""
        key = (build, args, tuple(sorted(kwargs.items())))
        try:
            prog = self._programs.get(key)
        except TypeError:  # (an argument that cannot be a key: planned each time)
            return build(*args, **kwargs)
        if prog is None:
            prog = build(*args, **kwargs)
            if len(self._programs) >= 32:
                self._programs.pop(next(iter(self._programs)))
            self._programs[key] = prog
        return prog

    def _chunk(self, dtype: np.dtype[Any]) -> int:
        return self.chunk_bytes // dtype.itemsize

    def _direct_min(self, dtype: np.dtype[Any], p2p: bool = False) -> int | None:
        """`direct_bytes` in elements (a message of at least that many goes direct). ``p2p``: for send and
        recv, not below what the peer's slots hold, so that a send the receiver has not reached yet still
        completes into them as it did (two ranks that both send before they receive go on working)."""
        if self.direct_bytes is None:
            return None
        least = (
            max(self.direct_bytes, self.chunk_bytes * self.engine.nslots + 1) if p2p else self.direct_bytes
        )
        return -(-least // dtype.itemsize)

    def _pick(self, collective: str, algo: str | None, nbytes: int) -> str:
        choices = algs.ALGORITHMS[collective]
        if algo is not None:
            if algo not in choices:
                raise ValueError(f"algo {algo!r}: {collective} has {', '.join(choices)}")
            return algo
        if collective == "all_reduce":
            n = self.size
            if nbytes <= RD_MAX and n >= 4 and n & (n - 1) == 0:
                return "rd"
            return "tree" if nbytes <= TREE_MAX else "rhd" if nbytes <= RHD_MAX else "ring"
        if collective in ("broadcast", "reduce"):
            return "tree" if nbytes <= RHD_MAX else "chain"
        return choices[0]

    def _pair(
        self, sendbuf: Any, recvbuf: Any, send_n: int | None = None, recv_n: int | None = None
    ) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
        s = _as_array(sendbuf, "sendbuf")
        r = s if recvbuf is None else _as_array(recvbuf, "recvbuf", writable=True)
        if recvbuf is None and not s.flags.writeable:
            raise ValueError("sendbuf: read-only, and no recvbuf for the result")
        if s.dtype != r.dtype:
            raise ValueError(f"sendbuf is {s.dtype}, recvbuf {r.dtype}: the same type is needed")
        return s, r

    # -- collectives ---------------------------------------------------------------------------------------
    def all_reduce(
        self, sendbuf: Any, recvbuf: Any = None, op: str = "sum", *, algo: str | None = None
    ) -> Any:
        """Reduce ``sendbuf`` of every rank element-wise into ``recvbuf`` (in place without it)."""
        s, r = self._pair(sendbuf, recvbuf)
        if s.size != r.size:
            raise ValueError(f"all_reduce: sendbuf has {s.size} elements, recvbuf {r.size}")
        ufunc_of(op)
        inplace = _same(s, r)
        if not inplace and np.shares_memory(s, r):
            raise ValueError("all_reduce: sendbuf and recvbuf overlap without being the same")
        a = self._pick("all_reduce", algo, r.nbytes)
        prog = self._plan(
            algs.all_reduce,
            self.rank,
            self.size,
            r.size,
            self._chunk(r.dtype),
            algo=a,
            inplace=inplace,
            avg=op.lower() == "avg",
            direct_min=self._direct_min(r.dtype),
        )
        self._run(prog, [s, r], op.lower())
        return recvbuf if recvbuf is not None else sendbuf

    def reduce_scatter(self, sendbuf: Any, recvbuf: Any, op: str = "sum", *, algo: str | None = None) -> Any:
        """Reduce ``sendbuf`` (size × n elements) over every rank; rank r gets segment r in ``recvbuf``."""
        s, r = self._pair(sendbuf, recvbuf)
        if s.size != self.size * r.size:
            raise ValueError(f"reduce_scatter: sendbuf needs {self.size} × {r.size} elements, has {s.size}")
        own = s.ctypes.data + self.rank * r.nbytes == r.ctypes.data  # in place: this rank's segment
        if np.shares_memory(s, r) and not own:
            raise ValueError("reduce_scatter: recvbuf overlaps sendbuf but is not this rank's segment of it")
        ufunc_of(op)
        self._pick("reduce_scatter", algo, r.nbytes)
        prog = self._plan(
            algs.reduce_scatter, self.rank, self.size, r.size, self._chunk(r.dtype), avg=op.lower() == "avg"
        )
        self._run(prog, [s, r], op.lower())
        return recvbuf

    def all_gather(self, sendbuf: Any, recvbuf: Any, *, algo: str | None = None) -> Any:
        """Gather every rank's ``sendbuf`` (n elements) into ``recvbuf`` (size × n, rank order). In place:
        ``sendbuf`` is segment ``rank`` of ``recvbuf``."""
        s, r = self._pair(sendbuf, recvbuf)
        if r.size != self.size * s.size:
            raise ValueError(f"all_gather: recvbuf needs {self.size} × {s.size} elements, has {r.size}")
        n = s.size
        inplace = bool(
            s.ctypes.data == r.ctypes.data + self.rank * n * r.itemsize and n and np.shares_memory(s, r)
        )
        if not inplace and np.shares_memory(s, r):
            raise ValueError("all_gather: sendbuf overlaps recvbuf but is not this rank's segment of it")
        self._pick("all_gather", algo, r.nbytes)
        prog = self._plan(
            algs.all_gather,
            self.rank,
            self.size,
            n,
            self._chunk(r.dtype),
            inplace=inplace,
            direct_min=self._direct_min(r.dtype),
        )
        self._run(prog, [s, r])
        return recvbuf

    def alltoall(self, sendbuf: Any, recvbuf: Any) -> Any:
        """Block j (size/``size`` elements) of ``sendbuf`` to rank j, which puts it at block ``rank``."""
        s, r = self._pair(sendbuf, recvbuf)
        if s.size != r.size or s.size % self.size:
            raise ValueError(
                f"alltoall: sendbuf ({s.size}) and recvbuf ({r.size}): equal, a multiple of {self.size}"
            )
        k = s.size // self.size
        counts = [k] * self.size
        displs = [k * j for j in range(self.size)]
        return self._alltoallv(s, r, counts, displs, counts, displs, recvbuf)

    def alltoallv(
        self,
        sendbuf: Any,
        send_counts: Sequence[int],
        recvbuf: Any,
        recv_counts: Sequence[int],
        send_displs: Sequence[int] | None = None,
        recv_displs: Sequence[int] | None = None,
    ) -> Any:
        """``send_counts[j]`` elements at ``send_displs[j]`` to rank j; ``recv_counts[j]`` from rank j at
        ``recv_displs[j]`` (displacements default to packed blocks)."""
        s, r = self._pair(sendbuf, recvbuf)
        sc, rc = self._counts("send_counts", send_counts), self._counts("recv_counts", recv_counts)
        sd = self._displs("send_displs", send_displs, sc, s.size)
        rd = self._displs("recv_displs", recv_displs, rc, r.size)
        return self._alltoallv(s, r, sc, sd, rc, rd, recvbuf)

    def _counts(self, what: str, c: Sequence[int]) -> list[int]:
        out = [int(x) for x in c]
        if len(out) != self.size or min(out) < 0:
            raise ValueError(f"{what}: {self.size} counts >= 0 needed")
        return out

    def _displs(self, what: str, d: Sequence[int] | None, counts: list[int], total: int) -> list[int]:
        if d is None:  # (packed blocks: only the counts can be wrong)
            if sum(counts) > total:
                which = what.replace("displs", "counts")
                raise ValueError(f"{which}: {sum(counts)} elements in all, the buffer holds {total}")
            return list(itertools.accumulate([0, *counts[:-1]]))
        out = [int(x) for x in d]
        if len(out) != self.size or any(o < 0 or o + c > total for o, c in zip(out, counts, strict=True)):
            raise ValueError(f"{what}: {self.size} offsets whose blocks fit in the {total}-element buffer")
        return out

    def _alltoallv(
        self,
        s: np.ndarray[Any, Any],
        r: np.ndarray[Any, Any],
        sc: list[int],
        sd: list[int],
        rc: list[int],
        rd: list[int],
        recvbuf: Any,
    ) -> Any:
        if np.shares_memory(s, r):
            raise ValueError("alltoall: sendbuf and recvbuf overlap")
        prog = self._plan(
            algs.alltoallv,
            self.rank,
            self.size,
            sc,
            sd,
            rc,
            rd,
            s.size,
            r.size,
            self._chunk(r.dtype),
            direct_min=self._direct_min(r.dtype),
        )
        self._run(prog, [s, r])
        return recvbuf

    def broadcast(self, buf: Any, root: int = 0, *, algo: str | None = None) -> Any:
        """``buf`` of ``root`` into ``buf`` of every rank."""
        b = _as_array(buf, "buf", writable=True)
        root = self._root(root)
        a = self._pick("broadcast", algo, b.nbytes)
        prog = self._plan(
            algs.broadcast,
            self.rank,
            self.size,
            b.size,
            self._chunk(b.dtype),
            root=root,
            algo=a,
            direct_min=self._direct_min(b.dtype),
        )
        self._run(prog, [b, b])
        return buf

    def reduce(
        self, sendbuf: Any, recvbuf: Any = None, op: str = "sum", root: int = 0, *, algo: str | None = None
    ) -> Any:
        """Reduce ``sendbuf`` of every rank into ``recvbuf`` of ``root`` (in place without it; other ranks
        may pass None)."""
        root = self._root(root)
        s = _as_array(sendbuf, "sendbuf")
        if self.rank == root:
            s, r = self._pair(sendbuf, recvbuf)
            if s.size != r.size:
                raise ValueError(f"reduce: sendbuf has {s.size} elements, recvbuf {r.size}")
        else:
            r = np.empty(s.size, s.dtype)
        ufunc_of(op)
        inplace = _same(s, r)
        a = self._pick("reduce", algo, s.nbytes)
        prog = self._plan(
            algs.reduce,
            self.rank,
            self.size,
            s.size,
            self._chunk(s.dtype),
            root=root,
            algo=a,
            inplace=inplace,
            avg=op.lower() == "avg",
        )
        self._run(prog, [s, r], op.lower())
        return (recvbuf if recvbuf is not None else sendbuf) if self.rank == root else None

    def barrier(self) -> None:
        """Return once every rank has entered the barrier."""
        e = np.empty(0, np.uint8)
        self._run(self._plan(algs.barrier, self.rank, self.size), [e, e])

    def send(self, buf: Any, peer: int) -> None:
        """``buf`` to rank ``peer``, which calls `recv` with as many elements."""
        b = _as_array(buf, "buf")
        peer = self._peer(peer)
        d = self._direct_min(b.dtype, p2p=True)
        self._run(self._plan(algs.send, peer, b.size, self._chunk(b.dtype), direct_min=d), [b, b])

    def recv(self, buf: Any, peer: int) -> Any:
        """Fill ``buf`` with what rank ``peer`` sends."""
        b = _as_array(buf, "buf", writable=True)
        peer = self._peer(peer)
        d = self._direct_min(b.dtype, p2p=True)
        self._run(self._plan(algs.recv, peer, b.size, self._chunk(b.dtype), direct_min=d), [b, b])
        return buf

    def sendrecv(self, sendbuf: Any, dest: int, recvbuf: Any, source: int) -> Any:
        """``sendbuf`` to rank ``dest`` while ``recvbuf`` fills from rank ``source`` (both at once)."""
        s, r = self._pair(sendbuf, recvbuf)
        dest, source = self._peer(dest, "dest"), self._peer(source, "source")
        if np.shares_memory(s, r):
            raise ValueError("sendrecv: sendbuf and recvbuf overlap")
        prog = self._plan(
            algs.sendrecv,
            dest,
            s.size,
            source,
            r.size,
            self._chunk(r.dtype),
            direct_min=self._direct_min(r.dtype, p2p=True),
        )
        self._run(prog, [s, r])
        return recvbuf

    def _root(self, root: int, what: str = "root") -> int:
        """``root`` (any integer, numpy's too) as an int, checked against the ranks; ``what`` names it."""
        try:
            r = operator.index(root) if not isinstance(root, bool) else None
        except TypeError:
            r = None
        if r is None or not 0 <= r < self.size:
            raise ValueError(f"{what}: {root!r} outside 0..{self.size - 1}")
        return r

    def _peer(self, peer: int, what: str = "peer") -> int:
        p = self._root(peer, what)
        if p == self.rank:
            raise ValueError(f"{what} {p}: this rank itself")
        return p

    # -- end -------------------------------------------------------------------------------------------------
    def abort(self, reason: str = "aborted") -> None:
        """Stop this rank's part in the job now: every peer it has a QP with gets an abort naming this rank
        (their collectives raise `CollectiveError` at once instead of waiting for it), then `close`."""
        eng = self.engine
        if not self._closed and eng.failed is None:
            with contextlib.suppress(CollectiveError):
                eng._fail(CollectiveError(f"rank {self.rank}: {reason}", self.rank))
            eng.flush_aborts(1.0)
        self.close()

    def close(self) -> None:
        """Release the QPs and slots (and the device, if the communicator made it). Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self.close_timeout > 0:
            self.engine.goodbye(self.close_timeout)
        self.engine.close()
        with contextlib.suppress(verbs.VerbsError):
            verbs.close_device(self.engine.device)
        verbs.remove_device(self._dev_name)
        if self._owned:
            self.device.close()
        close = getattr(self.store, "close", None)
        if callable(close) and self._owned_store:
            close()
