"""Inputs as a text model takes them before padding: truncation, encodings, their rows padded or concatenated.

What every text runner (:mod:`worker.runners.text` and the runners built on
it) and the pipeline runner share about tokenizing, apart from running a
model: the ``truncate`` and ``truncation_direction`` parameters
(:func:`truncation_of`), one input's :class:`Encoding` (its token rows, no
padding), the model's maximum length, the fast tokenizer's load, and the
``tokenize`` operation (:func:`tokenize_texts`, TEI's ``/tokenize`` shape).
A batch's encodings become a model's arrays here too: padded to one length
(:func:`pad_rows`) or concatenated into one row (:func:`concatenated`, for a
packed pass).  Nothing here imports torch.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from worker.runners.phases import phase
from worker.runners.spec import InputError, InputKind, ModelSpec, Outputs, check_inputs, quoted_names
from zbatch.protocol.vocabulary import ADD_SPECIAL_TOKENS, TOKENIZE, TRUNCATE, TRUNCATION_DIRECTION

log = logging.getLogger("zbatch.worker")
TRUNCATION_PARAMETERS = frozenset({TRUNCATE, TRUNCATION_DIRECTION})
TOKENIZE_PARAMETERS = frozenset({ADD_SPECIAL_TOKENS})
DIRECTIONS = ("right", "left")
FALLBACK_MAX_LENGTH = 512  # for a model that states no maximum anywhere
UNKNOWN_LENGTH = 2**24  # tokenizers that do not know their maximum say 1e30


@dataclass(frozen=True, slots=True)
class Truncation:
    enabled: bool = True
    direction: str = "right"


@dataclass(frozen=True, slots=True)
class Encoding:
    """One input as the model takes it, before padding: its row of each of the tokenizer's outputs but the
    attention mask (``input_ids``, and ``token_type_ids`` for models that take them)."""

    rows: dict[str, np.ndarray]

    @property
    def length(self) -> int:
        """The input's tokens as the model runs them: truncated, special tokens included."""
        return len(self.rows["input_ids"])


def check_parameters(parameters: dict[str, Any], accepted: frozenset[str], task: str) -> None:
    unknown = sorted(set(parameters) - accepted)
    if unknown:
        raise InputError(f"unknown parameter(s) {quoted_names(unknown)} for {task}; use only "
                         f"{quoted_names(sorted(accepted))}")


def flag(parameters: dict[str, Any], name: str, default: bool) -> bool:
    value = parameters.get(name, default)
    if not isinstance(value, bool):
        raise InputError(f"parameter {name!r} must be true or false, not {value!r}")
    return value


def truncation_of(parameters: dict[str, Any]) -> Truncation:
    direction = parameters.get(TRUNCATION_DIRECTION, "right")
    if direction not in DIRECTIONS:
        raise InputError(f"parameter {TRUNCATION_DIRECTION!r} must be 'right' or 'left', not {direction!r}")
    return Truncation(flag(parameters, TRUNCATE, True), str(direction))


def model_max_length(tokenizer: Any, config: Any) -> int:
    """The fewer of the tokenizer's and the position embeddings' maxima (RoBERTa has 2 positions spare)."""
    stated = [tokenizer.model_max_length, getattr(config, "max_position_embeddings", None)]
    known = [int(n) for n in stated if isinstance(n, int) and 0 < n < UNKNOWN_LENGTH]
    if not known:
        log.warning("the model states no maximum input length; inputs are truncated to %d tokens",
                    FALLBACK_MAX_LENGTH)
    return min(known, default=FALLBACK_MAX_LENGTH)


@contextlib.contextmanager
def truncation_side(tokenizer: Any, side: str) -> Iterator[None]:
    """Truncate on ``side`` within the block; the tokenizer takes it as an attribute, not an argument."""
    previous = tokenizer.truncation_side
    tokenizer.truncation_side = side
    try:
        yield
    finally:
        tokenizer.truncation_side = previous


def tokenize_texts(tokenizer: Any, inputs: list[Any], parameters: dict[str, Any]) -> Outputs:
    """Each text's tokens as TEI's ``/tokenize`` gives them: id, text, special, and character offsets.

    A special token's ``text`` is the token itself and its offsets are nil;
    any other token's ``text`` is the piece of the input it stands for.
    """
    check_inputs(inputs, InputKind.TEXT, repr(TOKENIZE))
    check_parameters(parameters, TOKENIZE_PARAMETERS, repr(TOKENIZE))
    if not tokenizer.is_fast:
        raise InputError("this model's tokenizer gives no character offsets (it is not a fast tokenizer), "
                         f"which {TOKENIZE!r} needs")
    encoded = tokenizer(inputs, add_special_tokens=flag(parameters, ADD_SPECIAL_TOKENS, True),
                        return_offsets_mapping=True, return_special_tokens_mask=True)
    outputs = []
    for index, text in enumerate(inputs):
        tokens = []
        for token_id, token, special, (start, stop) in zip(
                encoded["input_ids"][index], encoded.tokens(index), encoded["special_tokens_mask"][index],
                encoded["offset_mapping"][index], strict=True):
            if special:
                tokens.append({"id": token_id, "text": token, "special": True, "start": None, "stop": None})
            else:
                tokens.append({"id": token_id, "text": text[start:stop], "special": False, "start": start,
                               "stop": stop})
        outputs.append(tokens)
    return Outputs(outputs, [len(tokens) for tokens in outputs])


def load_tokenizer(spec: ModelSpec) -> Any:
    """The model's fast tokenizer (a phase of the start: :mod:`worker.runners.phases`)."""
    with phase("tokenizer"):
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(spec.path, use_fast=True, **spec.pretrained)


def pad_rows(encodings: Sequence[Encoding], length: int, pads: dict[str, int], left: bool) -> dict[str, np.ndarray]:
    """Each encoding's rows padded to ``length`` with ``pads`` (on the left if ``left``), and the attention mask."""
    arrays = {key: np.full((len(encodings), length), pad, dtype=np.int64) for key, pad in pads.items()}
    mask = np.zeros((len(encodings), length), dtype=np.int64)
    for row, each in enumerate(encodings):
        span = slice(length - each.length, length) if left else slice(0, each.length)
        for key, values in each.rows.items():
            arrays[key][row, span] = values
        mask[row, span] = 1
    return {**arrays, "attention_mask": mask}


def concatenated(encodings: list[Encoding]) -> dict[str, np.ndarray]:
    """A packed group's arrays: each of the tokenizer's rows concatenated in order, and each input's length."""
    arrays = {key: np.concatenate([each.rows[key] for each in encodings]) for key in encodings[0].rows}
    return {**arrays, "lengths": np.asarray([each.length for each in encodings], dtype=np.int64)}
