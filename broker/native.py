"""Opt-in: run the broker's sans-I/O hot path compiled with mypyc instead of interpreted.

Theory of operation
-------------------
``core``, ``state`` and ``protocol`` are plain, fully typed Python, which
mypyc compiles to C extensions.  ``scripts/compile-native DIR`` builds them
into ``DIR`` (never into the source tree, so an edited ``.py`` can never be
shadowed by an old build) and records a digest of each source it compiled.
A process started with ``ZBATCH_NATIVE_DIR=DIR`` puts ``DIR/broker`` first
on the package's search path, so ``import broker.core`` loads the compiled
module; every other module still comes from the sources.

The build is used only if it matches: same interpreter (cache tag) and the
same source digests.  Otherwise the process runs the interpreted modules
and the status says why, so a stale build costs speed, never correctness.
The broker logs the status at start.

Measured (``scripts/bench --cases routing``, interleaved runs): broker CPU
per request at concurrency 32 went from 52 to 38-41 us, and throughput from
14,100-14,600 to 17,900-19,000 requests/s (BENCHMARKS.md, History).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

ENV = "ZBATCH_NATIVE_DIR"
MODULES = ("core", "state", "protocol")
STAMP = "zbatch-native.json"


def source_digests(package_dir: Path) -> dict[str, str]:
    """What a build must match: the sha256 of each compiled module's source."""
    return {name: hashlib.sha256((package_dir / f"{name}.py").read_bytes()).hexdigest() for name in MODULES}


def stamp(package_dir: Path) -> dict[str, object]:
    """The record ``scripts/compile-native`` writes next to a build."""
    return {"cache_tag": sys.implementation.cache_tag, "sources": source_digests(package_dir)}


def activate(package_path: list[str], directory: str | None) -> str:
    """Use the build in ``directory`` for this package if it matches; return a status line for the log."""
    if not directory:
        return "interpreted"
    command = f"scripts/compile-native {directory}"
    rebuild = f"rebuild it with {command}"
    try:
        built = json.loads((Path(directory) / STAMP).read_text())
    except (OSError, ValueError) as exc:
        return f"interpreted: {ENV}={directory} holds no readable build ({exc}); build it with {command}"
    tag = sys.implementation.cache_tag
    if not isinstance(built, dict) or built.get("cache_tag") != tag:
        return f"interpreted: the build in {directory} is not for this Python ({tag}); {rebuild}"
    built_sources = built.get("sources") if isinstance(built.get("sources"), dict) else {}
    stale = [name for name, digest in source_digests(Path(package_path[0])).items()
             if built_sources.get(name) != digest]
    if stale:
        return f"interpreted: the build in {directory} predates changes to {', '.join(stale)}; {rebuild}"
    package_path.insert(0, str(Path(directory) / "broker"))
    sys.path.append(directory)  # mypyc's shared runtime library is a top-level module there
    return f"compiled with mypyc ({directory})"


def status_from_environment(package_path: list[str]) -> str:
    return activate(package_path, os.environ.get(ENV))
