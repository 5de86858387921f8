"""worker.runners.text and the embeddings parameters, on a tiny BERT built on disk: token counts, truncation,
``dimensions``, and the ``tokenize`` operation, each against the tokenizer itself."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy as np
import pytest

from tests.worker.tiny_models import make_tiny_bert
from worker.runners import InputError, ModelSpec, Outputs, load_runner, operation_of
from worker.runners.embeddings import EmbeddingRunner
from worker.runners.text import TextRunner

TEXTS = ["hello world", "the cat is happy", "", "red " * 300, "Ünïcödé café 東京 🚀 and a dog"]
LONG = 3  # TEXTS[LONG] is over the model's 128 tokens


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return make_tiny_bert(tmp_path_factory.mktemp("text"), "feature-extraction")


@pytest.fixture(scope="module")
def embedder(model_dir: str) -> EmbeddingRunner:
    runner = load_runner(ModelSpec("tiny-embeddings", model_dir))
    assert isinstance(runner, EmbeddingRunner)
    return runner


@pytest.fixture(scope="module")
def tokenizer(model_dir: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


def run(runner: EmbeddingRunner, texts: list[str], parameters: dict[str, Any] | None = None) -> Outputs:
    outputs = runner.run(texts, parameters or {})
    assert isinstance(outputs, Outputs)
    return outputs


def test_token_counts_are_the_tokenizers_after_truncation(embedder: EmbeddingRunner, tokenizer: Any) -> None:
    want = [len(ids) for ids in tokenizer(TEXTS, truncation=True, max_length=128)["input_ids"]]
    assert want[LONG] == 128 and want[2] == 2  # truncated; [CLS] [SEP] alone
    assert run(embedder, TEXTS).tokens == want
    for text, count in zip(TEXTS, want, strict=True):
        assert run(embedder, [text]).tokens == [count]  # one input skips the length pass: same counts


def test_the_details_for_ready(embedder: EmbeddingRunner) -> None:
    details = embedder.details
    assert (details.max_length, details.dimensions, details.dtype, details.labels) == (128, 32, "float32", ())


def test_truncate_false_refuses_each_long_input_alone(embedder: EmbeddingRunner) -> None:
    outputs = run(embedder, TEXTS, {"truncate": False})
    refused = outputs[LONG]
    assert isinstance(refused, InputError)
    assert "302 tokens" in str(refused) and "at most 128" in str(refused) and "'truncate': true" in str(refused)
    allowed = run(embedder, TEXTS)
    for index, (got, want) in enumerate(zip(outputs, allowed, strict=True)):
        if index != LONG:
            assert np.abs(got - want).max() < 1e-5
    (alone,) = run(embedder, [TEXTS[LONG]], {"truncate": False})
    assert isinstance(alone, InputError)


def test_truncation_direction_left_keeps_the_end(embedder: EmbeddingRunner) -> None:
    text = "dog " * 200 + "cat " * 200
    (left,) = run(embedder, [text], {"truncation_direction": "left"})
    (right,) = run(embedder, [text])
    (cats,) = run(embedder, ["cat " * 200])
    (dogs,) = run(embedder, ["dog " * 200])
    assert np.abs(left - cats).max() < 1e-5 and np.abs(right - dogs).max() < 1e-5


def test_dimensions_are_the_first_numbers_renormalised(embedder: EmbeddingRunner) -> None:
    full = run(embedder, TEXTS)
    short = run(embedder, TEXTS, {"dimensions": 8})
    raw = run(embedder, TEXTS, {"dimensions": 8, "normalize": False})
    raw_full = run(embedder, TEXTS, {"normalize": False})
    for vector, cut, unnormalised, unnormalised_full in zip(full, short, raw, raw_full, strict=True):
        assert cut.shape == (8,) and np.linalg.norm(cut) == pytest.approx(1.0, abs=1e-5)
        assert np.abs(cut - vector[:8] / np.linalg.norm(vector[:8])).max() < 1e-5
        assert np.abs(unnormalised - unnormalised_full[:8]).max() < 1e-5


def test_float16_precision_halves_the_numbers_and_keeps_the_vectors(embedder: EmbeddingRunner) -> None:
    full = run(embedder, TEXTS)
    for extra in ({}, {"dimensions": 8}, {"normalize": False}):
        single = run(embedder, TEXTS, extra | {"precision": "float32"})
        half = run(embedder, TEXTS, extra | {"precision": "float16"})
        for want, got in zip(single, half, strict=True):
            assert want.dtype == np.float32 and got.dtype == np.float16 and got.shape == want.shape
            assert got.nbytes * 2 == want.nbytes
            wide = got.astype(np.float32)
            assert float(wide @ want) / float(np.linalg.norm(wide) * np.linalg.norm(want)) >= 0.9999
    assert run(embedder, TEXTS, {"precision": "float32"}).tokens == full.tokens


@pytest.mark.parametrize(("parameters", "complaint"), [
    ({"precision": "int8"}, "parameter 'precision' must be one of 'float32', 'float16', not 'int8'"),
    ({"precision": 16}, "parameter 'precision' must be one of 'float32', 'float16', not 16"),
    ({"dimensions": 33}, "from 1 to 32"),
    ({"dimensions": 0}, "from 1 to 32"),
    ({"dimensions": True}, "from 1 to 32"),
    ({"dimensions": 2.5}, "from 1 to 32"),
    ({"truncate": "no"}, "'truncate' must be true or false"),
    ({"truncation_direction": "middle"}, "'right' or 'left'"),
    ({"prompt_name": "query"}, "'prompt_name' must name a prompt of this model, not 'query': it has none"),
    ({"top_k": 3}, "unknown parameter(s) 'top_k' for embeddings; use only 'dimensions', 'normalize', "
                   "'precision', 'prompt_name', 'truncate', 'truncation_direction'"),
])
def test_bad_parameters_refuse_the_batch(embedder: EmbeddingRunner, parameters: dict[str, Any],
                                         complaint: str) -> None:
    with pytest.raises(InputError) as refusal:
        embedder.run(["hello"], parameters)
    assert complaint in str(refusal.value)


def test_tokenize_gives_the_tokenizers_ids_and_offsets(embedder: EmbeddingRunner, tokenizer: Any) -> None:
    texts = ["hello world", "Ünïcödé café the dog", "cat [SEP] dog"]
    tokens = operation_of(embedder, "tokenize")(texts, {})
    assert isinstance(tokens, Outputs) and tokens.tokens == [len(each) for each in tokens]
    encoded = tokenizer(texts, return_offsets_mapping=True)
    for text, each, ids, offsets in zip(texts, tokens, encoded["input_ids"], encoded["offset_mapping"], strict=True):
        assert [token["id"] for token in each] == ids
        assert each[0] == {"id": tokenizer.cls_token_id, "text": "[CLS]", "special": True, "start": None,
                           "stop": None}
        assert each[-1]["text"] == "[SEP]" and each[-1]["special"]
        for token, (start, stop) in zip(each[1:-1], offsets[1:-1], strict=True):
            assert (token["start"], token["stop"], token["special"]) == (start, stop, False)
            assert token["text"] == text[start:stop]
    assert [token["text"] for token in tokens[0]] == ["[CLS]", "hello", "world", "[SEP]"]
    (plain,) = embedder.tokenize(["hello world"], {"add_special_tokens": False})
    assert [token["text"] for token in plain] == ["hello", "world"]
    assert embedder.modelled_seconds == 0.0


@pytest.mark.parametrize(("inputs", "parameters", "complaint"), [
    ([["a", "b"]], {}, "inputs[0] is an array of 2 item(s): str, str; 'tokenize' takes strings"),
    (["a"], {"add_special_tokens": 1}, "'add_special_tokens' must be true or false"),
    (["a"], {"truncate": True}, "unknown parameter(s) 'truncate' for 'tokenize'"),
])
def test_tokenize_refuses_what_it_cannot_use(embedder: EmbeddingRunner, inputs: list[Any],
                                             parameters: dict[str, Any], complaint: str) -> None:
    with pytest.raises(InputError) as refusal:
        embedder.tokenize(inputs, parameters)
    assert complaint in str(refusal.value)


def test_pipelines_count_tokens_and_tokenize_too(tmp_path: Path, tokenizer: Any) -> None:
    runner = load_runner(ModelSpec("tiny-fill", make_tiny_bert(tmp_path, "fill-mask"), task="fill-mask"))
    texts = ["test [MASK]", "hello big [MASK] world"]
    outputs = runner.run(texts, {})
    assert isinstance(outputs, Outputs) and outputs.tokens == [len(ids) for ids in tokenizer(texts)["input_ids"]]
    tokens = operation_of(runner, "tokenize")(["hello world"], {})
    assert isinstance(tokens, Outputs) and tokens.tokens == [4]
    assert runner.details.max_length == 128 and runner.details.dtype == "float32"  # type: ignore[attr-defined]


@pytest.mark.parametrize("head", ["feature-extraction", "rerank"])
@pytest.mark.parametrize("parameters", [{}, {"truncation_direction": "left"}, {"truncate": False}])
def test_encodings_are_what_transformers_gives_for_the_same_call(head: str, parameters: dict[str, Any],
                                                                 tmp_path: Path) -> None:
    """The fast tokenizer is called directly (worker.runners.text._tokenized): rows, truncation and pairs as
    ``tokenizer(texts, truncation=True, max_length=...)`` gives them, every call, whatever came before."""
    from transformers import AutoTokenizer

    path = make_tiny_bert(tmp_path, head)
    runner = load_runner(ModelSpec("tiny", path, task="rerank" if head == "rerank" else "embeddings"))
    assert isinstance(runner, TextRunner)
    tokenizer = AutoTokenizer.from_pretrained(path)
    inputs: list[Any] = TEXTS if head != "rerank" else [["is it " * 50, text] for text in TEXTS]
    texts = [tuple(each) if isinstance(each, list) else each for each in inputs]
    runner.encode(inputs, {"truncation_direction": "left"})  # settings of an earlier call must not stick
    got = runner.encode(inputs, parameters)
    truncate = parameters.get("truncate", True)
    tokenizer.truncation_side = parameters.get("truncation_direction", "right")
    want = tokenizer(texts, **({"truncation": True, "max_length": 128} if truncate else {}))
    for index, encoding in enumerate(got):
        if not truncate and len(want["input_ids"][index]) > 128:
            assert isinstance(encoding, InputError) and "tokens and the model takes at most 128" in str(encoding)
            continue
        assert not isinstance(encoding, InputError)
        assert sorted(encoding.rows) == sorted(key for key in want if key != "attention_mask")
        for key, row in encoding.rows.items():
            assert row.tolist() == want[key][index], (key, index)
