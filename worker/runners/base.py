"""The runner protocol the inference thread drives, and how a runner is chosen, loaded and warmed up."""

from __future__ import annotations

import importlib
import logging
import os
from pathlib import Path
from typing import Any, Protocol

from worker.runners import device as devices
from worker.runners.embeddings import EmbeddingRunner
from worker.runners.pipeline import PipelineRunner
from worker.runners.spec import CUSTOM_TASK_PREFIX, EMBEDDINGS_TASK, ModelSpec

log = logging.getLogger("zbatch.worker")


class Runner(Protocol):
    """A loaded model, driven by the inference thread (:mod:`worker.engine`) and nothing else.

    ``run`` returns one msgpack-friendly output per input, in input order, and
    raises :class:`~worker.runners.spec.InputError` for inputs the caller can fix.
    ``modelled_seconds`` is the cost hint for the thread governor: what the last
    batch took at calibration on the full thread count (0 when unknown).
    """

    spec: ModelSpec
    device: str
    modelled_seconds: float

    def warm_up(self) -> None: ...

    def run(self, inputs: list[Any], parameters: dict[str, Any]) -> list[Any]: ...


def runner_class(task: str) -> Any:
    """Built-in runners, or ``python:package.module:Class`` for a runner of your own.

    A custom class is built as ``Class(spec, device, dtype)`` and follows
    :class:`Runner` like the built-in ones (the tests use this to inject faults).
    """
    if task == EMBEDDINGS_TASK:
        return EmbeddingRunner
    if not task.startswith(CUSTOM_TASK_PREFIX):
        return PipelineRunner
    module_name, _, class_name = task.removeprefix(CUSTOM_TASK_PREFIX).partition(":")
    try:
        return getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError, ValueError):
        raise ValueError(f"task {task!r}: cannot import {class_name!r} from {module_name!r}") from None


def load_runner(spec: ModelSpec) -> Runner:
    """Load the model once on the calling thread, place it on its device and warm it up."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    device = devices.resolve_device(spec.device)
    dtype = devices.torch_dtype(spec.dtype, device)
    if not Path(spec.path).is_dir():
        raise ValueError(f"model folder {spec.path!r} for {spec.name!r} does not exist")
    if spec.dtype == "bfloat16" and device == "cpu" and devices.cpu_lacks_native_bfloat16():
        log.warning("model %s: this CPU has neither AVX512-BF16 nor AMX, so torch emulates bfloat16 and it may "
                    "run slower than float32; measure it, or give this model dtype float32", spec.name)
    runner: Runner = runner_class(spec.task)(spec, device, dtype)
    runner.warm_up()
    return runner
