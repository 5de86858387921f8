"""Sequence classifiers: cross-encoders that score [query, text] pairs (``rerank``), and text classifiers.

Both are an ``AutoModelForSequenceClassification`` run as a
:class:`~worker.runners.text.TextRunner`, so pairs and texts from many
requests share a batch, grouped by length, and every output comes with its
token count.

* ``rerank``: inputs are ``[query, text]`` pairs; the output of each is one
  float, the relevance: the sigmoid of the model's single logit, or the logit
  itself with ``raw_scores``.  The model must have one label.
* ``text-classification``: inputs are texts or ``[text, text_pair]`` pairs;
  the output of each is ``[{"label", "score"}, ...]`` for every label, highest
  first (``top_k``: only the first k).  Scores are the softmax of the logits,
  or their sigmoid for a model with one label or a multi-label model, as
  transformers' pipeline does; ``raw_scores`` gives the logits.

:func:`label_scores` is shared with the image classifier.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from worker.runners.encoding import flag, load_tokenizer, model_max_length
from worker.runners.spec import InputError, InputKind, ModelSpec, announced_labels
from worker.runners.text import TextRunner, load_model
from zbatch.protocol.vocabulary import RAW_SCORES, RERANK, TOP_K

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True, slots=True)
class ScoreOptions:
    raw_scores: bool
    top_k: int | None


def top_k_of(parameters: dict[str, Any], default: int | None) -> int | None:
    """``top_k``: a whole number of at least 1, or nil for every label."""
    top_k = parameters.get(TOP_K, default)
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
        raise InputError(f"parameter {TOP_K!r} must be a whole number of at least 1, or null for every label, "
                         f"not {top_k!r}")
    return top_k


def label_scores(logits: torch.Tensor, config: Any, options: ScoreOptions) -> list[list[dict[str, Any]]]:
    """Per row of ``logits``, ``{"label", "score"}`` for its best ``top_k`` labels (all if None), highest first."""
    import torch

    logits = logits.float()
    if options.raw_scores:
        scores = logits
    elif config.num_labels == 1 or config.problem_type == "multi_label_classification":
        scores = torch.sigmoid(logits)
    else:
        scores = torch.softmax(logits, dim=-1)
    count = scores.shape[-1] if options.top_k is None else min(options.top_k, scores.shape[-1])
    values, indices = scores.topk(count, dim=-1)
    return [[{"label": str(config.id2label[int(i)]), "score": float(v)} for v, i in zip(row_v, row_i, strict=True)]
            for row_v, row_i in zip(values.tolist(), indices.tolist(), strict=True)]


class SequenceClassifier(TextRunner):
    """A sequence-classification model over texts or pairs: relevance scores (``rerank``) or labels."""

    def __init__(self, spec: ModelSpec, device: str, dtype: torch.dtype, model: Any = None) -> None:
        """``model``: one that stands in for the transformers model (ONNX Runtime's), which then never loads."""
        tokenizer = load_tokenizer(spec)
        model = model if model is not None else load_model("AutoModelForSequenceClassification", spec, device, dtype)
        self.rerank = spec.task == RERANK
        if self.rerank and model.config.num_labels != 1:
            raise ValueError(f"model {spec.name!r}: rerank needs a cross-encoder with one output (num_labels 1); "
                             f"this one has {model.config.num_labels} labels: serve it as text-classification")
        if tokenizer.pad_token is None:  # decoder-only classifiers (GPT-2 style): batching needs a pad token
            tokenizer.pad_token = tokenizer.eos_token
            model.config.pad_token_id = tokenizer.pad_token_id
        super().__init__(spec, device, tokenizer, model, model_max_length(tokenizer, model.config))
        if self.rerank:
            self.kind, self.parameters = InputKind.PAIR, frozenset({RAW_SCORES})
            self.warm_up_input = ["warm-up", "warm-up"]
        else:
            self.kind, self.parameters = InputKind.TEXT_OR_PAIR, frozenset({RAW_SCORES, TOP_K})
            self.details = replace(self.details, labels=announced_labels(model.config.id2label))

    def _options(self, parameters: dict[str, Any]) -> ScoreOptions:
        return ScoreOptions(flag(parameters, RAW_SCORES, False), None if self.rerank else top_k_of(parameters, None))

    def _forward(self, encoded: Any, options: ScoreOptions) -> list[Any]:
        import torch

        with torch.inference_mode():
            logits = self._model(**encoded).logits
        if self.rerank:
            scores = logits.float()[:, 0]
            return (scores if options.raw_scores else torch.sigmoid(scores)).tolist()
        return label_scores(logits, self._model.config, options)
