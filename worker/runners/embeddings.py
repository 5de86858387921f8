"""Sentence embeddings, computed exactly like sentence-transformers, with padding-aware grouping.

Runs on the worker's inference thread as a :class:`~worker.runners.text.TextRunner`:
each batch is tokenised once to learn the input lengths.  A BERT encoder on a
CPU then runs the batch as one packed pass with no padding
(:mod:`worker.runners.packing`); any other model runs length-sorted groups
where :mod:`worker.runners.grouping` finds them cheaper than one padded pass
(it does on a CPU, rarely on a GPU).  Outputs come back in input order
either way.

The token vectors become one vector as the model's sentence-transformers
modules declare (:mod:`worker.runners.st_modules`: the pooling mode, Dense
layers, Normalize, ``max_seq_length`` and ``do_lower_case``), computed by
:mod:`worker.runners.pooling` on every path; a folder that declares none is
mean-pooled and normalized.  The start's log line names what was chosen.

Parameters: ``normalize`` (default: as the model declares; true for a model
that declares nothing), ``dimensions`` (keep the first N numbers,
re-normalised when ``normalize``: what Matryoshka-trained models are made
for), ``precision`` (``float32``, or ``float16``: half the bytes), truncation
(:mod:`worker.runners.encoding`) and ``prompt_name`` (:mod:`worker.runners.prompts`).
The ``embed_all`` operation answers each token's vector instead
(:mod:`worker.runners.operations`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from worker.runners.encoding import (
    TRUNCATION_PARAMETERS,
    check_parameters,
    flag,
    load_tokenizer,
    model_max_length,
)
from worker.runners.graphs import GraphedPooling, graphable
from worker.runners.operations import token_rows, unpooled
from worker.runners.packing import Packer, packer_for
from worker.runners.phases import phase
from worker.runners.pooling import SentenceHead, prompt_tokens, repadded, without_prompt
from worker.runners.spec import InputError, InputKind, ModelSpec, Outputs
from worker.runners.st_modules import SentenceModules, read_modules
from worker.runners.text import TextRunner, load_model
from zbatch.protocol.vocabulary import DIMENSIONS, EMBED_ALL, NORMALIZE, PRECISION, PRECISIONS, PROMPT_NAME
from zbatch.protocol.wire import shortened

if TYPE_CHECKING:
    import torch

log = logging.getLogger("zbatch.worker")


@dataclass(frozen=True, slots=True)
class EmbeddingOptions:
    normalize: bool
    dimensions: int | None
    prompt_length: int = 0  # each row's first tokens that the pooling leaves out (a prompt the model excludes)
    half: bool = False  # answer float16 numbers (``precision``): half the bytes, cosine > 0.9999 to float32


class EmbeddingRunner(TextRunner):
    """The model's pooling, Dense layers and normalization (:class:`~worker.runners.pooling.SentenceHead`)."""

    parameters = frozenset({NORMALIZE, DIMENSIONS, PRECISION})
    takes_prompts = True
    kind = InputKind.TEXT_OR_IDS  # token ids as well as texts (worker.runners.token_ids)

    def __init__(self, spec: ModelSpec, device: str, dtype: torch.dtype, model: Any = None) -> None:
        """``model``: one that stands in for the transformers model (ONNX Runtime's), which then never loads."""
        modules = read_modules(spec.path)  # before the model loads: a module zbatch cannot run stops the start
        tokenizer = load_tokenizer(spec)
        if modules.do_lower_case:
            _lowercased(tokenizer)
        model = model if model is not None else load_model("AutoModel", spec, device, dtype)
        super().__init__(spec, device, tokenizer, model, _max_length(modules, tokenizer, model.config))
        self.head = SentenceHead(modules, int(model.config.hidden_size), device)
        self._prompt_lengths = ({prefix: prompt_tokens(tokenizer, prefix, self.max_length)
                                 for prefix in self.prompts.by_name.values() if prefix}
                                if self.head.excludes_prompt else {})
        self._packer = packer_for(model, device, spec.unpadded_attention)
        use_graphs = device.startswith("cuda") and spec.cuda_graphs and graphable(model)
        self._graphs = GraphedPooling(model, device, self.head) if use_graphs else None
        self.dimensions = self.head.dimensions
        self.details = replace(self.details, dimensions=self.dimensions)
        log.info("model %s: %s", spec.name, modules.describe())

    def warm_up(self) -> None:
        """Capture the CUDA graphs (:mod:`worker.runners.graphs`), whose captures run every shape first; warm the
        shapes up eagerly only where there are no graphs, or their capture failed.  On an accelerator with
        unpadded attention: first check that a packed pass runs there at all, and last time every bucket
        padded and packed, the graphs captured (:mod:`worker.runners.unpadded`)."""
        if self.buckets is not None and self._packer is not None and not self._packs_here(self._packer):
            self._packer = None
        super().warm_up()
        if self._graphs is not None and self.buckets is not None:
            with phase("cuda graphs"):
                self._graphs.capture(self.buckets.shapes())
            if not self._graphs.shapes:
                self._warm_shapes(super()._eager_shapes())
        self.time_passes()

    def _packs_here(self, packer: Packer) -> bool:
        """Whether ``packer``'s pass (one attention call) runs on this accelerator; if not, batches run padded,
        as they would with ``--unpadded-attention off``."""
        import torch

        try:
            with torch.inference_mode():
                packer(torch.ones(3, dtype=torch.long, device=self.device), None, [1, 2]).sum().item()
        except Exception:
            log.warning("model %s: a packed pass with one attention call fails on %s, so every batch runs padded",
                        self.spec.name, self.device, exc_info=True)
            return False
        return True

    def _eager_shapes(self) -> list[tuple[int, int]]:
        """None where CUDA graphs will run every bucket's shape (their capture runs each first): batches run the
        graphs, and only ``embed_all`` runs the eager pass, which meets a shape's one-time set-up on first use."""
        return [] if self._graphs is not None else super()._eager_shapes()

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
        dimensions = parameters.get(DIMENSIONS)
        if dimensions is not None and (isinstance(dimensions, bool) or not isinstance(dimensions, int)
                                       or not 1 <= dimensions <= self.dimensions):
            raise InputError(f"parameter {DIMENSIONS!r} must be a whole number from 1 to {self.dimensions} (this "
                             f"model's size), not {dimensions!r}")
        precision = parameters.get(PRECISION)
        precision = PRECISIONS[0] if precision is None else precision  # nil: the default, as for the others
        if precision not in PRECISIONS:
            raise InputError(f"parameter {PRECISION!r} must be one of {', '.join(map(repr, PRECISIONS))}, "
                             f"not {shortened(repr(precision))}")
        prompt_length = self._prompt_lengths.get(self.prompts.prefix(parameters), 0) if self._prompt_lengths else 0
        return EmbeddingOptions(flag(parameters, NORMALIZE, self.head.modules.normalized), dimensions,
                                prompt_length, precision == "float16")

    def _forward(self, encoded: Any, options: EmbeddingOptions) -> list[np.ndarray]:
        """One 1-D vector per row of the group, float32 unless ``precision`` asks for float16."""
        import torch

        with torch.inference_mode():
            mask = encoded["attention_mask"]
            pool_mask = without_prompt(mask, options.prompt_length) if options.prompt_length else None
            pooled = self._graphs.pooled(encoded, pool_mask) if self._graphs is not None else None
            if pooled is None:
                pooled = self.head(self._model(**encoded).last_hidden_state, mask, pool_mask)
            return _finished(pooled, options)

    def _forward_packed(self, encoded: Any, options: EmbeddingOptions) -> list[np.ndarray]:
        """One 1-D vector per input of a packed group, pooled from its own tokens (as :meth:`_forward`'s)."""
        import torch

        assert self._packer is not None
        lengths = encoded["lengths"].tolist()
        with torch.inference_mode():
            hidden, mask = repadded(self._packer(encoded["input_ids"], encoded.get("token_type_ids"), lengths),
                                    lengths)
            pool_mask = without_prompt(mask, options.prompt_length) if options.prompt_length else None
            return _finished(self.head(hidden, mask, pool_mask), options)


def _finished(embeddings: torch.Tensor, options: EmbeddingOptions) -> list[np.ndarray]:
    """Pooled embeddings cut to ``dimensions``, normalised and in the precision asked, one numpy vector per row."""
    import torch

    if options.dimensions is not None:
        embeddings = embeddings[:, :options.dimensions]
    if options.normalize:
        embeddings = torch.nn.functional.normalize(embeddings, p=2, dim=1)
    if options.half:  # on the device: the copy to the host moves half the bytes too
        embeddings = embeddings.to(torch.float16)
    return list(embeddings.cpu().numpy())


def _max_length(modules: SentenceModules, tokenizer: Any, config: Any) -> int:
    """The length the sentence-transformers model was trained with (``max_seq_length``), as its own loader
    uses it, within the model's position embeddings; else the model's own maximum."""
    if modules.max_seq_length:
        positions = getattr(config, "max_position_embeddings", None)
        if isinstance(positions, int) and 0 < positions < modules.max_seq_length:
            return positions
        return modules.max_seq_length
    return model_max_length(tokenizer, config)


def _lowercased(tokenizer: Any) -> None:
    """Lowercase every text before the tokenizer sees it (``do_lower_case``), as sentence-transformers does."""
    if not tokenizer.is_fast:
        tokenizer.do_lower_case = True
        return
    from tokenizers.normalizers import Lowercase, Sequence

    backend = tokenizer.backend_tokenizer
    current = backend.normalizer
    parts: list[Any] = [] if current is None else [current]
    if isinstance(current, Sequence):
        parts = list(cast(Any, current))  # a sequence of normalizers iterates over them
    if not any(isinstance(part, Lowercase) for part in parts):
        backend.normalizer = Sequence([Lowercase(), *parts])
