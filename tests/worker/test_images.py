"""worker.runners.images on a tiny ViT classifier and a tiny YOLOS detector built on disk, with images made by
Pillow: the outputs of transformers' pipelines, one forward pass per batch, and bad files refused alone."""

from __future__ import annotations

import io
import os
import struct
import zlib
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import pytest

from tests.worker.tiny_models import image_bytes, make_tiny_vit, make_tiny_yolos
from worker.assembler import ItemFailure
from worker.engine import run_isolated
from worker.runners import InputError, ModelSpec, load_runner, operation_of
from worker.runners.images import FORMATS, MAX_PIXELS, ImageRunner, decode_image
from zbatch.protocol.wire import Status

IMAGES = [image_bytes(40, 30, 1), image_bytes(64, 64, 2, "JPEG"), image_bytes(20, 50, 3, "BMP"),
          image_bytes(33, 33, 4, "GIF")]


def png_header(width: int, height: int) -> bytes:
    """A PNG file that states its size and holds no pixels: enough for a header check, nothing to decode."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
    return b"\x89PNG\r\n\x1a\n" + header + chunk(b"IDAT", zlib.compress(b"")) + chunk(b"IEND", b"")


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("images")


@pytest.fixture(scope="module")
def classifier(models: Path) -> ImageRunner:
    runner = load_runner(ModelSpec("tiny-vit", make_tiny_vit(models), task="image-classification"))
    assert isinstance(runner, ImageRunner)
    return runner


@pytest.fixture(scope="module")
def detector(models: Path) -> ImageRunner:
    runner = load_runner(ModelSpec("tiny-yolos", make_tiny_yolos(models), task="object-detection"))
    assert isinstance(runner, ImageRunner)
    return runner


def pipeline_outputs(task: str, path: str, images: list[bytes], **parameters: Any) -> list[Any]:
    from PIL import Image
    from transformers import pipeline

    pipe = pipeline(task, model=path, device="cpu")
    return [pipe(Image.open(io.BytesIO(data)).convert("RGB"), **parameters) for data in images]


def test_classification_gives_the_pipelines_labels_and_scores(classifier: ImageRunner, models: Path) -> None:
    want = pipeline_outputs("image-classification", str(models / "tiny-vit"), IMAGES)
    got = classifier.run(IMAGES, {})
    assert len(got) == len(IMAGES)
    for labels, expected in zip(got, want, strict=True):
        assert [label["label"] for label in labels] == [label["label"] for label in expected]  # all 3 of 3
        assert [label["score"] for label in labels] == pytest.approx([e["score"] for e in expected], abs=1e-5)
    assert [len(labels) for labels in classifier.run(IMAGES[:1], {"top_k": 1})] == [1]
    assert [len(labels) for labels in classifier.run(IMAGES[:1], {"top_k": None})] == [3]
    assert classifier.details.labels == ("cat", "dog", "bird") and classifier.details.max_length is None


def test_detection_gives_the_pipelines_detections_best_first(detector: ImageRunner, models: Path) -> None:
    want = pipeline_outputs("object-detection", str(models / "tiny-yolos"), IMAGES[:1], threshold=0.0)[0]
    (got,) = detector.run(IMAGES[:1], {"threshold": 0.0})

    def flat(detections: list[dict[str, Any]]) -> list[tuple[str, tuple[int, ...], float]]:
        return sorted((d["label"], tuple(d["box"][k] for k in ("xmin", "ymin", "xmax", "ymax")), d["score"])
                      for d in detections)

    assert [item[:2] for item in flat(got)] == [item[:2] for item in flat(want)]
    assert [item[2] for item in flat(got)] == pytest.approx([item[2] for item in flat(want)], abs=1e-5)
    assert [d["score"] for d in got] == sorted((d["score"] for d in got), reverse=True)
    assert detector.run(IMAGES[:1], {}) == [[]]  # a random tiny model scores about 0.25: none reach 0.5


def test_images_of_different_sizes_share_one_forward_pass(detector: ImageRunner,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    passes: list[int] = []
    forward = detector._forward

    def counting(images: list[Any], options: Any) -> list[Any]:
        passes.append(len(images))
        return forward(images, options)

    monkeypatch.setattr(detector, "_forward", counting)
    found = detector.run(IMAGES, {"threshold": 0.1})
    assert passes == [len(IMAGES)]
    sizes = [(40, 30), (64, 64), (20, 50), (33, 33)]
    for detections, (width, height) in zip(found, sizes, strict=True):
        assert detections and all(0 <= d["box"]["xmin"] <= d["box"]["xmax"] <= width + 1 and
                                  0 <= d["box"]["ymin"] <= d["box"]["ymax"] <= height + 1 for d in detections)
        assert {d["label"] for d in detections} <= {"cat", "dog", "bird"}


def test_a_corrupt_image_fails_alone_and_the_batch_runs_once(classifier: ImageRunner,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    passes: list[int] = []
    forward = classifier._forward

    def counting(images: list[Any], options: Any) -> list[Any]:
        passes.append(len(images))
        return forward(images, options)

    monkeypatch.setattr(classifier, "_forward", counting)
    corrupt = IMAGES[1][: len(IMAGES[1]) // 2]  # a JPEG cut in half
    batch = [IMAGES[0], b"not an image", IMAGES[2], corrupt, IMAGES[3]]
    outcomes = run_isolated(operation_of(classifier, "run"), batch, {})
    assert passes == [3]
    failed = {i: o for i, o in enumerate(outcomes) if isinstance(o, ItemFailure)}
    assert set(failed) == {1, 3}
    assert all(f.status is Status.BAD_REQUEST and f.per_input for f in failed.values())
    assert "cannot be decoded as an image (UnidentifiedImageError); send a JPEG, PNG" in failed[1].message
    assert "cannot be decoded as an image" in failed[3].message
    alone = classifier.run(IMAGES[:1], {})[0]  # the same labels; scores to float rounding, which on some CPUs
    assert [each["label"] for each in outcomes[0]] == [each["label"] for each in alone]  # differs with batch size
    assert [each["score"] for each in outcomes[0]] == pytest.approx([each["score"] for each in alone], abs=1e-6)


def test_the_protocol_states_the_limit_and_the_formats() -> None:
    protocol = (Path(__file__).resolve().parents[2] / "zbatch" / "protocol" / "PROTOCOL.md").read_text()
    assert f"at most\n  {MAX_PIXELS:,} pixels" in protocol and f"{', '.join(FORMATS[:-1])} or {FORMATS[-1]}" in protocol


@pytest.mark.parametrize("size", [(5000, 4000), (10_000, 10_000), (100_000, 100_000)])  # ours; PIL warns; PIL refuses
def test_images_over_the_pixel_limit_are_refused_from_their_header(size: tuple[int, int]) -> None:
    refusal = decode_image(png_header(*size))
    assert isinstance(refusal, InputError)
    assert f"the limit of {MAX_PIXELS} pixels" in str(refusal) and "send a smaller image" in str(refusal)


def test_common_formats_and_modes_decode_to_rgb() -> None:
    from PIL import Image

    for mode in ("RGBA", "L", "P", "CMYK"):
        encoded = io.BytesIO()
        Image.new(mode, (8, 6)).save(encoded, format="TIFF" if mode == "CMYK" else "PNG")
        image = decode_image(encoded.getvalue())
        assert not isinstance(image, InputError) and image.mode == "RGB" and image.size == (8, 6)
    for data in IMAGES:
        assert not isinstance(decode_image(data), InputError)
    encoded = io.BytesIO()
    Image.new("RGB", (8, 6)).save(encoded, format="PCX")  # a format PIL knows but the worker does not try
    assert isinstance(decode_image(encoded.getvalue()), InputError)


@pytest.mark.parametrize(("task", "inputs", "parameters", "complaint"), [
    ("image-classification", ["a path"], {}, "inputs[0] is str; image-classification takes images"),
    ("image-classification", IMAGES[:1], {"threshold": 0.5}, "unknown parameter(s) 'threshold'"),
    ("image-classification", IMAGES[:1], {"top_k": -1}, "'top_k' must be a whole number"),
    ("object-detection", IMAGES[:1], {"threshold": 1.5}, "'threshold' must be a number from 0 to 1"),
    ("object-detection", IMAGES[:1], {"top_k": 2}, "unknown parameter(s) 'top_k'"),
])
def test_bad_inputs_and_parameters_are_refused(classifier: ImageRunner, detector: ImageRunner, task: str,
                                               inputs: list[Any], parameters: dict[str, Any], complaint: str) -> None:
    runner = classifier if task == "image-classification" else detector
    with pytest.raises(InputError) as refusal:
        runner.run(inputs, parameters)
    assert complaint in str(refusal.value)
    assert "has no tokenizer" in run_isolated(operation_of(runner, "tokenize"), ["text"], {})[0].message
