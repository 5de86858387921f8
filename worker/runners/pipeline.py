"""Any other string-input transformers pipeline as a runner: one pipeline call per batch.

The tables say which parameters each pipeline really takes, which it needs,
and what warm-up must pass, so bad parameters are refused with a message that
names them instead of being dropped silently.

Outputs carry each input's token count.  The pipeline tokenizes inside, out
of reach, so the count takes one more tokenizer call per batch (small beside
the pipeline's own): the input as the tokenizer encodes it alone, with
special tokens, truncated where the pipeline truncates (feature-extraction);
zero-shot-classification's count is its text's, not the pairs it forms with
each candidate label.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from worker.runners.encoding import model_max_length, tokenize_texts
from worker.runners.spec import (
    InputError,
    ModelDetails,
    ModelSpec,
    Outputs,
    announced_labels,
    check_inputs,
    quoted_names,
)
from worker.runners.text import dtype_name
from zbatch.protocol.vocabulary import EMBEDDINGS, IMAGE_TASKS, RERANK, TEXT_CLASSIFICATION

if TYPE_CHECKING:
    import torch

# Pipeline tasks whose inputs are plain strings, so they fit the list[str] request contract
# (text-classification has a runner of its own: worker.runners.classify).
PIPELINE_TASKS = (
    "feature-extraction",
    "fill-mask",
    "text-generation",
    "token-classification",
    "zero-shot-classification",
)
OWN_RUNNER_TASKS = (EMBEDDINGS, RERANK, TEXT_CLASSIFICATION, *IMAGE_TASKS)
LABELLED_TASKS = ("token-classification",)  # whose labels READY announces
# The worker owns batching; letting callers set these would break the one-output-per-input contract.
_RESERVED_PARAMETERS = frozenset({"batch_size", "num_workers"})
# Without truncation, inputs longer than the model's positions crash the forward pass. fill-mask is
# left alone: truncating could silently drop the mask, so an over-long input stays a model error.
_DEFAULT_PARAMETERS: dict[str, dict[str, Any]] = {
    "feature-extraction": {"truncation": True, "return_tensors": True},  # tensors skip a .tolist() round trip
}
# What pipelines with a **kwargs catch-all really use; they silently drop every other key.
# Pipelines absent here either take no catch-all or validate it themselves (generate() does).
_CATCH_ALL_PARAMETERS: dict[str, frozenset[str]] = {
    "feature-extraction": frozenset(),
    "zero-shot-classification": frozenset({"candidate_labels", "hypothesis_template", "multi_label"}),
}
# The pipeline fails with an unhelpful message when these are missing.
_REQUIRED_PARAMETERS: dict[str, tuple[str, ...]] = {"zero-shot-classification": ("candidate_labels",)}
# Some tasks cannot run at all without these, so warm-up has to supply them.
_WARMUP_PARAMETERS: dict[str, dict[str, Any]] = {
    "text-generation": {"max_new_tokens": 1},
    "zero-shot-classification": {"candidate_labels": ["yes", "no"]},
}


class PipelineRunner:
    """Any string-input transformers pipeline, run once per batch with outputs made msgpack-friendly."""

    def __init__(self, spec: ModelSpec, device: str, dtype: torch.dtype) -> None:
        from transformers import pipeline

        self.spec = spec
        self.device = device
        self.modelled_seconds = 0.0  # no cost model for pipelines
        self.task = _pipeline_task(spec.task)
        self._pipe = pipeline(self.task, model=spec.path, tokenizer=spec.path, device=device, **spec.pretrained)
        self._pipe.model.to(dtype=dtype).eval()
        tokenizer = self._pipe.tokenizer
        if self.task == "text-generation" and tokenizer.pad_token is None:
            # Decoder-only tokenizers (GPT-2 style) have no pad token, and batching needs one.
            tokenizer.pad_token = tokenizer.eos_token
            tokenizer.padding_side = "left"
        self._accepted = _accepted_parameters(self._pipe, self.task)
        config = self._pipe.model.config
        self.details = ModelDetails(model_max_length(tokenizer, config), dtype=dtype_name(self._pipe.model.dtype),
                                    labels=announced_labels(config.id2label) if self.task in LABELLED_TASKS else ())

    def warm_up(self) -> None:
        """Run a one-item batch that every model of this task can answer."""
        text = "hello world"
        if self.task == "fill-mask":
            text = f"hello {self._pipe.tokenizer.mask_token}"
        self.run([text], dict(_WARMUP_PARAMETERS.get(self.task, {})))

    def tokenize(self, inputs: list[Any], parameters: dict[str, Any]) -> Outputs:
        return tokenize_texts(self._pipe.tokenizer, inputs, parameters)

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
        # exactly what feature-extraction's preprocess() uses; other pipelines: the input encoded alone
        tokenize_kwargs = self._pipe._sanitize_parameters(**kwargs)[0] if self.task == "feature-extraction" else {}
        lengths = [len(ids) for ids in self._pipe.tokenizer(inputs, **tokenize_kwargs)["input_ids"]]
        if self.task == "feature-extraction":
            return Outputs(self._unpad(lengths, results), lengths)
        return Outputs([_plain(result) for result in results], lengths)

    def _unpad(self, lengths: list[int], results: list[Any]) -> list[np.ndarray]:
        """Cut off the batch padding that feature-extraction leaves on every row."""
        import torch

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
            f"unknown task {task!r}: use {', '.join(map(repr, OWN_RUNNER_TASKS))} or a transformers pipeline "
            f"task ({', '.join(PIPELINE_TASKS)})"
        ) from None
    if canonical not in PIPELINE_TASKS:
        raise ValueError(
            f"task {task!r} does not take plain-text inputs; zbatch serves {', '.join(OWN_RUNNER_TASKS)} and "
            f"{', '.join(PIPELINE_TASKS)}"
        )
    return str(canonical)


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
