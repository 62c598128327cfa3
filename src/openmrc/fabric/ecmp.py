"""ECMP as switches do it, for the baseline: a per-switch salted hash of the flow's 5-tuple (+ flow label).

Each switch hashes (src, dst, UDP source port, UDP destination port, IPv6 flow label), mixes in its own
salt through a non-linear finaliser, and takes the result modulo the number of equal-cost next hops. Salts
differ per switch (derived from one seed and the switch id) so that consecutive tiers do not make
correlated choices (hash polarisation).
A RoCEv2 QP has one 5-tuple, hence one path; spreading needs several QPs (several source ports).
CRC-32 keeps it deterministic across runs and platforms.
"""

from __future__ import annotations

import struct
import zlib
from typing import Final

__all__ = ["EcmpHash", "flow_crc", "fmix32", "mul32"]


def mul32(h: int, c: int) -> int:
    """``(h * c) mod 2**32`` for 32-bit ``h`` and ``c`` from products of 16-bit halves: the compiled build
    multiplies machine integers directly only when both factors are below ``2**30`` (a 32-bit factor
    sends every product through a Python integer multiplication)."""
    hl = h & 0xFFFF
    cl = c & 0xFFFF
    return (hl * cl + (((hl * (c >> 16) + (h >> 16) * cl) & 0xFFFF) << 16)) & 0xFFFFFFFF


def fmix32(h: int) -> int:
    """MurmurHash3's 32-bit finaliser: every input bit affects every output bit."""
    h ^= h >> 16
    h = mul32(h, 0x85EBCA6B)
    h ^= h >> 13
    h = mul32(h, 0xC2B2AE35)
    return h ^ (h >> 16)


def _crc_table() -> list[int]:
    """The byte-at-a-time table of CRC-32 (the reflected polynomial ``0xEDB88320``, as zlib's)."""
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0xEDB88320 if c & 1 else c >> 1
        table.append(c)
    return table


_CRC_TABLE: Final = _crc_table()


def _crc_add(c: int, value: int, nbytes: int) -> int:
    """The CRC-32 register ``c`` after the ``nbytes`` bytes of ``value``, big-endian (as ``!I`` packs)."""
    table = _CRC_TABLE
    for shift in range(8 * nbytes - 8, -8, -8):
        c = table[(c ^ (value >> shift)) & 0xFF] ^ (c >> 8)
    return c


_CRC_KEY_START: Final = _crc_add(0xFFFFFFFF, 0, 4)
"""The register after a flow key's first field (always zero)."""


class EcmpHash:
    """Deterministic salted ECMP hashing for every switch of a fabric."""

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed & 0xFFFFFFFF
        self._salts: dict[int, int] = {}

    def salt(self, switch: int) -> int:
        s = self._salts.get(switch)
        if s is None:
            s = self._salts[switch] = zlib.crc32(struct.pack("!IQ", self.seed, switch))
        return s

    def pick(
        self,
        switch: int,
        choices: int,
        src: int,
        dst: int,
        sport: int,
        dport: int = 4791,
        flow_label: int = 0,
    ) -> int:
        """Index of the next hop (0 .. choices-1) ``switch`` picks for this flow."""
        if choices <= 0:
            raise ValueError("ECMP needs at least one next hop")
        return self.hash32(switch, src, dst, sport, dport, flow_label) % choices

    def hash32(
        self, switch: int, src: int, dst: int, sport: int, dport: int = 4791, flow_label: int = 0
    ) -> int:
        """The 32-bit value `pick` reduces modulo the number of next hops."""
        return self.mix(flow_crc(src, dst, sport, dport, flow_label), self.salt(switch))

    @staticmethod
    def mix(crc: int, salt: int) -> int:
        """A switch's hash of a flow from the flow's `flow_crc` and the switch's `salt` (what `hash32` is;
        a simulator computes the CRC once per packet and this at every hop)."""
        # CRC-32 is affine over XOR: two switches hashing one key with different salts would differ by a
        # constant and polarise (the same low bits at every tier). MurmurHash3's fmix32 finaliser, applied
        # after mixing in the salt, decorrelates them.
        return fmix32(crc ^ salt)


def flow_crc(src: int, dst: int, sport: int, dport: int = 4791, flow_label: int = 0) -> int:
    """CRC-32 of a flow's key fields, the part of every switch's ECMP hash that does not depend on the
    switch: ``zlib.crc32`` of the 20 bytes ``struct.pack("!IIIHHI", 0, src, dst, sport, dport, flow_label)``
    (``src`` and ``dst`` taken modulo ``2**32``), computed a byte at a time without making those bytes
    (a simulator computes one per packet)."""
    if not (0 <= sport <= 0xFFFF and 0 <= dport <= 0xFFFF and 0 <= flow_label <= 0xFFFFFFFF):
        raise ValueError(
            f"flow key out of range: sport {sport}, dport {dport} (16 bits), "
            f"flow label {flow_label} (32 bits)"
        )
    c = _crc_add(_CRC_KEY_START, src & 0xFFFFFFFF, 4)
    c = _crc_add(c, dst & 0xFFFFFFFF, 4)
    c = _crc_add(c, sport << 16 | dport, 4)
    return _crc_add(c, flow_label, 4) ^ 0xFFFFFFFF
