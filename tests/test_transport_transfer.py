"""End-to-end transfers through the pair harness: clean and impaired."""

from __future__ import annotations

import pytest

from openmrc.transport import WcStatus

from .helpers import Impairments, Pair


@pytest.mark.parametrize("size", [1, 4096, 4097, 1 << 20])
def test_clean_transfer(size: int) -> None:
    p = Pair(seed=3, buf_size=max(size, 4096))
    wr = p.write(0, size)
    p.run(lambda: len(p.qp_a.send_cq) > 0)
    wcs = p.completions()
    assert [(w.wr_id, w.status, w.byte_len) for w in wcs] == [(wr, WcStatus.SUCCESS, size)]
    assert p.dst[:size] == p.src[:size]
    assert p.dst[size:] == bytes(len(p.dst) - size)  # nothing written past the message
    assert p.a.stats.retransmits == 0


@pytest.mark.parametrize("seed", range(3))
def test_impaired_transfer_is_bit_exact(seed: int) -> None:
    fail = {2: (20_000, None)}
    imp = Impairments(loss=0.05, dup=0.02, reorder_ns=3000, trim=0.02, ecn=0.05, port_fail=fail)
    p = Pair(seed=seed, imp=imp, buf_size=4 << 20)
    ids = [p.write(i << 20, 1 << 20) for i in range(4)]
    p.run(lambda: len(p.qp_a.send_cq) >= 4, max_time=10**10, max_steps=400_000)
    wcs = p.completions()
    assert [w.wr_id for w in wcs] == ids
    assert all(w.status is WcStatus.SUCCESS for w in wcs)
    assert p.dst == p.src
    assert p.a.stats.retransmits > 0
