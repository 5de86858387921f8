"""Sentence embeddings, computed exactly like sentence-transformers, with padding-aware grouping.

Runs on the worker's inference thread as a :class:`~worker.runners.text.TextRunner`:
each batch is tokenised once to learn the input lengths.  A BERT encoder on a
CPU then runs the batch as one packed pass with no padding
(:mod:`worker.runners.packing`); any other model runs length-sorted groups
where :mod:`worker.runners.grouping` finds them cheaper than one padded pass
(it does on a CPU, rarely on a GPU).  Outputs come back in input order
either way.

Parameters: ``normalize`` (default true: unit length), ``dimensions`` (keep
the first N numbers, re-normalised when ``normalize``: what
Matryoshka-trained models are made for), truncation
(:mod:`worker.runners.text`) and ``prompt_name`` (:mod:`worker.runners.prompts`).
The ``embed_all`` operation answers each token's vector instead
(:mod:`worker.runners.operations`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from worker.runners.graphs import GraphedPooling, graphable
from worker.runners.operations import token_rows, unpooled
from worker.runners.packing import packer_for
from worker.runners.spec import InputError, ModelSpec, Outputs
from worker.runners.text import TRUNCATION_PARAMETERS, TextRunner, check_parameters, flag, model_max_length
from zbatch.protocol.vocabulary import EMBED_ALL, PROMPT_NAME

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True, slots=True)
class EmbeddingOptions:
    normalize: bool
    dimensions: int | None


class EmbeddingRunner(TextRunner):
    """Mean pooling over the attention mask, then L2 norm, like sentence-transformers."""

    parameters = frozenset({"normalize", "dimensions"})
    takes_prompts = True

    def __init__(self, spec: ModelSpec, device: str, dtype: torch.dtype) -> None:
        from transformers import AutoModel, AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(spec.path, use_fast=True, **spec.pretrained)
        model = AutoModel.from_pretrained(spec.path, **spec.pretrained).to(device=device, dtype=dtype).eval()
        super().__init__(spec, device, tokenizer, model, _max_length(spec.path, tokenizer, model.config))
        self._packer = packer_for(model, device)
        use_graphs = device.startswith("cuda") and spec.cuda_graphs != "off" and graphable(model)
        self._graphs = GraphedPooling(model, device) if use_graphs else None
        self.dimensions = int(model.config.hidden_size)
        self.details = replace(self.details, dimensions=self.dimensions)

    def warm_up(self) -> None:
        """Warm every shape up eagerly, then capture the CUDA graphs (:mod:`worker.runners.graphs`)."""
        super().warm_up()
        if self._graphs is not None and self.buckets is not None:
            self._graphs.capture(self.buckets.shapes())

    def embed_all(self, inputs: list[Any], parameters: dict[str, Any]) -> Outputs:
        """Each input's token vectors, unpooled and not normalized (``embed_all``, worker.runners.operations)."""
        import torch

        self.modelled_seconds = 0.0
        check_parameters(parameters, TRUNCATION_PARAMETERS | {PROMPT_NAME}, f"'{EMBED_ALL}'")
        planned = self.plan(self.encode(inputs, parameters), {})

        def forward(arrays: dict[str, np.ndarray], packed: bool) -> list[np.ndarray]:
            encoded = {key: torch.from_numpy(array).to(self.device) for key, array in arrays.items()}
            with torch.inference_mode():
                if packed:
                    assert self._packer is not None
                    lengths = encoded["lengths"].tolist()
                    hidden = self._packer(encoded["input_ids"], encoded.get("token_type_ids"), lengths).float()
                    return [rows.cpu().numpy() for rows in torch.split(hidden, lengths)]
                return token_rows(self._model(**encoded).last_hidden_state, arrays["attention_mask"])

        return unpooled(planned, forward)

    def _options(self, parameters: dict[str, Any]) -> EmbeddingOptions:
        dimensions = parameters.get("dimensions")
        if dimensions is not None and (isinstance(dimensions, bool) or not isinstance(dimensions, int)
                                       or not 1 <= dimensions <= self.dimensions):
            raise InputError(f"parameter 'dimensions' must be a whole number from 1 to {self.dimensions} (this "
                             f"model's size), not {dimensions!r}")
        return EmbeddingOptions(flag(parameters, "normalize", True), dimensions)

    def _forward(self, encoded: Any, options: EmbeddingOptions) -> list[np.ndarray]:
        """One 1-D float32 vector per row of the group."""
        import torch

        with torch.inference_mode():
            pooled = self._graphs.pooled(encoded) if self._graphs is not None else None
            if pooled is not None:
                return _finished(pooled, options)
            hidden = self._model(**encoded).last_hidden_state.float()  # pool in float32 even for half models
            mask = encoded["attention_mask"].unsqueeze(-1).to(hidden.dtype)
            embeddings = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
            return _finished(embeddings, options)

    def _forward_packed(self, encoded: Any, options: EmbeddingOptions) -> list[np.ndarray]:
        """One 1-D float32 vector per input of a packed group: the mean of its own tokens."""
        import torch

        assert self._packer is not None
        lengths = encoded["lengths"].tolist()
        with torch.inference_mode():
            hidden = self._packer(encoded["input_ids"], encoded.get("token_type_ids"), lengths).float()
            embeddings = torch.stack([tokens.mean(dim=0) for tokens in torch.split(hidden, lengths)])
            return _finished(embeddings, options)


def _finished(embeddings: torch.Tensor, options: EmbeddingOptions) -> list[np.ndarray]:
    """Pooled embeddings cut to ``dimensions`` and normalised as asked, one numpy vector per row."""
    import torch

    if options.dimensions is not None:
        embeddings = embeddings[:, :options.dimensions]
    if options.normalize:
        embeddings = torch.nn.functional.normalize(embeddings, p=2, dim=1)
    return list(embeddings.cpu().numpy())


def _max_length(path: str, tokenizer: Any, config: Any) -> int:
    """The length the sentence-transformers model was trained with, as its own loader uses; else the model's."""
    st_config = Path(path) / "sentence_bert_config.json"
    if st_config.is_file():
        configured = json.loads(st_config.read_text(encoding="utf-8")).get("max_seq_length")
        if configured:
            return int(configured)
    return model_max_length(tokenizer, config)
