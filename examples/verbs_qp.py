"""QP management with openmrc.verbs, following the OCP example "MRC QP Management" step by step.

Two software MRC NICs on this machine (two planes each, 127.0.0.x addresses) are registered as devices;
the program opens one by name, queries it, allocates a PD, creates an MRC context, a CQ and a QP, moves the
QP through INIT, RTR and RTS with the example's attribute values (EV and CC profile ids from the
environment variables MRC_QP_EV_PROFILE_ID and MRC_QP_CC_PROFILE_ID, 0 when unset), queries it, writes a
message with an immediate to the peer QP, and destroys everything in order.

    python examples/verbs_qp.py [--size BYTES]
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time

from openmrc import verbs
from openmrc.provider import Peer, UdpDevice


def _env_id(name: str) -> int:
    text = os.environ.get(name, "0")
    try:
        value = int(text, 10)
    except ValueError:
        sys.exit(f"error: {name}={text!r} is not a profile id (a decimal number)")
    if value < 0:
        sys.exit(f"error: {name}={text!r} is not a profile id (a decimal number >= 0)")
    return value


class Endpoint:
    """One side: device, context, PD, CQ, QP and a registered buffer."""

    def __init__(self, name: str, size: int) -> None:
        self.dev = verbs.open_device(name)  # ibv_open_device
        attr = verbs.query_device(self.dev)  # mrc_query_device
        if not attr.supported:
            sys.exit(f"error: {name} does not support MRC")
        self.pd = verbs.alloc_pd(self.dev)
        self.ctx = verbs.create_context(self.dev, verbs.API_CURRENT_VERSION)
        self.cq = verbs.create_cq(self.ctx, 128)
        init = verbs.QpInitAttr(
            send_cq=self.cq,
            recv_cq=self.cq,
            pd=self.pd,
            sq_sig_all=True,
            cap=verbs.QpCap(max_send_wr=128, max_recv_wr=128, max_send_sge=1, max_recv_sge=1),
            send_ops_flags=verbs.SendOpsFlags.WITH_RDMA_WRITE | verbs.SendOpsFlags.WITH_RDMA_WRITE_WITH_IMM,
        )
        self.qp = verbs.create_qp(self.ctx, init)  # in RESET
        self.buf = bytearray(size)
        self.mr = verbs.reg_mr(self.pd, self.buf, verbs.Access.LOCAL_WRITE | verbs.Access.REMOTE_WRITE)

    def to_init(self, ev_profile_id: int, cc_profile_id: int) -> None:
        verbs.modify_qp(
            self.qp,
            verbs.QpAttr(qp_state=verbs.QpState.INIT),
            verbs.QpAttrMask.STATE,
            verbs.MrcQpAttr(ev_profile_id=ev_profile_id, cc_profile_id=cc_profile_id, qp_hint=None),
            verbs.MrcQpAttrMask.EV_PROFILE_ID | verbs.MrcQpAttrMask.CC_PROFILE_ID | verbs.MrcQpAttrMask.HINT,
        )

    def to_rts(self, peer: Peer, dest_qpn: int) -> None:
        M = verbs.MrcQpAttrMask
        verbs.modify_qp(
            self.qp,
            verbs.QpAttr(qp_state=verbs.QpState.RTR, ah_attr=peer, dest_qp_num=dest_qpn, rq_psn=0),
            verbs.QpAttrMask.STATE
            | verbs.QpAttrMask.AV
            | verbs.QpAttrMask.DEST_QPN
            | verbs.QpAttrMask.RQ_PSN,
            verbs.MrcQpAttr(
                mpr=8, mpr_dest=8, max_wimm=128, max_wimm_dest=128, cap=verbs.QpCapFlags.DYNAMIC_MPR
            ),
            M.MPR | M.MPR_DEST | M.MAX_WIMM | M.MAX_WIMM_DEST | M.CAP,
        )
        verbs.modify_qp(
            self.qp,
            verbs.QpAttr(qp_state=verbs.QpState.RTS, sq_psn=0),
            verbs.QpAttrMask.STATE | verbs.QpAttrMask.SQ_PSN,
            # timeout 14: 16.8 ms (OCP's example has 8, 262 µs: below a software NIC's 8.39 ms floor, which a
            # QP asking for less gets instead, with an AckTimeoutWarning); exp_cnt 25: retry for ever
            verbs.MrcQpAttr(mpr=8, max_wimm=128, timeout=14, linear_cnt=7, exp_cnt=25),
            M.MPR | M.MAX_WIMM | M.TIMEOUT | M.RETRY_CNT,
        )

    def close(self) -> None:
        verbs.destroy_qp(self.qp)
        verbs.dereg_mr(self.mr)
        verbs.destroy_cq(self.cq)
        verbs.destroy_context(self.ctx)
        verbs.dealloc_pd(self.pd)
        verbs.close_device(self.dev)


def _ver(v: int) -> str:
    return f"{v >> 24}.{(v >> 16) & 0xFF}.{v & 0xFFFF}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", type=int, default=1 << 20, help="bytes to write (1 .. 64 MiB)")
    args = ap.parse_args(argv)
    if not 1 <= args.size <= 64 << 20:
        ap.error("--size: 1 .. 67108864 bytes")
    ev_id, cc_id = _env_id("MRC_QP_EV_PROFILE_ID"), _env_id("MRC_QP_CC_PROFILE_ID")
    net = random.Random().randrange(2, 250)
    dev_a = UdpDevice([f"127.{net}.1.1", f"127.{net}.2.1"])
    dev_b = UdpDevice([f"127.{net}.1.2", f"127.{net}.2.2"])
    names = (f"mrc-{net}-a", f"mrc-{net}-b")
    verbs.add_device(names[0], dev_a)
    verbs.add_device(names[1], dev_b)
    try:
        cur, last, vendor, _ = verbs.query_version()
        print(f"mrc API {_ver(cur)} (oldest served {_ver(last)}), vendor API {_ver(vendor)}")
        print("devices:", ", ".join(verbs.get_device_list()))
        a, b = Endpoint(names[0], args.size), Endpoint(names[1], args.size)
        attr = verbs.query_device(a.dev)
        print(
            f"{names[0]}: protocol versions {int(attr.protocol_version):#x}, max_wimm {attr.max_wimm}, "
            f"max_mpr {attr.max_mpr} x 128 PSNs, max QP hints {attr.max_qp_hint}, caps {attr.cap.name}"
        )
        try:
            a.to_init(ev_id, cc_id)
            b.to_init(ev_id, cc_id)
        except verbs.VerbsError as exc:
            print(f"error: INIT with EV profile {ev_id}, CC profile {cc_id}: {exc}", file=sys.stderr)
            return 1
        a.to_rts(Peer.of(dev_b.endpoints()), verbs.get_qpn(b.qp))
        b.to_rts(Peer.of(dev_a.endpoints()), verbs.get_qpn(a.qp))
        q = verbs.query_qp(
            a.qp,
            verbs.QpAttrMask.STATE | verbs.QpAttrMask.DEST_QPN,
            int(verbs.MrcQpAttrMask.MPR | verbs.MrcQpAttrMask.TIMEOUT | verbs.MrcQpAttrMask.RETRY_CNT),
        )
        m = q.mrc_attr
        print(
            f"QP 0x{verbs.get_qpn(a.qp):06x}: {q.attr.qp_state.name if q.attr.qp_state else '?'} towards "
            f"0x{q.attr.dest_qp_num or 0:06x}, mpr {m.mpr}, timeout {m.timeout}, "
            f"retries {m.linear_cnt}+{m.exp_cnt}"
        )
        a.buf[:] = random.Random(1).randbytes(args.size)
        verbs.post_recv(b.qp, verbs.RecvWR(1))
        wr = verbs.SendWR(
            7,
            verbs.WrOpcode.RDMA_WRITE_WITH_IMM,
            [verbs.Sge(a.mr.addr, args.size, a.mr.lkey)],
            b.mr.addr,
            b.mr.rkey,
            0x1234,
        )
        t0 = time.perf_counter()
        verbs.post_send(a.qp, wr)
        got: list[verbs.WorkCompletion] = []
        sent: list[verbs.WorkCompletion] = []
        while not (got and sent) and time.perf_counter() - t0 < 30:
            sent += verbs.poll_cq(a.cq, 1)
            got += verbs.poll_cq(b.cq, 1)
        dt = time.perf_counter() - t0
        if not (got and sent):
            print("error: the Write did not complete within 30 s", file=sys.stderr)
            return 1
        ok = b.buf == a.buf and got[0].imm_data == 0x1234 and sent[0].status == verbs.WcStatus.SUCCESS
        print(
            f"Write with Imm of {args.size} B: {sent[0].status.name} / {got[0].status.name}, "
            f"imm 0x{got[0].imm_data or 0:x}, {args.size * 8 / dt / 1e9:.2f} Gb/s, "
            f"data {'intact' if ok else 'DIFFERS'}"
        )
        for side in (a, b):
            side.close()
        print("destroyed QPs, MRs, CQs, contexts, PDs; closed devices")
        return 0 if ok else 1
    finally:
        for name in names:
            verbs.remove_device(name)
        dev_a.close()
        dev_b.close()


if __name__ == "__main__":
    sys.exit(main())
