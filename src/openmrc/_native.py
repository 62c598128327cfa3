"""Use the mypyc-compiled modules only when they match their sources (see ``scripts/build_native.py``).

``scripts/build_native.py`` compiles the hot modules in place and records the SHA-256 of every compiled
source in ``_native.json``. At import, openmrc compares them: if any source has changed since (or
``OPENMRC_PURE=1`` is set), every compiled module is ignored and the interpreted sources are imported instead,
with a warning in the first case, so an out-of-date build never runs. Compiled modules share one runtime
library, which is why it is all or nothing.

A compiled module's public classes then get what mypyc leaves out of them, so that ``help()`` and
``inspect.signature`` tell the same API in both builds (``scripts/native_api.py``, which also writes the
functions', methods' and properties' docstrings into the C): their docstrings, their annotations as the
source writes them, and a signature made from the source's ``__init__``, read from ``_native_api.json``.
"""

from __future__ import annotations

import contextlib
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
from types import FunctionType, ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from inspect import Signature

_PKG_DIR = Path(__file__).resolve().parent
MANIFEST = _PKG_DIR / "_native.json"
API = _PKG_DIR / "_native_api.json"

compiled: frozenset[str] = frozenset()
"""Names of the modules running compiled in this process (empty when interpreted)."""


class _Finder(importlib.abc.MetaPathFinder):
    """Finds ``names`` (and nothing else) by `_find`."""

    def __init__(self, names: frozenset[str]) -> None:
        self.names = names

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        return self._find(fullname, path, target) if fullname in self.names else None

    def _find(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None
    ) -> importlib.machinery.ModuleSpec | None:
        raise NotImplementedError


class _SourceOnly(_Finder):
    """Finds ``names`` as their ``.py`` sources, never as extension modules."""

    def _find(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None
    ) -> importlib.machinery.ModuleSpec | None:
        source = _PKG_DIR.parent.joinpath(*fullname.split(".")).with_suffix(".py")
        if not source.is_file():  # compiled once, since moved (a module become a package): found as it is now
            return None
        return importlib.util.spec_from_file_location(fullname, source)


class _Compiled(_Finder):
    """Finds ``names`` as usual, loaded by `_CompiledLoader` where they are extension modules."""

    def _find(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None
    ) -> importlib.machinery.ModuleSpec | None:
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        extension = spec is not None and isinstance(spec.loader, importlib.machinery.ExtensionFileLoader)
        if spec is not None and spec.origin and extension:
            spec.loader = _CompiledLoader(fullname, spec.origin)
        return spec


class _CompiledLoader(importlib.machinery.ExtensionFileLoader):
    """Loads a compiled module, then gives its public classes what mypyc leaves out (`restore`), and those
    of the compiled modules it imported: a compiled module imports another directly, not through here."""

    def exec_module(self, module: ModuleType) -> None:
        super().exec_module(module)
        restore(module)
        for name in compiled - _restored:
            imported = sys.modules.get(name)
            if imported is not None and not getattr(imported.__spec__, "_initializing", False):
                restore(imported)


_api: dict[str, dict[str, dict[str, Any]]] | None = None
_restored: set[str] = set()


def restore(module: ModuleType) -> None:
    """Give the public classes of ``module``, compiled, what the build read of them in their source
    (``_native_api.json``): ``__doc__``, ``__annotations__`` (with their dataclass fields' types),
    ``__signature__`` and their members' docstrings. Only help: nothing here fails an import."""
    global _api
    _restored.add(module.__name__)
    if _api is None:
        try:
            _api = json.loads(API.read_text())
        except (OSError, ValueError):
            _api = {}
    for name, api in _api.get(module.__name__, {}).items():
        cls = module.__dict__.get(name)
        if isinstance(cls, type) and cls.__module__ == module.__name__:
            with contextlib.suppress(AttributeError, TypeError, ValueError):
                _restore_class(cls, api.get("doc"), api.get("annotations", {}), api.get("init"))
            for member, doc in api.get("members", {}).items():
                # the methods and properties made in Python (a class mypyc leaves to Python, a static
                # method); a compiled one's docstring is in the C, where it cannot be set
                made = cls.__dict__.get(member)
                if made is not None and getattr(made, "__doc__", None) != doc:
                    with contextlib.suppress(AttributeError, TypeError):
                        made.__doc__ = doc


def _restore_class(cls: type, doc: str | None, annotations: dict[str, str], init: str | None) -> None:
    if issubclass(cls, tuple):
        pass  # a NamedTuple: typing made its annotations of mypyc's, evaluated (the interpreted: ForwardRefs)
    elif annotations:
        cls.__annotations__ = dict(annotations)
    elif "__annotations__" in cls.__dict__:  # (mypyc gives an enum's members annotations)
        del cls.__annotations__
    import dataclasses

    generated = dataclasses.is_dataclass(cls) and init is None
    if generated:
        # the dataclass's own __init__: its annotations and its fields' types as the source writes them
        fields = dataclasses.fields(cls)
        for f in fields:
            f.type = annotations.get(f.name, f.type)
        made = cls.__dict__.get("__init__")
        if isinstance(made, FunctionType):
            made.__annotations__ = {f.name: f.type for f in fields if f.init} | {"return": None}
        if doc is None:  # what @dataclass writes of a class without a docstring
            import inspect

            doc = cls.__name__ + str(inspect.signature(cls)).replace(" -> None", "")
    cls.__doc__ = doc
    if not generated:
        cls.__signature__ = _SourceSignature(cls, init)  # type: ignore[attr-defined]


class _SourceSignature:
    """A compiled class's ``__signature__``: that of its source's ``__init__`` (``init``: its parameters
    and return annotation as written, ``(self, n: int = N) -> None``; None: it has none, the nearest
    base's), made when first asked for, its defaults evaluated in the class's module. mypyc's
    (``__text_signature__``) has no annotations, and there is none when a default is not a literal. A
    subclass with an ``__init__`` of its own (which may take other arguments) is `inspect`'s."""

    def __init__(self, owner: type, init: str | None) -> None:
        self._owner = owner
        self._init = init
        self._signature: Signature | None = None

    def __get__(self, obj: object, cls: type | None = None) -> Signature:
        owner = self._owner
        if cls is None or (cls is not owner and _init_of(cls) is not _init_of(owner)):
            raise AttributeError("__signature__")
        if self._signature is None:
            self._signature = self._make(owner)
        return self._signature

    def _make(self, cls: type) -> Signature:
        import inspect

        if self._init is None:  # the __init__ it inherits, if its source is known
            for base in cls.__mro__[1:]:
                known = base.__dict__.get("__signature__")
                if isinstance(known, _SourceSignature):
                    return known.__get__(None, base)
                if "__init__" in base.__dict__:
                    break
            raise AttributeError("__signature__")
        source = f"from __future__ import annotations\ndef __init__{self._init}: pass"
        try:
            code = compile(source, "<__init__>", "exec", dont_inherit=True)
            made: dict[str, Any] = {}
            exec(code, dict(vars(sys.modules[cls.__module__])), made)  # (a copy: exec adds to it)
            sig = inspect.signature(made["__init__"])
        except Exception as exc:  # (a default its module cannot evaluate): mypyc's signature, if any
            raise AttributeError("__signature__") from exc
        return sig.replace(parameters=list(sig.parameters.values())[1:])


def _init_of(cls: type) -> type:
    """The class whose ``__init__`` ``cls`` has."""
    return next(c for c in cls.__mro__ if "__init__" in c.__dict__)


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
    sys.meta_path.insert(0, _Compiled(names))


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
