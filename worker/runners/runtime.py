"""Which runtime runs a text model: torch, or ONNX Runtime where the model exports and validates.

Theory of operation
-------------------
``--runtime`` (:class:`~worker.runners.spec.ModelSpec` ``runtime``) is one of:

* ``torch``: the transformers model, as loaded.
* ``onnx``: ONNX Runtime, or the worker does not start (the reason is its
  error).
* ``auto`` (the worker's default): ONNX Runtime where it can serve the model
  (:func:`unsupported` says where it cannot: a GPU, a dtype other than
  float32, a task other than embeddings, rerank and text classification,
  ``onnxruntime`` not installed), torch elsewhere; and torch for a model whose
  export fails or does not validate, with one log line that says why.

:func:`with_onnx` runs before warm-up, so before the worker says READY: it
exports the runner's model once (:mod:`worker.runners.onnx_export`, cached),
and validates each graph the export wrote, the fused one first, against the
torch model on :data:`SAMPLES` run as one padded batch and each alone
(unpadded): every input's output (the embedding, pooled as the model declares
it, or the logits) must agree with torch's at cosine ≥ :data:`MIN_COSINE`; a
single number (a cross-encoder's score) must agree to within
``1 - MIN_COSINE`` of its size.
The first graph that holds replaces the runner's model
(:class:`~worker.runners.onnx_session.OrtModel`); the torch model is dropped.
``--quantize int8`` then tries ORT's int8 graph at the lower bar
:data:`INT8_MIN_COSINE` and keeps the float32 graph, with a log line, where
it falls short.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from worker.runners.classify import SequenceClassifier
from worker.runners.embeddings import EmbeddingRunner
from worker.runners.spec import QUANTIZE, RUNTIMES, InputKind, ModelSpec
from worker.runners.text import TextRunner

log = logging.getLogger("zbatch.worker")

MIN_COSINE = 0.99999  # float32 ONNX Runtime against torch
INT8_MIN_COSINE = 0.98  # int8 weights against float32 torch: close, not equal (all-MiniLM-L6-v2: 0.984 at worst)
SAMPLES = (
    "Hi.",
    "The quick brown fox jumps over the lazy dog by the river.",
    "A broker hands each worker a batch of requests, and the worker answers every one of them before its "
    "deadline, or says why it could not.",
)


class ExportRefused(Exception):
    """The model's ONNX export failed or did not validate; the message says why."""


@dataclass(frozen=True, slots=True)
class Validated:
    graph: str
    agreement: float  # the lowest agreement over the samples (a cosine)


def head_of(runner: Any) -> str | None:
    """The model output a runner reads, if ONNX Runtime can stand in for its model."""
    if isinstance(runner, EmbeddingRunner):
        return "last_hidden_state"
    if isinstance(runner, SequenceClassifier):
        return "logits"
    return None


def unsupported(spec: ModelSpec, device: str, runner: Any) -> str:
    """Why ONNX Runtime cannot serve this model here ("" if it can try)."""
    if device != "cpu":
        return f"it runs on {device}, where torch serves it (this worker carries ONNX Runtime's CPU build)"
    if head_of(runner) is None:
        return f"task {spec.task} has no ONNX runner (embeddings, rerank and text classification have)"
    dtype = str(getattr(getattr(runner, "_model", None), "dtype", "")).removeprefix("torch.")
    if dtype != "float32":
        return f"its weights are {dtype or 'of no known dtype'}; the ONNX export runs float32"
    try:
        import onnxruntime  # noqa: F401
    except ImportError:
        return "onnxruntime is not installed (pip install 'zbatch[onnx]')"
    return ""


def check_settings(spec: ModelSpec) -> None:
    """Refuse a runtime or quantization that does not exist, or int8 asked of torch."""
    if spec.runtime not in RUNTIMES:
        raise ValueError(f"model {spec.name!r}: unknown runtime {spec.runtime!r}; use {', '.join(RUNTIMES)}")
    if spec.quantize not in QUANTIZE:
        raise ValueError(f"model {spec.name!r}: unknown quantize {spec.quantize!r}; use {', '.join(QUANTIZE)}")
    if spec.quantize != "none" and spec.runtime == "torch":
        raise ValueError(f"model {spec.name!r}: quantize {spec.quantize} is ONNX Runtime's; use runtime auto or "
                         "onnx, or quantize none")


def choose(spec: ModelSpec, device: str, runner: Any) -> Any:
    """``runner``, its model run by ONNX Runtime where ``spec.runtime`` asks for it and it validates."""
    if spec.runtime == "torch":
        return runner
    why_not = unsupported(spec, device, runner)
    refused = False
    if not why_not:
        try:
            return with_onnx(runner, spec)
        except ExportRefused as exc:
            why_not, refused = str(exc), True
    if spec.runtime == "onnx":
        raise ValueError(f"model {spec.name!r}: runtime onnx cannot serve it: {why_not}")
    log.log(logging.WARNING if refused else logging.INFO, "model %s runs on torch: %s", spec.name, why_not)
    return runner


def with_onnx(runner: TextRunner, spec: ModelSpec) -> TextRunner:
    """Export, validate and swap the runner's model for its ONNX Runtime graph (ExportRefused: why not)."""
    import onnxruntime
    import torch

    from worker.runners import onnx_export
    from worker.runners.onnx_session import OrtModel

    head = head_of(runner)
    assert head is not None
    model = runner._model
    try:
        entry = onnx_export.exported(model, spec.path, head, list(runner._tokenizer.model_input_names),
                                     spec.onnx_cache)
    except Exception as exc:
        raise ExportRefused(f"its ONNX export failed ({type(exc).__name__}: {_first_line(exc)})") from exc
    full = torch.get_num_threads()
    samples = _samples(runner)
    chosen: tuple[OrtModel, Validated] | None = None
    failed = []
    for graph in entry.graphs:
        try:
            candidate = OrtModel(entry.path(graph), entry.inputs, head, model.config, full)
            agreement = agreement_with(runner, model, candidate, samples)
        except Exception as exc:  # a graph that fails on inputs unlike the traced example's, say
            failed.append(f"{graph} fails: {type(exc).__name__}: {_first_line(exc)}")
            continue
        if agreement >= MIN_COSINE:
            chosen = candidate, Validated(graph, agreement)
            break
        failed.append(f"{graph} at cosine {agreement:.6f}")
    if chosen is None:
        raise ExportRefused(f"its ONNX export does not validate against torch ({'; '.join(failed)}; it must reach "
                            f"cosine {MIN_COSINE} on padded and unpadded inputs)")
    ort_model, validated = chosen
    if spec.quantize == "int8":
        ort_model, validated = _int8(runner, spec, entry, ort_model, validated, samples)
    runner._model = ort_model
    runner._packer = None  # packing is torch's; length groups serve ORT
    runner.runtime = f"onnxruntime {onnxruntime.__version__}"  # type: ignore[attr-defined]
    log.info("model %s runs on ONNX Runtime %s (%s, cosine %.7f to torch on %d inputs padded and alone; %d "
             "session(s) for %s thread(s); cache %s)", spec.name, onnxruntime.__version__, validated.graph,
             validated.agreement, len(samples), len(ort_model.counts), "/".join(map(str, ort_model.counts)),
             entry.folder)
    return runner


def _int8(runner: TextRunner, spec: ModelSpec, entry: Any, ort_model: Any, validated: Validated,
          samples: list[Any]) -> tuple[Any, Validated]:
    from worker.runners import onnx_export
    from worker.runners.onnx_session import OrtModel

    head = ort_model.head
    try:
        int8 = onnx_export.quantized(entry, spec.path, head, spec.onnx_cache)
    except Exception as exc:
        log.warning("model %s: int8 quantization failed (%s: %s); float32 ONNX Runtime serves it", spec.name,
                    type(exc).__name__, _first_line(exc))
        return ort_model, validated
    try:
        candidate = OrtModel(int8.path(int8.graphs[0]), int8.inputs, head, ort_model.config, ort_model.counts[-1])
        agreement = agreement_with(runner, runner._model, candidate, samples)
    except Exception as exc:
        log.warning("model %s: its int8 graph fails (%s: %s); float32 ONNX Runtime serves it", spec.name,
                    type(exc).__name__, _first_line(exc))
        return ort_model, validated
    if agreement < INT8_MIN_COSINE:
        log.warning("model %s: its int8 graph agrees with torch at cosine %.5f only, under the %.2f bar; float32 "
                    "ONNX Runtime serves it", spec.name, agreement, INT8_MIN_COSINE)
        return ort_model, validated
    return candidate, Validated(f"int8 from {validated.graph}", agreement)


def _samples(runner: TextRunner) -> list[Any]:
    """The validation inputs for the runner's task: texts, pairs, one longer than the model takes."""
    texts = [*SAMPLES, " ".join(["words"] * (2 * runner.max_length))]
    if runner.kind is InputKind.PAIR:
        return [[texts[1], text] for text in texts]
    if runner.kind is InputKind.TEXT_OR_PAIR:
        return [*texts, [texts[1], texts[2]]]
    return texts


def agreement_with(runner: TextRunner, reference: Any, candidate: Any, samples: list[Any]) -> float:
    """The lowest agreement (cosine) between ``reference``'s and ``candidate``'s outputs over ``samples``,
    run as one padded batch and each alone."""
    import torch

    encodings = runner.encode(samples, {})
    batches = [encodings, *([each] for each in encodings)]
    lowest = 1.0
    for batch in batches:
        arrays = runner._pad(batch)  # type: ignore[arg-type]  # encode refuses nothing: every sample truncates
        tensors = {name: torch.from_numpy(array) for name, array in arrays.items()}
        with torch.inference_mode():
            expected = _rows(runner, reference(**tensors)[0], tensors["attention_mask"])
            got = _rows(runner, candidate(**tensors)[0], tensors["attention_mask"])
        lowest = min(lowest, *(_agreement(a, b) for a, b in zip(expected, got, strict=True)))
    return lowest


def _rows(runner: TextRunner, output: Any, mask: Any) -> list[np.ndarray]:
    """One vector per input: hidden states pooled as the embeddings model declares, or the row of logits."""
    if output.ndim == 3:
        assert isinstance(runner, EmbeddingRunner)
        output = runner.head(output, mask)
    return list(output.float().numpy().astype(np.float64))


def _agreement(expected: np.ndarray, got: np.ndarray) -> float:
    """Cosine similarity; for one number, 1 minus its error relative to its size (at least 1)."""
    if not np.all(np.isfinite(got)):
        return 0.0
    if expected.size == 1:
        return 1.0 - float(abs(expected.item() - got.item())) / max(1.0, abs(float(expected.item())))
    norms = float(np.linalg.norm(expected) * np.linalg.norm(got))
    return float(expected @ got) / norms if norms and math.isfinite(norms) else 0.0


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else ""
