"""Build tiny, randomly initialised BERT models on disk so tests never touch the network.

Plain functions (no pytest imports) so any test module or script can reuse them;
wrap them in session-scoped fixtures via ``tmp_path_factory``.
"""

from __future__ import annotations

import shutil
from pathlib import Path

SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
WORDS = (
    "test hello world the a an is was be to of and in on at for with by from "
    "this that it he she we they you i good bad happy sad cat dog red blue "
    "green big small fast slow run walk eat day night model batch queue "
    "worker broker zero one two three"
).split()
ID2LABEL = {0: "negative", 1: "positive"}
HEADS = ("fill-mask", "text-classification", "token-classification", "feature-extraction")


def write_vocab(folder: Path) -> Path:
    """Write a WordPiece vocab.txt holding the BERT special tokens plus a few lowercase words."""
    folder.mkdir(parents=True, exist_ok=True)
    vocab_file = folder / "vocab.txt"
    vocab_file.write_text("\n".join(SPECIAL_TOKENS + WORDS) + "\n", encoding="utf-8")
    return vocab_file


def make_tiny_bert(tmp_path: Path | str, head: str = "fill-mask") -> str:
    """Save a tiny BERT with the given pipeline head (plus its tokenizer) and return the folder path.

    ``head`` is one of HEADS; "feature-extraction" saves a bare BertModel. Weights are
    seeded, so the same call always yields the same model.
    """
    import torch
    from transformers import (
        BertConfig,
        BertForMaskedLM,
        BertForSequenceClassification,
        BertForTokenClassification,
        BertModel,
        BertTokenizerFast,
    )

    classes = {
        "fill-mask": BertForMaskedLM,
        "text-classification": BertForSequenceClassification,
        "token-classification": BertForTokenClassification,
        "feature-extraction": BertModel,
    }
    if head not in classes:
        raise ValueError(f"unknown head {head!r}; use one of {', '.join(HEADS)}")

    folder = Path(tmp_path) / f"tiny-bert-{head}"
    shutil.rmtree(folder, ignore_errors=True)  # a stale tokenizer.json would shadow the new vocab.txt
    write_vocab(folder)
    # from_pretrained on a folder holding only vocab.txt works on transformers 4.x and 5.x
    # (the constructor's vocab argument was renamed between them).
    tokenizer = BertTokenizerFast.from_pretrained(folder, do_lower_case=True, model_max_length=128)
    config = BertConfig(
        vocab_size=len(SPECIAL_TOKENS) + len(WORDS),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=37,
        max_position_embeddings=128,
        num_labels=len(ID2LABEL),
        id2label=dict(ID2LABEL),
        label2id={label: i for i, label in ID2LABEL.items()},
    )
    torch.manual_seed(0)
    model = classes[head](config).eval()
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


def make_tiny_gpt2(tmp_path: Path | str) -> str:
    """Save a tiny GPT-2 causal LM whose tokenizer, like the real GPT-2's, has no pad token."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    folder = Path(tmp_path) / "tiny-gpt2"
    shutil.rmtree(folder, ignore_errors=True)
    vocab = {token: i for i, token in enumerate(["<unk>", "<eos>", *WORDS])}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, unk_token="<unk>", eos_token="<eos>", bos_token="<eos>", model_max_length=128
    )
    config = GPT2Config(
        vocab_size=len(vocab), n_positions=128, n_embd=32, n_layer=2, n_head=2, bos_token_id=1, eos_token_id=1
    )
    torch.manual_seed(0)
    GPT2LMHeadModel(config).eval().save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)
