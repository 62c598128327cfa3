"""`UdpDevice`: the software MRC NIC that composes the device's parts (see the package's theory of operation):
the `Nic` with its QPs, MRs and CQs, the sockets (`sockets`), the receiving and sending sides (`receive`,
`send`), the fault injector (`injector`) and progress (`progress`), one lock over them all."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import random
import socket
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Final

from openmrc.ev import EVFormatMode, EVProfile
from openmrc.provider.bringup import connect_qp
from openmrc.provider.faults import Impairments
from openmrc.provider.profile_store import ProfileStore, StoreResolver
from openmrc.provider.udp.config import (
    DEFAULT_TIMEOUT,
    TRIM_DSCP,
    TRIM_LASTHOP_DSCP,
    DeviceStats,
    Endpoint,
    Peer,
    format_endpoint,
    parse_endpoint,
    software_config,
)
from openmrc.provider.udp.injector import FaultInjector
from openmrc.provider.udp.progress import Progress
from openmrc.provider.udp.receive import Receiver, RxTap
from openmrc.provider.udp.send import Sender
from openmrc.provider.udp.sockets import PortSockets
from openmrc.transport.config import NicConfig
from openmrc.transport.cq import CompletionQueue
from openmrc.transport.mr import MemoryRegion
from openmrc.transport.nic import Nic
from openmrc.transport.qp import Qp, QpInitAttr
from openmrc.transport.security import QpSecurity
from openmrc.transport.types import (
    Access,
    LocalProtocolError,
    QpState,
    RecvWR,
    SendWR,
    TrimMark,
    WorkCompletion,
)
from openmrc.wire import MRC_UDP_PORT

_STORE_POLL_NS: Final = 50_000_000  # how often a device using a profile store looks at it


INLINE_SEND_BYTES: Final = 64 << 10
"""A Write this small is put on the wire by the thread that posts it (`UdpDevice.post_send`)."""


class UdpDevice:
    """A software MRC NIC with one UDP socket per port. ``endpoints``: one per port (plane), as
    `parse_endpoint` reads them (``dport`` is the UDP port of those that name none).

    ``config``: the transport's knobs (``link_bps`` is one port's rate; the default EV profile draws its
    source ports from the dynamic range); ``seed``: the NIC's random choices (QPNs, keys, EVs; None:
    from the OS); ``pace``: send no faster than the port rate; ``gso``/``gro``: use UDP segmentation
    offload where packets allow; ``sockbuf``: socket buffer bytes asked for; ``srv6_addresses``: per port,
    the address uSID paths to it end at when that is not the port's own (a host-port uSID address, see
    `openmrc.fabric.linux`): the port receives there too."""

    def __init__(
        self,
        endpoints: Sequence[str | Endpoint],
        *,
        dport: int = MRC_UDP_PORT,
        config: NicConfig | None = None,
        seed: int | None = None,
        pace: bool = True,
        gso: bool = True,
        gro: bool = True,
        sockbuf: int = 16 << 20,
        srv6_addresses: Sequence[str | None] | None = None,
        trim_dscp: int = TRIM_DSCP,
        trim_lasthop_dscp: int = TRIM_LASTHOP_DSCP,
        clock: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        eps = [parse_endpoint(e, dport) for e in endpoints]
        if not 1 <= len(eps) <= 32:
            raise LocalProtocolError(errno.EINVAL, f"endpoints: {len(eps)} given, a device has 1..32 ports")
        if len(set(eps)) != len(eps):
            raise LocalProtocolError(errno.EINVAL, f"endpoints: the same endpoint twice in {eps}")
        for name, d in (("trim_dscp", trim_dscp), ("trim_lasthop_dscp", trim_lasthop_dscp)):
            if not 0 < d < 64:
                raise LocalProtocolError(errno.EINVAL, f"{name}: {d} is not a DSCP (1..63)")
        extra = list(srv6_addresses or ())
        if len(extra) > len(eps):
            raise LocalProtocolError(errno.EINVAL, f"srv6_addresses: {len(extra)} given for {len(eps)} ports")
        cfg = config or software_config()
        self.config = cfg
        self._clock = clock
        self._t0 = clock()
        self.rng = random.Random(seed)
        self.nic = Nic(len(eps), rng=self.rng, config=cfg)
        self.stats = DeviceStats()
        self._lock = threading.RLock()
        self._closed = False
        self._cqs: list[CompletionQueue] = []
        self._store: StoreResolver | None = None  # profiles shared through a node-local store
        self._store_at = 0  # when to look at the store again (ns, device clock)
        self._sockets = PortSockets(eps, srv6_addresses=extra, gro=gro, sockbuf=sockbuf)
        self._injector = FaultInjector(
            num_ports=len(eps),
            stats=self.stats,
            rng=random.Random(None if seed is None else seed ^ 0x5EED),
            trim_tos={TrimMark.TRIMMED: trim_dscp << 2, TrimMark.TRIMMED_LASTHOP: trim_lasthop_dscp << 2},
        )
        # Each datagram is handed to the NIC at the time the kernel stamped it on arrival (read against the
        # real-time clock), so that how late this process read it is not taken for network delay; only with
        # the default clock (a test's own clock has no relation to the kernel's).
        self._receiver = Receiver(
            nic=self.nic,
            stats=self.stats,
            sockets=self._sockets,
            trim_of={trim_dscp: TrimMark.TRIMMED, trim_lasthop_dscp: TrimMark.TRIMMED_LASTHOP},
            kernel_time=clock is time.monotonic_ns,
        )
        self._sender = Sender(
            nic=self.nic,
            stats=self.stats,
            sockets=self._sockets,
            injector=self._injector,
            config=cfg,
            pace=pace,
            gso=gso,
            clock=self.now,
        )
        try:
            self._progress = Progress(
                lock=self._lock,
                run_round=self._round,
                due_in=self._due_in,
                sockets=[p.sock for p in self._sockets.rx_ports],
                cqs=self._cqs,
            )
        except BaseException:
            self._sockets.close()
            raise

    # -- what the parts hold -------------------------------------------------------------------------------
    @property
    def pace(self) -> bool:
        """Whether sends are paced to the port rate."""
        return self._sender.pace

    @pace.setter
    def pace(self, on: bool) -> None:
        self._sender.pace = on

    @property
    def gso(self) -> bool:
        """Whether sends use UDP segmentation offload (turned off when the host refuses it)."""
        return self._sender.gso

    @gso.setter
    def gso(self, on: bool) -> None:
        self._sender.gso = on

    @property
    def sockbuf(self) -> int:
        """The socket buffer bytes asked for."""
        return self._sockets.sockbuf

    @property
    def faults(self) -> dict[int, Impairments]:
        """Per-port impairments the fault injector applies to what that port sends (see `impair`)."""
        return self._injector.faults

    @property
    def rx_tap(self) -> RxTap | None:
        """Called with (port, source address, flow label, TOS byte, datagram) for every datagram received,
        before the NIC sees it (tests and tools: what really arrived on the wire)."""
        return self._receiver.rx_tap

    @rx_tap.setter
    def rx_tap(self, tap: RxTap | None) -> None:
        self._receiver.rx_tap = tap

    # -- resources and QPs ---------------------------------------------------------------------------------
    @property
    def lock(self) -> threading.RLock:
        """Held while a progress round runs: hold it to read registered memory in a consistent state."""
        return self._lock

    @property
    def num_ports(self) -> int:
        return len(self._sockets.ports)

    def endpoints(self) -> list[Endpoint]:
        """This device's endpoint on every port, port 1 first (what a peer needs to reach it)."""
        return [(p.ip, p.udp_port) for p in self._sockets.ports]

    def now(self) -> int:
        """The device's clock: ns since it was opened (the time every NIC call is given)."""
        return self._clock() - self._t0

    def register(
        self, buffer: Any, access: Access = Access.LOCAL_WRITE | Access.REMOTE_WRITE
    ) -> MemoryRegion:
        with self._lock:
            self._check_open()
            return self.nic.register(buffer, access)

    def deregister(self, mr: MemoryRegion) -> None:
        with self._lock:
            self.nic.deregister(mr)

    def create_cq(self, depth: int = 65536) -> CompletionQueue:
        with self._lock:
            self._check_open()
            cq = self.nic.create_cq(depth)
            self._cqs.append(cq)
            return cq

    def destroy_cq(self, cq: CompletionQueue) -> None:
        """Forget ``cq`` (`LocalProtocolError` EBUSY while a QP of this device uses it)."""
        with self._lock:
            self.nic.destroy_cq(cq)
            if cq in self._cqs:
                self._cqs.remove(cq)

    def create_qp(self, init: QpInitAttr | None = None) -> Qp:
        """A QP in RESET (with a send and a receive CQ of its own unless ``init`` names them)."""
        with self._lock:
            self._check_open()
            return self.nic.create_qp(init or QpInitAttr(send_cq=self.create_cq(), recv_cq=self.create_cq()))

    def use_profile_store(self, path: str | os.PathLike[str]) -> None:
        """Take EV and CC profiles from the node-local store at ``path`` as well
        (`openmrc.provider.profile_store`): a QP may bind any profile the node's controller published there,
        and the device follows the store's changes (every 50 ms, and whenever a QP binds a profile)."""
        with self._lock:
            self._check_open()
            resolver = StoreResolver(ProfileStore(path), self.nic)
            resolver.refresh(self.now())  # a store that cannot be read fails here, with its reason
            self._store = resolver
            self.nic.profiles.resolver = resolver.resolve

    def add_ev_profile(self, profile_id: int, profile: EVProfile, ports: Sequence[int] | None = None) -> None:
        """Install an EV profile for QPs to bind at `connect` (``ports``: the port of each EV, as
        `Nic.add_ev_profile` takes them)."""
        with self._lock:
            self._check_open()
            self.nic.add_ev_profile(profile_id, profile, ports)

    def destroy_qp(self, qp: Qp) -> None:
        with self._lock:
            self.nic.destroy_qp(qp)
            self._sender.srv6_qps.discard(qp.qp_num)
            self._note_users()

    def add_peer(self, peer: Peer) -> None:
        """Know ``peer`` by its addresses (endpoint operations from them are answered to ``peer``)."""
        if len(peer.endpoints) < self.num_ports:
            raise LocalProtocolError(
                errno.EINVAL,
                f"peer {peer}: {len(peer.endpoints)} endpoints for a {self.num_ports}-port device",
            )
        for i, (ip, _udp) in enumerate(peer.endpoints[: self.num_ports], 1):
            local = self._sockets.ports[i - 1]
            if (":" in ip) != (local.family == socket.AF_INET6):
                raise LocalProtocolError(
                    errno.EAFNOSUPPORT,
                    f"peer {peer}: port {i} is {ip}, local port {i} is {format_endpoint((local.ip, 0))}",
                )
            self._receiver.peers_by_ip[ip] = peer

    def connect(
        self,
        qp: Qp,
        peer: Peer,
        dest_qp_num: int,
        *,
        rq_psn: int = 0,
        sq_psn: int = 0,
        ev_profile_id: int = 0,
        cc_profile_id: int = 0,
        mpr: int = 8,
        mpr_dest: int = 8,
        max_wimm: int = 16,
        max_wimm_dest: int = 16,
        timeout: int = DEFAULT_TIMEOUT,
        retry_linear: int = 7,
        retry_exp: int = 7,
        security: QpSecurity | None = None,
    ) -> None:
        """Take ``qp`` from RESET to RTS towards ``dest_qp_num`` on ``peer`` and make sure every EV of its
        profile can be carried: raises `LocalProtocolError` with the reason (an IPv4 port for STEV or
        SRv6 EVs, an SRH segment, a source port that cannot be bound) and leaves the QP in RESET.

        ``timeout``: the ACK timeout, 1.024 µs · 2^timeout (14: 16.8 ms; raised to the device's floor,
        `software_config`); ``retry_linear`` timeouts at that interval, then ``retry_exp`` doubling it
        (25: for ever), and the QP fails with RETRY_EXC_ERR: with the defaults 4.4 s after the peer's
        last answer (`openmrc.transport.Qp.time_to_error`). ``security``: authenticate the QP's packets in
        that security domain (the peer's QP must be connected with the same one)."""
        with self._lock:
            self._check_open()
            self.add_peer(peer)
            connect_qp(
                qp,
                peer,
                dest_qp_num,
                now=self.now(),
                rq_psn=rq_psn,
                sq_psn=sq_psn,
                ev_profile_id=ev_profile_id,
                cc_profile_id=cc_profile_id,
                mpr=mpr,
                mpr_dest=mpr_dest,
                max_wimm=max_wimm,
                max_wimm_dest=max_wimm_dest,
                timeout=timeout,
                retry_linear=retry_linear,
                retry_exp=retry_exp,
                on_init=self.prepare_qp,
                security=security,
            )

    def prepare_qp(self, qp: Qp) -> None:
        """Check that this device can carry every EV of the profile ``qp`` bound in INIT (raises
        `LocalProtocolError` with the reason: an IPv4 port for STEV or SRv6 EVs, an SRH segment, a source
        port that cannot be bound) and open what they need."""
        b = self.nic.ev_profile(qp.attr.ev_profile_id or 0)
        srv6 = b.mode is EVFormatMode.SRV6
        for i, (ev, port_no, echo) in enumerate(b.entries):
            port = self._sockets.ports[port_no - 1]
            ep = format_endpoint((port.ip, port.udp_port))
            where = f"EV profile {b.profile_id}, EV {i} (port {port_no}, {ep})"
            if port.family == socket.AF_INET and (srv6 or echo >> 16):
                raise LocalProtocolError(
                    errno.EAFNOSUPPORT,
                    f"{where}: {b.mode.name} EVs need IPv6 (the flow label or a uSID destination); "
                    "give the device IPv6 endpoints or use a UDP-mode EV profile",
                )
            if srv6 and any(ev[16:32]):
                raise LocalProtocolError(
                    errno.EOPNOTSUPP,
                    f"{where}: an SRH segment needs a raw socket; the UDP device sends uSID addresses only",
                )
            if self._sockets.tx_socket(port, echo & 0xFFFF, srv6) is None:
                raise LocalProtocolError(
                    errno.EADDRINUSE,
                    f"{where}: cannot bind UDP source port {echo & 0xFFFF} (in use, or below 1024 without "
                    "root); choose EVs in a free range",
                )
        if srv6:
            self._sender.srv6_qps.add(qp.qp_num)
        self._note_users()

    def _note_users(self, closing: bool = False) -> None:
        """Tell the profile store which QPs bind its profiles (best effort: an application that cannot
        write beside the store is not counted by the controller's EBUSY check)."""
        if self._store is not None:
            with contextlib.suppress(LocalProtocolError):
                self._store.publish_users(closing)

    def post_send(self, qp: Qp, wr: SendWR) -> None:
        """Queue ``wr`` on ``qp``. A small Write (a latency-bound message, at most `INLINE_SEND_BYTES`)
        leaves from the caller's thread at once, as a doorbell would start it; the progress thread (woken)
        sends the rest."""
        with self._lock:
            self._check_open()
            now = self.now()
            qp.post_send(wr, now=now)
            if self._progress.threaded and sum(s.length for s in wr.sg_list) <= INLINE_SEND_BYTES:
                self._sender.send(now)  # (one thread hand-off less on the way out)
        self._progress.kick()

    def post_recv(self, qp: Qp, wr: RecvWR) -> None:
        with self._lock:
            self._check_open()
            qp.post_recv(wr)

    def poll_cq(self, cq: CompletionQueue, n: int = 1) -> list[WorkCompletion]:
        """Up to ``n`` completions of ``cq``; without a progress thread, one progress round first."""
        if not self._progress.threaded and not self._closed:
            self.progress(0)
        with self._lock:
            return cq.poll(n)

    # -- fault injection -----------------------------------------------------------------------------------
    def impair(self, port: int | None = None, **settings: Any) -> Impairments:
        """Set the impairments of what ``port`` (None: every port) sends, as `Impairments` fields
        (``loss=0.01``, ``trim=0.05`` ...); returns the port's `Impairments` (the last one for all ports)."""
        return self._injector.impair(port, settings)

    def blackhole_port(self, port: int, seconds: float | None = None) -> None:
        """Everything ``port`` sends is lost from now for ``seconds`` (None: until `heal`)."""
        self._injector.blackhole_port(port, seconds, self.now())

    def blackhole_ev(self, entropy: int, seconds: float | None = None) -> None:
        """Packets sent along the EV with 32-bit value ``entropy`` are lost from now for ``seconds``."""
        self._injector.blackhole_ev(entropy, seconds, self.now())

    def heal(self) -> None:
        """Remove every impairment."""
        self._injector.heal()

    # -- progress ------------------------------------------------------------------------------------------
    @property
    def threaded(self) -> bool:
        """Whether a background progress thread drives this device (`start`)."""
        return self._progress.threaded

    def progress(self, timeout: float | None = 0.0) -> int:
        """One progress round: every datagram waiting is received, due timers run, what pacing allows is
        sent. If nothing happened and ``timeout`` is not 0, waits (up to ``timeout`` s; None: until
        something happens) for a datagram, a timer or a paced send, then runs another round. Returns the
        datagrams handled. Not to be called while a progress thread runs (`start`)."""
        if self._progress.threaded:
            raise LocalProtocolError(errno.EBUSY, "a progress thread drives this device (see stop())")
        with self._lock:
            self._check_open()
            n = self._round()
        if n or timeout == 0:
            return n
        self._progress.wait(timeout)
        with self._lock:
            return self._round()

    def run_until(self, done: Callable[[], bool], timeout: float) -> bool:
        """Progress until ``done()`` is true (checked between rounds) or ``timeout`` seconds pass; returns
        ``done()``."""
        end = time.monotonic() + timeout
        while not done():
            left = end - time.monotonic()
            if left <= 0:
                return done()
            self.progress(min(left, 0.05))
        return True

    def start(self) -> None:
        """Run progress in a background thread (daemon) until `stop` or `close`."""
        with self._lock:
            self._check_open()
            self._progress.start()

    def stop(self) -> None:
        """Stop the background progress thread (if any) and wait for it."""
        self._progress.stop()

    def _due_in(self) -> float | None:
        """Seconds until a timer, a held datagram or a paced send is due (None: nothing is)."""
        now = self.now()
        due = [t for t in (self.nic.get_timer(), self._injector.next_release()) if t is not None]
        if self._sender.pace and self.nic.has_data():
            due.append(self._sender.next_free())
        return max(0.0, (min(due) - now) / 1e9) if due else None

    def _round(self) -> int:
        nic = self.nic
        now = self.now()
        self.stats.rounds += 1
        n = self._receiver.drain(now)
        now = self._receiver.fed  # (the latest arrival's time, when one came while the drain ran)
        n += self._injector.release(now)
        if self._store is not None and now >= self._store_at:
            self._store_at = now + _STORE_POLL_NS
            with contextlib.suppress(LocalProtocolError):  # a store being rewritten: the next look
                self._store.refresh(now)
        timer = nic.get_timer()
        if timer is not None and timer <= now:
            nic.handle_timer(now)
        n += self._sender.send(now)
        self._progress.note_completions()
        return n

    # -- completions ---------------------------------------------------------------------------------------
    @property
    def completion_fd(self) -> int:
        """A file descriptor readable while some CQ of this device may hold completions (after
        `ack_completion_fd`, it turns readable again when a progress round finds completions)."""
        return self._progress.completion_fd

    def ack_completion_fd(self) -> None:
        self._progress.ack_completion_fd()

    async def wait_completions(self, cq: CompletionQueue, n: int = 1) -> list[WorkCompletion]:
        """Up to ``n`` completions of ``cq``, waiting on `completion_fd` in the running asyncio loop until
        there is one. Needs the progress thread (`start`)."""
        if not self._progress.threaded:
            raise LocalProtocolError(errno.EINVAL, "wait_completions needs the progress thread: call start()")
        loop = asyncio.get_running_loop()
        while True:
            with self._lock:
                self._check_open()
                wcs = cq.poll(n)
            if wcs:
                return wcs
            ready: asyncio.Future[None] = loop.create_future()
            loop.add_reader(self.completion_fd, _resolve, ready)
            try:
                self.ack_completion_fd()
                with self._lock:
                    pending = len(cq) > 0
                if not pending:  # else a completion arrived between the poll and the re-arm: poll again
                    await ready
            finally:
                loop.remove_reader(self.completion_fd)

    # -- shutdown ------------------------------------------------------------------------------------------
    def close(self) -> None:
        """Stop progress, move every QP to ERROR (outstanding work requests complete with
        ``WR_FLUSH_ERR`` on their CQs, still pollable) and close every socket and descriptor. Idempotent."""
        if self._closed:
            return
        self.stop()
        with self._lock:
            now = self.now()
            for qp in list(self.nic.qps.values()):
                if qp.state is not QpState.ERROR and qp.state is not QpState.RESET:
                    qp.modify(QpState.ERROR, now=now)
            self._closed = True
            self._progress.close()
            self._sockets.close()
            self._sender.clear()
            self._injector.clear()
            self._note_users(closing=True)

    @property
    def closed(self) -> bool:
        return self._closed

    def _check_open(self) -> None:
        if self._closed:
            raise LocalProtocolError(errno.EBADF, "the device is closed")

    def open_sockets(self) -> int:
        """How many sockets the device holds open (ports and sending sockets)."""
        return self._sockets.open_count()

    def __enter__(self) -> UdpDevice:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"{len(self.nic.qps)} QPs"
        return f"UdpDevice({', '.join(format_endpoint(e) for e in self.endpoints())}; {state})"


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)
