"""What a simulation carries: flows (one message between two hosts) and the triggers that start them.

A `Flow` is htsim's connection: a message of ``size`` bytes from one host to another, started at a time or
when a `Trigger` fires (htsim's oneshot, barrier and multishot triggers); its finish times and status are
filled in by `openmrc.sim.fabric_sim.FabricSim` as completions arrive.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from openmrc.transport import Qp, WcStatus

__all__ = ["Flow", "Trigger"]


class Trigger:
    """Starts flows once ``count`` events (flows finishing) have arrived: htsim's oneshot trigger is a
    count of 1, its barrier a count of n. A ``multishot`` trigger starts its next waiting flow at each
    arrival instead (htsim's multishot). A ``make`` callback is called once when the trigger fires, before
    its flows start: it may add the flows (``trigger=`` this trigger) then, so that a long job's flows exist
    only from the moment they start (`openmrc.sim.workloads.hierarchical_allreduce`)."""

    __slots__ = ("arrivals", "count", "flows", "make", "multishot", "name")

    def __init__(
        self,
        count: int = 1,
        name: str = "",
        *,
        multishot: bool = False,
        make: Callable[[Trigger], object] | None = None,
    ) -> None:
        if count < 1:
            raise ValueError(f"trigger count {count} < 1")
        self.count = count
        self.arrivals = 0
        self.flows: list[Flow] = []
        self.name = name
        self.multishot = multishot
        self.make = make


@dataclass(slots=True, eq=False)
class Flow:
    """One message of ``size`` bytes from host ``src`` to host ``dst``: an RDMA Write (with immediate when
    the receiver must see it complete) on the QP pair the two hosts share. It starts at ``start`` ns, or
    when ``trigger`` fires; finishing may fire ``send_done`` (the sender's completion) and ``recv_done``
    (the receiver's)."""

    src: int
    dst: int
    size: int
    start: int | None
    id: int = 0
    tag: str = ""
    imm: bool = False
    trigger: Trigger | None = None
    send_done: Trigger | None = None
    recv_done: Trigger | None = None
    qp: Qp | None = None  # None again once a transient connection is released
    finish: int | None = None
    recv_finish: int | None = None
    status: WcStatus | None = None

    def __init__(
        self,
        src: int,
        dst: int,
        size: int,
        start: int | None,
        id: int = 0,
        tag: str = "",
        imm: bool = False,
        trigger: Trigger | None = None,
        send_done: Trigger | None = None,
        recv_done: Trigger | None = None,
        qp: Qp | None = None,
        finish: int | None = None,
        recv_finish: int | None = None,
        status: WcStatus | None = None,
    ) -> None:
        # written out (the dataclass keeps it): compiled, it is several times as fast as the generated one
        self.src = src
        self.dst = dst
        self.size = size
        self.start = start
        self.id = id
        self.tag = tag
        self.imm = imm
        self.trigger = trigger
        self.send_done = send_done
        self.recv_done = recv_done
        self.qp = qp
        self.finish = finish
        self.recv_finish = recv_finish
        self.status = status

    @property
    def fct_ns(self) -> int | None:
        return None if self.finish is None or self.start is None else self.finish - self.start

    @property
    def goodput_bps(self) -> float | None:
        fct = self.fct_ns
        return None if not fct else self.size * 8e9 / fct
