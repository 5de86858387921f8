"""The text encoder every tokenizing process shares: the ids and token types of the library's whole path, always."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zbatch.hub import bundled_model_path
from zbatch.protocol.texts import TextEncoder

tokenizers = pytest.importorskip("tokenizers")

# Pieces that exercise every rule: case, punctuation, digits, ASCII controls and whitespace, accents, CJK, the
# word-piece prefix, added tokens in their own case and in others.
PIECES = ["Hello", "WORLD", "cat", "naïve", "Straße", "中文", "##ing", "don't", "e-mail", "3.14", " ", "  ", "\t", "\n",
          "\r", "\x00", "\x07", "\x7f", "[CLS]", "[MASK]", "[mask]", "[Sep]", "zbatch", "ZBATCH", "QuUx", "quux", "?!",
          "\u00a0", "\ufffd", "cafe", "Café", "a b", "A\tB"]
TEXT = st.lists(st.sampled_from(PIECES), max_size=12).map("".join)
INPUT = st.one_of(TEXT, st.tuples(TEXT, TEXT))
LIMITS = [(None, "right"), (8, "right"), (8, "left")]


def bundled_tokenizer() -> Any:
    return tokenizers.Tokenizer.from_file(str(Path(bundled_model_path()) / "tokenizer.json"))


def variant(lowercase: bool, added: bool) -> Any:
    """The bundled tokenizer with its normalizer's case rule, and with added tokens of both kinds."""
    serialized = json.loads(bundled_tokenizer().to_str())
    serialized["normalizer"]["lowercase"] = lowercase
    tokenizer = tokenizers.Tokenizer.from_str(json.dumps(serialized))
    if added:  # matched as normalized: an accent to strip, a tab that becomes a space; and as written
        tokenizer.add_tokens([tokenizers.AddedToken("zbatch", normalized=True),
                              tokenizers.AddedToken("café", normalized=True),
                              tokenizers.AddedToken("a\tb", normalized=True),
                              tokenizers.AddedToken("QuUx", normalized=False)])
    return tokenizer


TOKENIZERS = {f"lowercase={lowercase}, added={added}": variant(lowercase, added)
              for lowercase in (True, False) for added in (False, True)}
ENCODERS = {name: TextEncoder(tokenizer) for name, tokenizer in TOKENIZERS.items()}  # limits change between examples


def whole(tokenizer: Any, inputs: list[Any], limit: tuple[int | None, str]) -> list[tuple[list[int], list[int]]]:
    """The library's own encoding, normalizer and all."""
    max_length, direction = limit
    if max_length is None:
        tokenizer.no_truncation()
    else:
        tokenizer.enable_truncation(max_length, direction=direction)
    return [(each.ids, each.type_ids) for each in tokenizer.encode_batch(inputs)]


@pytest.mark.parametrize("name", sorted(TOKENIZERS))
@settings(max_examples=60, deadline=None)
@given(inputs=st.lists(INPUT, min_size=1, max_size=6), limit=st.sampled_from(LIMITS))
def test_the_encoder_gives_the_whole_paths_ids_and_token_types(name: str, inputs: list[Any],
                                                               limit: tuple[int | None, str]) -> None:
    tokenizer, encoder = TOKENIZERS[name], ENCODERS[name]
    encoder.limit(*limit)
    got = [(each.ids, each.type_ids) for each in encoder(inputs)]
    assert got == whole(tokenizer, inputs, limit)


@pytest.mark.parametrize("name", sorted(TOKENIZERS))
def test_added_tokens_match_as_the_library_matches_them(name: str) -> None:
    """Texts that hold an added token only as the library normalizes it ("café" is matched as "cafe", "a\tb" as
    "a b"), or only in another case than it was added in."""
    tokenizer, encoder = TOKENIZERS[name], ENCODERS[name]
    encoder.limit(None)
    texts = ["a cafe b", "x a b y", "Zbatch here", "quux and QuUx", "[mask] and [MASK]", ("a b", "CAFE")]
    assert [(each.ids, each.type_ids) for each in encoder(texts)] == whole(tokenizer, texts, (None, "right"))


def test_printable_ascii_takes_the_shortcut_and_anything_else_the_whole_path() -> None:
    """White-box: the whole path is made to fail, so an input that succeeds went through the copy without a
    normalizer, and one that fails did not."""
    encoder = TextEncoder(bundled_tokenizer())
    encoder.limit(None)

    def failing(inputs: list[Any]) -> list[Any]:
        raise AssertionError(f"the whole path was taken for {inputs!r}")

    encoder._encode = failing
    assert [each.ids for each in encoder(["Hello, World!", ("A question?", "an answer.")])]
    for other in ["naïve", "tab\there", "[MASK] me", "a [cls] b", "中文", ("fine", "not\x00")]:
        with pytest.raises(AssertionError, match="the whole path was taken"):
            encoder([other])


def test_a_mixed_batch_keeps_its_order() -> None:
    tokenizer = bundled_tokenizer()
    encoder = TextEncoder(tokenizer)
    encoder.limit(None)
    inputs = ["Plain ASCII.", "naïve café", "[MASK] here", "Another PLAIN one", "tab\tseparated"]
    assert [each.ids for each in encoder(inputs)] == [ids for ids, _ in whole(tokenizer, inputs, (None, "right"))]


def test_a_subclass_of_str_is_encoded_as_the_library_encodes_it() -> None:
    tokenizer = bundled_tokenizer()
    encoder = TextEncoder(tokenizer)
    encoder.limit(None)
    texts = [np.str_("Hi there"), "Hi there"]
    assert [each.ids for each in encoder(texts)] == [ids for ids, _ in whole(tokenizer, texts, (None, "right"))]


@pytest.mark.parametrize("added", [[f"extra{n}" for n in range(40)], ["\x00"]],
                         ids=["more added tokens than a text is worth checking for", "one that normalizes to nothing"])
def test_a_tokenizer_whose_added_tokens_cannot_be_checked_cheaply_takes_the_whole_path(added: list[str]) -> None:
    tokenizer = bundled_tokenizer()
    tokenizer.add_tokens([tokenizers.AddedToken(each, normalized=True) for each in added])
    encoder = TextEncoder(tokenizer)
    assert encoder._shortcut is None  # white-box: no copy is made
    encoder.limit(None)
    texts = ["extra3 Text", "plain"]
    assert [each.ids for each in encoder(texts)] == [ids for ids, _ in whole(tokenizer, texts, (None, "right"))]


def test_a_tokenizer_of_another_normalizer_or_release_takes_the_whole_path() -> None:
    serialized = json.loads(bundled_tokenizer().to_str())
    serialized["normalizer"] = {"type": "Lowercase"}
    lowercased = tokenizers.Tokenizer.from_str(json.dumps(serialized))
    encoder = TextEncoder(lowercased)
    assert encoder._shortcut is None
    assert [each.ids for each in encoder(["Hello"])] == [each.ids for each in lowercased.encode_batch(["Hello"])]

    class OlderTokenizer:  # a tokenizers release before encode_batch_fast, and without to_str
        def encode_batch(self, inputs: list[str]) -> list[str]:
            return inputs

    assert TextEncoder(OlderTokenizer())(["a"]) == ["a"]


# Printable ASCII only: what the word path takes (every punctuation mark, digits, both cases, runs of spaces), and
# words past WordPiece's 100 characters, which it gives as [UNK].
ASCII_TEXT = st.lists(st.one_of(st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7e), max_size=12),
                                st.sampled_from(["x" * 101, "ab" * 60, "unaffable", "##s", "[CLS]", "a[mask]"])),
                      max_size=8).map("".join)
TIGHT_LIMITS = [*LIMITS, (1, "right"), (2, "left"), (3, "right"), (3, "left"), (5, "left")]


@pytest.mark.parametrize("name", sorted(TOKENIZERS))
@settings(max_examples=80, deadline=None)
@given(texts=st.lists(ASCII_TEXT, min_size=1, max_size=5), limit=st.sampled_from(TIGHT_LIMITS))
def test_printable_ascii_by_words_gives_the_whole_paths_ids_at_any_truncation(
        name: str, texts: list[str], limit: tuple[int | None, str]) -> None:
    tokenizer, encoder = TOKENIZERS[name], ENCODERS[name]
    encoder.limit(*limit)
    assert [(each.ids, each.type_ids) for each in encoder(texts)] == whole(tokenizer, texts, limit)


def test_each_word_is_asked_of_the_library_once() -> None:
    """White-box: the texts learned from are recorded; a text of known words is not handed to the library."""
    tokenizer = bundled_tokenizer()
    encoder = TextEncoder(tokenizer)
    encoder.limit(None)
    words = encoder._shortcut._words  # type: ignore[union-attr]
    assert words is not None, "the bundled tokenizer (BERT's pre-tokenizer, WordPiece) takes the word path"
    learned: list[list[str]] = []
    library = words._learn

    def recording(split: list[str], encoding: Any) -> list[int]:
        learned.append(split)
        return library(split, encoding)

    words._learn = recording  # type: ignore[method-assign]
    texts = ["The cat, the CAT and the dog.", "the dog and THE cat.", "a new dog"]
    got = [each.ids for each in encoder(texts[:1]) + encoder(texts[1:])]  # texts of one call are learned together
    assert learned == [["the", "cat", ",", "the", "cat", "and", "the", "dog", "."], ["a", "new", "dog"]]
    assert sorted(words._cache) == sorted({",", ".", "a", "and", "cat", "dog", "new", "the"})
    assert got == [ids for ids, _ in whole(tokenizer, texts, (None, "right"))]


def test_long_words_and_long_texts_of_new_words_are_not_kept() -> None:
    from zbatch.protocol import texts

    tokenizer = bundled_tokenizer()
    encoder = TextEncoder(tokenizer)
    encoder.limit(None)
    words = encoder._shortcut._words  # type: ignore[union-attr]
    assert words is not None
    long_word = "q" * (texts.MAX_CACHED_CHARS + 1)
    many = " ".join(f"n{n}" for n in range(texts.MAX_LEARNED_WORDS + 1))
    inputs = [f"short {long_word}", many]
    got = [each.ids for each in encoder(inputs)]
    assert sorted(words._cache) == ["short"]
    assert got == [ids for ids, _ in whole(tokenizer, inputs, (None, "right"))]


def test_before_a_limit_is_set_the_tokenizer_s_own_truncation_and_padding_apply() -> None:
    tokenizer = bundled_tokenizer()
    assert tokenizer.padding is not None, "the bundled tokenizer pads: the case this guards"
    expected = [each.ids for each in tokenizer.encode_batch(["Hello world", "A longer text, of words."])]
    assert [each.ids for each in TextEncoder(tokenizer)(["Hello world", "A longer text, of words."])] == expected


def test_the_word_cache_never_grows_past_its_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    from zbatch.protocol import texts

    monkeypatch.setattr(texts, "MAX_CACHED_WORDS", 50)
    tokenizer = bundled_tokenizer()
    encoder = TextEncoder(tokenizer)
    encoder.limit(None)
    words = encoder._shortcut._words  # type: ignore[union-attr]
    assert words is not None
    inputs = [" ".join(f"w{n}x{k}" for k in range(7)) for n in range(40)]
    got = [each.ids for each in encoder(inputs)]
    assert len(words._cache) <= 50
    assert got == [ids for ids, _ in whole(tokenizer, inputs, (None, "right"))]


def test_a_tokenizer_of_another_pre_tokenizer_keeps_the_copy_without_a_normalizer() -> None:
    serialized = json.loads(bundled_tokenizer().to_str())
    serialized["pre_tokenizer"] = {"type": "Whitespace"}
    other = tokenizers.Tokenizer.from_str(json.dumps(serialized))
    encoder = TextEncoder(other)
    assert encoder._shortcut is not None and encoder._shortcut._words is None
    encoder.limit(None)
    texts = ["Don't split e-mail like BERT", "3.14 is pi"]
    assert [each.ids for each in encoder(texts)] == [ids for ids, _ in whole(other, texts, (None, "right"))]
