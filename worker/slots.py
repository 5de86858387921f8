"""The models one worker serves: each with its own batching policy, pending work and counters.

A worker may serve several small models on one device.  They share the one
inference thread, so at most one batch runs at a time, and a batch never
mixes models: each model has its own :class:`~worker.assembler.Assembler`.
When the model thread is free, the slot whose batch is due and whose oldest
item has waited longest goes next.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable
from dataclasses import dataclass, field

from worker.assembler import Assembler
from worker.batching import BatchPolicy
from worker.config import WorkerConfig
from worker.runners import ModelDetails, ModelSpec, default_model_path
from worker.runners.graphs import GRAPH_SETTINGS
from worker.runners.runtime import check_settings
from zbatch.hub import public_name
from zbatch.protocol.wire import MAX_META_BYTES, BatchCounters, ModelInfo, Status, pack
from zbatch.runtime.histogram import SECONDS_BUCKETS, SIZE_BUCKETS, Histogram
from zbatch.runtime.settings import parse_entries

SPEC_KEYS = {"name", "model", "revision", "path", "task", "device", "dtype", "runtime", "quantize", "max_batch_size",
             "max_batch_delay_ms", "cuda_graphs", "default_prompt_name"}
LABELS_BUDGET_BYTES = MAX_META_BYTES // 2  # READY's labels, all models together; the rest of READY is small


@dataclass(slots=True)
class ModelSlot:
    spec: ModelSpec
    max_batch_size: int  # 0 (the device's default) until the model is loaded: :meth:`loaded`
    policy: BatchPolicy
    assembler: Assembler = field(default_factory=Assembler)
    batches: int = 0
    batched_items: int = 0
    batch_sizes: Histogram = field(default_factory=lambda: Histogram(SIZE_BUCKETS))  # for the metrics
    inference_times: Histogram = field(default_factory=lambda: Histogram(SECONDS_BUCKETS))
    details: ModelDetails = field(default_factory=ModelDetails)  # the loaded model's, for READY

    def loaded(self, details: ModelDetails, max_batch_size: int) -> None:
        """The model is loaded: what it says about itself, and its batch size on its device."""
        self.details = details
        self.max_batch_size = self.policy.max_batch_size = max_batch_size

    @property
    def info(self) -> ModelInfo:
        return ModelInfo(self.spec.name, self.spec.task, self.max_batch_size, **dataclasses.asdict(self.details))

    def counters(self) -> BatchCounters:
        """What the heartbeats report; ``busy_ms``, the batches' total time, gives the broker the service rate."""
        skipped = self.assembler.skipped_items
        return BatchCounters(self.batches, self.batched_items,
                             skipped[Status.CANCELLED], skipped[Status.DEADLINE_EXCEEDED],
                             int(self.inference_times.total * 1000))


def ready_infos(slots: Iterable[ModelSlot]) -> tuple[ModelInfo, ...]:
    """What READY says about each model; without labels if those of all models would crowd its meta frame."""
    infos = tuple(slot.info for slot in slots)
    if sum(len(pack(list(info.labels))) for info in infos) <= LABELS_BUDGET_BYTES:
        return infos
    return tuple(dataclasses.replace(info, labels=()) for info in infos)


def model_slots(config: WorkerConfig) -> dict[str, ModelSlot]:
    """The main model from the flags, then any ``--extra-models``; names must be unique.

    A spec's ``path`` is the model as set, a Hub id or a folder (``model_path`` and ``path=``: a folder),
    until :func:`worker.sources.fetch_models` makes it the local folder.
    """
    setting = config.model or (os.path.abspath(config.model_path) if config.model_path else "")
    main = {"name": config.model_name or public_name(setting), "path": setting or default_model_path(),
            "revision": config.revision, "task": config.task, "device": config.device,
            "dtype": config.dtype, "runtime": config.runtime, "quantize": config.quantize,
            "onnx_cache": config.onnx_cache, "max_batch_size": str(config.max_batch_size),
            "max_batch_delay_ms": str(config.max_batch_delay_ms), "cuda_graphs": config.cuda_graphs,
            "default_prompt_name": config.default_prompt_name}
    slots: dict[str, ModelSlot] = {}
    for fields in [main, *parse_extra_models(config.extra_models, defaults=main)]:
        slot = _slot(fields, config.trust_remote_code)
        if slot.spec.name in slots:
            raise ValueError(f"model name {slot.spec.name!r} is served twice; give each model its own name")
        slots[slot.spec.name] = slot
    return slots


def parse_extra_models(text: str, defaults: dict[str, str]) -> list[dict[str, str]]:
    """``name=a,path=/m/a,task=fill-mask;model=org/b,revision=v2`` -> one settings map per model.

    ``model=`` is a Hub id or a folder, as ``--model``; ``path=`` a folder.  Device, dtype, runtime,
    quantization and batch settings not given are the main model's.
    """
    models = []
    for given in parse_entries(text, SPEC_KEYS, "extra model"):
        if ("path" in given) == ("model" in given):
            raise ValueError(f"extra model {given}: needs a model= (a Hub id or a folder) or a path= (a folder), "
                             f"one of the two")
        setting = given.pop("model", "") or os.path.abspath(given.pop("path"))
        fields = defaults | {"name": public_name(setting), "revision": "", "default_prompt_name": ""} | given
        models.append(fields | {"path": setting})
    return models


def _slot(fields: dict[str, str], trust_remote_code: bool) -> ModelSlot:
    try:
        batch_size, delay_ms = int(fields["max_batch_size"]), float(fields["max_batch_delay_ms"])
    except ValueError:
        raise ValueError(f"model {fields['name']!r}: batch settings must be numbers") from None
    if batch_size < 0 or delay_ms < 0:
        raise ValueError(f"model {fields['name']!r}: max_batch_size must be >= 0 (0: the device's default) and "
                         "max_batch_delay_ms >= 0")
    if fields["cuda_graphs"] not in GRAPH_SETTINGS:
        raise ValueError(f"model {fields['name']!r}: cuda_graphs must be one of {', '.join(GRAPH_SETTINGS)}")
    spec = ModelSpec(fields["name"], fields["path"], fields["task"], fields["device"], fields["dtype"], batch_size,
                     fields["cuda_graphs"], fields["runtime"], fields["quantize"], fields["onnx_cache"],
                     fields["default_prompt_name"], fields["revision"], trust_remote_code)
    check_settings(spec)
    return ModelSlot(spec, batch_size, BatchPolicy(batch_size, delay_ms / 1000))
