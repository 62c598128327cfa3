"""The collective algorithms, each written as a `Program` for one rank (see `openmrc.collectives.program`).

Buffers are numbered: 0 the send buffer, 1 the receive buffer, 2 a scratch buffer (only where an algorithm
needs one: the program's third size, which the communicator allocates). An in-place call aliases 0 to 1.
Every region is cut into pieces of at most ``chunk`` elements, the unit that moves in one Write with
Immediate, so each step is pipelined: piece i is reduced while piece i+1 is on the wire.

``direct_min``: a message of at least that many elements whose receive only places it (all_gather,
alltoall(v), broadcast, send/recv, the gathering half of an all_reduce) goes *direct*, straight into the
receiver's buffer once the receiver has advertised its region (`Program`): no slot, and no copy out of
one. None: never. Both ranks of a pair decide from the same count, so they agree.

Reduction order (what a floating result equals, bit for bit):
- ``ring``: the data is cut into ``size`` segments (`segments`); segment s is folded left to right in ring
  order starting at one rank: all_reduce from rank s (x_s ⊕ x_{s+1} ⊕ … ⊕ x_{s-1}), reduce_scatter from
  rank s+1 (… ending with x_s, the rank that keeps it).
- ``rhd`` (recursive halving-doubling, Rabenseifner): with p the largest power of two ≤ size and
  r = size - p, ranks 2i and 2i+1 (i < r) first combine as (x_2i ⊕ x_2i+1) in rank 2i+1; then p ranks
  (new rank j) halve: at distance d = p/2, p/4, …, 1 the lower new rank of each pair keeps the lower half and
  computes (its value ⊕ the partner's), the upper one (partner's ⊕ its own) -- i.e. always lower ⊕ upper.
- ``rd`` (recursive doubling, after the same fold): at distance 1, 2, 4 … partners exchange everything and
  both compute lower ⊕ upper.
- ``tree`` (binomial, rooted; all_reduce roots at 0 then broadcasts): a node folds its children into its
  value in increasing distance order, (x ⊕ child at distance 1) ⊕ child at distance 2 …, relative ranks.
- ``chain`` reduce: from the rank after the root along the ring to the root: (x_{root+1} ⊕ …) ⊕ x_root.
Every rank of an all_reduce ends with bitwise the same result (each element is reduced once, then copied).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from openmrc.collectives.program import Program

__all__ = [
    "ALGORITHMS",
    "all_gather",
    "all_reduce",
    "alltoallv",
    "barrier",
    "broadcast",
    "pieces",
    "recv",
    "reduce",
    "reduce_scatter",
    "segments",
    "send",
    "sendrecv",
]

SEND_BUF: Final = 0
RECV_BUF: Final = 1
SCRATCH: Final = 2

# which algorithms each collective has (the first is the default for large messages)
ALGORITHMS: Final[dict[str, tuple[str, ...]]] = {
    "all_reduce": ("ring", "rhd", "rd", "tree"),
    "reduce_scatter": ("ring",),
    "all_gather": ("ring",),
    "alltoall": ("pairwise",),
    "broadcast": ("chain", "tree"),
    "reduce": ("chain", "tree"),
}


def segments(count: int, parts: int) -> list[tuple[int, int]]:
    """``count`` elements cut into ``parts`` contiguous segments ``(offset, length)``, the first
    ``count % parts`` one element longer."""
    q, r = divmod(count, parts)
    out, off = [], 0
    for i in range(parts):
        n = q + (i < r)
        out.append((off, n))
        off += n
    return out


def pieces(off: int, n: int, chunk: int) -> list[tuple[int, int]]:
    """Region ``[off, off+n)`` in pieces of at most ``chunk`` elements (one empty piece for n = 0)."""
    if n == 0:
        return [(off, 0)]
    return [(o, min(chunk, off + n - o)) for o in range(off, off + n, chunk)]


def _sends(p: Program, peer: int, buf: int, off: int, n: int, chunk: int, direct: bool = False) -> None:
    for o, c in pieces(off, n, chunk):
        p.send(peer, buf, o, c, remote=o - off if direct else None)


def _recvs(
    p: Program,
    peer: int,
    buf: int,
    off: int,
    n: int,
    chunk: int,
    local: tuple[int, int] | None = None,
    first: bool = True,
    direct: bool = False,
) -> None:
    for o, c in pieces(off, n, chunk):
        src = None if local is None else (local[0], local[1] + (o - off))
        p.recv(peer, buf, o, c, src, first=first, direct=off if direct else None)


def _direct(n: int, direct_min: int | None) -> bool:
    """Whether a message of ``n`` elements goes direct."""
    return direct_min is not None and n >= direct_min


def _scale(p: Program, count: int, chunk: int) -> None:
    """``avg``: the result in buffer 1 divided by the world size, piece by piece."""
    for o, c in pieces(0, count, chunk):
        p.scale(RECV_BUF, o, c)


# -- all_reduce ----------------------------------------------------------------------------------------------
def all_reduce(
    rank: int,
    size: int,
    count: int,
    chunk: int,
    *,
    algo: str = "ring",
    inplace: bool = False,
    avg: bool = False,
    direct_min: int | None = None,
) -> Program:
    """``count`` elements of buffer 0 reduced over every rank into buffer 1; the messages of its gathering
    half of at least ``direct_min`` elements direct."""
    sizes = [count, count, count] if algo == "rd" else [count, count]  # (rd alone needs scratch)
    p = Program(sizes, {SEND_BUF: RECV_BUF} if inplace else None)
    if size == 1 or count == 0:
        p.copy(SEND_BUF, 0, RECV_BUF, 0, count)
        return p
    builders = {
        "ring": _ring_all_reduce,
        "rhd": _rhd_all_reduce,
        "rd": _rd_all_reduce,
        "tree": _tree_all_reduce,
    }
    builders[algo](p, rank, size, count, chunk, direct_min)
    if avg:
        _scale(p, count, chunk)
    return p


def _ring_all_reduce(p: Program, rank: int, size: int, count: int, chunk: int, dmin: int | None) -> None:
    segs = segments(count, size)
    right, left = (rank + 1) % size, (rank - 1) % size
    for k in range(size - 1):  # reduce-scatter: rank r ends owning segment r+1
        o, n = segs[(rank - k) % size]
        _sends(p, right, SEND_BUF if k == 0 else RECV_BUF, o, n, chunk)
        o, n = segs[(rank - k - 1) % size]
        _recvs(p, left, RECV_BUF, o, n, chunk, (SEND_BUF, o))
    for k in range(size - 1):  # all-gather
        o, n = segs[(rank + 1 - k) % size]
        _sends(p, right, RECV_BUF, o, n, chunk, _direct(n, dmin))
        o, n = segs[(rank - k) % size]
        _recvs(p, left, RECV_BUF, o, n, chunk, direct=_direct(n, dmin))


def _fold_in(
    p: Program, rank: int, size: int, count: int, chunk: int, dmin: int | None
) -> tuple[int, int, int, int] | None:
    """The standard fold of a world that is not a power of two (``rem`` ranks over ``pof2``): of the
    first 2·rem ranks, each even one hands its data to the odd one after it and gets the result back at
    the end (its whole program: None); the odd one folds it in and takes part as rank ``rank // 2`` of the
    power-of-two group, the rest as ``rank - rem``. Returns (pof2, rem, the buffer the group step reads
    first, the rank in the group)."""
    pof2 = 1 << (size.bit_length() - 1)
    rem = size - pof2
    if rank >= 2 * rem:
        return pof2, rem, SEND_BUF, rank - rem
    if rank % 2 == 0:
        _sends(p, rank + 1, SEND_BUF, 0, count, chunk)
        _recvs(p, rank + 1, RECV_BUF, 0, count, chunk, direct=_direct(count, dmin))
        return None
    _recvs(p, rank - 1, RECV_BUF, 0, count, chunk, (SEND_BUF, 0))
    return pof2, rem, RECV_BUF, rank // 2


def _fold_rank(j: int, rem: int) -> int:
    """The world rank of rank ``j`` of the power-of-two group (`_fold_in`)."""
    return 2 * j + 1 if j < rem else j + rem


def _fold_out(p: Program, rank: int, rem: int, count: int, chunk: int, dmin: int | None) -> None:
    """The result back to the rank folded into this one (`_fold_in`)."""
    if rank < 2 * rem:
        _sends(p, rank - 1, RECV_BUF, 0, count, chunk, _direct(count, dmin))


def _rhd_all_reduce(p: Program, rank: int, size: int, count: int, chunk: int, dmin: int | None) -> None:
    folded = _fold_in(p, rank, size, count, chunk, dmin)
    if folded is None:
        return
    pof2, rem, src, me = folded
    lo, hi = 0, count
    steps: list[tuple[int, int, int, int, int]] = []
    d = pof2 >> 1
    while d:
        mate = me ^ d
        peer = _fold_rank(mate, rem)
        mid = lo + (hi - lo) // 2
        lower = me < mate
        keep = (lo, mid) if lower else (mid, hi)
        give = (mid, hi) if lower else (lo, mid)
        _sends(p, peer, src, give[0], give[1] - give[0], chunk)
        _recvs(p, peer, RECV_BUF, keep[0], keep[1] - keep[0], chunk, (src, keep[0]), first=not lower)
        src = RECV_BUF
        steps.append((peer, *keep, *give))
        lo, hi = keep
        d >>= 1
    for mate, klo, khi, glo, ghi in reversed(steps):  # doubling: the halves come back
        _sends(p, mate, RECV_BUF, klo, khi - klo, chunk, _direct(khi - klo, dmin))
        _recvs(p, mate, RECV_BUF, glo, ghi - glo, chunk, direct=_direct(ghi - glo, dmin))
    _fold_out(p, rank, rem, count, chunk, dmin)


def _rd_all_reduce(p: Program, rank: int, size: int, count: int, chunk: int, dmin: int | None) -> None:
    """Recursive doubling (latency: log2 p exchanges of the whole vector, after the same fold as ``rhd``).
    Step k reads one buffer and writes the other (receive buffer and scratch in turn, the last step the
    receive buffer), so a step's reduction never waits for the previous step's send to be acknowledged."""
    folded = _fold_in(p, rank, size, count, chunk, dmin)
    if folded is None:
        return
    pof2, rem, src, me = folded
    steps = pof2.bit_length() - 1
    for k in range(steps):
        mate = me ^ (1 << k)
        peer = _fold_rank(mate, rem)
        dst = RECV_BUF if (steps - 1 - k) % 2 == 0 else SCRATCH
        _sends(p, peer, src, 0, count, chunk)
        _recvs(p, peer, dst, 0, count, chunk, (src, 0), first=me > mate)  # lower ⊕ upper on both sides
        src = dst
    _fold_out(p, rank, rem, count, chunk, dmin)


def _tree_all_reduce(p: Program, rank: int, size: int, count: int, chunk: int, dmin: int | None) -> None:
    _tree_reduce(p, rank, size, 0, count, chunk, RECV_BUF)
    _tree_broadcast(p, rank, size, 0, count, chunk, RECV_BUF, _direct(count, dmin))


def _tree_reduce(p: Program, rank: int, size: int, root: int, count: int, chunk: int, acc: int) -> None:
    """Binomial reduction of buffer 0 towards ``root``, accumulated in buffer ``acc``."""
    vr = (rank - root) % size
    src = SEND_BUF
    mask = 1
    while mask < size:
        if vr & mask:
            _sends(p, (rank - mask) % size, src, 0, count, chunk)
            return
        if vr + mask < size:
            _recvs(p, (rank + mask) % size, acc, 0, count, chunk, (src, 0), first=False)
            src = acc
        mask <<= 1
    p.copy(src, 0, acc, 0, count)  # a root without children


def _tree_broadcast(
    p: Program, rank: int, size: int, root: int, count: int, chunk: int, buf: int, direct: bool = False
) -> None:
    vr = (rank - root) % size
    mask = 1
    while mask < size:
        if vr & mask:
            _recvs(p, (rank - mask) % size, buf, 0, count, chunk, direct=direct)
            break
        mask <<= 1
    mask >>= 1
    while mask:
        if vr + mask < size:
            _sends(p, (rank + mask) % size, buf, 0, count, chunk, direct)
        mask >>= 1


# -- broadcast / reduce -------------------------------------------------------------------------------------
def broadcast(
    rank: int,
    size: int,
    count: int,
    chunk: int,
    *,
    root: int = 0,
    algo: str = "chain",
    inplace: bool = True,
    direct_min: int | None = None,
) -> Program:
    """Buffer 0 of ``root`` into buffer 1 of every rank (in place: the same buffer)."""
    p = Program([count, count], {SEND_BUF: RECV_BUF} if inplace else None)
    if rank == root:
        p.copy(SEND_BUF, 0, RECV_BUF, 0, count)
    if size == 1:
        return p
    direct = _direct(count, direct_min)
    if algo == "tree":
        _tree_broadcast(p, rank, size, root, count, chunk, RECV_BUF, direct)
        return p
    vr = (rank - root) % size  # chain: root -> root+1 -> ... pipelined piece by piece
    if vr:
        _recvs(p, (rank - 1) % size, RECV_BUF, 0, count, chunk, direct=direct)
    if vr < size - 1:
        _sends(p, (rank + 1) % size, RECV_BUF, 0, count, chunk, direct)
    return p


def reduce(
    rank: int,
    size: int,
    count: int,
    chunk: int,
    *,
    root: int = 0,
    algo: str = "chain",
    inplace: bool = False,
    avg: bool = False,
) -> Program:
    """Buffer 0 of every rank reduced into buffer 1 of ``root`` (other ranks' buffer 1 untouched; they
    accumulate in scratch, buffer 2)."""
    p = Program([count, count, count], {SEND_BUF: RECV_BUF} if inplace else None)
    acc = RECV_BUF if rank == root else SCRATCH
    if size == 1:
        p.copy(SEND_BUF, 0, RECV_BUF, 0, count)
    elif algo == "tree":
        _tree_reduce(p, rank, size, root, count, chunk, acc)
    else:
        vr = (rank - root) % size  # chain: root+1 -> root+2 -> ... -> root
        src = SEND_BUF
        if vr != 1 % size:
            _recvs(p, (rank - 1) % size, acc, 0, count, chunk, (SEND_BUF, 0), first=True)
            src = acc
        if vr:
            _sends(p, (rank + 1) % size, src, 0, count, chunk)
    if avg and rank == root:
        _scale(p, count, chunk)
    return p


# -- reduce_scatter / all_gather / alltoall ------------------------------------------------------------------
def reduce_scatter(
    rank: int, size: int, count: int, chunk: int, *, algo: str = "ring", avg: bool = False
) -> Program:
    """Buffer 0 (``size`` × ``count`` elements) reduced over every rank; rank r keeps segment r in buffer 1
    (``count`` elements). Intermediate sums live in scratch (buffer 2, as big as buffer 0)."""
    total = size * count
    p = Program([total, count, total])
    if size == 1:
        p.copy(SEND_BUF, 0, RECV_BUF, 0, count)
        return p
    right, left = (rank + 1) % size, (rank - 1) % size
    for k in range(size - 1):
        s_out, s_in = (rank - k - 1) % size, (rank - k - 2) % size
        _sends(p, right, SEND_BUF if k == 0 else SCRATCH, s_out * count, count, chunk)
        final = k == size - 2
        _recvs(
            p,
            left,
            RECV_BUF if final else SCRATCH,
            0 if final else s_in * count,
            count,
            chunk,
            (SEND_BUF, s_in * count),
        )
    if avg:
        _scale(p, count, chunk)
    return p


def all_gather(
    rank: int,
    size: int,
    count: int,
    chunk: int,
    *,
    algo: str = "ring",
    inplace: bool = False,
    direct_min: int | None = None,
) -> Program:
    """Buffer 0 (``count`` elements) of every rank into segment r of buffer 1 (``size`` × ``count``). In
    place: buffer 0 is segment ``rank`` of buffer 1 already."""
    p = Program([count, size * count])
    own = (RECV_BUF, rank * count) if inplace else (SEND_BUF, 0)
    p.copy(own[0], own[1], RECV_BUF, rank * count, count)
    right, left = (rank + 1) % size, (rank - 1) % size
    direct = _direct(count, direct_min)
    for k in range(size - 1):
        s_out, s_in = (rank - k) % size, (rank - k - 1) % size
        src = own if k == 0 else (RECV_BUF, s_out * count)
        _sends(p, right, *src, count, chunk, direct)
        _recvs(p, left, RECV_BUF, s_in * count, count, chunk, direct=direct)
    return p


def alltoallv(
    rank: int,
    size: int,
    send_counts: Sequence[int],
    send_displs: Sequence[int],
    recv_counts: Sequence[int],
    recv_displs: Sequence[int],
    send_size: int,
    recv_size: int,
    chunk: int,
    *,
    direct_min: int | None = None,
) -> Program:
    """Block ``send_counts[j]`` at ``send_displs[j]`` of buffer 0 to rank j, which receives it at its
    ``recv_displs[rank]`` of buffer 1; pairwise exchange (step k: to rank+k, from rank-k)."""
    p = Program([send_size, recv_size])
    p.copy(SEND_BUF, send_displs[rank], RECV_BUF, recv_displs[rank], recv_counts[rank])
    for k in range(1, size):
        to, frm = (rank + k) % size, (rank - k) % size
        out = _direct(send_counts[to], direct_min)
        _sends(p, to, SEND_BUF, send_displs[to], send_counts[to], chunk, out)
        into = _direct(recv_counts[frm], direct_min)
        _recvs(p, frm, RECV_BUF, recv_displs[frm], recv_counts[frm], chunk, direct=into)
    return p


# -- barrier / send / recv ----------------------------------------------------------------------------------
def barrier(rank: int, size: int) -> Program:
    """Dissemination barrier: round i, an empty message to rank + 2^i once the messages of every earlier
    round have come (ceil(log2 size) rounds)."""
    p = Program([0, 0])
    heard: list[int] = []
    d = 1
    while d < size:
        p.send((rank + d) % size, SEND_BUF, 0, 0, after=heard)
        heard.append(p.recv((rank - d) % size, RECV_BUF, 0, 0))
        d <<= 1
    return p


def send(peer: int, count: int, chunk: int, *, direct_min: int | None = None) -> Program:
    p = Program([count, 0])
    _sends(p, peer, SEND_BUF, 0, count, chunk, _direct(count, direct_min))
    return p


def recv(peer: int, count: int, chunk: int, *, direct_min: int | None = None) -> Program:
    p = Program([0, count])
    _recvs(p, peer, RECV_BUF, 0, count, chunk, direct=_direct(count, direct_min))
    return p


def sendrecv(
    dest: int, send_count: int, source: int, recv_count: int, chunk: int, *, direct_min: int | None = None
) -> Program:
    p = Program([send_count, recv_count])
    _sends(p, dest, SEND_BUF, 0, send_count, chunk, _direct(send_count, direct_min))
    _recvs(p, source, RECV_BUF, 0, recv_count, chunk, direct=_direct(recv_count, direct_min))
    return p
