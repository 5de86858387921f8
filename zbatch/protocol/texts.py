"""How texts become token ids, the same in every process that tokenizes: a worker, a gateway at the edge, a client.

A :class:`TextEncoder` wraps one ``tokenizers.Tokenizer`` (the library under transformers' fast tokenizers) and
encodes a batch of texts, or of pairs, in one call, without each token's character offsets, which no end of zbatch
reads (``encode_batch_fast``, where the installed release has it; ``encode_batch`` otherwise).

BERT's normalizer (``BertNormalizer``: control characters removed, CJK characters spaced, accents stripped,
letters lowercased) takes about a third of a short text's encoding in the library, though for a text of printable
ASCII all it can change is the letters' case.  So where a tokenizer's normalizer is BERT's, such a text is
lowercased in Python (where the normalizer lowercases) and encoded by a copy of the tokenizer without a normalizer:
the same ids and token types, since the rest of the pipeline sees the same normalized text.  Two kinds of text keep
the library's whole path, as do all texts of any other normalizer:

* a text with an ASCII control character (the normalizer removes or replaces those);
* a text in which, whatever the case, one of the tokenizer's added tokens appears, as written or as normalized: the
  library matches some on the raw text (BERT's ``[CLS]``, ``[MASK]``...) and the others in their normalized form on
  the normalized text, while the copy matches each as written on the text it is given.

A tokenizer with more than :data:`MAX_ADDED` added tokens, or one whose added token normalizes to nothing, always takes
the whole path: the check would cost more than it saves, or could not be made.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

CONTROL = re.compile(r"[\x00-\x1f\x7f]")  # what BERT's normalizer removes, or turns into a space, in ASCII
MAX_ADDED = 32  # added tokens past which a text's check for them costs more than the normalizer it saves
Encode = Callable[[list[Any]], list[Any]]


class TextEncoder:
    """One tokenizer's batch encoding without offsets, with BERT's normalizing done in Python where it is trivial.

    Its :meth:`limit` sets the truncation of every tokenizer it calls; other settings are the tokenizer's own, as
    they were when the encoder was made.
    """

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self._encode = _without_offsets(tokenizer)
        self._shortcut = _Shortcut.of(tokenizer)

    def limit(self, max_length: int | None, direction: str = "right") -> None:
        """Truncate to ``max_length`` tokens from ``direction`` (None: never), and never pad."""
        _limit(self.tokenizer, max_length, direction)
        if self._shortcut is not None:
            self._shortcut.limit(max_length, direction)

    def __call__(self, inputs: list[Any]) -> list[Any]:
        """Each input's encoding (``tokenizers.Encoding``: ``ids``, ``type_ids``), in order."""
        shortcut = self._shortcut
        if shortcut is None:
            return self._encode(inputs)
        taken = [shortcut.normalized(each) for each in inputs]
        if all(each is not None for each in taken):
            return shortcut.encode(taken)
        if not any(each is not None for each in taken):
            return self._encode(inputs)
        short = iter(shortcut.encode([each for each in taken if each is not None]))
        whole = iter(self._encode([raw for raw, each in zip(inputs, taken, strict=True) if each is None]))
        return [next(whole) if each is None else next(short) for each in taken]


class _Shortcut:
    """A copy of a BERT-normalized tokenizer without its normalizer, and which texts it may take."""

    def __init__(self, bare: Any, lowercase: bool, added: re.Pattern[str] | None) -> None:
        self._bare = bare
        self.encode = _without_offsets(bare)  # of inputs that :meth:`normalized` gave
        self._lowercase = lowercase
        self._added = added
        self._limits: tuple[int | None, str] | None = None

    @classmethod
    def of(cls, tokenizer: Any) -> _Shortcut | None:
        """The shortcut for ``tokenizer``, or None where its normalizer is not BERT's, it has too many added tokens,
        or it cannot be copied."""
        try:
            serialized = tokenizer.to_str()
            normalizer = json.loads(serialized).get("normalizer") or {}
            if normalizer.get("type") != "BertNormalizer":
                return None
            added = tokenizer.get_added_tokens_decoder().values()
            if len(added) > MAX_ADDED:
                return None
            forms = {form.lower() for token in added
                     for form in (token.content, tokenizer.normalizer.normalize_str(token.content))}
            if "" in forms:
                return None
            bare = type(tokenizer).from_str(serialized)
            bare.normalizer = None
        except Exception:  # a tokenizer of another kind or release: the library's whole path serves
            return None
        pattern = re.compile("|".join(map(re.escape, sorted(forms, key=len, reverse=True)))) if forms else None
        return cls(bare, bool(normalizer.get("lowercase", True)), pattern)

    def limit(self, max_length: int | None, direction: str) -> None:
        if self._limits != (max_length, direction):
            _limit(self._bare, max_length, direction)
            self._limits = (max_length, direction)

    def normalized(self, item: Any) -> Any:
        """``item`` (a text, or a pair of texts) as BERT's normalizer would leave it; None if this cannot say."""
        if isinstance(item, str):
            return self._text(item)
        if isinstance(item, tuple | list) and len(item) == 2:
            first, second = self._text(item[0]), self._text(item[1])
            return None if first is None or second is None else (first, second)
        return None

    def _text(self, text: Any) -> str | None:
        if type(text) is not str or not text.isascii() or CONTROL.search(text):
            return None  # a subclass of str too: what the library makes of one is its own affair
        lowered = text.lower()
        if self._added is not None and self._added.search(lowered):
            return None
        return lowered if self._lowercase else text


def _without_offsets(tokenizer: Any) -> Encode:
    encode: Encode = getattr(tokenizer, "encode_batch_fast", tokenizer.encode_batch)
    return encode


def _limit(tokenizer: Any, max_length: int | None, direction: str) -> None:
    if max_length is None:
        tokenizer.no_truncation()
    else:
        tokenizer.enable_truncation(max_length, strategy="longest_first", direction=direction)
    tokenizer.no_padding()
