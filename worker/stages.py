"""The preparation pool: tokenizes waiting requests and plans queued batches, so the model never waits for them.

Theory of operation
-------------------
A staged runner (:class:`~worker.runners.base.StagedRunner`) runs a batch in
three steps: *encode* (the tokenizer), *plan* (the batch's arrays, numpy)
and *run* (the model).  Only the last needs the model; the pool does the
first two ahead of it, on ``threads`` threads of its own, so that when the
model frees, the next batch is ready and the inference thread only copies
it to the device and launches the model:

1. Stages hand each other immutable values and futures, never shared
   mutable state.  The I/O loop owns every request; a request that waits
   for its batch is encoded on the pool (:meth:`PrepPool.encode`) and the
   loop keeps the :class:`~concurrent.futures.Future` of its encodings.  A
   batch goes to the engine as a :class:`BatchWork`: its inputs, its
   parameters and, per item, the future that encodes it (:class:`Prepared`).
2. A batch that waits behind a running one is planned on the pool as well
   (:meth:`PrepPool.plan`), from its requests' encodings.
3. Nobody waits for work that has not started: whoever needs an encoding or
   a plan first cancels its future, and does the work itself if the
   cancel succeeds (the pool had not started it).  Only work under way is
   waited for, and it is nearly done (:func:`settle`).
4. Requests queued together with the same parameters are encoded in one
   tokenizer call, up to :data:`MAX_COALESCED` inputs.
5. The pool never calls torch: torch keeps its thread pools per calling
   thread, and a second thread driving it would start and contend with a
   pool of its own.  Fast tokenizers release the GIL while they encode, so
   the pool's threads and the inference thread overlap; each thread
   tokenizes with a tokenizer of its own (:class:`~worker.runners.text.TextRunner`).
6. A request whose encoding failed (bad parameters, a tokenizer error), or
   a batch whose plan failed, is run the plain way (:meth:`Runner.run`),
   which fails it exactly as before, with its message.
7. A request of token ids only (its sender tokenized it) is encoded at once
   on the caller's thread: checking and truncating ids costs a few numpy
   calls a request, less than handing it to a pool thread and waking that
   thread.
"""

from __future__ import annotations

import enum
import logging
import queue
import threading
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import numpy as np

from worker.runners.base import StagedRunner

log = logging.getLogger("zbatch.worker")
MAX_COALESCED = 256  # most inputs one tokenizer call takes for several waiting requests


class TokenizeAhead(enum.Enum):
    """For which models the pool encodes and plans batches in the model's shadow (``--tokenize-ahead``)."""

    ALWAYS = "true"
    ON_ACCELERATORS = "auto"  # on the CPU the model's run leaves no core idle for the pool
    NEVER = "false"

    def applies(self, device: str) -> bool:
        """Whether a model on ``device`` has its batches prepared ahead."""
        return self is TokenizeAhead.ALWAYS or (self is TokenizeAhead.ON_ACCELERATORS and device != "cpu")


@dataclass(frozen=True, slots=True)
class Prepared:
    """Where an item's encoding comes from: its request's encodings (a future), at the item's index."""

    encodings: Future[list[Any]]
    index: int


@dataclass(frozen=True, slots=True)
class BatchWork:
    """A batch as the engine takes it: everything it needs, nothing the I/O loop will change."""

    ticket: int
    model: str
    operation: str
    parameters: dict[str, Any]
    inputs: tuple[Any, ...]
    prepared: tuple[Prepared | None, ...] = ()  # per item; empty: nothing was prepared


@dataclass(frozen=True, slots=True)
class Settled:
    """A staged batch ready for the model: each item's encoding (or its InputError) and the batch's plan."""

    encodings: list[Any]
    plan: Any


def settle(runner: StagedRunner[Any, Any], work: BatchWork) -> Settled | None:
    """Encode what is not encoded yet and plan ``work`` (rule 3); None: run it the plain way (rule 6)."""
    encodings: list[Any] = [None] * len(work.inputs)
    missing: list[int] = []
    for index, prepared in enumerate(work.prepared or (None,) * len(work.inputs)):
        if prepared is None or prepared.encodings.cancel():
            missing.append(index)
            continue
        try:
            encodings[index] = prepared.encodings.result()[prepared.index]
        except Exception:  # encoding it failed: the plain path reports why
            return None
    try:
        if missing:
            for index, encoding in zip(missing, runner.encode([work.inputs[i] for i in missing], work.parameters),
                                       strict=True):
                encodings[index] = encoding
        return Settled(encodings, runner.plan(encodings, work.parameters))
    except Exception:  # the plain path meets the same problem and reports it
        return None


@dataclass(frozen=True, slots=True)
class _Encode:
    runner: StagedRunner[Any, Any]
    inputs: Sequence[Any]
    parameters: dict[str, Any]
    key: bytes  # requests of equal keys share a tokenizer call
    result: Future[list[Any]]


@dataclass(frozen=True, slots=True)
class _Plan:
    runner: StagedRunner[Any, Any]
    work: BatchWork
    result: Future[Settled | None]


class PrepPool:
    """``threads`` threads that encode requests and plan batches for staged runners, ahead of the model."""

    def __init__(self, threads: int) -> None:
        self.threads = threads
        self._jobs: queue.SimpleQueue[_Encode | _Plan | None] = queue.SimpleQueue()
        self._threads = [threading.Thread(target=self._main, name=f"prep-{n}", daemon=True) for n in range(threads)]
        self._started = False

    def start(self) -> None:
        if not self._started:
            self._started = True
            for thread in self._threads:
                thread.start()

    def stop(self, timeout_s: float) -> None:
        if self._started:
            for _ in self._threads:
                self._jobs.put(None)
            for thread in self._threads:
                thread.join(timeout_s)

    def encode(self, runner: StagedRunner[Any, Any], inputs: Sequence[Any], parameters: dict[str, Any],
               key: bytes) -> Future[list[Any]]:
        """Any thread: the future of ``inputs`` encoded (rule 1); cancel it to do the work yourself.  Token ids
        only: encoded here, the future done (rule 7)."""
        result: Future[list[Any]] = Future()
        job = _Encode(runner, inputs, parameters, key, result)
        if inputs and all(isinstance(item, np.ndarray) for item in inputs):
            result.set_running_or_notify_cancel()
            _encode_together([job])
        else:
            self._jobs.put(job)
        return result

    def plan(self, runner: StagedRunner[Any, Any], work: BatchWork) -> Future[Settled | None]:
        """Any thread: the future of ``work`` settled (rule 2); cancel it to do the work yourself."""
        result: Future[Settled | None] = Future()
        self._jobs.put(_Plan(runner, work, result))
        return result

    def _main(self) -> None:
        while (job := self._jobs.get()) is not None:
            jobs = [job]
            inputs = len(job.inputs) if isinstance(job, _Encode) else 0
            while inputs < MAX_COALESCED:  # rule 4: take what queued meanwhile
                try:
                    more = self._jobs.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    self._jobs.put(None)  # for this thread's next turn
                    break
                jobs.append(more)
                inputs += len(more.inputs) if isinstance(more, _Encode) else 0
            try:
                self._work(jobs)
            except Exception:  # never expected; whoever waits does what was left undone
                log.exception("preparing batches ahead failed; the inference thread prepares them itself")

    def _work(self, jobs: list[_Encode | _Plan]) -> None:
        """Plans first (the model runs them next), then encodings, one tokenizer call per runner and key."""
        for job in jobs:
            if isinstance(job, _Plan) and job.result.set_running_or_notify_cancel():
                job.result.set_result(settle(job.runner, job.work))
        together: dict[tuple[int, bytes], list[_Encode]] = {}
        for job in jobs:
            if isinstance(job, _Encode) and job.result.set_running_or_notify_cancel():
                together.setdefault((id(job.runner), job.key), []).append(job)
        for group in together.values():
            _encode_together(group)


def _encode_together(jobs: list[_Encode]) -> None:
    """One tokenizer call for requests of one runner and one set of parameters; each gets its own slice."""
    try:
        encodings = jobs[0].runner.encode([each for job in jobs for each in job.inputs], jobs[0].parameters)
    except Exception as exc:  # bad parameters or a tokenizer error: the plain path reports it per request
        for job in jobs:
            job.result.set_exception(exc)
        return
    start = 0
    for job in jobs:
        job.result.set_result(encodings[start:start + len(job.inputs)])
        start += len(job.inputs)
