"""Image models: ``image-classification`` and ``object-detection``, with images decoded alone and run together.

Theory of operation
-------------------
An input is the bytes of an image file.  Every image of a batch is decoded
before the model runs, one at a time and bounded:

* only common formats are tried (:data:`FORMATS`), so a hostile file cannot
  reach PIL's rarer decoders;
* the size in the file's header is checked against :data:`MAX_PIXELS` before
  the pixels are decoded, so a small file claiming a huge image is refused
  without the memory it would take;
* an image that cannot be decoded, or is too large, is refused alone: its
  result is an :class:`~worker.runners.spec.InputError` and the others run,
  so one bad file does not split its batch in halves over and over.

The decoded images then go through the model's image processor and the model
in one call per batch, and are post-processed as transformers' pipelines do
it, so the outputs are the pipelines' (detections sorted best first).  The
pipelines themselves are not used: their collation cannot batch detection
inputs of different sizes, which the image processor pads together.

* ``image-classification``: ``[{"label", "score"}, ...]``, highest first;
  ``top_k`` (default 5; null: every label) of them.
* ``object-detection``: ``[{"label", "score", "box": {"xmin", "ymin", "xmax",
  "ymax"}}, ...]`` in pixels, highest score first, for the detections scoring
  at least ``threshold`` (default 0.5).
"""

from __future__ import annotations

import io
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from worker.runners.classify import ScoreOptions, label_scores, top_k_of
from worker.runners.encoding import check_parameters
from worker.runners.spec import (
    InputError,
    InputKind,
    ModelDetails,
    ModelSpec,
    Outputs,
    announced_labels,
    check_inputs,
)
from worker.runners.text import dtype_name
from zbatch.protocol.vocabulary import OBJECT_DETECTION, THRESHOLD, TOP_K

if TYPE_CHECKING:
    import torch
    from PIL import Image

FORMATS = ("JPEG", "PNG", "WEBP", "GIF", "BMP", "TIFF")
MAX_PIXELS = 4096 * 4096  # per image, as its header states it; decoded it takes 3 bytes a pixel
DEFAULT_TOP_K = 5
DEFAULT_THRESHOLD = 0.5


def decode_image(data: bytes, max_pixels: int = MAX_PIXELS) -> Image.Image | InputError:
    """The image in ``data`` as RGB, upright per its EXIF orientation; or why it cannot be used."""
    from PIL import Image, ImageOps

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data), formats=FORMATS)  # reads the header only
            width, height = image.size
            if width * height > max_pixels:
                return InputError(f"the image is {width}x{height} pixels, more than the limit of {max_pixels} "
                                  "pixels: send a smaller image")
            return ImageOps.exif_transpose(image).convert("RGB")
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):  # PIL's own limits, above ours
        return InputError(f"the image has more than the limit of {max_pixels} pixels: send a smaller image")
    except Exception as exc:  # PIL raises many types on a bad file; all mean the same to the caller
        return InputError(f"the input cannot be decoded as an image ({type(exc).__name__}); send a "
                          f"{', '.join(FORMATS[:-1])} or {FORMATS[-1]} file")


@dataclass(frozen=True, slots=True)
class ImageOptions:
    top_k: int | None
    threshold: float


class ImageRunner:
    """An image classifier or object detector, with its image processor, one forward pass per batch."""

    def __init__(self, spec: ModelSpec, device: str, dtype: torch.dtype) -> None:
        from transformers import AutoImageProcessor, AutoModelForImageClassification, AutoModelForObjectDetection

        self.spec = spec
        self.device = device
        self.modelled_seconds = 0.0  # no cost model for images
        self.detection = spec.task == OBJECT_DETECTION
        model_class = AutoModelForObjectDetection if self.detection else AutoModelForImageClassification
        self._processor = AutoImageProcessor.from_pretrained(spec.path, **spec.pretrained)
        self._model = model_class.from_pretrained(spec.path, **spec.pretrained).to(device=device, dtype=dtype).eval()
        self.details = ModelDetails(dtype=dtype_name(self._model.dtype),
                                    labels=announced_labels(self._model.config.id2label))

    def warm_up(self) -> None:
        """Run a one-image batch of a small grey PNG."""
        from PIL import Image

        png = io.BytesIO()
        Image.new("RGB", (64, 48), (128, 128, 128)).save(png, format="PNG")
        self.run([png.getvalue()], {})

    def run(self, inputs: list[Any], parameters: dict[str, Any]) -> list[Any]:
        """One output per image, in input order; an InputError for an image that cannot be used."""
        check_inputs(inputs, InputKind.IMAGE, self.spec.task)
        options = self._options(parameters)
        outputs: list[Any] = [decode_image(data) for data in inputs]
        decoded = [i for i, image in enumerate(outputs) if not isinstance(image, InputError)]
        if decoded:
            for index, output in zip(decoded, self._forward([outputs[i] for i in decoded], options), strict=True):
                outputs[index] = output
        return Outputs(outputs)

    def _options(self, parameters: dict[str, Any]) -> ImageOptions:
        if not self.detection:
            check_parameters(parameters, frozenset({TOP_K}), self.spec.task)
            return ImageOptions(top_k_of(parameters, DEFAULT_TOP_K), DEFAULT_THRESHOLD)
        check_parameters(parameters, frozenset({THRESHOLD}), self.spec.task)
        threshold = parameters.get(THRESHOLD, DEFAULT_THRESHOLD)
        if isinstance(threshold, bool) or not isinstance(threshold, int | float) or not 0 <= threshold <= 1:
            raise InputError(f"parameter {THRESHOLD!r} must be a number from 0 to 1, not {threshold!r}")
        return ImageOptions(DEFAULT_TOP_K, float(threshold))

    def _forward(self, images: list[Image.Image], options: ImageOptions) -> list[Any]:
        import torch

        inputs = self._processor(images=images, return_tensors="pt").to(self.device)
        inputs["pixel_values"] = inputs["pixel_values"].to(self._model.dtype)
        with torch.inference_mode():
            result = self._model(**inputs)
        if not self.detection:
            return label_scores(result.logits, self._model.config, ScoreOptions(False, options.top_k))
        sizes = [(image.height, image.width) for image in images]
        found = self._processor.post_process_object_detection(result, threshold=options.threshold,
                                                              target_sizes=sizes)
        return [self._detections(each) for each in found]

    def _detections(self, found: dict[str, Any]) -> list[dict[str, Any]]:
        """One image's detections as the object-detection pipeline gives them (whole pixels), best first."""
        labels = self._model.config.id2label
        detections = [{"label": str(labels[int(label)]), "score": float(score),
                       "box": dict(zip(("xmin", "ymin", "xmax", "ymax"), box.int().tolist(), strict=True))}
                      for score, label, box in zip(found["scores"], found["labels"], found["boxes"], strict=True)]
        return sorted(detections, key=lambda detection: -detection["score"])
