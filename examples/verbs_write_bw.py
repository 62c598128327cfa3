"""RDMA Write bandwidth sweep with openmrc.verbs: OCP's MRC benchmark example as a program.

    python examples/verbs_write_bw.py                  start a server and wait for a client
    python examples/verbs_write_bw.py HOST             connect to the server at HOST (its TCP address)

Each side is a software MRC NIC with one UDP endpoint per plane (``--bind``, once per plane). The client and
server exchange their endpoints, QP numbers, R_Key and buffer address over TCP; the client's first message
also carries its run (the message sizes, ``--iters`` and ``--warmup-iters``), so a server started bare
serves whatever a client asks for (a server's ``--size`` only caps it). Then for every message size from
``--min-size`` to ``--size`` (times ``--step-factor`` each step) the client posts ``--warmup-iters`` and
``--iters`` RDMA Writes, the last of each size a Write with Immediate that marks its end: the server waits
for that immediate (the size) before the client goes on. The client prints a table: message size,
operations, average bandwidth (Gb/s) and message rate. A side that fails tells the other why.
"""

from __future__ import annotations

import argparse
import contextlib
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
    """Device, context, PD, CQ and QP; `register` adds the buffer the Writes go from (or into)."""

    def __init__(self, binds: list[str]) -> None:
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
        verbs.modify_qp(
            self.qp,
            verbs.QpAttr(qp_state=verbs.QpState.INIT),
            verbs.QpAttrMask.STATE,
            verbs.MrcQpAttr(ev_profile_id=0, cc_profile_id=0),
            verbs.MrcQpAttrMask.EV_PROFILE_ID | verbs.MrcQpAttrMask.CC_PROFILE_ID | verbs.MrcQpAttrMask.HINT,
        )

    def register(self, size: int) -> None:
        self.buf = bytearray(size)
        self.mr = verbs.reg_mr(self.pd, self.buf, verbs.Access.LOCAL_WRITE | verbs.Access.REMOTE_WRITE)

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


class ExchangeError(Exception):
    """The set-up exchange went wrong; the message says how (the peer's own reason when it sent one)."""


def _recv(f: Any) -> dict[str, Any]:
    line = f.readline()
    if not line:
        raise ExchangeError("the peer closed the connection")
    try:
        out = json.loads(line)
    except ValueError:
        raise ExchangeError(f"the peer sent something that is not JSON: {line[:60]!r}") from None
    if not isinstance(out, dict):
        raise ExchangeError(f"the peer sent {line[:60]!r}, not a JSON object")
    if "error" in out:
        raise ExchangeError(f"the peer refused: {out['error']}")
    return out


def _expect(f: Any, key: str, value: object) -> None:
    msg = _recv(f)
    if msg.get(key) != value:
        raise ExchangeError(f"expected {{{key!r}: {value!r}}} from the peer, got {msg}")


def _reason(exc: Exception) -> str:
    """Why ``exc`` happened, never empty: a malformed message from the peer is named as such."""
    if isinstance(exc, (KeyError, TypeError, ValueError)):
        return f"the peer's message is malformed ({type(exc).__name__}: {exc})"
    return str(exc) or type(exc).__name__


def _run_of(hello: dict[str, Any], cap: int) -> tuple[list[int], int, int]:
    """The message sizes, iterations and warm-up iterations a client's first message asks for."""
    run = hello.get("run")
    if not isinstance(run, dict):
        raise ExchangeError("the client did not say its message sizes (an older verbs_write_bw.py?)")
    got, iters, warmup = run.get("sizes"), run.get("iters"), run.get("warmup_iters")
    if not isinstance(got, list) or not 1 <= len(got) <= 64 or not all(isinstance(s, int) for s in got):
        raise ExchangeError(f"the client's message sizes {got!r} are not a list of 1..64 integers")
    if not all(1 <= s <= cap for s in got):
        raise ExchangeError(
            f"the client asks for {max(got)} B messages; this server takes 1..{cap} B (--size)"
        )
    if not isinstance(iters, int) or iters < 1 or not isinstance(warmup, int) or warmup < 0:
        raise ExchangeError(f"the client's iterations {iters!r} / {warmup!r}: at least 1 / 0")
    return got, iters, warmup


def sizes(lo: int, hi: int, factor: int) -> list[int]:
    out, s = [], lo
    while s <= hi:
        out.append(s)
        s *= factor
    return out


def server(args: argparse.Namespace) -> int:
    side = Side(args.bind or ["127.0.1.1", "127.0.1.2"])
    side.udp.start()  # the server's NIC makes progress on its own thread
    try:
        with socket.create_server(("0.0.0.0", args.port), reuse_port=False) as ls:
            ends = ", ".join(f"{i}:{p}" for i, p in side.udp.endpoints())
            print(f"waiting for a client on TCP port {args.port} ({ends})")
            sys.stdout.flush()
            conn, addr = ls.accept()
        with conn, conn.makefile("r") as f:
            try:
                peer = _recv(f)
                todo, iters, warmup = _run_of(peer, args.size if args.size_given else 1 << 30)
                side.register(max(todo))
                side.connect(peer)
                _send(conn, side.info())
                for size in todo:
                    verbs.post_recv(side.qp, verbs.RecvWR(size))
                    _send(conn, {"ready": size})
                    _wait_marker(side, size)
                _send(conn, {"done": True})
            except (ExchangeError, KeyError, TypeError, ValueError) as exc:
                why = _reason(exc)
                with contextlib.suppress(OSError):
                    _send(conn, {"error": why})
                print(f"error: client {addr[0]}: {why}", file=sys.stderr)
                return 1
        print(
            f"served {addr[0]}: {len(todo)} sizes, {todo[0]} .. {todo[-1]} B, {warmup} + {iters} Writes each"
        )
        return 0
    finally:
        side.close()


def _wait_marker(side: Side, size: int) -> None:
    """Wait for the Write with Immediate that ends ``size``'s Writes (the size is its immediate)."""
    end = time.monotonic() + 60
    got: list[verbs.WorkCompletion] = []
    while not got and time.monotonic() < end:
        got = verbs.poll_cq(side.cq, 1)
        if not got:
            time.sleep(0.0002)
    if not got:
        raise ExchangeError(f"no end marker for {size} B in 60 s")
    if got[0].status != verbs.WcStatus.SUCCESS or got[0].imm_data != size:
        raise ExchangeError(f"{size} B: the end marker completed {got[0].status.name}, imm {got[0].imm_data}")


def client(args: argparse.Namespace) -> int:
    side = Side(args.bind or ["127.0.2.1", "127.0.2.2"])
    side.register(args.size)
    todo = sizes(args.min_size, args.size, args.step_factor)
    try:
        try:
            conn = socket.create_connection((args.host, args.port), timeout=10)
        except OSError as exc:
            print(f"error: cannot reach the server at {args.host}:{args.port}: {exc}", file=sys.stderr)
            return 1
        conn.settimeout(120)
        with conn, conn.makefile("r") as f:
            run = {"sizes": todo, "iters": args.iters, "warmup_iters": args.warmup_iters}
            _send(conn, {**side.info(), "run": run})
            peer = _recv(f)
            side.connect(peer)
            print(f"\n {'MsgSize':<10} {'TotalOps':<10} {'BW_avg(Gb/s)':<14} {'MsgRate(Mpps)'}")
            for size in todo:
                _expect(f, "ready", size)
                sge = [verbs.Sge(side.mr.addr, size, side.mr.lkey)]
                if _writes(side, sge, peer, args.warmup_iters, None) < 0:  # warm-up, not measured
                    return 1
                t0 = time.perf_counter()
                if _writes(side, sge, peer, args.iters, size) < 0:  # the last one carries the end marker
                    return 1
                dt = max(time.perf_counter() - t0, 1e-9)
                ops = args.iters
                print(f" {size:<10} {ops:<10} {size * ops * 8 / dt / 1e9:<14.3f} {ops / dt / 1e6:.6f}")
                sys.stdout.flush()
            _expect(f, "done", True)
        return 0
    except (ExchangeError, OSError, KeyError, TypeError, ValueError) as exc:
        print(f"error: the exchange with the server failed: {_reason(exc)}", file=sys.stderr)
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
    ap.add_argument("-n", "--iters", type=int, default=100, help="Writes per message size (client)")
    ap.add_argument(
        "-s",
        "--size",
        type=int,
        help="largest message size, bytes (client: default 64 MiB; server: the most it takes, default 1 GiB)",
    )
    ap.add_argument("--min-size", type=int, default=1, help="smallest message size, bytes (client)")
    ap.add_argument("--step-factor", type=int, default=2, help="message size step factor (client)")
    ap.add_argument(
        "-w", "--warmup-iters", type=int, default=1, help="Writes not measured, per size (client)"
    )
    args = ap.parse_args(argv)
    args.size_given = args.size is not None
    if args.size is None:
        args.size = 1 << 26
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
