"""`Communicator` on real ranks: separate processes, each with its own software MRC NIC (`UdpDevice`, 2 planes
on loopback), results checked against numpy; a plane failing mid-collective; a rank dying."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from openmrc.collectives import LOOPBACK_MTU, CollectiveError, Communicator, HashStore
from openmrc.collectives.bootstrap import store_get
from openmrc.collectives.engine import BYE, CREDIT, PING
from openmrc.collectives.launch import RankFailed, run_local
from openmrc.collectives.ops import DTYPES, ufunc_of
from openmrc.transport import SecurityDomain


def _x(rank: int, count: int, dtype: Any, salt: int = 0) -> np.ndarray[Any, Any]:
    rng = np.random.default_rng(rank * 7919 + salt)
    dt = np.dtype(dtype)
    if dt.kind in "iu":
        return rng.integers(0 if dt.kind == "u" else -9, 10, count).astype(dt)
    return (rng.integers(-64, 64, count) / 8).astype(dt)  # exact in every float type: sums are exact


def _all(comm: Communicator, count: int, dtype: Any, salt: int = 0) -> list[np.ndarray[Any, Any]]:
    return [_x(r, count, dtype, salt) for r in range(comm.size)]


def _job(comm: Communicator) -> dict[str, int]:
    """Every collective, several types, sizes across the algorithm thresholds, in place and not."""
    n, r = comm.size, comm.rank
    checked = 0
    for dtype in ("float32", "bfloat16", "int64", "uint8", "float16"):
        for count in (1, 1000, 70_000):
            for algo in ("ring", "rhd", "tree", None):
                xs = _all(comm, count, DTYPES[dtype], salt=count)
                op = "max" if dtype == "uint8" else "sum"
                want = ufunc_of(op).reduce(np.stack(xs), axis=0).astype(DTYPES[dtype])
                out = np.zeros(count, DTYPES[dtype])
                comm.all_reduce(xs[r], out, op=op, algo=algo)
                np.testing.assert_array_equal(out, want, err_msg=f"all_reduce {dtype} {count} {algo}")
                inplace = xs[r].copy()
                comm.all_reduce(inplace, op=op, algo=algo)
                np.testing.assert_array_equal(inplace, want)
                checked += 2
    count = 5000
    xs = _all(comm, n * count, np.float32, salt=1)
    out = np.zeros(count, np.float32)
    comm.reduce_scatter(xs[r], out, op="avg")
    want = (np.sum(xs, axis=0) / np.float32(n)).astype(np.float32)
    np.testing.assert_array_equal(out, want[r * count : (r + 1) * count])
    for count in (5000, 70_000):  # through slots; direct (over direct_bytes), in place
        gathered = np.zeros(n * count, np.int32)
        mine = gathered[r * count : (r + 1) * count] if count > 5000 else np.zeros(count, np.int32)
        mine[:] = r
        comm.all_gather(mine, gathered)
        np.testing.assert_array_equal(gathered, np.repeat(np.arange(n, dtype=np.int32), count))
    sizes = [[70_000 if (i + j) % 2 else 10 for j in range(n)] for i in range(n)]  # direct and not, mixed
    ins = np.concatenate([np.full(c, r * 100 + j, np.float32) for j, c in enumerate(sizes[r])])
    got = np.zeros(sum(sizes[j][r] for j in range(n)), np.float32)
    comm.alltoallv(ins, sizes[r], got, [sizes[j][r] for j in range(n)])
    want = np.concatenate([np.full(sizes[j][r], j * 100 + r, np.float32) for j in range(n)])
    np.testing.assert_array_equal(got, want)
    a2a_in = np.arange(n * 3, dtype=np.int16) + 100 * r
    a2a_out = np.zeros(n * 3, np.int16)
    comm.alltoall(a2a_in, a2a_out)
    np.testing.assert_array_equal(
        a2a_out, np.concatenate([np.arange(r * 3, r * 3 + 3) + 100 * j for j in range(n)])
    )
    for root in range(n):
        b = np.arange(300_000, dtype=np.float64) * (root + 1) if r == root else np.zeros(300_000)
        comm.broadcast(b, root=root)
        np.testing.assert_array_equal(b, np.arange(300_000, dtype=np.float64) * (root + 1))
        red = np.zeros(4000, np.int64)
        comm.reduce(np.full(4000, r + 1, np.int64), red, op="prod", root=root)
        if r == root:
            np.testing.assert_array_equal(red, np.full(4000, np.prod(np.arange(1, n + 1))))
    comm.barrier()
    if r == 0:
        comm.send(np.arange(100_000, dtype=np.float32), 1)
    elif r == 1:
        got = comm.recv(np.zeros(100_000, np.float32), 0)
        np.testing.assert_array_equal(got, np.arange(100_000, dtype=np.float32))
    stats = comm.engine.stats
    return {"checked": checked, "pieces": stats["pieces_sent"], "direct": stats["pieces_direct"]}


def test_every_collective_on_four_real_ranks() -> None:
    out = run_local(4, _job, timeout=240, comm_kwargs={"chunk_bytes": 64 * 1024})
    assert [o["checked"] for o in out] == [out[0]["checked"]] * 4 and out[0]["checked"] == 120
    assert all(o["pieces"] > 100 and o["direct"] > 10 for o in out)


def _small_and_often(comm: Communicator, calls: int) -> dict[str, Any]:
    """Many small all_reduces on the same buffer (a training loop's gradients, a benchmark's loop), then one
    on memory a bytearray holds."""
    r, n = comm.rank, comm.size
    y = np.zeros(4, np.float32)
    eng = comm.engine
    before = dict(eng.stats)
    for i in range(calls):
        y[:] = np.arange(4, dtype=np.float32) * (r + 1) + i
        comm.all_reduce(y)
        want = np.arange(4, dtype=np.float32) * (n * (n + 1) / 2) + i * n
        np.testing.assert_array_equal(y, want)
    raw = bytearray(16)
    a = np.frombuffer(raw, np.float32)
    a[:] = r + 1
    comm.all_reduce(a)
    assert float(a[0]) == n * (n + 1) / 2
    del a
    raw.extend(bytes(4))  # nothing of the communicator holds on to memory it does not own
    return {
        "credit_writes": eng.stats["credits_sent"] - before["credits_sent"],
        "carried": eng.stats["credits_carried"] - before["credits_carried"],
        "cached": len(eng._regs),
    }


def test_small_collectives_give_slots_back_on_their_pieces_and_keep_buffers_registered() -> None:
    """Two ranks, 200 small all_reduces: the slot each consumed goes back on its next piece to the peer, not
    in a Write of its own (one Write per rank and call, not two), and the buffer is registered once; memory
    numpy does not own (a bytearray's) is registered per call and let go."""
    out = run_local(2, _small_and_often, 200, timeout=120)
    for o in out:
        assert o["carried"] >= 195, o
        assert o["credit_writes"] <= 5, o
        assert 1 <= o["cached"] <= 3, o


def _ahead_while_away(comm: Communicator) -> float:
    """Rank 0 takes one piece, then waits outside the library for something rank 1 does only once its next
    send (a ring's worth of pieces) is out; the slot rank 0 freed but has not given back yet must not hold
    rank 1 up."""
    comm.barrier()
    if comm.rank == 0:
        comm.recv(np.zeros(1024, np.float32), 1)  # one 4 KiB piece
        store_get(comm.store, "sent")
        b = comm.recv(np.zeros(4096, np.float32), 1)  # four pieces: the whole ring
        return float(b.sum())
    comm.send(np.ones(1024, np.float32), 0)
    comm.send(np.ones(4096, np.float32), 0)
    comm.store.set("sent", "1")
    return 0.0


def test_a_peer_sends_as_far_ahead_while_a_rank_is_away_from_the_library() -> None:
    out = run_local(2, _ahead_while_away, timeout=60, comm_kwargs={"chunk_bytes": 4096, "slots": 4})
    assert out[0] == 4096.0


def _both_send_first(comm: Communicator) -> float:
    peer = 1 - comm.rank
    x = np.full(1 << 19, comm.rank, np.float32)  # 2 MiB: a direct message's size, within the peer's slots
    comm.send(x, peer)
    return float(comm.recv(np.zeros_like(x), peer)[-1])


def test_two_ranks_that_both_send_before_they_receive_go_on() -> None:
    """A send of what the peer's slots hold completes before the peer receives (point-to-point messages go
    direct, waiting for the receiver, only beyond that), so the classic exchange works."""
    assert run_local(2, _both_send_first, timeout=60) == [1.0, 0.0]


def _late_and_away(comm: Communicator) -> int:
    """Rank 1 takes its first completion 1 s late (a training thread holding the GIL, a pause) in a direct
    all_gather of 256 pieces, then stays away from the library for 1.5 s while rank 0 first sends it a
    direct message and then waits for it in an all_reduce."""
    eng = comm.engine
    if comm.rank == 1:
        took = eng._received
        late = [True]

        def slow(wc: Any) -> None:
            if late[0]:
                late[0] = False
                time.sleep(1.0)
            took(wc)

        eng._received = slow  # type: ignore[method-assign]
    n = 1 << 20
    out = np.zeros(2 * n, np.int32)
    comm.all_gather(np.full(n, comm.rank, np.int32), out)
    assert (out == np.repeat(np.arange(2, dtype=np.int32), n)).all()
    big = np.ones(1 << 21, np.float32)  # (8 MiB: beyond the slots, a direct message)
    for _ in range(2):
        if comm.rank == 1:
            time.sleep(1.5)
        if comm.rank == 0:
            comm.send(big, 1)
        else:
            comm.recv(big, 0)
        comm.all_reduce(big[:10])
    return int(eng.stats["pings"])


def test_a_receiver_that_polls_late_or_is_away_loses_nothing() -> None:
    """Direct pieces spend credits as slot pieces do (each takes one of the receiver's posted receives,
    and MRC fails a QP whose Write with Immediate finds none), and pings take no receive: a rank that
    polls late, or is away from the library for a while, is waited for, not failed."""
    out = run_local(2, _late_and_away, timeout=60, comm_kwargs={"chunk_bytes": 16 << 10, "ping_s": 0.02})
    assert out[0] > 64, out  # (more pings than the away rank has receives posted)


def _credits_back_one_by_one(comm: Communicator) -> int:
    """Rank 0 only sends direct pieces (a broadcast's root: it never grants credits, it is granted 1,024);
    rank 1 takes one completion at a time and gives back what it owes after each (as `SimWorld` does after
    every event): a credit Write per piece, each needing a receive posted at rank 0."""
    eng = comm.engine
    if comm.rank == 1:
        import openmrc.collectives.engine as engine_module

        engine_module.STEP_WCS = 1  # type: ignore[misc]
        step = eng.step

        def step_then_idle() -> int:
            k = step()
            eng.idle()
            return k

        eng.step = step_then_idle  # type: ignore[method-assign]
    b = np.full(1 << 20, 3.0 if comm.rank == 0 else 0.0, np.float32)  # 4 MiB: 1,024 pieces of 4 KiB
    for _ in range(2):
        comm.broadcast(b, root=0)
    assert (b == 3.0).all()
    return int(eng.stats["credits_sent"])


def test_direct_credits_given_back_one_by_one_find_receives_posted() -> None:
    """The rank granted direct credits posts a receive for each credit Write that may give one back."""
    kw = {"planes": 1, "chunk_bytes": 4096, "direct_bytes": 8192}
    out = run_local(2, _credits_back_one_by_one, timeout=60, comm_kwargs=kw)
    assert out[1] > 1024, out  # (more credit Writes than rank 0 has receives posted without the grant's)


def _goodbye_log(comm: Communicator) -> list[tuple[int, int]]:
    """The control Writes rank r posts from its last all_reduce through its goodbye."""
    eng = comm.engine
    log: list[tuple[int, int]] = []
    post = eng._control

    def logged(link: Any, kind: int, value: int, signaled: bool = False) -> None:
        log.append((kind, value))
        post(link, kind, value, signaled)

    eng._control = logged  # type: ignore[method-assign]
    comm.all_reduce(np.ones(2, np.float32))
    eng.goodbye(5.0)
    return log


def test_a_rank_gives_back_what_it_owes_before_its_goodbye() -> None:
    """A goodbye (a ping saying BYE) promises nothing more follows: the slots a rank still owes go back
    before it, not after."""
    for log in run_local(2, _goodbye_log, timeout=60):
        byes = [i for i, (kind, value) in enumerate(log) if kind == PING and value == BYE]
        assert byes, log
        assert all(kind != CREDIT for kind, _ in log[byes[0] :]), log


def _plane_fails(comm: Communicator, count: int) -> dict[str, Any]:
    """A large all_reduce while plane 2 of rank 1 blackholes everything it sends (and 1 % loss elsewhere)."""
    xs = _all(comm, count, np.float32)
    want = np.sum(xs, axis=0, dtype=np.float32)
    comm.device.impair(1, loss=0.01)
    comm.barrier()
    if comm.rank == 1:
        threading.Timer(0.02, comm.device.blackhole_port, args=(2,)).start()
    t0 = time.monotonic()
    for _ in range(3):
        out = np.zeros(count, np.float32)
        comm.all_reduce(xs[comm.rank], out, algo="ring")
        np.testing.assert_array_equal(out, want)
    return {"s": time.monotonic() - t0, "retx": comm.device.nic.stats.retransmits}


def test_all_reduce_rides_through_a_plane_failure() -> None:
    out = run_local(3, _plane_fails, 1 << 20, timeout=180)
    assert sum(o["retx"] for o in out) > 0  # the faults did bite


def _dies(comm: Communicator) -> str:
    x = np.ones(10_000, np.float32)
    comm.all_reduce(x)
    if comm.rank == 2:
        os._exit(3)  # a crash: no goodbye on any QP
    t0 = time.monotonic()
    try:
        for _ in range(100):
            comm.all_reduce(x)
    except CollectiveError as exc:
        return f"{time.monotonic() - t0:.2f} {exc.rank} {exc}"
    return "no error"


def _sends_to_the_dead(comm: Communicator) -> str:
    x = np.ones(1 << 21, np.float32)  # (8 MiB: a direct message, held until its receiver advertises it)
    comm.all_reduce(x[:10])
    if comm.rank == 1:
        os._exit(3)
    t0 = time.monotonic()
    try:
        for _ in range(100):
            comm.send(x, 1)
    except CollectiveError as exc:
        return f"{time.monotonic() - t0:.2f} {exc.rank} {exc}"
    return "no error"


def test_a_dead_rank_is_named_on_every_survivor() -> None:
    with pytest.raises(RankFailed) as info:
        run_local(4, _dies, timeout=60, comm_kwargs={"ping_s": 0.5})
    outcomes = info.value.outcomes
    assert outcomes[2][0] == "lost"
    for r in (0, 1, 3):
        kind, text = outcomes[r]
        assert kind == "ok", text
        seconds, rank, _ = text.split(" ", 2)
        assert rank == "2", text
        assert float(seconds) < 10.0, text
    # a rank that only sends to the dead one (it waits for an advert or a slot, nothing in flight)
    with pytest.raises(RankFailed) as info:
        run_local(2, _sends_to_the_dead, timeout=60, comm_kwargs={"ping_s": 0.5})
    kind, text = info.value.outcomes[0]
    assert kind == "ok" and text.split(" ")[1] == "1" and float(text.split(" ")[0]) < 10.0, text


def _stops(comm: Communicator, case: str) -> str:
    """Each rank's first error of ``case`` and how long it took ("<seconds> <message>"), or "no error"."""
    x = np.ones(1000, np.float32)
    comm.all_reduce(x)  # (the QPs are made)
    t0 = time.monotonic()
    try:
        if case == "disagree":  # rank 1 all-reduces float64: pieces twice the size rank 0 expects
            comm.all_reduce(x if comm.rank == 0 else np.ones(1000, np.float64))
        elif case == "timeout":  # rank 1 away for 2 s, rank 0 gives up after 0.5
            if comm.rank == 0:
                comm.timeout = 0.5
            else:
                time.sleep(2.0)
            comm.all_reduce(x)
        elif case == "closed" and comm.rank == 0:  # rank 1 leaves (its goodbye) while rank 0 waits for it
            comm.all_reduce(x)
    except CollectiveError as exc:
        return f"{time.monotonic() - t0:.2f} {exc}"
    return f"{time.monotonic() - t0:.2f} no error"


@pytest.mark.parametrize("case", ["disagree", "timeout", "closed"])
def test_a_rank_that_stops_a_collective_tells_its_live_peers(case: str) -> None:
    """A rank that finds its peer running another collective, that gives up waiting (``timeout``), or
    that waits for a peer that closed its communicator stops with an error saying so, and tells the peer,
    which is alive: the peer stops at once with the reason, instead of failing seconds later on a rank it
    takes for dead (RETRY_EXC_ERR), or waiting out its goodbye."""
    t0 = time.monotonic()
    out = run_local(2, _stops, case, timeout=60)
    took = [float(o.split(" ", 1)[0]) for o in out]
    texts = [o.split(" ", 1)[1] for o in out]
    if case == "disagree":
        assert all(t < 3.0 for t in took), out
        assert "not running the same collective" in texts[0], out  # whichever finds it first says so
        assert "not running the same collective" in texts[1], out
    elif case == "timeout":
        assert "did not complete within 0.5 s, waiting for rank 1" in texts[0] and took[0] < 1.5, out
        assert "rank 0 gave up waiting for this collective" in texts[1] and took[1] < 3.5, out
    else:
        assert "rank 1 closed its communicator while this rank waits for it" in texts[0], out
        assert took[0] < 3.0 and texts[1] == "no error", out
    assert time.monotonic() - t0 < 15.0  # (the closing rank did not wait out its 10-s goodbye)


def _late_reduce(comm: Communicator) -> float:
    comm.all_reduce(np.ones(10, np.float32))  # (the QPs are made)
    if comm.rank == 1:
        time.sleep(0.05)
    x = np.full(1000, comm.rank + 1, np.float32)
    comm.reduce(x, root=0, algo="tree")  # rank 2's pieces wait at the root for rank 1's, rank 2 closes
    return float(x[0])


def test_a_peer_that_closes_after_its_part_is_not_taken_for_one_that_left_early() -> None:
    """The last rank of a tree reduce sends, is acknowledged, returns and closes while the root still
    waits for another rank before it takes that rank's pieces: nothing more is missing from it, and its
    goodbye is no error (a root that took it for one failed the job)."""
    assert run_local(3, _late_reduce, timeout=60)[0] == 6.0


def _ranks_of(pid: int) -> list[int]:
    """The live processes ``pid`` started (its children, as /proc tells them)."""
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError):
            out += [int(c) for c in (task / "children").read_text().split()]
    return out


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_a_launcher_stopped_by_a_signal_leaves_no_rank_running(sig: signal.Signals) -> None:
    """`openmrc collective run` stopped by SIGTERM (a scheduler's cancel, ``timeout``) stops its ranks and
    exits with 143; killed outright, its ranks die with it (the parent-death signal), not run on."""
    cmd = [
        str(Path(sys.executable).parent / "openmrc"),
        "collective",
        "run",
        "-n",
        "2",
        "-b",
        "4M",
        "-e",
        "4M",
    ]
    p = subprocess.Popen([*cmd, "--iters", "100000"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        end = time.monotonic() + 30
        while len(ranks := _ranks_of(p.pid)) < 2 and time.monotonic() < end:
            time.sleep(0.1)
        assert len(ranks) == 2 and p.poll() is None
        time.sleep(1.0)  # (in their collectives)
        p.send_signal(sig)
        assert p.wait(timeout=15) == (143 if sig == signal.SIGTERM else -signal.SIGKILL)
        end = time.monotonic() + 5
        while any(_alive(r) for r in ranks) and time.monotonic() < end:
            time.sleep(0.05)
        assert not any(_alive(r) for r in ranks)
    finally:
        for r in _ranks_of(p.pid):
            with contextlib.suppress(OSError):
                os.kill(r, signal.SIGKILL)
        p.kill()
        assert p.stderr is not None
        p.stderr.close()


def test_communicator_refuses_bad_calls() -> None:
    store = HashStore(timeout=5)
    with Communicator(0, 1, store) as comm:
        x = np.arange(10, dtype=np.float32)
        comm.all_reduce(x)  # a world of one: itself
        np.testing.assert_array_equal(x, np.arange(10, dtype=np.float32))
        with pytest.raises(ValueError, match="same type"):
            comm.all_reduce(x, np.zeros(10, np.float64))
        with pytest.raises(ValueError, match="expected one of"):
            comm.all_reduce(x, op="xor")
        with pytest.raises(ValueError, match="has ring"):
            comm.reduce_scatter(x, np.zeros(10, np.float32), algo="tree")
        with pytest.raises(ValueError, match="C-contiguous"):
            comm.all_reduce(np.zeros((4, 4), np.float32)[:, 1])
        with pytest.raises(ValueError, match="not supported"):
            comm.all_reduce(np.zeros(4, np.complex64))
        with pytest.raises(ValueError, match="read-only"):
            ro = np.zeros(4, np.float32)
            ro.flags.writeable = False
            comm.all_reduce(ro)
        with pytest.raises(ValueError, match="root"):
            comm.broadcast(x, root=1)
        comm.broadcast(x, root=np.int64(0))  # (numpy's integers are ranks too)
        for bad_peer in (1, -1, np.int64(5), 0.0):
            with pytest.raises(ValueError, match=r"^peer: .* outside 0\.\.0"):
                comm.send(x, bad_peer)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match=r"^dest: "):
            comm.sendrecv(x, 3, np.zeros(10, np.float32), 0)
        with pytest.raises(ValueError, match=r"^send_counts: 20 elements in all, the buffer holds 10"):
            comm.alltoallv(x, [20], np.zeros(10, np.float32), [10])
        with pytest.raises(ValueError, match=r"^recv_displs: "):
            comm.alltoallv(x, [10], np.zeros(10, np.float32), [10], recv_displs=[5])
        with pytest.raises(ValueError, match="overlap"):
            comm.all_reduce(x[:8], x[2:])
        comm.all_reduce(bytearray(b"\x01\x02"))  # any buffer-protocol object
    with pytest.raises(CollectiveError, match="closed"):
        comm.all_reduce(x)
    with pytest.raises(ValueError, match="rank"):
        Communicator(2, 2, store)
    for bad in (0, -5, True, "fast", 1.5):
        with pytest.raises(ValueError, match="direct_bytes"):
            Communicator(0, 1, store, direct_bytes=bad)
    for bad in (0, -1, True, "1", float("nan")):
        with pytest.raises(ValueError, match="timeout"):
            Communicator(0, 1, store, timeout=bad)  # type: ignore[arg-type]


def test_ranks_on_loopback_send_jumbo_packets_and_all_ranks_must_agree() -> None:
    """On loopback a rank's packets carry `LOOPBACK_MTU` (a software NIC's cost is per packet; lo carries
    64 KiB datagrams); ``mtu`` chooses another, checked, and a rank whose packets are another size than
    its peer's is told so by name instead of having its data refused at the responder; so is one whose
    slots are another size (its pieces would land in the wrong places)."""
    store = HashStore(timeout=5)
    with Communicator(0, 1, store, prefix="mtu-one") as comm:
        assert comm.mtu == LOOPBACK_MTU == comm.device.config.mtu
    for bad in (3, 128, 64 << 10, True):
        with pytest.raises(ValueError, match="mtu"):
            Communicator(0, 1, store, mtu=bad)
    with pytest.raises(ValueError, match="given device"):
        Communicator(0, 1, store, device=object(), mtu=4096)
    domain, other = SecurityDomain.generate(5), SecurityDomain.generate(5)  # (the same SDI, two keys)
    for what, told in (
        ("mtu", ("4096 B", "8192 B")),
        ("chunk_bytes", ("of 4096 B", "of 8192 B")),
        ("direct_bytes", ("direct_bytes=", "8192")),
        ("security", ("in security domain 5", "unauthenticated")),
        ("key", (domain.fingerprint(), other.fingerprint())),  # (named by their fingerprints)
    ):
        errors: list[str] = []

        def rank(r: int, what: str = what, errors: list[str] = errors) -> None:
            try:
                kw: dict[str, Any] = {what: 4096 if r else 8192}
                if what in ("security", "key"):
                    kw = {"security": domain if r else (None if what == "security" else other)}
                with Communicator(r, 2, store, prefix=f"{what}-two", **kw) as comm:
                    comm.all_reduce(np.ones(16, np.float32))
            except CollectiveError as exc:
                errors.append(str(exc))

        threads = [threading.Thread(target=rank, args=(r,)) for r in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert len(errors) == 2 and all(told[0] in e and told[1] in e for e in errors), errors
