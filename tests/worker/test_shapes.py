"""Accelerator shapes: buckets, bucketed plans (their filler rows never reach an answer), the graphed BERT pass,
and the device defaults (dtype, batch size).

The bucket path is what a runner takes on CUDA; here it is switched on for a runner on the CPU, which is the
only thing that differs, so its plans and outputs are checked against the plain ones with real models.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy as np
import pytest
import torch

from tests.worker.tiny_models import make_tiny_bert, with_st_modules
from worker.runners import ModelSpec, default_model_path, load_runner
from worker.runners.device import batch_size, torch_dtype
from worker.runners.embeddings import EmbeddingRunner
from worker.runners.graphs import bert_pooled, graphable
from worker.runners.pooling import SentenceHead, without_prompt
from worker.runners.shapes import LENGTHS, Buckets
from worker.runners.st_modules import POOLING_MODES, Pooling, SentenceModules, read_modules
from worker.runners.text import Planned, TextRunner

TEXTS = ["hello world", "the cat is happy", "", "a dog and a cat in the night " * 3, "big", "red " * 40]


@pytest.fixture(scope="module")
def minilm() -> TextRunner:
    runner = load_runner(ModelSpec("minilm", default_model_path()))
    assert isinstance(runner, TextRunner)
    return runner


@pytest.fixture(scope="module")
def reranker(tmp_path_factory: pytest.TempPathFactory) -> TextRunner:
    runner = load_runner(ModelSpec("rerank", make_tiny_bert(tmp_path_factory.mktemp("rr"), "rerank"), "rerank"))
    assert isinstance(runner, TextRunner)
    return runner


def test_lengths_and_rows_round_up_to_few_buckets_within_the_model_and_batch() -> None:
    buckets = Buckets(max_length=256, max_rows=128)
    assert [buckets.length(n) for n in (1, 16, 17, 33, 65, 129, 200, 256, 300)] == [
        16, 16, 32, 48, 96, 192, 256, 256, 256]
    assert [buckets.rows(n) for n in (1, 2, 3, 5, 33, 100, 128)] == [1, 2, 4, 8, 64, 128, 128]
    assert buckets.lengths == [16, 32, 48, 64, 96, 128, 192, 256]
    assert buckets.row_counts == [1, 2, 4, 8, 16, 32, 64, 128]
    shapes = buckets.shapes()
    assert len(shapes) == 64 and shapes[0] == (128, 256) and shapes[-1] == (1, 16)
    assert all(buckets.length(n) >= n for n in range(1, 257)) and all(buckets.rows(n) >= n for n in range(1, 129))


def test_buckets_end_at_the_models_own_maximum_and_batch_size() -> None:
    buckets = Buckets(max_length=100, max_rows=48)
    assert buckets.lengths == [16, 32, 48, 64, 96, 100] and buckets.length(97) == 100
    assert buckets.row_counts == [1, 2, 4, 8, 16, 32, 48] and buckets.rows(40) == 48
    assert Buckets(max_length=8, max_rows=1).shapes() == [(1, 8)]
    assert max(LENGTHS) >= 8192  # long-context encoders still get buckets
    with pytest.raises(ValueError, match="positive"):
        Buckets(0, 1)


def test_a_token_budget_leaves_out_the_buckets_over_it_but_one_input_always_runs() -> None:
    buckets = Buckets(max_length=256, max_rows=128, max_tokens=1024)
    shapes = buckets.shapes()
    assert all(rows * length <= 1024 for rows, length in shapes if rows > 1)
    assert (64, 16) in shapes and (64, 32) not in shapes and (4, 256) in shapes and (8, 256) not in shapes
    assert {(1, length) for length in buckets.lengths} <= set(shapes), "an input alone runs however long"
    assert set(shapes) < set(Buckets(256, 128).shapes())
    assert buckets.padded_tokens(3, 20) == 4 * 32
    with pytest.raises(ValueError, match="budget >= 0"):
        Buckets(256, 128, -1)


def test_a_bucketed_plan_within_a_budget_runs_passes_that_were_warmed(minilm: TextRunner) -> None:
    runner = minilm
    plain = runner.run(TEXTS, {})
    spec = runner.spec
    runner.spec = dataclasses.replace(spec, max_batch_tokens=64)
    runner.buckets = Buckets(runner.max_length, 8, 64)
    runner.set_length_grouping(False)
    try:
        planned = runner.plan(runner.encode(TEXTS, {}), {})
        assert len(planned.groups) > 1 and sorted(i for group, _ in planned.groups for i in group) == list(
            range(len(TEXTS)))
        for group, arrays in planned.groups:
            shape = arrays["input_ids"].shape
            assert shape in runner.buckets.shapes(), "every pass runs a shape warm-up ran"
            assert len(group) == 1 or shape[0] * shape[1] <= 64
        budgeted = runner.run_planned(planned)
    finally:
        runner.spec, runner.buckets = spec, None
        runner.set_length_grouping(True)
    for mine, theirs in zip(budgeted, plain, strict=True):
        assert np.allclose(mine, theirs, atol=1e-5)


@pytest.mark.parametrize("fixture", ["minilm", "reranker"])
def test_a_bucketed_plan_pads_to_its_bucket_and_answers_exactly_the_plain_outputs(
        fixture: str, request: pytest.FixtureRequest) -> None:
    runner: TextRunner = request.getfixturevalue(fixture)
    inputs: list[object] = list(TEXTS) if fixture == "minilm" else [["is it", text] for text in TEXTS]
    plain = runner.run(inputs, {})
    runner.buckets = Buckets(runner.max_length, 8)
    runner.set_length_grouping(False)  # on the CPU the embedder would pack; on CUDA it never does
    try:
        planned = runner.plan(runner.encode(inputs, {}), {})
        assert isinstance(planned, Planned) and not planned.packed and len(planned.groups) == 1
        ((group, arrays),) = planned.groups
        assert group == list(range(len(inputs)))
        longest = max(planned.tokens)
        assert arrays["input_ids"].shape == (8, runner.buckets.length(longest))
        assert arrays["attention_mask"][len(inputs):].sum(axis=1).tolist() == [1, 1]  # filler: one real token
        bucketed = runner.run_planned(planned)
    finally:
        runner.buckets = None
        runner.set_length_grouping(True)
    assert len(bucketed) == len(plain) and bucketed.tokens == plain.tokens  # type: ignore[attr-defined]
    for mine, theirs in zip(bucketed, plain, strict=True):
        assert np.allclose(np.asarray(mine, dtype=np.float64), np.asarray(theirs, dtype=np.float64), atol=1e-5)


def test_warm_up_runs_every_bucket_once(minilm: TextRunner, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[int, ...]] = []
    forward = minilm._forward

    def recording(encoded: dict[str, torch.Tensor], options: object) -> list[object]:
        seen.append(tuple(encoded["input_ids"].shape))
        return forward(encoded, options)

    monkeypatch.setattr(minilm, "_forward", recording)
    minilm.buckets = Buckets(64, 4)
    try:
        minilm.warm_up()
    finally:
        minilm.buckets = None
        minilm.warm_up()  # calibrated again for the tests after this one
    assert set(Buckets(64, 4).shapes()) <= set(seen)


class StandInGraphs:
    """Stands in for :class:`worker.runners.graphs.GraphedPooling`, which needs CUDA (none here): records the shapes
    it is asked to capture, and captures them all, or none (a failed capture)."""

    def __init__(self, captures: bool) -> None:
        self.captures = captures
        self.asked: list[tuple[int, int]] = []

    def capture(self, shapes: list[tuple[int, int]]) -> None:
        self.asked = list(shapes)

    @property
    def shapes(self) -> list[tuple[int, int]]:
        return sorted(self.asked) if self.captures else []

    def pooled(self, encoded: dict[str, torch.Tensor], pool_mask: torch.Tensor | None = None) -> None:
        return None  # the eager pass answers: what is tested is which shapes warm-up runs through it


@pytest.mark.parametrize("captures", [True, False])
def test_shapes_that_graphs_capture_are_not_also_warmed_eagerly(minilm: TextRunner, captures: bool,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """A capture runs each shape itself before recording it; the eager pass warms them only if capture failed."""
    assert isinstance(minilm, EmbeddingRunner)
    seen: list[tuple[int, ...]] = []
    forward = minilm._forward

    def recording(encoded: dict[str, torch.Tensor], options: Any) -> list[Any]:
        seen.append(tuple(encoded["input_ids"].shape))
        return forward(encoded, options)

    graphs = StandInGraphs(captures)
    monkeypatch.setattr(minilm, "_forward", recording)
    monkeypatch.setattr(minilm, "_graphs", graphs)
    monkeypatch.setattr(minilm, "_packer", None)  # as on an accelerator by default (--unpadded-attention off)
    minilm.buckets = Buckets(64, 4)
    try:
        minilm.warm_up()
    finally:
        minilm.buckets = None
    assert graphs.asked == Buckets(64, 4).shapes()
    warmed = set(Buckets(64, 4).shapes()) & set(seen) - {(1, 16)}  # (1, 16): the tiny warm-up batch's bucket
    assert warmed == (set() if captures else set(Buckets(64, 4).shapes()) - {(1, 16)})


def graphed_heads(runner: EmbeddingRunner, folder: Path) -> dict[str, SentenceHead]:
    """The runner's own head, each pooling mode, two concatenated, and a Dense without Normalize (written in
    ``folder``, beside a copy of the model's config)."""
    size = int(runner._model.config.hidden_size)
    heads = {mode: SentenceHead(SentenceModules(Pooling((mode,))), size, "cpu") for mode in POOLING_MODES}
    heads["cls+max"] = SentenceHead(SentenceModules(Pooling(("cls", "max"))), size, "cpu")
    folder.mkdir()
    shutil.copy(Path(runner.spec.path) / "config.json", folder)
    dense = with_st_modules(str(folder), "lasttoken", dense=[(8, "torch.nn.modules.activation.GELU")],
                            normalize=False)
    return {"own": runner.head, **heads, "lasttoken+Dense": SentenceHead(read_modules(dense), size, "cpu")}


def test_the_graphed_pass_is_the_models_own_pass(minilm: TextRunner, tmp_path: Path) -> None:
    """What a CUDA graph records (worker.runners.graphs.bert_pooled) equals transformers' forward through the
    model's head: each pooling mode, a Dense, and a pooling mask that leaves out a prompt."""
    tiny = load_runner(ModelSpec("tiny", make_tiny_bert(tmp_path, "feature-extraction")))
    for runner in (minilm, tiny):
        assert isinstance(runner, EmbeddingRunner) and graphable(runner._model)
        heads = graphed_heads(runner, tmp_path / f"{runner.spec.name}-head")
        runner.set_length_grouping(False)
        try:
            planned = runner.plan(runner.encode(TEXTS, {}), {})
        finally:
            runner.set_length_grouping(True)
        for group, arrays in planned.groups:
            encoded = {key: torch.from_numpy(array) for key, array in arrays.items()}
            mask = encoded["attention_mask"]
            types = encoded.get("token_type_ids", torch.zeros_like(encoded["input_ids"]))
            for name, head in heads.items():
                for pool_mask in (None, without_prompt(mask, 2)):
                    with torch.inference_mode():
                        want = head(runner._model(**encoded).last_hidden_state, mask, pool_mask)
                        got = bert_pooled(runner._model, head, encoded["input_ids"], types, mask, pool_mask)
                    assert got.dtype == torch.float32 and got.shape == (len(group), head.dimensions), name
                    assert torch.allclose(got, want, atol=1e-5), name


def test_models_the_graphed_pass_does_not_know_stay_eager(tmp_path: Path) -> None:
    from transformers import AutoModelForMaskedLM

    masked = AutoModelForMaskedLM.from_pretrained(make_tiny_bert(tmp_path, "fill-mask"))
    assert not graphable(masked.eval())  # a head on top: not a bare encoder
    bare = load_runner(ModelSpec("tiny", make_tiny_bert(tmp_path / "bare", "feature-extraction")))
    assert isinstance(bare, EmbeddingRunner)
    assert not graphable(bare._model.train()) and graphable(bare._model.eval())


def test_auto_dtype_is_float32_on_the_cpu_and_half_on_cuda(tmp_path: Path) -> None:
    saved_bf16 = tmp_path / "bf16"
    saved_bf16.mkdir()
    (saved_bf16 / "config.json").write_text(json.dumps({"model_type": "bert", "dtype": "bfloat16"}))
    legacy = tmp_path / "legacy"
    legacy.mkdir()
    (legacy / "config.json").write_text(json.dumps({"model_type": "bert", "torch_dtype": "bfloat16"}))
    assert torch_dtype("auto", "cpu", default_model_path()) is torch.float32
    assert torch_dtype("auto", "cpu", str(saved_bf16)) is torch.float32
    assert torch_dtype("auto", "cuda", default_model_path()) is torch.float16
    assert torch_dtype("auto", "cuda:1", str(saved_bf16)) is torch.bfloat16
    assert torch_dtype("auto", "cuda", str(legacy)) is torch.bfloat16
    assert torch_dtype("auto", "cuda", str(tmp_path / "missing")) is torch.float16
    assert torch_dtype("float32", "cuda") is torch.float32  # asked for: kept


def test_the_default_batch_size_follows_the_device() -> None:
    assert batch_size("cpu") == 32 and batch_size("cuda") == batch_size("cuda:3") == 128
    runner = load_runner(ModelSpec("minilm", default_model_path()))
    assert runner.spec.max_batch_size == 32  # resolved at load from 0, the setting's default
    assert load_runner(ModelSpec("minilm", default_model_path(), max_batch_size=7)).spec.max_batch_size == 7


class OwnSpecRunner(EmbeddingRunner):
    """A custom runner (``python:`` task) that builds a spec of its own, without the batch size."""

    def __init__(self, spec: ModelSpec, device: str, dtype: torch.dtype) -> None:
        super().__init__(ModelSpec(spec.name, spec.path), device, dtype)


def test_a_custom_runner_with_a_spec_of_its_own_still_gets_the_resolved_batch_size() -> None:
    """Else the worker would announce batches of 0, which the broker refuses, and never register."""
    runner = load_runner(ModelSpec("own", default_model_path(), task=f"python:{__name__}:OwnSpecRunner"))
    assert type(runner) is OwnSpecRunner and runner.spec.max_batch_size == 32
