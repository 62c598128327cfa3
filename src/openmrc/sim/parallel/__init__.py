"""One simulation split across processes (ranks), with the results of the same run in one process.

Theory of operation
-------------------
Every rank runs only its share of the nodes (`ranks.assign_ranks`, from the topology alone: hosts in
contiguous blocks with their T0s, a switch with the rank of its lower neighbours when they agree, the
rest, the spines, shared out in turn), and builds only that share (`FabricSim` with ``part``, a
`Partition`): its hosts (NICs, QPs), its switches and their ports. The top tier (every neighbour a tier
below: a Clos's T1s, a fat tree's cores) is shared out port by port instead
(`openmrc.sim.fabric_sim.shared_switches`): every rank runs each such switch with its ports towards its
own nodes, and a packet sent up into one is routed as it is sent (the switch's choice depends on the
packet and the routing state; where ECMP may reconverge before it arrives, every rank routes it at its
arrival) and crosses, if at all, straight to the rank of the port it leaves by: once when its ends are on
different ranks, never when they share one (the whole switch on one rank would have about half the
packets cross twice). `launch.run` and `launch.run_local` take a builder, called with ``(rank, size)``
in each rank's own process (forked before building, or started by ``mpiexec``); a whole fabric built
beforehand still runs, its other nodes idle replicas. A packet crossing to another rank is shipped
there.

Building in parts keeps every value the results depend on the same as in one process:

- *Seeds.* Each NIC's rng is seeded from the simulation's rng in host order; every rank draws all the
  seeds (cheap) and builds the NICs of its hosts only, so each NIC has its one-process seed. Ports of an
  ordered fabric draw from streams seeded by (seed, node, port): no shared draw order at all.
- *QPs and memory.* A NIC draws its QP numbers, memory keys and EV table shuffles from its own rng, in
  the order its flows are set up. Every rank holds the whole flow list and sets up, in flow order, the
  QPs of flows with a local end: a host's draws are then those of one process, in the same order (its
  QP towards a host of another rank is made and connected, towards QP 0, when its pair would be made).
  Only two things cross, once, before the run (`windows._connect_parts`): the QP numbers of the pairs
  cut by the split (both ranks noted them in flow order, so the lists line up) and each host's flow
  buffer address and R_Key. Nothing changes for a run in one process.
- *The cut.* A port whose peer is on another rank ships what it sends (`exchange._Shipper`); one whose
  peer is a shared switch routes it there and ships it to the rank of the port it leaves by, or keeps it
  (`exchange._Splitter`). The port of another rank's node that leads into this rank (or into a shared
  switch) has a stand-in here (`Partition.ghosts`): it delivers what that port ships (through its epoch
  check once failures may hit it) and fails with its link.
- *Failures* are scheduled on every rank, as the same events, and change only the ports a rank has (its
  own and the stand-ins); which switch ports are down, all ECMP reconvergence needs, is kept by
  (node, port) everywhere (`openmrc.sim.failures`).
- *Results.* Each rank reports its flows' ends, its ports' figures (a stand-in's drops count for the
  port it stands for), its hosts' retransmissions and samples; every rank merges them (`merge`) into
  the whole run's results (`Partition.totals`), or, among forked ranks (`run_local`), rank 0 alone:
  the others' results would go unread.

Synchronisation is conservative and window-based, as in ns-3's and OMNeT++'s distributed simulators, and
pipelined: the lookahead is the shortest link latency of the fabric, and each rank runs up to `LAG`
windows ahead of the slowest (`openmrc.sim.parallel.windows`).

The results do not depend on the split because the engine runs in ordered mode
(`FabricSimConfig.ordered`, `Simulator.order_by_origin`): ties are broken by who scheduled an event and
that node's own scheduling order, and each port draws from its own random stream. A node's history therefore
depends only on the packets it receives, and by induction it is the same on any number of ranks. What
would let one host act on another at once (flow triggers, PFC pauses, the RoCEv2 baseline) is refused
when the run has more than one rank.

Modules, each for one part of it:

- `ranks`: which rank runs which node (`assign_ranks`, `assign`: a rank's `Partition`) and the lookahead.
- `exchange`: what crosses between ranks during the run, packed per window, and how it is read back.
- `channels`: how ranks reach each other: `PipeExchange` (processes forked from this one, no extra
  needed) and `MpiExchange` (mpi4py, the ``mpi`` extra, under ``mpiexec``), both `Pipelined`.
- `windows`: the window loop (`run_split`, which drives any `Exchange`), and what a rank posts after a
  window (`Window`).
- `merge`: each rank's share of the results, merged into the whole run's.
- `launch`: `run` and `run_local`, which start the ranks and have each build its part.

The public names are `openmrc.sim.partition`'s (and `openmrc.sim.crossing`'s); the results carry where each
rank's time went (`SimResults.timings`).
"""
