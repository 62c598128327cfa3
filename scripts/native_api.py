"""What mypyc leaves out of the modules it compiles, put back from their sources (for ``build_native.py``).

A user's ``help()`` and ``inspect.signature`` must tell the documented API whichever build runs, and mypyc
keeps no docstring: a compiled function, method or property carries its text signature only, a class
nothing (an enum, or any class mypyc leaves to Python, says "mypyc filler docstring"), a dataclass's
annotations are the classes mypyc could name at run time (``type`` for ``int | None``), and a class whose
``__init__`` has a default that is not a literal (``clock=time.monotonic_ns``) has no signature at all.
mypyc has no option to keep them, and its code generator is itself compiled (no hook to give it any), so:

* `document_c` writes each function's, method's and property's docstring into the C that mypyc generated,
  beside the text signature, where CPython reads it (none can be set once compiled), and the signature
  as the source writes it where it can (`text_signature`). It finds the method and getset tables by the
  names mypyc gives them; if a later mypyc writes them otherwise, nothing is found, the build says so,
  and ``tests/test_native_api.py`` fails on the compiled build. A coroutine (``async def``) is the
  exception: mypyc makes it an object of its own that shows no docstring (``UdpDevice.wait_completions``);
* `classes` lists what each public class holds as plain attributes, which ``openmrc._native`` sets when a
  compiled module is imported: ``__doc__``, ``__annotations__`` as the source writes them (the strings of
  ``from __future__ import annotations``, as the interpreted module has them), the parameters of the
  source's ``__init__`` (its signature is made from them when first asked for) and the docstrings of
  the members made in Python (static methods, the members of a class mypyc leaves to Python).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

Key = tuple[str, str | None, str]
"""A function's place: (module, class or None for a module-level function, function or property)."""

Doc = tuple[str | None, str | None]
"""What the C says of a function: its text signature (None: mypyc's) and its docstring."""

_FUNCTION = (ast.FunctionDef, ast.AsyncFunctionDef)


def functions(module: str, source: str) -> dict[Key, Doc]:
    """The text signatures and docstrings of ``module``'s functions, and of its classes' methods and
    properties."""
    found: dict[Key, Doc] = {}
    for node in ast.parse(source).body:
        members = node.body if isinstance(node, ast.ClassDef) else [node]
        owner = node.name if isinstance(node, ast.ClassDef) else None
        for fn in members:
            key = (module, owner, getattr(fn, "name", ""))
            # (the first of a property's getter and setter, the documented of a function's overloads)
            if isinstance(fn, _FUNCTION) and (key not in found or found[key][1] is None):
                found[key] = (text_signature(fn, owner), ast.get_docstring(fn, clean=False))
    return found


def text_signature(fn: ast.FunctionDef | ast.AsyncFunctionDef, owner: str | None) -> str | None:
    """``fn``'s text signature as CPython reads it (``name($self, a, b=1, *, c=2)``), when every default is
    a literal; None otherwise (mypyc's then, which writes a constant's value, but loses the ``*`` of
    keyword-only parameters behind a float default)."""
    args, kinds = fn.args, {d.id for d in fn.decorator_list if isinstance(d, ast.Name)}
    try:
        positional = [*args.posonlyargs, *args.args]
        defaults = [None] * (len(positional) - len(args.defaults)) + [
            repr(ast.literal_eval(d)) for d in args.defaults
        ]
        kw_defaults = [None if d is None else repr(ast.literal_eval(d)) for d in args.kw_defaults]
    except ValueError:
        return None
    params = [a.arg if d is None else f"{a.arg}={d}" for a, d in zip(positional, defaults, strict=True)]
    if args.posonlyargs:
        params.insert(len(args.posonlyargs), "/")
    if owner is not None and "staticmethod" not in kinds and params and params[0] != "/":
        params[0] = "$" + params[0]  # bound: not shown, not passed
    if args.vararg is not None:
        params.append("*" + args.vararg.arg)
    elif args.kwonlyargs:
        params.append("*")
    keywords = zip(args.kwonlyargs, kw_defaults, strict=True)
    params += [a.arg if d is None else f"{a.arg}={d}" for a, d in keywords]
    if args.kwarg is not None:
        params.append("**" + args.kwarg.arg)
    return f"{fn.name}({', '.join(params)})"


def classes(source: str) -> dict[str, dict[str, Any]]:
    """Each public class of ``source``: ``doc``, ``annotations`` (name -> annotation as written),
    ``init``, the parameters and return annotation of the source's ``__init__`` (None: it has none), and
    ``members``, the docstring of each documented method and property (for those made in Python: the
    members of a class mypyc leaves to Python, static methods)."""
    found: dict[str, dict[str, Any]] = {}
    for node in ast.parse(source).body:
        if not isinstance(node, ast.ClassDef) or node.name.startswith("_"):
            continue
        annotations: dict[str, str] = {}
        members: dict[str, str] = {}
        init = None
        for item in node.body:
            if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name) and item.simple:
                annotations[item.target.id] = ast.unparse(item.annotation)
            elif isinstance(item, _FUNCTION):
                doc = ast.get_docstring(item, clean=False)
                if doc is not None:
                    members.setdefault(item.name, doc)
                if item.name == "__init__":
                    returns = "" if item.returns is None else f" -> {ast.unparse(item.returns)}"
                    init = f"({ast.unparse(item.args)}){returns}"
        found[node.name] = {
            "doc": ast.get_docstring(node, clean=False),
            "annotations": annotations,
            "init": init,
            "members": members,
        }
    return found


def _c_string(text: str) -> str:
    """``text`` as a C string literal (UTF-8; octal escapes, so that no digit after one joins it)."""
    out = []
    for b in text.encode():
        out.append(chr(b) if 0x20 <= b < 0x7F and b not in b'"\\?' else f"\\{b:03o}")
    return '"' + "".join(out) + '"'


_TABLE = re.compile(r"static (?:PyMethodDef|PyGetSetDef) (\w+?)_(methods|getseters)\[\] = \{(.*?)\};", re.S)
_METHOD = re.compile(r'\{"(\w+)",([^{}]*?)PyDoc_STR\((NULL|"(?:[^"\\]|\\.)*")\)')
_GETSET = re.compile(r'\{"(\w+)",(\s*\(getter\)\w+,\s*(?:\(setter\)\w+,|NULL,))\s*NULL, NULL\}')


def document_c(c_file: Path, modules: list[str], docs: dict[Key, Doc]) -> int:
    """Write ``docs`` into the method and getset tables of ``c_file``, the C mypyc generated for
    ``modules`` (one compilation group); how many docstrings it wrote."""
    from mypyc.namegen import NameGenerator

    names = NameGenerator([modules])
    owners: dict[str, tuple[str, str | None]] = {}  # a table's C name prefix -> (module, class or None)
    for module, owner, _ in docs:
        prefix = names.private_name(module, owner) if owner else names.private_name(module) + "module"
        owners[prefix] = (module, owner)
    written = 0

    def literal(key: Key, mypyc_doc: str) -> str:
        """What PyDoc_STR says of the function at ``key``, of which mypyc wrote ``mypyc_doc``."""
        nonlocal written
        signature, doc = docs.get(key, (None, None))
        parts = [] if mypyc_doc == "NULL" else [mypyc_doc]  # mypyc's: "name(...)\n--\n\n"
        if signature is not None:
            parts = [_c_string(f"{signature}\n--\n\n")]
        if doc is not None:
            parts.append(_c_string(doc))
            written += 1
        return " ".join(parts) or "NULL"  # (adjacent literals: one string)

    def method(m: re.Match[str], module: str, owner: str | None) -> str:
        return f'{{"{m[1]}",{m[2]}PyDoc_STR({literal((module, owner, m[1]), m[3])})'

    def getset(m: re.Match[str], module: str, owner: str | None) -> str:
        nonlocal written
        _, doc = docs.get((module, owner, m[1]), (None, None))
        if doc is None:
            return m[0]
        written += 1
        return f'{{"{m[1]}",{m[2]} PyDoc_STR({_c_string(doc)}), NULL}}'

    def table(m: re.Match[str]) -> str:
        where = owners.get(m[1])
        if where is None:
            return m[0]
        entry, fill = (_METHOD, method) if m[2] == "methods" else (_GETSET, getset)
        body = entry.sub(lambda e: fill(e, *where), m[3])
        return m[0][: m.start(3) - m.start(0)] + body + "};"

    c_file.write_text(_TABLE.sub(table, c_file.read_text()))
    return written
