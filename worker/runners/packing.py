"""Packed forward passes for BERT encoders on a CPU: a batch's tokens in one row, with no padding at all.

Theory of operation
-------------------
A padded batch pays for its longest input on every row.  On a CPU the cost of
a pass follows the tokens it runs, so padding is pure waste there, and
:mod:`worker.runners.grouping` can only trim it: each group it splits off pays
the fixed cost of another pass.

Every step of a BERT encoder but attention works on each token by itself:
the embeddings, the linear layers, the layer norms and the feed-forward
block.  So the batch's inputs, concatenated into one row of ``sum(lengths)``
tokens, go through those steps exactly as they would one by one, in one pass
and with no padding token anywhere.  Attention is the one step that mixes
tokens; it runs on each input's own slice of the row.  Positions restart at
0 for each input, as in its own pass.

The result is the model's last hidden state for every real token, packed in
the same order, equal to a padded pass to float rounding.  Only models this
module knows are packed (:func:`packer_for`); any other model runs padded.

A packed pass costs a fixed part and a part per token
(:meth:`~worker.runners.grouping.CostModel.packed_seconds`).  Attention's
share, one call per input and quadratic in its length, is left out of that
model: at these lengths it is a small part of the pass, and the model only
tells the thread governor what a batch should take.

On an accelerator (``--unpadded-attention auto``), attention runs as one
call over the whole row instead of one per input: the row is a jagged
tensor (``torch.nested``, its inputs' offsets), which CUDA's scaled
dot-product attention runs as one variable-length kernel, as TEI's flash
attention does.  Whether a batch runs so there is
:mod:`worker.runners.unpadded`'s choice.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

if TYPE_CHECKING:
    import torch


class Packer(Protocol):
    """A packed pass: the last hidden state of each token of inputs concatenated in order."""

    max_tokens: int | None  # the most tokens one packed group may hold; None: any number
    min_inputs: int  # the fewest inputs worth a packed pass: below it the padded pass runs (it has no padding)

    def __call__(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None,
                 lengths: Sequence[int]) -> torch.Tensor: ...


class PackedBert:
    """Runs a ``transformers`` BertModel's encoder over packed inputs, borrowing its own layers and weights.

    ``one_call``: attention over the whole row at once, as a jagged tensor (the accelerator's way); else one
    call per input's slice (the CPU's: there the jagged call falls back to a slower loop of its own).
    """

    max_tokens: int | None = None  # attention runs per input: a group's cost grows with its tokens alone
    min_inputs = 1

    def __init__(self, model: Any, one_call: bool = False) -> None:
        self._model = model
        self._heads = int(model.config.num_attention_heads)
        self.one_call = one_call

    def __call__(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None,
                 lengths: Sequence[int]) -> torch.Tensor:
        """The last hidden state of each token, ``(sum(lengths), hidden)``, for inputs concatenated in order."""
        import torch

        embeddings = self._model.embeddings
        positions = torch.from_numpy(restarting_positions(lengths)).to(input_ids.device, non_blocking=True)
        row = _Row.of(lengths, input_ids.device) if self.one_call else None
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        hidden = (embeddings.word_embeddings(input_ids) + embeddings.token_type_embeddings(token_type_ids)
                  + embeddings.position_embeddings(positions))
        hidden = embeddings.LayerNorm(hidden)
        for layer in self._model.encoder.layer:
            attention = layer.attention
            context = self._attend(attention.self, hidden, lengths, row)
            hidden = attention.output.LayerNorm(attention.output.dense(context) + hidden)
            hidden = layer.output.LayerNorm(layer.output.dense(layer.intermediate(hidden)) + hidden)
        return hidden  # type: ignore[no-any-return]  # transformers' layers are untyped

    def _attend(self, attention: Any, hidden: torch.Tensor, lengths: Sequence[int],
                row: _Row | None) -> torch.Tensor:
        """Self-attention of each input over its own tokens only: the one step that mixes tokens; in one call
        over the jagged ``row`` where there is one."""
        import torch
        from torch.nn.functional import scaled_dot_product_attention

        tokens = hidden.shape[0]
        per_head = int(attention.attention_head_size)
        query, key, value = (projection(hidden).view(tokens, self._heads, per_head).transpose(0, 1)
                             for projection in (attention.query, attention.key, attention.value))
        if row is not None:
            return row.attended(query, key, value).reshape(tokens, self._heads * per_head)
        contexts = []
        start = 0
        for length in lengths:
            span = slice(start, start + length)
            contexts.append(scaled_dot_product_attention(query[:, span], key[:, span], value[:, span]))
            start += length
        return torch.cat(contexts, dim=1).transpose(0, 1).reshape(tokens, self._heads * per_head)


def restarting_positions(lengths: Sequence[int]) -> np.ndarray:
    """Each token's position in its own input, for inputs of ``lengths`` concatenated: 0, 1, .. 0, 1, .."""
    counts = np.asarray(lengths, dtype=np.int64)
    starts = np.cumsum(counts) - counts
    return np.arange(int(counts.sum()), dtype=np.int64) - np.repeat(starts, counts)


@dataclass(frozen=True, slots=True)
class _Row:
    """A packed row's inputs as a jagged tensor takes them: offsets on the device, the shortest and longest
    length from the host, so that no layer waits for the device or copies them again."""

    offsets: torch.Tensor
    shortest: int
    longest: int

    @classmethod
    def of(cls, lengths: Sequence[int], device: Any) -> _Row:
        import torch

        bounds = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=bounds[1:])
        return cls(torch.from_numpy(bounds).to(device, non_blocking=True), min(lengths), max(lengths))

    def attended(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
        """Attention of each input over its own tokens, all inputs in one call: ``(heads, tokens, per_head)``
        in, ``(tokens, heads, per_head)`` out."""
        import torch
        from torch.nn.functional import scaled_dot_product_attention

        def jagged(projected: torch.Tensor) -> torch.Tensor:  # (heads, tokens, d) -> (inputs, heads, j, d)
            return torch.nested.nested_tensor_from_jagged(projected.transpose(0, 1), self.offsets,
                                                          min_seqlen=self.shortest,
                                                          max_seqlen=self.longest).transpose(1, 2)

        attended = scaled_dot_product_attention(jagged(query), jagged(key), jagged(value))
        return attended.transpose(1, 2).values()  # a jagged tensor's rows, packed


def packer_for(model: Any, device: str, unpadded_attention: bool = False) -> PackedBert | None:
    """A packed runner for ``model`` on ``device``, or None where padded passes are the right way.

    Only a plain BERT encoder (``BertModel``: absolute positions, not a decoder) in eval mode (the packed
    pass has no dropout).  On the CPU it always packs; on an accelerator only with ``unpadded_attention``,
    with one attention call per pass, and then only for the batches it wins
    (:func:`worker.runners.unpadded.packing_pays`).
    """
    if type(model).__name__ != "BertModel" or (device != "cpu" and not unpadded_attention):
        return None  # before importing BertModel's module: a model that is not one (ONNX Runtime's) does not
    from transformers import BertModel  # pay for the import

    config = model.config
    if type(model) is not BertModel or config.is_decoder or model.training:
        return None
    if getattr(config, "position_embedding_type", "absolute") != "absolute":
        return None
    return PackedBert(model, one_call=device != "cpu")


def packed_groups(runnable: list[int], tokens: Sequence[int], max_tokens: int | None) -> list[list[int]]:
    """``runnable`` in order, cut into groups of at most ``max_tokens`` tokens each (one input longer than that
    alone); one group where there is no cap."""
    if max_tokens is None:
        return [runnable]
    groups: list[list[int]] = []
    room = 0
    for index in runnable:
        if not groups or tokens[index] > room:
            groups.append([])
            room = max_tokens
        groups[-1].append(index)
        room -= tokens[index]
    return groups
