"""Element types and reduction operators of `openmrc.collectives`.

Types are numpy dtypes named as NCCL and torch name them (``float32``, ``bfloat16`` ...); bfloat16 is
``ml_dtypes.bfloat16``, the type JAX uses. Reductions are numpy ufuncs applied with ``out=`` into the
destination, so a reduction is the only pass over the data. ``avg`` reduces as ``sum`` and divides once at
the end, by the world size: floating types with a true division, integer types truncating towards zero
(C's ``/``, as NCCL's ``ncclAvg`` does for integers).
"""

from __future__ import annotations

from typing import Any, Final

import ml_dtypes
import numpy as np

__all__ = ["DTYPES", "OPS", "dtype_of", "finish_avg", "ufunc_of"]

DTYPES: Final[dict[str, np.dtype[Any]]] = {
    "int8": np.dtype(np.int8),
    "uint8": np.dtype(np.uint8),
    "int16": np.dtype(np.int16),
    "uint16": np.dtype(np.uint16),
    "int32": np.dtype(np.int32),
    "uint32": np.dtype(np.uint32),
    "int64": np.dtype(np.int64),
    "uint64": np.dtype(np.uint64),
    "float16": np.dtype(np.float16),
    "bfloat16": np.dtype(ml_dtypes.bfloat16),
    "float32": np.dtype(np.float32),
    "float64": np.dtype(np.float64),
}
_ALIASES: Final = {
    "int": "int32",
    "half": "float16",
    "float": "float32",
    "double": "float64",
    "bf16": "bfloat16",
    "fp16": "float16",
    "fp32": "float32",
    "fp64": "float64",
}
_BY_DTYPE: Final = {dt: name for name, dt in DTYPES.items()}

OPS: Final[dict[str, np.ufunc]] = {
    "sum": np.add,
    "prod": np.multiply,
    "min": np.minimum,
    "max": np.maximum,
    "avg": np.add,
}


def dtype_of(what: Any) -> np.dtype[Any]:
    """The dtype named ``what`` (a name of `DTYPES` or an alias such as ``float``/``bf16``) or given as a
    numpy dtype; raises `ValueError` naming the supported types."""
    if isinstance(what, str):
        name = _ALIASES.get(what.lower(), what.lower())
        if name in DTYPES:
            return DTYPES[name]
    else:
        try:
            dt = np.dtype(what)
        except TypeError:
            dt = None
        if dt is not None and dt in _BY_DTYPE:
            return DTYPES[_BY_DTYPE[dt]]
    raise ValueError(f"dtype {what!r}: not supported (supported: {', '.join(DTYPES)})")


def ufunc_of(op: str) -> np.ufunc:
    """The ufunc of reduction ``op`` (sum, prod, min, max, avg); raises `ValueError` otherwise."""
    if not isinstance(op, str) or op.lower() not in OPS:
        raise ValueError(f"op {op!r}: expected one of {', '.join(OPS)}")
    return OPS[op.lower()]


def finish_avg(a: np.ndarray[Any, Any], n: int) -> None:
    """Divide a sum of ``n`` contributions by ``n`` in place (integers truncate towards zero)."""
    if n == 1 or a.size == 0:
        return
    if a.dtype.kind == "f" or a.dtype == DTYPES["bfloat16"]:
        np.divide(a, a.dtype.type(n), out=a)
    elif a.dtype.kind == "u":
        np.floor_divide(a, a.dtype.type(n), out=a)
    else:  # C division: the floor, one up where a negative value did not divide exactly
        d = a.dtype.type(n)
        up = (a < 0) & (np.remainder(a, d) != 0)
        np.floor_divide(a, d, out=a)
        np.add(a, up.astype(a.dtype), out=a)
