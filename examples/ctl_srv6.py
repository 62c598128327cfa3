"""Explicit SRv6 EV profiles (the OCP mrc_ctl.h examples "SRv6" and "SRv6 + SRH") on two hosts of a
simulated SRv6 fabric.

A controller on each host builds an SRv6 EV format profile and an explicit EV profile whose EVs are uSID
source routes, one per (plane, spine) path between the two hosts; QPs bound to it write 1 MiB, and the
spines' packet counters show the spraying: a QP sprays over three of each plane's four paths (its active
EVs; the fourth is the plane's backup, which takes over when an active path fails), so in every plane at
least three spines carry packets.

* ``srv6``: each EV is one uSID destination address holding the whole path
  (locator · source T0 · spine · destination T0 · host port);
* ``srh``: each EV splits its path in two: the destination address goes up to the spine, the one segment
  of an SRH holds the rest. The spine's uSID is the last of the address's carrier, so the spine takes the
  SRH segment as the new destination address and looks it up (RFC 9800 End with NEXT-CSID).

With no section named, both run. Everything goes through `openmrc.verbs` and `openmrc.ctl`, as on a
software NIC; the host is a simulated one because uSID addresses need a fabric that routes them (on real
sockets, `openmrc testbed` builds one with root; an SRH needs raw sockets, which the UDP device refuses
with that reason). The simulator's clock runs as the program polls.

    python examples/ctl_srv6.py [srv6] [srh]
"""

from __future__ import annotations

import argparse
import ipaddress
import random
import sys

from openmrc import ctl, verbs
from openmrc.ev import EVFormatMode, EVProfileMode, EVState
from openmrc.sim.config import FabricSimConfig
from openmrc.sim.fabric_sim import FabricSim
from openmrc.sim.network import Switch
from openmrc.transport import NicConfig

S = ctl.ProfileState
EM = ctl.EvProfileAttrMask
FM = ctl.EvFmtProfileAttrMask
SRC, DST = 1, 6  # under different T0s: every path crosses a spine
PROFILES = {"srv6": (21, 31), "srh": (22, 32)}  # section: (EV format profile id, EV profile id)


class Host:
    """A simulated host opened as a verbs device, with a controller context on it."""

    def __init__(self, fabric: FabricSim, host: int, name: str) -> None:
        self.host = host
        verbs.add_device(name, fabric.verbs_device(host))
        self.name = name
        self.dev = verbs.open_device(name)
        self.ctx = verbs.create_context(self.dev, verbs.API_CURRENT_VERSION)
        ctl.grant(self.dev)  # the simulated NIC belongs to this process
        self.pd = verbs.alloc_pd(self.dev)
        self.cq = verbs.create_cq(self.ctx, 64)

    def close(self) -> None:
        verbs.destroy_cq(self.cq)
        verbs.dealloc_pd(self.pd)
        verbs.destroy_context(self.ctx)
        verbs.close_device(self.dev)
        verbs.remove_device(self.name)


def paths(fabric: FabricSim, src: int, dst: int, srh: bool) -> list[ctl.Ev]:
    """One EV per (plane, spine) from ``src`` to ``dst``: 32 bytes, the destination address and, with
    ``srh``, the SRH segment."""
    plan, t = fabric.plan, fabric.topo
    assert plan is not None
    out = []
    for plane in range(t.planes):
        for spine in range(t.uplinks):
            usids = plan.path_usids(src, dst, plane, spine)
            if srh:  # up to the spine in the address, the rest in the SRH's segment
                val = plan.address_int(usids[:2]) << 128 | plan.address_int(usids[2:])
            else:
                val = plan.address_int(usids) << 128
            out.append(ctl.Ev(val.to_bytes(32, "big"), plane + 1))
    return out


def build_profiles(h: Host, fmt_id: int, ev_id: int, evs: list[ctl.Ev], srh: bool) -> None:
    """An SRv6 format profile (locator + six uSIDs, and the SRH segment's the same again) and an explicit
    EV profile holding ``evs``, both ONLINE."""
    widths = [32, *[16] * 6] * (2 if srh else 1)
    fmt = ctl.EvFmtProfileAttr(
        S.OFFLINE, ev_fmt_mode=EVFormatMode.SRV6, op=ctl.EvFmtOp.MODIFY_FIELDS, fmt_fields=widths
    )
    ctl.modify_ev_fmt_profile(h.ctx, fmt_id, fmt, FM.STATE | FM.MODE | FM.OP)
    ctl.modify_ev_fmt_profile(h.ctx, fmt_id, ctl.EvFmtProfileAttr(S.ONLINE), FM.STATE)
    attr = ctl.EvProfileAttr(
        S.OFFLINE,
        ev_mode=EVProfileMode.EXP,
        ev_fmt_profile_id=fmt_id,
        ev_count=len(evs),
        ev_min_active=1,
        ev_event_mask=int(EVState.GOOD | EVState.ASSUMED_BAD),
    )
    ctl.modify_ev_profile(
        h.ctx, ev_id, attr, EM.STATE | EM.MODE | EM.FMT_ID | EM.COUNT | EM.MIN_ACTIVE | EM.EVENT_MASK
    )
    entries = [ctl.EvOpEntry(ctl.EV_UNPOPULATED, ev) for ev in evs]  # each fills the next unpopulated slot
    ctl.modify_ev_profile(
        h.ctx, ev_id, ctl.EvProfileAttr(ev_op=ctl.EvOp.REPLACE_EV, entries=entries), EM.EV_OP
    )
    ctl.modify_ev_profile(h.ctx, ev_id, ctl.EvProfileAttr(S.ONLINE), EM.STATE)


def make_qp(h: Host, ev_id: int) -> verbs.Qp:
    qp = verbs.create_qp(h.ctx, verbs.QpInitAttr(send_cq=h.cq, recv_cq=h.cq, pd=h.pd, sq_sig_all=True))
    verbs.modify_qp(
        qp,
        verbs.QpAttr(qp_state=verbs.QpState.INIT),
        verbs.QpAttrMask.STATE,
        verbs.MrcQpAttr(ev_profile_id=ev_id, cc_profile_id=0),
        verbs.MrcQpAttrMask.EV_PROFILE_ID | verbs.MrcQpAttrMask.CC_PROFILE_ID | verbs.MrcQpAttrMask.HINT,
    )
    return qp


def connect(qp: verbs.Qp, peer_host: int, dest_qpn: int) -> None:
    Q, M = verbs.QpAttrMask, verbs.MrcQpAttrMask
    verbs.modify_qp(
        qp,
        verbs.QpAttr(qp_state=verbs.QpState.RTR, ah_attr=peer_host, dest_qp_num=dest_qpn, rq_psn=0),  # type: ignore[arg-type]
        Q.STATE | Q.AV | Q.DEST_QPN | Q.RQ_PSN,
        verbs.MrcQpAttr(mpr_dest=8, max_wimm_dest=16),
        M.MPR_DEST | M.MAX_WIMM_DEST,
    )
    verbs.modify_qp(
        qp,
        verbs.QpAttr(qp_state=verbs.QpState.RTS, sq_psn=0),
        Q.STATE | Q.SQ_PSN,
        verbs.MrcQpAttr(mpr=8, max_wimm=16, timeout=14, linear_cnt=7, exp_cnt=7),
        M.MPR | M.MAX_WIMM | M.TIMEOUT | M.RETRY_CNT,
    )


def spine_packets(fabric: FabricSim) -> dict[str, int]:
    t = fabric.topo
    out = {}
    for plane in range(t.planes):
        for j in range(t.uplinks):
            node = fabric.nodes[t.t1(plane, j)]
            assert isinstance(node, Switch)
            out[t.node_name(t.t1(plane, j))] = sum(p.sent_packets for p in node.ports)
    return out


def run(fabric: FabricSim, a: Host, b: Host, section: str) -> bool:
    srh = section == "srh"
    fmt_id, ev_id = PROFILES[section]
    build_profiles(a, fmt_id, ev_id, paths(fabric, a.host, b.host, srh), srh)
    build_profiles(b, fmt_id, ev_id, paths(fabric, b.host, a.host, srh), srh)
    q = ctl.EvProfileAttr(ev_op=ctl.EvOp.QUERY_EV_ARRAY, entry_count=64)
    ctl.query_ev_profile(a.ctx, ev_id, q, EM.EV_OP)
    first = q.entries[0].ev
    da = ipaddress.IPv6Address(first.val[:16])
    seg = f", SRH segment {ipaddress.IPv6Address(first.val[16:])}" if srh else ""
    print(
        f"{section}: EV profile {ev_id} ONLINE, {len(q.entries)} EVs; the first: port {first.port}, {da}{seg}"
    )
    qa, qb = make_qp(a, ev_id), make_qp(b, ev_id)
    connect(qa, b.host, verbs.get_qpn(qb))
    connect(qb, a.host, verbs.get_qpn(qa))
    size = 1 << 20
    src, dst = bytearray(random.Random(ev_id).randbytes(size)), bytearray(size)
    mra = verbs.reg_mr(a.pd, src, int(verbs.Access.LOCAL_WRITE))
    mrb = verbs.reg_mr(b.pd, dst, int(verbs.Access.LOCAL_WRITE | verbs.Access.REMOTE_WRITE))
    before, t0 = spine_packets(fabric), fabric.sim.now
    verbs.post_recv(qb, verbs.RecvWR(1))
    wr = verbs.SendWR(
        1, verbs.WrOpcode.RDMA_WRITE_WITH_IMM, [verbs.Sge(mra.addr, size, mra.lkey)], mrb.addr, mrb.rkey, 7
    )
    verbs.post_send(qa, wr)
    done: list[verbs.WorkCompletion] = []
    for _ in range(1_000_000):  # each poll runs the simulator to its next event
        done += verbs.poll_cq(a.cq, 1) + verbs.poll_cq(b.cq, 1)
        if len(done) == 2:
            break
    ok = len(done) == 2 and all(wc.status == verbs.WcStatus.SUCCESS for wc in done) and dst == src
    after = spine_packets(fabric)
    used = {k: after[k] - before[k] for k in after}
    print(
        f"{section}: 1 MiB Write with Imm in {(fabric.sim.now - t0) / 1000:.1f} us simulated, "
        f"data {'intact' if ok else 'DIFFERS'}; packets per spine: "
        + ", ".join(f"{k} {v}" for k, v in used.items())
    )
    for qp in (qa, qb):
        verbs.destroy_qp(qp)
    verbs.dereg_mr(mra)
    verbs.dereg_mr(mrb)
    misrouted = sum(n.misrouted for n in fabric.nodes if isinstance(n, Switch))
    active = round(fabric.topo.uplinks * NicConfig().active_ev_fraction)  # per plane; the rest are backups
    planes = {k.split("-")[0] for k in used}
    sprayed = all(sum(v > 0 for k, v in used.items() if k.startswith(f"{p}-")) >= active for p in planes)
    return ok and sprayed and misrouted == 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("sections", nargs="*", metavar="SECTION", help="srv6, srh (default: both)")
    args = ap.parse_args(argv)
    bad = [s for s in args.sections if s not in PROFILES]
    if bad:
        ap.error(f"unknown section {bad[0]!r} (choose from srv6, srh)")
    fabric = FabricSim.clos(FabricSimConfig(planes=2, hosts=8, t0_radix=8, t1_radix=8, routing="srv6"))
    t = fabric.topo
    print(
        f"fabric: {t.planes} planes x {t.uplinks} spines, {t.num_hosts} hosts, static uSID tables "
        f"(locator 0x{fabric.plan.locator:08x}); host{SRC} -> host{DST}"  # type: ignore[union-attr]
    )
    a, b = Host(fabric, SRC, "sim-host1"), Host(fabric, DST, "sim-host6")
    try:
        ok = all([run(fabric, a, b, s) for s in args.sections or list(PROFILES)])
    finally:
        a.close()
        b.close()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
