"""Token ids as inputs (issue 41, point 2) on tiny models built on disk: ids as ``tokenize`` gives them run to the
text's own outputs, truncation keeps the special tokens, and each bad input is refused alone, its neighbours run."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy as np
import pytest

from tests.worker.tiny_models import make_tiny_bert, make_tiny_qwen3, with_prompts, with_st_modules
from worker.runners import InputError, ModelSpec, load_runner, operation_of
from worker.runners.embeddings import EmbeddingRunner
from worker.runners.encoding import Encoding
from worker.runners.sparse import SparseEmbeddingRunner
from worker.runners.spec import check_request
from worker.runners.text import TextRunner
from worker.runners.token_ids import SpecialFrame, outside_vocabulary
from zbatch.protocol import payloads
from zbatch.protocol import vocabulary as v
from zbatch.protocol.texts import TextEncoder

TEXTS = ["hello world", "the cat is happy", "red " * 300 + "blue", "a dog"]
LONG = 2  # TEXTS[LONG] is over the tiny model's 128 tokens
CLS, SEP = 2, 3  # the tiny vocabulary's [CLS] and [SEP] (tests/worker/tiny_models.py)


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("token-ids")


@pytest.fixture(scope="module")
def embedder(models: Path) -> EmbeddingRunner:
    folder = with_prompts(make_tiny_bert(models / "plain", "feature-extraction"), {"query": "query: ", "none": ""})
    runner = load_runner(ModelSpec("tiny", folder))
    assert isinstance(runner, EmbeddingRunner)
    return runner


def ids_of(runner: TextRunner, texts: list[str], parameters: dict[str, Any] | None = None) -> list[np.ndarray]:
    """Each text's ids as the ``tokenize`` operation gives them: special tokens included, never truncated."""
    return [np.asarray([token["id"] for token in tokens], dtype=np.int64)
            for tokens in runner.tokenize(texts, parameters or {})]


def assert_same_vectors(got: list[Any], want: list[Any]) -> None:
    assert len(got) == len(want)
    for ours, theirs in zip(got, want, strict=True):
        assert float(np.dot(ours, theirs)) / float(np.linalg.norm(ours) * np.linalg.norm(theirs)) >= 0.9999


# ------------------------------------------------------------------ the checks and the frame


def test_outside_vocabulary_names_the_first_bad_id() -> None:
    assert outside_vocabulary(np.asarray([0, 5, 9]), 10) is None
    assert outside_vocabulary(np.asarray([], dtype=np.int64), 10) is None
    assert outside_vocabulary(np.asarray([1, 12, -1]), 10) == ("token id 12 is outside this model's vocabulary: "
                                                               "ids run from 0 to 9")
    assert str(outside_vocabulary(np.asarray([-4, 3]), 10)).startswith("token id -4 is outside")
    assert "18446744073709551615" in str(outside_vocabulary(np.asarray([2**64 - 1], dtype=np.uint64), 10))


def test_truncation_keeps_the_frame_and_cuts_between() -> None:
    frame = SpecialFrame((CLS,), (SEP,))
    ids = np.asarray([CLS, 10, 11, 12, 13, SEP])
    assert frame.truncated(ids, 6, True) is ids
    assert frame.truncated(ids, 4, True).tolist() == [CLS, 10, 11, SEP]
    assert frame.truncated(ids, 4, False).tolist() == [CLS, 12, 13, SEP]
    unframed = np.asarray([10, 11, 12, 13, 14])  # the sender left the special tokens out: a plain cut
    assert frame.truncated(unframed, 3, True).tolist() == [10, 11, 12]
    assert frame.truncated(unframed, 3, False).tolist() == [12, 13, 14]
    assert frame.truncated(ids, 2, True).tolist() == [CLS, 10]  # no room for the frame and a token


def test_the_frame_is_the_tokenizers(embedder: EmbeddingRunner) -> None:
    assert SpecialFrame.of(embedder._tokenizer) == SpecialFrame((CLS,), (SEP,))


# ------------------------------------------------------------------ same outputs as the text


def test_ids_run_to_the_texts_vectors_and_counts(embedder: EmbeddingRunner) -> None:
    ids = ids_of(embedder, TEXTS)
    assert ids[LONG].size > embedder.max_length  # tokenize does not truncate; run does
    from_text, from_ids = embedder.run(TEXTS, {}), embedder.run(ids, {})
    assert_same_vectors(from_ids, from_text)
    assert from_ids.tokens == from_text.tokens and from_ids.tokens[LONG] == 128  # type: ignore[attr-defined]
    for direction in ("left", "right"):
        parameters = {v.TRUNCATION_DIRECTION: direction}
        assert_same_vectors(embedder.run([ids[LONG]], parameters), embedder.run([TEXTS[LONG]], parameters))
    assert_same_vectors(embedder.run(ids, {v.DIMENSIONS: 8, v.NORMALIZE: False}),
                        embedder.run(TEXTS, {v.DIMENSIONS: 8, v.NORMALIZE: False}))


def test_texts_and_ids_mix_in_one_request(embedder: EmbeddingRunner) -> None:
    ids = ids_of(embedder, TEXTS)
    mixed = [TEXTS[0], ids[1], ids[2], TEXTS[3]]
    outputs = embedder.run(mixed, {})
    assert_same_vectors(outputs, embedder.run(TEXTS, {}))
    assert outputs.tokens == [4, 6, 128, 4]  # type: ignore[attr-defined]


def test_ids_take_zero_token_types_and_any_integer_dtype(embedder: EmbeddingRunner) -> None:
    (ids,) = ids_of(embedder, ["the cat"])
    encodings = embedder.encode([ids.astype(np.int32), ids.astype(np.uint16)], {})
    for encoding in encodings:
        assert isinstance(encoding, Encoding)
        assert encoding.rows["input_ids"].dtype == np.int64 and encoding.rows["input_ids"].tolist() == ids.tolist()
        assert encoding.rows["token_type_ids"].tolist() == [0] * ids.size


def test_embed_all_takes_ids(embedder: EmbeddingRunner) -> None:
    embed_all = operation_of(embedder, v.EMBED_ALL)
    for ours, theirs in zip(embed_all(ids_of(embedder, TEXTS), {}), embed_all(TEXTS, {}), strict=True):
        np.testing.assert_allclose(ours, theirs, atol=1e-5)


def test_sparse_embeddings_take_ids(models: Path) -> None:
    splade = load_runner(ModelSpec("tiny-splade", make_tiny_bert(models / "splade", "fill-mask"),
                                   v.SPARSE_EMBEDDINGS))
    assert isinstance(splade, SparseEmbeddingRunner)
    for ours, theirs in zip(splade.run(ids_of(splade, TEXTS), {}), splade.run(TEXTS, {}), strict=True):
        np.testing.assert_array_equal(ours[v.SPARSE_INDICES], theirs[v.SPARSE_INDICES])
        np.testing.assert_allclose(ours[v.SPARSE_VALUES], theirs[v.SPARSE_VALUES], rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------ refusals, each alone


def test_bad_ids_are_refused_alone_and_their_neighbours_run(embedder: EmbeddingRunner) -> None:
    vocabulary = len(embedder._tokenizer)
    bad = {"outside": np.asarray([CLS, vocabulary, SEP]), "negative": np.asarray([CLS, -1, SEP]),
           "empty": np.asarray([], dtype=np.int64)}
    good = ids_of(embedder, ["a dog"])[0]
    outputs = embedder.run([good, *bad.values(), "a dog"], {})
    assert_same_vectors([outputs[0], outputs[4]], embedder.run(["a dog"] * 2, {}))
    messages = [str(output) for output in outputs[1:4]]
    assert all(isinstance(output, InputError) for output in outputs[1:4])
    assert messages[0] == (f"token id {vocabulary} is outside this model's vocabulary: ids run from 0 to "
                           f"{vocabulary - 1}")
    assert messages[1].startswith("token id -1 is outside")
    assert messages[2].startswith("this input is an empty array of token ids")


def test_too_many_ids_with_truncate_false_are_refused_alone(embedder: EmbeddingRunner) -> None:
    ids = ids_of(embedder, TEXTS)
    outputs = embedder.run(ids, {v.TRUNCATE: False})
    assert isinstance(outputs[LONG], InputError)
    assert str(outputs[LONG]).startswith(f"this input has {ids[LONG].size} tokens and the model takes at most 128")
    assert_same_vectors([outputs[0], outputs[1]], embedder.run(TEXTS[:2], {}))


def test_a_prompt_cannot_go_before_ids(embedder: EmbeddingRunner) -> None:
    """A named prompt refuses the ids alone (the texts of the request take it); an empty prompt is no prompt."""
    (ids,) = ids_of(embedder, ["a dog"])
    outputs = embedder.run([ids, "a dog"], {v.PROMPT_NAME: "query"})
    assert isinstance(outputs[0], InputError) and "a prompt cannot go before token ids" in str(outputs[0])
    assert_same_vectors([outputs[1]], embedder.run(["a dog"], {v.PROMPT_NAME: "query"}))
    assert_same_vectors(embedder.run([ids], {v.PROMPT_NAME: "none"}), embedder.run(["a dog"], {}))
    prompted_ids = ids_of(embedder, ["a dog"], {v.PROMPT_NAME: "query"})  # the sender's prompt, in the ids
    assert_same_vectors(embedder.run(prompted_ids, {}), embedder.run(["a dog"], {v.PROMPT_NAME: "query"}))


def test_a_default_prompt_refuses_ids(models: Path) -> None:
    folder = with_prompts(make_tiny_bert(models / "default", "feature-extraction"), {"query": "query: "},
                          default="query")
    runner = load_runner(ModelSpec("tiny-default", folder))
    assert isinstance(runner, EmbeddingRunner)
    (refused,) = runner.run(ids_of(runner, ["a dog"]), {})
    assert isinstance(refused, InputError) and "the model's default prompt" in str(refused)


@pytest.mark.parametrize(("inputs", "start"), [
    ([np.zeros(3, dtype=np.float32)], "inputs[0] is a 1-dimensional float32 array; embeddings takes strings, or "
                                      "token ids"),
    (["a", np.zeros((2, 2), dtype=np.int64)], "inputs[1] is a 2-dimensional int64 array; embeddings takes"),
    ([np.zeros(3, dtype=np.bool_)], "inputs[0] is a 1-dimensional bool array"),
    ([[1, 2]], "inputs[0] is an array of 2 item(s): int, int; embeddings takes strings, or token ids"),
])
def test_other_arrays_refuse_the_request(inputs: list[Any], start: str) -> None:
    for task in (v.EMBEDDINGS, v.SPARSE_EMBEDDINGS):
        with pytest.raises(InputError) as refused:
            check_request(task, v.RUN, inputs)
        assert str(refused.value).startswith(start.replace("embeddings takes", f"{task} takes"))


def test_only_embeddings_models_run_ids() -> None:
    ids = [np.asarray([CLS, 5, SEP])]
    check_request(v.EMBEDDINGS, v.EMBED_ALL, ids)
    check_request(v.EMBEDDINGS, v.DECODE, ids)
    for task, operation in ((v.RERANK, v.RUN), ("text-classification", v.RUN), (v.EMBEDDINGS, v.TOKENIZE),
                            ("fill-mask", v.RUN)):
        with pytest.raises(InputError, match=r"token ids are taken by 'decode', and by the 'run' of embeddings"):
            check_request(task, operation, ids)


# ------------------------------------------------------- a tokenizer for the edge (zbatch/client/tokenizing.py)


def edge_ids(runner: TextRunner, texts: list[str]) -> tuple[list[np.ndarray], str]:
    """The texts' ids as a gateway makes them from what the ``tokenizer`` operation gives, and the fingerprint."""
    from tokenizers import Tokenizer

    fingerprint = runner.details.tokenizer
    (serialized,) = operation_of(runner, v.TOKENIZER)([fingerprint], {})
    assert payloads.tokenizer_fingerprint(serialized) == fingerprint
    encoder = TextEncoder(Tokenizer.from_str(serialized))
    encoder.limit(None)  # as zbatch/client/tokenizing.py loads it
    encoded = encoder(texts)
    return [np.asarray(each.ids, dtype=np.int32) for each in encoded], fingerprint


def test_the_text_encoder_gives_the_same_ids_and_types_as_the_whole_encoding(embedder: EmbeddingRunner) -> None:
    """What the worker and the gateway call, on the tokenizer the worker serves: ids and token types as
    ``encode_batch`` makes them, for texts and pairs, truncated or not (tests/zbatch/test_texts.py: every rule)."""
    from tokenizers import Tokenizer

    fingerprint = embedder.details.tokenizer
    (serialized,) = operation_of(embedder, v.TOKENIZER)([fingerprint], {})
    tokenizer = Tokenizer.from_str(serialized)
    encoder = TextEncoder(tokenizer)
    pairs = [(text, TEXTS[index - 1]) for index, text in enumerate(TEXTS)]
    for limit in (None, 16):
        encoder.limit(limit)
        for inputs in (["Mixed CASE, naïve", "[MASK] Tab\tTab"], TEXTS, pairs):
            fast, plain = encoder(inputs), tokenizer.encode_batch(inputs)
            assert [(each.ids, each.type_ids) for each in fast] == [(each.ids, each.type_ids) for each in plain]
    assert any(len(each.ids) == 16 for each in fast)


def test_edge_ids_run_to_the_texts_vectors_and_counts(embedder: EmbeddingRunner) -> None:
    ids, fingerprint = edge_ids(embedder, TEXTS)
    assert ids[LONG].size > embedder.max_length  # untruncated: the worker truncates them as it would the text
    for parameters in ({}, {v.TRUNCATION_DIRECTION: "left"}, {v.DIMENSIONS: 8, v.NORMALIZE: False}):
        from_text = embedder.run(TEXTS, parameters)
        from_ids = embedder.run(ids, parameters | {v.TOKENIZED_BY: fingerprint})
        assert_same_vectors(from_ids, from_text)
        assert from_ids.tokens == from_text.tokens  # type: ignore[attr-defined]
    (refused,) = embedder.run([ids[LONG]], {v.TRUNCATE: False, v.TOKENIZED_BY: fingerprint})
    assert isinstance(refused, InputError) and str(refused) == str(embedder.run([TEXTS[LONG]], {v.TRUNCATE: False})[0])


def test_the_edge_tokenizer_lowercases_where_the_models_modules_ask(models: Path) -> None:
    folder = with_st_modules(make_tiny_qwen3(models / "lowercased"), "lasttoken", do_lower_case=True)
    runner = load_runner(ModelSpec("tiny-lowercased", folder))
    assert isinstance(runner, EmbeddingRunner)
    texts = ["Hello World", "the CAT"]
    (shouted, quiet), fingerprint = edge_ids(runner, [texts[0], texts[0].lower()])
    assert shouted.tolist() == quiet.tolist()
    ids, _ = edge_ids(runner, texts)
    assert_same_vectors(runner.run(ids, {v.TOKENIZED_BY: fingerprint}), runner.run(texts, {}))


def test_ids_from_another_tokenizer_are_refused(embedder: EmbeddingRunner) -> None:
    ids, fingerprint = edge_ids(embedder, TEXTS[:1])
    other = "0" * 16
    with pytest.raises(InputError, match=f"tokenized with tokenizer '{other}' and this worker's model 'tiny' uses "
                                         f"{fingerprint}: send the texts"):
        embedder.run(ids, {v.TOKENIZED_BY: other})
    (answer,) = operation_of(embedder, v.TOKENIZER)([other], {})
    assert isinstance(answer, InputError) and f"this worker's tokenizer is {fingerprint}, not '{other}'" in str(answer)


def test_models_whose_ids_are_not_their_texts_announce_no_tokenizer(models: Path) -> None:
    prompted = with_prompts(make_tiny_bert(models / "edge-default", "feature-extraction"), {"query": "query: "},
                            default="query")
    classifier = make_tiny_bert(models / "edge-classifier", "text-classification")
    for runner in (load_runner(ModelSpec("tiny-default", prompted)),
                   load_runner(ModelSpec("tiny-classifier", classifier, "text-classification"))):
        assert isinstance(runner, TextRunner) and runner.details.tokenizer == ""
        with pytest.raises(InputError, match="announces no tokenizer to tokenize with elsewhere"):
            operation_of(runner, v.TOKENIZER)(["0" * 16], {})
        with pytest.raises(InputError, match="unknown parameter"):
            runner.run(["a dog"], {v.TOKENIZED_BY: "0" * 16})
