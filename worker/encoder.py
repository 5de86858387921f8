"""The encoder thread: tokenizes requests and plans the next batch in the model's shadow.

Theory of operation
-------------------
A text runner runs a batch in three steps (:mod:`worker.runners.text`):
*encode* (the tokenizer), *plan* (length groups padded into arrays, numpy)
and *run* (torch).  Only the last needs the model.  The encoder thread does
the first two ahead of it, so that when the model frees, the next batch is
ready and the model never waits for the tokenizer:

1. A request that has to wait (the model is busy, or its batch waits for
   more) is encoded as soon as it arrives.  Requests that queued together
   with the same parameters are encoded in one tokenizer call.  A request
   that arrives on an idle model runs at once and is encoded by the
   inference thread itself: handing it over would cost a thread wake-up on
   the latency path and gain nothing.
2. A batch that the worker cuts while another one runs (a full one, which
   can no longer grow) is planned at once: its requests' encodings gathered,
   its length groups padded.
3. The inference thread never waits for work the encoder thread has not
   started: what is not ready when it needs it, it does itself.  It waits
   only for an encoding or a plan already under way, which is nearly done.
4. The encoder thread never calls torch: torch keeps its thread pools per
   calling thread, and a second thread driving it would start and contend
   with a pool of its own (:mod:`worker.engine`).  Fast tokenizers release the
   GIL while they encode, and torch releases it in its operators, so the two
   threads overlap.  A runner locks its own tokenizer, whose settings are
   shared state, so encoding and the ``tokenize`` operation never interleave.
5. Encodings are the same for an input alone or in a batch, so a batch is
   planned from its requests' encodings, whichever thread made them.  A
   request whose encoding failed (bad parameters, a tokenizer error) is run
   the plain way (:meth:`Runner.run`), which fails it exactly as before.

Runners without the three steps (pipelines, images) and other operations
(``tokenize``) run as before, all on the inference thread.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from worker.assembler import Batch, PendingRequest
from worker.runners.spec import RUN

log = logging.getLogger("zbatch.worker")
UNENCODABLE = "unencodable"  # a request's ``encoded`` when encoding failed: run it the plain way


def encodes(runner: Any) -> bool:
    """Whether the runner splits a batch into encode, plan and run (:class:`~worker.runners.text.TextRunner`)."""
    return all(callable(getattr(runner, name, None)) for name in ("encode", "plan", "run_planned"))


@dataclass(eq=False)
class BatchJob:
    """A batch handed to the engine; once planned, its encodings and plan (``plan`` None: run it plainly)."""

    model: str
    batch: Batch
    lock: threading.Lock = field(default_factory=threading.Lock)
    settled: bool = False  # encoded and planned, or found unencodable
    encodings: list[Any] = field(default_factory=list)
    plan: Any = None


class Encoder:
    """Encodes requests and plans batches for the runners that can, on its own thread or on the caller's."""

    def __init__(self, runners: Mapping[str, Any]) -> None:
        self._runners = {name: runner for name, runner in runners.items() if encodes(runner)}
        self._claims = {name: threading.Lock() for name in self._runners}  # one encoding of a request at a time
        self._jobs: queue.SimpleQueue[tuple[str, PendingRequest] | BatchJob | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._main, name="encoder", daemon=True)

    def start(self) -> None:
        if self._runners:
            self._thread.start()

    def stop(self, timeout_s: float) -> None:
        if self._thread.is_alive():
            self._jobs.put(None)
            self._thread.join(timeout_s)

    def serves(self, model: str, operation: str = RUN) -> bool:
        return operation == RUN and model in self._runners

    def encode_ahead(self, model: str, request: PendingRequest) -> None:
        """Any thread: encode ``request`` on the encoder thread (see :meth:`serves`)."""
        self._jobs.put((model, request))

    def plan_ahead(self, job: BatchJob) -> None:
        """Any thread: plan ``job`` on the encoder thread, for the model to run once it frees."""
        self._jobs.put(job)

    def settle(self, job: BatchJob) -> None:
        """Encode and plan ``job`` unless that is done (waiting if it is under way); after it, ``job.plan`` is
        the plan, or None for a batch to run the plain way."""
        with job.lock:
            if job.settled:
                return
            job.settled = True
            runner = self._runners[job.model]
            requests = list({id(item.request): item.request for item in job.batch.items}.values())
            self._encode(job.model, requests)
            encodings = []
            for item in job.batch.items:
                encoded = item.request.encoded
                if not isinstance(encoded, list):
                    return  # unencodable: the plain path fails it as it always did
                encodings.append(encoded[item.index])
            try:
                job.plan = runner.plan(encodings, job.batch.parameters)
            except Exception:  # the plain path meets the same problem and reports it
                return
            job.encodings = encodings

    def _main(self) -> None:
        while (job := self._jobs.get()) is not None:
            jobs = [job]
            while True:
                try:
                    more = self._jobs.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    self._jobs.put(None)
                    break
                jobs.append(more)
            try:
                self._work(jobs)
            except Exception:  # never expected; the inference thread does whatever was left undone
                log.exception("encoding ahead failed; the inference thread encodes these batches itself")

    def _work(self, jobs: list[tuple[str, PendingRequest] | BatchJob]) -> None:
        """Batches first (the model runs them next), then the requests, one tokenizer call per model and
        parameters."""
        for job in jobs:
            if isinstance(job, BatchJob):
                self.settle(job)
        together: dict[tuple[str, bytes], list[PendingRequest]] = {}
        for job in jobs:
            if not isinstance(job, BatchJob):
                model, request = job
                together.setdefault((model, request.parameters_key), []).append(request)
        for (model, _), requests in together.items():
            self._encode(model, requests)

    def _encode(self, model: str, requests: list[PendingRequest]) -> None:
        """Encode those of ``requests`` (one model, one set of parameters) that are not encoded yet."""
        with self._claims[model]:
            todo = [r for r in requests if r.encoded is None and not r.finished]
            if not todo:
                return
            inputs = [each for request in todo for each in request.inputs]
            try:
                encodings = self._runners[model].encode(inputs, todo[0].parameters)
            except Exception:  # bad parameters or a tokenizer error: the plain path reports it per request
                for request in todo:
                    request.encoded = UNENCODABLE
                return
            start = 0
            for request in todo:
                request.encoded = encodings[start:start + len(request.inputs)]
                start += len(request.inputs)
