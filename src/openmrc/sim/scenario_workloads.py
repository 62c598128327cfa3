"""The workload kinds of a scenario's ``[workload]`` table: for each kind, the schema of the keys it reads
and, beside it, what adds its flows to the fabric. `WORKLOADS` holds them by kind; `Workload`, the whole
table as the schema validates it, is every kind's keys together (a key one kind reads is allowed, and
ignored, under another: ``--set workload.kind=...`` switches a scenario's kind and keeps its keys).

A kind the simulator cannot build itself (``collective``: the real `openmrc.collectives.Communicator`, a
layer above) is added by the module `PLUGIN_MODULES` names, which registers it in `WORKLOAD_PLUGINS` when
first used.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import model_validator

from openmrc.sim import workloads
from openmrc.sim.fabric_sim import FabricSim
from openmrc.sim.htsim_cm import load_cm
from openmrc.sim.scenario_fields import Section, setting

__all__ = [
    "PLUGIN_MODULES",
    "WORKLOADS",
    "WORKLOAD_PLUGINS",
    "AllReduceHierKeys",
    "AllReduceKeys",
    "CmKeys",
    "CollectiveKeys",
    "IncastKeys",
    "PairKeys",
    "PermutationKeys",
    "Workload",
    "WorkloadKeys",
    "WorkloadKind",
]

Find = Callable[[str], Path]
"""Where a file a workload names is: a path, or a shipped file (`openmrc.sim.scenario.data_file`)."""


class WorkloadKeys(Section):
    """The keys every workload kind reads."""

    kind: Literal[
        "permutation", "incast", "alltoall", "allreduce", "allreduce-hier", "cm", "pair", "collective"
    ] = setting(
        "permutation",
        "",
        "the traffic pattern (pair: one QP's messages, as ib_write_bw / ib_write_lat; allreduce: a ring; "
        "allreduce-hier: one hierarchical all-reduce step, servers of gpus_per_server GPUs; collective: the "
        "real openmrc.collectives Communicator on every host, moving and reducing real data)",
    )
    size_kib: int = setting(
        256,
        "KiB",
        "bytes per flow (per rank/GPU for allreduce*); a flow is one RDMA Write, whose length is 32-bit",
        ge=1,
        le=(1 << 22) - 1,
    )
    size_bytes: int | None = setting(
        None, "bytes", "bytes per flow, when not a whole number of KiB", ge=1, le=(1 << 32) - 1
    )
    start_us: float = setting(0.0, "µs", "when the flows start", ge=0)

    def size(self) -> int:
        """Bytes per flow: ``size_bytes``, else ``size_kib`` KiB."""
        return self.size_bytes if self.size_bytes is not None else self.size_kib << 10

    def start_ns(self) -> int:
        return int(self.start_us * 1000)


K = TypeVar("K", bound=WorkloadKeys)
Add = Callable[[FabricSim, K, Find], None]


@dataclass(frozen=True, slots=True)
class WorkloadKind:
    """One kind of workload."""

    keys: type[WorkloadKeys]
    """The schema of the keys it reads (a part of `Workload`)."""
    add: Callable[[FabricSim, Any, Find], None]
    """Adds its flows: ``add(sim, workload, find)``."""
    splits: bool = True
    """Whether a run of it can be split over processes (``--ranks``)."""
    figures: Callable[[Any], dict[str, Any]] | None = None
    """Figures its keys give without simulating, reported beside each run (``workload -> {key: value}``)."""


WORKLOADS: dict[str, WorkloadKind] = {}
"""Every workload kind by name (``[workload] kind``)."""


def _kind(
    name: str,
    keys: type[K],
    *,
    splits: bool = True,
    figures: Callable[[K], dict[str, Any]] | None = None,
) -> Callable[[Add[K]], Add[K]]:
    def register(add: Add[K]) -> Add[K]:
        WORKLOADS[name] = WorkloadKind(keys, add, splits, figures)
        return add

    return register


# -- the kinds, each its keys then its flows ----------------------------------------------------------------


class PermutationKeys(WorkloadKeys):
    seed: int = setting(1, "", "permutation: seeds the draw (each host's destination)", ge=0)


@_kind("permutation", PermutationKeys)
def _permutation(sim: FabricSim, wl: PermutationKeys, find: Find) -> None:
    workloads.permutation(sim, wl.size(), seed=wl.seed, start=wl.start_ns())


class IncastKeys(WorkloadKeys):
    senders: int = setting(7, "", "incast: senders", ge=1)
    target: int = setting(0, "", "incast: the receiving host", ge=0)
    victim: bool = setting(False, "", "incast: one more flow to the target's T0 neighbour")
    victim_size_kib: int | None = setting(None, "KiB", "incast: the victim's size (default size_kib)", ge=1)


@_kind("incast", IncastKeys)
def _incast(sim: FabricSim, wl: IncastKeys, find: Find) -> None:
    workloads.incast(
        sim,
        wl.size(),
        senders=wl.senders,
        target=wl.target,
        start=wl.start_ns(),
        victim=wl.victim,
        victim_size=None if wl.victim_size_kib is None else wl.victim_size_kib << 10,
    )


@_kind("alltoall", WorkloadKeys)
def _alltoall(sim: FabricSim, wl: WorkloadKeys, find: Find) -> None:
    workloads.all_to_all(sim, wl.size(), start=wl.start_ns())


class AllReduceHierKeys(WorkloadKeys):
    gpus_per_server: int = setting(
        8, "", "allreduce-hier: GPUs per server (consecutive hosts; NVLink inside, not simulated)", ge=1
    )
    nvlink_gbps: float = setting(
        3600.0,
        "Gb/s",
        "allreduce-hier: per-GPU NVLink rate for the computed intra-server phases (allreduce_nvlink_us)",
        gt=0,
    )


def _nvlink(wl: AllReduceHierKeys) -> dict[str, Any]:
    ns = workloads.nvlink_ns(wl.size(), wl.gpus_per_server, round(wl.nvlink_gbps * 1e9))
    return {"allreduce_nvlink_us": ns / 1000}


@_kind("allreduce-hier", AllReduceHierKeys, figures=_nvlink)
def _allreduce_hier(sim: FabricSim, wl: AllReduceHierKeys, find: Find) -> None:
    workloads.hierarchical_allreduce(sim, wl.size(), gpus_per_server=wl.gpus_per_server, start=wl.start_ns())


class AllReduceKeys(WorkloadKeys):
    order_seed: int | None = setting(None, "", "allreduce: shuffles the ring order (default: in order)")


@_kind("allreduce", AllReduceKeys)
def _allreduce(sim: FabricSim, wl: AllReduceKeys, find: Find) -> None:
    workloads.ring_allreduce(sim, wl.size(), order_seed=wl.order_seed, start=wl.start_ns())


class CmKeys(WorkloadKeys):
    file: str | None = setting(None, "", "cm: an htsim connection matrix (path, or a shipped file's name)")

    @model_validator(mode="after")
    def _cm_file(self) -> CmKeys:
        if self.kind == "cm" and self.file is None:
            raise ValueError("kind 'cm' needs file (a connection matrix)")
        return self


@_kind("cm", CmKeys)
def _cm(sim: FabricSim, wl: CmKeys, find: Find) -> None:
    assert wl.file is not None  # `CmKeys._cm_file`
    workloads.connection_matrix(sim, load_cm(find(wl.file)), start=wl.start_ns())


class PairKeys(WorkloadKeys):
    src: int = setting(0, "", "pair: the sending host", ge=0)
    dst: int = setting(1, "", "pair: the receiving host", ge=0)
    messages: int = setting(1, "", "pair: messages of size_kib (or size_bytes) each", ge=1)
    total_kib: int | None = setting(
        None, "KiB", "pair: fewer messages when this much has gone in all before (sweeps of size)", ge=1
    )
    depth: int = setting(1, "", "pair: messages outstanding at once (ib_write_bw's tx-depth)", ge=1)
    imm: bool = setting(
        False, "", "pair: Writes with Immediate, so the receiver sees each arrive (delivery_us)"
    )


@_kind("pair", PairKeys)
def _pair(sim: FabricSim, wl: PairKeys, find: Find) -> None:
    size = wl.size()
    messages = wl.messages
    if wl.total_kib is not None:
        messages = min(messages, -(-(wl.total_kib << 10) // size))
    workloads.pair(
        sim, size, src=wl.src, dst=wl.dst, messages=messages, depth=wl.depth, imm=wl.imm, start=wl.start_ns()
    )


class CollectiveKeys(WorkloadKeys):
    op: Literal["all_reduce", "reduce_scatter", "all_gather", "broadcast"] = setting(
        "all_reduce", "", "collective: the operation (size_kib per rank, as nccl-tests counts it)"
    )
    algo: Literal["ring", "rhd", "rd", "tree", "chain"] | None = setting(
        None, "", "collective: the algorithm (default: chosen by size)"
    )
    dtype: str = setting("float32", "", "collective: the element type (float32, bfloat16, int32 ...)")
    chunk_kib: int = setting(
        256, "KiB", "collective: the pipelining unit, one Write with Immediate", ge=4, le=65536
    )


WORKLOAD_PLUGINS: dict[str, Callable[[FabricSim, Any, int, int], None]] = {}
"""Workload kinds a layer above the simulator provides: ``kind -> add(sim, workload, size, start_ns)``
(``workload``: the kind's keys, e.g. `CollectiveKeys`), registered by the module `PLUGIN_MODULES` names
when it is imported (on first use of the kind: the simulator imports nothing from above itself)."""
PLUGIN_MODULES: dict[str, str] = {"collective": "openmrc.collectives.simworld"}


@_kind("collective", CollectiveKeys, splits=False)
def _collective(sim: FabricSim, wl: CollectiveKeys, find: Find) -> None:
    if wl.kind not in WORKLOAD_PLUGINS:
        importlib.import_module(PLUGIN_MODULES[wl.kind])  # it registers itself
    WORKLOAD_PLUGINS[wl.kind](sim, wl, wl.size(), wl.start_ns())


class Workload(
    # pydantic puts the keys of the last base first: the kinds' keys read in the order they are defined above
    CollectiveKeys,
    PairKeys,
    CmKeys,
    AllReduceKeys,
    AllReduceHierKeys,
    IncastKeys,
    PermutationKeys,
):
    """The traffic: one pattern of RDMA Writes. A permutation is a derangement drawn from `seed`: every
    host sends one flow and receives one, never from itself (N hosts, N flows)."""
