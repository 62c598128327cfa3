"""The namespace testbed: build, fault and tear down (see the package docstring)."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Final

from openmrc.fabric.clos import MultiPlaneClos
from openmrc.fabric.linux import LinuxFabric, load_export
from openmrc.fabric.srv6 import UsidPlan

__all__ = ["DEFAULT_PREFIX", "DEFAULT_STATE_DIR", "MODES", "Testbed", "TestbedError", "missing"]

DEFAULT_PREFIX: Final = os.environ.get("OPENMRC_TESTBED_PREFIX", "omrc-")
DEFAULT_STATE_DIR: Final = Path(os.environ.get("OPENMRC_TESTBED_DIR", "/run/openmrc-testbed"))
MODES: Final = ("srv6", "ecmp")
MAX_NODES: Final = 512  # namespaces a testbed may make (each is a few hundred kB of kernel state)
_TABLE: Final = "openmrc"


class TestbedError(RuntimeError):
    """The testbed cannot do what was asked; the message says why."""

    __test__ = False  # not a test class, whatever pytest thinks of the name


def missing() -> str | None:
    """Why the testbed cannot run here (not root, a tool not installed), or None."""
    if os.geteuid() != 0:
        return "the testbed needs root (it creates network namespaces)"
    for tool, pkg in (("ip", "iproute2"), ("nft", "nftables"), ("ethtool", "ethtool")):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (apt-get install {pkg})"
    return None


def _run(args: Sequence[str], *, stdin: str | None = None, check: bool = True) -> str:
    """The command's output; on failure `TestbedError` with its message (``check``) or ""."""
    r = subprocess.run(list(args), input=stdin, capture_output=True, text=True, check=False)
    if r.returncode:
        if not check:
            return ""
        raise _failed(args, r.returncode, r.stdout, r.stderr)
    return r.stdout


def _failed(args: Sequence[str], code: int, out: str, err: str) -> TestbedError:
    why = (err or out).strip() or f"exit status {code}"
    return TestbedError(f"{shlex.join(args)}: {why}")


def _run_together(cmds: Sequence[tuple[Sequence[str], str]]) -> None:
    """Run every (command, standard input) at once and wait for all; `TestbedError` with the first one's
    message that failed."""
    procs = []
    for args, stdin in cmds:
        p = subprocess.Popen(
            list(args), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        assert p.stdin is not None
        p.stdin.write(stdin)  # (a few lines: fits the pipe, never blocks)
        p.stdin.close()
        procs.append((args, p))
    results = []
    for args, p in procs:
        assert p.stdout is not None and p.stderr is not None
        out, err = p.stdout.read(), p.stderr.read()  # (short: the pipes cannot fill while one is read)
        p.wait()
        p.stdout.close()
        p.stderr.close()
        results.append((args, p, out, err))
    for args, p, out, err in results:
        if p.returncode:
            raise _failed(args, p.returncode, out, err)


class Testbed:
    """The namespaces named ``prefix``<node> and their export under ``state_dir``."""

    __test__ = False

    def __init__(self, prefix: str = DEFAULT_PREFIX, state_dir: Path | str = DEFAULT_STATE_DIR) -> None:
        if not prefix or len(prefix) > 16 or not all(c.isalnum() or c in "-_" for c in prefix):
            raise ValueError(f"Testbed.prefix: {prefix!r} is not 1..16 letters, digits, '-' or '_'")
        self.prefix = prefix
        self.state_dir = Path(state_dir)
        self.export_dir = self.state_dir / "export"
        self._state_file = self.state_dir / "state.json"
        self.changing_at: float | None = None
        self.changed_at: float | None = None
        """Wall-clock times (``time.time()``) at which the last `fail`, `loss` or `heal` started to be
        applied, and was in effect at both ends of its link (what an experiment measures detection and
        recovery from)."""

    # -- shape ---------------------------------------------------------------------------------------------
    @staticmethod
    def shape(planes: int, hosts: int, spines: int, hosts_per_t0: int | None = None) -> MultiPlaneClos:
        """The leaf-spine of the testbed: ``planes`` planes, each with ``spines`` T1s and as many T0s as
        ``hosts`` need at ``hosts_per_t0`` (default ``spines``: no oversubscription) per T0."""
        for name, v in (("planes", planes), ("hosts", hosts), ("spines", spines)):
            if v < 1:
                raise ValueError(f"--{name} {v}: at least 1")
        hpt = spines if hosts_per_t0 is None else hosts_per_t0
        if hpt < 1 or hpt % spines:
            raise ValueError(f"--hosts-per-t0 {hpt}: a multiple of --spines ({spines})")
        t0_per_plane = -(-hosts // hpt)
        topo = MultiPlaneClos(planes, hosts, hpt + spines, t0_per_plane, oversubscription=hpt // spines)
        if topo.num_nodes() > MAX_NODES:
            raise ValueError(f"{topo.num_nodes()} namespaces: the testbed makes at most {MAX_NODES}")
        return topo

    # -- life cycle ----------------------------------------------------------------------------------------
    def ns(self, node: str) -> str:
        return self.prefix + node

    def namespaces(self) -> list[str]:
        """The namespaces of this testbed that exist now (from ``ip netns list``)."""
        out = _run(["ip", "netns", "list"])
        names = [line.split()[0] for line in out.splitlines() if line.strip()]
        return sorted(n for n in names if n.startswith(self.prefix))

    def up(
        self,
        planes: int = 2,
        hosts: int = 4,
        spines: int = 2,
        *,
        mode: str = "srv6",
        hosts_per_t0: int | None = None,
        log: Callable[[str], None] | None = None,
    ) -> LinuxFabric:
        """Build the fabric; on any error everything made so far is removed again."""
        why = missing()
        if why:
            raise TestbedError(why)
        if mode not in MODES:
            raise ValueError(f"--mode {mode!r}: one of {', '.join(MODES)}")
        topo = self.shape(planes, hosts, spines, hosts_per_t0)
        there = self.namespaces()
        if there:
            raise TestbedError(
                f"a testbed is up already ({len(there)} namespaces {self.prefix}*): "
                "`openmrc testbed down` first"
            )
        fab = LinuxFabric(UsidPlan(topo), srv6=mode == "srv6")
        say = log or (lambda _msg: None)
        try:
            self.state_dir.mkdir(parents=True, exist_ok=True)
            shutil.rmtree(self.export_dir, ignore_errors=True)
            fab.write(self.export_dir)
            state: dict[str, Any] = {"mode": mode, "faults": {}, "complete": False}  # until all is configured
            self._save(state)
            nodes = [topo.node_name(n) for n in range(topo.num_nodes())]
            _run(["ip", "-batch", "-"], stdin="".join(f"netns add {self.ns(n)}\n" for n in nodes))
            cmds = []
            for ln in fab.links():
                cmds.append(
                    f"link add {ln['a_dev']} netns {self.ns(ln['a'])} type veth "
                    f"peer name {ln['b_dev']} netns {self.ns(ln['b'])}\n"
                )
            _run(["ip", "-batch", "-"], stdin="".join(cmds))
            say(f"{len(nodes)} namespaces, {len(cmds)} veth links")
            for i, n in enumerate(nodes):
                steps = ["set -e", "ip link set lo up"]
                if i < topo.num_hosts:  # the kernel computes (and the receiver checks) UDP checksums
                    steps += [f"ethtool -K eth{p} tx off >/dev/null" for p in range(planes)]
                steps.append(f"sh {shlex.quote(str(self.export_dir / 'linux' / f'{n}.sh'))}")
                _run(["ip", "netns", "exec", self.ns(n), "sh", "-c", "\n".join(steps)])
            self._save(state | {"complete": True})
            say(f"configured from {self.export_dir}")
        except BaseException:
            self.down()
            raise
        return fab

    def down(self) -> int:
        """Stop every process still running in the testbed's namespaces (`exec`'s: SIGTERM, then SIGKILL
        after a second), then remove the namespaces (and so their links and rules) and the state; returns
        how many namespaces there were. Safe to call at any time."""
        there = self.namespaces() if shutil.which("ip") else []
        if there:
            self._stop_processes(there)
            _run(["ip", "-batch", "-"], stdin="".join(f"netns del {n}\n" for n in there), check=False)
        shutil.rmtree(self.state_dir, ignore_errors=True)
        return len(there)

    @staticmethod
    def _stop_processes(namespaces: list[str], grace_s: float = 1.0) -> None:
        """Terminate the processes inside ``namespaces`` (a deleted namespace would keep them running,
        cut off from everything)."""

        batch = "".join(f"netns pids {n}\n" for n in namespaces)  # (one `ip` for all of them)

        def pids() -> set[int]:
            res = subprocess.run(
                ["ip", "-force", "-batch", "-"], input=batch, capture_output=True, text=True, check=False
            )
            out = {int(p) for p in res.stdout.split() if p.isdigit()}
            out.discard(os.getpid())
            return out

        for sig in (signal.SIGTERM, signal.SIGKILL):
            left = pids()
            if not left:
                return
            for pid in left:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, sig)
            end = time.monotonic() + grace_s
            while time.monotonic() < end and pids():
                time.sleep(0.05)

    # -- state ---------------------------------------------------------------------------------------------
    def _load(self) -> dict[str, Any]:
        try:
            state: dict[str, Any] = json.loads(self._state_file.read_text())
        except (OSError, ValueError):
            raise TestbedError("no testbed is up (`openmrc testbed up` builds one)") from None
        if not state.get("complete", True):
            raise TestbedError(
                "the testbed is half-built (its `up` was stopped before it finished): "
                "`openmrc testbed down`, then `up` again"
            )
        return state

    def _save(self, state: dict[str, Any]) -> None:
        self._state_file.write_text(json.dumps(state, indent=1) + "\n")

    @property
    def mode(self) -> str:
        return str(self._load()["mode"])

    def fabric(self) -> LinuxFabric:
        """The fabric the testbed was built from (its export)."""
        self._load()
        return load_export(self.export_dir)

    def links(self) -> list[dict[str, Any]]:
        self._load()
        links: list[dict[str, Any]] = json.loads((self.export_dir / "links.json").read_text())
        return links

    def link(self, name: str) -> dict[str, Any]:
        """The link ``A--B`` (either order)."""
        a, sep, b = name.partition("--")
        links = self.links()
        for ln in links:
            if sep and {ln["a"], ln["b"]} == {a, b}:
                return ln
        raise TestbedError(f"no link {name!r}; links are named A--B, e.g. {links[-1]['name']}")

    def host_ns(self, host: str) -> str:
        names = {n for ln in self.links() for n in (ln["a"], ln["b"])}
        if host not in names:
            hosts = sum(1 for n in names if n.startswith("host"))
            raise TestbedError(f"no node {host!r} in the testbed (hosts are host0 .. host{hosts - 1})")
        return self.ns(host)

    # -- faults --------------------------------------------------------------------------------------------
    def fail(self, name: str) -> None:
        """Blackhole a link both ways: every packet arriving at either end is dropped, the link stays up."""
        self._fault(name, "counter drop", {"kind": "blackhole"})

    def loss(self, name: str, rate: float) -> None:
        """Drop ``rate`` (0..1) of the packets arriving at either end, at random."""
        if not 0 < rate < 1:
            raise ValueError(f"loss {rate * 100:g}%: a rate between 0 and 100 %")
        n = round(rate * 10_000)
        self._fault(name, f"numgen random mod 10000 < {n} counter drop", {"kind": "loss", "percent": n / 100})

    def heal(self, name: str | None = None) -> list[str]:
        """Remove the fault of ``name`` (every fault if None); returns the links healed."""
        state = self._load()
        names = list(state["faults"]) if name is None else [self.link(name)["name"]]
        for n in names:
            self._fault(n, None, None)
        return names

    def _fault(self, name: str, rule: str | None, record: dict[str, Any] | None) -> None:
        ln = self.link(name)
        state = self._load()
        ends = ((ln["a"], ln["a_dev"]), (ln["b"], ln["b_dev"]))
        dropped = state.setdefault("dropped", {})  # what earlier rules of the link dropped
        dropped[ln["name"]] = dropped.get(ln["name"], 0) + sum(self.drops(n).get(d, 0) for n, d in ends)
        scripts = []
        for node, dev in ends:
            chain = f"in-{dev}"
            hook = f'{{ type filter hook ingress device "{dev}" priority 0; }}'
            script = [
                f"add table netdev {_TABLE}",
                f"add chain netdev {_TABLE} {chain} {hook}",
                f"flush chain netdev {_TABLE} {chain}",
            ]
            if rule is not None:
                script.append(f"add rule netdev {_TABLE} {chain} {rule}")
            argv = ["ip", "netns", "exec", self.ns(node), "nft", "-f", "-"]
            scripts.append((argv, "\n".join(script) + "\n"))
        # Both ends at once, so that the two directions change within a few milliseconds of each other
        # (one after the other, each `ip netns exec` taking 5-15 ms, the second came up to 30 ms later).
        self.changing_at = time.time()
        _run_together(scripts)
        self.changed_at = time.time()
        if record is None:
            state["faults"].pop(ln["name"], None)
        else:
            state["faults"][ln["name"]] = record
        self._save(state)

    # -- observation ---------------------------------------------------------------------------------------
    def counters(self, node: str) -> dict[str, dict[str, int]]:
        """Per interface of ``node``: packets and bytes received and sent (the kernel's link counters)."""
        out = _run(["ip", "-n", self.ns(node), "-j", "-s", "link", "show"])
        res: dict[str, dict[str, int]] = {}
        for link in json.loads(out):
            st = link.get("stats64", {})
            rx, tx = st.get("rx", {}), st.get("tx", {})
            res[link["ifname"]] = {
                "rx_packets": int(rx.get("packets", 0)),
                "rx_bytes": int(rx.get("bytes", 0)),
                "tx_packets": int(tx.get("packets", 0)),
                "tx_bytes": int(tx.get("bytes", 0)),
            }
        return res

    def drops(self, node: str) -> dict[str, int]:
        """Packets the fault rules dropped, per interface of ``node``."""
        cmd = ["ip", "netns", "exec", self.ns(node), "nft", "-j", "list", "table", "netdev", _TABLE]
        out = _run(cmd, check=False)  # fails when no fault was ever set on this node
        res: dict[str, int] = {}
        for item in json.loads(out).get("nftables", []) if out else ():
            rule = item.get("rule")
            if rule:
                for expr in rule.get("expr", []):
                    if "counter" in expr:
                        dev = str(rule["chain"]).removeprefix("in-")
                        res[dev] = res.get(dev, 0) + int(expr["counter"]["packets"])
        return res

    def status(self) -> list[dict[str, Any]]:
        """Every link with its fault and packet counts each way (from the sending end's counters)."""
        state = self._load()
        counters: dict[str, dict[str, dict[str, int]]] = {}
        drops: dict[str, dict[str, int]] = {}
        rows = []
        for ln in self.links():
            for node in (ln["a"], ln["b"]):
                if node not in counters:
                    counters[node] = self.counters(node)
                    drops[node] = self.drops(node)
            fault = state["faults"].get(ln["name"])
            rows.append(
                {
                    "link": ln["name"],
                    "plane": ln["plane"],
                    "fault": "" if fault is None else _fault_text(fault),
                    "a_to_b": counters[ln["a"]].get(ln["a_dev"], {}).get("tx_packets", 0),
                    "b_to_a": counters[ln["b"]].get(ln["b_dev"], {}).get("tx_packets", 0),
                    "dropped": drops[ln["a"]].get(ln["a_dev"], 0)
                    + drops[ln["b"]].get(ln["b_dev"], 0)
                    + state.get("dropped", {}).get(ln["name"], 0),
                }
            )
        return rows

    def exec_argv(self, node: str, argv: Sequence[str]) -> list[str]:
        """The command line that runs ``argv`` inside ``node``'s namespace."""
        if not argv:
            raise TestbedError("no command to run (testbed exec HOST -- CMD ...)")
        return ["ip", "netns", "exec", self.host_ns(node), *argv]


def _fault_text(fault: dict[str, Any]) -> str:
    return "blackholed" if fault["kind"] == "blackhole" else f"loss {fault['percent']:g}%"
