"""ONNX Runtime for text models: the export cache, validation against torch, the fallback, threads, int8.

Every model is real: tiny ones built from a config in a temp folder, and the bundled default model.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.worker.tiny_models import make_tiny_bert, make_tiny_longformer
from worker.config import load_config
from worker.runners import DEFAULT_MODEL_NAME, ModelSpec, calibrations, default_model_path, load_runner, verdicts
from worker.runners.onnx_export import META, cache_key, exported
from worker.runners.onnx_session import PACKED_MAX_TOKENS, OrtPacker, session_threads, thread_counts
from worker.runners.runtime import INT8_MIN_COSINE, MIN_COSINE, agreement_with
from zbatch.testing import ROOT

TEXTS = ["hello world", "the cat and the dog run on a day of blue sky", "a",
         " ".join(["good model batch queue worker"] * 60)]  # the last one is truncated


def cosine(a: Any, b: Any) -> float:
    a, b = np.asarray(a, dtype=np.float64).ravel(), np.asarray(b, dtype=np.float64).ravel()
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


def load(path: str, task: str = "embeddings", runtime: str = "onnx", **spec: Any) -> Any:
    return load_runner(ModelSpec(f"m-{runtime}", path, task=task, device="cpu", runtime=runtime, **spec))


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("onnx-models")


@pytest.fixture(scope="module")
def default_pair() -> tuple[Any, Any]:
    """The bundled model on torch and on ONNX Runtime."""
    return load(default_model_path(), runtime="torch"), load(default_model_path(), runtime="auto")


def test_auto_serves_the_default_model_on_onnx_runtime_with_torchs_vectors(default_pair: tuple[Any, Any]) -> None:
    torch_runner, onnx_runner = default_pair
    assert onnx_runner.runtime.startswith("onnxruntime ")
    assert not hasattr(torch_runner, "runtime")
    for parameters in ({}, {"normalize": False}, {"dimensions": 128}):
        expected, got = torch_runner.run(TEXTS, parameters), onnx_runner.run(TEXTS, parameters)
        assert got.tokens == expected.tokens
        assert min(cosine(a, b) for a, b in zip(expected, got, strict=True)) >= MIN_COSINE
    assert len(onnx_runner.run(["alone"], {})[0]) == 384


def test_the_default_model_runs_packed_on_onnx_runtime_in_groups_of_capped_tokens(
        default_pair: tuple[Any, Any]) -> None:
    """Its packed graph validated, so a batch runs with no padding, cut where a group would pass the cap, and
    each input gets torch's vector whichever group it ran in."""
    torch_runner, runner = default_pair
    assert isinstance(runner._packer, OrtPacker)
    texts = [f"text number {index} about the cat and the dog" for index in range(100)] + [" ".join(["word"] * 300)]
    planned = runner.plan(runner.encode(texts, {}), {})
    assert planned.packed and len(planned.groups) >= 3
    sizes = [int(arrays["lengths"].sum()) for _, arrays in planned.groups]
    assert all(size <= PACKED_MAX_TOKENS for size in sizes), sizes
    assert [index for group, _ in planned.groups for index in group] == list(range(len(texts)))
    assert not runner.plan(runner.encode(["one alone"], {}), {}).packed  # the fused padded graph runs it faster
    expected, got = torch_runner.run(texts, {}), runner.run(texts, {})
    assert got.tokens == expected.tokens
    assert min(cosine(a, b) for a, b in zip(expected, got, strict=True)) >= MIN_COSINE


def test_length_groups_serve_onnx_runtime_without_a_packed_graph(default_pair: tuple[Any, Any]) -> None:
    """Where no packed graph serves (here taken away from the runner), a batch of short inputs and one long one
    runs in length groups, calibrated on the ORT sessions."""
    _, runner = default_pair
    packer, runner._packer = runner._packer, None
    try:
        assert runner.cost_model.seconds_per_token > 0
        texts = ["short"] * 15 + [" ".join(["word"] * 200)]
        planned = runner.plan(runner.encode(texts, {}), {})
        assert not planned.packed and len(planned.groups) >= 2
        runner.set_length_grouping(False)
        try:
            assert len(runner.plan(runner.encode(texts, {}), {}).groups) == 1
        finally:
            runner.set_length_grouping(True)
    finally:
        runner._packer = packer


@pytest.mark.parametrize(("head", "task", "inputs", "parameters"), [
    ("rerank", "rerank", [["hello", "hello world"], ["a cat", " ".join(["dog"] * 200)]], {"raw_scores": True}),
    ("text-classification", "text-classification", ["good day", ["bad", "sad night"], "the cat"], {"raw_scores": True}),
])
def test_rerank_and_classification_run_on_onnx_runtime_with_torchs_scores(
        models: Path, head: str, task: str, inputs: list[Any], parameters: dict[str, Any]) -> None:
    path = make_tiny_bert(models, head)
    torch_runner, onnx_runner = load(path, task, runtime="torch"), load(path, task)
    assert onnx_runner.runtime.startswith("onnxruntime ")
    expected, got = torch_runner.run(inputs, parameters), onnx_runner.run(inputs, parameters)
    assert got.tokens == expected.tokens
    if task == "rerank":
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    else:
        for want, have in zip(expected, got, strict=True):
            assert [each["label"] for each in have] == [each["label"] for each in want]
            np.testing.assert_allclose([each["score"] for each in have], [each["score"] for each in want], atol=1e-5)


def graph_entries(cache: Path) -> list[Path]:
    """The exported graphs' folders in a cache, not the start's other records (tests/worker/test_start_cache.py)."""
    return [entry for entry in cache.iterdir() if entry.is_dir() and entry.name not in (verdicts.KIND,
                                                                                          calibrations.KIND)]


def test_the_export_is_cached_and_keyed_on_the_weights(models: Path, tmp_path: Path) -> None:
    path = make_tiny_bert(models, "feature-extraction")
    cache = tmp_path / "cache"
    first = load(path, onnx_cache=str(cache))
    entries = graph_entries(cache)
    assert len(entries) == 1 and (entries[0] / META).is_file()
    written = (entries[0] / META).stat().st_mtime_ns
    second = load(path, onnx_cache=str(cache))
    assert graph_entries(cache) == entries
    assert (entries[0] / META).stat().st_mtime_ns == written  # reused, not exported again
    assert second.run(TEXTS, {})[0] == pytest.approx(first.run(TEXTS, {})[0], abs=1e-6)
    key = cache_key(path, "last_hidden_state")
    weights = Path(path) / "model.safetensors"
    weights.write_bytes(weights.read_bytes() + b"")  # the same bytes: the same key
    assert cache_key(path, "last_hidden_state") == key
    (Path(path) / "config.json").write_text((Path(path) / "config.json").read_text().replace("}", ' }', 1))
    assert cache_key(path, "last_hidden_state") != key  # another config: another export
    assert cache_key(path, "logits") != cache_key(path, "last_hidden_state")


EXPORT_ONE = """
import logging, sys
logging.basicConfig(level=logging.INFO, format="%(message)s")
from transformers import AutoModel
from worker.runners.onnx_export import exported
model = AutoModel.from_pretrained(sys.argv[1]).eval()
names = ["input_ids", "token_type_ids", "attention_mask"]
entry = exported(model, sys.argv[1], "last_hidden_state", names, sys.argv[2])
print("ENTRY", entry.folder, ",".join(entry.graphs))
"""


def test_workers_starting_together_export_once(models: Path, tmp_path: Path) -> None:
    """Two processes asking for the same model's graphs at once: one exports, the other waits and reuses it."""
    path = make_tiny_bert(models, "feature-extraction")
    cache = tmp_path / "shared"
    env = os.environ | {"PYTHONPATH": str(ROOT)}
    processes = [subprocess.Popen([sys.executable, "-c", EXPORT_ONE, path, str(cache)], env=env, cwd=ROOT,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for _ in range(2)]
    outputs = [process.communicate(timeout=240)[0] for process in processes]
    assert [process.returncode for process in processes] == [0, 0], outputs
    entries = {line.split()[1] for output in outputs for line in output.splitlines() if line.startswith("ENTRY")}
    assert len(entries) == 1
    assert sum(output.count("exported ") for output in outputs) == 1, outputs
    assert sorted(p.name for p in cache.iterdir()) == sorted([Path(next(iter(entries))).name,
                                                              Path(next(iter(entries))).name + ".lock"])


def test_a_model_whose_export_fails_validation_is_served_by_torch_with_one_log_line(
        models: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = make_tiny_longformer(models)
    with caplog.at_level(logging.INFO, logger="zbatch.worker"):
        runner = load(path, runtime="auto")
    assert not hasattr(runner, "runtime")  # torch
    said = [r for r in caplog.records if r.name == "zbatch.worker" and r.levelno >= logging.WARNING]
    assert len(said) == 1, [r.getMessage() for r in said]
    assert "runs on torch" in said[0].getMessage() and "does not validate" in said[0].getMessage()
    assert "\n" not in said[0].getMessage()
    assert len(runner.run(["hello world", "the cat"], {})[0]) == 32  # and it serves
    with pytest.raises(ValueError, match="runtime onnx cannot serve it: its ONNX export does not validate"):
        load(path, runtime="onnx")


def test_auto_keeps_torch_where_onnx_runtime_does_not_serve(models: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = make_tiny_bert(models, "fill-mask")
    with caplog.at_level(logging.INFO, logger="zbatch.worker"):
        fill = load(path, "fill-mask", runtime="auto")
    assert not hasattr(fill, "runtime")
    assert any("runs on torch: task fill-mask has no ONNX runner" in r.getMessage() for r in caplog.records)
    bf16 = load(make_tiny_bert(models, "feature-extraction"), runtime="auto", dtype="bfloat16")
    assert not hasattr(bf16, "runtime")
    with pytest.raises(ValueError, match="task fill-mask has no ONNX runner"):
        load(path, "fill-mask", runtime="onnx")


def test_validation_measures_a_real_difference(default_pair: tuple[Any, Any], models: Path) -> None:
    """The check compares outputs: a graph of another model's weights falls far below the bar."""
    import torch

    torch_runner, onnx_runner = default_pair
    samples = ["hello world", "a much longer sentence with many more tokens in it than the first one"]
    assert agreement_with(torch_runner, torch_runner._model, onnx_runner._model, samples) >= MIN_COSINE
    other = load(default_model_path(), runtime="torch")
    torch.manual_seed(0)
    with torch.no_grad():
        for parameter in other._model.parameters():
            parameter.add_(0.05 * torch.randn_like(parameter))
    assert agreement_with(torch_runner, other._model, onnx_runner._model, samples) < 0.999


def test_a_session_per_thread_count_follows_the_ledgers_grant(default_pair: tuple[Any, Any]) -> None:
    import torch

    assert thread_counts(1) == [1] and thread_counts(2) == [1, 2] and thread_counts(6) == [1, 2, 4, 6]
    assert [session_threads(n, [1, 2, 4, 6]) for n in (1, 2, 3, 5, 6)] == [1, 2, 2, 4, 6]
    _, runner = default_pair
    model = runner._model
    assert model.counts == thread_counts(torch.get_num_threads())
    for count, session in model.sessions.items():
        assert session.get_session_options().intra_op_num_threads == count
        # idle threads sleep: no spinning on cores the ledger hands to another worker
        assert session.get_session_options().get_session_config_entry("session.intra_op.allow_spinning") == "0"
    packer = runner._packer
    assert packer.counts == model.counts
    previous = torch.get_num_threads()
    for sessions, packs in ((model.sessions, False), (packer.sessions, True)):  # padded, then packed passes
        used: list[int] = []
        runner._packer = packer if packs else None
        for count in model.counts:
            torch.set_num_threads(count)  # as the inference thread does for each batch
            session = sessions[count]

            def run(*args: Any, session: Any = session, count: int = count, used: list[int] = used) -> Any:
                used.append(count)
                return type(session).run(session, *args)

            session.run = run
            try:
                runner.run(["hello", "a world"] if packs else ["hello"], {})  # one input alone runs padded
            finally:
                del session.run
        assert used == model.counts
    runner._packer = packer
    torch.set_num_threads(previous)


def test_int8_is_kept_only_at_its_bar_and_only_for_onnx_runtime(default_pair: tuple[Any, Any]) -> None:
    torch_runner, _ = default_pair
    int8 = load(default_model_path(), runtime="auto", quantize="int8")
    assert int8.runtime.startswith("onnxruntime ")
    assert "int8" in str(int8._model.path)
    expected, got = torch_runner.run(TEXTS, {}), int8.run(TEXTS, {})
    lowest = min(cosine(a, b) for a, b in zip(expected, got, strict=True))
    assert INT8_MIN_COSINE <= lowest < MIN_COSINE  # close, and not equal: it is another model
    with pytest.raises(ValueError, match="quantize int8 is ONNX Runtime's"):
        load(default_model_path(), runtime="torch", quantize="int8")


def test_runtime_settings_reach_every_model(models: Path) -> None:
    config = load_config(["--runtime", "onnx", "--quantize", "int8", "--onnx-cache", "/tmp/graphs",
                          "--extra-models", f"name=b,path={models},runtime=torch,quantize=none;name=c,path={models}"],
                         {})
    main, b, c = (model.spec for model in config.models)
    assert [spec.name for spec in (main, b, c)] == [DEFAULT_MODEL_NAME, "b", "c"]
    assert (main.runtime, main.quantize, main.onnx_cache) == ("onnx", "int8", "/tmp/graphs")
    assert (b.runtime, b.quantize) == ("torch", "none")
    assert (c.runtime, c.quantize, c.onnx_cache) == ("onnx", "int8", "/tmp/graphs")  # the main model's
    assert load_config([], {"ZBATCH_RUNTIME": "torch"}).runtime == "torch"
    assert load_config([], {}).runtime == "auto"
    with pytest.raises(SystemExit):
        load_config(["--runtime", "tensorrt"], {})
    with pytest.raises(ValueError, match="quantize int8 is ONNX Runtime's"):
        load_config(["--runtime", "torch", "--quantize", "int8"], {}).models  # noqa: B018
    with pytest.raises(ValueError, match="unknown runtime 'jax'"):
        load_config(["--extra-models", f"name=d,path={models},runtime=jax"], {}).models  # noqa: B018


def test_exported_graph_takes_any_batch_and_length(models: Path, tmp_path: Path) -> None:
    """Dynamic axes and explicit position ids: lengths unlike the traced example's give torch's outputs."""
    from transformers import AutoModel

    path = make_tiny_bert(models, "feature-extraction")
    model = AutoModel.from_pretrained(path).eval()
    entry = exported(model, path, "last_hidden_state", ["input_ids", "token_type_ids", "attention_mask"],
                     str(tmp_path))
    assert "position_ids" in entry.inputs
    torch_runner = load(path, runtime="torch")
    from worker.runners.onnx_session import OrtModel

    for graph in entry.graphs:
        candidate = OrtModel(entry.path(graph), entry.inputs, "last_hidden_state", model.config, 1)
        for texts in (["a"], ["hello world"] * 9, TEXTS, [" ".join(["day"] * 126)]):
            assert agreement_with(torch_runner, model, candidate, texts) >= MIN_COSINE
