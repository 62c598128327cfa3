"""A simulated host as a device for `openmrc.verbs`: the same program that drives a software NIC over UDP
drives a host of a `FabricSim`, selected by the device name it opens.

`SimHostDevice` wraps one host of a built fabric (`FabricSim.verbs_device(h)`) through that host's public API
(`openmrc.sim.hosts.MrcHost`). Its clock is the simulator's; its progress runs the simulator: ``progress(0)``
runs the events of the next instant that has any (so a loop of ``poll_cq`` walks simulated time forward event
by event), ``progress(t)`` runs ``t`` seconds of simulated time. Every host of the fabric moves on together
(there is one event queue), so several programs in one process can drive several hosts, as the collectives do.
A QP's ``ah_attr`` (its peer) is the peer's host number; EV profile 0 (UDP source ports) suits an ECMP fabric,
and `ev_profile_for` installs the SRv6 source-route profile towards a peer, as a controller would.
"""

from __future__ import annotations

import errno
import threading
from typing import TYPE_CHECKING, Any

from openmrc.transport import (
    Access,
    CompletionQueue,
    LocalProtocolError,
    MemoryRegion,
    Nic,
    Qp,
    QpInitAttr,
    RecvWR,
    SendWR,
)

if TYPE_CHECKING:
    from openmrc.sim.hosts import MrcHost

__all__ = ["SimHostDevice"]


class SimHostDevice:
    """``host`` of a fabric of ``hosts`` hosts as a verbs device (see the module's docstring)."""

    def __init__(self, host: MrcHost, hosts: int) -> None:
        self._host = host
        self._hosts = hosts
        self._lock = threading.RLock()
        self._cqs: list[CompletionQueue] = []
        self._closed = False
        self.driven = False
        """Set by a driver of many hosts (`openmrc.collectives.SimWorld`) that runs the simulator itself:
        polling a CQ then does not run it."""

    def __repr__(self) -> str:
        return f"SimHostDevice(host {self._host.id})"

    @property
    def host_id(self) -> int:
        return self._host.id

    @property
    def nic(self) -> Nic:
        return self._host.nic

    @property
    def lock(self) -> threading.RLock:
        return self._lock

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def threaded(self) -> bool:
        """Whether something else runs the simulator (`driven`): the verbs calls then never do."""
        return self.driven

    def close(self) -> None:
        self._closed = True

    def now(self) -> int:
        return self._host.now()

    def pump(self) -> None:
        """Let this host's NIC send what the program's calls made ready (a driver of many hosts calls it
        after posting on one; `progress` does it for its own host)."""
        self._host.pump()

    def progress(self, timeout: float | None = 0.0) -> int:
        """Run the simulator: to the next instant with events (``timeout`` 0 or None), or ``timeout``
        seconds of simulated time on; returns the events run."""
        sim = self._host.engine
        self._host.pump()  # what the program's calls made ready since the last round
        nxt = sim.peek()
        if nxt is None:
            return 0
        until = nxt if not timeout else max(nxt, sim.now + int(timeout * 1e9))
        return sim.run(until=until)

    # -- resources -------------------------------------------------------------------------------------------
    def register(
        self, buffer: Any, access: Access = Access.LOCAL_WRITE | Access.REMOTE_WRITE
    ) -> MemoryRegion:
        return self._host.register(buffer, access)

    def deregister(self, mr: MemoryRegion) -> None:
        self.nic.deregister(mr)

    def create_cq(self, depth: int = 65536) -> CompletionQueue:
        cq = self._host.create_cq(depth)
        self._cqs.append(cq)
        return cq

    def destroy_cq(self, cq: CompletionQueue) -> None:
        self.nic.destroy_cq(cq)
        if cq in self._cqs:
            self._cqs.remove(cq)

    def create_qp(self, init: QpInitAttr | None = None) -> Qp:
        return self._host.create_qp(init or QpInitAttr(send_cq=self.create_cq(), recv_cq=self.create_cq()))

    def destroy_qp(self, qp: Qp) -> None:
        self.nic.destroy_qp(qp)

    def prepare_qp(self, qp: Qp) -> None:
        """Every EV of a simulated fabric can be carried: nothing to check."""

    def add_peer(self, peer: Any) -> None:
        n = self._hosts
        own = self._host.id
        if isinstance(peer, bool) or not isinstance(peer, int) or not 0 <= peer < n or peer == own:
            raise LocalProtocolError(
                errno.EINVAL, f"peer {peer!r}: another host of this fabric, a number in 0..{n - 1}"
            )

    def ev_profile_for(self, peer: int) -> int:
        """The EV profile id for QPs towards host ``peer`` (installed on first use: SRv6 source routes over
        every plane; 0, the NIC's UDP source-port profile, on an ECMP fabric)."""
        self.add_peer(peer)
        return self._host.ev_profile_for(peer)

    # -- work ------------------------------------------------------------------------------------------------
    def post_send(self, qp: Qp, wr: SendWR) -> None:
        self._host.post_send(qp, wr)

    def post_recv(self, qp: Qp, wr: RecvWR) -> None:
        self._host.post_recv(qp, wr)
