"""The runner protocol the inference thread drives, and how a runner is chosen, loaded and warmed up."""

from __future__ import annotations

import dataclasses
import importlib
import logging
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol, TypeVar, runtime_checkable

from worker.runners import device as devices
from worker.runners import phases, runtime
from worker.runners.classify import SequenceClassifier
from worker.runners.embeddings import EmbeddingRunner
from worker.runners.images import ImageRunner
from worker.runners.pipeline import PipelineRunner
from worker.runners.sparse import SparseEmbeddingRunner
from worker.runners.spec import InputError, ModelDetails, ModelSpec
from worker.runners.text import TextRunner
from zbatch.protocol.vocabulary import (
    CLASSIFICATION,
    CUSTOM_TASK_PREFIX,
    DECODE,
    EMBEDDINGS,
    IMAGE_TASKS,
    RERANK,
    RUN,
    SPARSE_EMBEDDINGS,
    TOKENIZE,
    TOKENIZER,
)

Operation = Callable[[list[Any], dict[str, Any]], list[Any]]

log = logging.getLogger("zbatch.worker")


class Runner(Protocol):
    """A loaded model, driven by the inference thread (:mod:`worker.engine`) and nothing else.

    ``run`` returns one result per input, in input order: a msgpack-friendly
    output, or an :class:`~worker.runners.spec.InputError` for an input the
    caller must fix (the others still get their outputs).  A text runner
    returns them as :class:`~worker.runners.spec.Outputs` with the tokens each
    input took.  ``run`` raises InputError when the whole batch is unusable
    (bad parameters, say).
    ``modelled_seconds`` is the cost hint for the thread governor: what the last
    batch took at calibration on the full thread count (0 when unknown).

    A runner MAY also have ``details`` (:class:`~worker.runners.spec.ModelDetails`,
    for READY) and a method named after each other operation it answers,
    ``tokenize(inputs, parameters)``, ``decode`` or ``embed_all`` (PROTOCOL.md
    section 5.3); :func:`details_of` and :func:`operation_of` read them, so a
    runner without them still serves and refuses those operations.
    """

    spec: ModelSpec
    device: str
    modelled_seconds: float

    def warm_up(self) -> None: ...

    def run(self, inputs: list[Any], parameters: dict[str, Any]) -> list[Any]: ...


EncodingT = TypeVar("EncodingT")
PlanT = TypeVar("PlanT")


@runtime_checkable
class StagedRunner(Runner, Protocol[EncodingT, PlanT]):
    """A runner whose ``run`` is three steps the worker may put on different threads (:mod:`worker.stages`).

    ``run(inputs, parameters)`` is ``run_planned(plan(encode(inputs, parameters), parameters))``:

    * ``encode``: each input in the form the model takes it, or the
      :class:`~worker.runners.spec.InputError` that refuses it alone; raises
      InputError for a bad batch.  No torch: any thread may call it, and an
      input encodes the same alone as in a batch, so a batch may gather
      encodings made for its requests one by one.
    * ``plan``: the batch's arrays from its encodings (numpy, no torch).
    * ``run_planned``: the model over a plan; the only step that calls torch,
      on the inference thread.
    """

    def encode(self, inputs: list[Any], parameters: dict[str, Any]) -> list[EncodingT]: ...

    def plan(self, encodings: Sequence[EncodingT], parameters: dict[str, Any]) -> PlanT: ...

    def run_planned(self, plan: PlanT) -> list[Any]: ...


def staged(runner: Runner) -> StagedRunner[Any, Any] | None:
    """``runner`` as a staged runner, if it is one."""
    return runner if isinstance(runner, StagedRunner) else None


def operation_of(runner: Runner, operation: str) -> Operation:
    """The runner's method for a request's ``operation`` (its name); one that refuses every batch if it has none."""
    if operation == RUN:
        return runner.run
    method: Operation | None = getattr(runner, "serialized_tokenizer" if operation == TOKENIZER else operation, None)
    if method is not None:
        return method
    message = (f"model {runner.spec.name!r} has no tokenizer; the {operation!r} operation works on text models"
               if operation in (TOKENIZE, DECODE, TOKENIZER) else
               f"model {runner.spec.name!r} is a {runner.spec.task} model; the {operation!r} operation works on "
               "embeddings models")

    def refuse(inputs: list[Any], parameters: dict[str, Any]) -> list[Any]:
        raise InputError(message)

    return refuse


def details_of(runner: Runner) -> ModelDetails:
    details = getattr(runner, "details", None)
    return details if isinstance(details, ModelDetails) else ModelDetails()


def runner_class(task: str) -> Any:
    """Built-in runners, or ``python:package.module:Class`` for a runner of your own.

    A custom class is built as ``Class(spec, device, dtype)`` and follows
    :class:`Runner` like the built-in ones (the tests use this to inject faults).
    """
    if task == EMBEDDINGS:
        return EmbeddingRunner
    if task == SPARSE_EMBEDDINGS:
        return SparseEmbeddingRunner
    if task == RERANK or task in CLASSIFICATION:
        return SequenceClassifier
    if task in IMAGE_TASKS:
        return ImageRunner
    if not task.startswith(CUSTOM_TASK_PREFIX):
        return PipelineRunner
    module_name, _, class_name = task.removeprefix(CUSTOM_TASK_PREFIX).partition(":")
    try:
        return getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError, ValueError):
        raise ValueError(f"task {task!r}: cannot import {class_name!r} from {module_name!r}") from None


def load_runner(spec: ModelSpec) -> Runner:
    """Load the model once on the calling thread, place it on its device, choose its runtime (torch, or ONNX
    Runtime: :mod:`worker.runners.runtime`) and warm it up; each step a phase of the start
    (:mod:`worker.runners.phases`).

    The runner's ``spec`` is ``spec`` with its batch size resolved for the device.
    """
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    with phases.phase("device"):
        device = devices.resolve_device(spec.device)
        dtype = devices.torch_dtype(spec.dtype, device, spec.path)
    spec = dataclasses.replace(spec, max_batch_size=spec.max_batch_size or devices.batch_size(device))
    if not Path(spec.path).is_dir():
        raise ValueError(f"model folder {spec.path!r} for {spec.name!r} does not exist")
    if spec.dtype == "bfloat16" and device == "cpu" and devices.cpu_lacks_native_bfloat16():
        log.warning("model %s: this CPU has neither AVX512-BF16 nor AMX, so torch emulates bfloat16 and it may "
                    "run slower than float32; measure it, or give this model dtype float32", spec.name)
    runtime.check_settings(spec)
    runner: Runner = runtime.load(spec, device, dtype, runner_class(spec.task))
    if runner.spec.max_batch_size < 1:  # a custom runner that built a spec of its own: 0 would announce no batch
        runner.spec = dataclasses.replace(runner.spec, max_batch_size=spec.max_batch_size)
    if spec.max_batch_tokens and not isinstance(runner, TextRunner):
        log.warning("model %s: max_batch_tokens applies to models zbatch tokenizes itself (embeddings, rerank, "
                    "classification and the like); this %s model runs its batches whole", spec.name, spec.task)
    with phases.phase("warm-up"):
        runner.warm_up()
    return runner
