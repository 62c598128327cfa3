"""Compile openmrc's hot modules with mypyc, in place, next to their sources.

The transport core and the simulator are plain, fully typed Python (mypy --strict); mypyc turns the listed
modules into C extensions with the same behaviour, several times faster. The interpreted sources stay the
reference: ``OPENMRC_PURE=1`` ignores the compiled modules, and openmrc ignores them by itself (with a
warning) as soon as any listed source differs from the one compiled, so a stale build is never used.

    python scripts/build_native.py           # build (about two and a half minutes here)
    python scripts/build_native.py --clean   # remove the compiled modules

`make native` runs it when a listed source changed; `make demo` and `make test` depend on it.

The manifest ``src/openmrc/_native.json`` records the SHA-256 of every compiled source. What mypyc leaves
out of the modules it compiles (docstrings, annotations as written, signatures) is put back from their
sources (``native_api.py``): into the generated C, and into ``src/openmrc/_native_api.json``, which
``openmrc._native`` reads when a compiled module is imported.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src"
MANIFEST = SRC / "openmrc" / "_native.json"
API = SRC / "openmrc" / "_native_api.json"

# Everything a packet touches on its way through a NIC or the simulated fabric.
MODULES = [
    "openmrc/wire/buffer.py",
    "openmrc/wire/constants.py",
    "openmrc/wire/headers.py",
    "openmrc/wire/packet.py",
    "openmrc/wire/icrc.py",
    "openmrc/wire/datagram.py",
    "openmrc/wire/security.py",
    "openmrc/transport/cc.py",
    "openmrc/transport/config.py",
    "openmrc/transport/cq.py",
    "openmrc/transport/endpoint.py",
    "openmrc/transport/evtable.py",
    "openmrc/transport/mr.py",
    "openmrc/transport/nic.py",
    "openmrc/transport/nscc.py",
    "openmrc/transport/profiles.py",
    "openmrc/transport/qp.py",
    "openmrc/transport/recovery.py",
    "openmrc/transport/requester.py",
    "openmrc/transport/responder.py",
    "openmrc/transport/security.py",
    "openmrc/transport/sent.py",
    "openmrc/transport/stats.py",
    "openmrc/transport/types.py",
    "openmrc/provider/faults.py",
    "openmrc/provider/udp/config.py",
    "openmrc/provider/udp/sockets.py",
    "openmrc/provider/udp/receive.py",
    "openmrc/provider/udp/injector.py",
    "openmrc/provider/udp/send.py",
    "openmrc/provider/udp/progress.py",
    "openmrc/provider/udp/device.py",
    "openmrc/fabric/topology.py",
    "openmrc/fabric/clos.py",
    "openmrc/fabric/fattree.py",
    "openmrc/fabric/ecmp.py",
    "openmrc/fabric/srv6.py",
    "openmrc/sim/engine.py",
    "openmrc/sim/ports.py",
    "openmrc/sim/network.py",
    "openmrc/sim/routing.py",
    "openmrc/sim/roce.py",
    "openmrc/sim/failures.py",
    "openmrc/sim/config.py",
    "openmrc/sim/flows.py",
    "openmrc/sim/hosts.py",
    "openmrc/sim/fabric_sim.py",
    "openmrc/sim/metrics.py",
    "openmrc/sim/workloads.py",
    "openmrc/sim/parallel/exchange.py",
    "openmrc/sim/parallel/ranks.py",
    "openmrc/sim/parallel/channels.py",
    "openmrc/sim/parallel/merge.py",
    "openmrc/sim/parallel/windows.py",
    "openmrc/sim/parallel/launch.py",
]
EXTENSIONS = ["openmrc/_arenas.c", "openmrc/_order.c"]
"""Small C extensions built beside them (`openmrc._native.extension`): pymalloc's arenas on transparent
huge pages (`openmrc._native.huge_page_arenas`), and the ordering of a time's events in the simulator's
ordered mode (`openmrc.sim.engine`)."""


def module_name(path: str) -> str:
    return path.removesuffix(".py").replace("/", ".")


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def clean() -> None:
    MANIFEST.unlink(missing_ok=True)
    API.unlink(missing_ok=True)
    for so in SRC.rglob("*.so"):
        so.unlink()
    shutil.rmtree(ROOT / "build" / "mypyc", ignore_errors=True)


def build(opt_level: str = "3") -> None:
    import native_api
    from mypyc.build import mypycify
    from setuptools import Extension, setup

    clean()
    # Digests of what is about to be compiled (a source edited during the build must not pass as built),
    # and what mypyc leaves out of it, read from the same sources.
    sources = {module_name(m): (SRC / m).read_bytes() for m in MODULES}
    manifest = {name: hashlib.sha256(text).hexdigest() for name, text in sources.items()}
    c_digests = {Path(c).stem: digest(SRC / c) for c in EXTENSIONS}
    docs: dict[native_api.Key, native_api.Doc] = {}
    for name, text in sources.items():
        docs.update(native_api.functions(name, text.decode()))
    api = {name: native_api.classes(text.decode()) for name, text in sources.items()}
    os.chdir(SRC)  # mypyc names modules after their paths
    extensions = mypycify(MODULES, opt_level=opt_level, target_dir=str(ROOT / "build" / "mypyc"))
    generated = {Path(c) for ext in extensions for c in ext.sources if c.endswith(".c")}
    written = sum(native_api.document_c(c, list(sources), docs) for c in sorted(generated))
    if not written:
        print("warning: no docstring written into the generated C (has mypyc changed?)", file=sys.stderr)
    extensions += [Extension(module_name(c.removesuffix(".c")), [c]) for c in EXTENSIONS]
    jobs = str(max(1, os.cpu_count() or 1))
    setup(
        name="openmrc-native",
        ext_modules=extensions,
        script_args=[
            "-q",
            "build_ext",
            "--inplace",
            "-j",
            jobs,
            "-b",
            str(ROOT / "build" / "mypyc" / "lib"),
            "-t",
            str(ROOT / "build" / "mypyc" / "tmp"),
        ],
    )
    API.write_text(json.dumps(api, indent=1) + "\n")  # (in order: annotations are as written)
    built = {"modules": manifest, "c": c_digests}
    MANIFEST.write_text(json.dumps(built, indent=1, sort_keys=True) + "\n")
    print(f"compiled {len(MODULES)} modules with mypyc ({written} docstrings kept)", file=sys.stderr)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clean", action="store_true", help="remove the compiled modules and the manifest")
    ap.add_argument("--opt", default="3", help="C optimisation level (0 builds quickly, for trying things)")
    ap.add_argument("--list", action="store_true", help="print the compiled sources (for make) and exit")
    args = ap.parse_args()
    if args.list:
        print(" ".join(f"src/{m}" for m in [*MODULES, *EXTENSIONS]))
    elif args.clean:
        clean()
    else:
        build(args.opt)


if __name__ == "__main__":
    main()
