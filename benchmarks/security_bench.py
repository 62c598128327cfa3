"""Authenticated MRC: forged packets against an authenticated transfer, what authentication costs in goodput,
and key rotation during a transfer.

    python benchmarks/security_bench.py [--json] [--forged 10000] [--mib 64] [--iters 16] [--pairs 3]
                                        [--no-goodput]

1. *Forgeries* (the pair harness, packets as bytes with the real ICRC; ``--forged 0`` leaves them out): an
   8 MiB authenticated Write with 1 % loss while an adversary delivers ``--forged`` packets of its own
   beside the genuine ones, each sealed with a correct ICRC for the addresses it claims, live QP numbers
   and in-window PSNs: replays of genuine packets, genuine packets with one bit flipped, the plain MRC 1.0
   packet inside a genuine one with its payload changed, and packets sealed under the domain's SDI with a
   key of the adversary's own, in turn. Against the same run without the adversary: ``forged_effect`` is 0
   when the transfer finished at the same simulated time with the same retransmissions and bytes (every
   forgery dropped before it changed anything); ``forged_refused`` counts what the NICs dropped and
   counted, by reason. The same adversary against the same transfer *without* authentication (MRC 1.0) for
   contrast: ``plain_*``.
2. *Goodput* (``openmrc perf`` between two processes, 4 planes, one QP, ``--iters`` Writes of ``--mib``
   MiB): plain, ``--secure`` (authentication; header tags "auto", what ``--secure`` does by default: none
   on loopback, where nothing trims), ``--secure --header-tag`` (a header tag on every data packet, one
   AES-GCM call more per packet: what a fabric that trims costs) and ``--secure --encrypt``, in
   ``--pairs`` rounds of the four back to back, quietly and then with one busy process beside them;
   ``auth_ratio``, ``auth_htag_ratio`` and ``encrypt_ratio`` are the medians of each round's secure /
   plain goodput (the machine is shared: each ratio compares runs made seconds apart).
3. *Rotation* (two software NICs on loopback sockets, 4 planes): a 64 MiB authenticated Write during which
   the sender's side rotates its key every 20 ms and the receiver's side follows 5 ms later (two processes'
   controllers are never in step): ``rotations``, ``rotation_refused`` (packets refused for their epoch:
   0) and ``rotation_retransmits`` against ``norotation_retransmits`` of the same Write without rotation.

Compiled modules (``make native``) are used when present; ``OPENMRC_PURE=1`` measures the interpreted core.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import random
import statistics
import sys
import threading
import time
from typing import Any

from _busy import busy_process
from openmrc import _native
from openmrc.provider.loopback import Impairments, Pair, port_address
from openmrc.provider.perf import PerfError, run_client, serve
from openmrc.provider.udp import Peer, UdpDevice
from openmrc.transport import Access, QpSecurity, SecurityDomain, SendWR, Sge, Transmit, WrOpcode
from openmrc.transport.security import SealState
from openmrc.wire import Addressing, parse, seal
from openmrc.wire.constants import is_data_opcode
from openmrc.wire.datagram import data_header_length
from openmrc.wire.security import (
    SEAL_OVERHEAD,
    SECH_SIZE,
    trailer_length,
    unpack_sech,
)

KINDS = ("replay", "bit_flip", "plain_mrc", "wrong_key")


# -- 1. forgeries --------------------------------------------------------------------------------------------
class Adversary:
    """Delivers ``per`` forged packets beside every genuine one it sees, kinds in turn, until ``total``."""

    def __init__(self, p: Pair, total: int, per: int, sealed: bool) -> None:
        self.p, self.total, self.per, self.sealed = p, total, per, sealed
        self.rng = random.Random(7)
        self.seen: list[tuple[bytes, int, dict[str, Any]]] = []
        self.sent = dict.fromkeys(KINDS, 0)
        self.key = self.rng.randbytes(32)
        p.fabric.observers.append(self.observe)

    def trailer(self, raw: bytes) -> int:
        return trailer_length(raw[:-4]) if self.sealed else 0

    def forge(self, kind: str, raw: bytes, src: str) -> bytes:
        rng = self.rng
        body = bytearray(raw[:-4])
        if kind == "bit_flip":
            i = rng.randrange(len(body))
            body[i] ^= 1 << rng.randrange(8)
        elif kind == "plain_mrc":  # what an MRC 1.0 QP takes: the packet inside, its payload changed
            body = body[: len(body) - self.trailer(raw)]
            if is_data_opcode(body[0]) and len(body) > data_header_length(body) + 8:
                body[-8:] = b"FORGED!!"
        elif kind == "wrong_key" and self.sealed:  # sealed as a genuine QP seals, with a key of its own
            h = unpack_sech(body[len(body) - SEAL_OVERHEAD : len(body) - SEAL_OVERHEAD + SECH_SIZE])
            qpn = self.p.qp_a.qp_num if src == "a" else self.p.qp_b.qp_num
            own = SealState(qpn, QpSecurity(SecurityDomain(h.sdi, self.key, epoch=h.epoch), ssi=h.ssi))
            own.sent = h.counter + 10_000 - 1
            plain = parse(bytes(body[: len(body) - self.trailer(raw)]) + bytes(4))
            t = Transmit(1, None, bytes(32), 0, plain, qpn)
            own.seal(t, 0)
            body = bytearray(t.body or b"")
        # (without authentication there is no key to get wrong: "wrong_key" is one more replay)
        return bytes(body) + bytes(4)

    def observe(self, dst: Any, obj: object, port: int, now: int, kw: dict[str, Any]) -> None:
        if not isinstance(obj, bytes) or kw["trim"]:
            return
        self.seen.append((obj, port, dict(kw)))
        for _ in range(self.per):
            n = sum(self.sent.values())
            if n >= self.total:
                return
            kind = KINDS[n % len(KINDS)]
            raw, rport, rkw = self.seen[self.rng.randrange(len(self.seen))]
            src = str(rkw["src"])
            addr = Addressing(
                port_address(src, rport),
                port_address("b" if src == "a" else "a", rport),
                rkw["entropy"] & 0xFFFF,
            )
            target = self.p.b if src == "a" else self.p.a
            target.receive_datagram(
                seal(self.forge(kind, raw, src), addr),
                rport,
                now,
                addr,
                flow_label=rkw["entropy"] >> 16,
                src=src,
            )
            self.sent[kind] += 1


def _transfer(secure: bool, forged: int) -> tuple[Pair, Adversary | None]:
    dom = SecurityDomain(1, bytes(range(32)))
    sec = (QpSecurity(dom, ssi=11), QpSecurity(dom, ssi=22)) if secure else None
    size = 8 << 20
    p = Pair(seed=5, wire=True, buf_size=size, imp=Impairments(loss=0.01), security=sec)
    adv = Adversary(p, forged, 4, secure) if forged else None
    p.post_recv(1)
    p.write(0, size, imm=1)
    p.run(lambda: len(p.qp_a.send_cq) >= 1 and (len(p.qp_b.recv_cq) >= 1 or p.qp_a.state.name == "ERROR"))
    if adv is not None:
        while sum(adv.sent.values()) < forged and p.step():  # the rest after the transfer, as it winds down
            pass
    return p, adv


def forgeries(total: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for secure in (True, False):
        ref, _ = _transfer(secure, 0)
        p, adv = _transfer(secure, total)
        assert adv is not None
        done = p.completions()
        status = done[0].status.name if done else None
        exact = p.dst == p.src
        pre = "" if secure else "plain_"
        same = p.now == ref.now and p.a.stats.retransmits == ref.a.stats.retransmits and exact
        if secure:
            out["forged"] = sum(adv.sent.values())
            out["forged_by_kind"] = adv.sent
            out["forged_effect"] = 0 if same and status == "SUCCESS" else 1
            out["forged_refused"] = {
                k: getattr(p.a.stats, k) + getattr(p.b.stats, k)
                for k in (
                    "rx_auth_failed",
                    "rx_auth_replayed",
                    "rx_auth_epoch",
                    "rx_auth_unsealed",
                    "rx_dropped_no_qp",
                    "rx_malformed",
                    "rx_dropped_state",
                    "rx_bogus_ack",
                )
            }
        out[f"{pre}status"] = status
        out[f"{pre}bit_exact"] = exact
        out[f"{pre}same_as_without_adversary"] = same
        out[f"{pre}retransmits"] = p.a.stats.retransmits
        out[f"{pre}reference_retransmits"] = ref.a.stats.retransmits
    return out


# -- 2. goodput ----------------------------------------------------------------------------------------------
def _server(binds: list[str], q: Any, spec: str) -> None:
    dom = SecurityDomain.from_spec(spec) if spec else None
    serve(binds, oob=("127.0.0.1", 0), log=lambda s: None, ready=q.put, security=dom)


def goodput(spec: str, mib: int, iters: int, base: int, mode: str) -> float:
    binds_s = [f"127.{base}.1.{p}" for p in range(1, 5)]
    binds_c = [f"127.{base}.2.{p}" for p in range(1, 5)]
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    srv = ctx.Process(target=_server, args=(binds_s, q, spec), daemon=True)
    srv.start()
    dom = SecurityDomain.from_spec(spec) if spec else None
    try:
        addr = q.get(timeout=30)
        rep = run_client(
            addr,
            binds_c,
            [mib << 20],
            iters=iters,
            security=None if mode == "plain" else dom,
            encrypt=mode == "encrypt",
            header_tag=True if mode == "auth_htag" else "auto",
        )
    except PerfError as exc:
        print(f"{mode}: {exc}", file=sys.stderr)
        return 0.0
    finally:
        srv.terminate()
        srv.join(10)
    if not rep.hash_ok:
        print(f"{mode}: the server's buffer differs", file=sys.stderr)
        return 0.0
    return rep.results[0].bw_avg_gbps


def goodputs(mib: int, iters: int, pairs: int, busy: bool, base: int) -> dict[str, Any]:
    """``pairs`` rounds of plain, auth, encrypt: the medians and the median ratios."""
    # (a secure server takes secure clients only: the plain runs use a plain server)
    spec = SecurityDomain.generate(9).spec()
    rows: dict[str, list[float]] = {"plain": [], "auth": [], "auth_htag": [], "encrypt": []}
    with busy_process(busy):
        for r in range(pairs):
            for i, mode in enumerate(rows):
                rows[mode].append(
                    goodput(spec if mode != "plain" else "", mib, iters, base + 4 * r + i, mode)
                )
    sfx = "_contended" if busy else ""
    ratio = {
        m: statistics.median(x / max(p, 1e-9) for x, p in zip(rows[m], rows["plain"], strict=True))
        for m in ("auth", "auth_htag", "encrypt")
    }
    return {
        f"goodput_gbps_plain{sfx}": round(statistics.median(rows["plain"]), 3),
        f"goodput_gbps_auth{sfx}": round(statistics.median(rows["auth"]), 3),
        f"goodput_gbps_encrypt{sfx}": round(statistics.median(rows["encrypt"]), 3),
        f"goodput_gbps_auth_htag{sfx}": round(statistics.median(rows["auth_htag"]), 3),
        f"auth_ratio{sfx}": round(ratio["auth"], 3),
        f"auth_htag_ratio{sfx}": round(ratio["auth_htag"], 3),
        f"encrypt_ratio{sfx}": round(ratio["encrypt"], 3),
        f"rounds{sfx}": {m: [round(x, 3) for x in v] for m, v in rows.items()},
    }


# -- 3. rotation ---------------------------------------------------------------------------------------------
def rotation(rotate: bool, base: int) -> dict[str, int]:
    key = bytes(range(32))
    da, db = SecurityDomain(3, key), SecurityDomain(3, key)
    size = 64 << 20
    a = UdpDevice([f"127.{base}.3.{p}" for p in range(1, 5)], seed=1)
    b = UdpDevice([f"127.{base}.4.{p}" for p in range(1, 5)], seed=2)
    try:
        src, dst = bytearray(random.Random(1).randbytes(size)), bytearray(size)
        mra, mrb = a.register(src, Access.LOCAL_WRITE), b.register(dst)
        qa, qb = a.create_qp(), b.create_qp()
        a.connect(qa, Peer.of(b.endpoints()), qb.qp_num, security=QpSecurity(da))
        b.connect(qb, Peer.of(a.endpoints()), qa.qp_num, security=QpSecurity(db))
        a.start()
        b.start()
        stop = threading.Event()
        rotations = 0

        def rotator() -> None:
            nonlocal rotations
            while not stop.wait(0.02):
                with a.lock:
                    da.rotate()
                time.sleep(0.005)
                with b.lock:
                    db.rotate()
                rotations += 1

        t = threading.Thread(target=rotator, daemon=True)
        if rotate:
            t.start()
        a.post_send(qa, SendWR(1, WrOpcode.RDMA_WRITE, [Sge(mra.addr, size, mra.lkey)], mrb.addr, mrb.rkey))
        wcs: list[Any] = []
        end = time.monotonic() + 120
        while not wcs and time.monotonic() < end:
            with a.lock:
                wcs = qa.send_cq.poll(1)
            time.sleep(0.002)
        stop.set()
        if rotate:
            t.join()
        assert wcs and wcs[0].status.name == "SUCCESS" and dst == src, "the rotation run failed"
        return {
            "rotations": rotations,
            "refused": sum(
                getattr(n.stats, k)
                for n in (a.nic, b.nic)
                for k in ("rx_auth_epoch", "rx_auth_failed", "rx_auth_replayed", "rx_auth_unsealed")
            ),
            "retransmits": a.nic.stats.retransmits,
        }
    finally:
        a.close()
        b.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--forged", type=int, default=10_000, help="forged packets against the transfer")
    ap.add_argument("--mib", type=int, default=64, help="size of each perf Write, MiB")
    ap.add_argument("--iters", type=int, default=16, help="Writes per perf run")
    ap.add_argument("--pairs", type=int, default=3, help="rounds of plain / auth / encrypt runs")
    ap.add_argument("--no-goodput", action="store_true", help="leave out the perf runs")
    a = ap.parse_args()
    if a.forged < 0 or a.mib < 1 or a.iters < 1 or a.pairs < 1:
        ap.error("--forged at least 0; --mib, --iters, --pairs at least 1")
    out: dict[str, Any] = {"build": "compiled" if _native.compiled else "interpreted"}
    if a.forged:
        out.update(forgeries(a.forged))
    if not a.no_goodput:
        out.update(goodputs(a.mib, a.iters, a.pairs, False, 20))
        out.update(goodputs(a.mib, a.iters, a.pairs, True, 50))
    plain, rot = rotation(False, 60), rotation(True, 61)
    out["rotations"] = rot["rotations"]
    out["rotation_refused"] = rot["refused"]
    out["rotation_retransmits"] = rot["retransmits"]
    out["norotation_retransmits"] = plain["retransmits"]
    if a.json:
        print(json.dumps(out))
        return
    for k, v in out.items():
        print(f"{k:36} {v}")


if __name__ == "__main__":
    main()
