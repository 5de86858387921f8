"""What a worker serves and what every runner shares: the model spec, input checks, the default model.

Also the shape of a runner's results: a list of outputs that may carry each
input's token count (:class:`Outputs`), where an input the caller must fix
has an :class:`InputError` in place of its output, so the rest of its batch
still runs.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from zbatch.hub import BUNDLED_MODEL_NAME, bundled_model_path
from zbatch.protocol.vocabulary import CLASSIFICATION, EMBEDDINGS, RERANK, SPARSE_EMBEDDINGS, TOKENIZER
from zbatch.protocol.vocabulary import CUSTOM_TASK_PREFIX as CUSTOM_TASK_PREFIX
from zbatch.protocol.vocabulary import DECODE as DECODE
from zbatch.protocol.vocabulary import EMBED_ALL as EMBED_ALL
from zbatch.protocol.vocabulary import IMAGE_TASKS as IMAGE_TASKS
from zbatch.protocol.vocabulary import RUN as RUN
from zbatch.protocol.vocabulary import TOKENIZE as TOKENIZE
from zbatch.protocol.wire import MAX_LABEL_CHARS, MAX_LABELS

DEFAULT_MODEL_NAME = BUNDLED_MODEL_NAME
default_model_path = bundled_model_path  # the bundled model's folder, found without importing its package
RUNTIMES = ("auto", "torch", "onnx")  # what runs a text model: ONNX Runtime where it validates (auto), or one
TAKES_IDS = frozenset({EMBEDDINGS, SPARSE_EMBEDDINGS})  # the tasks whose ``run`` takes token ids as well as text
QUANTIZE = ("none", "int8")  # int8: ONNX Runtime's dynamic quantization, where it still validates


class InputError(ValueError):
    """The caller's inputs are unusable for this model/task (maps to status bad_request).

    The message says what was wrong and what to do, and is safe to send back to the client.
    """


@dataclass(frozen=True)
class ModelSpec:
    """What to serve: a public name, a local model folder, the task and where/how to run it.

    ``runtime`` defaults to torch here, so a caller that builds a spec gets the plain transformers model;
    the worker's ``--runtime`` defaults to auto (:mod:`worker.runners.runtime`).  ``onnx_cache``: where
    exported graphs are kept ("": the default, :func:`worker.runners.onnx_export.cache_dir`).
    """

    name: str
    path: str
    task: str = EMBEDDINGS
    device: str = "auto"
    dtype: str = "auto"
    max_batch_size: int = 0  # 0: the device's default (worker.runners.device.batch_size), resolved at load
    max_batch_tokens: int = 0  # most tokens one pass runs, padding included (runners.grouping); 0: no budget
    cuda_graphs: bool = True  # on CUDA: each bucket shape of a graphable model runs as a CUDA graph (runners.graphs)
    unpadded_attention: bool = False  # on an accelerator: a BERT batch runs packed where that wins (runners.packing)
    runtime: str = "torch"
    quantize: str = "none"
    onnx_cache: str = ""
    default_prompt_name: str = ""  # the prompt put before a text that names none (worker.runners.prompts)
    revision: str = ""  # of a Hub model, until worker.sources makes ``path`` its local folder
    trust_remote_code: bool = False  # transformers may run the model's own code (config.json auto_map)

    @property
    def pretrained(self) -> dict[str, Any]:
        """What each ``from_pretrained`` of the model takes besides its folder: whether the model's own code may
        run (never unless the operator said so, and then worker.sources has let it through)."""
        return {"trust_remote_code": self.trust_remote_code}


def quoted_names(keys: list[str]) -> str:
    return ", ".join(map(repr, keys))


class Outputs(list[Any]):
    """A runner's outputs, one per input, and the tokens the model took for each input when the runner counts
    them: after truncation, special tokens included.  A plain list to a caller that wants only the outputs."""

    def __init__(self, outputs: Iterable[Any] = (), tokens: list[int] | None = None) -> None:
        super().__init__(outputs)
        self.tokens = tokens


@dataclass(frozen=True, slots=True)
class ModelDetails:
    """What a loaded model tells the HTTP dialects about itself (READY's optional model keys); empty: unknown."""

    max_length: int | None = None
    dimensions: int | None = None
    dtype: str = ""
    labels: tuple[str, ...] = ()
    tokenizer: str = ""  # the fingerprint of the tokenizer a sender may tokenize with (token_ids.edge_form)
    max_batch_tokens: int | None = None  # most tokens one pass runs, padding included, where a budget is set


def announced_labels(id2label: dict[int, Any] | None) -> tuple[str, ...]:
    """A classifier's labels by id, as READY may carry them; none if there are too many, or too long ones."""
    labels = tuple(str(label) for _, label in sorted((id2label or {}).items()))
    fits = len(labels) <= MAX_LABELS and all(0 < len(label) <= MAX_LABEL_CHARS and label.isprintable()
                                             for label in labels)
    return labels if fits else ()


class InputKind(enum.Enum):
    """What one input of a task must be; the value says it to a caller who sent something else."""

    TEXT = "strings"
    PAIR = "[query, text] pairs: arrays of two strings"
    TEXT_OR_PAIR = "strings, or [text, text_pair] arrays of two strings"
    IMAGE = "images: the bytes of an image file (msgpack bin), such as a JPEG or a PNG"
    IDS = "token ids: one-dimensional arrays of whole numbers (ext-1 integer arrays)"
    TEXT_OR_IDS = "strings, or token ids: one-dimensional arrays of whole numbers (ext-1 integer arrays)"
    ANY = "any inputs"

    def accepts(self, value: Any) -> bool:
        if self is InputKind.TEXT:
            return isinstance(value, str)
        if self is InputKind.PAIR:
            return is_pair(value)
        if self is InputKind.TEXT_OR_PAIR:
            return isinstance(value, str) or is_pair(value)
        if self is InputKind.IMAGE:
            return isinstance(value, bytes)
        if self is InputKind.IDS:
            return is_ids(value)
        if self is InputKind.TEXT_OR_IDS:
            return isinstance(value, str) or is_ids(value)
        return True


def is_ids(value: Any) -> bool:
    """Whether ``value`` is token ids: a one-dimensional integer array."""
    return isinstance(value, np.ndarray) and value.ndim == 1 and value.dtype.kind in ("i", "u")


def is_pair(value: Any) -> bool:
    return isinstance(value, list) and len(value) == 2 and all(isinstance(text, str) for text in value)


def input_kind(task: str, operation: str = RUN) -> InputKind:
    """What the inputs of ``task`` must be (a runner of your own checks its own)."""
    if operation == DECODE:
        return InputKind.IDS
    if task in TAKES_IDS and operation in (RUN, EMBED_ALL):
        return InputKind.TEXT_OR_IDS
    if operation in (TOKENIZE, EMBED_ALL, TOKENIZER):
        return InputKind.TEXT
    if task == RERANK:
        return InputKind.PAIR
    if task in CLASSIFICATION:
        return InputKind.TEXT_OR_PAIR
    if task in IMAGE_TASKS:
        return InputKind.IMAGE
    return InputKind.ANY if task.startswith(CUSTOM_TASK_PREFIX) else InputKind.TEXT


def check_request(task: str, operation: str, inputs: list[Any]) -> None:
    """Refuse a request for ``task`` whose inputs are not of the kind it takes, naming the first one that is not.

    The worker calls this as a request arrives, so the index is the request's own.
    """
    if operation != RUN and task in IMAGE_TASKS:
        raise InputError(f"{task} models have no tokenizer; the {operation!r} operation works on text models")
    check_inputs(inputs, input_kind(task, operation), task if operation == RUN else f"'{operation}'")


def check_inputs(inputs: Any, kind: InputKind = InputKind.TEXT, task: str = "this task") -> None:
    """Reject anything but a non-empty list of inputs of ``kind`` before it reaches a tokenizer or a decoder."""
    if not isinstance(inputs, list) or not inputs:
        raise InputError(f"inputs must be a non-empty list of {kind.value}")
    for i, value in enumerate(inputs):
        if not kind.accepts(value):
            hint = (f" (token ids are taken by 'decode', and by the 'run' of {' and '.join(sorted(TAKES_IDS))} "
                    "models)" if is_ids(value) else "")
            raise InputError(f"inputs[{i}] is {_kind_of(value)}; {task} takes {kind.value}{hint}")


def _kind_of(value: Any) -> str:
    if isinstance(value, np.ndarray):
        return f"a {value.ndim}-dimensional {value.dtype} array"
    if isinstance(value, list):
        return f"an array of {len(value)} item(s): {', '.join(type(item).__name__ for item in value)}"
    return type(value).__name__
