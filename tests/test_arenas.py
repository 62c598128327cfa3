"""pymalloc's arenas on transparent huge pages (`openmrc._arenas`, installed by importing the simulator).

Each case runs in a fresh interpreter: the allocator is process-wide and stays once installed."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from openmrc import _native

pytestmark = pytest.mark.skipif(
    not _native.compiled, reason="the arena allocator comes with the compiled build (make native)"
)


def _run(code: str, **env: str) -> dict[str, object]:
    """``code`` in a fresh interpreter; what it prints last, as JSON."""
    done = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    got: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return got


_CHURN = """
import gc, json
import openmrc.sim  # installs the allocator
from openmrc import _arenas
gc.disable()
def fill(n, k):
    return [(i, i * k, str(i)) for i in range(n)]
first = fill(600_000, 3)
after_first = _arenas.stats()
total = sum(a + b + len(c) for a, b, c in first)
del first
gc.collect()
after_free = _arenas.stats()
second = fill(600_000, 5)
after_second = _arenas.stats()
ok = all(b == 5 * a and c == str(a) for a, b, c in second)
print(json.dumps({"first": after_first, "freed": after_free, "second": after_second, "ok": ok,
                  "total": total}))
"""


def test_arenas_hold_objects_and_are_handed_out_again() -> None:
    got = _run(_CHURN)
    first, freed, second = got["first"], got["freed"], got["second"]
    assert isinstance(first, dict) and isinstance(freed, dict) and isinstance(second, dict)
    assert first["installed"] and first["arena_bytes"] > 0
    assert first["arenas_out"] >= 50  # (600,000 tuples, ints and strings: well over 50 MB)
    n = 600_000
    assert got["total"] == sum(i + 3 * i + len(str(i)) for i in range(n))
    given_back = freed["arenas_free"]
    assert given_back > 0 and freed["arenas_out"] < first["arenas_out"]
    # the same objects again take the arenas given back before any new memory (a few may be new: what
    # the first round left in use is not the same)
    assert second["arenas_free"] <= given_back // 10
    carved_first = first["arenas_out"] + first["arenas_free"]
    carved_second = second["arenas_out"] + second["arenas_free"]
    assert carved_second - carved_first <= carved_first // 10
    assert got["ok"]


def test_arenas_made_before_go_back_to_the_allocator_they_came_from() -> None:
    got = _run(
        """
import gc, json
gc.disable()
early = [(i, str(i)) for i in range(300_000)]  # arenas of Python's own allocator
import openmrc.sim
from openmrc import _arenas
del early
gc.collect()
late = [(i, str(i)) for i in range(100_000)]
print(json.dumps(_arenas.stats() | {"ok": late[-1] == (99_999, "99999")}))
"""
    )
    assert got["installed"] and got["ok"]
    assert isinstance(got["foreign_frees"], int) and got["foreign_frees"] > 0


@pytest.mark.parametrize("env", [{"OPENMRC_HUGE_PAGES": "0"}, {"OPENMRC_PURE": "1"}])
def test_left_alone_when_turned_off_or_interpreted(env: dict[str, str]) -> None:
    got = _run(
        """
import json, warnings
warnings.simplefilter("ignore")
import openmrc.sim
from openmrc import _native, _arenas
print(json.dumps({"installed": _arenas.stats()["installed"], "said": _native.huge_page_arenas()}))
""",
        **env,
    )
    assert got == {"installed": False, "said": False}
