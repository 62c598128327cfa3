"""RDMA Write bandwidth sweep with openmrc.verbs: OCP's MRC benchmark example as a program.

    python examples/verbs_write_bw.py                  start a server and wait for a client
    python examples/verbs_write_bw.py HOST             connect to the server at HOST (its TCP address)

Each side is a software MRC NIC with one UDP endpoint per plane (``--bind``, once per plane). The client and
server exchange their endpoints, QP numbers, R_Key and buffer address over TCP, then for every message size
from ``--min-size`` to ``--size`` (times ``--step-factor`` each step) the client posts ``--warmup-iters``
and ``--iters`` RDMA Writes, the last of each size a Write with Immediate that marks its end: the server
waits for that immediate (the size) before the client goes on. The client prints a table: message size,
operations, average bandwidth (Gb/s) and message rate.
"""

from __future__ import annotations

import argparse
import json
import random
import socket
import sys
import time
from typing import Any

from openmrc import verbs
from openmrc.provider import Peer, UdpDevice

TX_DEPTH = 128


class Side:
    """Device, context, PD, CQ, QP and a registered buffer of ``size`` bytes."""

    def __init__(self, binds: list[str], size: int) -> None:
        self.udp = UdpDevice(binds)
        self.name = f"mrc-bw-{random.Random().randrange(1 << 30)}"
        verbs.add_device(self.name, self.udp)
        self.dev = verbs.open_device(self.name)
        self.ctx = verbs.create_context(self.dev, verbs.API_CURRENT_VERSION)
        self.pd = verbs.alloc_pd(self.dev)
        self.cq = verbs.create_cq(self.ctx, 4 * TX_DEPTH)
        cap = verbs.QpCap(max_send_wr=TX_DEPTH, max_recv_wr=TX_DEPTH)
        self.qp = verbs.create_qp(
            self.ctx, verbs.QpInitAttr(send_cq=self.cq, recv_cq=self.cq, pd=self.pd, cap=cap)
        )
        self.buf = bytearray(size)
        self.mr = verbs.reg_mr(self.pd, self.buf, verbs.Access.LOCAL_WRITE | verbs.Access.REMOTE_WRITE)
        verbs.modify_qp(
            self.qp,
            verbs.QpAttr(qp_state=verbs.QpState.INIT),
            verbs.QpAttrMask.STATE,
            verbs.MrcQpAttr(ev_profile_id=0, cc_profile_id=0),
            verbs.MrcQpAttrMask.EV_PROFILE_ID | verbs.MrcQpAttrMask.CC_PROFILE_ID | verbs.MrcQpAttrMask.HINT,
        )

    def info(self) -> dict[str, Any]:
        return {
            "endpoints": self.udp.endpoints(),
            "qpn": self.qp.qp_num,
            "rkey": self.mr.rkey,
            "va": self.mr.addr,
        }

    def connect(self, peer: dict[str, Any]) -> None:
        Q, M = verbs.QpAttrMask, verbs.MrcQpAttrMask
        ah = Peer.of(
            [f"{ip}:{port}" if ":" not in ip else f"[{ip}]:{port}" for ip, port in peer["endpoints"]]
        )
        verbs.modify_qp(
            self.qp,
            verbs.QpAttr(qp_state=verbs.QpState.RTR, ah_attr=ah, dest_qp_num=peer["qpn"], rq_psn=0),
            Q.STATE | Q.AV | Q.DEST_QPN | Q.RQ_PSN,
            verbs.MrcQpAttr(
                mpr=8, mpr_dest=8, max_wimm=128, max_wimm_dest=128, cap=verbs.QpCapFlags.DYNAMIC_MPR
            ),
            M.MPR | M.MPR_DEST | M.MAX_WIMM | M.MAX_WIMM_DEST | M.CAP,
        )
        verbs.modify_qp(
            self.qp,
            verbs.QpAttr(qp_state=verbs.QpState.RTS, sq_psn=0),
            Q.STATE | Q.SQ_PSN,
            verbs.MrcQpAttr(mpr=8, max_wimm=128, timeout=14, linear_cnt=7, exp_cnt=25),
            M.MPR | M.MAX_WIMM | M.TIMEOUT | M.RETRY_CNT,
        )

    def close(self) -> None:
        verbs.remove_device(self.name)
        self.udp.close()


def _send(sock: socket.socket, obj: dict[str, Any]) -> None:
    sock.sendall(json.dumps(obj).encode() + b"\n")


def _recv(f: Any) -> dict[str, Any]:
    line = f.readline()
    if not line:
        raise ConnectionError("the peer closed the connection")
    out: dict[str, Any] = json.loads(line)
    return out


def sizes(lo: int, hi: int, factor: int) -> list[int]:
    out, s = [], lo
    while s <= hi:
        out.append(s)
        s *= factor
    return out


def server(args: argparse.Namespace) -> int:
    side = Side(args.bind or ["127.0.1.1", "127.0.1.2"], args.size)
    side.udp.start()  # the server's NIC makes progress on its own thread
    try:
        with socket.create_server(("0.0.0.0", args.port), reuse_port=False) as ls:
            ends = ", ".join(f"{i}:{p}" for i, p in side.udp.endpoints())
            print(f"waiting for a client on TCP port {args.port} ({ends})")
            sys.stdout.flush()
            conn, addr = ls.accept()
        with conn, conn.makefile("r") as f:
            peer = _recv(f)
            side.connect(peer)
            _send(conn, side.info())
            for size in sizes(args.min_size, args.size, args.step_factor):
                verbs.post_recv(side.qp, verbs.RecvWR(size))
                _send(conn, {"ready": size})
                ch_end = time.monotonic() + 60
                got: list[verbs.WorkCompletion] = []
                while not got and time.monotonic() < ch_end:
                    got = verbs.poll_cq(side.cq, 1)
                    if not got:
                        time.sleep(0.0002)
                if not got or got[0].imm_data != size or got[0].status != verbs.WcStatus.SUCCESS:
                    print(f"error: no end marker for {size} B", file=sys.stderr)
                    return 1
            _send(conn, {"done": True})
        print(f"served {addr[0]}")
        return 0
    finally:
        side.close()


def client(args: argparse.Namespace) -> int:
    side = Side(args.bind or ["127.0.2.1", "127.0.2.2"], args.size)
    try:
        try:
            conn = socket.create_connection((args.host, args.port), timeout=10)
        except OSError as exc:
            print(f"error: cannot reach the server at {args.host}:{args.port}: {exc}", file=sys.stderr)
            return 1
        conn.settimeout(120)
        with conn, conn.makefile("r") as f:
            _send(conn, side.info())
            peer = _recv(f)
            side.connect(peer)
            print(f"\n {'MsgSize':<10} {'TotalOps':<10} {'BW_avg(Gb/s)':<14} {'MsgRate(Mpps)'}")
            for size in sizes(args.min_size, args.size, args.step_factor):
                assert _recv(f).get("ready") == size
                sge = [verbs.Sge(side.mr.addr, size, side.mr.lkey)]
                if _writes(side, sge, peer, args.warmup_iters, None) < 0:  # warm-up, not measured
                    return 1
                t0 = time.perf_counter()
                if _writes(side, sge, peer, args.iters, size) < 0:  # the last one carries the end marker
                    return 1
                dt = max(time.perf_counter() - t0, 1e-9)
                ops = args.iters
                print(f" {size:<10} {ops:<10} {size * ops * 8 / dt / 1e9:<14.3f} {ops / dt / 1e6:.4f}")
                sys.stdout.flush()
            assert _recv(f).get("done")
        return 0
    except (ConnectionError, json.JSONDecodeError, AssertionError, OSError) as exc:
        print(f"error: the exchange with the server failed: {exc}", file=sys.stderr)
        return 1
    finally:
        side.close()


def _writes(side: Side, sge: list[verbs.Sge], peer: dict[str, Any], n: int, marker: int | None) -> int:
    """Post ``n`` Writes (at most TX_DEPTH outstanding), the last a Write with Immediate ``marker`` if given,
    and wait for all of them; returns ``n``, or -1 after printing the failed completion."""
    posted = done = 0
    while done < n:
        while posted < n and posted - done < TX_DEPTH:
            last = posted == n - 1 and marker is not None
            op = verbs.WrOpcode.RDMA_WRITE_WITH_IMM if last else verbs.WrOpcode.RDMA_WRITE
            verbs.post_send(
                side.qp, verbs.SendWR(posted, op, sge, peer["va"], peer["rkey"], marker if last else None)
            )
            posted += 1
        for wc in verbs.poll_cq(side.cq, 64):
            if wc.status != verbs.WcStatus.SUCCESS:
                print(f"error: work request {wc.wr_id}: {wc.status.name}", file=sys.stderr)
                return -1
            done += 1
    return n


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("host", nargs="?", help="the server's address (client mode)")
    ap.add_argument("-p", "--port", type=int, default=18515, help="TCP port of the set-up exchange")
    ap.add_argument("--bind", action="append", help="this side's address on a plane (once per plane)")
    ap.add_argument("-n", "--iters", type=int, default=100, help="Writes per message size")
    ap.add_argument("-s", "--size", type=int, default=1 << 26, help="largest message size (bytes)")
    ap.add_argument("--min-size", type=int, default=1, help="smallest message size (bytes)")
    ap.add_argument("--step-factor", type=int, default=2, help="message size step factor")
    ap.add_argument("-w", "--warmup-iters", type=int, default=1, help="Writes not measured, per size")
    args = ap.parse_args(argv)
    if not 0 < args.port < 65536:
        ap.error("--port: 1..65535")
    if not 1 <= args.min_size <= args.size <= 1 << 30:
        ap.error("--min-size and --size: 1 <= min-size <= size <= 1 GiB")
    if args.step_factor < 2 or args.iters < 1 or args.warmup_iters < 0:
        ap.error("--step-factor >= 2, --iters >= 1, --warmup-iters >= 0")
    try:
        return client(args) if args.host else server(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except (OSError, verbs.VerbsError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
