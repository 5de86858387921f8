"""Opt-in: run the routing hot path compiled with mypyc instead of interpreted.

Theory of operation
-------------------
The broker's core and state and the wire protocol are plain, fully typed
Python, which mypyc compiles to C extensions as one group.
``scripts/compile-native DIR`` builds them into ``DIR`` (never into the
source tree, so an edited ``.py`` can never be shadowed by an old build) and
records a digest of each source it compiled.  A process started with
``ZBATCH_NATIVE_DIR=DIR`` puts ``DIR/broker`` first on ``broker``'s search
path and ``DIR/zbatch/protocol`` first on ``zbatch.protocol``'s, so their
imports load the compiled modules; every other module comes from the sources.

The build is used only if it matches: same interpreter (cache tag) and the
same source digests for every module of the group.  Otherwise the process
runs the interpreted modules and the status says why, so a stale build costs
speed, never correctness.  Compiled modules of one group call each other
directly, so the group is used whole or not at all: each package checks the
same stamp and reaches the same verdict.  The broker logs the status at start.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

ENV = "ZBATCH_NATIVE_DIR"
SOURCE_ROOT = Path(__file__).resolve().parents[2]  # the folder that holds zbatch/ and broker/
MODULES = ("broker.core", "broker.state", "broker.admission", "zbatch.protocol.messages",
           "zbatch.protocol.wire")  # the group mypyc compiles
STAMP = "zbatch-native.json"


def source_file(module: str, root: Path = SOURCE_ROOT) -> Path:
    return root.joinpath(*module.split(".")).with_suffix(".py")


def source_digests(root: Path = SOURCE_ROOT) -> dict[str, str]:
    """What a build must match: the sha256 of each compiled module's source."""
    return {name: hashlib.sha256(source_file(name, root).read_bytes()).hexdigest() for name in MODULES}


def stamp(root: Path = SOURCE_ROOT) -> dict[str, object]:
    """The record ``scripts/compile-native`` writes next to a build."""
    return {"cache_tag": sys.implementation.cache_tag, "sources": source_digests(root)}


def verdict(directory: str | None, root: Path = SOURCE_ROOT) -> str | None:
    """None when the build in ``directory`` may be used; otherwise the status line saying why not."""
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
    recorded = built.get("sources")
    built_sources: dict[str, object] = recorded if isinstance(recorded, dict) else {}
    stale = [name for name, digest in source_digests(root).items() if built_sources.get(name) != digest]
    if stale:
        return f"interpreted: the build in {directory} predates changes to {', '.join(stale)}; {rebuild}"
    return None


def activate(package_path: list[str], package: str, directory: str | None, root: Path = SOURCE_ROOT) -> str:
    """Use the build in ``directory`` for ``package`` if it matches; return a status line for the log."""
    problem = verdict(directory, root)
    if problem is not None:
        return problem
    assert directory is not None
    package_path.insert(0, str(Path(directory).joinpath(*package.split("."))))
    if directory not in sys.path:
        sys.path.append(directory)  # mypyc's shared runtime library is a top-level module there
    return f"compiled with mypyc ({directory})"


def activate_from_environment(package_path: list[str], package: str) -> str:
    return activate(package_path, package, os.environ.get(ENV))
