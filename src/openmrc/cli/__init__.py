"""The ``openmrc`` command line. A warning shown while a command runs (a key file others may read, compiled
modules out of date) is one line on stderr, as every other diagnostic: no file name and line of the code."""

from __future__ import annotations

import sys
import warnings
from typing import TextIO


def _one_line(
    message: Warning | str,
    category: type[Warning],
    filename: str,
    lineno: int,
    file: TextIO | None = None,
    line: str | None = None,
) -> None:
    print(f"openmrc: warning: {message}", file=sys.stderr if file is None else file)


warnings.showwarning = _one_line
