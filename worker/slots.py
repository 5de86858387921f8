"""The models one worker serves: each with its own batching policy, pending work and counters.

A worker may serve several small models on one device.  They share the one
inference thread, so at most one batch runs at a time, and a batch never
mixes models: each model has its own :class:`~worker.assembler.Assembler`.
When the model thread is free, the slot whose batch is due and whose oldest
item has waited longest goes next.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from worker.assembler import Assembler
from worker.batching import BatchPolicy
from worker.runners.spec import ModelDetails, ModelSpec
from zbatch.protocol.wire import MAX_META_BYTES, BatchCounters, ModelInfo, Status, pack
from zbatch.runtime.histogram import SECONDS_BUCKETS, SIZE_BUCKETS, Histogram

if TYPE_CHECKING:
    from worker.model_settings import ServedModel

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


def model_slots(models: Iterable[ServedModel]) -> dict[str, ModelSlot]:
    """A slot for each model to serve (:attr:`worker.config.WorkerConfig.models`), by its name."""
    return {model.spec.name: ModelSlot(model.spec, model.spec.max_batch_size,
                                       BatchPolicy(model.spec.max_batch_size, model.max_batch_delay_s))
            for model in models}
