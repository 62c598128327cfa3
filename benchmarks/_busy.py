"""One process busy-looping beside a measurement: another tenant of a shared machine (a real host is never
idle). Shared by the benchmarks that measure the software NIC both quietly and contended."""

from __future__ import annotations

import contextlib
import multiprocessing as mp
from collections.abc import Iterator


def _spin() -> None:
    while True:
        pass


@contextlib.contextmanager
def busy_process(on: bool = True) -> Iterator[None]:
    """Run what is inside beside one busy-looping process (nothing beside it when ``on`` is False)."""
    if not on:
        yield
        return
    p = mp.get_context("spawn").Process(target=_spin, daemon=True)
    p.start()
    try:
        yield
    finally:
        p.terminate()
        p.join(10)
