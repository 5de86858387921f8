"""Issue 39's case through real daemons: a copy of the bundled model with its pooling switched to CLS, served by a
worker, answers sentence-transformers' vectors from the same folder (it answered them at cosine 0.35 when zbatch
always mean-pooled); a worker given a module it cannot run exits at start with one line that names it."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.daemons import start_broker, start_worker, wait_until
from tests.worker.tiny_models import make_tiny_bert, with_st_modules
from worker.runners import default_model_path
from zbatch import testing
from zbatch.client import AsyncClient

MODEL = "cls-minilm"
TEXTS = ["hello world", "A man is eating food.", "ZeroMQ brokers route requests to workers, which batch them.",
         "long " + "sentence transformers truncate inputs beyond the maximum sequence length " * 40]


def cosines(first: Any, second: Any) -> np.ndarray:
    a, b = np.asarray(first, np.float64), np.asarray(second, np.float64)
    found: np.ndarray = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
    return found


@pytest.fixture(scope="module")
def cls_model(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The bundled model's files, linked into a folder named like its own (the two share one ONNX export), with
    a Pooling module of its own that pools the CLS token, as sentence-transformers writes it."""
    folder = tmp_path_factory.mktemp("cls") / "model"
    folder.mkdir()
    for item in Path(default_model_path()).iterdir():
        if item.is_file():
            (folder / item.name).symlink_to(item)
    (folder / "1_Pooling").mkdir()
    (folder / "1_Pooling" / "config.json").write_text(json.dumps({
        "word_embedding_dimension": 384, "pooling_mode_cls_token": True, "pooling_mode_mean_tokens": False,
        "pooling_mode_max_tokens": False, "pooling_mode_mean_sqrt_len_tokens": False}))
    return str(folder)


def test_a_cls_pooled_model_served_by_a_worker_answers_sentence_transformers_vectors(cls_model: str,
                                                                                     tmp_path: Path) -> None:
    from sentence_transformers import SentenceTransformer

    expected = SentenceTransformer(cls_model, device="cpu").encode(TEXTS)
    with testing.Daemons(tmp_path) as daemons:
        broker = daemons.add(start_broker(tmp_path))
        worker = daemons.add(start_worker(broker, tmp_path, "w1", model_path=cls_model, model_name=MODEL, workers=1))

        async def ask() -> list[Any]:
            async with AsyncClient(broker.frontend) as client:
                return list(await client.infer(MODEL, TEXTS))

        answered = asyncio.run(ask())
        log = worker.log(lines=200)
    assert f"model {MODEL}: cls pooling, normalized (as its sentence-transformers modules declare)" in log
    assert cosines(answered, expected).min() >= 0.9999
    mean_pooled = SentenceTransformer(default_model_path(), device="cpu").encode(TEXTS)  # what zbatch answered
    assert cosines(mean_pooled, expected).min() < 0.9


def test_a_worker_given_a_module_it_cannot_run_exits_with_one_line_naming_it(tmp_path: Path) -> None:
    folder = with_st_modules(make_tiny_bert(tmp_path, "feature-extraction"), "mean",
                             extra=["sentence_transformers.models.LayerNorm"])
    worker = testing.spawn("worker", "refused", tmp_path, model_path=folder, backend=testing.endpoint(), workers=1)
    try:
        wait_until(lambda: worker.process.poll() is not None, 120, "the worker to exit", worker.log)
    finally:
        worker.stop()
    last = worker.log_path.read_text().strip().splitlines()[-1]
    assert worker.process.returncode == 1, worker.log()
    assert last.startswith("zbatch-worker: error: model in ") and "'sentence_transformers.models.LayerNorm'" in last
    assert "serve the model with sentence-transformers, or a model without that module" in last
