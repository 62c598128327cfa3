"""One Write with Immediate between two processes over openmrc.verbs, every step written out.

    python examples/verbs_pair.py server                  # planes on 127.0.11.1 and 127.0.11.2
    python examples/verbs_pair.py client 127.0.0.1        # planes on 127.0.12.1 and 127.0.12.2

Each side opens a software MRC NIC with one UDP endpoint per plane, makes a PD, a CQ, a QP and a
registered buffer, and tells the other (over a TCP connection, as perftest does) what a peer needs:
its endpoints (`UdpDevice.endpoints()`: an (address, UDP port) per plane), its QP number, and the
buffer's address and R_Key. Both QPs then go RESET -> INIT -> RTR -> RTS; the client Writes its buffer
into the server's with an immediate, which completes a receive on the server.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from dataclasses import dataclass
from typing import Any

from openmrc import verbs
from openmrc.provider import Peer, UdpDevice

SIZE = 1 << 20  # bytes written
SETUP_PORT = int(os.environ.get("VERBS_PAIR_PORT", "18517"))  # TCP, for the exchange only


@dataclass
class Side:
    """One process's NIC, verbs objects and registered buffer."""

    nic: UdpDevice
    dev: verbs.Device
    ctx: verbs.Context
    pd: verbs.ProtectionDomain
    cq: verbs.Cq
    qp: verbs.Qp
    buf: bytearray
    mr: verbs.MemoryRegion


def open_side(addresses: list[str]) -> Side:
    nic = UdpDevice(addresses)  # one address (ADDR or ADDR:PORT) per plane, in plane order
    nic.start()  # a progress thread: the NIC answers its peer even while this program is not polling
    verbs.add_device("mrc0", nic)
    dev = verbs.open_device("mrc0")
    ctx = verbs.create_context(dev, verbs.API_CURRENT_VERSION)
    pd = verbs.alloc_pd(dev)
    cq = verbs.create_cq(ctx, 64)  # room for 64 completions
    qp = verbs.create_qp(ctx, verbs.QpInitAttr(send_cq=cq, recv_cq=cq, pd=pd, sq_sig_all=True))
    buf = bytearray(SIZE)
    mr = verbs.reg_mr(pd, buf, verbs.Access.LOCAL_WRITE | verbs.Access.REMOTE_WRITE)
    # RESET -> INIT: EV profile 0 and CC profile 0 are the device's defaults (128 EVs sprayed, UET NSCC)
    verbs.modify_qp(
        qp,
        verbs.QpAttr(qp_state=verbs.QpState.INIT),
        verbs.QpAttrMask.STATE,
        verbs.MrcQpAttr(ev_profile_id=0, cc_profile_id=0, qp_hint=None),
        verbs.MrcQpAttrMask.EV_PROFILE_ID | verbs.MrcQpAttrMask.CC_PROFILE_ID | verbs.MrcQpAttrMask.HINT,
    )
    return Side(nic, dev, ctx, pd, cq, qp, buf, mr)


def describe(side: Side) -> dict[str, Any]:
    """What the peer needs: this NIC's endpoints (an (address, UDP port) per plane), the QP number, and the
    buffer's virtual address and R_Key."""
    return {
        "endpoints": side.nic.endpoints(),
        "qpn": verbs.get_qpn(side.qp),
        "va": side.mr.addr,
        "rkey": side.mr.rkey,
    }


def connect(side: Side, peer: dict[str, Any]) -> None:
    """INIT -> RTR -> RTS towards the peer the other side described."""
    A, M = verbs.QpAttrMask, verbs.MrcQpAttrMask
    to = Peer.of([(address, port) for address, port in peer["endpoints"]])
    verbs.modify_qp(  # RTR: the peer; receive window (mpr_dest) 8 x 128 PSNs; 128 Writes with Imm at once
        side.qp,
        verbs.QpAttr(qp_state=verbs.QpState.RTR, ah_attr=to, dest_qp_num=peer["qpn"], rq_psn=0),
        A.STATE | A.AV | A.DEST_QPN | A.RQ_PSN,
        verbs.MrcQpAttr(mpr_dest=8, max_wimm_dest=128),
        M.MPR_DEST | M.MAX_WIMM_DEST,
    )
    verbs.modify_qp(  # RTS: ACK timeout 1.024 us x 2^14 = 16.8 ms, 7 retries at it then 7 doubling: 4.4 s
        side.qp,
        verbs.QpAttr(qp_state=verbs.QpState.RTS, sq_psn=0),
        A.STATE | A.SQ_PSN,
        verbs.MrcQpAttr(mpr=8, max_wimm=128, timeout=14, linear_cnt=7, exp_cnt=7),
        M.MPR | M.MAX_WIMM | M.TIMEOUT | M.RETRY_CNT,
    )


def wait(cq: verbs.Cq) -> verbs.WorkCompletion:
    """Poll until a completion comes. (Without `UdpDevice.start()`, polling is what moves the NIC: it
    sends, receives and runs its timers only then, and a peer waiting for an acknowledgement waits too.)"""
    while True:
        for wc in verbs.poll_cq(cq, 1):
            if wc.status != verbs.WcStatus.SUCCESS:
                sys.exit(f"error: {wc.status.name}")
            return wc


def close(side: Side) -> None:
    verbs.destroy_qp(side.qp)
    verbs.dereg_mr(side.mr)
    verbs.destroy_cq(side.cq)
    verbs.destroy_context(side.ctx)
    verbs.dealloc_pd(side.pd)
    verbs.close_device(side.dev)
    verbs.remove_device("mrc0")
    side.nic.close()


def main() -> None:
    args = sys.argv[1:]
    if args[:1] != ["server"] and not (args[:1] == ["client"] and len(args) == 2):
        sys.exit("usage: verbs_pair.py server | verbs_pair.py client SERVER_ADDRESS")
    server = args[0] == "server"
    side = open_side(["127.0.11.1", "127.0.11.2"] if server else ["127.0.12.1", "127.0.12.2"])
    if server:
        with socket.create_server(("", SETUP_PORT)) as listener:
            conn, _ = listener.accept()
    else:
        conn = socket.create_connection((args[1], SETUP_PORT), timeout=10)
    with conn, conn.makefile("rw") as line:
        line.write(json.dumps(describe(side)) + "\n")
        line.flush()
        peer = json.loads(line.readline())
        connect(side, peer)
        if server:
            verbs.post_recv(side.qp, verbs.RecvWR(1))  # one receive per Write with Immediate
            line.write("ready\n")
            line.flush()
            wc = wait(side.cq)
            print(f"received {wc.byte_len} B with immediate 0x{wc.imm_data or 0:x}: {side.buf[:8].hex()}...")
            line.write("done\n")
            line.flush()
        else:
            line.readline()  # "ready": the server's receive is posted
            side.buf[:] = bytes(range(256)) * (SIZE // 256)
            sge = verbs.Sge(side.mr.addr, SIZE, side.mr.lkey)
            wr = verbs.SendWR(
                1, verbs.WrOpcode.RDMA_WRITE_WITH_IMM, [sge], peer["va"], peer["rkey"], 0xC0FFEE
            )
            verbs.post_send(side.qp, wr)
            print(f"wrote {SIZE} B: {wait(side.cq).status.name}")
            line.readline()  # "done": the server saw it, both may close
    close(side)


if __name__ == "__main__":
    main()
