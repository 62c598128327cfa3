"""A node-local store of ONLINE EV and CC profiles, shared by a controller process and the application
processes of one node (each of which runs its own software NIC).

The store is one JSON file (by default under ``/run/openmrc/``, or ``$XDG_RUNTIME_DIR/openmrc/`` for a user):
the controller (`openmrc.ctl.attach_store`) rewrites it whenever a profile goes ONLINE or OFFLINE or an EV
is denied or allowed again; every write replaces the file atomically (a temporary file and ``rename``)
under an exclusive ``flock`` of a lock file beside it, and readers take the shared lock. A device that uses
the store (`UdpDevice.use_profile_store`) resolves a profile id it does not know from the file when a QP
binds it, and re-reads the file when it changes: new profiles become bindable, profiles taken OFFLINE stop
being bindable (QPs that bound them keep their EVs, as on a NIC), and denied EVs are denied in the running
QPs too. Format (version 1)::

    {"version": 1,
     "ev": {"7": {"mode": "UDP", "min_active": 4, "event_mask": 3,
                  "evs": [["c1000000...", 1], ...], "denied": ["c1000000...", ...]}},
     "cc": {"0": {"algorithm": "uet-1.0-nscc", "config": {"base_rtt": 200000, ...}}}}

EVs are the 32-byte expanded values in hex with their port; ``config`` is the algorithm's configuration
dataclass as a mapping (null: the algorithm's defaults).

Security domains (**[openmrc]**, authenticated MRC) travel the same way in a file of their own beside it,
``<store>.domains``, readable by its owner only (it holds the domain keys): ``{"version": 1, "domains":
{"7": {"spec": "SDI:KEY:EPOCH", "revoked": false}}}``. A device that uses the store finds a domain there
when an application asks for it by id (`openmrc.verbs.get_security_domain`), follows its rotations, and
fails the QPs bound to it when the controller revokes it.

Applications say which store profiles their QPs bind, so that the controller refuses to take a profile in
use OFFLINE (EBUSY) whichever process uses it: each process with QPs bound to store profiles keeps a file
``<store>.users/<pid>.json`` (``{"ev": {"7": [qpn, ...]}, "cc": {...}}``), rewritten when a QP binds a
profile or is destroyed, and removed when its device closes; files of processes that no longer run are
ignored and removed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from openmrc.ev import EVFormatMode, EVState, ev_echo32
from openmrc.transport import LocalProtocolError, Nic, NsccConfig, QpState, SecurityDomain
from openmrc.transport.profiles import EvProfileBinding

__all__ = ["FORMAT_VERSION", "ProfileStore", "default_store_path"]

FORMAT_VERSION = 1
_CONFIGS: dict[str, type[Any]] = {"uet-1.0-nscc": NsccConfig}


def default_store_path(device: str = "default") -> Path:
    """``/run/openmrc/<device>.json`` for root, ``$XDG_RUNTIME_DIR/openmrc/<device>.json`` (or the temporary
    directory) otherwise."""
    base = (
        Path("/run")
        if os.geteuid() == 0
        else Path(os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir())
    )
    return base / "openmrc" / f"{device}.json"


def _os_error(path: Path, exc: OSError) -> LocalProtocolError:
    return LocalProtocolError(exc.errno or errno.EIO, f"profile store {path}: {exc.strerror or exc}")


class ProfileStore:
    """The store at ``path`` (its directory is made on first write)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._lock_path = self.path.with_name(self.path.name + ".lock")
        self._seen: int | None = None  # the file's mtime_ns when last read by `changed`
        self.users_dir = self.path.with_name(self.path.name + ".users")
        self.domains_path = self.path.with_name(self.path.name + ".domains")
        self._domains_seen: int | None = None

    def __repr__(self) -> str:
        return f"ProfileStore({str(self.path)!r})"

    @contextlib.contextmanager
    def _locked(self, exclusive: bool) -> Iterator[None]:
        try:
            self._lock_path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise _os_error(self.path, exc) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
            yield
        finally:
            os.close(fd)  # closing releases the lock

    # -- reading ---------------------------------------------------------------------------------------------
    def read(self) -> dict[str, Any]:
        """The store's content (empty when there is no file yet). A file that is not a version-1 store
        raises `LocalProtocolError` EINVAL naming the path."""
        with self._locked(False):
            try:
                text = self.path.read_text()
                self._seen = self.path.stat().st_mtime_ns
            except FileNotFoundError:
                self._seen = None
                return {"version": FORMAT_VERSION, "ev": {}, "cc": {}}
            except OSError as exc:
                raise _os_error(self.path, exc) from None
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as exc:
            raise LocalProtocolError(errno.EINVAL, f"profile store {self.path}: not JSON ({exc})") from None
        if not isinstance(doc, dict) or doc.get("version") != FORMAT_VERSION:
            raise LocalProtocolError(
                errno.EINVAL, f"profile store {self.path}: not a version-{FORMAT_VERSION} store"
            )
        doc.setdefault("ev", {})
        doc.setdefault("cc", {})
        return doc

    def changed(self) -> bool:
        """Whether the file changed since it was last read (cheap: one ``stat``)."""
        try:
            now = self.path.stat().st_mtime_ns
        except OSError:
            now = None
        return now != self._seen

    def read_domains(self) -> dict[int, tuple[str, bool]]:
        """The security domains the controller published: SDI -> (spec, revoked). Empty without a file;
        an unreadable or malformed one raises `LocalProtocolError` EINVAL naming the path."""
        path = self.domains_path
        with self._locked(False):
            try:
                text = path.read_text()
                self._domains_seen = path.stat().st_mtime_ns
            except FileNotFoundError:
                self._domains_seen = None
                return {}
            except OSError as exc:
                raise _os_error(path, exc) from None
        try:
            doc = json.loads(text)
            return {int(k): (str(v["spec"]), bool(v["revoked"])) for k, v in doc["domains"].items()}
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise LocalProtocolError(errno.EINVAL, f"security domains {path}: malformed ({exc!r})") from None

    def domains_changed(self) -> bool:
        """Whether the domains file changed since it was last read (one ``stat``)."""
        try:
            now = self.domains_path.stat().st_mtime_ns
        except OSError:
            now = None
        return now != self._domains_seen

    def publish_domains(self, domains: dict[int, SecurityDomain]) -> None:
        """Write ``domains`` (their keys, epochs, and whether revoked) as the domains file's content,
        readable by its owner only."""
        doc = {
            "version": FORMAT_VERSION,
            "domains": {str(k): {"spec": d.spec(), "revoked": d.revoked} for k, d in sorted(domains.items())},
        }
        with self._locked(True):
            _replace(self.domains_path, json.dumps(doc, indent=1), self.domains_path, mode=0o600)

    # -- writing ---------------------------------------------------------------------------------------------
    def write(self, doc: dict[str, Any]) -> None:
        """Replace the store's content atomically."""
        doc = {"version": FORMAT_VERSION, "ev": doc.get("ev", {}), "cc": doc.get("cc", {})}
        text = json.dumps(doc, indent=1, sort_keys=True)
        with self._locked(True):
            _replace(self.path, text, self.path)

    # -- which processes' QPs bind which profiles ---------------------------------------------------------
    def write_users(self, users: dict[str, dict[int, list[int]]], pid: int | None = None) -> None:
        """Record the QPs of process ``pid`` (default: this one) bound to store profiles, by kind ("ev",
        "cc") and profile id; nothing bound removes the record."""
        path = self.users_dir / f"{os.getpid() if pid is None else pid}.json"
        if not any(users.values()):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            return
        doc = {kind: {str(k): v for k, v in ids.items()} for kind, ids in users.items()}
        try:
            self.users_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise _os_error(self.users_dir, exc) from None
        _replace(path, json.dumps(doc), self.users_dir)

    def users(self, kind: str, profile_id: int) -> list[tuple[int, int]]:
        """(process id, QP number) of the other running processes' QPs bound to profile ``profile_id`` of
        ``kind`` ("ev" or "cc"). Records of processes that exited are removed on the way."""
        out: list[tuple[int, int]] = []
        try:
            entries = sorted(self.users_dir.glob("*.json"))
        except OSError:
            return out
        me = os.getpid()
        for f in entries:
            try:
                pid = int(f.stem)
            except ValueError:
                continue
            if pid == me:
                continue
            if not _running(pid):
                with contextlib.suppress(OSError):
                    f.unlink()
                continue
            try:
                doc = json.loads(f.read_text())
                qpns = doc.get(kind, {}).get(str(profile_id), [])
                out += [(pid, int(q)) for q in qpns]
            except (OSError, ValueError, AttributeError, TypeError):
                continue  # a record being replaced or not ours: the next look
        return out

    def publish(self, nic: Nic, ev_ids: list[int], cc_ids: list[int]) -> None:
        """Write the NIC's EV profiles ``ev_ids`` and CC profiles ``cc_ids`` (and the EV states a
        controller set on them) as the store's whole content."""
        ev: dict[str, Any] = {}
        for pid in ev_ids:
            b = nic.ev_profiles.get(pid)
            if b is None:
                continue
            states = nic.profiles.ev_states.get(pid, {})
            ev[str(pid)] = {
                "mode": b.mode.name,
                "min_active": b.min_active,
                "event_mask": b.event_mask,
                "evs": [[e.hex(), port] for e, port, _ in b.entries],
                "denied": [e.hex() for e, _, echo in b.entries if states.get(echo) is EVState.DENIED],
            }
        cc: dict[str, Any] = {}
        for pid in cc_ids:
            entry = nic.cc_profiles.get(pid)
            if entry is None:
                continue
            algo, cfg = entry
            cc[str(pid)] = {"algorithm": algo, "config": None if cfg is None else dataclasses.asdict(cfg)}  # type: ignore[call-overload]
        self.write({"ev": ev, "cc": cc})


def _replace(path: Path, text: str, name: Path, mode: int = 0o644) -> None:
    """Write ``text`` to ``path`` atomically (a temporary file beside it, then ``rename``), with permissions
    ``mode``; errors name ``name``."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix="." + path.name + ".")
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except OSError as exc:
        with contextlib.suppress(OSError, UnboundLocalError):
            os.unlink(tmp)
        raise _os_error(name, exc) from None


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True


class StoreResolver:
    """Keeps a NIC's store-sourced profiles in step with a `ProfileStore` (see the module's docstring)."""

    def __init__(self, store: ProfileStore, nic: Nic) -> None:
        self.store = store
        self.nic = nic
        self.ev_ids: set[int] = set()  # profiles this resolver installed
        self.cc_ids: set[int] = set()
        self._ev_docs: dict[int, Any] = {}
        self._cc_docs: dict[int, Any] = {}
        self._users: dict[str, dict[int, list[int]]] = {"ev": {}, "cc": {}}  # as last written
        self.domain_ids: set[int] = set()  # security domains this resolver installed

    def publish_users(self, closing: bool = False) -> None:
        """Record which of this NIC's QPs bind store profiles (`ProfileStore.write_users`), if that
        changed; ``closing``: the device is going away, remove the record."""
        users: dict[str, dict[int, list[int]]] = {"ev": {}, "cc": {}}
        if not closing:
            for qp in self.nic.qps.values():
                if qp.state is QpState.RESET:
                    continue
                for kind, ids, pid in (
                    ("ev", self.ev_ids, qp.attr.ev_profile_id),
                    ("cc", self.cc_ids, qp.attr.cc_profile_id),
                ):
                    if pid and pid in ids:
                        users[kind].setdefault(pid, []).append(qp.qp_num)
        if users != self._users:
            self.store.write_users(users)
            self._users = users

    def refresh(self, now: int = 0) -> None:
        """Re-read the store if it changed: install new and changed profiles, remove those it no longer
        holds, and apply its denied EVs to the QPs bound to them; and record this NIC's users."""
        with contextlib.suppress(LocalProtocolError):
            self.publish_users()
        if self.store.domains_changed():
            self._refresh_domains(now)
        if not self.store.changed():
            return
        doc = self.store.read()
        nic = self.nic
        ev_docs = {int(k): v for k, v in doc["ev"].items()}
        cc_docs = {int(k): v for k, v in doc["cc"].items()}
        for pid in list(self.ev_ids):
            if pid not in ev_docs:
                with contextlib.suppress(LocalProtocolError):
                    nic.profiles.remove_ev_profile(pid)
                self.ev_ids.discard(pid)
                self._ev_docs.pop(pid, None)
        for pid in list(self.cc_ids):
            if pid not in cc_docs:
                with contextlib.suppress(LocalProtocolError):
                    nic.profiles.remove_cc_profile(pid)
                self.cc_ids.discard(pid)
                self._cc_docs.pop(pid, None)
        for pid, d in ev_docs.items():
            if pid in nic.ev_profiles and pid not in self.ev_ids:
                continue  # the process's own profile of that id wins
            if self._ev_docs.get(pid) != d:
                self._install_ev(pid, d)
            self._apply_denied(pid, d, now)
        for pid, d in cc_docs.items():
            if pid in nic.cc_profiles and pid not in self.cc_ids:
                continue
            if self._cc_docs.get(pid) != d:
                algo = d.get("algorithm")
                cfg_doc = d.get("config")
                cls = _CONFIGS.get(str(algo))
                cfg = None if cfg_doc is None or cls is None else cls(**cfg_doc)
                nic.add_cc_profile(pid, str(algo), cfg)
                self.cc_ids.add(pid)
                self._cc_docs[pid] = d

    def _refresh_domains(self, now: int) -> None:
        """Install the security domains the store holds that this NIC does not, follow their rotations,
        revoke those the controller revoked (failing their QPs), and forget those it removed."""
        docs = self.store.read_domains()
        nic = self.nic
        for sdi in list(self.domain_ids):
            if sdi not in docs:
                self.domain_ids.discard(sdi)
                nic.domains.pop(sdi, None)
        for sdi, (spec, revoked) in docs.items():
            dom = nic.domains.get(sdi)
            if dom is None:
                try:
                    dom = SecurityDomain.from_spec(spec)
                except ValueError as exc:
                    raise LocalProtocolError(
                        errno.EINVAL, f"security domains {self.store.domains_path}: domain {sdi}: {exc}"
                    ) from None
                nic.domains[sdi] = dom
                self.domain_ids.add(sdi)
            elif sdi not in self.domain_ids:
                continue  # the process's own domain of that id wins
            if revoked and not dom.revoked:
                nic.revoke_domain(dom, now)
                continue
            epoch = int(spec.rsplit(":", 1)[-1])
            while not dom.revoked and dom.epoch != epoch:  # (at most 255 steps: epochs are mod 256)
                dom.rotate()

    def _install_ev(self, pid: int, d: dict[str, Any]) -> EvProfileBinding:
        try:
            mode = EVFormatMode[d["mode"]]
            evs = [(bytes.fromhex(h), int(port)) for h, port in d["evs"]]
            b = self.nic.profiles.add_expanded_profile(
                pid, mode, evs, int(d["min_active"]), int(d["event_mask"])
            )
        except (KeyError, ValueError, TypeError) as exc:
            raise LocalProtocolError(
                errno.EINVAL, f"profile store {self.store.path}: EV profile {pid}: {exc!r}"
            ) from None
        self.ev_ids.add(pid)
        self._ev_docs[pid] = d
        return b

    def _apply_denied(self, pid: int, d: dict[str, Any], now: int) -> None:
        nic = self.nic
        mode = EVFormatMode[d["mode"]]
        denied = {ev_echo32(bytes.fromhex(h), mode) for h in d.get("denied", [])}
        states = nic.profiles.ev_states.setdefault(pid, {})
        changed = {e for e in denied if states.get(e) is not EVState.DENIED} | {
            e for e, s in states.items() if s is EVState.DENIED and e not in denied
        }
        if not changed:
            return
        for e in changed:
            if e in denied:
                states[e] = EVState.DENIED
            else:
                states.pop(e, None)
        for qp in nic.qps.values():
            if qp.evs is not None and (qp.attr.ev_profile_id or 0) == pid:
                for e in changed:
                    if e in qp.evs.by_entropy:
                        nic.modify_ev_state(qp, e, EVState.DENIED if e in denied else EVState.GOOD, now=now)

    def resolve(self, kind: int, pid: int) -> bool:
        """The NIC asks for profile ``pid`` (kind 0: EV, 1: CC; 2: security domain ``pid``) it does not hold:
        look in the store."""
        with contextlib.suppress(LocalProtocolError):  # an unreadable store: what the NIC holds counts
            self.refresh()
        if kind == 2:
            return pid in self.nic.domains
        return pid in (self.nic.ev_profiles if kind == 0 else self.nic.cc_profiles)
