"""Use the mypyc-compiled modules only when they match their sources (see ``scripts/build_native.py``).

``scripts/build_native.py`` compiles the hot modules in place and records the SHA-256 of every compiled
source in ``_native.json``. At import, openmrc compares them: if any source has changed since (or
``OPENMRC_PURE=1`` is set), every compiled module is ignored and the interpreted sources are imported instead,
with a warning in the first case, so an out-of-date build never runs. Compiled modules share one runtime
library, which is why it is all or nothing.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

_PKG_DIR = Path(__file__).resolve().parent
MANIFEST = _PKG_DIR / "_native.json"

compiled: frozenset[str] = frozenset()
"""Names of the modules running compiled in this process (empty when interpreted)."""


class _SourceOnly(importlib.abc.MetaPathFinder):
    """Finds ``names`` as their ``.py`` sources, never as extension modules."""

    def __init__(self, names: frozenset[str]) -> None:
        self.names = names

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in self.names:
            return None
        source = _PKG_DIR.parent.joinpath(*fullname.split(".")).with_suffix(".py")
        if not source.is_file():  # compiled once, since moved (a module become a package): found as it is now
            return None
        return importlib.util.spec_from_file_location(fullname, source)


def _digest(source: Path) -> str:
    return hashlib.sha256(source.read_bytes()).hexdigest()


def _stale(modules: dict[str, str]) -> list[str]:
    stale = []
    for name, sha in modules.items():
        source = _PKG_DIR.parent.joinpath(*name.split(".")).with_suffix(".py")
        try:
            if _digest(source) != sha:
                stale.append(name)
        except OSError:
            stale.append(name)
    return stale


def setup() -> None:
    """Called once by ``openmrc/__init__``, before any compiled module can be imported."""
    global compiled
    try:
        modules: dict[str, str] = json.loads(MANIFEST.read_text())["modules"]
    except (OSError, ValueError, KeyError):
        return  # nothing compiled
    names = frozenset(modules)
    if os.environ.get("OPENMRC_PURE", "") not in ("", "0"):
        sys.meta_path.insert(0, _SourceOnly(names))
        return
    stale = _stale(modules)
    if stale:
        warnings.warn(
            f"openmrc: compiled modules are out of date ({', '.join(stale[:3])}"
            f"{' …' if len(stale) > 3 else ''} changed); running interpreted. "
            "Rebuild with `make native` (or `python scripts/build_native.py`).",
            RuntimeWarning,
            stacklevel=3,
        )
        sys.meta_path.insert(0, _SourceOnly(names))
        return
    compiled = names


def extension(name: str) -> ModuleType | None:
    """The C extension ``openmrc.<name>`` built beside the compiled modules (``scripts/build_native.py``
    builds each from ``<name>.c``), or None: only with the compiled build, and only when it was built from
    today's source (otherwise the next `make native` builds it again, and the caller keeps to Python)."""
    if not compiled:
        return None
    try:
        built = json.loads(MANIFEST.read_text()).get("c", {}).get(name)
        if built is None or built != _digest(_PKG_DIR / f"{name}.c"):
            return None
        return importlib.import_module(f"openmrc.{name}")
    except (OSError, ValueError, AttributeError, ImportError):
        return None


def huge_page_arenas() -> bool:
    """From now on, keep this process's small objects (pymalloc's arenas) in memory advised for
    transparent huge pages (``_arenas.c``): a large simulation's objects are touched in no particular
    order, and with 4 KB pages nearly every touch of a cold one also walks the page tables. Only with the
    compiled build (`extension`), and not when ``OPENMRC_HUGE_PAGES=0``; whether the allocator is in
    place. The kernel backs the memory with huge pages when ``/sys/kernel/mm/transparent_hugepage/enabled``
    is ``madvise`` or ``always``."""
    if os.environ.get("OPENMRC_HUGE_PAGES", "1").strip() == "0":
        return False
    arenas = extension("_arenas")
    return arenas is not None and bool(arenas.install())
