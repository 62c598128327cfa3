"""The collective algorithms, sans-IO: every rank's `Schedule` run in one process over an adversarial
in-memory network (`collective_tools.run_ranks`), results checked against numpy."""

from __future__ import annotations

import functools
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from openmrc.collectives import algorithms as A
from openmrc.collectives.ops import DTYPES, dtype_of, finish_avg, ufunc_of
from openmrc.collectives.program import Program, Schedule, ScheduleError
from tests.collective_tools import run_ranks

SIZES = st.integers(1, 9)
COUNTS = st.integers(0, 70)
CHUNKS = st.integers(1, 16)


def _ints(rng: np.random.Generator, n: int, count: int, dtype: Any = np.int64) -> list[np.ndarray[Any, Any]]:
    return [rng.integers(-40, 40, count).astype(dtype) for _ in range(n)]


DIRECT_MIN = st.sampled_from([None, 1, 7])  # (elements: never, every message, the larger ones)


@settings(max_examples=150, deadline=None)
@given(
    SIZES,
    COUNTS,
    CHUNKS,
    st.sampled_from(["ring", "rhd", "rd", "tree"]),
    st.booleans(),
    DIRECT_MIN,
    st.integers(0, 99),
)
def test_all_reduce_sum_exact(
    n: int, count: int, chunk: int, algo: str, inplace: bool, direct_min: int | None, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    xs = _ints(rng, n, count)
    expect = functools.reduce(np.add, xs)
    outs = [x.copy() if inplace else np.full(count, 7, np.int64) for x in xs]
    progs = [
        A.all_reduce(r, n, count, chunk, algo=algo, inplace=inplace, direct_min=direct_min) for r in range(n)
    ]
    bufs = [[outs[r] if inplace else xs[r], outs[r], np.zeros(count, np.int64)] for r in range(n)]
    run_ranks(progs, bufs, np.add, seed=seed)
    for r in range(n):
        np.testing.assert_array_equal(outs[r], expect, err_msg=f"rank {r}")


@pytest.mark.parametrize("op", ["prod", "min", "max", "avg"])
@pytest.mark.parametrize("algo", ["ring", "rhd", "rd", "tree"])
def test_all_reduce_ops(op: str, algo: str) -> None:
    n, count = 5, 23
    rng = np.random.default_rng(3)
    xs = [rng.integers(-3, 4, count).astype(np.int32) for _ in range(n)]
    uf = ufunc_of(op)
    expect = functools.reduce(uf, xs).astype(np.int32)
    if op == "avg":
        expect = (np.sign(expect) * (np.abs(expect) // n)).astype(np.int32)  # C division
    outs = [np.zeros(count, np.int32) for _ in range(n)]
    progs = [A.all_reduce(r, n, count, 4, algo=algo, avg=op == "avg") for r in range(n)]
    bufs = [[xs[r], outs[r], np.zeros(count, np.int32)] for r in range(n)]
    run_ranks(progs, bufs, uf, n if op == "avg" else 1, seed=1)
    for r in range(n):
        np.testing.assert_array_equal(outs[r], expect)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
def test_ring_all_reduce_float_order_is_documented(dtype: str) -> None:
    """Ring: segment s is x_s ⊕ x_s+1 ⊕ … folded left to right, on every rank bit for bit."""
    n, count, dt = 4, 50, dtype_of(dtype)
    rng = np.random.default_rng(9)
    xs = [rng.standard_normal(count).astype(dt) for _ in range(n)]
    outs = [np.zeros(count, dt) for _ in range(n)]
    run_ranks([A.all_reduce(r, n, count, 6) for r in range(n)], [[xs[r], outs[r]] for r in range(n)], np.add)
    expect = np.zeros(count, dt)
    for s, (o, c) in enumerate(A.segments(count, n)):
        acc = xs[s][o : o + c].copy()
        for k in range(1, n):
            acc = np.add(acc, xs[(s + k) % n][o : o + c])
        expect[o : o + c] = acc
    for r in range(n):
        assert outs[r].tobytes() == expect.tobytes(), f"rank {r}"


@pytest.mark.parametrize("algo", ["rhd", "rd", "tree"])
def test_all_reduce_float_identical_on_every_rank(algo: str) -> None:
    n, count = 7, 41
    rng = np.random.default_rng(5)
    xs = [rng.standard_normal(count).astype(np.float32) for _ in range(n)]
    outs = [np.zeros(count, np.float32) for _ in range(n)]
    run_ranks(
        [A.all_reduce(r, n, count, 5, algo=algo) for r in range(n)],
        [[xs[r], outs[r], np.zeros(count, np.float32)] for r in range(n)],
        np.add,
    )
    np.testing.assert_allclose(outs[0], np.sum(xs, axis=0, dtype=np.float64), rtol=1e-5, atol=1e-5)
    for r in range(1, n):
        assert outs[r].tobytes() == outs[0].tobytes()


@settings(max_examples=60, deadline=None)
@given(SIZES, st.integers(0, 20), CHUNKS, st.integers(0, 99))
def test_reduce_scatter(n: int, count: int, chunk: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    xs = _ints(rng, n, n * count)
    total = functools.reduce(np.add, xs)
    outs = [np.zeros(count, np.int64) for _ in range(n)]
    progs = [A.reduce_scatter(r, n, count, chunk) for r in range(n)]
    run_ranks(progs, [[xs[r], outs[r], np.zeros(n * count, np.int64)] for r in range(n)], np.add, seed=seed)
    for r in range(n):
        np.testing.assert_array_equal(outs[r], total[r * count : (r + 1) * count])


@settings(max_examples=60, deadline=None)
@given(SIZES, st.integers(0, 20), CHUNKS, st.booleans(), DIRECT_MIN, st.integers(0, 99))
def test_all_gather(n: int, count: int, chunk: int, inplace: bool, direct_min: int | None, seed: int) -> None:
    rng = np.random.default_rng(seed)
    xs = _ints(rng, n, count)
    outs = [np.full(n * count, -99, np.int64) for _ in range(n)]
    bufs = []
    for r in range(n):
        if inplace:
            outs[r][r * count : (r + 1) * count] = xs[r]
            bufs.append([outs[r][r * count : (r + 1) * count], outs[r]])
        else:
            bufs.append([xs[r], outs[r]])
    progs = [A.all_gather(r, n, count, chunk, inplace=inplace, direct_min=direct_min) for r in range(n)]
    run_ranks(progs, bufs, seed=seed)
    for r in range(n):
        np.testing.assert_array_equal(outs[r], np.concatenate(xs))


@settings(max_examples=60, deadline=None)
@given(SIZES, CHUNKS, DIRECT_MIN, st.integers(0, 99))
def test_alltoallv(n: int, chunk: int, direct_min: int | None, seed: int) -> None:
    rng = np.random.default_rng(seed)
    counts = rng.integers(0, 12, (n, n))  # counts[i][j]: rank i to rank j
    send = [np.arange(counts[i].sum()) + 1000 * i for i in range(n)]
    sd = [np.concatenate([[0], np.cumsum(counts[i])[:-1]]).astype(int).tolist() for i in range(n)]
    rc = [[int(counts[j][i]) for j in range(n)] for i in range(n)]
    rd = [np.concatenate([[0], np.cumsum(rc[i])[:-1]]).astype(int).tolist() for i in range(n)]
    recv = [np.full(sum(rc[i]), -1, np.int64) for i in range(n)]
    progs = [
        A.alltoallv(
            i,
            n,
            counts[i].tolist(),
            sd[i],
            rc[i],
            rd[i],
            send[i].size,
            recv[i].size,
            chunk,
            direct_min=direct_min,
        )
        for i in range(n)
    ]
    run_ranks(progs, [[send[i], recv[i]] for i in range(n)], seed=seed)
    for i in range(n):
        expect = np.concatenate([send[j][sd[j][i] : sd[j][i] + counts[j][i]] for j in range(n)])
        np.testing.assert_array_equal(recv[i], expect)


@settings(max_examples=60, deadline=None)
@given(SIZES, st.integers(0, 40), CHUNKS, st.sampled_from(["chain", "tree"]), DIRECT_MIN, st.data())
def test_broadcast(
    n: int, count: int, chunk: int, algo: str, direct_min: int | None, data: st.DataObject
) -> None:
    root = data.draw(st.integers(0, n - 1))
    rng = np.random.default_rng(count)
    bufs = [rng.integers(0, 100, count) if r == root else np.full(count, -1, np.int64) for r in range(n)]
    want = bufs[root].copy()
    run_ranks(
        [A.broadcast(r, n, count, chunk, root=root, algo=algo, direct_min=direct_min) for r in range(n)],
        [[b, b] for b in bufs],
    )
    for r in range(n):
        np.testing.assert_array_equal(bufs[r], want)


@settings(max_examples=60, deadline=None)
@given(SIZES, st.integers(0, 40), CHUNKS, st.sampled_from(["chain", "tree"]), st.booleans(), st.data())
def test_reduce(n: int, count: int, chunk: int, algo: str, inplace: bool, data: st.DataObject) -> None:
    root = data.draw(st.integers(0, n - 1))
    rng = np.random.default_rng(count + n)
    xs = _ints(rng, n, count)
    expect = functools.reduce(np.add, xs)
    keep = [x.copy() for x in xs]
    outs = [x if inplace and r == root else np.full(count, -5, np.int64) for r, x in enumerate(xs)]
    progs = [
        A.reduce(r, n, count, chunk, root=root, algo=algo, inplace=inplace and r == root) for r in range(n)
    ]
    bufs = [[xs[r], outs[r], np.zeros(count, np.int64)] for r in range(n)]
    run_ranks(progs, bufs, np.add)
    np.testing.assert_array_equal(outs[root], expect)
    for r in range(n):
        if r != root:
            np.testing.assert_array_equal(xs[r], keep[r])  # inputs untouched
            np.testing.assert_array_equal(outs[r], np.full(count, -5))


def test_chain_reduce_float_order() -> None:
    """Chain reduce: (x_root+1 ⊕ x_root+2 ⊕ …) ⊕ x_root, left to right."""
    n, count, root = 5, 30, 2
    rng = np.random.default_rng(2)
    xs = [rng.standard_normal(count).astype(np.float32) for _ in range(n)]
    outs = [np.zeros(count, np.float32) for _ in range(n)]
    progs = [A.reduce(r, n, count, 4, root=root, algo="chain") for r in range(n)]
    run_ranks(progs, [[xs[r], outs[r], np.zeros(count, np.float32)] for r in range(n)], np.add)
    acc = xs[(root + 1) % n].copy()
    for k in range(2, n + 1):
        acc = np.add(acc, xs[(root + k) % n])
    assert outs[root].tobytes() == acc.tobytes()


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8])
def test_barrier_and_sendrecv(n: int) -> None:
    e = np.empty(0, np.uint8)
    scheds = run_ranks([A.barrier(r, n) for r in range(n)], [[e, e]] * n)
    assert all(s.done for s in scheds)
    if n >= 2:
        for direct_min in (None, 1):
            x, y = np.arange(33, dtype=np.int16), np.zeros(33, np.int16)
            progs = [A.send(1, 33, 5, direct_min=direct_min), A.recv(0, 33, 5, direct_min=direct_min)]
            run_ranks(progs, [[x, x], [y, y]])
            np.testing.assert_array_equal(x, y)


def test_a_direct_message_is_advertised_once_its_region_is_ready() -> None:
    """A direct message (a copy, no reduction, into consecutive regions from one peer) is advertised to
    the peer only once nothing earlier still reads or writes its region, and the peer's messages in
    order; a piece that comes the other way (direct for a slot receive, or the reverse) is an error."""
    with pytest.raises(ValueError, match="only a copy"):
        Program([8, 8]).recv(1, 1, 0, 4, (0, 0), direct=0)  # a reduction
    with pytest.raises(ValueError, match="only a copy"):
        Program([8, 8]).recv(1, 1, 0, 4, direct=2)  # before its message's start
    q = Program([8, 8])
    q.recv(2, 1, 0, 2, direct=0)
    q.recv(3, 1, 4, 2)
    with pytest.raises(ValueError, match="not the next region"):
        q.recv(2, 1, 4, 2, direct=0)
    assert Program([8, 8]).recv(2, 1, 0, 0, direct=0) == 0  # an empty piece: never direct
    # rank 0 sends its buffer 1 to rank 2 and then receives a direct message from rank 1 into it
    p = Program([8, 8])
    snd = p.send(2, 1, 0, 8)
    p.recv(1, 1, 0, 4, direct=0)
    p.recv(1, 1, 4, 4, direct=0)
    p.recv(3, 1, 4, 2, direct=4)  # (another peer's message into rank 1's second piece: after it)
    x = np.arange(8, dtype=np.int64)
    sched = Schedule(p, [x, x.copy()])
    sched.start()
    assert sched.take_sends() == [(snd, p.ops[snd])] and sched.take_adverts() == []  # still being sent
    sched.sent(snd)
    assert sched.take_adverts() == [(1, 1, 0, 8)]  # one message of 8 elements from element 0
    sched.arrived(1, 32)
    assert sched.take_adverts() == []  # (rank 3's region is still rank 1's to write)
    sched.arrived(1, 32)
    assert sched.take_adverts() == [(3, 1, 4, 2)]
    y = np.zeros(8, np.int64)
    sched = Schedule(A.recv(0, 8, 8, direct_min=1), [y, y])
    sched.start()
    with pytest.raises(ScheduleError, match="a piece in a slot from rank 0 where this rank expects a direct"):
        sched.arrived(0, x.tobytes(), "slot")
    sched = Schedule(A.recv(0, 8, 8), [y, y])
    sched.start()
    with pytest.raises(
        ScheduleError, match="a direct piece from rank 0 where this rank expects one in a slot"
    ):
        sched.arrived(0, 64)


def test_barrier_waits_for_every_rank() -> None:
    """No rank's barrier completes while one rank has not entered it."""
    n = 6
    e = np.empty(0, np.uint8)
    progs = [A.barrier(r, n) for r in range(n)]
    scheds = [Schedule(p, [e, e]) for p in progs]
    late = 4
    inbox: list[tuple[int, int]] = []
    for r, s in enumerate(scheds):
        if r != late:
            s.start()
    for _ in range(50):  # deliver everything deliverable among the others
        for r, s in enumerate(scheds):
            if r == late:
                continue
            for _i, op in s.take_sends():
                inbox.append((r, op.peer))
                s.sent(_i)
        for a, b in list(inbox):
            if b != late:
                inbox.remove((a, b))
                scheds[b].arrived(a, b"")
    assert not any(s.done for s in scheds)


def test_schedule_refuses_what_does_not_fit() -> None:
    p = A.recv(1, 4, 4)
    buf = np.zeros(4, np.int32)
    s = Schedule(p, [buf, buf])
    s.start()
    with pytest.raises(ScheduleError, match="expected 16 B"):
        s.arrived(1, b"\0" * 12)
    s2 = Schedule(A.recv(1, 4, 4), [buf, buf])
    s2.start()
    s2.arrived(1, b"\1" * 16)
    with pytest.raises(ScheduleError, match="no receive"):
        s2.arrived(1, b"\1" * 16)
    with pytest.raises(ScheduleError, match="no receive"):
        s2.arrived(3, b"")


def test_program_hazards() -> None:
    """A write waits for the sends reading its elements and for the last write; reads wait for writes."""
    p = Program([10, 10])
    s1 = p.send(1, 1, 0, 6)
    s2 = p.send(2, 1, 4, 6)
    w = p.recv(1, 1, 5, 2)  # overlaps both sends
    r = p.send(3, 1, 0, 10)  # reads what w wrote
    assert p.ops[w].deps == 2 and w in p.ops[s1].after and w in p.ops[s2].after
    assert p.ops[r].deps == 1 and r in p.ops[w].after
    assert p.copy(1, 3, 1, 3, 4) == -1  # a copy onto itself is nothing
    with pytest.raises(ValueError, match="outside buffer"):
        p.send(1, 0, 8, 5)


@pytest.mark.parametrize("name", list(DTYPES))
def test_avg_finish(name: str) -> None:
    dt = DTYPES[name]
    if dt.kind == "u":
        a = np.array([0, 7, 9], dt)
        finish_avg(a, 2)
        np.testing.assert_array_equal(a, np.array([0, 3, 4], dt))
    elif dt.kind == "i":
        info = np.iinfo(dt)
        a = np.array([-7, 7, info.min, -6], dt)
        finish_avg(a, 2)
        np.testing.assert_array_equal(a, np.array([-3, 3, info.min // 2, -3], dt))
    else:
        a = np.array([3.0, -1.0], dt)
        finish_avg(a, 2)
        np.testing.assert_array_equal(a, np.array([1.5, -0.5], dt))


def test_dtype_names() -> None:
    assert dtype_of("bf16") == np.dtype(ml_dtypes.bfloat16)
    assert dtype_of(np.float32) == np.dtype(np.float32)
    with pytest.raises(ValueError, match="supported"):
        dtype_of("complex64")
    with pytest.raises(ValueError, match="expected one of"):
        ufunc_of("xor")
