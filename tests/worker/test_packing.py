"""Packed BERT passes: every real token's hidden state equals the padded pass's, and only BERT on a CPU packs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tests.worker.tiny_models import make_tiny_bert, make_tiny_gpt2
from worker.runners import DEFAULT_MODEL_NAME, ModelSpec, default_model_path, embeddings, load_runner
from worker.runners.packing import PackedBert, packer_for

LENGTHS = [3, 17, 1, 9, 30]  # mixed, so a padded pass pads all but one


def padded_and_packed(model: Any, token_types: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The real tokens' last hidden states from one padded pass and from one packed pass, row by row."""
    generator = torch.Generator().manual_seed(7)
    longest = max(LENGTHS)
    ids = torch.randint(5, model.config.vocab_size, (len(LENGTHS), longest), generator=generator)
    types = (torch.randint(0, 2, ids.shape, generator=generator) if token_types
             else torch.zeros_like(ids))
    mask = torch.tensor([[1] * length + [0] * (longest - length) for length in LENGTHS])
    packer = packer_for(model, "cpu")
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


def test_only_a_bert_encoder_on_a_cpu_packs(tiny_bert: Any, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    assert packer_for(tiny_bert, "cpu") is not None
    assert packer_for(tiny_bert, "cuda") is None, "on a GPU padding is nearly free"
    assert packer_for(AutoModelForCausalLM.from_pretrained(make_tiny_gpt2(tmp_path)), "cpu") is None
    tiny_bert.config.is_decoder = True
    try:
        assert packer_for(tiny_bert, "cpu") is None, "a decoder's attention is causal"
    finally:
        tiny_bert.config.is_decoder = False


def test_the_embeddings_runner_packs_and_models_the_pass_without_padding() -> None:
    runner = load_runner(ModelSpec(DEFAULT_MODEL_NAME, default_model_path(), device="cpu"))
    assert isinstance(runner, embeddings.EmbeddingRunner)
    texts = ["hi", "a short sentence", "a much longer sentence that would pad every short one in its batch " * 3]
    planned = runner.plan(runner.encode(texts, {}), {})
    assert planned.packed and len(planned.groups) == 1
    assert planned.groups[0][1]["lengths"].tolist() == planned.tokens
    if runner.cost_model.seconds_per_token:
        assert planned.modelled_seconds == pytest.approx(runner.cost_model.packed_seconds(planned.tokens))
    alone = [runner.run([text], {})[0] for text in texts]
    for want, got in zip(alone, runner.run_planned(planned), strict=True):
        assert np.abs(want - got).max() < 1e-5
