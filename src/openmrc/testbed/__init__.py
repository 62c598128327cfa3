"""A real-kernel multi-plane fabric on one machine: network namespaces joined by veth pairs, configured with
nothing but the Linux export of `openmrc.fabric` (``linux/<node>.sh``, ``links.json``), so building it is
the test of that export.

Each host and switch of a `MultiPlaneClos` becomes a namespace ``<prefix><node>`` (``omrc-host0``,
``omrc-p1-t1-0`` ...), each link a veth pair named by the export (``eth<port>`` at both ends). ``up``
writes the export under the state directory, creates the namespaces and veths, turns off transmit
checksum offload on the hosts' ports (veth would otherwise hand the receiver unchecked UDP checksums,
hiding exactly the uSID checksum problem) and runs every node's script in its namespace. Faults are
nftables rules on the ``netdev`` ingress hook of both ends of a link, so a failed link stays up (a
blackhole, which only the transport can notice) and loss is ``numgen random`` per packet. ``down``
removes every namespace with the prefix, whatever state the last run left.

Needs root, iproute2 with SRv6 uSID (``seg6local ... flavors next-csid``, Linux ≥ 6.1) and nftables;
`missing` says what is not there.
"""

from openmrc.testbed.netns import DEFAULT_PREFIX, DEFAULT_STATE_DIR, Testbed, TestbedError, missing

__all__ = ["DEFAULT_PREFIX", "DEFAULT_STATE_DIR", "Testbed", "TestbedError", "missing"]
