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
it falls short.  Where the runner packs (embeddings on a CPU) and the export
holds a packed graph, that graph is validated the same way, all samples in
one packed row and each alone, and serves the runner's packed groups
(:class:`~worker.runners.onnx_session.OrtPacker`) only if it holds too.

The outcome is the model's *verdict*, kept in the start cache
(:mod:`worker.runners.verdicts`).  :func:`load` looks for it before anything
loads: a kept verdict serves its graph at once, with no torch model loaded,
no export and no validation, and a kept refusal loads torch without trying
again.  Only a start that finds none exports and validates.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from worker.runners import onnx_export, phases, start_cache, verdicts
from worker.runners.classify import SequenceClassifier
from worker.runners.embeddings import EmbeddingRunner
from worker.runners.spec import QUANTIZE, RUNTIMES, InputKind, ModelSpec
from worker.runners.text import TextRunner, dtype_name

log = logging.getLogger("zbatch.worker")

MIN_COSINE = 0.99999  # float32 ONNX Runtime against torch
INT8_MIN_COSINE = 0.98  # int8 weights against float32 torch: close, not equal (all-MiniLM-L6-v2: 0.984 at worst)
SAMPLES = (
    "Hi.",
    "The quick brown fox jumps over the lazy dog by the river.",
    "A broker hands each worker a batch of requests, and the worker answers every one of them before its "
    "deadline, or says why it could not.",
)
VALIDATION = {"samples": SAMPLES, "min_cosine": MIN_COSINE, "int8_min_cosine": INT8_MIN_COSINE}  # a verdict's key


class ExportRefused(Exception):
    """The model's ONNX export failed or did not validate; the message says why.  ``lasting``: the same model
    would fail the same way at the next start (not an I/O error), so the verdict may be kept."""

    def __init__(self, message: str, lasting: bool = True) -> None:
        super().__init__(message)
        self.lasting = lasting


def head_of(runner: Any) -> str | None:
    """The model output a runner (or runner class) reads, if ONNX Runtime can stand in for its model."""
    kind = runner if isinstance(runner, type) else type(runner)
    if issubclass(kind, EmbeddingRunner):
        return "last_hidden_state"
    if issubclass(kind, SequenceClassifier):
        return "logits"
    return None


def unsupported(spec: ModelSpec, device: str, runner_class: type, dtype: Any) -> str:
    """Why ONNX Runtime cannot serve this model here ("" if it can try), known before the model loads."""
    if device != "cpu":
        return f"it runs on {device}, where torch serves it (this worker carries ONNX Runtime's CPU build)"
    if head_of(runner_class) is None:
        return f"task {spec.task} has no ONNX runner (embeddings, rerank and text classification have)"
    if dtype_name(dtype) != "float32":
        return f"its weights are {dtype_name(dtype)}; the ONNX export runs float32"
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


def load(spec: ModelSpec, device: str, dtype: Any, runner_class: type) -> Any:
    """The runner of ``spec``, its model run by ONNX Runtime where ``spec.runtime`` asks for it and the model's
    verdict allows it (kept from an earlier start, or worked out now: :mod:`worker.runners.verdicts`)."""
    why_not = "" if spec.runtime == "torch" else unsupported(spec, device, runner_class, dtype)
    if spec.runtime == "torch" or why_not:
        if why_not:
            _on_torch(spec, why_not, refused=False)
        return runner_class(spec, device, dtype)
    head = head_of(runner_class)
    assert head is not None
    with phases.phase("verdict"):
        key = verdicts.key_for(spec, runner_class, head, device, dtype_name(dtype), VALIDATION)
    with start_cache.once(key, verdicts.usable(key.cache)) as record:
        if record is None:  # this worker decides, holding the verdict's lock
            return _decide(spec, device, dtype, runner_class, key)
        verdict = verdicts.from_record(record, key.cache)
    if verdict.graph is None:
        _on_torch(spec, f"{verdict.reason} (as decided at an earlier start: {key.path})", refused=True)
        phases.note("verdict", f"from the cache, {key.path.name}")
        return runner_class(spec, device, dtype)
    ort_model = _kept_graph(verdict, head, spec, key)
    if ort_model is None:
        with start_cache.holding(key):
            return _decide(spec, device, dtype, runner_class, key)
    phases.note("verdict", f"from the cache, {key.path.name}")
    if runner_class in (EmbeddingRunner, SequenceClassifier):
        runner = runner_class(spec, device, dtype, model=ort_model)  # no torch model loads at all
    else:  # a runner of the user's own, built as any runner is: its torch model loads, then steps aside
        runner = runner_class(spec, device, dtype)
    return _serving(runner, ort_model, spec, verdict, f"as validated at an earlier start: {key.path}")


def _decide(spec: ModelSpec, device: str, dtype: Any, runner_class: type, key: start_cache.RecordKey) -> Any:
    """Load the torch model, export and validate it now, keep the verdict, and return the runner it gives."""
    runner = runner_class(spec, device, dtype)
    try:
        verdict, ort_model = with_onnx(runner, spec)
    except ExportRefused as exc:
        if exc.lasting:
            start_cache.write(key, verdicts.to_record(verdicts.Verdict.torch(str(exc)), key.cache))
        _on_torch(spec, str(exc), refused=True)
        return runner
    start_cache.write(key, verdicts.to_record(verdict, key.cache))
    return _serving(runner, ort_model, spec, verdict, "validated now against torch")


def _kept_graph(verdict: verdicts.Verdict, head: str, spec: ModelSpec, key: start_cache.RecordKey) -> Any:
    """The graph a kept verdict names, in ONNX Runtime's sessions; None, with one log line, if it does not load
    after all (a file damaged in place)."""
    with phases.phase("sessions"):
        import torch
        from transformers import AutoConfig

        from worker.runners.onnx_session import OrtModel

        assert verdict.graph is not None
        config = AutoConfig.from_pretrained(spec.path, **spec.pretrained)
        try:
            return OrtModel(verdict.graph, verdict.inputs, head, config, torch.get_num_threads())
        except Exception as exc:  # ONNX Runtime's own errors
            log.info("start cache: %s names a graph that does not load (%s: %s); working it out again", key.path,
                     type(exc).__name__, _first_line(exc))
            return None


def _serving(runner: Any, ort_model: Any, spec: ModelSpec, verdict: verdicts.Verdict, how: str) -> Any:
    """``runner`` with ``ort_model`` in place of its model, said in one log line (and the verdict's warnings)."""
    import onnxruntime

    for warning in verdict.warnings:
        log.warning("model %s: %s", spec.name, warning)
    runner._model = ort_model
    runner._packer = (ort_model.packer(verdict.packed, verdict.packed_inputs)
                      if verdict.packed is not None and _packs(runner) else None)  # else length groups serve ORT
    runner.runtime = f"onnxruntime {onnxruntime.__version__}"
    log.info("model %s runs on ONNX Runtime %s (%s, cosine %.7f to torch on %d inputs padded and alone, %s; %d "
             "session(s) for %s thread(s); graph %s%s)", spec.name, onnxruntime.__version__, verdict.label,
             verdict.agreement, verdict.samples, how, len(ort_model.counts), "/".join(map(str, ort_model.counts)),
             verdict.graph, f"; packed passes of up to {runner._packer.max_tokens} tokens: {verdict.packed}"
             if runner._packer is not None else "")
    return runner


def _on_torch(spec: ModelSpec, why_not: str, refused: bool) -> None:
    """Say why torch serves the model; refuse to start where ``spec.runtime`` asks for ONNX Runtime alone."""
    if spec.runtime == "onnx":
        raise ValueError(f"model {spec.name!r}: runtime onnx cannot serve it: {why_not}")
    log.log(logging.WARNING if refused else logging.INFO, "model %s runs on torch: %s", spec.name, why_not)


def with_onnx(runner: TextRunner, spec: ModelSpec) -> tuple[verdicts.Verdict, Any]:
    """Export and validate the runner's model: the verdict and the ONNX Runtime model it names (ExportRefused:
    why none holds).  The runner is left as it was."""
    import torch

    from worker.runners.onnx_session import OrtModel

    head = head_of(runner)
    assert head is not None
    model = runner._model
    try:
        with phases.phase("export"):
            entry = onnx_export.exported(model, spec.path, head, list(runner._tokenizer.model_input_names),
                                         spec.onnx_cache)
    except Exception as exc:
        raise ExportRefused(f"its ONNX export failed ({type(exc).__name__}: {_first_line(exc)})",
                            lasting=not isinstance(exc, OSError | MemoryError)) from exc
    full = torch.get_num_threads()
    samples = _samples(runner)
    failed = []
    for graph in entry.graphs:
        try:
            with phases.phase("sessions"):
                candidate = OrtModel(entry.path(graph), entry.inputs, head, model.config, full)
            with phases.phase("validation"):
                agreement = agreement_with(runner, model, candidate, samples)
        except Exception as exc:  # a graph that fails on inputs unlike the traced example's, say
            failed.append(f"{graph} fails: {type(exc).__name__}: {_first_line(exc)}")
            continue
        if agreement >= MIN_COSINE:
            verdict = verdicts.Verdict(entry.path(graph), entry.inputs, graph, agreement, len(samples))
            if spec.quantize == "int8":
                return _int8(runner, spec, entry, candidate, verdict, samples)
            return _with_packed(runner, entry, candidate, verdict, samples), candidate
        failed.append(f"{graph} at cosine {agreement:.6f}")
    raise ExportRefused(f"its ONNX export does not validate against torch ({'; '.join(failed)}; it must reach "
                        f"cosine {MIN_COSINE} on padded and unpadded inputs)")


def _with_packed(runner: TextRunner, entry: Any, ort_model: Any, verdict: verdicts.Verdict,
                 samples: list[Any]) -> verdicts.Verdict:
    """``verdict`` with the entry's packed graph where the runner packs and the graph agrees with torch as the
    padded one must; else as it was, with one log line why not."""
    if not entry.packed or not _packs(runner):
        return verdict
    path = entry.path(onnx_export.PACKED)
    try:
        with phases.phase("validation"):
            agreement = packed_agreement(runner, runner._model, ort_model.packer(path, entry.packed), samples)
    except Exception as exc:
        log.info("the packed graph fails (%s: %s); padded graphs serve", type(exc).__name__, _first_line(exc))
        return verdict
    if agreement < MIN_COSINE:
        log.info("the packed graph agrees with torch at cosine %.6f only; padded graphs serve", agreement)
        return verdict
    return dataclasses.replace(verdict, packed=path, packed_inputs=entry.packed)


def _packs(runner: TextRunner) -> bool:
    """Whether the runner has a packed pass to run (embeddings do; a classifier's head needs padded rows)."""
    return type(runner)._forward_packed is not TextRunner._forward_packed


def packed_agreement(runner: TextRunner, reference: Any, packer: Any, samples: list[Any]) -> float:
    """The lowest agreement (cosine) between ``reference``'s padded rows and ``packer``'s packed ones over
    ``samples``, pooled as the runner pools them, all in one packed group and each alone."""
    import torch

    from worker.runners.pooling import repadded

    def rows(batch: list[Any], tensors: dict[str, Any]) -> list[np.ndarray]:
        lengths = [each.length for each in batch]
        ids = torch.from_numpy(np.concatenate([each.rows["input_ids"] for each in batch]))
        hidden, mask = repadded(packer(ids, None, lengths), lengths)
        return _rows(runner, hidden, mask)

    return _lowest_agreement(runner, reference, samples, rows)


def _int8(runner: TextRunner, spec: ModelSpec, entry: Any, ort_model: Any, validated: verdicts.Verdict,
          samples: list[Any]) -> tuple[verdicts.Verdict, Any]:
    """The int8 graph and its verdict where it holds at its bar; else the float32 ones, with a warning why not."""
    from worker.runners.onnx_session import OrtModel

    head = ort_model.head
    try:
        with phases.phase("export"):
            int8 = onnx_export.quantized(entry, spec.path, head, spec.onnx_cache)
        candidate = OrtModel(int8.path(int8.graphs[0]), int8.inputs, head, ort_model.config, ort_model.counts[-1])
        with phases.phase("validation"):
            agreement = agreement_with(runner, runner._model, candidate, samples)
    except Exception as exc:
        if isinstance(exc, OSError | MemoryError):  # may not happen again: no verdict is kept
            raise ExportRefused(f"its int8 graph could not be made ({type(exc).__name__}: {_first_line(exc)})",
                                lasting=False) from exc
        warning = (f"int8 quantization failed ({type(exc).__name__}: {_first_line(exc)}); float32 ONNX Runtime "
                   "serves it")
        return dataclasses.replace(validated, warnings=(warning,)), ort_model
    if agreement < INT8_MIN_COSINE:
        warning = (f"its int8 graph agrees with torch at cosine {agreement:.5f} only, under the {INT8_MIN_COSINE:.2f} "
                   "bar; float32 ONNX Runtime serves it")
        return dataclasses.replace(validated, warnings=(warning,)), ort_model
    return dataclasses.replace(validated, graph=int8.path(int8.graphs[0]), inputs=int8.inputs,
                               label=f"int8 from {validated.label}", agreement=agreement), candidate


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
    def rows(batch: list[Any], tensors: dict[str, Any]) -> list[np.ndarray]:
        return _rows(runner, candidate(**tensors)[0], tensors["attention_mask"])

    return _lowest_agreement(runner, reference, samples, rows)


def _lowest_agreement(runner: TextRunner, reference: Any, samples: list[Any],
                      candidate_rows: Callable[[list[Any], dict[str, Any]], list[np.ndarray]]) -> float:
    """The lowest cosine between ``reference``'s padded rows and ``candidate_rows(batch, padded tensors)`` over
    ``samples``, all in one batch and each alone."""
    import torch

    encodings = runner.encode(samples, {})
    lowest = 1.0
    for batch in [encodings, *([each] for each in encodings)]:
        arrays = runner._pad(batch)  # type: ignore[arg-type]  # encode refuses nothing: every sample truncates
        tensors = {name: torch.from_numpy(array) for name, array in arrays.items()}
        with torch.inference_mode():
            expected = _rows(runner, reference(**tensors)[0], tensors["attention_mask"])
            got = candidate_rows(batch, tensors)
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
