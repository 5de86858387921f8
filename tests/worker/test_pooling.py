"""Issue 39, point 2: each pooling mode, Dense, Normalize, max_seq_length and do_lower_case as the model's
sentence-transformers modules declare them, against sentence-transformers itself, on tiny models built on disk
(a BERT encoder, a Qwen3 decoder with left padding), on every path the worker runs: torch packed, torch padded,
padded to accelerator buckets, and ONNX Runtime.  And the refusal of a module zbatch cannot run."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy as np
import pytest

from tests.worker.tiny_models import make_tiny_bert, make_tiny_qwen3, with_prompts, with_st_modules
from worker.runners import ModelSpec, load_runner
from worker.runners.embeddings import EmbeddingRunner
from worker.runners.shapes import Buckets
from worker.runners.st_modules import UnsupportedModule, read_modules
from zbatch.protocol.vocabulary import PROMPT_NAME

MIN_COSINE = 0.9999
TEXTS = ["hello world", "the cat is happy", "a", "", "red " * 300, "a dog and a cat in the night " * 3]
PROMPTS = {"query": "query: ", "passage": "passage: the "}
MODES = ["cls", "max", "mean", "mean_sqrt_len_tokens", "weightedmean", "lasttoken"]
TANH, IDENTITY = "torch.nn.modules.activation.Tanh", "torch.nn.modules.linear.Identity"


def cosines(first: Sequence[Any] | np.ndarray, second: Sequence[Any] | np.ndarray) -> np.ndarray:
    a = np.stack([np.asarray(x, np.float64) for x in first])
    b = np.stack([np.asarray(x, np.float64) for x in second])
    found: np.ndarray = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
    return found


def norms(vectors: Sequence[Any] | np.ndarray) -> np.ndarray:
    found: np.ndarray = np.linalg.norm(np.stack([np.asarray(x, np.float64) for x in vectors]), axis=1)
    return found


def sentence_transformers(folder: str, texts: list[str] = TEXTS, **options: Any) -> np.ndarray:
    """What sentence-transformers encodes from the folder (batches of 4: padded batches of mixed lengths)."""
    from sentence_transformers import SentenceTransformer

    vectors: np.ndarray = np.asarray(SentenceTransformer(folder, device="cpu").encode(texts, batch_size=4, **options))
    return vectors


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("pooling")


@pytest.fixture(scope="module")
def onnx_cache(tmp_path_factory: pytest.TempPathFactory) -> str:
    """One export cache: the tiny BERTs share their weights, so they share one export."""
    return str(tmp_path_factory.mktemp("onnx"))


def serve(folder: str, runtime: str, onnx_cache: str) -> EmbeddingRunner:
    runner = load_runner(ModelSpec("m", folder, runtime=runtime, onnx_cache=onnx_cache))
    assert isinstance(runner, EmbeddingRunner)
    assert runtime == "torch" or runner.runtime.startswith("onnxruntime")  # type: ignore[attr-defined]
    return runner


def every_path(runner: EmbeddingRunner, texts: list[str] = TEXTS,
               parameters: dict[str, Any] | None = None) -> dict[str, list[Any]]:
    """The runner's vectors on each path its batches take: as it plans them (packed for a BERT on torch, else
    length groups), one padded pass, and padded to accelerator buckets with filler rows."""
    parameters = parameters or {}
    answers = {"planned": runner.run(texts, parameters)}
    runner.set_length_grouping(False)
    try:
        answers["padded"] = runner.run(texts, parameters)
        runner.buckets = Buckets(runner.max_length, 8)
        answers["bucketed"] = runner.run(texts, parameters)
    finally:
        runner.buckets = None
        runner.set_length_grouping(True)
    return answers


def assert_matches(answers: dict[str, list[Any]], expected: np.ndarray) -> None:
    for path, got in answers.items():
        assert cosines(got, expected).min() >= MIN_COSINE, path
        np.testing.assert_allclose(norms(got), norms(expected), rtol=1e-4, err_msg=path)


@pytest.mark.parametrize("modes", [*MODES, ("cls", "mean")], ids=str)
def test_each_pooling_mode_matches_sentence_transformers(models: Path, onnx_cache: str, modes: Any) -> None:
    """Each mode on every path, and two modes concatenated as the older per-mode flags declare them."""
    name = modes if isinstance(modes, str) else "+".join(modes)
    folder = with_st_modules(make_tiny_bert(models / name, "feature-extraction"), modes,
                             legacy=isinstance(modes, tuple))
    expected = sentence_transformers(folder)
    torch_runner = serve(folder, "torch", onnx_cache)
    assert torch_runner.dimensions == 32 * (1 if isinstance(modes, str) else len(modes)) == expected.shape[1]
    assert_matches(every_path(torch_runner), expected)
    assert_matches(every_path(serve(folder, "onnx", onnx_cache)), expected)


@pytest.fixture(scope="module")
def decoder(models: Path) -> str:
    """A Qwen3 decoder pooled on its last token (its end-of-text token), padded on the left."""
    return with_st_modules(make_tiny_qwen3(models / "decoder"), "lasttoken")


def test_a_decoder_pools_its_last_token_with_left_padding(decoder: str, onnx_cache: str) -> None:
    expected = sentence_transformers(decoder)
    runner = serve(decoder, "torch", onnx_cache)
    assert runner._tokenizer.padding_side == "left"
    runner.set_length_grouping(False)
    try:
        (_, arrays), = runner.plan(runner.encode(TEXTS, {}), {}).groups
    finally:
        runner.set_length_grouping(True)
    mask = arrays["attention_mask"]
    assert len(set(mask.sum(1))) > 2 and mask[:, -1].all() and not mask[:, 0].all()  # left padded, mixed lengths
    assert_matches(every_path(runner), expected)
    alone = [runner.run([text], {})[0] for text in TEXTS]
    assert cosines(alone, expected).min() >= MIN_COSINE
    assert_matches(every_path(serve(decoder, "onnx", onnx_cache)), expected)


@pytest.mark.parametrize("make", [make_tiny_bert, make_tiny_qwen3], ids=["bert", "qwen3"])
def test_a_prompt_is_left_out_of_the_pooling_where_the_model_says_so(models: Path, onnx_cache: str,
                                                                      make: Any) -> None:
    where = models / f"prompted-{make.__name__}"
    model = make_tiny_bert(where, "feature-extraction") if make is make_tiny_bert else make_tiny_qwen3(where)
    folder = with_prompts(with_st_modules(model, "mean", include_prompt=False), PROMPTS)
    runners = [serve(folder, "torch", onnx_cache), serve(folder, "onnx", onnx_cache)]
    for name in PROMPTS:
        expected = sentence_transformers(folder, prompt_name=name)
        for runner in runners:
            assert_matches(every_path(runner, parameters={PROMPT_NAME: name}), expected)
    included = sentence_transformers(with_st_modules(folder, "mean"), prompt_name="query")
    assert cosines(runners[0].run(TEXTS, {PROMPT_NAME: "query"}), included).min() < 0.999  # it does differ


def test_dense_layers_without_normalize_within_max_seq_length(models: Path, onnx_cache: str,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    folder = with_st_modules(make_tiny_bert(models / "dense", "feature-extraction"), "cls",
                             dense=[(16, TANH), (8, IDENTITY)], normalize=False, max_seq_length=12)
    expected = sentence_transformers(folder)
    with caplog.at_level(logging.INFO, "zbatch.worker"):
        runners = [serve(folder, "torch", onnx_cache), serve(folder, "onnx", onnx_cache)]
    assert ("model m: cls pooling, Dense 32->16 (Tanh), Dense 16->8 (Identity), not normalized (as its "
            "sentence-transformers modules declare)") in caplog.text
    assert not np.allclose(norms(expected), 1.0, atol=1e-3)
    for runner in runners:
        assert runner.dimensions == runner.details.dimensions == 8 and runner.max_length == 12
        assert max(runner.run(TEXTS, {}).tokens) == 12  # type: ignore[attr-defined]
        assert_matches(every_path(runner), expected)
        normalized = runner.run(TEXTS, {"normalize": True})  # asked for: unit length all the same
        np.testing.assert_allclose(norms(normalized), 1.0, rtol=1e-5)
        assert cosines(normalized, expected).min() >= MIN_COSINE


def test_do_lower_case_lowercases_before_the_tokenizer(models: Path, onnx_cache: str) -> None:
    folder = with_st_modules(make_tiny_qwen3(models / "lowercased"), "mean", do_lower_case=True)
    texts = ["Hello World", "THE CAT is happy", "hello world"]
    runner = serve(folder, "torch", onnx_cache)
    got = runner.run(texts, {})
    np.testing.assert_allclose(got[0], got[2], atol=1e-6)
    assert cosines(got, sentence_transformers(folder, texts)).min() >= MIN_COSINE


def test_a_model_without_modules_is_mean_pooled_and_normalized_and_says_so(
        models: Path, onnx_cache: str, caplog: pytest.LogCaptureFixture) -> None:
    folder = make_tiny_bert(models / "plain", "feature-extraction")
    with caplog.at_level(logging.INFO, "zbatch.worker"):
        runner = serve(folder, "torch", onnx_cache)
    assert ("model m: mean pooling, normalized (zbatch's default: the folder has no modules.json, so it declares "
            "no pooling)") in caplog.text
    assert_matches(every_path(runner), sentence_transformers(folder, normalize_embeddings=True))


def edit_json(path: Path, change: Any) -> None:
    """Rewrite a JSON file after ``change`` has changed its data in place."""
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


REFUSED: dict[str, tuple[dict[str, Any], tuple[str, Any] | None, str]] = {  # written, then edited: refused as
    "an unknown module": ({"extra": ["sentence_transformers.models.LayerNorm"]},
                          None, "'sentence_transformers.models.LayerNorm' (in '3_Extra'), is not one zbatch runs"),
    "an unknown pooling mode": ({"pooling": "attention"}, None, "pooling mode 'attention'"),
    "an unknown activation": ({"dense": [(8, "mymodels.Swish")]}, None, "activation function 'mymodels.Swish'"),
    "a Dense over token vectors": ({"dense": [(8, TANH)]}, ("2_Dense/config.json", lambda config: config.update(
        module_input_name="token_embeddings")), "Dense layers over the sentence_embedding only"),
    "a transformer in a subfolder": ({}, ("modules.json", lambda listed: listed[0].update(path="0_BERT")),
                                     "keeps its Transformer in '0_BERT'"),
    "no pooling": ({}, ("modules.json", lambda listed: listed.pop(1)), "then a Pooling"),
    "a sparse encoder": ({"extra": ["sentence_transformers.sparse_encoder.modules.SpladePooling"]}, None,
                         "serve it with task sparse-embeddings"),
}


@pytest.mark.parametrize("case", REFUSED, ids=str)
def test_a_module_zbatch_cannot_run_is_refused_naming_it(models: Path, case: str) -> None:
    written, edit, message = REFUSED[case]
    folder = with_st_modules(make_tiny_bert(models / case.replace(" ", "-"), "feature-extraction"), **written)
    if edit is not None:
        edit_json(Path(folder) / edit[0], edit[1])
    with pytest.raises(UnsupportedModule, match="zbatch") as refused:
        read_modules(folder)
    assert message in str(refused.value)
    assert "serve" in str(refused.value) or "fix" in str(refused.value) or "move" in str(refused.value)


def test_the_worker_refuses_before_loading_and_a_dense_that_does_not_fit(models: Path) -> None:
    folder = with_st_modules(make_tiny_bert(models / "misfit", "feature-extraction"), "max", dense=[(8, TANH)])
    edit_json(Path(folder) / "1_Pooling" / "config.json", lambda config: config.update(pooling_mode=["max", "cls"]))
    with pytest.raises(ValueError, match="takes 32 numbers, but the modules before it give 64"):
        load_runner(ModelSpec("m", folder))
    with pytest.raises(ValueError, match="pooling mode 'attention'"):
        load_runner(ModelSpec("m", with_st_modules(folder, "attention")))
