"""What a worker keeps between starts: the ONNX verdict and the calibration, read at the next start, worked out again
when stale, corrupt or for another model, and written once by workers that start together.

Models are real: tiny ones built in a temp folder, and the bundled default model in a real worker daemon.  Each test
names a cache folder of its own, so each first start is cold whatever the run's shared cache holds.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.daemons import start_broker, start_worker
from tests.worker.tiny_models import make_tiny_bert, make_tiny_longformer
from worker.runners import DEFAULT_MODEL_NAME, ModelSpec, load_runner, phases, verdicts
from worker.runners import calibrations as calibration_records
from worker.runners import start_cache as cache_records
from worker.runners.classify import SequenceClassifier
from worker.runners.grouping import CALIBRATION_RUNS, CALIBRATION_SHORT
from worker.runners.onnx_export import CACHE_ENV
from worker.runners.runtime import VALIDATION
from zbatch.client import Client
from zbatch.testing import KEPT_ENV, ROOT, START_CACHE_ENV, daemon_env

TEXTS = ["hello world", "the cat and the dog run on a day of blue sky", "a"]
FROM_CACHE = "as validated at an earlier start"
VALIDATED_NOW = "validated now against torch"


def load(path: str, cache: Path, runtime: str = "auto", task: str = "embeddings") -> tuple[Any, phases.StartPhases]:
    """A runner loaded as the worker loads it, and the phases its start ran."""
    with phases.recording() as times:
        runner = load_runner(ModelSpec("m", path, task=task, device="cpu", runtime=runtime, onnx_cache=str(cache)))
    return runner, times


def records(cache: Path, kind: str) -> list[Path]:
    return sorted((cache / kind).glob("*.json"))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> str:
    return make_tiny_bert(tmp_path_factory.mktemp("start-cache-models"), "feature-extraction")


def test_the_second_start_serves_the_kept_graph_without_loading_torchs_model(
        tiny: str, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="zbatch.worker"):
        first, cold = load(tiny, tmp_path)
        second, warm = load(tiny, tmp_path)
    said = [r.getMessage() for r in caplog.records if "runs on ONNX Runtime" in r.getMessage()]
    assert len(said) == 2 and VALIDATED_NOW in said[0] and FROM_CACHE in said[1], said
    assert {"model", "export", "validation", "calibration"} <= set(cold.seconds)
    assert not {"model", "export", "validation"} & set(warm.seconds), warm.summary()
    assert warm.notes["verdict"].startswith("from the cache")
    assert second.runtime == first.runtime and second._model.path == first._model.path
    for want, got in zip(first.run(TEXTS, {}), second.run(TEXTS, {}), strict=True):
        np.testing.assert_array_equal(want, got)
    assert len(records(tmp_path, verdicts.KIND)) == 1 and len(records(tmp_path, calibration_records.KIND)) == 1


def test_a_corrupt_verdict_is_worked_out_again_with_one_log_line(
        tiny: str, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    load(tiny, tmp_path)
    (kept,) = records(tmp_path, verdicts.KIND)
    kept.write_text('{"runtime": "onnxrunt')  # cut short, as by a full disk
    with caplog.at_level(logging.INFO, logger="zbatch.worker"):
        runner, times = load(tiny, tmp_path)
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith(f"start cache: {kept}")]
    assert len(said) == 1 and "does not parse" in said[0], said
    assert "validation" in times.seconds and runner.runtime.startswith("onnxruntime")
    assert json.loads(kept.read_text())["runtime"] == "onnxruntime"  # written again, whole


def test_a_verdict_whose_graph_changed_is_validated_again(tiny: str, tmp_path: Path,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    first, _ = load(tiny, tmp_path)
    graph: Path = first._model.path
    graph.write_bytes(graph.read_bytes())  # the same bytes, written again: validated before it serves
    with caplog.at_level(logging.INFO, logger="zbatch.worker"):
        _, times = load(tiny, tmp_path)
    assert any("names a graph that changed since it was validated" in r.getMessage() for r in caplog.records)
    assert "validation" in times.seconds
    _, again = load(tiny, tmp_path)
    assert "validation" not in again.seconds


def test_a_verdict_is_keyed_on_the_model_the_task_and_the_host(tiny: str, tmp_path: Path) -> None:
    from worker.runners.embeddings import EmbeddingRunner

    def key(path: str = tiny, **spec: Any) -> str:
        fields = {"name": "m", "path": path, "onnx_cache": str(tmp_path)} | spec
        return verdicts.key_for(ModelSpec(**fields), EmbeddingRunner, "last_hidden_state", "cpu", "float32",
                                VALIDATION).digest

    before = key()
    assert key(name="other public name") == before  # what it is called changes nothing it validated
    assert key(quantize="int8") != before
    assert verdicts.key_for(ModelSpec("m", tiny, onnx_cache=str(tmp_path)), SequenceClassifier, "logits", "cpu",
                            "float32", VALIDATION).digest != before
    assert verdicts.key_for(ModelSpec("m", tiny, onnx_cache=str(tmp_path)), EmbeddingRunner, "last_hidden_state",
                            "cpu", "float32", VALIDATION | {"min_cosine": 0.9}).digest != before
    vocab = Path(tiny) / "vocab.txt"
    vocab.write_text(vocab.read_text() + "zebra\n")  # the tokenizer: other validation inputs
    try:
        assert key() != before
    finally:
        vocab.write_text(vocab.read_text().removesuffix("zebra\n"))
    assert key() == before
    config = Path(tiny) / "config.json"
    original = config.read_text()
    config.write_text(original.replace("}", ' }', 1))  # another config: another graph and another verdict
    try:
        assert key() != before
    finally:
        config.write_text(original)


def test_a_changed_model_starts_cold(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The same folder with other weights: a verdict of its own, validated now, never the old model's."""
    import torch
    from transformers import AutoModel

    path = make_tiny_bert(tmp_path / "models", "feature-extraction")
    cache = tmp_path / "cache"
    first, _ = load(path, cache)
    model = AutoModel.from_pretrained(path)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.01)
    model.save_pretrained(path)
    with caplog.at_level(logging.INFO, logger="zbatch.worker"):
        second, times = load(path, cache)
    assert "validation" in times.seconds and "export" in times.seconds
    assert any(VALIDATED_NOW in r.getMessage() for r in caplog.records)
    assert second._model.path != first._model.path
    assert len(records(cache, verdicts.KIND)) == 2


def test_a_model_that_does_not_validate_starts_on_torch_without_trying_again(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = make_tiny_longformer(tmp_path / "models")
    load(path, tmp_path / "cache")
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="zbatch.worker"):
        runner, times = load(path, tmp_path / "cache")
    assert not hasattr(runner, "runtime")  # torch
    said = [r.getMessage() for r in caplog.records if r.name == "zbatch.worker" and r.levelno >= logging.WARNING]
    assert len(said) == 1 and "does not validate" in said[0] and "as decided at an earlier start" in said[0]
    assert not {"export", "validation"} & set(times.seconds)
    with pytest.raises(ValueError, match="runtime onnx cannot serve it: its ONNX export does not validate"):
        load(path, tmp_path / "cache", runtime="onnx")


def test_a_cache_that_cannot_keep_records_does_not_stop_a_start(tiny: str, tmp_path: Path,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    """Files where the record folders would be (a fault root's tests can make; a read-only folder is none to
    root): the graphs are kept, the records cannot be, and the worker serves, saying so once a folder."""
    for kind in (verdicts.KIND, calibration_records.KIND):
        (tmp_path / kind).write_text("not a folder")
    with caplog.at_level(logging.INFO, logger="zbatch.worker"):
        first, _ = load(tiny, tmp_path)
        second, times = load(tiny, tmp_path)
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("start cache:")]
    assert len(said) == 2 and all("cannot be written" in each for each in said), said  # once a folder
    assert "validation" in times.seconds  # nothing was kept: worked out again
    for want, got in zip(first.run(TEXTS, {}), second.run(TEXTS, {}), strict=True):
        np.testing.assert_array_equal(want, got)


DECIDE_ONE = """
import logging, sys
logging.basicConfig(level=logging.INFO, format="%(message)s")
from worker.runners import ModelSpec, load_runner
runner = load_runner(ModelSpec("m", sys.argv[1], device="cpu", runtime="onnx", onnx_cache=sys.argv[2]))
print("RUNTIME", runner.runtime)
"""


def test_workers_starting_together_validate_and_write_once(tiny: str, tmp_path: Path) -> None:
    """Two processes start the same model on an empty cache at once: one exports, validates and calibrates; the
    other waits for it and reads what it kept."""
    env = os.environ | {"PYTHONPATH": str(ROOT)}
    processes = [subprocess.Popen([sys.executable, "-c", DECIDE_ONE, tiny, str(tmp_path)], env=env, cwd=ROOT,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for _ in range(2)]
    outputs = [process.communicate(timeout=240)[0] for process in processes]
    assert [process.returncode for process in processes] == [0, 0], outputs
    said = "\n".join(outputs)
    assert said.count(VALIDATED_NOW) == 1 and said.count(FROM_CACHE) == 1, outputs
    assert said.count("exported ") == 1, outputs
    assert len(records(tmp_path, verdicts.KIND)) == 1 and len(records(tmp_path, calibration_records.KIND)) == 1
    assert not list((tmp_path / verdicts.KIND).glob(".*")), "no temporary file is left behind"


def kept_calibration(cache: Path) -> cache_records.RecordKey:
    return calibration_records.key_for(cache, "model", {"model": "a digest", "threads": 2})


def test_a_kept_calibration_is_read_and_a_quieter_host_measures_again(tmp_path: Path) -> None:
    """The timings are injected: what is tested is which passes run, not how long they take."""
    timed: list[tuple[int, int]] = []
    pace = {"seconds": 1.0}

    def seconds_for(rows: int, tokens: int) -> float:
        timed.append((rows, tokens))
        return pace["seconds"] * (0.002 + 0.0001 * rows * tokens)

    key = kept_calibration(tmp_path)
    first = calibration_records.calibrated(key, seconds_for)
    assert len(timed) == 2 * CALIBRATION_RUNS and first.seconds_per_token > 0
    timed.clear()
    pace["seconds"] = 1.1  # as quiet, or busier: the kept calibration stands
    assert calibration_records.calibrated(key, seconds_for) == first
    assert timed == [CALIBRATION_SHORT] * CALIBRATION_RUNS
    timed.clear()
    pace["seconds"] = 0.5  # clearly quieter than when it was kept: measured again, and kept
    again = calibration_records.calibrated(key, seconds_for)
    assert len(timed) == 3 * CALIBRATION_RUNS and again.seconds_per_token < first.seconds_per_token
    timed.clear()
    assert calibration_records.calibrated(key, seconds_for) == again and len(timed) == CALIBRATION_RUNS


def test_a_corrupt_calibration_is_measured_again(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    key = kept_calibration(tmp_path)
    key.path.parent.mkdir(parents=True)
    record = {"overhead_tokens": -5, "seconds_per_token": 0.001, "short_seconds": 0.01,
              cache_records.PARTS: dict(key.parts)}
    key.path.write_text(json.dumps(record))
    with caplog.at_level(logging.INFO, logger="zbatch.worker"):
        model = calibration_records.calibrated(key, lambda rows, tokens: 0.002 + 0.0001 * rows * tokens)
    assert [r.getMessage() for r in caplog.records if "start cache" in r.getMessage()] == [
        f"start cache: {key.path} holds numbers no calibration gives; working it out again"]
    assert model.overhead_tokens >= 0 and json.loads(key.path.read_text())["overhead_tokens"] >= 0


def test_a_record_under_another_key_is_not_used(tmp_path: Path) -> None:
    key = kept_calibration(tmp_path)
    cache_records.write(key, {"overhead_tokens": 1.0, "seconds_per_token": 0.1, "short_seconds": 0.1})
    other = calibration_records.key_for(tmp_path, "model", {"model": "a digest", "threads": 1})
    other.path.write_text(key.path.read_text())  # a record copied under another key's name
    assert cache_records.read(other) == (None, "does not match its key")


def test_the_harness_hands_the_runs_start_cache_to_every_daemon(start_cache: Path) -> None:
    """tests/conftest.py sets one cache for the run; zbatch.testing keeps it in each daemon's environment."""
    assert START_CACHE_ENV == CACHE_ENV and START_CACHE_ENV in KEPT_ENV
    assert daemon_env()[START_CACHE_ENV] == str(start_cache) == os.environ[CACHE_ENV]


def test_a_worker_restarted_on_a_warm_cache_reads_its_verdict_and_calibration(tmp_path: Path) -> None:
    """The worker daemon itself, twice on one cache: the second start's log line says its verdict came from the
    cache and that it loaded no torch model, exported and validated nothing, and it answers the same vectors."""
    broker = start_broker(tmp_path)
    cache = tmp_path / "cache"
    answers = []
    try:
        for name in ("cold", "warm"):
            worker = start_worker(broker, tmp_path, name, onnx_cache=str(cache))
            try:
                with Client(broker.frontend) as client:
                    answers.append(client.infer(DEFAULT_MODEL_NAME, TEXTS))
            finally:
                worker.stop()
    finally:
        broker.stop()
    cold, warm = ((tmp_path / f"{name}.log").read_text() for name in ("cold", "warm"))
    assert VALIDATED_NOW in cold and "validation " in cold
    loaded = next(line for line in warm.splitlines() if "torch thread(s): " in line).split("torch thread(s): ")[1]
    ran = {part.split(" ")[0] for part in loaded.split(", ")}
    assert FROM_CACHE in warm and "verdict 0." in loaded and "(from the cache" in loaded
    assert not {"model", "export", "validation"} & ran, loaded
    for want, got in zip(*answers, strict=True):
        np.testing.assert_array_equal(want, got)
