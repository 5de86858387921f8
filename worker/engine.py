"""The inference thread: the only thread in a worker process that touches torch.

It loads the model, warms it up and runs every batch, so torch is driven
from one OS thread (torch's thread pools are per calling thread: a second
thread calling torch pays for its own pool and contends with the first).
The asyncio I/O loop hands it batches in order (:class:`~worker.stages.BatchWork`),
at most one waiting behind the one that runs, and hears back through
``call_soon_threadsafe``; it never waits on torch.  The preparation pool
(:mod:`worker.stages`) tokenizes and plans text batches ahead of it, without
torch, so for a staged runner this thread only copies and launches.

A batch that raises is split in halves and retried until the failing inputs
are alone, so one bad input fails by itself and its neighbours succeed.  A
runner that can tell a bad input before the model runs (an image it cannot
decode) returns an :class:`~worker.runners.InputError` in its place instead,
and the batch runs once without it.

On a CPU, each batch runs on the cores the host's ledger grants it
(:mod:`worker.cores`): all of them while this worker is the only one busy, a
share while others are, never more than are free.  :mod:`worker.threads`
drops torch to one thread while foreign processes hold the cores, and goes
back when they let go.  Without the ledger (``--cores-ledger off``) a worker
keeps a fixed thread count, the host's cores over ``--workers``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from worker.assembler import Counted, ItemFailure
from worker.cores import CoreLedger, host_cores, open_ledger, openmp_idle_spin
from worker.runners import InputError, ModelDetails, ModelSpec, Runner, details_of, load_runner, operation_of, phases
from worker.runners.base import Operation, StagedRunner, staged
from worker.runners.device import resolve_device
from worker.stages import BatchWork, PrepPool, Settled, TokenizeAhead, settle
from worker.threads import ThreadGovernor
from zbatch.protocol.vocabulary import RUN
from zbatch.protocol.wire import Status

log = logging.getLogger("zbatch.worker")
Outcomes = list[Any]
# The pool's threads tokenize in Rust without the GIL, but each call has Python around it: past a few threads
# they queue for the GIL with the I/O loop and this thread instead of adding throughput.
MAX_PREP_THREADS = 4
Done = Callable[[int, Outcomes, float], None]  # ticket, one outcome per item, the model's time


def _planned_call(runner: StagedRunner[Any, Any], settled: Settled) -> Operation:
    """A call for :func:`run_isolated`: the settled plan for the whole batch, a new plan for any part of it."""
    def call(encodings: list[Any], parameters: dict[str, Any]) -> list[Any]:
        plan = settled.plan if encodings is settled.encodings else runner.plan(encodings, parameters)
        return runner.run_planned(plan)

    return call


def run_isolated(call: Operation, inputs: list[Any], parameters: dict[str, Any]) -> Outcomes:
    """One outcome per input: its output (:class:`Counted` if the runner counted its tokens), or an
    ItemFailure if it fails even on its own.

    ``call`` is a runner's operation (:func:`worker.runners.operation_of`).
    """
    try:
        outputs = call(inputs, parameters)
        if len(outputs) != len(inputs):
            raise RuntimeError(f"model returned {len(outputs)} outputs for {len(inputs)} inputs")
        tokens = getattr(outputs, "tokens", None) or [None] * len(outputs)
        return [ItemFailure(Status.BAD_REQUEST, str(output), per_input=True) if isinstance(output, InputError)
                else output if count is None else Counted(output, count)
                for output, count in zip(outputs, tokens, strict=True)]
    except InputError as exc:
        if len(inputs) == 1:
            return [ItemFailure(Status.BAD_REQUEST, str(exc))]
    except Exception as exc:  # the model's own failure: isolate it, report it without internals
        if len(inputs) == 1:
            log.exception("inference failed on one input")
            return [ItemFailure(Status.WORKER_ERROR,
                                f"inference failed on this input ({type(exc).__name__}); see the worker log")]
    middle = len(inputs) // 2
    return run_isolated(call, inputs[:middle], parameters) + run_isolated(call, inputs[middle:], parameters)


@dataclass(frozen=True, slots=True)
class _Job:
    work: BatchWork
    planned: Future[Settled | None] | None  # planned on the pool while the batch before it ran


class InferenceThread:
    """Loads every model in ``specs`` and runs batches in order, one at a time.

    ``torch_threads``: the most a batch may use (0: every core the ledger has, or without a ledger the
    host's cores over ``workers``); ``cores_ledger``: the ledger's file (None: a fixed thread count);
    ``tokenize_ahead``: for which models the preparation pool tokenizes and plans text batches in the
    model's shadow (:class:`~worker.stages.TokenizeAhead`); ``prep_threads``: the pool's threads (0: the
    host's cores over ``workers``, at most :data:`MAX_PREP_THREADS`).
    """

    def __init__(self, specs: list[ModelSpec], torch_threads: int, loop: asyncio.AbstractEventLoop,
                 done: Done, workers: int = 1, cores_ledger: str | None = None,
                 tokenize_ahead: TokenizeAhead = TokenizeAhead.ON_ACCELERATORS, prep_threads: int = 0) -> None:
        self.specs = specs
        self._tokenize_ahead = tokenize_ahead
        self.torch_threads = torch_threads or max(1, host_cores() // workers)  # until the ledger is open
        self._threads_cap = torch_threads
        self._ledger_file = cores_ledger
        if cores_ledger is not None:
            # Between batches, OpenMP's threads spin on their cores (libgomp's default spin): a worker that just ran
            # a batch would burn the cores the ledger hands to the next busy worker; threads that never spin
            # sleep and wake hundreds of times per forward pass.  Read once, when torch loads its OpenMP
            # runtime: set before the first ``import torch``.
            os.environ.update(openmp_idle_spin(os.environ))
        self.ledger: CoreLedger | None = None
        self.device = ""
        self.details: dict[str, ModelDetails] = {}  # by model name, once loaded: what READY says about each
        self.batch_sizes: dict[str, int] = {}  # by model name, once loaded: its largest batch on its device
        self.prepared_ahead: frozenset[str] = frozenset()  # models whose batches the pool prepares, once loaded
        self.pool = PrepPool(prep_threads or max(1, min(MAX_PREP_THREADS, host_cores() // workers)))
        # The pool's threads are the tokenizer's parallelism: each call parallel over every core as well
        # (the fast tokenizer's default) would oversubscribe them, and cost more than it saves on a batch.
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        self._staged: dict[str, StagedRunner[Any, Any]] = {}  # the loaded models the pool prepares ahead
        self._governed_threads = torch_threads
        self._faster_than_calibrated = False  # logged once: batches showed calibration ran on a busier host
        self._loop = loop
        self._done = done
        self._batches: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._in_engine = 0  # batches submitted and not done yet (the I/O loop's count)
        self._loaded: asyncio.Future[None] = loop.create_future()
        # Done when the thread ends, for whatever reason: the worker cannot serve without it.
        self.finished: asyncio.Future[None] = loop.create_future()
        self._thread = threading.Thread(target=self._main, name="inference", daemon=True)

    async def start(self) -> None:
        """Start the thread and wait until the model is loaded and warm (or failed to load)."""
        self._thread.start()
        await self._loaded

    def submit(self, work: BatchWork) -> None:
        """I/O loop: run ``work`` after the batches submitted before it; one that waits is planned meanwhile."""
        runner = self._staged.get(work.model) if work.operation == RUN else None
        planned = self.pool.plan(runner, work) if runner is not None and self._in_engine else None
        self._in_engine += 1
        self._batches.put(_Job(work, planned))

    def encode_ahead(self, model: str, inputs: Sequence[Any], parameters: dict[str, Any],
                     key: bytes) -> Future[list[Any]] | None:
        """I/O loop: the future of a waiting request's encodings, if its model is prepared ahead."""
        runner = self._staged.get(model)
        return None if runner is None else self.pool.encode(runner, inputs, parameters, key)

    def stop(self, timeout_s: float) -> None:
        self._batches.put(None)
        self._thread.join(timeout_s)
        self.pool.stop(timeout_s)

    def _main(self) -> None:
        error: BaseException | None = None
        try:
            self._serve()
        except BaseException as exc:  # handed to the loop, whose lifecycle logs it and exits
            error = exc
        finally:
            with contextlib.suppress(RuntimeError):  # the loop is closed: the process is exiting anyway
                self._loop.call_soon_threadsafe(self._set_finished, error)

    def _serve(self) -> None:
        try:
            with phases.recording() as first:
                with phases.phase("imports"):  # what every model needs; torch's own import dominates
                    import torch  # noqa: F401
                    import transformers  # noqa: F401
                self._open_ledger()
            runners = self._load(first)
        except BaseException as exc:  # report load failures to the loop, which exits with a message
            self._loop.call_soon_threadsafe(self._set_loaded, exc)
            return
        for name, runner in runners.items():
            if self._tokenize_ahead.applies(runner.device) and (stages := staged(runner)) is not None:
                self._staged[name] = stages
        self.prepared_ahead = frozenset(self._staged)
        if self._staged:
            self.pool.start()
        self._loop.call_soon_threadsafe(self._set_loaded, None)
        governor = ThreadGovernor(self.torch_threads if self.device == "cpu" else 1, time.monotonic)
        while (job := self._batches.get()) is not None:
            runner = runners[job.work.model]
            wanted = self._governed(governor)
            threads = self._take_cores(runner, wanted)
            started = time.perf_counter()
            try:
                outcomes = self._run(runner, job)
            finally:
                if self.ledger is not None and runner.device == "cpu":
                    self.ledger.release()
            elapsed = time.perf_counter() - started
            self._loop.call_soon_threadsafe(self._finish, job.work.ticket, outcomes, elapsed)
            if threads == wanted:  # a batch on fewer threads than chosen (cores shared) says nothing of the choice
                governor.observe(threads, elapsed, runner.modelled_seconds, job.work.model)

    def _open_ledger(self) -> None:
        """The host's cores ledger, for a worker whose models run on the CPU; every core is then the most a
        batch may use (``--torch-threads`` caps it)."""
        if not any(resolve_device(spec.device) == "cpu" for spec in self.specs):
            return
        self.ledger = open_ledger(self._ledger_file)
        if self.ledger is not None:
            self.torch_threads = min(self._threads_cap or self.ledger.cores, self.ledger.cores)
            self._governed_threads = self.torch_threads
            log.info("sharing this host's %d cores with its other workers (cores ledger %s): up to %d torch "
                     "thread(s) a batch", self.ledger.cores, self.ledger.path, self.torch_threads)

    def _take_cores(self, runner: Runner, wanted: int) -> int:
        """Cores for the next batch from the ledger (waiting while none is free), and torch set to use them."""
        import torch

        threads = wanted
        if self.ledger is not None and runner.device == "cpu":
            threads = self.ledger.acquire(wanted)
        if threads != torch.get_num_threads():
            torch.set_num_threads(threads)
        return threads

    def _run(self, runner: Runner, job: _Job) -> Outcomes:
        """One outcome per item: the batch as planned (on the pool, or here), or run the plain way."""
        work = job.work
        stages = self._staged.get(work.model) if work.operation == RUN else None
        if stages is not None:
            if job.planned is not None and not job.planned.cancel():
                settled = job.planned.result()  # under way on the pool: nearly done
            else:
                settled = settle(stages, work)
            if settled is not None:
                return run_isolated(_planned_call(stages, settled), settled.encodings, work.parameters)
        return run_isolated(operation_of(runner, work.operation), list(work.inputs), work.parameters)

    def _finish(self, ticket: int, outcomes: Outcomes, elapsed_s: float) -> None:
        self._in_engine -= 1
        self._done(ticket, outcomes, elapsed_s)

    def _governed(self, governor: ThreadGovernor) -> int:
        """The governor's thread count for the next batch (probes included); logged when its choice changes, and
        once when batches show that calibration ran on a busier host."""
        if not self._faster_than_calibrated and governor.lowest_reference < 1:
            self._faster_than_calibrated = True
            log.info("batches run in %.2fx their calibrated time: calibration ran on a busier host, so these batches "
                     "are now the quiet reference for the thread count", governor.lowest_reference)
        if governor.current != self._governed_threads:
            self._governed_threads = governor.current
            if governor.current < governor.full:
                log.info("torch threads now %d: other processes hold the cores (batches took %.1fx their "
                         "quiet-machine time on %d threads, %.1fx on %d)", governor.current, governor.lost_slowdown,
                         governor.full, governor.slowdown, governor.current)
            else:
                log.info("torch threads back to %d: the cores are free again", governor.current)
        return governor.threads

    def _load(self, times: phases.StartPhases) -> dict[str, Runner]:
        """Load every model; each one's log line says where its start went (the first's includes the imports)."""
        import torch
        import transformers

        transformers.logging.disable_progress_bar()  # type: ignore[no-untyped-call, unused-ignore]  # garbles logs
        torch.set_num_threads(self.torch_threads)
        runners = {}
        for spec in self.specs:
            started = time.perf_counter() - times.total  # the first model's time includes the imports
            with phases.recording(times):
                runners[spec.name] = runner = self._load_one(spec)
            elapsed = time.perf_counter() - started
            log.info("model %s (%s) loaded on %s in %.1f s with %d torch thread(s): %s", spec.name,
                     spec.task, runner.device, elapsed, self.torch_threads, times.summary(elapsed))
            times = phases.StartPhases()
        self.device = ",".join(sorted({runner.device for runner in runners.values()}))
        self.details = {name: details_of(runner) for name, runner in runners.items()}
        self.batch_sizes = {name: runner.spec.max_batch_size for name, runner in runners.items()}
        return runners

    def _load_one(self, spec: ModelSpec) -> Runner:
        """Load ``spec``'s model holding every core of the ledger: warm-up calibrates it on every thread, and its
        timings are wrong on fewer."""
        if self.ledger is not None:
            with phases.phase("waiting for the cores"):
                self.ledger.acquire(self.torch_threads, whole=True)
        try:
            return load_runner(spec)
        finally:
            if self.ledger is not None:
                self.ledger.release()

    def _set_finished(self, error: BaseException | None) -> None:
        if error is None:
            self.finished.set_result(None)
        else:
            self.finished.set_exception(error)

    def _set_loaded(self, error: BaseException | None) -> None:
        if error is None:
            self._loaded.set_result(None)
        else:
            self._loaded.set_exception(error)
