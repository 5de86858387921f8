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

Where the pre-tokenizer is BERT's too and the model WordPiece (all-MiniLM, bge, e5, gte, arctic-embed), a single text
that takes the shortcut is encoded word by word (:class:`_WordPieces`).  On printable ASCII, BERT's pre-tokenizer
splits at whitespace and isolates each punctuation mark, so the words are :data:`WORD`'s matches, and WordPiece splits
each word alone: its pieces depend on nothing around it.  So each word's pieces are asked of the library once and
kept, and a text's ids are its words' pieces between the tokenizer's own special tokens, truncated as the library
truncates.  A text whose words are all known costs a regular expression and a dictionary look-up a word, and no call
into the library (BENCHMARKS.md, "BERT's pre-tokenizer and WordPiece in Python").  Texts with new words are learned
from in one library call for all of them.  The cache holds at most :data:`MAX_CACHED_WORDS` words of at most
:data:`MAX_CACHED_CHARS` characters, and starts again when a text would overfill it, so no sender can grow it without
bound; a long text with new words takes the library's call and teaches nothing.  Pairs take the copy without a
normalizer.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

CONTROL = re.compile(r"[\x00-\x1f\x7f]")  # what BERT's normalizer removes, or turns into a space, in ASCII
MAX_ADDED = 32  # added tokens past which a text's check for them costs more than the normalizer it saves
# BERT's pre-tokenizer on printable ASCII: runs of letters and digits, and each punctuation mark (Rust's
# is_ascii_punctuation: the 32 printable characters that are neither letters, digits nor the space) alone.
WORD = re.compile(r"[A-Za-z0-9]+|[!-/:-@\[-`{-~]")
MAX_CACHED_WORDS = 65_536  # a cache of each word's pieces
MAX_CACHED_CHARS = 32  # longer words are not kept: at most about 200 bytes a word, 13 MiB in all
MAX_LEARNED_WORDS = 512  # a text of more words that are not all known takes the library's call, and teaches nothing
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
        """Each input's encoding (``ids``, ``type_ids``: the library's ``Encoding``, or :class:`Ids`), in order."""
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

    def __init__(self, bare: Any, lowercase: bool, added: re.Pattern[str] | None,
                 words: _WordPieces | None = None) -> None:
        self._bare = bare
        self._encode_bare = _without_offsets(bare)
        self._lowercase = lowercase
        self._added = added
        self._words = words
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
        return cls(bare, bool(normalizer.get("lowercase", True)), pattern, _WordPieces.of(bare))

    def limit(self, max_length: int | None, direction: str) -> None:
        if self._limits != (max_length, direction):
            _limit(self._bare, max_length, direction)
            if self._words is not None:
                self._words.limit(max_length, direction)
            self._limits = (max_length, direction)

    def encode(self, normalized: list[Any]) -> list[Any]:
        """The encodings of inputs that :meth:`normalized` gave: single texts by their words where it can."""
        words = self._words
        if words is None:
            return self._encode_bare(normalized)
        encoded = words.encode(normalized)
        rest = [each for each, done in zip(normalized, encoded, strict=True) if done is None]
        if not rest:
            return encoded
        bare = iter(self._encode_bare(rest))
        return [next(bare) if done is None else done for done in encoded]

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


class Ids:
    """A text's encoding by its words: what zbatch reads of the library's ``Encoding``."""

    __slots__ = ("ids", "type_ids")

    def __init__(self, ids: list[int], type_ids: list[int]) -> None:
        self.ids = ids
        self.type_ids = type_ids


class _WordPieces:
    """BERT's pre-tokenizer and WordPiece for a normalized printable-ASCII text, each word's pieces cached."""

    def __init__(self, pieces: Any, start: list[int], end: list[int], type_id: int) -> None:
        self._pieces = pieces  # the tokenizer without normalizer, special tokens or truncation
        self._start, self._end, self._type_id = start, end, type_id
        self._cache: dict[str, list[int]] = {}
        self._budget: int | None = None  # the most pieces a text keeps; None: all
        self._from_start = True
        self._limited = False  # until limit() is called, the tokenizer's own truncation and padding apply

    @classmethod
    def of(cls, bare: Any) -> _WordPieces | None:
        """The word path for ``bare`` (a tokenizer without a normalizer), or None where its pre-tokenizer is not
        BERT's, its model not WordPiece, or its special tokens do not frame a text as BERT's post-processor does."""
        try:
            serialized = bare.to_str()
            fields = json.loads(serialized)
            if ((fields.get("pre_tokenizer") or {}).get("type") != "BertPreTokenizer"
                    or (fields.get("model") or {}).get("type") != "WordPiece"):
                return None
            pieces, framed = type(bare).from_str(serialized), type(bare).from_str(serialized)
            pieces.post_processor = None
            for copy in (pieces, framed):
                _limit(copy, None, "right")
            probe = framed.encode("a b")
            inner = pieces.encode("a b", add_special_tokens=False).ids
        except Exception:  # another kind of tokenizer or release: the copy serves
            return None
        ids = probe.ids
        starts = [at for at in range(len(ids) - len(inner) + 1) if ids[at:at + len(inner)] == inner]
        if len(starts) != 1 or len(set(probe.type_ids)) != 1:
            return None
        start = starts[0]
        return cls(pieces, ids[:start], ids[start + len(inner):], probe.type_ids[0])

    def limit(self, max_length: int | None, direction: str) -> None:
        self._budget = None if max_length is None else max_length - len(self._start) - len(self._end)
        self._from_start = direction == "right"
        self._limited = True

    def encode(self, inputs: list[Any]) -> list[Ids | None]:
        """Each input's encoding if it is a text this path takes, else None (the library's call makes it): any
        input before :meth:`limit` (the tokenizer's own truncation and padding apply then), a pair, a budget with
        no room for a word, a text of more than :data:`MAX_LEARNED_WORDS` words not all known."""
        budget = self._budget
        if not self._limited or (budget is not None and budget <= 0):
            return [None] * len(inputs)
        cache = self._cache
        bodies: list[list[int] | None] = []
        splits: dict[int, list[str]] = {}  # the texts to learn from, by index
        for index, text in enumerate(inputs):
            if type(text) is not str:
                bodies.append(None)
                continue
            words = WORD.findall(text)
            try:
                bodies.append([piece for word in words for piece in cache[word]])
            except KeyError:  # a word not seen yet (or another thread cleared the cache meanwhile)
                bodies.append(None)
                if len(words) <= MAX_LEARNED_WORDS:
                    splits[index] = words
        if splits:
            learned = self._pieces.encode_batch([inputs[index] for index in splits], add_special_tokens=False)
            for (index, words), encoding in zip(splits.items(), learned, strict=True):
                bodies[index] = self._learn(words, encoding)
        return [None if body is None else self._framed(body) for body in bodies]

    def _framed(self, body: list[int]) -> Ids:
        budget = self._budget
        if budget is not None and len(body) > budget:
            body = body[:budget] if self._from_start else body[len(body) - budget:]
        ids = [*self._start, *body, *self._end]
        return Ids(ids, [self._type_id] * len(ids))

    def _learn(self, words: list[str], encoding: Any) -> list[int]:
        """A text's pieces from the library's encoding of it; each new short word's kept (the encoding says which
        pieces are whose)."""
        ids: list[int] = encoding.ids
        whose: list[int | None] = encoding.word_ids
        if not words or not whose or whose[0] != 0 or whose[-1] != len(words) - 1:  # split otherwise: keep nothing
            return ids
        cache = self._cache
        if len(cache) + len(words) > MAX_CACHED_WORDS:
            cache.clear()
        pieces_of = encoding.word_to_tokens
        for index, word in enumerate(words):
            if word not in cache and len(word) <= MAX_CACHED_CHARS:
                start, end = pieces_of(index)
                cache[word] = ids[start:end]
        return ids


def _without_offsets(tokenizer: Any) -> Encode:
    encode: Encode = getattr(tokenizer, "encode_batch_fast", tokenizer.encode_batch)
    return encode


def _limit(tokenizer: Any, max_length: int | None, direction: str) -> None:
    if max_length is None:
        tokenizer.no_truncation()
    else:
        tokenizer.enable_truncation(max_length, strategy="longest_first", direction=direction)
    tokenizer.no_padding()
