"""**[openmrc]** Authenticated MRC: security domains, their keys, the per-QP sealing and opening of packets.

Theory of operation
-------------------
A *security domain* (`SecurityDomain`) is a set of QPs that trust one another: an identifier (SDI) and a
256-bit domain key handed to every member out of band (the controller's store, ``openmrc perf --secure``,
a collective's bootstrap). The key never seals a packet itself: each *epoch* of the domain has its own
AES-128 keys, ``HKDF-SHA256(domain key, salt = "openmrc-sd" | SDI, info = "openmrc auth v1" | epoch)`` for
whole packets and the same with info ``... | epoch | "header"`` for header tags, so an epoch key that
leaks says nothing of the others. Rotation (`SecurityDomain.rotate`) moves senders to the
next epoch; a receiver takes the epoch before, the current one and the next one (two live at every moment
of a rotation, whichever side rotates first: members derive the next key themselves, so a rotation needs
no coordination and costs no packet). Revocation (`SecurityDomain.revoke`) ends the domain at once: nothing
of it is sealed or opened again.

A QP joins a domain when it is set up (`QpSecurity`, the INIT attribute ``security``; both ends must agree,
as they agree on the QP numbers). Each QP draws a random 32-bit SSI and counts the packets it seals; SSI,
its QP number and the counter make the AES-GCM nonce (`openmrc.wire.security`), and the trailer carries
SSI, epoch and counter so that the receiver can rebuild it (the sender's QP number it knows: it is the
peer it was connected to, so a packet of another QP replayed into this one does not verify).

The receiving QP (`SealState.open`) accepts a packet only if its SECH is well formed and of its domain and
agreed mode, its epoch live, its tag verifies under the nonce of *this QP's peer*, and its counter is new:
a replay window of `REPLAY_WINDOW` counters per QP (the QP's peer is its one sender; a counter more than the
window behind the highest one verified is refused, as IPsec's and UET's windows do). The first packet that
verifies pins the peer's SSI; another SSI (an older incarnation of the peer QP, replayed) is refused.
Every refusal is counted in `NicStats` (``rx_auth_failed``, ``rx_auth_replayed``, ``rx_auth_epoch``,
``rx_auth_unsealed``) and has no other effect: the packet never reaches the requester or the responder, so
it can neither place a byte nor acknowledge, delay or fail anything.

What stays visible to an on-path observer: headers (QP numbers, PSNs, opcodes, addresses and lengths) and,
without encryption, payloads. What authentication cannot stop: dropping or delaying packets (MRC's
recovery sees losses), and the members of a domain impersonating one another (one key per domain).
A trimmed packet keeps its trailer (a switch keeps it as it keeps the ICRC): its header tag is verified
and it is taken as a trimmed packet (a fast NACK), nothing more; its counter is then spent, so neither the
packet nor its trimmed copy is taken again.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
import struct
import warnings
from typing import Final

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from openmrc.transport.stats import NicStats
from openmrc.transport.types import LocalProtocolError, SackTransmit, Transmit
from openmrc.wire.constants import is_data_opcode
from openmrc.wire.datagram import data_header_length
from openmrc.wire.packet import _ZERO_PAD
from openmrc.wire.security import (
    BTH_SEALED,
    COUNTER_MAX,
    NONCE_LAYOUT,
    SEAL_OVERHEAD,
    SECH_FLAG_HEADER_TAG,
    SECH_FLAG_WANTS_HEADER_TAG,
    SECH_LAYOUT,
    SECH_VERSION,
    TAG_SIZE,
)

__all__ = ["REPLAY_WINDOW", "KeyFileWarning", "QpSecurity", "SealState", "SecurityDomain"]

REPLAY_WINDOW: Final = 1 << 16
"""Counters a receiving QP remembers behind the highest one verified (a QP has at most 255·128 PSNs in
flight, each sealed once per transmission: reordering across paths stays well inside)."""
DOMAIN_KEY_BYTES: Final = 32
_KEY_FILE_MAX: Final = 4096  # bytes: a key file is one line of about 80


class KeyFileWarning(UserWarning):
    """A key file that others than its owner may read (`SecurityDomain.load` takes it, and warns)."""


_EPOCH_SALT: Final = b"openmrc-sd"
_EPOCH_INFO: Final = b"openmrc auth v1"
_HEADER_INFO: Final = b"header"
_NO_ICRC: Final = b"\x00\x00\x00\x00"  # (what `parse` skips: the ICRC was checked on the datagram)
_BTH_SIZE: Final = 12
_VERSION: Final = SECH_VERSION << 4  # SECH byte 0 without flags
_WINDOW_MASK: Final = REPLAY_WINDOW - 1
_TAG_FLAGS: Final = SECH_FLAG_HEADER_TAG | SECH_FLAG_WANTS_HEADER_TAG  # (what a packet may say beside E)
# Bound methods, not the Structs: compiled, calling one skips a method lookup by name per packet.
_SECH_READ: Final = struct.Struct("!HIIHI").unpack_from
"""SECH in five reads: version/flags << 8 | epoch, SDI, SSI, reserved << 8 | counter >> 32, counter's low
32 (`SECH_LAYOUT`'s fields, two of them paired: fewer objects per packet)."""
_SECH_PACK: Final = SECH_LAYOUT.pack
_NONCE_PACK: Final = NONCE_LAYOUT.pack

REFUSED_UNSEALED: Final = 1
"""Why `SealState.verify` refused a packet: not sealed, or too short for what it claims
(``rx_auth_unsealed``)."""
REFUSED_FAILED: Final = 2
"""Its SECH is not of this QP's domain, mode or peer, or its tag does not verify (``rx_auth_failed``)."""
REFUSED_REPLAYED: Final = 3
"""Its counter was seen, or is too far behind to tell (``rx_auth_replayed``)."""
REFUSED_EPOCH: Final = 4
"""Its epoch is not live, or the domain is revoked (``rx_auth_epoch``)."""


def _uint32(name: str, v: object) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not 0 < v <= 0xFFFFFFFF:
        raise LocalProtocolError(errno.EINVAL, f"{name}={v!r}: expected an integer in [1, 4294967295]")
    return v


class SecurityDomain:
    """A security domain: ``sdi`` (1 .. 2^32-1), the 32-byte domain ``key``, the current ``epoch`` (0..255).

    The same domain is made in every process that takes part from the same three values (`from_spec` reads
    them as one string, `spec` writes it); `generate` draws a fresh key."""

    def __init__(self, sdi: int, key: bytes, *, epoch: int = 0) -> None:
        self.sdi = _uint32("sdi", sdi)
        if not isinstance(key, bytes | bytearray) or len(key) != DOMAIN_KEY_BYTES:
            raise LocalProtocolError(errno.EINVAL, f"a domain key is {DOMAIN_KEY_BYTES} bytes")
        if isinstance(epoch, bool) or not isinstance(epoch, int) or not 0 <= epoch <= 0xFF:
            raise LocalProtocolError(errno.EINVAL, f"epoch={epoch!r}: expected an integer in [0, 255]")
        self._key = bytes(key)
        self.epoch = epoch
        self.revoked = False
        self._aead: dict[int, tuple[AESGCM, AESGCM]] = {}

    @classmethod
    def generate(cls, sdi: int, *, epoch: int = 0) -> SecurityDomain:
        """A domain with a fresh random key."""
        return cls(sdi, secrets.token_bytes(DOMAIN_KEY_BYTES), epoch=epoch)

    @classmethod
    def from_spec(cls, spec: str) -> SecurityDomain:
        """The domain of ``"SDI:KEY[:EPOCH]"`` (KEY as 64 hex digits), what `spec` writes."""
        parts = spec.strip().split(":")
        if len(parts) not in (2, 3):
            raise ValueError("a security domain is SDI:KEY[:EPOCH] (KEY: 64 hex digits)")
        try:
            sdi = int(parts[0], 0)
            key = bytes.fromhex(parts[1])
            epoch = int(parts[2], 0) if len(parts) == 3 else 0
        except ValueError:
            raise ValueError("a security domain is SDI:KEY[:EPOCH] (KEY: 64 hex digits)") from None
        try:
            return cls(sdi, key, epoch=epoch)
        except LocalProtocolError as exc:
            raise ValueError(exc.args[-1] if exc.args else str(exc)) from None

    def fingerprint(self) -> str:
        """16 hex digits that tell whether two members hold the same domain key (derived one way from
        it: they say nothing of the key)."""
        hkdf = HKDF(
            algorithm=hashes.SHA256(),
            length=8,
            salt=_EPOCH_SALT + struct.pack("!I", self.sdi),
            info=b"openmrc fingerprint v1",
        )
        return hkdf.derive(self._key).hex()

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> SecurityDomain:
        """The domain a key file holds (its `spec`, as ``openmrc perf keygen`` writes it); ValueError
        ``"PATH: why"`` when the file cannot be read or holds no domain (not a regular file, larger than a
        key file is, not text). A file that others than its owner may read is taken, with a
        `KeyFileWarning`: a domain key is a secret."""
        name = os.fspath(path)
        try:
            # (without blocking: opening a FIFO for reading would wait for a writer; it is refused below)
            with os.fdopen(os.open(path, os.O_RDONLY | os.O_NONBLOCK), "rb") as f:
                st = os.fstat(f.fileno())
                if not stat.S_ISREG(st.st_mode):
                    raise ValueError(f"{name}: not a regular file (a key file is)")
                data = f.read(_KEY_FILE_MAX + 1)
        except OSError as exc:
            raise ValueError(f"{name}: {exc.strerror or exc}") from None
        if len(data) > _KEY_FILE_MAX:
            raise ValueError(f"{name}: larger than a key file ({_KEY_FILE_MAX} bytes at most)")
        try:
            text = data.decode("ascii")
        except UnicodeDecodeError:
            raise ValueError(f"{name}: not a key file (SDI:KEY[:EPOCH] as text)") from None
        try:
            dom = cls.from_spec(text)
        except ValueError as exc:
            raise ValueError(f"{name}: {exc}") from None
        if st.st_mode & 0o077:
            warnings.warn(
                f"{name}: others may read this key file (mode {stat.S_IMODE(st.st_mode):03o}): a domain key "
                "is a secret (chmod 600)",
                KeyFileWarning,
                stacklevel=2,
            )
        return dom

    def spec(self) -> str:
        """``"SDI:KEY:EPOCH"``: everything another member needs (a secret: hand it out of band only)."""
        return f"{self.sdi}:{self._key.hex()}:{self.epoch}"

    @staticmethod
    def epoch_key(key: bytes, sdi: int, epoch: int, header: bool = False) -> bytes:
        """The AES-128 key of ``epoch`` of the domain ``sdi`` whose domain key is ``key``: for whole
        packets, or (``header``) for header tags."""
        hkdf = HKDF(
            algorithm=hashes.SHA256(),
            length=16,
            salt=_EPOCH_SALT + struct.pack("!I", sdi),
            info=_EPOCH_INFO + bytes((epoch & 0xFF,)) + (_HEADER_INFO if header else b""),
        )
        return hkdf.derive(key)

    def live(self, epoch: int) -> bool:
        """Whether packets sealed in ``epoch`` are taken: the epoch before the current one, the current one
        and the next one, unless the domain is revoked."""
        return not self.revoked and (epoch - self.epoch + 1) & 0xFF <= 2

    def aead(self, epoch: int) -> tuple[AESGCM, AESGCM] | None:
        """The ciphers of ``epoch`` (whole packets, header tags), None if that epoch is not live."""
        a = self._aead.get(epoch)
        if a is None:
            if not self.live(epoch):
                return None
            a = self._aead[epoch] = (
                AESGCM(self.epoch_key(self._key, self.sdi, epoch)),
                AESGCM(self.epoch_key(self._key, self.sdi, epoch, header=True)),
            )
        elif self.revoked:
            return None
        return a

    def rotate(self) -> int:
        """Seal with the next epoch's key from now on; the new epoch. The one before stays live (packets
        in flight), the one before that is dropped."""
        if self.revoked:
            raise LocalProtocolError(errno.EINVAL, f"security domain {self.sdi} is revoked")
        self.epoch = (self.epoch + 1) & 0xFF
        for e in [e for e in self._aead if not self.live(e)]:
            del self._aead[e]
        return self.epoch

    def revoke(self) -> None:
        """End the domain: nothing is sealed or opened under it again (`Nic.revoke_domain` also fails the
        QPs bound to it)."""
        self.revoked = True
        self._aead.clear()

    def __repr__(self) -> str:
        state = "revoked" if self.revoked else f"epoch {self.epoch}"
        return f"SecurityDomain(sdi={self.sdi}, {state})"  # (never the key)


class QpSecurity:
    """The QP attribute ``security`` (**[openmrc]**, set in INIT; both ends of a QP set the same): the
    ``domain`` it belongs to, and whether payloads are ``encrypt``-ed as well as authenticated.
    ``header_tag``: whether the data packets this QP sends carry a header tag, so that a trimmed one is
    verified and NACKed at once. ``"auto"`` (the default): from the first packet in which the peer QP asks
    for them (it received a trimmed packet without one, which it could not verify and recovered as a
    loss), so that a QP pays for header tags (one AES-GCM call per packet) only on a fabric that trims;
    True: always; False: never (a trimmed packet is always recovered as a loss). ``ssi``: the QP's secure
    source identifier, random when not given (a test that needs it fixed gives it)."""

    __slots__ = ("domain", "encrypt", "header_tag", "ssi")

    def __init__(
        self,
        domain: SecurityDomain,
        *,
        encrypt: bool = False,
        header_tag: bool | str = "auto",
        ssi: int | None = None,
    ) -> None:
        if not isinstance(domain, SecurityDomain):
            raise LocalProtocolError(errno.EINVAL, f"domain: expected a SecurityDomain, got {domain!r}")
        if header_tag not in (True, False, "auto") or type(header_tag) not in (bool, str):
            raise LocalProtocolError(errno.EINVAL, f"header_tag: True, False or 'auto', not {header_tag!r}")
        self.domain = domain
        self.encrypt = bool(encrypt)
        self.header_tag: bool | str = header_tag
        self.ssi = None if ssi is None else _uint32("ssi", ssi)

    def __repr__(self) -> str:
        return f"QpSecurity({self.domain!r}, encrypt={self.encrypt}, header_tag={self.header_tag!r})"


class ReplayWindow:
    """The counters one sender's packets carried, as far as `REPLAY_WINDOW` behind the highest verified."""

    __slots__ = ("seen", "top")

    def __init__(self) -> None:
        self.top = 0
        """The highest counter verified."""
        self.seen = bytearray(REPLAY_WINDOW >> 3)
        """One bit per counter within the window behind ``top`` (counter mod the window)."""

    def refuses(self, c: int) -> bool:
        """Whether counter ``c`` was seen already, or is too far behind to tell."""
        top = self.top
        return c <= top and (
            top - c >= REPLAY_WINDOW or bool(self.seen[(c & _WINDOW_MASK) >> 3] >> (c & 7) & 1)
        )

    def mark(self, c: int) -> None:
        """Note counter ``c`` (verified, not seen before)."""
        seen = self.seen
        top = self.top
        if c > top:
            if c - top >= REPLAY_WINDOW:
                seen[:] = bytes(len(seen))
            else:
                x = top + 1
                while x < c:  # counters between the old top and c, not seen yet: a byte's worth at a time
                    i = x & _WINDOW_MASK
                    lo = i & 7
                    k = 8 - lo
                    if k > c - x:
                        k = c - x
                    seen[i >> 3] &= ~(((1 << k) - 1) << lo) & 0xFF
                    x += k
            self.top = c
        i = c & _WINDOW_MASK
        seen[i >> 3] |= 1 << (i & 7)


class SealState:
    """What one QP of a domain needs to seal what it sends and open what it receives; or (``per_sender``)
    what a NIC's endpoint needs for its requests and answers (`Nic.secure_endpoint`), which come from any
    peer NIC: a replay window per sender SSI instead of one pinned peer."""

    __slots__ = (
        "auto_header_tag",
        "domain",
        "encrypt",
        "header_tag",
        "peer_qpn",
        "peer_ssi",
        "qp_num",
        "refused",
        "sent",
        "ssi",
        "wants_header_tag",
        "window",
        "windows",
    )

    def __init__(
        self, qp_num: int, security: QpSecurity, peer_qpn: int = 0, *, per_sender: bool = False
    ) -> None:
        self.qp_num = qp_num
        """The sending QP's number (in the nonce of what it seals)."""
        self.peer_qpn = peer_qpn
        """The peer QP's number (in the nonce of what it opens; its QP sets it in RTR)."""
        self.domain = security.domain
        self.encrypt = security.encrypt
        self.auto_header_tag = security.header_tag == "auto"
        """Header tags from the first verified packet whose SECH says W (`QpSecurity`'s ``"auto"``)."""
        self.header_tag = security.header_tag is True
        """Whether the data packets sealed now carry a header tag."""
        self.wants_header_tag = False
        """Whether this QP received a trimmed packet without a header tag: it sets W in what it seals."""
        ssi = security.ssi
        while not ssi:
            ssi = secrets.randbits(32)
        self.ssi: int = ssi
        self.sent = secrets.randbits(39) if per_sender else 0
        """The counter of the last packet sealed (an endpoint, whose nonces share the reserved QP number
        with every NIC's, starts at random: only a colliding SSI and overlapping counters reuse one)."""
        self.peer_ssi = 0
        self.refused = 0
        """Why `verify` refused the last packet it refused (``REFUSED_*``)."""
        self.window = ReplayWindow()
        self.windows: dict[int, ReplayWindow] | None = {} if per_sender else None
        """Per sender SSI (an endpoint's), made when a sender's first packet verifies."""

    # -- sending -------------------------------------------------------------------------------------------
    def seal(self, t: Transmit, now: int) -> bool:
        """Give ``t`` its sealed bytes (``t.body``: BTH through the tag; a driver adds the ICRC). False if
        it must not leave: the domain is revoked, or the QP has sealed 2^40 packets in this domain."""
        dom = self.domain
        epoch = dom.epoch
        keys = dom.aead(epoch)
        if keys is None or self.sent >= COUNTER_MAX:
            return False
        self.sent = c = self.sent + 1
        hi = c >> 32
        lo = c & 0xFFFFFFFF
        ssi = self.ssi
        nonce = _NONCE_PACK(ssi, self.qp_num << 8 | hi, lo)
        encrypt = self.encrypt
        tpl = t.tpl
        hdr: bytes | bytearray
        if tpl is not None:  # a data packet from its Write's template: its headers come sealed (S set)
            n = t.size
            hdr = tpl.header(t.op, t.ack_req, t.rtx, t.psn, t.va, n, True)
            payload: bytes | memoryview = t.payload
            data = True
        else:
            if type(t) is SackTransmit:
                t.stamp_service(now)  # (leaves now: sealed, no driver may change it later)
            pkt = t.packet
            hdr = bytearray(pkt.encode_headers())
            hdr[8] |= BTH_SEALED
            payload = pkt.payload
            n = len(payload)
            data = is_data_opcode(hdr[0])
        pad = _ZERO_PAD[-n & 3]
        htagged = data and self.header_tag  # (control packets are never trimmed: no header tag)
        flags = (
            _VERSION
            | encrypt
            | (SECH_FLAG_HEADER_TAG if htagged else 0)
            | (SECH_FLAG_WANTS_HEADER_TAG if self.wants_header_tag else 0)
        )
        sech = _SECH_PACK(flags, epoch, dom.sdi, ssi, 0, hi, lo)
        htag = keys[1].encrypt(nonce, b"", b"".join((hdr, sech))) if htagged else b""
        if encrypt and data:
            ct = keys[0].encrypt(nonce, payload, b"".join((hdr, pad, htag, sech)))
            t.body = b"".join((hdr, memoryview(ct)[:n], pad, htag, sech, memoryview(ct)[n:]))
        else:
            aad = b"".join((hdr, payload, pad, htag, sech))
            t.body = aad + keys[0].encrypt(nonce, b"", aad)
        return True

    # -- receiving -----------------------------------------------------------------------------------------
    def open(self, body: memoryview, stats: NicStats, trimmed: bool = False) -> memoryview | bytes | None:
        """The packet ``body`` (BTH through the tag, its ICRC checked unless ``trimmed``) as
        `openmrc.wire.parse` takes it (the MRC 1.0 packet, its last four bytes standing for the ICRC), or
        None: refused and counted in ``stats``. A ``trimmed`` data packet is its headers and trailer (or,
        from an in-process fabric, still whole): its header tag is checked, and its headers come back."""
        out = self.verify(body, trimmed)
        if out is None:
            count_refusal(stats, self.refused)
        return out

    def verify(self, body: memoryview, trimmed: bool = False, n: int = -1) -> memoryview | bytes | None:
        """`open` without counting: None when refused, the reason in ``refused`` (`REFUSED_UNSEALED`,
        `REFUSED_FAILED`, `REFUSED_REPLAYED`, `REFUSED_EPOCH`). ``n``: the packet is ``body``'s first ``n``
        bytes (a datagram with its ICRC, sliced by no one; -1: all of it). A NIC that leaves a sealed
        packet's ICRC unchecked (its tag covers every byte the ICRC does) checks the ICRC of a refused
        one, to count damage apart from forgery."""
        if n < 0 or n > len(body):
            n = len(body)
        if n < _BTH_SIZE + SEAL_OVERHEAD or not body[8] & BTH_SEALED:
            self.refused = REFUSED_UNSEALED
            return None
        sech_at = n - SEAL_OVERHEAD  # SECH and the tag: always the last 32 bytes
        f = _SECH_READ(body, sech_at)
        vfe: int = f[0]  # (typed: compiled, what follows is native integer arithmetic, not object calls)
        sdi: int = f[1]
        ssi: int = f[2]
        rsvd_hi: int = f[3]
        lo: int = f[4]
        vf = vfe >> 8
        epoch = vfe & 0xFF
        rsvd = rsvd_hi >> 8
        hi = rsvd_hi & 0xFF
        dom = self.domain
        c = hi << 32 | lo
        encrypted = self.encrypt
        data = is_data_opcode(body[0])
        has_htag = vf & SECH_FLAG_HEADER_TAG
        peer_ssi = self.peer_ssi
        if (
            vf & ~_TAG_FLAGS != _VERSION | encrypted
            or (has_htag and not data)
            or rsvd
            or sdi != dom.sdi
            or not ssi
            or not c
            or (peer_ssi and ssi != peer_ssi)
        ):
            self.refused = REFUSED_FAILED
            return None
        if trimmed and not has_htag:
            # (no header tag: a trimmed packet cannot be verified; what this QP seals asks for them, which
            # costs the peer an AES-GCM call per packet at worst, whoever trimmed or forged this one)
            if data and self.windows is None:  # (a QP's data; control packets are never trimmed)
                self.wants_header_tag = True
            self.refused = REFUSED_UNSEALED
            return None
        end = sech_at - TAG_SIZE if has_htag else sech_at  # the end of the pad
        if end < _BTH_SIZE:
            self.refused = REFUSED_UNSEALED
            return None
        keys = dom.aead(epoch)
        if keys is None:
            self.refused = REFUSED_EPOCH
            return None
        windows = self.windows
        w = self.window
        if windows is not None:
            w = windows.get(ssi) or ReplayWindow()
        if w.refuses(c):
            self.refused = REFUSED_REPLAYED
            return None
        nonce = _NONCE_PACK(ssi, self.peer_qpn << 8 | hi, lo)
        tag_at = n - TAG_SIZE
        out: memoryview | bytes
        try:
            if data:
                hl = data_header_length(body)
                pad = (body[1] >> 4) & 3
                if hl > (end if trimmed else end - pad):
                    self.refused = REFUSED_FAILED
                    return None
            if data and trimmed:  # its header tag
                keys[1].decrypt(nonce, body[end:sech_at], b"".join((body[:hl], body[sech_at:tag_at])))
                out = b"".join((body[:hl], _NO_ICRC))
            elif data and encrypted:
                aad = b"".join((body[:hl], body[end - pad : tag_at]))
                pt = keys[0].decrypt(nonce, b"".join((body[hl : end - pad], body[tag_at:n])), aad)
                out = b"".join((body[:hl], pt, body[end - pad : end], _NO_ICRC))
            else:  # nearly every packet: the tag over the whole packet
                keys[0].decrypt(nonce, body[tag_at:n], body[:tag_at])
                out = body[: end + 4]  # (four bytes of the trailer stand for the ICRC `parse` skips)
        except InvalidTag:
            self.refused = REFUSED_FAILED
            return None
        w.mark(c)
        if vf & SECH_FLAG_WANTS_HEADER_TAG and self.auto_header_tag:
            self.header_tag = True  # (the peer received a trimmed packet it could not verify)
        if windows is not None:
            windows[ssi] = w
        if not peer_ssi and windows is None:
            self.peer_ssi = ssi
        return out


def count_refusal(stats: NicStats, why: int) -> None:
    """Count a packet `SealState.verify` refused for ``why`` in ``stats``."""
    if why == REFUSED_FAILED:
        stats.rx_auth_failed += 1
    elif why == REFUSED_REPLAYED:
        stats.rx_auth_replayed += 1
    elif why == REFUSED_EPOCH:
        stats.rx_auth_epoch += 1
    else:
        stats.rx_auth_unsealed += 1
