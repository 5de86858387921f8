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
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import torch


class Packer(Protocol):
    """A packed pass: the last hidden state of each token of inputs concatenated in order."""

    max_tokens: int | None  # the most tokens one packed group may hold; None: any number
    min_inputs: int  # the fewest inputs worth a packed pass: below it the padded pass runs (it has no padding)

    def __call__(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None,
                 lengths: Sequence[int]) -> torch.Tensor: ...


class PackedBert:
    """Runs a ``transformers`` BertModel's encoder over packed inputs, borrowing its own layers and weights."""

    max_tokens: int | None = None  # attention runs per input: a group's cost grows with its tokens alone
    min_inputs = 1

    def __init__(self, model: Any) -> None:
        self._model = model
        self._heads = int(model.config.num_attention_heads)

    def __call__(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None,
                 lengths: Sequence[int]) -> torch.Tensor:
        """The last hidden state of each token, ``(sum(lengths), hidden)``, for inputs concatenated in order."""
        import torch

        embeddings = self._model.embeddings
        positions = torch.cat([torch.arange(length, device=input_ids.device) for length in lengths])
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        hidden = (embeddings.word_embeddings(input_ids) + embeddings.token_type_embeddings(token_type_ids)
                  + embeddings.position_embeddings(positions))
        hidden = embeddings.LayerNorm(hidden)
        for layer in self._model.encoder.layer:
            attention = layer.attention
            context = self._attend(attention.self, hidden, lengths)
            hidden = attention.output.LayerNorm(attention.output.dense(context) + hidden)
            hidden = layer.output.LayerNorm(layer.output.dense(layer.intermediate(hidden)) + hidden)
        return hidden  # type: ignore[no-any-return]  # transformers' layers are untyped

    def _attend(self, attention: Any, hidden: torch.Tensor, lengths: Sequence[int]) -> torch.Tensor:
        """Self-attention of each input over its own tokens only: the one step that mixes tokens."""
        import torch
        from torch.nn.functional import scaled_dot_product_attention

        tokens = hidden.shape[0]
        per_head = int(attention.attention_head_size)
        query, key, value = (projection(hidden).view(tokens, self._heads, per_head).transpose(0, 1)
                             for projection in (attention.query, attention.key, attention.value))
        contexts = []
        start = 0
        for length in lengths:
            span = slice(start, start + length)
            contexts.append(scaled_dot_product_attention(query[:, span], key[:, span], value[:, span]))
            start += length
        return torch.cat(contexts, dim=1).transpose(0, 1).reshape(tokens, self._heads * per_head)


def packer_for(model: Any, device: str) -> PackedBert | None:
    """A packed runner for ``model`` on ``device``, or None where padded passes are the right way.

    Only a plain BERT encoder (``BertModel``: absolute positions, not a decoder) in eval mode (the packed
    pass has no dropout) on the CPU.  On a GPU padding is nearly free and one attention call per input
    would cost more than it saves.
    """
    if device != "cpu" or type(model).__name__ != "BertModel":  # before importing BertModel's module: a model
        return None  # that is not one (ONNX Runtime's) does not pay for the import
    from transformers import BertModel

    config = model.config
    if type(model) is not BertModel or config.is_decoder or model.training:
        return None
    if getattr(config, "position_embedding_type", "absolute") != "absolute":
        return None
    return PackedBert(model)
