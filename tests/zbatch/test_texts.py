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
