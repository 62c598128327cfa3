"""Data-parallel training (PyTorch DDP, or FSDP2 with ``--wrap fsdp``) over MRC, or over gloo to compare.

    torchrun --nproc-per-node 4 examples/train_ddp.py --backend mrc
    torchrun --nproc-per-node 4 examples/train_ddp.py --backend gloo
    torchrun --nproc-per-node 4 examples/train_ddp.py --backend mrc --wrap fsdp

A small MLP learns a fixed random teacher network from synthetic data (each rank draws its own batches,
seeded by rank and step, so a run is reproducible and both backends see the same data). Rank 0 prints the
loss and the step time per step; ``--out FILE`` writes them as JSON (``{"backend", "world", "losses",
"step_s", "ends"}``, ends: each step's wall-clock end). ``--fail-plane P@STEP[+STEPS]`` (mrc only)
blackholes plane P of every rank's device from that step on (for STEPS steps, then heals it): MRC routes
around it and the training goes on.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from typing import NoReturn

import torch
import torch.distributed as dist
from torch import nn


def model(width: int) -> nn.Module:
    return nn.Sequential(
        nn.Linear(64, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 8)
    )


def batch(rank: int, step: int, size: int, teacher: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1_000_003 * rank + step)
    x = torch.randn(size, 64, generator=g)
    with torch.no_grad():
        y = teacher(x)
    return x, y


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--backend", choices=["mrc", "gloo"], default="mrc")
    ap.add_argument(
        "--wrap",
        choices=["ddp", "fsdp"],
        default="ddp",
        help="DistributedDataParallel, or FSDP2's fully_shard (parameters sharded, all-gathered per step)",
    )
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--batch", type=int, default=64, help="samples per rank and step")
    ap.add_argument("--width", type=int, default=256, help="hidden layer width")
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--out", help="write losses and step times as JSON (rank 0)")
    ap.add_argument("--fail-plane", help="P@STEP[+STEPS]: blackhole plane P from STEP (mrc only)")
    ap.add_argument("--quiet", action="store_true", help="no per-step lines")
    args = ap.parse_args()
    if not 1 <= args.steps <= 1_000_000 or not 1 <= args.batch <= 65536 or not 1 <= args.width <= 16384:
        ap.error("--steps 1..1e6, --batch 1..65536, --width 1..16384")

    def refuse(why: str) -> NoReturn:
        """A --fail-plane that cannot be: one line on stderr (from every rank), exit status 2, no training."""
        print(f"{ap.prog}: error: --fail-plane {args.fail_plane}: {why}", file=sys.stderr)
        sys.exit(2)

    fail = None
    if args.fail_plane:
        m = re.fullmatch(r"(\d+)@(\d+)(?:\+(\d+))?", args.fail_plane)
        if not m:
            refuse("expected PLANE@STEP[+STEPS], e.g. 2@10 or 2@10+5")
        if args.backend != "mrc":
            refuse("it blackholes a plane of MRC's device: only with --backend mrc")
        fail = (int(m.group(1)), int(m.group(2)), int(m.group(3)) if m.group(3) else None)
        if fail[1] >= args.steps:
            refuse(f"step {fail[1]} is not one of the {args.steps} steps (0..{args.steps - 1})")
        if fail[2] == 0:
            refuse("+0 steps fails nothing (give +1 or more, or no +STEPS: for good)")
    if "RANK" not in os.environ:
        ap.error("run me with torchrun (e.g. torchrun --nproc-per-node 4 examples/train_ddp.py)")
    if args.backend == "mrc":
        import openmrc.torch  # noqa: F401 (registers the backend)
    dist.init_process_group(args.backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    if fail is not None:  # the planes of this process's device are known once the group has made it
        from openmrc import torch as mrc_torch

        planes = mrc_torch.device().num_ports
        if not 1 <= fail[0] <= planes or planes == 1:
            dist.destroy_process_group()
            if planes == 1:  # (+STEPS or not: the step that would heal it never ends)
                refuse("blackholing the only plane cuts the ranks apart (give OPENMRC_PLANES=2 or more)")
            refuse(f"plane {fail[0]} outside 1..{planes} (the planes of this rank's MRC device)")
    torch.manual_seed(0)
    teacher = model(args.width)
    torch.manual_seed(1)
    if args.wrap == "fsdp":
        from torch.distributed.fsdp import fully_shard

        net = model(args.width)
        for layer in net:
            if isinstance(layer, nn.Linear):
                fully_shard(layer)  # each layer's parameters sharded over the ranks
        fully_shard(net)
    else:
        net = nn.parallel.DistributedDataParallel(model(args.width))
    opt = torch.optim.SGD(net.parameters(), lr=args.lr)
    losses: list[float] = []
    step_s: list[float] = []
    ends: list[float] = []  # wall-clock end of each step (to place a fault injected from outside)
    try:
        for step in range(args.steps):
            if fail is not None and args.backend == "mrc":
                from openmrc import torch as mrc_torch

                plane, at, steps = fail
                if step == at:
                    mrc_torch.device().blackhole_port(plane)
                if steps is not None and step == at + steps:
                    mrc_torch.device().heal()
            t0 = time.perf_counter()
            x, y = batch(rank, step, args.batch, teacher)
            loss = nn.functional.mse_loss(net(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            mean = loss.detach().clone()
            dist.all_reduce(mean)  # the global loss (the sum over the ranks, / world below)
            step_s.append(time.perf_counter() - t0)
            ends.append(time.time())
            losses.append(mean.item() / world)
            if rank == 0 and not args.quiet:
                print(f"step {step:4d}  loss {losses[-1]:.6f}  {step_s[-1] * 1000:8.2f} ms", flush=True)
        if rank == 0 and args.out:
            with open(args.out, "w") as f:
                out = {
                    "backend": args.backend,
                    "wrap": args.wrap,
                    "world": world,
                    "losses": losses,
                    "step_s": step_s,
                    "ends": ends,
                }
                json.dump(out, f)
        dist.barrier()  # every rank done before any tears its connections down (gloo aborts otherwise)
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
