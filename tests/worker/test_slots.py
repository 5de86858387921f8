"""Which models a worker serves, from its flags: parsing and validation, no model loading."""

from __future__ import annotations

import pytest

from worker.config import load_config
from worker.runners import ModelDetails
from worker.slots import model_slots, ready_infos
from zbatch.protocol import wire


def test_main_model_only_by_default() -> None:
    slots = model_slots(load_config([], {}))
    assert list(slots) == ["all-MiniLM-L6-v2"] and slots["all-MiniLM-L6-v2"].max_batch_size == 0  # the device's
    assert slots["all-MiniLM-L6-v2"].spec.max_batch_size == 0


def test_extra_models_inherit_unset_settings_from_the_main_one() -> None:
    config = load_config(["--max-batch-size", "16", "--extra-models",
                          "name=cls,path=/m/cls,task=text-classification,max_batch_size=4; "
                          "path=/m/mlm,task=fill-mask"], {})
    slots = model_slots(config)
    assert list(slots) == ["all-MiniLM-L6-v2", "cls", "mlm"]
    assert (slots["cls"].spec.task, slots["cls"].max_batch_size) == ("text-classification", 4)
    assert (slots["mlm"].spec.path, slots["mlm"].max_batch_size, slots["mlm"].spec.device) == ("/m/mlm", 16, "auto")


def test_the_default_prompt_name_is_the_main_models_and_each_extra_models_own() -> None:
    config = load_config(["--extra-models", "name=a,path=/m/a;name=b,path=/m/b,default_prompt_name=passage"],
                         {"ZBATCH_DEFAULT_PROMPT_NAME": "query"})
    slots = model_slots(config)
    assert [slot.spec.default_prompt_name for slot in slots.values()] == ["query", "", "passage"]


@pytest.mark.parametrize(
    ("extra", "complaint"),
    [
        ("name=x", "needs a model= .a Hub id or a folder. or a path="),
        ("name=x,path=/p,colour=red", "expected key=value pairs"),
        ("name=all-MiniLM-L6-v2,path=/p", "served twice"),
        ("name=x,path=/p,max_batch_size=-1", "max_batch_size must be >= 0"),
        ("name=x,path=/p,max_batch_delay_ms=soon", "must be numbers"),
    ],
)
def test_bad_extra_models_are_refused_with_a_reason(extra: str, complaint: str) -> None:
    with pytest.raises(ValueError, match=complaint):
        model_slots(load_config(["--extra-models", extra], {}))


def test_ready_carries_each_models_details_and_drops_labels_that_would_crowd_it() -> None:
    config = load_config(["--extra-models", ";".join(f"name=m{i},path=/m/{i}" for i in range(8))], {})
    slots = model_slots(config)
    for slot in slots.values():
        slot.loaded(ModelDetails(512, None, "float32", tuple(f"{j:03} " + "x" * 96 for j in range(256))), 32)
    (alone,) = ready_infos(list(slots.values())[:1])  # 256 labels of 100 characters: 26 KB
    assert len(alone.labels) == 256
    infos = ready_infos(slots.values())  # 9 models of them: over half the meta limit
    assert all(info.labels == () and (info.max_length, info.dtype) == (512, "float32") for info in infos)
    frames = wire.encode_ready(wire.Ready(infos, 64))
    assert wire.decode_worker_message(frames) == wire.Ready(infos, 64)
