"""Packed BERT passes: every real token's hidden state equals the padded pass's, with a call of attention per
input (a CPU's way) or one over the whole row (an accelerator's); which models pack, and where."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tests.worker.tiny_models import make_tiny_bert, make_tiny_gpt2
from worker.runners import DEFAULT_MODEL_NAME, ModelSpec, default_model_path, embeddings, load_runner
from worker.runners.packing import PackedBert, packed_groups, packer_for, restarting_positions
from worker.runners.spec import InputError

LENGTHS = [3, 17, 1, 9, 30]  # mixed, so a padded pass pads all but one


def padded_and_packed(model: Any, token_types: bool, packer: PackedBert | None = None
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """The real tokens' last hidden states from one padded pass and from one packed pass (``packer``'s, else the
    CPU's), row by row."""
    generator = torch.Generator().manual_seed(7)
    longest = max(LENGTHS)
    ids = torch.randint(5, model.config.vocab_size, (len(LENGTHS), longest), generator=generator)
    types = (torch.randint(0, 2, ids.shape, generator=generator) if token_types
             else torch.zeros_like(ids))
    mask = torch.tensor([[1] * length + [0] * (longest - length) for length in LENGTHS])
    packer = packer or packer_for(model, "cpu")
    assert isinstance(packer, PackedBert)
    with torch.inference_mode():
        padded = model(input_ids=ids, token_type_ids=types, attention_mask=mask).last_hidden_state
        packed = packer(ids[mask.bool()], types[mask.bool()] if token_types else None, LENGTHS)
    return padded[mask.bool()], packed


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from transformers import AutoModel

    return AutoModel.from_pretrained(make_tiny_bert(tmp_path_factory.mktemp("bert"), "feature-extraction")).eval()


@pytest.mark.parametrize("token_types", [False, True])
def test_a_packed_pass_gives_each_token_the_padded_pass_hidden_state(tiny_bert: Any, token_types: bool) -> None:
    padded, packed = padded_and_packed(tiny_bert, token_types)
    assert packed.shape == (sum(LENGTHS), tiny_bert.config.hidden_size)
    assert torch.allclose(packed, padded, atol=1e-5)


def test_the_default_model_packs_to_the_same_hidden_states() -> None:
    from transformers import AutoModel

    model = AutoModel.from_pretrained(default_model_path()).eval()
    padded, packed = padded_and_packed(model, token_types=False)
    assert torch.allclose(packed, padded, atol=1e-4)


@pytest.mark.parametrize("token_types", [False, True])
def test_one_attention_call_over_the_row_gives_the_padded_pass_hidden_states(tiny_bert: Any,
                                                                             token_types: bool) -> None:
    """The accelerator's packed pass: one call over a jagged tensor (on the CPU torch runs it its own way)."""
    padded, at_once = padded_and_packed(tiny_bert, token_types, PackedBert(tiny_bert, one_call=True))
    assert torch.allclose(at_once, padded, atol=1e-5)


def test_the_default_model_attends_at_once_to_the_same_vectors() -> None:
    from transformers import AutoModel

    model = AutoModel.from_pretrained(default_model_path()).eval()
    padded, at_once = padded_and_packed(model, False, PackedBert(model, one_call=True))
    assert torch.nn.functional.cosine_similarity(at_once, padded, dim=1).min().item() >= 0.9999


def test_positions_restart_at_each_input() -> None:
    assert restarting_positions([3, 1, 2]).tolist() == [0, 1, 2, 0, 0, 1]
    assert restarting_positions([]).tolist() == []


def test_inputs_do_not_see_each_other() -> None:
    """Attention stays inside each input: changing one input leaves the others' states exactly as they were."""
    from transformers import AutoModel

    model = AutoModel.from_pretrained(default_model_path()).eval()
    packer = packer_for(model, "cpu")
    assert packer is not None
    first, second = torch.arange(100, 110), torch.arange(200, 205)
    with torch.inference_mode():
        together = packer(torch.cat([first, second]), None, [10, 5])
        changed = packer(torch.cat([first, second + 50]), None, [10, 5])
    assert torch.equal(together[:10], changed[:10])
    assert not torch.allclose(together[10:], changed[10:])


def test_only_a_bert_encoder_in_eval_mode_on_a_cpu_packs(tiny_bert: Any, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    on_cpu = packer_for(tiny_bert, "cpu")
    assert on_cpu is not None and not on_cpu.one_call, "on a CPU a call per input runs faster"
    assert packer_for(tiny_bert, "cuda") is None, "on a GPU unpadded attention is asked for (off by default)"
    on_gpu = packer_for(tiny_bert, "cuda", unpadded_attention=True)
    assert on_gpu is not None and on_gpu.one_call
    assert packer_for(AutoModelForCausalLM.from_pretrained(make_tiny_gpt2(tmp_path)), "cpu") is None
    classifier = AutoModelForSequenceClassification.from_pretrained(make_tiny_bert(tmp_path, "text-classification"))
    assert packer_for(classifier.eval(), "cpu") is None, "a head on top is not what the packed pass returns"
    tiny_bert.config.is_decoder = True
    try:
        assert packer_for(tiny_bert, "cpu") is None, "a decoder's attention is causal"
    finally:
        tiny_bert.config.is_decoder = False
    tiny_bert.train()
    try:
        assert packer_for(tiny_bert, "cpu") is None, "the packed pass has no dropout"
    finally:
        tiny_bert.eval()


@pytest.fixture(scope="module")
def runner() -> embeddings.EmbeddingRunner:
    loaded = load_runner(ModelSpec(DEFAULT_MODEL_NAME, default_model_path(), device="cpu"))
    assert isinstance(loaded, embeddings.EmbeddingRunner)
    return loaded


TEXTS = ["hi", "a short sentence", "a much longer sentence that would pad every short one in its batch " * 3]


def padded(runner: embeddings.EmbeddingRunner, texts: list[str], parameters: dict[str, Any]) -> list[Any]:
    runner.set_length_grouping(False)
    try:
        return runner.run(texts, parameters)
    finally:
        runner.set_length_grouping(True)


def test_the_embeddings_runner_packs_and_models_the_pass_without_padding(
        runner: embeddings.EmbeddingRunner) -> None:
    planned = runner.plan(runner.encode(TEXTS, {}), {})
    assert planned.packed and len(planned.groups) == 1
    assert planned.groups[0][1]["lengths"].tolist() == planned.tokens
    assert planned.modelled_seconds > 0
    assert planned.modelled_seconds == pytest.approx(runner.cost_model.packed_seconds(planned.tokens))
    for want, got in zip(padded(runner, TEXTS, {}), runner.run_planned(planned), strict=True):
        assert np.abs(want - got).max() < 1e-5


@pytest.mark.parametrize("parameters", [{"dimensions": 64}, {"normalize": False},
                                        {"dimensions": 8, "normalize": False}])
def test_packed_embeddings_honour_the_parameters(runner: embeddings.EmbeddingRunner,
                                                  parameters: dict[str, Any]) -> None:
    packed = runner.run(TEXTS, parameters)
    for want, got in zip(padded(runner, TEXTS, parameters), packed, strict=True):
        assert got.shape == want.shape == (parameters.get("dimensions", runner.dimensions),)
        assert np.abs(want - got).max() < 1e-5


def test_a_token_budget_cuts_packed_passes_and_the_vectors_stay(runner: embeddings.EmbeddingRunner,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    want = runner.run(TEXTS, {})
    monkeypatch.setattr(runner, "spec", replace(runner.spec, max_batch_tokens=8))
    planned = runner.plan(runner.encode(TEXTS, {}), {})
    assert planned.packed and len(planned.groups) > 1
    for group, arrays in planned.groups:
        assert len(group) == 1 or arrays["input_ids"].size <= 8, "within the budget, or one input alone"
    for expected, got in zip(want, runner.run_planned(planned), strict=True):
        assert np.abs(expected - got).max() < 1e-5


def test_a_refused_input_keeps_its_place_in_a_packed_batch(runner: embeddings.EmbeddingRunner) -> None:
    too_long = "word " * (runner.max_length + 10)
    texts = [TEXTS[0], too_long, TEXTS[2]]
    outputs = runner.run(texts, {"truncate": False})
    assert isinstance(outputs[1], InputError)
    for want, got in zip(padded(runner, [TEXTS[0], TEXTS[2]], {}), [outputs[0], outputs[2]], strict=True):
        assert np.abs(want - got).max() < 1e-5


def test_switching_modes_times_the_pass_that_will_run(runner: embeddings.EmbeddingRunner,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Packed and padded passes cost differently: switching times the pass the batches will run, once a mode."""
    assert runner.cost_model.seconds_per_token, "on a CPU a longer pass costs more: warm-up measures it"
    packer = runner._packer
    assert packer is not None
    packed_calls: list[int] = []

    def counted(*args: Any) -> Any:
        packed_calls.append(1)
        return packer(*args)

    monkeypatch.setattr(runner, "_packer", counted)
    monkeypatch.setattr(runner, "_timed_modes", {})  # as loaded: timed in the packed mode only
    packed_model = runner.cost_model
    runner.set_length_grouping(False)
    try:
        assert packed_calls == [], "off: the padded pass is timed"
        padded_model = runner.cost_model
        assert padded_model.seconds_per_token and padded_model is not packed_model
    finally:
        runner.set_length_grouping(True)
    assert packed_calls == [] and runner.cost_model is packed_model, "on again: the packed timing is back"
    runner.set_length_grouping(False)
    try:
        assert runner.cost_model is padded_model, "off again: timed once already"
    finally:
        runner.set_length_grouping(True)


@pytest.mark.parametrize(("tokens", "cap", "expected"), [
    ([10, 20, 30], None, [[0, 1, 2]]),
    ([10, 20, 30], 30, [[0, 1], [2]]),
    ([10, 50, 5, 5], 30, [[0], [1], [2, 3]]),  # one input over the cap runs alone
    ([30, 30], 60, [[0, 1]]),
])
def test_packed_groups_keep_the_order_and_stay_under_the_cap(tokens: list[int], cap: int | None,
                                                           expected: list[list[int]]) -> None:
    assert packed_groups(list(range(len(tokens))), tokens, cap) == expected

