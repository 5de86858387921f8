"""Token ids as inputs: the ``decode`` operation's and, for embeddings models, ``run``'s (PROTOCOL.md 5.2, 5.3).

A client that tokenizes itself (as Arctic Inference's front end does) sends
each input as an ext-1 one-dimensional integer array of ids, the encoding
the model runs as it is: its special tokens are the sender's (what the
``tokenize`` operation gives: ``[CLS] ... [SEP]``).  This module checks ids
against the vocabulary (:func:`outside_vocabulary`, one check for both
operations) and truncates them as the tokenizer truncates a text
(:class:`SpecialFrame`): the special tokens the tokenizer puts around a text
stay, and the tokens between them are cut.

A gateway may tokenize for the model (PROTOCOL.md 3.4, 5.3): :func:`edge_form` is
the tokenizer it gets (the ``tokenizer`` operation), serialized as the worker
runs it (lowercasing a model's modules ask for included), and READY names it by
fingerprint.  Ids it makes untruncated are then the text's encoding, truncated
here as the text would be, so vectors and counts are the same either way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


def edge_form(tokenizer: Any, takes_ids: bool, default_prompt: str) -> str:
    """The tokenizer as a sender tokenizes with it (``tokenizers``' JSON, truncation and padding off), or "" where
    its ids would not run as the texts do: a runner that takes no ids, a tokenizer with no fast (Rust) form, or a
    default prompt, which cannot go before ids."""
    if not takes_ids or not getattr(tokenizer, "is_fast", False) or default_prompt:
        return ""
    from tokenizers import Tokenizer

    edge = Tokenizer.from_str(tokenizer.backend_tokenizer.to_str())
    edge.no_truncation()
    edge.no_padding()
    serialized: str = edge.to_str()
    return serialized


def outside_vocabulary(ids: np.ndarray, vocabulary: int) -> str | None:
    """Why ``ids`` cannot run on a model of ``vocabulary`` entries (naming the first bad id), or None if they can."""
    if not ids.size or (int(ids.min()) >= 0 and int(ids.max()) < vocabulary):
        return None
    bad = int(ids[(ids < 0) | (ids >= vocabulary)][0])
    return f"token id {bad} is outside this model's vocabulary: ids run from 0 to {vocabulary - 1}"


@dataclass(frozen=True, slots=True)
class SpecialFrame:
    """The special tokens a tokenizer puts before (``head``) and after (``tail``) one text: BERT's ``[CLS]`` and
    ``[SEP]``, RoBERTa's ``<s>`` and ``</s>``, none for a tokenizer that adds none."""

    head: tuple[int, ...] = ()
    tail: tuple[int, ...] = ()

    @classmethod
    def of(cls, tokenizer: Any) -> SpecialFrame:
        """The tokenizer's frame, found by encoding one word with and without special tokens."""
        framed = list(tokenizer("a", add_special_tokens=True)["input_ids"])
        bare = list(tokenizer("a", add_special_tokens=False)["input_ids"])
        for start in range(len(framed) - len(bare) + 1):
            if framed[start:start + len(bare)] == bare:
                return cls(tuple(framed[:start]), tuple(framed[start + len(bare):]))
        return cls()

    def truncated(self, ids: np.ndarray, max_length: int, keep_start: bool) -> np.ndarray:
        """``ids`` cut to ``max_length``, keeping their start (``keep_start``) or their end; ids framed by this
        frame keep it, and lose tokens from between, as a text the tokenizer truncates does."""
        if ids.size <= max_length:
            return ids
        head, tail = len(self.head), len(self.tail)
        body = max_length - head - tail
        framed = (body > 0 and ids.size >= head + tail and tuple(ids[:head].tolist()) == self.head
                  and tuple(ids[ids.size - tail:].tolist()) == self.tail)
        if not framed:
            return ids[:max_length] if keep_start else ids[ids.size - max_length:]
        middle = ids[head:ids.size - tail]
        kept = middle[:body] if keep_start else middle[middle.size - body:]
        return np.concatenate([ids[:head], kept, ids[ids.size - tail:]])
