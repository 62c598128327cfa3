"""The API a user's ``help()`` and ``inspect`` see is the one the sources document, whichever build runs
(``scripts/native_api.py`` and `openmrc._native.restore` put back what mypyc leaves out): each public class's
and function's docstring, its signature with the parameters and annotations the source writes, a class's
annotations, and its methods' and properties' docstrings. The suite runs compiled and interpreted."""

from __future__ import annotations

import ast
import dataclasses
import enum
import importlib
import inspect
import pydoc
import typing
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

import pytest

import openmrc
from openmrc import _native

PACKAGES = ["openmrc.verbs", "openmrc.ctl", "openmrc.provider", "openmrc.transport", "openmrc.wire"]
PACKAGES += ["openmrc.ev"]
SRC = Path(openmrc.__file__).parent
FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)


def _public() -> list[Any]:
    seen: dict[int, Any] = {}
    for name in PACKAGES:
        package = importlib.import_module(name)
        for attr in package.__all__:
            obj = getattr(package, attr)
            ours = getattr(obj, "__module__", "").startswith("openmrc.")
            if ours and (inspect.isclass(obj) or callable(obj)):
                seen.setdefault(id(obj), obj)
    return sorted(seen.values(), key=lambda o: f"{o.__module__}.{o.__qualname__}")


PUBLIC = _public()


@cache
def _source(module: str) -> dict[str, ast.AST]:
    path = SRC.joinpath(*module.split(".")[1:]).with_suffix(".py")
    return {n.name: n for n in ast.parse(path.read_text()).body if hasattr(n, "name")}


def _node(obj: Any) -> Any:
    node = _source(obj.__module__).get(obj.__name__)
    if node is None:
        pytest.skip(f"{obj.__qualname__} is not defined at the top of {obj.__module__}")
    return node


def _doc(node: Any) -> str | None:
    doc = ast.get_docstring(node, clean=False)
    return None if doc is None else inspect.cleandoc(doc)


def _params(fn: ast.FunctionDef, bound: bool) -> list[tuple[str, str, str | None]]:
    """(name, kind, annotation as written) of each parameter of ``fn``, its first dropped if ``bound``."""
    a = fn.args
    kinds = [
        *[(p, "POSITIONAL_ONLY") for p in a.posonlyargs],
        *[(p, "POSITIONAL_OR_KEYWORD") for p in a.args],
        *([(a.vararg, "VAR_POSITIONAL")] if a.vararg else []),
        *[(p, "KEYWORD_ONLY") for p in a.kwonlyargs],
        *([(a.kwarg, "VAR_KEYWORD")] if a.kwarg else []),
    ]
    out = [(p.arg, k, None if p.annotation is None else ast.unparse(p.annotation)) for p, k in kinds]
    return out[1:] if bound else out


def _ids(obj: Any) -> str:
    return f"{obj.__module__.removeprefix('openmrc.')}.{obj.__qualname__}"


@pytest.mark.parametrize("obj", [o for o in PUBLIC if inspect.isclass(o)], ids=_ids)
def test_a_public_class_is_documented_as_written(obj: type) -> None:
    node = _node(obj)
    doc = _doc(node)
    if doc is not None:
        assert inspect.getdoc(obj) == doc
    assert "mypyc" not in (obj.__doc__ or "")
    annotations = {
        s.target.id: ast.unparse(s.annotation)
        for s in node.body
        if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)
    }
    if issubclass(obj, tuple):  # a NamedTuple's, evaluated (by typing) in either build
        assert typing.get_type_hints(obj) == {k: _evaluate(v, obj) for k, v in annotations.items()}
    elif not issubclass(obj, enum.Enum):
        assert inspect.get_annotations(obj) == annotations
    init = next((f for f in node.body if isinstance(f, ast.FunctionDef) and f.name == "__init__"), None)
    if init is not None:
        expected = _params(init, bound=True)
    elif dataclasses.is_dataclass(obj):
        fields = sorted((f for f in dataclasses.fields(obj) if f.init), key=lambda f: bool(f.kw_only))
        kinds = {False: "POSITIONAL_OR_KEYWORD", True: "KEYWORD_ONLY"}
        expected = [(f.name, kinds[bool(f.kw_only)], annotations[f.name]) for f in fields]
    else:
        return
    sig = inspect.signature(obj)
    assert [(p.name, p.kind.name, _annotation(p)) for p in sig.parameters.values()] == expected
    for name, member in vars(obj).items():
        source = next((f for f in node.body if isinstance(f, FUNCTIONS) and f.name == name), None)
        if source is None or name.startswith("_") or _doc(source) is None:
            continue
        if isinstance(source, ast.AsyncFunctionDef) and _native.compiled:
            continue  # mypyc's coroutine objects show no docstring (scripts/native_api.py)
        assert inspect.getdoc(member) == _doc(source), name


@pytest.mark.parametrize("obj", [o for o in PUBLIC if not inspect.isclass(o)], ids=_ids)
def test_a_public_function_is_documented_as_written(obj: Callable[..., Any]) -> None:
    node = _node(obj)
    if _doc(node) is not None:
        assert inspect.getdoc(obj) == _doc(node)
    sig = inspect.signature(obj)
    assert [(p.name, p.kind.name) for p in sig.parameters.values()] == [
        (name, kind) for name, kind, _ in _params(node, bound=False)
    ]


def test_help_of_the_device_shows_its_documented_api() -> None:
    """The one a user reads first: its docstring, its signature with annotations and every method's."""
    from openmrc.provider.udp import UdpDevice

    text = pydoc.render_doc(UdpDevice, renderer=pydoc.plaintext)
    assert "A software MRC NIC with one UDP socket per port." in text
    assert "UdpDevice(endpoints: 'Sequence[str | Endpoint]', *, dport: 'int' = 4791," in text
    assert "This device's endpoint on every port" in text  # endpoints()
    assert "Whether sends use UDP segmentation offload" in text  # gso, a property


def test_a_subclass_made_in_python_has_the_signature_of_its_own_init() -> None:
    """A congestion control a user writes (a subclass of a compiled class): its ``__init__``'s, or the
    base's when it has none."""
    from openmrc.transport import CongestionControl

    class Tuned(CongestionControl):
        def __init__(self, *, mtu: int, gain: float = 0.5) -> None:
            super().__init__(mtu=mtu)

    class Plain(CongestionControl):
        pass

    assert list(inspect.signature(Tuned).parameters) == ["mtu", "gain"]
    assert list(inspect.signature(Plain).parameters) == ["mtu", "config", "now"]


def _annotation(p: inspect.Parameter) -> str | None:
    return None if p.annotation is inspect.Parameter.empty else str(p.annotation)


def _evaluate(annotation: str, cls: type) -> Any:
    return eval(annotation, vars(importlib.import_module(cls.__module__)))
