"""One simulation split across processes (ranks), with the results of the same run in one process.

The names of `openmrc.sim.parallel`, which holds the code and its theory of operation: which rank runs
which node (`assign_ranks`, `assign`, `owned_nodes`, `lookahead_ns`), how ranks reach each other
(`PipeExchange`, `MpiExchange`, `mpi_world`), the window loop (`run_split`) and starting the ranks (`run`,
`run_local`). A split run's results carry where each rank's time went (`SimResults.timings`).
"""

from __future__ import annotations

from openmrc.sim.fabric_sim import Partition
from openmrc.sim.parallel.channels import LAG, Exchange, MpiExchange, PipeExchange, Pipelined, mpi_world
from openmrc.sim.parallel.launch import Build, run, run_local
from openmrc.sim.parallel.ranks import PartitionError, assign, assign_ranks, lookahead_ns, owned_nodes
from openmrc.sim.parallel.windows import PROGRESS_S, run_split

__all__ = [
    "LAG",
    "PROGRESS_S",
    "Build",
    "Exchange",
    "MpiExchange",
    "Partition",
    "PartitionError",
    "PipeExchange",
    "Pipelined",
    "assign",
    "assign_ranks",
    "lookahead_ns",
    "mpi_world",
    "owned_nodes",
    "run",
    "run_local",
    "run_split",
]
