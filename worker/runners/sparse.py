"""Sparse embeddings (the ``sparse-embeddings`` task): a SPLADE-style masked-LM model's weight per vocabulary entry.

For each input the model's masked-LM logits, ``log(1 + relu(logit))`` at
every real token (padding masked out), then the largest over the tokens for
each vocabulary entry: what TEI's SPLADE pooling and sentence-transformers'
``SpladePooling`` compute.  Most entries are 0; the output keeps the others,
``{"indices": int32 [M], "values": float32 [M]}`` in vocabulary order
(PROTOCOL.md 5.2).  Batching, truncation, token counts and prompts are the
text runners' (:mod:`worker.runners.text`); the vocabulary's size is the
``dimensions`` READY announces.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np

from worker.runners.encoding import load_tokenizer, model_max_length
from worker.runners.spec import InputKind, ModelSpec
from worker.runners.text import TextRunner, load_model
from zbatch.protocol.vocabulary import SPARSE_INDICES, SPARSE_VALUES

if TYPE_CHECKING:
    import torch


class SparseEmbeddingRunner(TextRunner):
    """A masked-LM model (``AutoModelForMaskedLM``) pooled the SPLADE way."""

    takes_prompts = True
    kind = InputKind.TEXT_OR_IDS  # token ids as well as texts (worker.runners.token_ids)

    def __init__(self, spec: ModelSpec, device: str, dtype: torch.dtype) -> None:
        tokenizer = load_tokenizer(spec)
        model = load_model("AutoModelForMaskedLM", spec, device, dtype)
        super().__init__(spec, device, tokenizer, model, model_max_length(tokenizer, model.config))
        self.details = replace(self.details, dimensions=int(model.config.vocab_size))

    def _forward(self, encoded: Any, options: Any) -> list[dict[str, np.ndarray]]:
        """Each row's vocabulary entries of weight above 0, and their weights."""
        import torch

        with torch.inference_mode():
            logits = self._model(**encoded).logits.float()
            mask = encoded["attention_mask"].unsqueeze(-1).to(logits.dtype)
            weights = (torch.log1p(torch.relu(logits)) * mask).amax(dim=1).cpu().numpy()
        return [sparse_entries(row) for row in weights]


def sparse_entries(weights: np.ndarray) -> dict[str, np.ndarray]:
    """A dense weight vector's entries above 0: their indices (int32) and weights (float32)."""
    indices = np.flatnonzero(weights > 0).astype(np.int32)
    return {SPARSE_INDICES: indices, SPARSE_VALUES: weights[indices].astype(np.float32)}
