"""Sentence embeddings, computed exactly like sentence-transformers, with padding-aware grouping.

Runs on the worker's inference thread.  Each batch is tokenised once to learn
the input lengths; :mod:`worker.runners.grouping` then decides whether running it as
a few length-sorted groups costs less than one padded pass (it does on a CPU,
rarely on a GPU).  Outputs come back in input order either way.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from worker.runners.grouping import NEVER_SPLIT, CostModel, calibrate, plan_groups
from worker.runners.spec import InputError, ModelSpec, check_inputs, quoted_names

if TYPE_CHECKING:
    import torch


class EmbeddingRunner:
    """Mean pooling over the attention mask, then L2 norm, like sentence-transformers."""

    def __init__(self, spec: ModelSpec, device: str, dtype: torch.dtype) -> None:
        from transformers import AutoModel, AutoTokenizer

        self.spec = spec
        self.device = device
        self._tokenizer = AutoTokenizer.from_pretrained(spec.path, use_fast=True)
        self._model = AutoModel.from_pretrained(spec.path).to(device=device, dtype=dtype).eval()
        self.max_length = self._max_length()
        self.cost_model = CostModel(0.0)
        self.modelled_seconds = 0.0  # what the last batch took at calibration (0: not known)
        self._length_grouping = True

    def set_length_grouping(self, enabled: bool) -> None:
        """Group batches by length (the default), or run every batch as one padded pass.

        Off, the model runs as plain serving code runs it, which is what a
        comparison with such code needs.  The embeddings agree either way, to
        float rounding.
        """
        self._length_grouping = enabled

    def warm_up(self) -> None:
        """Run a tiny batch (lazy initialisation), then measure what padding costs on this device."""
        self.run(["warm-up"], {})
        self.cost_model = calibrate(self._seconds_for)

    def _max_length(self) -> int:
        """Use the length the sentence-transformers model was trained with, as its own loader does."""
        st_config = Path(self.spec.path) / "sentence_bert_config.json"
        if st_config.is_file():
            configured = json.loads(st_config.read_text(encoding="utf-8")).get("max_seq_length")
            if configured:
                return int(configured)
        return int(min(self._tokenizer.model_max_length, self._model.config.max_position_embeddings))

    def run(self, inputs: list[str], parameters: dict[str, Any]) -> list[np.ndarray]:
        """One 1-D float32 vector per input, in input order."""
        self.modelled_seconds = 0.0  # stays 0 if this batch is refused before it runs
        check_inputs(inputs)
        unknown = sorted(set(parameters) - {"normalize"})
        if unknown:
            raise InputError(f"unknown parameter(s) {quoted_names(unknown)} for embeddings; use only 'normalize'")
        normalize = parameters.get("normalize", True)
        if not isinstance(normalize, bool):
            raise InputError(f"parameter 'normalize' must be true or false, not {normalize!r}")

        if len(inputs) == 1:  # no plan to make, and no second tokenisation on the latency path
            return self._embed(inputs, normalize)
        lengths = self._lengths(inputs)
        groups = plan_groups(lengths, self.cost_model if self._length_grouping else NEVER_SPLIT)
        self.modelled_seconds = self.cost_model.seconds(groups, lengths)
        outputs: list[np.ndarray] = [np.empty(0, np.float32)] * len(inputs)
        for group in groups:
            for index, vector in zip(group, self._embed([inputs[i] for i in group], normalize), strict=True):
                outputs[index] = vector
        return outputs

    def _lengths(self, texts: list[str]) -> list[int]:
        """Tokens per text after truncation (a fast tokenizer does 32 texts in about a millisecond)."""
        encoded = self._tokenizer(texts, truncation=True, max_length=self.max_length)
        return [len(ids) for ids in encoded["input_ids"]]

    def _embed(self, texts: list[str], normalize: bool) -> list[np.ndarray]:
        """One forward pass over ``texts`` padded to the longest of them."""
        import torch

        batch = self._tokenizer(
            texts, padding=True, truncation=True, max_length=self.max_length, return_tensors="pt"
        ).to(self.device)
        with torch.inference_mode():
            hidden = self._model(**batch).last_hidden_state.float()  # pool in float32 even for half models
            mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
            embeddings = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
            if normalize:
                embeddings = torch.nn.functional.normalize(embeddings, p=2, dim=1)
        return list(embeddings.cpu().numpy())

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
            self._model(**batch).last_hidden_state.sum().item()  # .item() waits for a GPU to finish
        return time.perf_counter() - started
