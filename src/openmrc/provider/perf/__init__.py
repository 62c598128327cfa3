"""``openmrc perf``: RDMA Write bandwidth between two UDP devices, shaped like perftest's ``ib_write_bw``.

The server opens a `UdpDevice` on its plane endpoints and waits for clients on a TCP port (18515, as
perftest). Out of band, over that TCP connection, each side tells the other what RDMA needs: its
per-port endpoints, QP numbers and first PSNs, and the server the remote address (VA) and R_Key of the
buffer the client writes into. Then the client posts Writes (``iters`` of each message size, at most
``tx_depth`` outstanding, round-robin over ``qps`` QPs) and measures from the first post to the last
completion; the server's device completes them with a progress thread. At the end the client sends the
SHA-256 of what it wrote and the server compares it with its buffer.

Messages are JSON lines; the client speaks first (``hello``), the server answers each message with one
line (``ok`` or ``error`` with a reason). Impairments asked for by the client (``--loss``, a port that
fails at a time) apply to both directions: the client impairs what it sends and asks the server to do
the same for what it sends. Each side picks its QPs' first PSNs at random (as perftest) and both describe
the connection as ``ib_write_bw`` does (`Connection`: QPN, PSN, R_Key and VA per QP, and the planes).

*One client at a time.* The server serves one client; another that connects meanwhile is told at once
that the server is busy (as iperf3 does), and the server says so on its diagnostics: two measurements
sharing the device's ports, its impairments and its EV profile would measure neither.

*A server that goes away.* While it measures, the client looks at the out-of-band connection every
50 ms (a non-blocking peek): the server never speaks unasked, so an end of file or a reset
there means its process is gone, and the client fails at once rather than waiting for the transport's
retries to run out (with the default connect attributes, 4.4 s of silence).

*Entropy.* ``ev_mode`` chooses the QPs' EV profiles, on both sides: ``udp`` (the device's default
profile: UDP source ports), ``stev`` (UDP source ports and IPv6 flow labels, for fabrics that hash on the
flow label) or ``srv6`` (one uSID path per EV over every plane and spine, from a fabric export written by
``openmrc topo plan --out`` or ``openmrc testbed up``: `PerfFabric`). With a fabric each side finds
itself among the export's hosts by its addresses and binds its port addresses and its uSID addresses.

*Duration runs.* With ``duration`` the client writes one message size for that long and reports every
``interval``: goodput, retransmissions and how many EVs are GOOD and ASSUMED_BAD (`IntervalReport`), the
figures of a failure experiment (``openmrc testbed``). Interrupted (Ctrl-C), the client raises
`PerfInterrupted` with a report of what ran so far.

Modules: `report` (what a run measured, `Connection`, `PerfError`), `entropy` (EV modes, `PerfFabric`),
`exchange` (the out-of-band channel and what each side tells the other), `server` (`serve`), `client`
(`run_client`).
"""

from openmrc.provider.perf.client import default_iters, run_client, sweep_sizes
from openmrc.provider.perf.entropy import EV_MODES, PerfFabric, stev_profile
from openmrc.provider.perf.exchange import MAX_SIZE, OOB_PORT, perf_config
from openmrc.provider.perf.report import (
    ClientReport,
    Connection,
    IntervalReport,
    PerfError,
    PerfInterrupted,
    QpAddress,
    SideAddress,
    SizeResult,
    operation_name,
    summarize,
)
from openmrc.provider.perf.server import serve

__all__ = [
    "EV_MODES",
    "MAX_SIZE",
    "OOB_PORT",
    "ClientReport",
    "Connection",
    "IntervalReport",
    "PerfError",
    "PerfFabric",
    "PerfInterrupted",
    "QpAddress",
    "SideAddress",
    "SizeResult",
    "default_iters",
    "operation_name",
    "perf_config",
    "run_client",
    "serve",
    "stev_profile",
    "summarize",
    "sweep_sizes",
]
