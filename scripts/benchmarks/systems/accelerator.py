"""A simulated accelerator behind the real worker: a model that sleeps as a GPU computes, and takes no CPU.

The worker, broker and policy are the real ones; only the model is replaced by :class:`SleepRunner`,
which costs a fixed time per batch plus a little per item, like a GPU, and uses no CPU, so that this
host plays a GPU host.  The overlap, idle, chaos and staggered cases, the tests of transitions and
shedding, and :mod:`scripts.benchmarks.studies.delay` run on it.

:class:`TokenizingSleepRunner` takes real texts through the real tokenizer of the bundled model
first (a text runner whose forward pass sleeps): the preparation pool encodes and plans the next
batch while the model runs (:mod:`worker.stages`); :class:`InlineTokenizingSleepRunner` has the
inference thread do the same work before each batch, as a runner without the three steps is run.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path
from typing import Any

from scripts.benchmarks.common import batches, procs
from scripts.benchmarks.common.texts import shuffled
from scripts.benchmarks.load import calls, loops
from worker.runners.grouping import NEVER_SPLIT
from worker.runners.spec import default_model_path
from worker.runners.text import TextRunner
from zbatch.client import AsyncClient
from zbatch.testing import Daemon, Daemons, free_port, start_broker, start_worker, wait_until

BATCH_MS = 20.0  # fixed cost of one batch on the simulated accelerator
ITEM_MS = 0.2  # and of each item in it
COST_ENV = "DELAY_BENCH_COST_MS"  # "batch,item": how the benchmark tells the worker's runner its costs
READY_GATE_ENV = "DELAY_BENCH_READY_GATE"  # a file: SleepRunner's warm-up ends at the time.time() written there
COLD_ENV = "DELAY_BENCH_COLD_BATCHES"  # "count,ms": SleepRunner's first count batches each take ms longer
MODEL = "simulated"
MAX_BATCH = 32
GPU_MAX_BATCH = 128  # the worker's default batch on CUDA (worker/config.py): a GPU host's worker
RUNNERS = {"none": "SleepRunner", "inline": "InlineTokenizingSleepRunner", "ahead": "TokenizingSleepRunner"}


class SleepRunner:
    """A worker runner (``--task python:scripts.benchmarks.systems.accelerator:SleepRunner``) that sleeps like a GPU
    computes."""

    def __init__(self, spec: Any, device: str, dtype: Any) -> None:
        self.spec = spec
        self.device = "cpu"
        self.modelled_seconds = 0.0
        batch_ms, item_ms = os.environ.get(COST_ENV, f"{BATCH_MS},{ITEM_MS}").split(",")
        self.batch_s, self.item_s = float(batch_ms) / 1000, float(item_ms) / 1000
        count, cold_ms = os.environ.get(COLD_ENV, "0,0").split(",")
        self.cold_batches, self.cold_s = int(count), float(cold_ms) / 1000

    def warm_up(self) -> None:
        """Nothing to warm: the runner has no model.  With ``READY_GATE_ENV`` set, say so in a file beside the
        gate (its name plus ``.loaded``) and wait for the time the gate holds (:func:`open_gates`): a worker
        registers once its runner is loaded, so this sets when each of several workers registers."""
        gate = os.environ.get(READY_GATE_ENV)
        if gate:
            Path(f"{gate}.loaded").touch()
            while not Path(gate).exists():
                time.sleep(0.01)
            time.sleep(max(0.0, float(Path(gate).read_text()) - time.time()))

    def run(self, inputs: list[str], parameters: dict[str, Any]) -> list[Any]:
        """Sleep for the batch; the first few longer (``COLD_ENV``), as a GPU's first real batches after a start
        are (lazy initialisation, shapes the warm-up missed): what a broker's first measurement of a fresh
        worker sees.  Two cold batches make that measurement one small batch over a long time: the first
        batch holds whatever arrived first, and the heartbeat after it comes while the second still runs."""
        cold = self.cold_s if self.cold_batches > 0 else 0.0
        self.cold_batches -= 1
        time.sleep(cold + self.batch_s + self.item_s * len(inputs))
        return [len(text) for text in inputs]


class _Sleeping:
    """What :class:`TokenizingSleepRunner` has for a model: a dtype for READY, and a forward pass that sleeps."""

    dtype = "float32"

    def __init__(self, batch_s: float, item_s: float) -> None:
        self.batch_s, self.item_s = batch_s, item_s

    def __call__(self, **encoded: Any) -> None:
        time.sleep(self.batch_s + self.item_s * len(encoded["input_ids"]))


class TokenizingSleepRunner(TextRunner):
    """A text runner with the bundled model's real tokenizer, whose model sleeps like :class:`SleepRunner`.

    Batches run in one group (no length grouping: one sleep a batch), so only the tokenizer's work and where
    it runs differ from :class:`SleepRunner`.
    """

    def __init__(self, spec: Any, device: str, dtype: Any) -> None:
        from transformers import AutoTokenizer

        batch_ms, item_ms = os.environ.get(COST_ENV, f"{BATCH_MS},{ITEM_MS}").split(",")
        tokenizer = AutoTokenizer.from_pretrained(default_model_path(), use_fast=True)
        model = _Sleeping(float(batch_ms) / 1000, float(item_ms) / 1000)
        super().__init__(spec, "cpu", tokenizer, model, 256)
        self.cost_model = NEVER_SPLIT

    def warm_up(self) -> None:
        """Nothing to calibrate: the model is a sleep."""

    def _forward(self, encoded: Any, options: Any) -> list[Any]:
        self._model(**encoded)
        return [int(n) for n in encoded["attention_mask"].sum(dim=1)]


class InlineTokenizingSleepRunner:
    """:class:`TokenizingSleepRunner` without its three steps: the inference thread tokenizes each batch."""

    def __init__(self, spec: Any, device: str, dtype: Any) -> None:
        self._runner = TokenizingSleepRunner(spec, device, dtype)
        self.spec, self.device, self.modelled_seconds = self._runner.spec, "cpu", 0.0

    def warm_up(self) -> None:
        """Nothing to calibrate: the model is a sleep."""

    def run(self, inputs: list[Any], parameters: dict[str, Any]) -> list[Any]:
        return self._runner.run(inputs, parameters)


def accelerator_env(model_path: str, batch_ms: float = BATCH_MS, item_ms: float = ITEM_MS,
                    ready_gate: str | None = None, cold: tuple[int, float] = (0, 0.0)) -> dict[str, str]:
    """The variables that make a worker serve model ``simulated`` on a :class:`SleepRunner` as a GPU host's
    worker would (batches of up to :data:`GPU_MAX_BATCH`, two of them in flight, no share of the host's cores),
    and a gateway take it for its default model: what ``zbatch serve`` passes on to its daemons, so that a CPU
    host can play a GPU host.  ``model_path``: any existing folder (the runner reads nothing from it);
    ``ready_gate``: see :data:`READY_GATE_ENV`; ``cold``: how many first batches take how many ms longer
    (:data:`COLD_ENV`)."""
    env = {"ZBATCH_TASK": "python:scripts.benchmarks.systems.accelerator:SleepRunner", "ZBATCH_MODEL_PATH": model_path,
           "ZBATCH_MODEL_NAME": MODEL, "ZBATCH_DEFAULT_MODEL": MODEL, "ZBATCH_MAX_BATCH_SIZE": str(GPU_MAX_BATCH),
           "ZBATCH_CORES_LEDGER": "off", "ZBATCH_TORCH_THREADS": "1", "ZBATCH_TOKENIZE_AHEAD": "true",
           "ZBATCH_GPUS": "none", COST_ENV: f"{batch_ms},{item_ms}", COLD_ENV: f"{cold[0]},{cold[1]:g}"}
    return env | ({READY_GATE_ENV: ready_gate} if ready_gate else {})


def open_gates(gates: list[str], every_s: float, timeout_s: float) -> float:
    """Once every worker waiting at ``gates`` (see :data:`READY_GATE_ENV`) has loaded, let the first register
    now and each next one ``every_s`` after the one before; returns the first one's time.time()."""
    wait_until(lambda: all(Path(f"{gate}.loaded").exists() for gate in gates), timeout_s, "the workers to load")
    first = time.time()
    for index, gate in enumerate(gates):
        Path(f"{gate}.tmp").write_text(repr(first + index * every_s))
        Path(f"{gate}.tmp").rename(gate)
    return first


def start_simulated_worker(daemons: Daemons, broker: Daemon, batch_ms: float, item_ms: float,
                           tokenize: str = "none", **settings: Any) -> str:
    """The real worker serving model ``simulated`` with a :class:`SleepRunner`, or with a tokenizer in front
    (``tokenize``: see RUNNERS); ``settings`` as its flags.

    Its runner says it runs on the CPU but leaves it idle, as an accelerator would, so the worker is told
    to tokenize ahead as it does for models on an accelerator (``--tokenize-ahead auto``).

    Returns its metrics URL.
    """
    port = free_port()
    settings = {"tokenize_ahead": "true"} | settings
    daemons.add(start_worker(broker, daemons.log_dir, "w0", env={COST_ENV: f"{batch_ms},{item_ms}"}, workers=1,
                             torch_threads=1, task=f"python:scripts.benchmarks.systems.accelerator:{RUNNERS[tokenize]}",
                             model_path=tempfile.mkdtemp(), model_name=MODEL, metrics_port=port, **settings))
    return f"http://127.0.0.1:{port}/metrics"


def start_simulated_system(daemons: Daemons, /, batch_ms: float, item_ms: float, tokenize: str = "none",
                           **settings: Any) -> tuple[str, str]:
    """A broker and the simulated worker (``settings`` as its flags).

    Returns the broker's frontend and the worker's metrics URL.
    """
    broker = daemons.add(start_broker(daemons.log_dir))
    return broker.frontend, start_simulated_worker(daemons, broker, batch_ms, item_ms, tokenize, **settings)


async def measure(delay_ms: float, concurrency: int, seconds: float, batch_ms: float, item_ms: float,
                  tokenize: str = "none") -> dict[str, Any]:
    """Throughput and batch sizes of ``concurrency`` closed-loop clients with this batch delay."""
    with procs.running() as daemons:
        frontend, metrics = await procs.start(daemons, start_simulated_system, batch_ms, item_ms, tokenize,
                                              max_batch_size=MAX_BATCH, max_batch_delay_ms=delay_ms)
        async with AsyncClient(frontend) as client:
            texts = ["a short text"] if tokenize == "none" else shuffled()
            call = calls.zmq_infer_call(client, MODEL, texts)
            before = await batches.snapshot(metrics)
            result = await loops.closed_loop(call, concurrency, warmup_s=0.0, duration_s=seconds)
            ran = batches.difference(before, await batches.snapshot(metrics))
        full = min(concurrency, MAX_BATCH)
        ideal = full / (batch_ms + item_ms * full) * 1000
        return {"req_s": result["req_s"], "ideal": ideal, "p50_ms": result["p50_ms"], "batches": ran}
