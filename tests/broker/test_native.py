"""The opt-in compiled hot path: a build is used only when it matches the sources and the interpreter.

The last test runs only in scripts/test's second pass, which compiles the modules with
scripts/compile-native and sets ZBATCH_NATIVE_DIR for tests/broker and the protocol tests of tests/zbatch.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.daemons import start_broker, wait_until
from zbatch.runtime import native

SOURCES = native.SOURCE_ROOT


@pytest.fixture
def sys_path() -> Iterator[None]:
    saved = list(sys.path)
    yield
    sys.path[:] = saved


def write_stamp(directory: Path, record: object) -> None:
    (directory / native.STAMP).write_text(json.dumps(record))


def test_without_a_build_the_modules_are_interpreted() -> None:
    path = [str(SOURCES / "broker")]
    assert native.activate(path, "broker", None) == "interpreted"
    assert path == [str(SOURCES / "broker")]


def test_a_directory_without_a_build_is_ignored_with_the_command_that_builds_it(tmp_path: Path) -> None:
    path = [str(SOURCES / "broker")]
    status = native.activate(path, "broker", str(tmp_path))
    assert status.startswith("interpreted:") and f"scripts/compile-native {tmp_path}" in status
    assert path == [str(SOURCES / "broker")]


def test_a_build_for_another_python_is_ignored(tmp_path: Path) -> None:
    write_stamp(tmp_path, native.stamp(SOURCES) | {"cache_tag": "cpython-20"})
    path = [str(SOURCES / "broker")]
    assert "not for this Python" in native.activate(path, "broker", str(tmp_path))
    assert path == [str(SOURCES / "broker")]


def test_a_build_older_than_a_source_is_ignored_and_the_source_named(tmp_path: Path) -> None:
    sources = native.source_digests(SOURCES) | {"broker.state": "0" * 64}
    write_stamp(tmp_path, native.stamp(SOURCES) | {"sources": sources})
    path = [str(SOURCES / "broker")]
    status = native.activate(path, "broker", str(tmp_path))
    assert "predates changes to broker.state;" in status and "rebuild it with scripts/compile-native" in status
    assert path == [str(SOURCES / "broker")]


def test_a_matching_build_is_searched_first(tmp_path: Path, sys_path: None) -> None:
    write_stamp(tmp_path, native.stamp(SOURCES))
    path = [str(SOURCES / "broker")]
    assert native.activate(path, "broker", str(tmp_path)).startswith("compiled with mypyc")
    assert path == [str(tmp_path / "broker"), str(SOURCES / "broker")]
    assert sys.path[-1] == str(tmp_path)


@pytest.mark.skipif(not os.environ.get(native.ENV), reason="only in scripts/test's compiled pass")
def test_the_compiled_pass_really_runs_compiled_modules(log_dir: Path) -> None:
    import broker.core
    import broker.state
    import zbatch.protocol.wire

    build = Path(os.environ[native.ENV]).resolve()
    compiled = ((broker.core, "broker"), (broker.state, "broker"), (zbatch.protocol.wire, "zbatch/protocol"))
    for module, folder in compiled:
        assert Path(module.__file__ or "").resolve().parent == build / folder, module
        assert (module.__file__ or "").endswith(".so"), module
    daemon = start_broker(log_dir)
    try:
        wait_until(lambda: "routing core compiled with mypyc" in daemon.log(), 30,
                   "the broker to log that it runs the compiled core", daemon.log)
    finally:
        daemon.stop()
