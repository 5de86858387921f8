"""Whether ONNX Runtime may serve a model: decided by validation once per model, host and versions, then kept.

Theory of operation
-------------------
:mod:`worker.runners.runtime` validates a model's exported graphs against
torch before ONNX Runtime serves a vector from them.  The outcome, the
*verdict*, is a record of the start cache (:mod:`worker.runners.start_cache`,
``verdicts/`` in ``--onnx-cache``): the graph that held and how closely, or
why none did and torch serves.  The next start of the same model on the same
host reads it and serves the graph it names without loading the torch model,
exporting or validating; a model that did not validate loads on torch at
once, without trying again.

A verdict serves only where validation would come out the same, so its key
(:func:`key_for`) holds everything validation depends on:

* the model folder: its config and weights (as the graphs' own cache key
  does), and every other file under it (the tokenizer and its settings, which
  make the validation's inputs; sentence-transformers' modules, which pool
  the outputs it compares);
* the task's runner and the output it reads, the quantization asked for;
* the validation: its samples, its bars, and :data:`FORMAT`, bumped when
  validation or the sessions' settings change;
* the torch, transformers, tokenizers and ONNX Runtime versions, the device
  and dtype, and the CPU (its model and instruction-set flags: ONNX Runtime
  chooses its kernels by them).

The graph a verdict names is held to the size and modification time it had
when it was validated: a graph replaced since is validated again.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from worker.runners import onnx_export
from worker.runners.device import cpu_identity
from worker.runners.spec import ModelSpec
from worker.runners.start_cache import Record, RecordKey

FORMAT = 2  # bump when validation, or the sessions a validated graph runs in, change
KIND = "verdicts"
ONNX_RUNTIME, TORCH = "onnxruntime", "torch"


@dataclass(frozen=True, slots=True)
class Verdict:
    """ONNX Runtime's graph for a model and how closely it agreed with torch; or, with no graph, why torch serves."""

    graph: Path | None
    inputs: tuple[str, ...] = ()
    label: str = ""  # which graph, as the start's log line says it: "fused.onnx", "int8 from fused.onnx"
    agreement: float = 0.0  # the lowest cosine to torch over the samples
    samples: int = 0
    reason: str = ""  # with no graph: why ONNX Runtime does not serve the model
    warnings: tuple[str, ...] = ()  # said again at every start that uses the verdict (an int8 graph not kept, say)
    packed: Path | None = None  # the packed graph, where it validated too (worker.runners.onnx_session.OrtPacker)
    packed_inputs: tuple[str, ...] = ()

    @classmethod
    def torch(cls, reason: str) -> Verdict:
        return cls(None, reason=reason)


def key_for(spec: ModelSpec, runner_class: type, head: str, device: str, dtype: str,
            validation: Mapping[str, Any]) -> RecordKey:
    """The verdict's key: everything the validation of ``spec``'s model by ``validation`` depends on."""
    parts = {
        "format": FORMAT,
        "model": onnx_export.model_digest(spec.path),
        "other_files": onnx_export.other_files_digest(spec.path),
        "runner": f"{runner_class.__module__}.{runner_class.__qualname__}",
        "task": spec.task, "head": head, "quantize": spec.quantize, "pretrained": spec.pretrained,
        "device": device, "dtype": dtype,
        "validation": dict(validation),
        "versions": {**onnx_export.versions(), "tokenizers": _tokenizers_version()},
        "cpu": cpu_identity(),
    }
    return RecordKey(onnx_export.cache_dir(spec.onnx_cache), KIND, Path(spec.path).name, parts)


def to_record(verdict: Verdict, cache: Path) -> Record:
    if verdict.graph is None:
        return {"runtime": TORCH, "reason": verdict.reason}
    stat = verdict.graph.stat()
    return {"runtime": ONNX_RUNTIME, "graph": str(verdict.graph.relative_to(cache)),
            "graph_file": [stat.st_size, stat.st_mtime_ns], "inputs": list(verdict.inputs), "label": verdict.label,
            "agreement": verdict.agreement, "samples": verdict.samples, "warnings": list(verdict.warnings),
            **({"packed": str(verdict.packed.relative_to(cache)), "packed_inputs": list(verdict.packed_inputs)}
               if verdict.packed is not None else {})}


def from_record(record: Record, cache: Path) -> Verdict:
    if record["runtime"] == TORCH:
        return Verdict.torch(str(record["reason"]))
    packed = record.get("packed")
    return Verdict(cache / record["graph"], tuple(map(str, record["inputs"])), str(record["label"]),
                   float(record["agreement"]), int(record["samples"]), "", tuple(map(str, record["warnings"])),
                   cache / str(packed) if packed else None, tuple(map(str, record.get("packed_inputs", ()))))


def usable(cache: Path) -> Callable[[Record], str]:
    """Why a verdict record cannot serve ("" if it can): a runtime it does not know, a graph gone or replaced."""
    def check(record: Record) -> str:
        if record["runtime"] == TORCH:
            return ""
        if record["runtime"] != ONNX_RUNTIME:
            return f"names a runtime this worker does not know ({record['runtime']!r})"
        graph = cache / record["graph"]
        if not graph.is_file():
            return f"names a graph that is gone ({graph})"
        stat = graph.stat()
        if [stat.st_size, stat.st_mtime_ns] != list(record["graph_file"]):
            return f"names a graph that changed since it was validated ({graph})"
        if record.get("packed") and not (cache / str(record["packed"])).is_file():
            return f"names a packed graph that is gone ({cache / str(record['packed'])})"
        return ""

    return check


def _tokenizers_version() -> str:
    import tokenizers

    return str(tokenizers.__version__)
