"""What the runners that tokenize text themselves share: truncation, token counts, ``tokenize``, length groups.

Theory of operation
-------------------
:class:`TextRunner` runs a batch of texts (or ``[text, text_pair]`` pairs)
through a tokenizer and a model, one forward pass per length group:

1. Inputs and parameters are checked; a bad parameter refuses the batch.
2. A batch of several inputs is tokenized once without padding, to learn its
   lengths; :mod:`worker.runners.grouping` plans the length groups from them.
   A one-input batch skips this (no plan to make on the latency path).
3. With ``truncate`` false the lengths are taken untruncated (even for one
   input), and each input longer than the model takes is refused alone: its
   result is an :class:`InputError` saying its length and the maximum, and the
   others run.
4. Each group is tokenized padded, truncated on ``truncation_direction``, and
   run.  The attention mask of that tokenization counts each input's tokens
   as run, after truncation with special tokens, so counting costs nothing:
   results are :class:`~worker.runners.spec.Outputs` carrying those counts.

The ``tokenize`` operation (:func:`tokenize_texts`) runs the tokenizer alone
and answers TEI's ``/tokenize`` shape; the pipeline runner shares it.
torch is imported inside the functions, so importing this module stays cheap.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from worker.runners.grouping import NEVER_SPLIT, CostModel, calibrate, plan_groups
from worker.runners.spec import (
    InputError,
    InputKind,
    ModelDetails,
    ModelSpec,
    Outputs,
    check_inputs,
    quoted_names,
)

log = logging.getLogger("zbatch.worker")
TRUNCATION_PARAMETERS = frozenset({"truncate", "truncation_direction"})
TOKENIZE_PARAMETERS = frozenset({"add_special_tokens"})
DIRECTIONS = ("right", "left")
FALLBACK_MAX_LENGTH = 512  # for a model that states no maximum anywhere
UNKNOWN_LENGTH = 2**24  # tokenizers that do not know their maximum say 1e30


@dataclass(frozen=True, slots=True)
class Truncation:
    enabled: bool = True
    direction: str = "right"


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
    direction = parameters.get("truncation_direction", "right")
    if direction not in DIRECTIONS:
        raise InputError(f"parameter 'truncation_direction' must be 'right' or 'left', not {direction!r}")
    return Truncation(flag(parameters, "truncate", True), str(direction))


def model_max_length(tokenizer: Any, config: Any) -> int:
    """The fewer of the tokenizer's and the position embeddings' maxima (RoBERTa has 2 positions spare)."""
    stated = [tokenizer.model_max_length, getattr(config, "max_position_embeddings", None)]
    known = [int(n) for n in stated if isinstance(n, int) and 0 < n < UNKNOWN_LENGTH]
    if not known:
        log.warning("the model states no maximum input length; inputs are truncated to %d tokens",
                    FALLBACK_MAX_LENGTH)
    return min(known, default=FALLBACK_MAX_LENGTH)


def dtype_name(dtype: Any) -> str:
    return str(dtype).removeprefix("torch.")


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
    check_inputs(inputs, InputKind.TEXT, "'tokenize'")
    check_parameters(parameters, TOKENIZE_PARAMETERS, "'tokenize'")
    if not tokenizer.is_fast:
        raise InputError("this model's tokenizer gives no character offsets (it is not a fast tokenizer), "
                         "which 'tokenize' needs")
    encoded = tokenizer(inputs, add_special_tokens=flag(parameters, "add_special_tokens", True),
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


class TextRunner:
    """A tokenizer and a model, run over length-sorted groups; subclasses say what a forward pass returns.

    A subclass sets ``kind`` and ``parameters`` (what its task accepts
    besides truncation), builds ``details`` and implements
    :meth:`_options` (its parameters, checked) and :meth:`_forward`.
    """

    kind = InputKind.TEXT
    parameters: frozenset[str] = frozenset()
    warm_up_input: Any = "warm-up"

    def __init__(self, spec: ModelSpec, device: str, tokenizer: Any, model: Any, max_length: int) -> None:
        self.spec = spec
        self.device = device
        self.max_length = max_length
        self.cost_model = CostModel(0.0)
        self.modelled_seconds = 0.0  # what the last batch took at calibration (0: not known)
        self.details = ModelDetails(max_length, dtype=dtype_name(model.dtype))
        self._tokenizer = tokenizer
        self._model = model
        self._length_grouping = True

    def set_length_grouping(self, enabled: bool) -> None:
        """Group batches by length (the default), or run every batch as one padded pass.

        Off, the model runs as plain serving code runs it, which is what a
        comparison with such code needs.  The outputs agree either way, to
        float rounding.
        """
        self._length_grouping = enabled

    def warm_up(self) -> None:
        """Run a tiny batch (lazy initialisation), then measure what padding costs on this device."""
        self.run([self.warm_up_input], {})
        self.cost_model = calibrate(self._seconds_for)

    def tokenize(self, inputs: list[Any], parameters: dict[str, Any]) -> Outputs:
        self.modelled_seconds = 0.0
        return tokenize_texts(self._tokenizer, inputs, parameters)

    def run(self, inputs: list[Any], parameters: dict[str, Any]) -> list[Any]:
        """One output per input, in input order, with the tokens each took (refused inputs: an InputError)."""
        self.modelled_seconds = 0.0  # stays 0 if this batch is refused before it runs
        check_inputs(inputs, self.kind, self.spec.task)
        check_parameters(parameters, self.parameters | TRUNCATION_PARAMETERS, self.spec.task)
        truncation = truncation_of(parameters)
        options = self._options(parameters)
        outputs: list[Any] = [None] * len(inputs)
        tokens = [0] * len(inputs)
        with truncation_side(self._tokenizer, truncation.direction):
            lengths = self._lengths(inputs, truncation.enabled) if len(inputs) > 1 or not truncation.enabled else []
            runnable = list(range(len(inputs)))
            if not truncation.enabled:
                for index, length in enumerate(lengths):
                    if length > self.max_length:
                        outputs[index] = InputError(
                            f"this input has {length} tokens and the model takes at most {self.max_length}: "
                            "shorten it, or let the model truncate it (parameter 'truncate': true)")
                runnable = [index for index in runnable if outputs[index] is None]
            for group in self._groups(runnable, lengths):
                encoded = self._encode([inputs[i] for i in group])
                counts = encoded["attention_mask"].sum(dim=1).tolist()
                for index, output, count in zip(group, self._forward(encoded, options), counts, strict=True):
                    outputs[index], tokens[index] = output, int(count)
        return Outputs(outputs, tokens)

    def _options(self, parameters: dict[str, Any]) -> Any:
        """The task's own parameters, checked (InputError), in whatever form :meth:`_forward` takes."""
        return None

    def _forward(self, encoded: Any, options: Any) -> list[Any]:
        """One output per row of a padded, tokenized group."""
        raise NotImplementedError

    def _groups(self, runnable: list[int], lengths: Sequence[int]) -> list[list[int]]:
        """``runnable`` (indices of the batch) in the length groups that cost least to run."""
        if len(runnable) < 2 or not lengths:
            return [runnable] if runnable else []
        chosen = [lengths[i] for i in runnable]
        plan = plan_groups(chosen, self.cost_model if self._length_grouping else NEVER_SPLIT)
        self.modelled_seconds = self.cost_model.seconds(plan, chosen)
        return [[runnable[i] for i in group] for group in plan]

    def _lengths(self, inputs: list[Any], truncate: bool) -> list[int]:
        """Tokens per input, truncated or not (a fast tokenizer does 32 texts in about a millisecond)."""
        limit = {"truncation": True, "max_length": self.max_length} if truncate else {}
        return [len(ids) for ids in self._tokenizer(_texts(inputs), **limit)["input_ids"]]

    def _encode(self, inputs: list[Any]) -> Any:
        return self._tokenizer(_texts(inputs), padding=True, truncation=True, max_length=self.max_length,
                               return_tensors="pt").to(self.device)

    def _seconds_for(self, rows: int, tokens: int) -> float:
        """Time one forward pass over ``rows`` inputs of exactly ``tokens`` tokens (for calibration)."""
        import torch

        shape = (rows, min(tokens, self.max_length))
        word_id = self._tokenizer.convert_tokens_to_ids(self._tokenizer.unk_token or "a")
        assert isinstance(word_id, int)  # one token in, one id out
        batch = {"input_ids": torch.full(shape, word_id, device=self.device),
                 "attention_mask": torch.ones(shape, dtype=torch.long, device=self.device)}
        started = time.perf_counter()
        with torch.inference_mode():
            self._model(**batch)[0].float().sum().item()  # .item() waits for a GPU to finish
        return time.perf_counter() - started


def _texts(inputs: list[Any]) -> list[Any]:
    """Texts as they are, pairs as the tuples a tokenizer reads as (text, text_pair)."""
    return [tuple(item) if isinstance(item, list) else item for item in inputs]
