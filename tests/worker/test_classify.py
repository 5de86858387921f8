"""worker.runners.classify on tiny BERTs built on disk: a cross-encoder for ``rerank``, a text classifier.

Scores are checked against the model run directly by transformers, one pair at a time.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import pytest

from tests.worker.tiny_models import make_tiny_bert
from worker.runners import InputError, ModelSpec, Outputs, check_request, load_runner
from worker.runners.classify import SequenceClassifier

PAIRS = [["hello", "hello world"], ["what is red", "the cat is red " * 40], ["a", ""], ["dog", "a big dog runs"]]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("classify")


@pytest.fixture(scope="module")
def reranker(models: Path) -> SequenceClassifier:
    runner = load_runner(ModelSpec("tiny-rerank", make_tiny_bert(models, "rerank"), task="rerank"))
    assert isinstance(runner, SequenceClassifier)
    return runner


def logits_one_at_a_time(path: str, inputs: list[Any]) -> list[list[float]]:
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForSequenceClassification.from_pretrained(path).eval()
    rows = []
    for item in inputs:
        texts = [[item]] if isinstance(item, str) else [[item[0]], [item[1]]]  # lists: ("a", "") is still a pair
        encoded = tokenizer(*texts, truncation=True, max_length=128, return_tensors="pt")
        with torch.inference_mode():
            rows.append(model(**encoded).logits[0].tolist())
    return rows


def test_rerank_scores_are_the_sigmoid_of_the_logit_with_tokens_per_pair(reranker: SequenceClassifier,
                                                                          models: Path) -> None:
    import torch
    from transformers import AutoTokenizer

    logits = [row[0] for row in logits_one_at_a_time(str(models / "tiny-bert-rerank"), PAIRS)]
    scores = reranker.run(PAIRS, {})
    raw = reranker.run(PAIRS, {"raw_scores": True})
    assert isinstance(scores, Outputs) and all(type(score) is float for score in scores)
    assert scores == pytest.approx(torch.sigmoid(torch.tensor(logits)).tolist(), abs=1e-5)
    assert raw == pytest.approx(logits, abs=1e-5)
    tokenizer = AutoTokenizer.from_pretrained(models / "tiny-bert-rerank")
    want = [len(ids) for ids in tokenizer([p[0] for p in PAIRS], [p[1] for p in PAIRS], truncation=True,
                                          max_length=128)["input_ids"]]
    assert scores.tokens == want and want[1] == 128


def test_rerank_truncate_false_refuses_the_long_pair_alone(reranker: SequenceClassifier) -> None:
    outputs = reranker.run(PAIRS, {"truncate": False})
    assert isinstance(outputs[1], InputError) and "at most 128" in str(outputs[1])
    assert [type(output) for i, output in enumerate(outputs) if i != 1] == [float, float, float]


def test_rerank_announces_no_labels(reranker: SequenceClassifier) -> None:
    assert (reranker.details.max_length, reranker.details.labels, reranker.details.dtype) == (128, (), "float32")


@pytest.mark.parametrize(("inputs", "parameters", "complaint"), [
    (["just a text"], {}, "inputs[0] is str; rerank takes [query, text] pairs"),
    ([["a", "b", "c"]], {}, "inputs[0] is an array of 3 item(s)"),
    ([["a", 1]], {}, "inputs[0] is an array of 2 item(s): str, int"),
    ([["a", "b"]], {"top_k": 1}, "unknown parameter(s) 'top_k' for rerank; use only 'raw_scores', 'truncate'"),
    ([["a", "b"]], {"raw_scores": "yes"}, "'raw_scores' must be true or false"),
])
def test_rerank_refuses_what_it_cannot_use(reranker: SequenceClassifier, inputs: list[Any],
                                           parameters: dict[str, Any], complaint: str) -> None:
    with pytest.raises(InputError) as refusal:
        reranker.run(inputs, parameters)
    assert complaint in str(refusal.value)


def test_a_request_of_the_wrong_kind_is_refused_with_its_own_index() -> None:
    with pytest.raises(InputError, match=r"inputs\[2\] is str; rerank takes \[query, text\] pairs"):
        check_request("rerank", "run", [["q", "a"], ["q", "b"], "c"])
    with pytest.raises(InputError, match=r"inputs\[1\] is bytes; text-classification takes strings, or"):
        check_request("text-classification", "run", ["a", b"b"])
    with pytest.raises(InputError, match=r"inputs\[0\] is str; image-classification takes images"):
        check_request("image-classification", "run", ["a"])
    with pytest.raises(InputError, match="object-detection models have no tokenizer"):
        check_request("object-detection", "tokenize", ["a"])
    check_request("rerank", "tokenize", ["texts, not pairs"])
    check_request("python:my.module:Runner", "run", [1, b"", None])


def test_a_classifier_is_refused_for_rerank(models: Path) -> None:
    path = make_tiny_bert(models, "text-classification")
    with pytest.raises(ValueError, match=r"rerank needs a cross-encoder with one output.*has 2 labels"):
        load_runner(ModelSpec("two-labels", path, task="rerank"))


def test_text_classification_takes_texts_and_pairs_and_scores_every_label(models: Path) -> None:
    import torch

    path = make_tiny_bert(models, "text-classification")
    runner = load_runner(ModelSpec("tiny-cls", path, task="text-classification"))
    inputs: list[Any] = ["hello world", ["the cat", "a dog"], "red " * 300]
    logits = logits_one_at_a_time(path, inputs)
    outputs = runner.run(inputs, {})
    raw = runner.run(inputs, {"raw_scores": True, "top_k": 1})
    assert isinstance(outputs, Outputs) and outputs.tokens == [4, 7, 128]
    for labels, best, row in zip(outputs, raw, logits, strict=True):
        probabilities = torch.softmax(torch.tensor(row), dim=0).tolist()
        want = sorted(({"label": name, "score": p} for name, p in zip(("negative", "positive"), probabilities,
                                                                       strict=True)), key=lambda x: -x["score"])
        assert [label["label"] for label in labels] == [label["label"] for label in want]
        assert [label["score"] for label in labels] == pytest.approx([label["score"] for label in want], abs=1e-5)
        assert len(best) == 1 and best[0]["score"] == pytest.approx(max(row), abs=1e-5)
    assert runner.details.labels == ("negative", "positive")  # type: ignore[attr-defined]
    with pytest.raises(InputError, match="'top_k' must be a whole number"):
        runner.run(["a"], {"top_k": 0})
