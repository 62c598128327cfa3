"""Collectives over MRC: `Communicator` (all_reduce, reduce_scatter, all_gather, alltoall(v), broadcast,
reduce, barrier, send/recv) over `openmrc.verbs` only, so the same objects run on a software NIC
(`openmrc.provider.UdpDevice`) and on a simulated host.

The algorithms are sans-IO (`program`: a `Program` per rank and collective, run by a `Schedule` that is fed
completions and hands back sends); `engine` moves pieces with Writes with Immediate into credited slots;
`bootstrap` finds the other ranks (torchrun, mpiexec, a store).
"""

from openmrc.collectives.bootstrap import HashStore, Launch, Store, TCPStore, from_env, from_mpi
from openmrc.collectives.communicator import LOOPBACK_MTU, Communicator, default_binds, rank_device
from openmrc.collectives.engine import CollectiveError
from openmrc.collectives.ops import DTYPES, OPS, dtype_of
from openmrc.collectives.program import Program, Schedule, ScheduleError

__all__ = [
    "DTYPES",
    "LOOPBACK_MTU",
    "OPS",
    "CollectiveError",
    "Communicator",
    "HashStore",
    "Launch",
    "Program",
    "Schedule",
    "ScheduleError",
    "Store",
    "TCPStore",
    "default_binds",
    "dtype_of",
    "from_env",
    "from_mpi",
    "rank_device",
]
