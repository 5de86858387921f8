"""The operations besides ``run`` and ``tokenize`` (PROTOCOL.md 5.3): ``decode`` and ``embed_all``.

* ``decode``: each input, a 1-D integer array of token ids, back to its text
  with the model's tokenizer; ``skip_special_tokens`` (default true) leaves
  out ``[CLS]``, ``[SEP]`` and the like.  An id outside the vocabulary refuses
  its input alone (:func:`~worker.runners.token_ids.outside_vocabulary`, the
  check ``run`` makes of ids too).  Only the tokenizer runs.
* ``embed_all``: an embeddings model's last hidden state without pooling,
  one float32 row per token of each input (special tokens included, after
  truncation and any prompt), not normalized: what TEI's ``/embed_all``
  answers.  The batch is tokenized and grouped as ``run`` does it
  (:class:`~worker.runners.text.TextRunner`), so ``truncate``,
  ``truncation_direction`` and ``prompt_name`` mean the same.

The runners' ``decode`` and ``embed_all`` methods call these; a runner
without them refuses the operation (:func:`worker.runners.base.operation_of`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from worker.runners.spec import InputError, InputKind, Outputs, check_inputs
from worker.runners.token_ids import outside_vocabulary
from zbatch.protocol.vocabulary import DECODE, SKIP_SPECIAL_TOKENS


def decode_ids(tokenizer: Any, inputs: list[Any], parameters: dict[str, Any]) -> Outputs:
    """The text of each input's token ids; tokens counts the ids."""
    check_inputs(inputs, InputKind.IDS, f"'{DECODE}'")
    unknown = sorted(set(parameters) - {SKIP_SPECIAL_TOKENS})
    if unknown:
        raise InputError(f"unknown parameter(s) {unknown} for '{DECODE}'; use only {SKIP_SPECIAL_TOKENS!r}")
    skip = parameters.get(SKIP_SPECIAL_TOKENS, True)
    if not isinstance(skip, bool):
        raise InputError(f"parameter {SKIP_SPECIAL_TOKENS!r} must be true or false, not {skip!r}")
    vocabulary = len(tokenizer)
    outputs: list[Any] = []
    for ids in inputs:
        refusal = outside_vocabulary(ids, vocabulary)
        outputs.append(InputError(refusal) if refusal else tokenizer.decode(ids.tolist(), skip_special_tokens=skip))
    return Outputs(outputs, [int(ids.size) for ids in inputs])


def token_rows(hidden: Any, attention_mask: np.ndarray) -> list[np.ndarray]:
    """Each row's vectors for its real tokens (where the mask is 1, whichever side it was padded on)."""
    vectors = hidden.float().cpu().numpy()
    return [vectors[row][attention_mask[row].astype(bool)] for row in range(len(attention_mask))]


def unpooled(planned: Any, forward: Callable[[dict[str, np.ndarray], bool], list[np.ndarray]]) -> Outputs:
    """A planned batch's token vectors: ``forward(arrays, packed)`` gives one [tokens, hidden] array per row
    of a group (a bucket's filler rows last, dropped here); refused inputs keep their error."""
    outputs = list(planned.outputs)
    for group, arrays in planned.groups:
        for index, rows in zip(group, forward(arrays, planned.packed)[:len(group)], strict=True):
            outputs[index] = np.ascontiguousarray(rows, dtype=np.float32)
    return Outputs(outputs, list(planned.tokens))
