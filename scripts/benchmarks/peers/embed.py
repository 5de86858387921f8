"""The model code of the peers that take a function to serve (mosec, Triton, LitServe, Ray Serve).

Written once so that they all compute the same thing, the way sentence-transformers does for
all-MiniLM-L6-v2: tokenise with truncation at MAX_TOKENS, one forward pass padded to the longest
text of the batch, mean pooling over the attention mask, L2 norm; float32, TORCH_THREADS threads.
That is one padded pass per batch, as the Hugging Face guide's servers and a plain offline loop
run it (zbatch's own padding-aware grouping is not lent to its peers).  On a GPU host the gpu case
names the device and dtype (``ZBATCH_PEER_DEVICE``, ``ZBATCH_PEER_DTYPE``): the pooling stays float32.
Infinity brings its own model code (sentence-transformers') and does not use this module.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from scripts.benchmarks.peers import DEVICE_ENV, DTYPE_ENV, MAX_TOKENS, TORCH_THREADS


class Embedder:
    """all-MiniLM-L6-v2 loaded from a folder; :meth:`__call__` embeds a batch of texts."""

    def __init__(self, path: str) -> None:
        import torch
        from transformers import AutoModel, AutoTokenizer

        torch.set_num_threads(TORCH_THREADS)
        self._torch = torch
        self._device = os.environ.get(DEVICE_ENV, "cpu")
        dtype = getattr(torch, os.environ.get(DTYPE_ENV, "float32"))
        self._tokenizer: Any = AutoTokenizer.from_pretrained(path)
        self._model: Any = AutoModel.from_pretrained(path).to(self._device, dtype).eval()

    def __call__(self, texts: list[str]) -> np.ndarray:
        """One unit-length float32 vector per text, a (len(texts), 384) array."""
        torch = self._torch
        encoded = self._tokenizer(texts, padding=True, truncation=True, max_length=MAX_TOKENS,
                                  return_tensors="pt").to(self._device)
        with torch.inference_mode():
            hidden = self._model(**encoded).last_hidden_state.float()
            mask = encoded["attention_mask"].unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
            return torch.nn.functional.normalize(pooled, p=2, dim=1).cpu().numpy()  # type: ignore[no-any-return]
