"""Drivers of the sans-IO transport core: the pair harness, the UDP device, and the fault injector they share.

The driver contract
-------------------
Every driver of a `openmrc.transport.Nic` (the pair harness `loopback.Pair`, the simulator's hosts in
`openmrc.sim.network`, the software NIC `udp.UdpDevice`) does three things and nothing else, always with
the time ``now`` (integer ns of the driver's clock, never decreasing)::

    1. feed arrivals and the time
       nic.receive_datagram(data, port, now, addr, ecn=..., flow_label=..., trim=..., src=...)
           # bytes from a socket: ``addr`` is the `openmrc.wire.Addressing` the socket reports; the ICRC
           # is checked against it, the entropy is (flow_label & 0xffff) << 16 | addr.sport
       nic.receive(packet, port, now, ecn, entropy, trim, src)       # a decoded Packet (in process)
    2. drain datagrams_to_send
       for t in nic.datagrams_to_send(now, max_data):   # max_data: what pacing allows (None: no limit)
           send t.packet on port t.port towards t.peer along EV t.ev (t.entropy: its 32-bit value)
    3. re-arm one timer
       deadline = nic.get_timer()       # None, or when to call nic.handle_timer(now)
       ... at that time: nic.handle_timer(now), then 2. again

A driver that keeps one timer armed and asks after every packet may first ask ``nic.timer_floor()``: a
time no later than the deadline (-1: none), read without putting the NIC's timer heap in order; only when
it is earlier than the armed timer does ``get_timer()`` have anything new (the simulator's hosts do so).

After ``handle_timer(now)``, ``get_timer()`` is None or later than ``now`` (a driver never spins). After
every receive or timer, step 2 may have new packets; after a `Qp.post_send`, too. A pacing driver calls
step 2 again when its ports have room (`Nic.has_data` says whether anything waits). A `Transmit`'s
``packet`` is always a decoded `openmrc.wire.Packet`; a driver that carries bytes seals it with the ICRC
of its addressing (`openmrc.wire.seal` / `seal_parts`). Bad input never raises out of step 1: it is
dropped and counted in ``nic.stats``.

Modules: `loopback` (two NICs on a scripted fabric: the tests' pair harness), `udp` (a software MRC NIC
over UDP sockets, one per plane), `faults` (the impairments both apply: loss, duplication, reordering,
trimming, ECN marks, bit flips, blackholed EVs and ports).
"""

from openmrc.provider.faults import Fate, Impairments, fates
from openmrc.provider.loopback import Fabric, Pair, port_address
from openmrc.provider.udp import DeviceStats, Peer, UdpDevice, parse_endpoint

__all__ = [
    "DeviceStats",
    "Fabric",
    "Fate",
    "Impairments",
    "Pair",
    "Peer",
    "UdpDevice",
    "fates",
    "parse_endpoint",
    "port_address",
]
