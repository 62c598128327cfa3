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

__all__ = ["EcmpHash", "flow_crc", "fmix32"]

_KEY: Final = struct.Struct("!IIIHHI")


def _mul32(h: int, c: int) -> int:
    """``(h * c) mod 2**32`` for 32-bit ``h`` and ``c`` without a 64-bit product (every intermediate stays a
    machine integer in the compiled build)."""
    return (h * (c & 0xFFFF) + (((h * (c >> 16)) & 0xFFFF) << 16)) & 0xFFFFFFFF


def fmix32(h: int) -> int:
    """MurmurHash3's 32-bit finaliser: every input bit affects every output bit."""
    h ^= h >> 16
    h = _mul32(h, 0x85EBCA6B)
    h ^= h >> 13
    h = _mul32(h, 0xC2B2AE35)
    return h ^ (h >> 16)


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
    switch."""
    return zlib.crc32(_KEY.pack(0, src & 0xFFFFFFFF, dst & 0xFFFFFFFF, sport, dport, flow_label))
