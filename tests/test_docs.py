"""Programs the docs show in full are the ones under ``examples/``, and they run as the docs say."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def test_the_two_process_verbs_example_in_the_docs_is_the_example_and_runs() -> None:
    docs = (ROOT / "docs" / "verbs.md").read_text()
    example = (ROOT / "examples" / "verbs_pair.py").read_text()
    assert f"```python\n{example}```" in docs  # the whole program, as it is
    env = {**os.environ, "VERBS_PAIR_PORT": str(_free_port())}
    run = [sys.executable, str(ROOT / "examples" / "verbs_pair.py")]
    server = subprocess.Popen(
        [*run, "server"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    try:
        for _ in range(50):  # the client connects once the server listens
            client = subprocess.run(
                [*run, "client", "127.0.0.1"], capture_output=True, text=True, env=env, timeout=60
            )
            if "Connection refused" not in client.stderr:
                break
        assert client.returncode == 0, client.stderr
        assert client.stdout.strip() == "wrote 1048576 B: SUCCESS"
        out, err = server.communicate(timeout=30)
    finally:
        server.kill()
    assert server.returncode == 0, err
    assert re.fullmatch(r"received 1048576 B with immediate 0xc0ffee: 0001020304050607\.\.\.\n", out), out
    usage = subprocess.run([*run, "client"], capture_output=True, text=True, timeout=60)
    assert usage.returncode == 1 and usage.stderr.startswith("usage: verbs_pair.py server")
