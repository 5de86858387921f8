"""The bench's shaped models (scripts/benchmarks/systems/shapes.py): a model of the widths asked for, which the
worker serves as it would the real one, and the tokens a text counts."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from scripts.benchmarks.systems.shapes import Shape, mean_tokens, shaped_model
from worker.runners import ModelSpec, load_runner

TINY = Shape("tiny", 2, 64, 2, 128)


def test_a_shaped_model_has_its_widths_and_serves_normalized_vectors_of_them(tmp_path: Path) -> None:
    folder = shaped_model(TINY, tmp_path)
    config = json.loads((folder / "config.json").read_text())
    assert (config["num_hidden_layers"], config["hidden_size"], config["num_attention_heads"],
            config["intermediate_size"]) == (2, 64, 2, 128)
    assert json.loads((folder / "1_Pooling" / "config.json").read_text())["word_embedding_dimension"] == 64
    assert shaped_model(TINY, tmp_path) == folder and not folder.with_name(folder.name + ".partial").exists()
    runner = load_runner(ModelSpec("tiny", str(folder), device="cpu", runtime="torch"))
    [vector] = runner.run(["hello world"], {})
    assert np.asarray(vector).shape == (64,)
    assert abs(float(np.linalg.norm(vector)) - 1.0) < 1e-5, "the bundled model's Normalize module is kept"


def test_tokens_a_text_counts_include_the_special_tokens(tmp_path: Path) -> None:
    folder = shaped_model(TINY, tmp_path)
    assert mean_tokens(folder, ["hello world"]) == 4  # [CLS] hello world [SEP]
    assert mean_tokens(folder, ["hello world", "hello"]) == 3.5


def test_a_shaped_model_takes_its_tokenizer_and_modules_from_the_base_named(tmp_path: Path) -> None:
    """A GPU host carries its own copy of the model (``ZBATCH_MODEL_PATH``), not the bundled package."""
    base = shaped_model(TINY, tmp_path / "first")
    (base / "tokenizer_config.json").write_text(
        json.dumps(json.loads((base / "tokenizer_config.json").read_text()) | {"model_max_length": 77}))
    folder = shaped_model(Shape("tiny-wide", 2, 96, 2, 128), tmp_path / "second", str(base))
    assert json.loads((folder / "tokenizer_config.json").read_text())["model_max_length"] == 77
    assert json.loads((folder / "config.json").read_text())["hidden_size"] == 96
