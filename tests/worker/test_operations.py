"""Issue 35's worker side on tiny models built on disk: prompts by name, sparse embeddings of a masked-LM model,
``embed_all`` and ``decode``, each against sentence-transformers or the tokenizer itself."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy as np
import pytest

from tests.worker.tiny_models import make_tiny_bert, with_prompts
from worker.runners import InputError, ModelSpec, load_runner, operation_of
from worker.runners.embeddings import EmbeddingRunner
from worker.runners.prompts import Prompts
from worker.runners.sparse import SparseEmbeddingRunner
from worker.runners.spec import check_request
from zbatch.protocol import vocabulary as v

TEXTS = ["hello world", "the cat is happy", "red " * 300, "a dog"]
PROMPTS = {"query": "query: ", "passage": "passage: the "}


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("operations")


@pytest.fixture(scope="module")
def embedder(models: Path) -> EmbeddingRunner:
    folder = with_prompts(make_tiny_bert(models, "feature-extraction"), PROMPTS)
    runner = load_runner(ModelSpec("tiny", folder))
    assert isinstance(runner, EmbeddingRunner)
    return runner


@pytest.fixture(scope="module")
def splade(models: Path) -> SparseEmbeddingRunner:
    runner = load_runner(ModelSpec("tiny-splade", make_tiny_bert(models, "fill-mask"), v.SPARSE_EMBEDDINGS))
    assert isinstance(runner, SparseEmbeddingRunner)
    return runner


def st_model(folder: str) -> Any:
    """sentence-transformers' own model of the folder: the transformer, mean pooling, these prompts."""
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(folder, device="cpu", prompts=PROMPTS)


# ------------------------------------------------------------------ prompts


def test_a_named_prompt_gives_sentence_transformers_vector(embedder: EmbeddingRunner) -> None:
    reference = st_model(embedder.spec.path)
    for name in PROMPTS:
        ours = np.stack(embedder.run(TEXTS, {v.PROMPT_NAME: name}))
        theirs = reference.encode(TEXTS, prompt_name=name, normalize_embeddings=True)
        np.testing.assert_allclose(ours, theirs, atol=1e-5)
    plain = np.stack(embedder.run(TEXTS, {}))
    np.testing.assert_allclose(plain, reference.encode(TEXTS, normalize_embeddings=True), atol=1e-5)
    assert not np.allclose(plain, np.stack(embedder.run(TEXTS, {v.PROMPT_NAME: "query"})), atol=1e-3)


def test_a_prompt_is_counted_and_tokenized_with_its_text(embedder: EmbeddingRunner) -> None:
    plain = embedder.run(["a dog"], {}).tokens  # type: ignore[attr-defined]
    prompted = embedder.run(["a dog"], {v.PROMPT_NAME: "query"}).tokens  # type: ignore[attr-defined]
    assert prompted[0] == plain[0] + 2  # "query" and ":"
    tokens = embedder.tokenize(["a dog"], {v.PROMPT_NAME: "query"})[0]
    assert [t["text"] for t in tokens] == ["[CLS]", "query", ":", "a", "dog", "[SEP]"]


def test_an_unknown_prompt_name_refuses_the_batch_naming_the_prompts(embedder: EmbeddingRunner) -> None:
    with pytest.raises(InputError, match="'passage', 'query'"):
        embedder.run(["a"], {v.PROMPT_NAME: "nope"})
    with pytest.raises(InputError, match="prompt_name"):
        embedder.run(["a"], {v.PROMPT_NAME: 7})


def test_the_default_prompt_is_the_workers_then_the_models_own(tmp_path: Path) -> None:
    folder = with_prompts(make_tiny_bert(tmp_path, "feature-extraction"), PROMPTS, default="passage")
    assert Prompts.load(folder).prefix({}) == "passage: the "  # the model's own, as sentence-transformers
    assert Prompts.load(folder, "query").prefix({}) == "query: "  # --default-prompt-name wins
    assert Prompts.load(folder, "query").prefix({v.PROMPT_NAME: "passage"}) == "passage: the "
    with pytest.raises(ValueError, match="'passage', 'query'"):
        Prompts.load(folder, "nope")
    runner = load_runner(ModelSpec("tiny", folder, default_prompt_name="query"))
    assert isinstance(runner, EmbeddingRunner)
    np.testing.assert_allclose(np.stack(runner.run(TEXTS, {})),
                               st_model(folder).encode(TEXTS, prompt_name="query", normalize_embeddings=True),
                               atol=1e-5)


def test_a_default_prompt_needs_a_model_that_takes_prompts(tmp_path: Path) -> None:
    plain = make_tiny_bert(tmp_path, "feature-extraction")
    with pytest.raises(ValueError, match="none"):
        load_runner(ModelSpec("tiny", plain, default_prompt_name="query"))
    classifier = make_tiny_bert(tmp_path, "text-classification")
    with pytest.raises(ValueError, match="embeddings models"):
        load_runner(ModelSpec("tiny", classifier, "text-classification", default_prompt_name="query"))


# ------------------------------------------------------------------ sparse embeddings


def test_sparse_embeddings_are_sentence_transformers_splade(splade: SparseEmbeddingRunner) -> None:
    from sentence_transformers import SparseEncoder

    reference = SparseEncoder(splade.spec.path, device="cpu")  # a masked-LM folder: MLM head, SPLADE max pooling
    theirs = reference.encode(TEXTS, convert_to_tensor=True).to_dense().numpy()
    outputs = splade.run(TEXTS, {})
    assert splade.details.dimensions == theirs.shape[1]
    for output, dense in zip(outputs, theirs, strict=True):
        assert output[v.SPARSE_INDICES].dtype == np.int32 and output[v.SPARSE_VALUES].dtype == np.float32
        np.testing.assert_array_equal(output[v.SPARSE_INDICES], np.flatnonzero(dense > 0))
        np.testing.assert_allclose(output[v.SPARSE_VALUES], dense[dense > 0], rtol=1e-5, atol=1e-6)


def test_sparse_embeddings_take_prompts_and_truncation(splade: SparseEmbeddingRunner, tmp_path: Path) -> None:
    with pytest.raises(InputError, match="prompt"):
        splade.run(["a"], {v.PROMPT_NAME: "query"})  # this model has no prompts
    refused = splade.run(["red " * 300], {v.TRUNCATE: False})
    assert isinstance(refused[0], InputError) and "128" in str(refused[0])


# ------------------------------------------------------------------ embed_all


@pytest.mark.parametrize("packed", [True, False])
def test_embed_all_is_the_last_hidden_state_of_every_token(embedder: EmbeddingRunner, packed: bool) -> None:
    """Packed (a BERT on the CPU) or padded in length groups (any other model, or on an accelerator)."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(embedder.spec.path)
    model = AutoModel.from_pretrained(embedder.spec.path).eval()
    embed_all = operation_of(embedder, v.EMBED_ALL)
    assert embedder._packer is not None  # a BERT on the CPU: packed unless told not to
    embedder.set_length_grouping(packed)
    try:
        outputs = embed_all(TEXTS, {v.PROMPT_NAME: "query"})
    finally:
        embedder.set_length_grouping(True)
    assert outputs.tokens == [len(o) for o in outputs]  # type: ignore[attr-defined]
    for text, rows in zip(TEXTS, outputs, strict=True):
        encoded = tokenizer("query: " + text, truncation=True, max_length=128, return_tensors="pt")
        with torch.inference_mode():
            want = model(**encoded).last_hidden_state[0].numpy()
        assert rows.shape == want.shape == (len(encoded["input_ids"][0]), 32)
        np.testing.assert_allclose(rows, want, atol=1e-5)
    with pytest.raises(InputError, match="normalize"):
        embed_all(["a"], {v.NORMALIZE: True})


def test_embed_all_is_refused_where_there_is_no_embeddings_model(splade: SparseEmbeddingRunner) -> None:
    with pytest.raises(InputError, match="embed_all"):
        operation_of(splade, v.EMBED_ALL)(["a"], {})


# ------------------------------------------------------------------ decode


def test_decode_gives_back_the_text_of_token_ids(embedder: EmbeddingRunner) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(embedder.spec.path)
    ids = [np.asarray(tokenizer(text)["input_ids"], dtype=np.int64) for text in ("hello world", "the cat")]
    decode = operation_of(embedder, v.DECODE)
    assert list(decode(ids, {})) == ["hello world", "the cat"]
    assert list(decode(ids[:1], {v.SKIP_SPECIAL_TOKENS: False})) == ["[CLS] hello world [SEP]"]
    assert decode(ids, {}).tokens == [4, 4]  # type: ignore[attr-defined]
    out_of_range = decode([np.asarray([2, 10_000], dtype=np.int64), ids[0]], {})
    assert isinstance(out_of_range[0], InputError) and out_of_range[1] == "hello world"
    with pytest.raises(InputError, match="skip_special_tokens"):
        decode(ids, {v.SKIP_SPECIAL_TOKENS: "yes"})


@pytest.mark.parametrize("inputs", [["text"], [np.zeros((2, 2), dtype=np.int64)], [np.zeros(2, dtype=np.float32)],
                                    [[1, 2]]])
def test_decode_takes_one_dimensional_integer_arrays_only(inputs: list[Any]) -> None:
    with pytest.raises(InputError, match="token ids"):
        check_request(v.EMBEDDINGS, v.DECODE, inputs)


def test_image_models_have_no_tokenizer_for_any_operation() -> None:
    for operation in (v.TOKENIZE, v.DECODE, v.EMBED_ALL):
        with pytest.raises(InputError, match="no tokenizer"):
            check_request(v.IMAGE_CLASSIFICATION, operation, [b"image"])


def test_prompts_file_is_read_as_sentence_transformers_writes_it(tmp_path: Path) -> None:
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "config_sentence_transformers.json").write_text(json.dumps(
        {"__version__": {"sentence_transformers": "5.0.0"}, "prompts": {"query": "q: ", "document": ""},
         "default_prompt_name": None, "similarity_fn_name": "cosine"}))
    prompts = Prompts.load(str(folder))
    assert prompts.by_name == {"query": "q: ", "document": ""} and prompts.default == ""
    assert prompts.prefix({v.PROMPT_NAME: "document"}) == ""
    shutil.rmtree(folder)
    assert Prompts.load(str(folder)).by_name == {}
