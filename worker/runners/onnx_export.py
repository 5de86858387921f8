"""A transformer model exported to ONNX once, and kept in a cache that workers starting together share.

Theory of operation
-------------------
:func:`exported` returns the folder of a model's ONNX graphs, exporting it
first if no worker has done so yet:

* The **cache key** covers what the graph depends on: the model's digest (its
  ``config.json`` and weight files), the head it runs (the bare encoder or the
  sequence classifier), the torch, transformers and onnxruntime versions, and
  :data:`FORMAT` (how this module exports).  A key names one folder under the
  cache (``--onnx-cache``; by default ``$XDG_CACHE_HOME/zbatch/onnx``).
* **Export** is ``torch.onnx.export`` (its TorchScript tracer) of the model
  with eager attention, batch and sequence axes dynamic.  Position ids are an
  input of the graph where the model numbers positions 0, 1, 2, ... (BERT's
  convention, checked on the model at export), so the trace cannot bake the
  example's length into a slice of the position table; models that number
  them from the input ids (RoBERTa's padding offset) compute them in the graph.
  Then onnxruntime's transformer optimizer fuses attention, layer norms and
  GELU where it recognises them (``fused.onnx``; ``plain.onnx`` is kept too,
  and :mod:`worker.runners.runtime` validates the fused graph first).
  A BERT encoder also gets ``packed.onnx``: the same model over one row of
  a batch's inputs concatenated, positions restarting at each input and an
  attention bias (0 within an input, the float minimum across inputs) as its
  mask, so no padding token is ever computed (:mod:`worker.runners.packing`
  says why that pays on a CPU; its attention is one dense call over the row,
  so :mod:`worker.runners.onnx_session` caps a packed group's tokens).
  ``--quantize int8`` adds ``int8.onnx``: ORT's dynamic quantization of the
  fused graph's weights, its own cache entry.
* **Atomic, and once**: a worker takes an exclusive lock on ``KEY.lock``,
  looks again, exports into a temporary folder beside the entry and renames
  it into place, so a worker that starts meanwhile waits on the lock and then
  finds the finished folder, and a crash leaves at most a temporary folder
  (cleared by the next export of that key), never a half-written entry.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from worker.runners.start_cache import locked

log = logging.getLogger("zbatch.worker")

FORMAT = 2  # bump when what an export writes changes, so old entries are not reused
CACHE_ENV = "ZBATCH_ONNX_CACHE"
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")
PLAIN, FUSED, INT8, PACKED = "plain.onnx", "fused.onnx", "int8.onnx", "packed.onnx"
ATTENTION_BIAS = "attention_bias"  # the packed graph's mask: 0 within an input, the float minimum across inputs
META = "meta.json"
OUTPUT = "output"
OPSET = 17


@dataclass(frozen=True, slots=True)
class Exported:
    """A cache entry: its folder, the graph inputs in order, and the graphs it holds (best first)."""

    folder: Path
    inputs: tuple[str, ...]
    graphs: tuple[str, ...]
    packed: tuple[str, ...] = ()  # the packed graph's inputs in order, where the entry has one (PACKED)

    def path(self, graph: str) -> Path:
        return self.folder / graph


def cache_dir(setting: str = "") -> Path:
    """The cache folder: ``setting``, else ``$ZBATCH_ONNX_CACHE``, else ``zbatch/onnx`` in the user's cache."""
    chosen = setting or os.environ.get(CACHE_ENV, "")
    if chosen:
        return Path(chosen).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "zbatch" / "onnx"


def model_digest(path: str) -> str:
    """SHA-256 over the model folder's ``config.json`` and weight files (names and bytes).

    Worked out once per process for files as they are: a start asks for it several times (the export's key,
    the verdict's, the calibration's), and a file that changes gets new sizes or times, so it is read again.
    """
    folder = Path(path)
    files = sorted(p for p in folder.iterdir() if p.is_file()
                   and (p.name == "config.json" or p.suffix in WEIGHT_SUFFIXES))
    return _digest(folder, files)


def other_files_digest(path: str) -> str:
    """SHA-256 over every other file under the model folder (the tokenizer's, sentence-transformers' modules,
    subfolders' weights): what :func:`model_digest` leaves out, for keys that depend on the whole folder."""
    folder = Path(path)
    covered = {p for p in folder.iterdir() if p.is_file()
                  and (p.name == "config.json" or p.suffix in WEIGHT_SUFFIXES)}
    files = sorted(p for p in folder.rglob("*") if p.is_file() and p not in covered
                   and not any(part.startswith(".") for part in p.relative_to(folder).parts))
    return _digest(folder, files)


_digests: dict[tuple[Any, ...], str] = {}  # this process's digests, by the files' names, sizes and times


def _digest(folder: Path, files: list[Path]) -> str:
    stats = tuple((str(file.relative_to(folder)), *_identity(file)) for file in files)
    known = _digests.get((str(folder), stats))
    if known is not None:
        return known
    digest = hashlib.sha256()
    for file in files:
        digest.update(str(file.relative_to(folder)).encode() + b"\0")
        with file.open("rb") as stream:
            while chunk := stream.read(1 << 20):
                digest.update(chunk)
    _digests[(str(folder), stats)] = found = digest.hexdigest()
    return found


def _identity(file: Path) -> tuple[int, ...]:
    """What changes when a file is written or replaced: its inode, size, modification and change times."""
    stat = file.stat()
    return stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns


def versions() -> dict[str, str]:
    import onnxruntime
    import torch
    import transformers

    return {"torch": torch.__version__, "transformers": transformers.__version__,
            "onnxruntime": onnxruntime.__version__}


def cache_key(model_path: str, head: str, variant: str = "") -> str:
    """The entry's folder name: the model folder's name, then a hash of everything the graph depends on."""
    parts = {"model": model_digest(model_path), "head": head, "format": FORMAT, "variant": variant, **versions()}
    hashed = hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:20]
    name = "".join(c if c.isalnum() or c in "-_." else "_" for c in Path(model_path).name)[:40]
    return f"{name}-{variant + '-' if variant else ''}{hashed}"


def existing(model_path: str, head: str, cache: str = "", variant: str = "") -> Exported | None:
    """The cache entry of the model's graphs if a whole one is there (no export, no model needed), else None."""
    return _read_entry(cache_dir(cache) / cache_key(model_path, head, variant))


def exported(model: Any, model_path: str, head: str, input_names: list[str], cache: str = "") -> Exported:
    """The cache entry of ``model`` (a transformers model in eval mode, on the CPU): exported now if missing.

    ``head`` says which output the graph returns (``last_hidden_state`` or ``logits``); ``input_names`` are
    the tokenizer's (``input_ids``, ``attention_mask``, ``token_type_ids`` where the model takes them).
    """
    key = cache_key(model_path, head)
    return _entry(cache_dir(cache), key, lambda folder: _export(model, head, input_names, folder))


def quantized(source: Exported, model_path: str, head: str, cache: str = "") -> Exported:
    """The int8 entry made from ``source``'s best graph by ORT's dynamic quantization (made now if missing)."""
    key = cache_key(model_path, head, "int8")

    def make(folder: Path) -> dict[str, Any]:
        from onnx import TensorProto
        from onnxruntime.quantization import QuantType, quantize_dynamic

        with _quiet():  # the fused graph's own operators have no shape inference: say their outputs are float
            # MatMul weights, a scale per output channel: on all-MiniLM-L6-v2 quantizing the fused attention
            # too, or one scale per tensor, cost agreement with torch (0.980 and 0.845 against 0.984), and the
            # quantized embedding layer takes no position ids
            quantize_dynamic(source.path(source.graphs[0]), folder / INT8, weight_type=QuantType.QInt8,
                             op_types_to_quantize=["MatMul"], per_channel=True,
                             extra_options={"DefaultTensorType": TensorProto.FLOAT})
        return {"inputs": list(source.inputs), "graphs": [INT8]}

    return _entry(cache_dir(cache), key, make)


def _entry(cache: Path, key: str, make: Any) -> Exported:
    """The entry ``key`` under ``cache``; ``make(folder)`` writes a missing one and returns its meta."""
    final = cache / key
    entry = _read_entry(final)
    if entry is None:
        cache.mkdir(parents=True, exist_ok=True)
        with locked(cache / f"{key}.lock"):
            entry = _read_entry(final)  # another worker may have made it while this one waited
            if entry is None:
                if final.exists():
                    log.info("start cache: %s lacks a readable %s or a graph; exporting it again", final, META)
                _make(cache, key, make)
                entry = _read_entry(final)
    if entry is None:
        raise RuntimeError(f"the export into {final} left no readable {META}")
    return entry


def _read_entry(folder: Path) -> Exported | None:
    """The entry in ``folder`` if its meta parses and names graphs that are there."""
    try:
        meta = json.loads((folder / META).read_text())
        entry = Exported(folder, tuple(meta["inputs"]), tuple(meta["graphs"]), tuple(meta.get("packed", ())))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    files = [*entry.graphs, *([PACKED] if entry.packed else [])]
    return entry if entry.graphs and all(entry.path(graph).is_file() for graph in files) else None


def _make(cache: Path, key: str, make: Any) -> None:
    started = time.perf_counter()
    for stale in cache.glob(f"{key}.tmp-*"):  # a crashed export's leftovers (we hold the key's lock)
        shutil.rmtree(stale, ignore_errors=True)
    folder = Path(tempfile.mkdtemp(prefix=f"{key}.tmp-", dir=cache))
    try:
        meta = make(folder) | {"versions": versions(), "format": FORMAT}
        (folder / META).write_text(json.dumps(meta, indent=1) + "\n")
        shutil.rmtree(cache / key, ignore_errors=True)  # an entry without meta: unfinished, from before
        os.rename(folder, cache / key)
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    log.info("exported %s in %.1f s", cache / key, time.perf_counter() - started)


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """The exporter's and optimizer's warnings and chatter stay out of the worker's log."""
    loggers = [logging.getLogger(name) for name in ("onnxruntime", "onnxruntime.transformers", "root")]
    levels = [each.level for each in loggers]
    for each in loggers:
        each.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        for each, level in zip(loggers, levels, strict=True):
            each.setLevel(level)


def numbers_positions_from_zero(model: Any, input_names: list[str]) -> bool:
    """Whether the model, given no position ids, numbers each row's positions 0, 1, 2, ... (BERT does;
    RoBERTa counts from its padding index), tried on a padded batch with and without explicit ones."""
    import inspect

    import torch

    if "position_ids" not in inspect.signature(model.forward).parameters:
        return False
    example = _example(model, input_names)
    positions = torch.arange(example["input_ids"].shape[1]).expand_as(example["input_ids"])
    with torch.inference_mode():
        implicit = model(**example)[0]
        explicit = model(**example, position_ids=positions)[0]
    return bool(torch.equal(implicit, explicit))


def _example(model: Any, input_names: list[str]) -> dict[str, Any]:
    """Two rows of different lengths (7 and 5 tokens), right-padded: the trace's example input."""
    import torch

    vocab = int(model.config.vocab_size)
    ids = torch.tensor([[min(5 + i, vocab - 1) for i in range(7)]] * 2)
    mask = torch.ones_like(ids)
    mask[1, 5:] = 0
    example = {"input_ids": ids, "attention_mask": mask}
    if "token_type_ids" in input_names:
        example["token_type_ids"] = torch.zeros_like(ids)
    return example


def _traced(model: Any, head: str, inputs: list[str]) -> Any:
    """What the export traces: the model over its inputs as positional tensors, returning one output tensor."""
    import torch

    class Graph(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, *tensors: torch.Tensor) -> torch.Tensor:
            output: torch.Tensor = getattr(self.model(**dict(zip(inputs, tensors, strict=True))), head)
            return output

    return Graph().eval()  # a new module trains: the exporter would leave the model training on its way out


def _export(model: Any, head: str, input_names: list[str], folder: Path) -> dict[str, Any]:
    """Write ``plain.onnx`` (and ``fused.onnx`` where the optimizer fuses anything); return the entry's meta."""
    import torch

    previous = getattr(model.config, "_attn_implementation", None)
    model.set_attn_implementation("eager")  # the attention pattern ORT's optimizer fuses
    try:
        names: list[str] = [name for name in ("input_ids", "attention_mask", "token_type_ids") if name in input_names]
        if numbers_positions_from_zero(model, names):
            names.append("position_ids")
        example = _example(model, names)
        if "position_ids" in names:
            example["position_ids"] = torch.arange(7).expand(2, 7)
        axes: dict[str, dict[int, str]] = {name: {0: "batch", 1: "sequence"} for name in names}
        with _quiet(), torch.inference_mode():
            torch.onnx.export(_traced(model, head, names), tuple(example[name] for name in names), folder / PLAIN,
                              dynamo=False, input_names=names, output_names=[OUTPUT], opset_version=OPSET,
                              dynamic_axes={**axes, OUTPUT: {0: "batch"}})
    finally:
        model.eval()
        if previous:
            model.set_attn_implementation(previous)
    graphs = [PLAIN]
    if _fuse(model.config, folder / PLAIN, folder / FUSED):
        graphs.insert(0, FUSED)
    packed = _export_packed(model, head, names, folder / PACKED)
    return {"inputs": names, "graphs": graphs, "head": head, **({"packed": packed} if packed else {})}


def _export_packed(model: Any, head: str, names: list[str], target: Path) -> list[str]:
    """Write the packed graph of a BERT encoder (:mod:`worker.runners.packing`'s pass, in ONNX): one row of a
    batch's inputs concatenated, positions restarting at each, and an additive attention bias that keeps each
    input's attention within its own tokens.  Returns its inputs in order, or [] where the model has no such
    pass or the export fails (padded graphs serve)."""
    import torch

    from worker.runners.packing import packer_for, restarting_positions

    if head != "last_hidden_state" or "position_ids" not in names or packer_for(model, "cpu") is None:
        return []
    inputs = [*(name for name in names if name != "attention_mask"), ATTENTION_BIAS]
    lengths = [7, 5]
    example = {"input_ids": torch.tensor([[min(5 + i, int(model.config.vocab_size) - 1) for i in range(12)]]),
               "token_type_ids": torch.zeros(1, 12, dtype=torch.long),
               "position_ids": torch.from_numpy(restarting_positions(lengths))[None],
               ATTENTION_BIAS: torch.from_numpy(attention_bias(lengths))}
    mapped = {ATTENTION_BIAS: "attention_mask"}  # a 4-D float mask is added to the scores as it is
    axes = {name: {1: "tokens"} for name in inputs if name != ATTENTION_BIAS}
    try:
        with _quiet(), torch.inference_mode():
            torch.onnx.export(_traced(model, head, [mapped.get(name, name) for name in inputs]),
                              tuple(example[name] for name in inputs), target, dynamo=False, input_names=inputs,
                              output_names=[OUTPUT], opset_version=OPSET,
                              dynamic_axes={**axes, ATTENTION_BIAS: {2: "tokens", 3: "tokens"}, OUTPUT: {1: "tokens"}})
    except Exception as exc:  # best-effort, as the fused graph is
        log.info("the packed graph could not be exported (%s: %s); padded graphs serve", type(exc).__name__, exc)
        target.unlink(missing_ok=True)
        return []
    return inputs


def attention_bias(lengths: Sequence[int]) -> np.ndarray:
    """The packed graph's attention bias for inputs of ``lengths``: ``(1, 1, tokens, tokens)`` float32."""
    inputs = np.repeat(np.arange(len(lengths)), lengths)
    same = inputs[:, None] == inputs[None, :]
    return np.where(same, 0.0, np.finfo(np.float32).min).astype(np.float32)[None, None]


def _fuse(config: Any, source: Path, target: Path) -> bool:
    """onnxruntime's transformer optimizer over an encoder's graph; False if it fused nothing or failed."""
    if getattr(config, "is_decoder", False) or getattr(config, "is_encoder_decoder", False):
        return False
    try:
        from onnxruntime.transformers.optimizer import optimize_model

        with _quiet():
            optimized = optimize_model(str(source), model_type="bert", opt_level=0,
                                       num_heads=int(getattr(config, "num_attention_heads", 0) or 0),
                                       hidden_size=int(getattr(config, "hidden_size", 0) or 0))
            fused = optimized.get_fused_operator_statistics()
            if not any(fused.get(op) for op in ("Attention", "MultiHeadAttention", "SkipLayerNormalization")):
                return False
            optimized.save_model_to_file(str(target))
    except Exception as exc:  # the optimizer is best-effort: the plain graph still serves
        log.info("onnxruntime's optimizer could not fuse this graph (%s: %s); the plain export serves",
                 type(exc).__name__, exc)
        return False
    return True
