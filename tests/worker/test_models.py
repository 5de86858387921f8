"""worker.runners against real models: the bundled all-MiniLM-L6-v2 and tiny BERT/GPT-2 models built on disk."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy as np
import pytest

from tests.worker.tiny_models import make_tiny_bert, make_tiny_gpt2
from worker.runners import DEFAULT_MODEL_NAME, InputError, ModelSpec, Runner, default_model_path, load_runner
from worker.runners.device import cpu_lacks_native_bfloat16, resolve_device
from worker.runners.embeddings import EmbeddingRunner

TEXTS = [
    "hello world",
    "A man is eating food.",
    "ZeroMQ brokers route requests to workers, which batch them dynamically before running the model.",
    "",
    "Ünïcödé façade — naïve café, 東京 and emoji 🚀 are tokenised too.",
    "long " + "sentence transformers truncate inputs beyond the maximum sequence length " * 40,
]


@pytest.fixture(scope="module")
def embedder() -> Runner:
    return load_runner(ModelSpec(DEFAULT_MODEL_NAME, default_model_path()))


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("tiny-models")


@pytest.fixture(scope="session")
def fill_mask(tiny_dir: Path) -> Runner:
    return load_runner(ModelSpec("tiny-fill-mask", make_tiny_bert(tiny_dir, "fill-mask"), task="fill-mask"))


def _pipeline(tiny_dir: Path, head: str, task: str | None = None) -> Runner:
    return load_runner(ModelSpec(f"tiny-{head}", make_tiny_bert(tiny_dir, head), task=task or head))


# --- embeddings ---------------------------------------------------------------------------------


def test_embeddings_match_sentence_transformers(embedder: Runner) -> None:
    from sentence_transformers import SentenceTransformer
    from transformers import AutoTokenizer

    assert len(AutoTokenizer.from_pretrained(default_model_path())(TEXTS[-1])["input_ids"]) > 256  # truncated
    expected = SentenceTransformer(default_model_path(), device="cpu").encode(TEXTS, normalize_embeddings=True)
    got = embedder.run(TEXTS, {})
    assert len(got) == len(TEXTS)
    for row, want in zip(got, expected, strict=True):
        assert isinstance(row, np.ndarray) and row.dtype == np.float32 and row.shape == (384,)
        assert np.linalg.norm(row) == pytest.approx(1.0, abs=1e-5)
        assert np.abs(row - want).max() < 1e-5


def test_embeddings_batch_equals_one_at_a_time(embedder: Runner) -> None:
    batched = embedder.run(TEXTS, {})
    for text, row in zip(TEXTS, batched, strict=True):
        (single,) = embedder.run([text], {})
        assert np.abs(row - single).max() < 1e-5


@pytest.mark.parametrize("overhead_tokens", [0.0, 50.0])
def test_length_groups_give_the_same_embeddings_in_input_order(embedder: Runner, overhead_tokens: float) -> None:
    from worker.runners.grouping import NEVER_SPLIT, CostModel

    runner: EmbeddingRunner = embedder  # type: ignore[assignment]
    calibrated = runner.cost_model
    try:
        runner.cost_model = NEVER_SPLIT
        one_pass = runner.run(TEXTS * 2, {})
        runner.cost_model = CostModel(overhead_tokens)
        grouped = runner.run(TEXTS * 2, {})
    finally:
        runner.cost_model = calibrated
    for want, got in zip(one_pass, grouped, strict=True):
        assert np.abs(want - got).max() < 1e-5


def test_calibration_on_this_cpu_finds_that_padding_costs_more_than_a_split(embedder: Runner) -> None:
    """On a CPU a padded token costs a measurable fraction of a forward pass, so mixed batches get split.

    It depends on the host giving the calibration's short and long passes, timed in turn, their share in one
    of its rounds (:func:`worker.runners.grouping.calibrate` times them again while the long one is timed the
    faster, which is how a busy host made this fail)."""
    model = embedder.cost_model  # type: ignore[attr-defined]
    assert 0 <= model.overhead_tokens < 16 * 64


def test_embeddings_normalize_false_returns_raw_mean_pool(embedder: Runner) -> None:
    (raw,) = embedder.run(["hello world"], {"normalize": False})
    (unit,) = embedder.run(["hello world"], {"normalize": True})
    assert np.linalg.norm(raw) != pytest.approx(1.0, abs=1e-3)
    assert np.abs(raw / np.linalg.norm(raw) - unit).max() < 1e-5


def test_embedder_reports_device_and_spec(embedder: Runner) -> None:
    assert embedder.device == "cpu"
    assert embedder.spec.name == DEFAULT_MODEL_NAME
    assert embedder.max_length == 256  # type: ignore[attr-defined]  # from sentence_bert_config.json


@pytest.mark.parametrize(
    ("inputs", "parameters", "match"),
    [
        ([], {}, "non-empty list"),
        ("hello", {}, "non-empty list"),
        (["ok", 3], {}, r"inputs\[1\] is int"),
        (["ok", None], {}, r"inputs\[1\] is NoneType"),
        (["ok"], {"pooling": "cls"}, "'pooling'"),
        (["ok"], {"normalize": "yes"}, "normalize"),
    ],
)
def test_embeddings_reject_bad_requests(embedder: Runner, inputs: object, parameters: dict[str, Any],
                                        match: str) -> None:
    with pytest.raises(InputError, match=match):
        embedder.run(inputs, parameters)  # type: ignore[arg-type]


# --- pipelines ----------------------------------------------------------------------------------


@pytest.mark.parametrize("batch", [["test [MASK]"], ["test [MASK]", "hello [MASK] world"]])
def test_fill_mask_returns_candidates_per_input(fill_mask: Runner, batch: list[str]) -> None:
    results = fill_mask.run(batch, {})
    assert len(results) == len(batch)
    for candidates in results:
        assert isinstance(candidates, list) and candidates
        for candidate in candidates:
            assert isinstance(candidate["token_str"], str) and candidate["token_str"]
            assert type(candidate["score"]) is float and 0.0 <= candidate["score"] <= 1.0


def test_fill_mask_top_k_parameter(fill_mask: Runner) -> None:
    (candidates,) = fill_mask.run(["test [MASK]"], {"top_k": 2})
    assert len(candidates) == 2


@pytest.mark.parametrize(
    ("inputs", "parameters", "match"),
    [
        (["test [MASK]", "no mask here"], {}, r"inputs\[1\].*mask token \[MASK\]"),
        (["test [MASK]"], {"bogus": 1}, "unknown parameter.*'bogus'.*top_k"),
        (["test [MASK]"], {"top_k": "three"}, "top_k"),
        (["test [MASK]"], {"batch_size": 4}, "'batch_size'.*set by the worker"),
        ([], {}, "non-empty list"),
        ([b"test [MASK]"], {}, "bytes"),
    ],
)
def test_fill_mask_rejects_bad_requests(fill_mask: Runner, inputs: list[Any], parameters: dict[str, Any],
                                        match: str) -> None:
    with pytest.raises(InputError, match=match):
        fill_mask.run(inputs, parameters)


def test_text_classification_returns_every_label_and_score_highest_first(tiny_dir: Path) -> None:
    """Issue 24 changed the default from the best label alone to every label (TEI's /predict)."""
    runner = _pipeline(tiny_dir, "text-classification")
    long_text = "hello world " * 200  # longer than the 128 positions: must be truncated, not crash
    results = runner.run(["hello world", "test", long_text], {})
    assert len(results) == 3
    for result in results:
        assert {label["label"] for label in result} == {"negative", "positive"}
        assert all(type(label["score"]) is float for label in result)
        assert result[0]["score"] >= result[1]["score"]
    assert len(runner.run(["hello"], {"top_k": None})[0]) == 2
    assert len(runner.run(["hello"], {"top_k": 1})[0]) == 1
    with pytest.raises(InputError, match="'bogus'"):
        runner.run(["hello"], {"bogus": True})


def test_feature_extraction_returns_unpadded_float32_matrices(tiny_dir: Path) -> None:
    runner = _pipeline(tiny_dir, "feature-extraction")
    texts = ["test", "hello big world", "hello world " * 200]
    batched = runner.run(texts, {})
    assert [row.shape for row in batched] == [(3, 32), (5, 32), (128, 32)]  # [CLS] ... [SEP], truncated at 128
    for text, row in zip(texts, batched, strict=True):
        assert isinstance(row, np.ndarray) and row.dtype == np.float32
        (single,) = runner.run([text], {})
        assert single.shape == row.shape and np.abs(single - row).max() < 1e-5
    (as_lists,) = runner.run(["hello big world"], {"return_tensors": False})
    assert np.abs(as_lists - batched[1]).max() < 1e-6


def test_token_classification_outputs_are_plain_python(tiny_dir: Path) -> None:
    runner = _pipeline(tiny_dir, "token-classification", task="ner")  # "ner" is an alias
    (entities, _) = runner.run(["hello world", "test"], {})
    assert [entity["word"] for entity in entities] == ["hello", "world"]
    for entity in entities:
        assert all(type(entity[key]) is int for key in ("index", "start", "end"))
        assert type(entity["score"]) is float


def test_text_generation_batches_without_a_pad_token(tmp_path: Path) -> None:
    runner = load_runner(ModelSpec("tiny-gpt2", make_tiny_gpt2(tmp_path), task="text-generation"))
    results = runner.run(["hello world", "the cat is"], {"max_new_tokens": 2, "do_sample": False})
    assert len(results) == 2
    assert all(isinstance(result[0]["generated_text"], str) for result in results)
    with pytest.raises(InputError, match="bogus"):
        runner.run(["hello"], {"bogus": 1})


def test_zero_shot_classification_needs_candidate_labels(tiny_dir: Path) -> None:
    runner = _pipeline(tiny_dir, "text-classification", task="zero-shot-classification")
    results = runner.run(["hello world", "the dog is happy"], {"candidate_labels": ["cat", "dog", "red"]})
    assert len(results) == 2
    for result in results:
        assert sorted(result["labels"]) == ["cat", "dog", "red"]
        assert all(type(score) is float for score in result["scores"])
    with pytest.raises(InputError, match=r"needs the parameter.*'candidate_labels'"):
        runner.run(["hello world"], {})
    with pytest.raises(InputError, match="'bogus'"):
        runner.run(["hello world"], {"candidate_labels": ["cat"], "bogus": 1})


# --- loading and device/dtype validation --------------------------------------------------------


def test_unknown_task_is_rejected(tiny_dir: Path) -> None:
    path = make_tiny_bert(tiny_dir, "text-classification")
    with pytest.raises(ValueError, match=r"unknown task 'summarise'.*'embeddings'.*pipeline task"):
        load_runner(ModelSpec("x", path, task="summarise"))
    with pytest.raises(ValueError, match="plain-text inputs"):
        load_runner(ModelSpec("x", path, task="image-segmentation"))  # image-classification has a runner now


def test_missing_model_folder_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="does not exist"):
        load_runner(ModelSpec("x", str(tmp_path / "nope")))


def test_resolve_device_follows_the_host() -> None:
    import torch

    if torch.cuda.is_available():
        assert resolve_device("auto") == "cuda" and resolve_device("cuda:0") == "cuda:0"
        return
    assert resolve_device("auto") == "cpu"
    assert resolve_device("cpu") == "cpu"
    for device in ("cuda", "cuda:0", "cuda:3"):
        with pytest.raises(ValueError, match=r"CUDA is not available.*--device cpu or auto"):
            resolve_device(device)
    for device in ("mps", "cuda:x", "gpu"):
        with pytest.raises(ValueError, match="unsupported device"):
            resolve_device(device)


@pytest.mark.parametrize(
    ("dtype", "match"),
    [("float16", "needs a CUDA device.*use --dtype float32, or bfloat16"), ("int8", "unsupported dtype")],
)
def test_bad_dtype_on_cpu_is_rejected(dtype: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        load_runner(ModelSpec(DEFAULT_MODEL_NAME, default_model_path(), device="cpu", dtype=dtype))


def test_bfloat16_on_cpu_embeds_close_to_float32(embedder: Runner) -> None:
    """Vectors from bfloat16 weights are still float32, and near float32's (cosine 0.9999 here; 0.999 allowed)."""
    bf16 = load_runner(ModelSpec(DEFAULT_MODEL_NAME, default_model_path(), device="cpu", dtype="bfloat16"))
    texts = TEXTS * 3  # mixed lengths: likely split into length groups, as served batches are
    for want, got in zip(embedder.run(texts, {}), bf16.run(texts, {}), strict=True):
        assert got.dtype == np.float32 and got.shape == (384,)
        assert float(want @ got) > 0.999  # both unit vectors: this is their cosine


def test_bfloat16_feature_extraction_on_cpu_returns_float32(tiny_dir: Path) -> None:
    path = make_tiny_bert(tiny_dir, "feature-extraction")
    runner = load_runner(ModelSpec("tiny-bf16", path, task="feature-extraction", device="cpu", dtype="bfloat16"))
    rows = runner.run(["test", "hello big world"], {})
    assert [(row.shape, row.dtype) for row in rows] == [((3, 32), np.float32), ((5, 32), np.float32)]


def test_bfloat16_fill_mask_on_cpu_returns_python_floats(tiny_dir: Path) -> None:
    fill = load_runner(ModelSpec("tiny-fill-bf16", make_tiny_bert(tiny_dir, "fill-mask"), task="fill-mask",
                                 device="cpu", dtype="bfloat16"))
    (candidates,) = fill.run(["test [MASK]"], {})
    assert candidates and all(type(candidate["score"]) is float for candidate in candidates)


@pytest.mark.parametrize(
    ("machine", "flags", "lacks"),
    [("x86_64", "fpu avx2 avx512f", True), ("x86_64", "fpu avx2 avx512_bf16", False),
     ("x86_64", "fpu amx_bf16 amx_tile", False), ("x86_64", "", False), ("aarch64", "fp asimd", False)],
)
def test_cpu_bfloat16_check_reads_the_cpu_flags(machine: str, flags: str, lacks: bool) -> None:
    cpuinfo = f"processor\t: 0\nflags\t\t: {flags}\n" if flags else "processor\t: 0\n"
    assert cpu_lacks_native_bfloat16(cpuinfo, machine) is lacks


@pytest.mark.parametrize("lacks", [True, False])
def test_bfloat16_warns_only_on_a_cpu_without_native_support(
        tiny_dir: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, lacks: bool) -> None:
    """The CPU check is replaced by a fake, so the test does not depend on this host's CPU."""
    import worker.runners.device

    def fake_cpu_check() -> bool:
        return lacks

    monkeypatch.setattr(worker.runners.device, "cpu_lacks_native_bfloat16", fake_cpu_check)
    path = make_tiny_bert(tiny_dir, "feature-extraction")
    with caplog.at_level("WARNING", logger="zbatch.worker"):
        load_runner(ModelSpec("tiny-warn", path, task="feature-extraction", device="cpu", dtype="bfloat16"))
    warned = "torch emulates bfloat16" in caplog.text and "dtype float32" in caplog.text
    assert warned is lacks


def test_default_model_path_points_at_the_bundled_model() -> None:
    path = Path(default_model_path())
    assert path.name == "model" and (path / "config.json").is_file()
    assert (path / "sentence_bert_config.json").is_file()


def test_import_is_cheap() -> None:
    """Importing worker.runners for its names must not drag in torch."""
    code = "import sys, worker.runners; sys.exit('torch' in sys.modules or 'transformers' in sys.modules)"
    root = Path(__file__).resolve().parents[2]
    assert subprocess.run([sys.executable, "-c", code], cwd=root, check=False).returncode == 0

