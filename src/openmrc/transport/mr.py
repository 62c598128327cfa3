"""Memory regions: registered buffers with a base VA, lkey/rkey and access rights.

Placement writes straight into the registered buffer through a memoryview (zero-copy). Every remote
access is checked (R_Key, bounds, REMOTE_WRITE) before a single byte is written.
"""

from __future__ import annotations

import contextlib
import errno
import random
from typing import Any

from openmrc.transport.types import Access, LocalProtocolError

__all__ = ["MemoryRegion", "MrTable"]


class MemoryRegion:
    """A registered buffer. ``addr`` is its base virtual address (as RETH.VA / Sge.addr refer to it)."""

    __slots__ = ("access", "addr", "length", "lkey", "pd", "remote_write", "rkey", "view")

    def __init__(
        self, view: memoryview, addr: int, length: int, lkey: int, rkey: int, access: Access
    ) -> None:
        self.view = view
        self.addr = addr
        self.length = length
        self.lkey = lkey
        self.rkey = rkey
        self.access = access
        self.remote_write = bool(access & Access.REMOTE_WRITE)
        self.pd: object = None
        """The protection domain it was registered in (`openmrc.verbs` sets it): then only a QP of the same
        PD may write it remotely, whatever R_Key a packet names. None: any QP of the NIC."""

    def __repr__(self) -> str:
        return (
            f"MemoryRegion(addr={self.addr:#x}, length={self.length}, "
            f"lkey={self.lkey:#x}, rkey={self.rkey:#x})"
        )

    def _offset(self, addr: int, length: int) -> int:
        """Where ``[addr, addr+length)`` starts in the region, or -1 if it does not lie inside."""
        off = addr - self.addr
        return off if off >= 0 and length >= 0 and off + length <= self.length else -1

    def slice(self, addr: int, length: int) -> memoryview | None:
        """The bytes ``[addr, addr+length)`` if they lie inside the region, else None."""
        off = self._offset(addr, length)
        return None if off < 0 else self.view[off : off + length]

    def write(self, addr: int, data: memoryview) -> bool:
        """Copy ``data`` to ``addr`` if it fits inside the region (else write nothing and return False):
        `slice` and a copy in one step, without the intermediate view."""
        n = len(data)
        off = self._offset(addr, n)
        if off < 0:
            return False
        self.view[off : off + n] = data
        return True


class MrTable:
    """The NIC's memory regions, by lkey and by rkey."""

    def __init__(self, rng: random.Random) -> None:
        self._rng = rng
        self._by_lkey: dict[int, MemoryRegion] = {}
        self._by_rkey: dict[int, MemoryRegion] = {}
        self._next_va = 0x1000_0000

    def register(self, buffer: Any, access: Access, addr: int | None = None) -> MemoryRegion:
        try:
            view = memoryview(buffer)
        except TypeError as exc:
            raise LocalProtocolError(
                errno.EINVAL, f"buffer does not support the buffer protocol: {exc}"
            ) from exc
        if view.readonly and access & (Access.LOCAL_WRITE | Access.REMOTE_WRITE):
            raise LocalProtocolError(
                errno.EINVAL, "buffer is read-only: register it without LOCAL_WRITE and REMOTE_WRITE"
            )
        if not view.c_contiguous:
            raise LocalProtocolError(errno.EINVAL, "buffer is not C-contiguous")
        view = view.cast("B")
        if addr is None:
            addr = self._next_va
            self._next_va += (len(view) + 0xFFFF) & ~0xFFF  # keep regions apart
        if addr < 0 or addr + len(view) > 1 << 64:
            raise LocalProtocolError(
                errno.EINVAL, f"address 0x{addr:x} + {len(view)} B outside the 64-bit space"
            )
        lkey, rkey = self._fresh_key(self._by_lkey), self._fresh_key(self._by_rkey)
        mr = MemoryRegion(view, addr, len(view), lkey, rkey, Access(access))
        self._by_lkey[lkey] = mr
        self._by_rkey[rkey] = mr
        return mr

    def deregister(self, mr: MemoryRegion) -> None:
        if self._by_lkey.get(mr.lkey) is not mr:
            raise LocalProtocolError(errno.EINVAL, "memory region is not registered")
        del self._by_lkey[mr.lkey]
        del self._by_rkey[mr.rkey]
        # Let the owner resize or close its buffer again (unless a slice handed out earlier is still alive).
        with contextlib.suppress(BufferError):
            mr.view.release()

    def _fresh_key(self, used: dict[int, MemoryRegion]) -> int:
        while True:
            key = self._rng.getrandbits(32)
            if key and key not in used:
                return key

    def by_lkey(self, lkey: int) -> MemoryRegion | None:
        return self._by_lkey.get(lkey)

    def _remote(self, rkey: int) -> MemoryRegion | None:
        """The region ``rkey`` names if it allows remote writes."""
        mr = self._by_rkey.get(rkey)
        return mr if mr is not None and mr.remote_write else None

    def remote_target(self, rkey: int, addr: int, length: int) -> memoryview | None:
        """Where a remote Write may land, or None if R_Key, bounds or REMOTE_WRITE forbid it."""
        mr = self._remote(rkey)
        return None if mr is None else mr.slice(addr, length)

    def remote_write(self, rkey: int, addr: int, data: memoryview, pd: object = None) -> bool:
        """Place ``data`` at ``addr`` if R_Key, bounds, REMOTE_WRITE and the protection domain allow it (a
        region of a PD takes Writes only from a QP of ``pd``, that one; else write nothing and return
        False): `remote_target` and the copy in one step."""
        mr = self._remote(rkey)
        return mr is not None and (mr.pd is None or mr.pd is pd) and mr.write(addr, data)
