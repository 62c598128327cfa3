"""Start ``n`` ranks as local processes, each with a `Communicator`, and collect what each returns.

    results = run_local(4, my_job, arg)            # my_job(comm, arg) in 4 processes

The parent serves the store (`TCPStore`); every rank is a fresh interpreter (``python -m
openmrc.collectives.launch``, no fork: the ranks start their own threads) that runs ``fn(comm, *args)``
(``fn`` importable by name: a module-level function; one of the ``__main__`` script works too) and hands its
return value back; `run_local` returns them in rank order. A rank that raises makes `run_local` raise
`RankFailed` with every rank's outcome once the others have finished or failed (they do: a dead rank is
reported to the survivors by the communicator); ``timeout`` bounds the whole run, after which every rank
still running is killed. The ranks ignore Ctrl-C: the parent gets it, stops every rank and raises
KeyboardInterrupt; SIGTERM (a scheduler's cancel, ``timeout``, ``kill``) stops them too and exits with 143,
and a rank whose parent dies (SIGKILL) is killed by the kernel with it (Linux), not left running.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import pickle
import runpy
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Final

from openmrc.collectives.bootstrap import TCPStore

__all__ = ["RankFailed", "run_local"]


class RankFailed(RuntimeError):
    """One or more ranks failed: ``outcomes[r]`` is ``("ok", value)``, ``("error", text)`` or ``("lost",
    reason)`` for rank r."""

    def __init__(self, outcomes: list[tuple[str, Any]]) -> None:
        bad = [
            (str(o[1]) if str(o[1]).startswith(f"rank {r}: ") else f"rank {r}: {o[1]}").rstrip()
            for r, o in enumerate(outcomes)
            if o[0] != "ok"
        ]
        super().__init__("; ".join(line.splitlines()[-1] if line else line for line in bad))
        self.outcomes = outcomes


def _resolve(spec: dict[str, Any]) -> Callable[..., Any]:
    """The function to run: by reference, or by name from the parent's ``__main__`` script."""
    if spec["main"] is None:
        fn: Callable[..., Any] = pickle.loads(spec["fn"])
        return fn
    ns = runpy.run_path(spec["main"], run_name="__mp_main__")
    obj: Any = ns[spec["fn"].split(".")[0]]
    for part in spec["fn"].split(".")[1:]:
        obj = getattr(obj, part)
    return obj  # type: ignore[no-any-return]


_PR_SET_PDEATHSIG: Final = 1


def _die_with_parent(parent: int) -> None:
    """Have the kernel kill this process when its parent dies (Linux's PR_SET_PDEATHSIG), and exit now if
    it already has: a rank whose launcher is gone has no one to report to."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:
        os._exit(1)


def _rank_main() -> None:
    """One rank (``python -m openmrc.collectives.launch``): its spec on stdin, its outcome to a file."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's: it stops every rank
    spec = pickle.load(sys.stdin.buffer)
    _die_with_parent(spec["parent"])
    try:
        from openmrc.collectives.communicator import Communicator

        fn = _resolve(spec)
        store = TCPStore("127.0.0.1", spec["port"], timeout=60)
        with Communicator(spec["rank"], spec["size"], store, **spec["kwargs"]) as comm:
            outcome: tuple[str, Any] = ("ok", fn(comm, *spec["args"]))
    except BaseException as exc:  # reported to the parent, which decides
        from openmrc.collectives.engine import CollectiveError

        text = str(exc) if isinstance(exc, CollectiveError) else None
        outcome = ("error", text or "".join(traceback.format_exception_only(type(exc), exc)).strip())
    try:
        sys.stdout.flush()
    except BrokenPipeError:  # the reader went away: nothing more goes there (not even at exit)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    tmp = spec["out"] + ".part"
    with open(tmp, "wb") as f:
        pickle.dump(outcome, f)
    os.replace(tmp, spec["out"])


def _fn_spec(fn: Callable[..., Any]) -> tuple[Any, str | None]:
    if getattr(fn, "__module__", None) == "__main__":
        main = getattr(sys.modules["__main__"], "__file__", None)
        if main is None:
            raise ValueError("run_local: fn is defined interactively; define it in a module")
        return fn.__qualname__, str(Path(main).resolve())
    try:
        return pickle.dumps(fn), None
    except (pickle.PicklingError, AttributeError, TypeError) as exc:
        raise ValueError(f"run_local: fn must be a module-level function ({exc})") from None


def _signal_name(n: int) -> str:
    try:
        return signal.Signals(n).name
    except ValueError:
        return f"signal {n}"


@contextlib.contextmanager
def _terminate_as_exit() -> Iterator[None]:
    """SIGTERM raises SystemExit(143) inside (on the main thread, where no handler of the caller's is
    set), so that what ``run_local`` started is stopped and cleaned up, as after Ctrl-C."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.getsignal(signal.SIGTERM)
    if old is not signal.SIG_DFL:
        yield
        return

    def stop(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def run_local(
    n: int,
    fn: Callable[..., Any],
    *args: Any,
    timeout: float = 300.0,
    comm_kwargs: dict[str, Any] | None = None,
    on_start: Callable[[list[Any]], None] | None = None,
) -> list[Any]:
    """Run ``fn(comm, *args)`` on ``n`` local ranks; their return values in rank order (see the module).
    ``on_start(processes)``: called once the ranks are started (tests kill one from there)."""
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= 256:
        raise ValueError(f"n: {n!r} outside 1..256 local ranks")
    fn_ref, main = _fn_spec(fn)
    server = TCPStore("127.0.0.1", 0, is_master=True, timeout=60)
    procs: list[subprocess.Popen[bytes]] = []
    with _terminate_as_exit(), tempfile.TemporaryDirectory(prefix="openmrc-ranks-") as tmp:
        outs = [os.path.join(tmp, f"rank{r}.pickle") for r in range(n)]
        outcomes: list[tuple[str, Any] | None] = [None] * n
        try:
            for r in range(n):
                p = subprocess.Popen(
                    [sys.executable, "-m", "openmrc.collectives.launch"], stdin=subprocess.PIPE
                )
                spec = {
                    "rank": r,
                    "size": n,
                    "port": server.port,
                    "fn": fn_ref,
                    "main": main,
                    "args": args,
                    "kwargs": dict(comm_kwargs or {}),
                    "out": outs[r],
                    "parent": os.getpid(),
                }
                assert p.stdin is not None
                p.stdin.write(pickle.dumps(spec))
                p.stdin.close()
                procs.append(p)
            if on_start is not None:
                on_start(procs)
            end = time.monotonic() + timeout
            while any(p.poll() is None for p in procs) and time.monotonic() < end:
                time.sleep(0.05)
            for r, p in enumerate(procs):
                if p.poll() is None:
                    outcomes[r] = ("lost", f"still running after {timeout:g} s (killed)")
                elif os.path.exists(outs[r]):
                    with open(outs[r], "rb") as f:
                        outcomes[r] = pickle.load(f)
                elif p.returncode < 0:
                    outcomes[r] = ("lost", f"killed by {_signal_name(-p.returncode)} without a result")
                else:
                    outcomes[r] = ("lost", f"exited with code {p.returncode} without a result")
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
            for p in procs:
                p.wait()
            server.close()
    final = [o if o is not None else ("lost", "no result") for o in outcomes]
    if any(o[0] != "ok" for o in final):
        raise RankFailed(final)
    return [o[1] for o in final]


if __name__ == "__main__":
    _rank_main()
