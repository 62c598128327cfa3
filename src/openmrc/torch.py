"""The torch.distributed backend ``mrc``: collectives over MRC for DDP, FSDP and anything else that calls
``torch.distributed``.

    import openmrc.torch                      # registers the backend "mrc"
    torch.distributed.init_process_group("mrc")   # torchrun's environment, as with gloo

`MrcProcessGroup` is a Python ``ProcessGroup`` over an `openmrc.collectives.Communicator` (CPU tensors). Every
call returns at once with a Work (``wait()``, ``get_future()``); a worker thread of the group runs the
collectives in call order while the software NIC makes network progress on its own thread, so the caller's
thread (DDP's backward pass) goes on. Each process has one MRC device, shared by its groups: its endpoints
come from ``OPENMRC_BINDS`` (``ip[:port],ip[:port]``, one per plane), from ``OPENMRC_FABRIC`` (a fabric export
such as `openmrc testbed`'s: this host's plane addresses, and SRv6 or flow-label paths towards each peer) or,
by default, loopback addresses of its global rank with ``OPENMRC_PLANES`` planes (2); on loopback its packets
carry 32 KiB (`openmrc.collectives.LOOPBACK_MTU`), elsewhere MRC's 4 KiB. A failed collective (a
dead rank, a peer that stopped answering) fails its Work with the `CollectiveError`'s message, naming the
rank.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import queue
import threading
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

import ml_dtypes
import numpy as np
import torch
import torch.distributed as dist
from torch._C._distributed_c10d import _create_work_from_future  # type: ignore[attr-defined,unused-ignore]

from openmrc.collectives import Communicator
from openmrc.collectives.communicator import rank_device

__all__ = ["MrcProcessGroup", "device", "register"]

BACKEND = "mrc"
_REDUCE = {
    dist.ReduceOp.SUM: "sum",
    dist.ReduceOp.PRODUCT: "prod",
    dist.ReduceOp.MIN: "min",
    dist.ReduceOp.MAX: "max",
    dist.ReduceOp.AVG: "avg",
}
_device_lock = threading.Lock()
_device: Any = None  # the process's MRC device, shared by every group
_profile_for: Callable[[Any], int] | None = None  # its EV profiles towards a peer (a fabric export)
_groups: list[MrcProcessGroup] = []


def _np(t: torch.Tensor) -> np.ndarray[Any, Any]:
    """A flat numpy view of a contiguous CPU tensor (bfloat16 as ml_dtypes.bfloat16)."""
    if t.device.type != "cpu":
        raise ValueError(f"the mrc backend moves CPU tensors; got one on {t.device}")
    if t.dtype == torch.bfloat16:
        a: np.ndarray[Any, Any] = t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
        return a.reshape(-1)
    if t.dtype == torch.bool or t.is_complex():
        raise ValueError(f"the mrc backend has no reductions for {t.dtype}")
    b: np.ndarray[Any, Any] = t.numpy()
    return b.reshape(-1)


class _Contig:
    """A contiguous stand-in for a tensor, copied back on exit if it had to be made."""

    def __init__(self, t: torch.Tensor, write: bool = True) -> None:
        self.t, self.write = t, write
        self.c = t if t.is_contiguous() else t.contiguous()

    def __enter__(self) -> np.ndarray[Any, Any]:
        return _np(self.c)

    def __exit__(self, *exc: object) -> None:
        if self.write and self.c is not self.t and exc[0] is None:
            self.t.copy_(self.c)


def _op(opts: Any) -> str:
    op = getattr(opts, "reduceOp", dist.ReduceOp.SUM)
    for k, v in _REDUCE.items():
        if op == k:
            return v
    raise ValueError(f"the mrc backend has no reduction {op} (it has sum, product, min, max, avg)")


def _shared_device(rank: int) -> tuple[Any, Callable[[Any], int] | None]:
    global _device, _profile_for
    with _device_lock:
        if _device is None or _device.closed:
            binds = os.environ.get("OPENMRC_BINDS")
            ends = [b.strip() for b in binds.split(",")] if binds else None
            export = os.environ.get("OPENMRC_FABRIC")
            if export:  # a host of a fabric export: its addresses and the fabric's paths
                from openmrc.collectives.fabric import fabric_device

                fd = fabric_device(export, ends)
                _device, _profile_for = fd.device, fd.profile_for
            else:
                planes = int(os.environ.get("OPENMRC_PLANES", "2"))
                _device = rank_device(rank, planes, ends)
            _device.start()
        return _device, _profile_for


def device() -> Any:
    """This process's MRC device (a `UdpDevice`: its faults, statistics, EV states), once a group exists."""
    if _device is None:
        raise RuntimeError("mrc: no process group has been created in this process yet")
    return _device


class MrcProcessGroup(dist.ProcessGroup):
    """One process group over MRC (see the module's docstring)."""

    def __init__(self, store: Any, rank: int, size: int, timeout: timedelta | None = None) -> None:
        super().__init__(rank, size)
        self._rank, self._size = rank, size
        global_rank = int(os.environ.get("RANK", rank))
        dev, profile_for = _shared_device(global_rank)
        # (init_process_group's timeout, as gloo's; one of days, "no limit" in effect, is none)
        limit = None if timeout is None or timeout.total_seconds() > 1e6 else timeout.total_seconds()
        self.comm = Communicator(rank, size, store, device=dev, ev_profile=profile_for, timeout=limit)
        self._jobs: queue.SimpleQueue[tuple[Callable[[], Any], torch.futures.Future[Any]] | None] = (
            queue.SimpleQueue()
        )
        self._worker = threading.Thread(target=self._work, name=f"openmrc-pg-{rank}", daemon=True)
        self._worker.start()
        self._closed = False
        _groups.append(self)

    def getBackendName(self) -> str:
        return BACKEND

    # torch 2.13 keeps a group's name on its C++ backends, and a Python process group has none, so the
    # name torch gives it is kept here (FSDP2's DeviceMesh resolves its groups by name)
    def _set_group_name(self, name: str) -> None:
        self._mrc_group_name: str | None = name

    @property
    def group_name(self) -> str:
        name: str | None = getattr(self, "_mrc_group_name", None)
        if name is None:
            raise RuntimeError("ProcessGroup name not set")
        return name

    def __repr__(self) -> str:
        return f"MrcProcessGroup(rank {self._rank} of {self._size})"

    # -- running work off the caller's thread --------------------------------------------------------------
    def _work(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            fn, fut = job
            try:
                fut.set_result(fn())
            except Exception as exc:  # handed to the caller through the Work
                fut.set_exception(RuntimeError(f"mrc: {exc}"))

    def _submit(self, fn: Callable[[], Any]) -> Any:
        if self._closed:
            raise RuntimeError("mrc: the process group has been shut down")
        fut: torch.futures.Future[Any] = torch.futures.Future()
        self._jobs.put((fn, fut))
        return _create_work_from_future(fut)

    def _each(
        self, tensors: list[torch.Tensor], call: Callable[[np.ndarray[Any, Any]], Any], write: bool = True
    ) -> Any:
        """Work that runs ``call`` on each tensor in turn (as a contiguous array)."""

        def run() -> list[torch.Tensor]:
            for t in tensors:
                with _Contig(t, write) as a:
                    call(a)
            return tensors

        return self._submit(run)

    # -- collectives ---------------------------------------------------------------------------------------
    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> Any:
        op = _op(opts)
        return self._each(tensors, lambda a: self.comm.all_reduce(a, op=op))

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any = None) -> Any:
        return self.allreduce(tensors, opts)

    def broadcast(self, tensors: list[torch.Tensor], opts: Any = None) -> Any:
        root = getattr(opts, "rootRank", 0)
        return self._each(tensors, lambda a: self.comm.broadcast(a, root=root))

    def reduce(self, tensors: list[torch.Tensor], opts: Any = None) -> Any:
        op, root = _op(opts), getattr(opts, "rootRank", 0)
        return self._each(tensors, lambda a: self.comm.reduce(a, None, op=op, root=root))

    def _gather_into(self, out: torch.Tensor, inp: torch.Tensor) -> None:
        with _Contig(out) as o, _Contig(inp, write=False) as i:
            self.comm.all_gather(i, o)

    def allgather(
        self, output_tensors: list[list[torch.Tensor]], input_tensors: list[torch.Tensor], opts: Any = None
    ) -> Any:
        def run() -> list[list[torch.Tensor]]:
            for outs, inp in zip(output_tensors, input_tensors, strict=True):
                flat = torch.empty((self._size, *inp.shape), dtype=inp.dtype)
                self._gather_into(flat, inp)
                for r, o in enumerate(outs):
                    o.copy_(flat[r])
            return output_tensors

        return self._submit(run)

    def _allgather_base(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> Any:
        def run() -> list[torch.Tensor]:
            self._gather_into(output, input)
            return [output]

        return self._submit(run)

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> Any:
        return self._allgather_base(output, input, opts)

    def _scatter_reduce_into(self, out: torch.Tensor, inp: torch.Tensor, op: str) -> None:
        with _Contig(out) as o, _Contig(inp, write=False) as i:
            self.comm.reduce_scatter(i, o, op=op)

    def reduce_scatter(
        self, output_tensors: list[torch.Tensor], input_tensors: list[list[torch.Tensor]], opts: Any = None
    ) -> Any:
        op = _op(opts)

        def run() -> list[torch.Tensor]:
            for out, ins in zip(output_tensors, input_tensors, strict=True):
                self._scatter_reduce_into(out, torch.stack([t.reshape(out.shape) for t in ins]), op)
            return output_tensors

        return self._submit(run)

    def _reduce_scatter_base(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> Any:
        op = _op(opts)

        def run() -> list[torch.Tensor]:
            self._scatter_reduce_into(output, input, op)
            return [output]

        return self._submit(run)

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> Any:
        return self._reduce_scatter_base(output, input, opts)

    def alltoall_base(
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        output_split_sizes: Sequence[int],
        input_split_sizes: Sequence[int],
        opts: Any = None,
    ) -> Any:
        def counts(t: torch.Tensor, splits: Sequence[int]) -> list[int]:
            row = t[0].numel() if t.dim() and t.shape[0] else 0
            if not splits:
                if t.dim() == 0 or t.shape[0] % self._size:
                    raise ValueError(
                        f"alltoall: {tuple(t.shape)} does not split into {self._size} equal parts"
                    )
                return [t.numel() // self._size] * self._size
            return [int(s) * row for s in splits]

        def run() -> list[torch.Tensor]:
            sc, rc = counts(input, input_split_sizes), counts(output, output_split_sizes)
            with _Contig(output) as o, _Contig(input, write=False) as i:
                self.comm.alltoallv(i, sc, o, rc)
            return [output]

        return self._submit(run)

    def all_to_all_single(
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        output_split_sizes: Sequence[int],
        input_split_sizes: Sequence[int],
        opts: Any = None,
    ) -> Any:
        return self.alltoall_base(output, input, output_split_sizes, input_split_sizes, opts)

    def alltoall(
        self, output_tensors: list[torch.Tensor], input_tensors: list[torch.Tensor], opts: Any = None
    ) -> Any:
        def run() -> list[torch.Tensor]:
            flat_in = torch.cat([t.reshape(-1) for t in input_tensors])
            flat_out = torch.empty(sum(t.numel() for t in output_tensors), dtype=flat_in.dtype)
            with _Contig(flat_out) as o:
                self.comm.alltoallv(
                    _np(flat_in), [t.numel() for t in input_tensors], o, [t.numel() for t in output_tensors]
                )
            off = 0
            for t in output_tensors:
                t.copy_(flat_out[off : off + t.numel()].reshape(t.shape))
                off += t.numel()
            return output_tensors

        return self._submit(run)

    def barrier(self, opts: Any = None) -> Any:
        def run() -> list[torch.Tensor]:
            self.comm.barrier()
            return []

        return self._submit(run)

    def send(self, tensors: list[torch.Tensor], dst: int, tag: int = 0) -> Any:
        return self._each(tensors, lambda a: self.comm.send(a, dst), write=False)

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int = 0) -> Any:
        return self._each(tensors, lambda a: self.comm.recv(a, src))

    # -- end -------------------------------------------------------------------------------------------------
    def shutdown(self) -> None:
        """Finish the queued work, say goodbye to the peers, release the QPs."""
        if self._closed:
            return
        self._closed = True
        self._jobs.put(None)
        self._worker.join(60)
        self.comm.close()
        with contextlib.suppress(ValueError):
            _groups.remove(self)

    def abort(self) -> None:
        self.shutdown()


def _create(store: Any, rank: int, size: int, timeout: timedelta) -> MrcProcessGroup:
    return MrcProcessGroup(store, rank, size, timeout)


def _at_exit() -> None:
    for pg in list(_groups):
        with contextlib.suppress(Exception):
            pg.shutdown()
    if _device is not None:
        with contextlib.suppress(Exception):
            _device.close()


def register() -> None:
    """Register the backend ``mrc`` with torch.distributed (importing this module does it)."""
    if BACKEND.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(BACKEND, _create, devices=["cpu"])


register()
atexit.register(_at_exit)
