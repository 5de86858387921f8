"""Each served model's slot: what READY says about the models, no model loading."""

from __future__ import annotations

from worker.config import load_config
from worker.runners import ModelDetails
from worker.slots import model_slots, ready_infos
from zbatch.protocol import wire


def test_ready_carries_each_models_details_and_drops_labels_that_would_crowd_it() -> None:
    config = load_config(["--extra-models", ";".join(f"name=m{i},path=/m/{i}" for i in range(8))], {})
    slots = model_slots(config.models)
    for slot in slots.values():
        slot.loaded(ModelDetails(512, None, "float32", tuple(f"{j:03} " + "x" * 96 for j in range(256))), 32)
    (alone,) = ready_infos(list(slots.values())[:1])  # 256 labels of 100 characters: 26 KB
    assert len(alone.labels) == 256
    infos = ready_infos(slots.values())  # 9 models of them: over half the meta limit
    assert all(info.labels == () and (info.max_length, info.dtype) == (512, "float32") for info in infos)
    frames = wire.encode_ready(wire.Ready(infos, 64))
    assert wire.decode_worker_message(frames) == wire.Ready(infos, 64)
