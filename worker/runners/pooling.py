"""A sentence vector from a model's token vectors, as sentence-transformers computes it: pooling, Dense, Normalize.

Theory of operation
-------------------
:class:`SentenceHead` computes what a model's modules declare
(:mod:`worker.runners.st_modules`) over a padded batch's last hidden state
and attention mask, in float32 whatever the model's dtype, by the same
arithmetic as sentence-transformers' ``Pooling``, ``Dense`` and
``Normalize``.  Every path of the embeddings runner ends in it: the padded
torch pass, the packed one (its rows padded again first: :func:`repadded`),
ONNX Runtime's (the graph gives the hidden states, the pooling stays here,
and the export is validated through it: :mod:`worker.runners.runtime`) and
the CUDA graphs, which record it (:mod:`worker.runners.graphs`: nothing here
reads the GPU back, so it can be captured).

The pooling modes (several concatenate, in the order the model lists them):

* ``mean``: the mean of the row's tokens; ``mean_sqrt_len_tokens``: their
  sum over the square root of their count;
* ``cls``: the first token, ``lasttoken``: the last one (the end-of-text
  token of decoder models), found from the mask, so either padding side
  works;
* ``max``: each number's largest over the tokens;
* ``weightedmean``: tokens weighted 1, 2, 3, ... from the first real one.

A Pooling with ``include_prompt`` false leaves a prompt's tokens out of the
pooling (not out of attention): the first :func:`prompt_tokens` real tokens
of each row, as sentence-transformers counts them (the prompt tokenized
alone, less a special token that ends it).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from worker.runners.st_modules import WEIGHT_FILES, Dense, SentenceModules, UnsupportedModule

if TYPE_CHECKING:
    import torch


class SentenceHead:
    """The model's pooling and the modules after it, on ``device``: ``head(hidden, mask)`` -> ``(rows, dims)``.

    The normalization that ends the modules is left to the caller (``modules.normalized``): a request may turn
    it off, or ask for it of a model that declares none, and cuts ``dimensions`` before it.
    """

    def __init__(self, modules: SentenceModules, hidden_size: int, device: str) -> None:
        self.modules = modules
        self.modes = modules.pooling.modes
        size = hidden_size * len(self.modes)
        self._steps: list[Callable[[torch.Tensor], torch.Tensor]] = []
        for step in modules.steps:
            if isinstance(step, Dense):
                if step.in_features != size:
                    raise UnsupportedModule(f"the Dense module in {step.folder} takes {step.in_features} numbers, "
                                            f"but the modules before it give {size}; fix the module's config.json")
                self._steps.append(_dense(step, device))
                size = step.out_features
            else:
                self._steps.append(_normalized)
        self.dimensions = size

    def __call__(self, hidden: torch.Tensor, attention_mask: torch.Tensor,
                 pool_mask: torch.Tensor | None = None) -> torch.Tensor:
        """One float32 vector per row; ``pool_mask`` (default: the attention mask) says which tokens pool."""
        vectors = pooled(hidden, attention_mask, self.modes, pool_mask)
        for step in self._steps:
            vectors = step(vectors)
        return vectors

    @property
    def excludes_prompt(self) -> bool:
        return not self.modules.pooling.include_prompt


def pooled(hidden: torch.Tensor, attention_mask: torch.Tensor, modes: Sequence[str],
           pool_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Each mode's vector of each row, concatenated, in float32 (sentence-transformers' ``Pooling``)."""
    import torch

    hidden = hidden.float()
    mask = attention_mask if pool_mask is None else pool_mask
    length = hidden.shape[1]
    out = (mask == 0).unsqueeze(-1)
    kept = hidden.masked_fill(out, 0.0)  # a padded position's vector never reaches a sum, even if it is not finite
    counts = mask.sum(dim=1, keepdim=True).to(torch.float32).clamp(min=1e-9)
    vectors = []
    for mode in modes:
        if mode == "cls":  # the first token that pools: after left padding, or after an excluded prompt
            vectors.append(_at(hidden, mask.to(torch.int32).argmax(dim=1)))
        elif mode == "lasttoken":
            present, from_end = mask.to(torch.int32).flip(1).max(dim=1)
            from_end = torch.where(present == 0, length - 1, from_end)
            vectors.append(_at(kept, length - 1 - from_end))
        elif mode == "max":
            vectors.append(hidden.masked_fill(out, float("-inf")).max(dim=1).values)
        elif mode == "mean":
            vectors.append(kept.sum(dim=1) / counts)
        elif mode == "mean_sqrt_len_tokens":
            vectors.append(kept.sum(dim=1) / counts.sqrt())
        elif mode == "weightedmean":  # weights 1, 2, ... from each row's first real token, prompt or not
            first = attention_mask.to(torch.int32).argmax(dim=1, keepdim=True)
            weights = torch.arange(1, length + 1, device=hidden.device, dtype=torch.float32).unsqueeze(0) - first
            weights = weights.masked_fill(mask == 0, 0.0).unsqueeze(-1)
            vectors.append((kept * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1e-9))
        else:
            raise ValueError(f"unknown pooling mode {mode!r}")
    return vectors[0] if len(vectors) == 1 else torch.cat(vectors, dim=-1)


def without_prompt(attention_mask: torch.Tensor, prompt_length: int) -> torch.Tensor:
    """The mask with each row's first ``prompt_length`` real tokens left out (padding on either side)."""
    import torch

    first = attention_mask.to(torch.int32).argmax(dim=1, keepdim=True)
    positions = torch.arange(attention_mask.shape[1], device=attention_mask.device).unsqueeze(0)
    return attention_mask.masked_fill(positions < first + prompt_length, 0)


def repadded(hidden: torch.Tensor, lengths: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """A packed pass's ``(tokens, hidden)`` rows as a right-padded ``(rows, longest, hidden)`` and its mask."""
    import torch
    from torch.nn.utils.rnn import pad_sequence

    padded = pad_sequence(list(torch.split(hidden, list(lengths))), batch_first=True)
    counts = torch.tensor(list(lengths), device=hidden.device)
    mask = (torch.arange(padded.shape[1], device=hidden.device).unsqueeze(0) < counts.unsqueeze(1)).long()
    return padded, mask


def prompt_tokens(tokenizer: Any, prompt: str, max_length: int) -> int:
    """How many tokens a prompt puts before a text, as sentence-transformers counts them: the prompt tokenized
    alone, less a special token that ends it (``[SEP]``, an end-of-text token)."""
    ids = list(tokenizer(prompt, truncation=True, max_length=max_length)["input_ids"])
    return len(ids) - 1 if ids and ids[-1] in set(tokenizer.all_special_ids) else len(ids)


def _at(hidden: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Row ``r``'s vector at position ``index[r]``."""
    import torch

    return torch.gather(hidden, 1, index.long().view(-1, 1, 1).expand(-1, 1, hidden.shape[-1])).squeeze(1)


def _normalized(vectors: torch.Tensor) -> torch.Tensor:
    import torch

    return torch.nn.functional.normalize(vectors, p=2, dim=-1)


def _dense(step: Dense, device: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """The Dense module as a function, its weights (float32) on ``device``."""
    import torch

    weights = _weights(step.folder)
    expected: dict[str, tuple[int, ...]] = {"linear.weight": (step.out_features, step.in_features)}
    if step.bias:
        expected["linear.bias"] = (step.out_features,)
    projects = step.residual and step.in_features != step.out_features
    if projects:
        expected["residual.weight"] = (step.out_features, step.in_features)
    for key, shape in expected.items():
        if key not in weights or tuple(weights[key].shape) != shape:
            raise UnsupportedModule(f"the Dense module in {step.folder} has no weight {key!r} of shape {shape} "
                                    "(its config.json and its weights disagree); fix the module")
    tensors = {key: weights[key].to(device=device, dtype=torch.float32) for key in expected}
    activation = getattr(torch.nn, step.activation)()

    def dense(vectors: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = activation(torch.nn.functional.linear(vectors, tensors["linear.weight"],
                                                                  tensors.get("linear.bias")))
        if step.residual:
            out = out + (torch.nn.functional.linear(vectors, tensors["residual.weight"]) if projects else vectors)
        return out

    return dense


def _weights(folder: Path) -> dict[str, torch.Tensor]:
    """A module's weights, from safetensors or a (weights-only) torch file."""
    import torch

    path = next(folder / name for name in WEIGHT_FILES if (folder / name).is_file())
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(str(path))
    loaded = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(loaded, dict):
        raise UnsupportedModule(f"{path} holds no weights by name; fix the module")
    return loaded
