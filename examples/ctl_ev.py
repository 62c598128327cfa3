"""The OCP mrc_ctl.h examples as one program on two software MRC NICs of this machine (two planes each).

    python examples/ctl_ev.py [exp] [gen] [events] [probes] [--stev]

* ``exp``: an EV format profile and an explicit EV profile (the array replaced entry by entry, then
  ONLINE), a QP pair bound to it writing 1 MiB, then a range of EVs DENIED on line;
* ``gen``: a generated EV profile (fields with min/max values), a subset of it DENIED;
* ``events``: an EV event queue while a plane is blackholed and healed (ASSUMED_BAD, then GOOD);
* ``probes``: a batch of EV probes over both planes, with their RTTs: from the probe leaving this NIC to
  its answer arriving (the kernel's receive time), the far end's service time taken out.

With no section named, all four run. ``--stev`` uses STEV EVs (IPv6 flow label + UDP source port) on
IPv6 loopback endpoints instead of UDP-mode EVs on 127.0.0.x. Controller calls need root, or, as here,
``ctl.grant`` for a software NIC this process owns.
"""

from __future__ import annotations

import argparse
import random
import sys
import time

from openmrc import ctl, verbs
from openmrc.ev import EVField, EVFormatMode, EVProfileMode, EVState
from openmrc.provider import Peer, UdpDevice

S = ctl.ProfileState
EM = ctl.EvProfileAttrMask
FM = ctl.EvFmtProfileAttrMask
FMT_ID, EXP_ID, GEN_ID = 13, 1, 2


class Node:
    def __init__(self, name: str, endpoints: list[str]) -> None:
        self.udp = UdpDevice(endpoints)
        self.name = name
        verbs.add_device(name, self.udp)
        self.dev = verbs.open_device(name)
        self.ctx = verbs.create_context(self.dev, verbs.API_CURRENT_VERSION)
        ctl.grant(self.dev)
        self.pd = verbs.alloc_pd(self.dev)
        self.cq = verbs.create_cq(self.ctx, 256)

    def qp(self, ev_profile: int) -> verbs.Qp:
        qp = verbs.create_qp(self.ctx, verbs.QpInitAttr(send_cq=self.cq, recv_cq=self.cq, pd=self.pd))
        verbs.modify_qp(
            qp,
            verbs.QpAttr(qp_state=verbs.QpState.INIT),
            verbs.QpAttrMask.STATE,
            verbs.MrcQpAttr(ev_profile_id=ev_profile, cc_profile_id=0),
            verbs.MrcQpAttrMask.EV_PROFILE_ID | verbs.MrcQpAttrMask.CC_PROFILE_ID | verbs.MrcQpAttrMask.HINT,
        )
        return qp

    def connect(self, qp: verbs.Qp, peer: Node, dest_qpn: int) -> None:
        Q, M = verbs.QpAttrMask, verbs.MrcQpAttrMask
        verbs.modify_qp(
            qp,
            verbs.QpAttr(
                qp_state=verbs.QpState.RTR,
                ah_attr=Peer.of(peer.udp.endpoints()),
                dest_qp_num=dest_qpn,
                rq_psn=0,
            ),
            Q.STATE | Q.AV | Q.DEST_QPN | Q.RQ_PSN,
            verbs.MrcQpAttr(mpr_dest=8, max_wimm_dest=128),
            M.MPR_DEST | M.MAX_WIMM_DEST,
        )
        verbs.modify_qp(
            qp,
            verbs.QpAttr(qp_state=verbs.QpState.RTS, sq_psn=0),
            Q.STATE | Q.SQ_PSN,
            verbs.MrcQpAttr(mpr=8, max_wimm=128, timeout=14, linear_cnt=7, exp_cnt=25),
            M.MPR | M.MAX_WIMM | M.TIMEOUT | M.RETRY_CNT,
        )


def ev_value(i: int, stev: bool, port: int) -> ctl.Ev:
    # STEV: the example's 32-bit (i << 16 | i) value; UDP mode: a 16-bit source port per index
    return ctl.Ev.of((i << 16 | i) + 0x4000_4000, 4, port) if stev else ctl.Ev.of(0xC000 + i, 2, port)


def setup_format(n: Node, stev: bool) -> None:
    mode, widths = (EVFormatMode.STEV, [16, 16]) if stev else (EVFormatMode.UDP, [16])
    attr = ctl.EvFmtProfileAttr(S.OFFLINE, ev_fmt_mode=mode, op=ctl.EvFmtOp.MODIFY_FIELDS, fmt_fields=widths)
    ctl.modify_ev_fmt_profile(n.ctx, FMT_ID, attr, FM.STATE | FM.MODE | FM.OP)
    ctl.modify_ev_fmt_profile(n.ctx, FMT_ID, ctl.EvFmtProfileAttr(S.ONLINE), FM.STATE)


def explicit(a: Node, b: Node, stev: bool) -> None:
    count = 64
    for n in (a, b):
        setup_format(n, stev)
        ctl.modify_ev_profile(
            n.ctx,
            EXP_ID,
            ctl.EvProfileAttr(
                S.OFFLINE,
                ev_mode=EVProfileMode.EXP,
                ev_fmt_profile_id=FMT_ID,
                ev_count=count,
                ev_min_active=count // 4,
                ev_event_mask=int(EVState.GOOD | EVState.ASSUMED_BAD),
            ),
            EM.STATE | EM.MODE | EM.FMT_ID | EM.COUNT | EM.MIN_ACTIVE | EM.EVENT_MASK,
        )
        for i in range(count):  # replace the first unpopulated entry, one EV at a time, ports alternating
            entry = ctl.EvOpEntry(ctl.EV_UNPOPULATED, ev_value(i, stev, 1 + i % 2))
            ctl.modify_ev_profile(
                n.ctx, EXP_ID, ctl.EvProfileAttr(ev_op=ctl.EvOp.REPLACE_EV, entries=[entry]), EM.EV_OP
            )
        ctl.modify_ev_profile(n.ctx, EXP_ID, ctl.EvProfileAttr(S.ONLINE), EM.STATE)
    print(f"exp: EV profile {EXP_ID} ONLINE with {count} explicit EVs over format profile {FMT_ID}")
    qa, qb = a.qp(EXP_ID), b.qp(EXP_ID)
    a.connect(qa, b, qb.qp_num)
    b.connect(qb, a, qa.qp_num)
    src, dst = bytearray(random.Random(2).randbytes(1 << 20)), bytearray(1 << 20)
    mra = verbs.reg_mr(a.pd, src, int(verbs.Access.LOCAL_WRITE))
    mrb = verbs.reg_mr(b.pd, dst, int(verbs.Access.LOCAL_WRITE | verbs.Access.REMOTE_WRITE))
    wr = verbs.SendWR(
        1, verbs.WrOpcode.RDMA_WRITE, [verbs.Sge(mra.addr, len(src), mra.lkey)], mrb.addr, mrb.rkey
    )
    verbs.post_send(qa, wr)
    wcs = drive(a, b, lambda: verbs.poll_cq(a.cq, 1))
    print(
        f"exp: 1 MiB Write over profile {EXP_ID}: {wcs[0].status.name if wcs else 'TIMEOUT'}, "
        f"data {'intact' if dst == src else 'DIFFERS'}"
    )
    deny = [ctl.EvOpEntry(ev_value(i, stev, 1 + i % 2), state=EVState.DENIED) for i in range(13, 43)]
    ctl.modify_ev_profile(
        a.ctx, EXP_ID, ctl.EvProfileAttr(ev_op=ctl.EvOp.MODIFY_EV_STATE, entries=deny), EM.EV_OP
    )
    denied = sum(1 for s in qa.core.ev_states() if s.state is EVState.DENIED)
    print(f"exp: EVs 13..42 DENIED on line; the bound QP now has {denied} denied EVs")
    for qp in (qa, qb):
        verbs.destroy_qp(qp)
    verbs.dereg_mr(mra)
    verbs.dereg_mr(mrb)


def generated(a: Node, stev: bool) -> None:
    if not stev:
        fields = [EVField(width=16, init_val=0xC000, min_val=0x200, max_val=0x3FF, mask=0x03FF)]
    else:
        fields = [
            EVField(width=16, init_val=0x4000, min_val=0, max_val=0xFF, mask=0x00FF),
            EVField(width=16, init_val=0xC000, min_val=0, max_val=0xFF, mask=0x00FF),
        ]
    attr = ctl.EvProfileAttr(
        S.OFFLINE,
        ev_mode=EVProfileMode.GEN,
        ev_fmt_profile_id=FMT_ID,
        ev_count=128,
        ev_min_active=32,
        ev_event_mask=int(EVState.ASSUMED_BAD),
    )
    ctl.modify_ev_profile(a.ctx, GEN_ID, attr, EM.MODE | EM.FMT_ID | EM.COUNT | EM.MIN_ACTIVE | EM.EVENT_MASK)
    fields_attr = ctl.EvProfileAttr(S.OFFLINE, ev_fields_op=ctl.EvFieldsOp.MODIFY_FIELDS, fields=fields)
    ctl.modify_ev_profile(a.ctx, GEN_ID, fields_attr, EM.STATE | EM.EV_FIELDS_OP)
    ctl.modify_ev_profile(a.ctx, GEN_ID, ctl.EvProfileAttr(S.ONLINE), EM.STATE)
    arr = ctl.EvProfileAttr(ev_op=ctl.EvOp.QUERY_EV_ARRAY, entry_count=16)
    try:
        ctl.query_ev_profile(a.ctx, GEN_ID, arr, EM.EV_OP)
    except ctl.CtlError as exc:  # the array is larger: ask again with the size the error names
        print(f"gen: QUERY_EV_ARRAY with room for 16: {exc.errno_name}, {exc.needed} needed")
        arr.entry_count = exc.needed
        ctl.query_ev_profile(a.ctx, GEN_ID, arr, EM.EV_OP)
    subset = [ctl.EvOpEntry(e.ev, state=EVState.DENIED) for e in arr.entries[::4]]
    ctl.modify_ev_profile(
        a.ctx, GEN_ID, ctl.EvProfileAttr(ev_op=ctl.EvOp.MODIFY_EV_STATE, entries=subset), EM.EV_OP
    )
    check = [ctl.EvOpEntry(e.ev) for e in arr.entries[:4]]
    ctl.query_ev_profile(
        a.ctx, GEN_ID, ctl.EvProfileAttr(ev_op=ctl.EvOp.QUERY_EV_STATE, entries=check), EM.EV_OP
    )
    print(
        f"gen: {len(arr.entries)} generated EVs, {len(subset)} DENIED; "
        f"first four: {', '.join(e.state.name for e in check)}"
    )


def events(a: Node, b: Node, stev: bool) -> None:
    if EXP_ID not in a.udp.nic.ev_profiles:
        explicit(a, b, stev)
    evq = ctl.create_ev_event_cq(a.ctx, 1024)
    qa, qb = a.qp(EXP_ID), b.qp(EXP_ID)
    a.connect(qa, b, qb.qp_num)
    b.connect(qb, a, qa.qp_num)
    src, dst = bytearray(8 << 20), bytearray(8 << 20)
    mra = verbs.reg_mr(a.pd, src, int(verbs.Access.LOCAL_WRITE))
    mrb = verbs.reg_mr(b.pd, dst, int(verbs.Access.LOCAL_WRITE | verbs.Access.REMOTE_WRITE))
    wr = verbs.SendWR(
        2, verbs.WrOpcode.RDMA_WRITE, [verbs.Sge(mra.addr, len(src), mra.lkey)], mrb.addr, mrb.rkey
    )
    a.udp.blackhole_port(2, seconds=0.3)  # plane 2 loses everything for 300 ms
    verbs.post_send(qa, wr)
    seen: list[ctl.CtlEvEvent] = []
    done = False
    end = time.monotonic() + 20
    while time.monotonic() < end:  # until the Write is done and every EV that went bad is GOOD again
        seen += ctl.poll_ev_event(evq, 64)
        b.udp.progress(0)
        done = done or bool(verbs.poll_cq(a.cq, 1))
        now_bad = {e.ev for e in seen if e.state is EVState.ASSUMED_BAD}
        if (
            done
            and now_bad
            and all(any(g.ev == ev and g.state is EVState.GOOD for g in seen) for ev in now_bad)
        ):
            break
    bad = sum(1 for e in seen if e.state is EVState.ASSUMED_BAD)
    good = sum(1 for e in seen if e.state is EVState.GOOD)
    print(
        f"events: plane 2 blackholed 300 ms: {bad} ASSUMED_BAD and {good} GOOD events "
        f"(dropped: {sum(e.drop_count for e in seen)})"
    )
    for qp in (qa, qb):
        verbs.destroy_qp(qp)
    verbs.dereg_mr(mra)
    verbs.dereg_mr(mrb)
    verbs.destroy_cq(evq)


def probes(a: Node, b: Node, stev: bool) -> None:
    b.udp.add_peer(Peer.of(a.udp.endpoints()))  # answers go to a's ports (not the sender's address's 4791)
    b.udp.start()  # the far end answers from its own progress thread
    peer = Peer.of(b.udp.endpoints())
    mode = EVFormatMode.STEV if stev else EVFormatMode.UDP
    reqs = [ctl.EpReq(p, peer, ev_value(900 + p, stev, p), mode) for p in (1, 2)]
    rsps = ctl.ep_batch_send_wait(a.ctx, 0, ctl.EpOpType.EV_PROBE, reqs, 2_000_000_000)
    for r in rsps:
        svc = "taken out" if r.adj_svc_time else "included"
        print(
            f"probes: req {r.req_id} answered on port {r.port}: rtt {r.rtt / 1000:.1f} us "
            f"(probe sent -> answer received, the far end's service time {svc})"
        )
    b.udp.stop()


def drive(a: Node, b: Node, done, timeout: float = 30.0):  # type: ignore[no-untyped-def]
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = done()
        if got:
            return got
        b.udp.progress(0)
    return []


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("sections", nargs="*", metavar="SECTION", help="exp, gen, events, probes (default: all)")
    ap.add_argument("--stev", action="store_true", help="STEV EVs on IPv6 loopback endpoints")
    args = ap.parse_args(argv)
    known = ["exp", "gen", "events", "probes"]
    for name in args.sections:
        if name not in known:
            ap.error(f"section {name!r}: one of {', '.join(known)}")
    sections = args.sections or known
    net = random.Random().randrange(2, 250)
    if args.stev:
        base = random.Random().randrange(20000, 30000, 100)
        ends = ([f"[::1]:{base + 1}", f"[::1]:{base + 2}"], [f"[::1]:{base + 51}", f"[::1]:{base + 52}"])
    else:
        ends = ([f"127.{net}.1.1", f"127.{net}.2.1"], [f"127.{net}.1.2", f"127.{net}.2.2"])
    try:
        a, b = Node(f"ctl-a-{net}", ends[0]), Node(f"ctl-b-{net}", ends[1])
    except OSError as exc:
        print(f"error: cannot open the devices' sockets: {exc}", file=sys.stderr)
        return 1
    try:
        attr = ctl.query_device(a.dev)
        print(
            f"device {a.name}: CC {', '.join(attr.algorithms)}; EV modes {attr.ev_mode_mask:#x}, "
            f"formats {attr.ev_fmt_mode_mask:#x}; ports {attr.phy_port_mask:#x}"
        )
        if "exp" in sections or "gen" in sections:
            explicit(a, b, args.stev) if "exp" in sections else setup_format(a, args.stev)
        if "gen" in sections:
            generated(a, args.stev)
        if "events" in sections:
            events(a, b, args.stev)
        if "probes" in sections:
            probes(a, b, args.stev)
        return 0
    except (verbs.VerbsError, ctl.CtlError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        for n in (a, b):
            verbs.remove_device(n.name)
            n.udp.close()


if __name__ == "__main__":
    sys.exit(main())
