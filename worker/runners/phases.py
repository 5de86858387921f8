"""The phases of a worker's start, timed for one log line: where the seconds before READY went.

Theory of operation
-------------------
A start is a run of phases on the inference thread: the imports, the
tokenizer, the model, the ONNX export, its validation and sessions, warm-up,
calibration.  The code of each phase says ``with phase("tokenizer"):``; the
engine opens :func:`recording` around a model's load and logs
:meth:`StartPhases.summary` when it is done.  A phase outside any recording
(a test that loads a runner itself) costs nothing and records nothing.

The recording is a context variable, so each thread sees its own (the
inference thread loads the models; no other thread times anything).  A
phase counts its own time only: one nested in another (``calibration`` in
``warm-up``) is taken out of the outer one, so the phases add up to the
start.  :meth:`StartPhases.note` adds a word on how a phase was done, such as
"from the cache", so that the line says why a phase took no time.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from contextvars import ContextVar

_current: ContextVar[StartPhases | None] = ContextVar("zbatch_start_phases", default=None)


class StartPhases:
    """Seconds by phase, in the order the phases first ran, and notes on how some were done."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self.clock = clock
        self.seconds: dict[str, float] = {}
        self.notes: dict[str, str] = {}
        self._nested: list[float] = []  # per open phase: the time of the phases nested in it so far

    def add(self, name: str, seconds: float) -> None:
        self.seconds[name] = self.seconds.get(name, 0.0) + seconds

    @property
    def total(self) -> float:
        return sum(self.seconds.values())

    def summary(self, elapsed: float | None = None) -> str:
        """``imports 1.1 s, tokenizer 0.1 s, verdict 0.0 s (from the cache), ...``: every phase that ran, and
        ``other`` for what none timed, out of ``elapsed`` if given."""
        if elapsed is not None and elapsed - self.total >= 0.005:
            self.add("other", elapsed - self.total)
        parts = []
        for name, seconds in self.seconds.items():
            note = self.notes.get(name)
            parts.append(f"{name} {seconds:.2f} s" + (f" ({note})" if note else ""))
        parts += [f"{name}: {note}" for name, note in self.notes.items() if name not in self.seconds]
        return ", ".join(parts) or "no phases recorded"


@contextlib.contextmanager
def recording(phases: StartPhases | None = None) -> Iterator[StartPhases]:
    """Record the phases run within the block on this thread (into ``phases``, or a new recorder)."""
    recorder = phases or StartPhases()
    token = _current.set(recorder)
    try:
        yield recorder
    finally:
        _current.reset(token)


@contextlib.contextmanager
def phase(name: str) -> Iterator[None]:
    """Time the block as phase ``name`` of the start being recorded, if one is."""
    recorder = _current.get()
    if recorder is None:
        yield
        return
    started = recorder.clock()
    recorder.add(name, 0.0)  # its place in the line: where it started
    recorder._nested.append(0.0)
    try:
        yield
    finally:
        elapsed = recorder.clock() - started
        recorder.add(name, elapsed - recorder._nested.pop())
        if recorder._nested:
            recorder._nested[-1] += elapsed


def note(name: str, text: str) -> None:
    """Say how phase ``name`` was done ("from the cache"), in the start being recorded, if one is."""
    recorder = _current.get()
    if recorder is not None:
        recorder.notes[name] = text


def process_age_s() -> float | None:
    """Seconds since this process started (interpreter start-up included), where the OS says (Linux)."""
    try:
        with open(f"/proc/{os.getpid()}/stat", encoding="ascii") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        started_ticks = int(fields[19])  # field 22, starttime, counted after the command's closing parenthesis
        return time.clock_gettime(time.CLOCK_BOOTTIME) - started_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):
        return None
