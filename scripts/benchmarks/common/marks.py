"""Timestamps at named points of the daemons' own functions: a study tool for the path of one request.

Never loaded by the product.  A daemon loads it only when its environment names a folder in
:data:`FOLDER_ENV` and puts a hook folder first on ``PYTHONPATH`` (:func:`daemon_env`): that folder's
``sitecustomize`` calls :func:`install_at_import`, which wraps each :class:`Point` as its module is first
imported (``load/marks_hook`` marks :mod:`scripts.benchmarks.load.lone_points`).  The measuring process
calls :func:`install_now` for its own modules.  A wrapped call records its
point's label with ``time.perf_counter_ns()``, Linux's CLOCK_MONOTONIC, one clock for every process on the
host, so the marks of several processes merge into one timeline, each mark with its process's pid.  A thread of
the recorder's own appends a process's marks to ``FOLDER/<pid>.marks`` every :data:`FLUSH_EVERY_S`, and the
process does at exit; none of that is on the marked functions' path.  A point its module lacks (a renamed method,
another release of a library) is left out with a line on stderr, so a study cannot stop a daemon from starting.

A mark costs a clock read, a lock and a list append (about a microsecond), and the wrapper's call: a study
compares stages of tens of microseconds, and says so.
"""

from __future__ import annotations

import atexit
import functools
import importlib.abc
import importlib.machinery
import inspect
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

FOLDER_ENV = "BENCH_MARKS_FOLDER"  # the folder each process writes its marks to
FLUSH_EVERY_S = 0.5

Mark = tuple[int, str, int]  # perf_counter_ns, label, pid


@dataclass(frozen=True)
class Point:
    """A function to mark: ``qualname`` in ``module`` (``Class.method``), marked on call and/or on return."""

    module: str
    qualname: str
    on_call: str | None = None
    on_return: str | None = None


class _Recorder:
    """This process's marks, appended to its file in the folder by a thread of its own and at exit."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.marks: list[tuple[int, str]] = []
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        atexit.register(self.flush)
        os.register_at_fork(after_in_child=self._forked)
        self._start_flushing()

    def mark(self, label: str) -> None:
        now = time.perf_counter_ns()
        with self._lock:
            self.marks.append((now, label))

    def flush(self) -> None:
        with self._lock:
            marks, self.marks = self.marks, []
        if marks:
            with (self.folder / f"{os.getpid()}.marks").open("a") as out:
                out.writelines(f"{ns}\t{label}\n" for ns, label in marks)

    def _forked(self) -> None:
        """In a forked child: the parent's marks are the parent's to write, and the flushing thread did not follow."""
        self._lock = threading.Lock()
        self.marks = []
        self._start_flushing()

    def _start_flushing(self) -> None:
        threading.Thread(target=self._flush_often, name="bench-marks", daemon=True).start()

    def stop(self) -> None:
        """No more flushing by the thread; what is held is written now."""
        self._stopped.set()
        self.flush()

    def _flush_often(self) -> None:
        while not self._stopped.wait(FLUSH_EVERY_S):
            self.flush()


def _wrapped(function: Callable[..., Any], point: Point, recorder: _Recorder) -> Callable[..., Any]:
    mark = recorder.mark
    if inspect.iscoroutinefunction(function):
        @functools.wraps(function)
        async def marked_async(*args: Any, **kwargs: Any) -> Any:
            if point.on_call:
                mark(point.on_call)
            result = await function(*args, **kwargs)
            if point.on_return:
                mark(point.on_return)
            return result
        return marked_async

    @functools.wraps(function)
    def marked(*args: Any, **kwargs: Any) -> Any:
        if point.on_call:
            mark(point.on_call)
        result = function(*args, **kwargs)
        if point.on_return:
            mark(point.on_return)
        return result
    return marked


def _patch(module: ModuleType, points: Iterable[Point], recorder: _Recorder) -> Callable[[], None]:
    """Wrap each point of ``module`` (one it lacks is left out, said on stderr); returns what puts the originals
    back."""
    originals = []
    for point in points:
        owner_name, _, attribute = point.qualname.rpartition(".")
        owner: Any = getattr(module, owner_name, None) if owner_name else module
        original = getattr(owner, attribute, None)
        if original is None or isinstance(inspect.getattr_static(owner, attribute), staticmethod | classmethod):
            sys.stderr.write(f"bench marks: {module.__name__}.{point.qualname} is not a plain function or method "
                             "here: not marked\n")
            continue
        originals.append((owner, attribute, original))
        setattr(owner, attribute, _wrapped(original, point, recorder))

    def restore() -> None:
        for owner, attribute, original in originals:
            setattr(owner, attribute, original)
    return restore


def _by_module(points: Iterable[Point]) -> dict[str, list[Point]]:
    grouped: dict[str, list[Point]] = {}
    for point in points:
        grouped.setdefault(point.module, []).append(point)
    return grouped


class _PatchingFinder(importlib.abc.MetaPathFinder):
    """Finds the modules of the points as Python would, and patches each once it has run."""

    def __init__(self, points: dict[str, list[Point]], recorder: _Recorder) -> None:
        self.points, self.recorder = points, recorder

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None) -> Any:
        if fullname not in self.points:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        loader, points, recorder = spec.loader, self.points[fullname], self.recorder
        run_module = loader.exec_module

        def exec_and_patch(module: ModuleType) -> None:
            run_module(module)
            _patch(module, points, recorder)

        loader.exec_module = exec_and_patch  # type: ignore[method-assign]
        return spec


def install_at_import(points: Iterable[Point]) -> None:
    """In a daemon with :data:`FOLDER_ENV` set: patch each point's module when it is imported."""
    folder = os.environ.get(FOLDER_ENV)
    if folder:
        sys.meta_path.insert(0, _PatchingFinder(_by_module(points), _Recorder(Path(folder))))


def install_now(points: Iterable[Point], folder: Path) -> Callable[[], None]:
    """In this process: patch the points' modules (imported now); returns what writes the marks out and puts
    the modules' own functions back."""
    recorder = _Recorder(folder)
    restores = [_patch(importlib.import_module(module), each, recorder) for module, each in _by_module(points).items()]

    def uninstall() -> None:
        recorder.stop()
        for restore in restores:
            restore()
    return uninstall


def daemon_env(folder: Path, hook: Path) -> dict[str, str]:
    """The variables that make a daemon (and any process it starts) run ``hook``'s ``sitecustomize`` and mark
    into ``folder``."""
    from zbatch.testing import daemon_env as base

    return {FOLDER_ENV: str(folder), "PYTHONPATH": os.pathsep.join([str(hook), base()["PYTHONPATH"]])}


def read_marks(folder: Path) -> list[Mark]:
    """Every process's marks in ``folder``, in time order, each with its process's pid."""
    marks: list[Mark] = []
    for path in folder.glob("*.marks"):
        pid = int(path.stem)
        for line in path.read_text().splitlines():
            ns, _, label = line.partition("\t")
            marks.append((int(ns), label, pid))
    return sorted(marks)
