"""Build tiny, randomly initialised models on disk so tests never touch the network.

BERT with any head (a cross-encoder for ``rerank`` too), GPT-2, a Longformer, a ViT image
classifier and a YOLOS object detector (no timm), and images made by Pillow.

Plain functions (no pytest imports) so any test module or script can reuse them;
wrap them in session-scoped fixtures via ``tmp_path_factory``.
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path

SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
WORDS = (
    "test hello world the a an is was be to of and in on at for with by from "
    "this that it he she we they you i good bad happy sad cat dog red blue "
    "green big small fast slow run walk eat day night model batch queue "
    "worker broker zero one two three"
).split()
ID2LABEL = {0: "negative", 1: "positive"}
HEADS = ("fill-mask", "text-classification", "token-classification", "feature-extraction", "rerank")
IMAGE_LABELS = {0: "cat", 1: "dog", 2: "bird"}


def write_vocab(folder: Path) -> Path:
    """Write a WordPiece vocab.txt holding the BERT special tokens plus a few lowercase words."""
    folder.mkdir(parents=True, exist_ok=True)
    vocab_file = folder / "vocab.txt"
    vocab_file.write_text("\n".join(SPECIAL_TOKENS + WORDS) + "\n", encoding="utf-8")
    return vocab_file


def make_tiny_bert(tmp_path: Path | str, head: str = "fill-mask", max_length: int = 128, **shape: int) -> str:
    """Save a tiny BERT with the given pipeline head (plus its tokenizer) and return the folder path.

    ``head`` is one of HEADS; "feature-extraction" saves a bare BertModel, "rerank" a
    cross-encoder (a sequence classifier with one label). Weights are seeded, so the
    same call always yields the same model.  ``max_length`` is the tokenizer's truncation, and ``shape``
    overrides the config's sizes (``hidden_size=96``, say): a model with a real model's activations and little
    of its arithmetic.
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
        "rerank": BertForSequenceClassification,
    }
    if head not in classes:
        raise ValueError(f"unknown head {head!r}; use one of {', '.join(HEADS)}")

    sizes = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 37,
             "max_position_embeddings": max(128, max_length)} | shape
    named = {**shape, **({"max_length": max_length} if max_length != 128 else {})}
    folder = Path(tmp_path) / "-".join(["tiny-bert", head, *(f"{k}{v}" for k, v in sorted(named.items()))])
    shutil.rmtree(folder, ignore_errors=True)  # a stale tokenizer.json would shadow the new vocab.txt
    write_vocab(folder)
    # from_pretrained on a folder holding only vocab.txt works on transformers 4.x and 5.x
    # (the constructor's vocab argument was renamed between them).
    tokenizer = BertTokenizerFast.from_pretrained(folder, do_lower_case=True, model_max_length=max_length)
    config = BertConfig(
        vocab_size=len(SPECIAL_TOKENS) + len(WORDS),
        **sizes,
        **_labels({0: "LABEL_0"} if head == "rerank" else ID2LABEL),
    )
    torch.manual_seed(0)
    model = classes[head](config).eval()
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


def make_tiny_longformer(tmp_path: Path | str) -> str:
    """Save a tiny Longformer encoder (attention window 4) with the BERT vocab's tokenizer.

    Its forward pads each batch to a multiple of the window with Python integers taken from the
    input's shape, so a traced ONNX export bakes in the example's length and fails on other
    lengths: a model whose export really does not validate.
    """
    import torch
    from transformers import BertTokenizerFast, LongformerConfig, LongformerModel

    folder = Path(tmp_path) / "tiny-longformer"
    shutil.rmtree(folder, ignore_errors=True)
    write_vocab(folder)
    tokenizer = BertTokenizerFast.from_pretrained(folder, do_lower_case=True, model_max_length=64)
    config = LongformerConfig(vocab_size=len(SPECIAL_TOKENS) + len(WORDS), hidden_size=32, num_hidden_layers=1,
                              num_attention_heads=2, intermediate_size=37, max_position_embeddings=80,
                              attention_window=4, pad_token_id=0)
    torch.manual_seed(0)
    LongformerModel(config).eval().save_pretrained(folder)
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


def _labels(id2label: dict[int, str]) -> dict[str, object]:
    return {"num_labels": len(id2label), "id2label": dict(id2label),
            "label2id": {label: i for i, label in id2label.items()}}


def make_tiny_vit(tmp_path: Path | str) -> str:
    """Save a tiny ViT image classifier (32x32 inputs, labels cat, dog, bird) and its image processor."""
    import torch
    from transformers import ViTConfig, ViTForImageClassification, ViTImageProcessor

    folder = Path(tmp_path) / "tiny-vit"
    shutil.rmtree(folder, ignore_errors=True)
    config = ViTConfig(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                       intermediate_size=37, **_labels(IMAGE_LABELS))
    torch.manual_seed(0)
    ViTForImageClassification(config).eval().save_pretrained(folder)
    ViTImageProcessor(size={"height": 32, "width": 32}).save_pretrained(folder)
    return str(folder)


def make_tiny_yolos(tmp_path: Path | str) -> str:
    """Save a tiny YOLOS object detector (5 detection tokens, labels cat, dog, bird) and its image processor.

    Its processor resizes to 32 to 64 pixels and pads a batch to its largest image, so images of
    different shapes share one forward pass.
    """
    import torch
    from transformers import YolosConfig, YolosForObjectDetection, YolosImageProcessor

    folder = Path(tmp_path) / "tiny-yolos"
    shutil.rmtree(folder, ignore_errors=True)
    config = YolosConfig(image_size=[32, 32], patch_size=8, hidden_size=32, num_hidden_layers=2,
                         num_attention_heads=2, intermediate_size=37, num_detection_tokens=5,
                         use_mid_position_embeddings=False, **_labels(IMAGE_LABELS))
    torch.manual_seed(0)
    YolosForObjectDetection(config).eval().save_pretrained(folder)
    YolosImageProcessor(size={"shortest_edge": 32, "longest_edge": 64}).save_pretrained(folder)
    return str(folder)


def image_bytes(width: int, height: int, seed: int = 0, image_format: str = "PNG") -> bytes:
    """An image file of random pixels, made by Pillow."""
    import io

    import numpy as np
    from PIL import Image

    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    encoded = io.BytesIO()
    Image.fromarray(pixels).save(encoded, format=image_format)
    return encoded.getvalue()


def with_prompts(folder: str, prompts: dict[str, str], default: str | None = None) -> str:
    """Give the model in ``folder`` prompts, as sentence-transformers saves them in
    ``config_sentence_transformers.json``; returns the folder."""
    import json

    config = {"prompts": prompts, "default_prompt_name": default, "similarity_fn_name": "cosine"}
    (Path(folder) / "config_sentence_transformers.json").write_text(json.dumps(config), encoding="utf-8")
    return folder


def make_tiny_qwen3(tmp_path: Path | str) -> str:
    """Save a tiny Qwen3 decoder (Qwen3-Embedding's architecture) with an offline tokenizer that, like that
    model's, ends each text with its end-of-text token and pads on the left with that token."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3Model

    folder = Path(tmp_path) / "tiny-qwen3"
    shutil.rmtree(folder, ignore_errors=True)
    eos = "<|endoftext|>"
    vocab = {token: i for i, token in enumerate(["<unk>", eos, *WORDS, ":", "query", "passage"])}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.post_processor = processors.TemplateProcessing(single=f"$A {eos}", pair=f"$A {eos} $B {eos}",
                                                           special_tokens=[(eos, vocab[eos])])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", eos_token=eos, pad_token=eos,
                                        padding_side="left", model_max_length=128)
    config = Qwen3Config(vocab_size=len(vocab), hidden_size=32, intermediate_size=37, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=16, max_position_embeddings=128,
                         eos_token_id=vocab[eos], pad_token_id=None)  # None: the end-of-text token's vector is not 0
    torch.manual_seed(0)
    Qwen3Model(config).eval().save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


def with_st_modules(folder: str, pooling: str | Sequence[str] = "mean", *, dense: Sequence[tuple[int, str]] = (),
                    normalize: bool = True, include_prompt: bool = True, max_seq_length: int | None = None,
                    do_lower_case: bool = False, legacy: bool = False, extra: Sequence[str] = ()) -> str:
    """Give the model in ``folder`` sentence-transformers modules, as sentence-transformers writes them: a
    Pooling of ``pooling`` (the older per-mode flags where ``legacy``), a seeded Dense per ``(out_features,
    activation)`` of ``dense``, Normalize where ``normalize``, then modules of the types in ``extra``;
    ``max_seq_length`` and ``do_lower_case`` in ``sentence_bert_config.json``.  Returns the folder."""
    import json

    import torch
    from safetensors.torch import save_file

    root = Path(folder)
    hidden = int(json.loads((root / "config.json").read_text())["hidden_size"])
    types = LEGACY_TYPES if legacy else TYPES
    modes = [pooling] if isinstance(pooling, str) else list(pooling)
    if legacy:
        flags = {f"pooling_mode_{flag}": name in modes for name, flag in LEGACY_FLAG_NAMES.items()}
        pooling_config: dict[str, object] = {"word_embedding_dimension": hidden, "include_prompt": include_prompt,
                                             **flags}
    else:
        pooling_config = {"embedding_dimension": hidden, "pooling_mode": pooling if isinstance(pooling, str) else modes,
                          "include_prompt": include_prompt}
    modules = [("", types["Transformer"], None), ("1_Pooling", types["Pooling"], pooling_config)]
    size = hidden * len(modes)
    torch.manual_seed(1)
    for out_features, activation in dense:
        path = f"{len(modules)}_Dense"
        modules.append((path, types["Dense"], {"in_features": size, "out_features": out_features, "bias": True,
                                                 "activation_function": activation}))
        (root / path).mkdir(exist_ok=True)
        save_file({"linear.weight": torch.randn(out_features, size) / size ** 0.5,
                   "linear.bias": torch.randn(out_features) / 10}, str(root / path / "model.safetensors"))
        size = out_features
    if normalize:
        modules.append((f"{len(modules)}_Normalize", types["Normalize"], None))
    modules.extend([(f"{len(modules) + i}_Extra", kind, None) for i, kind in enumerate(extra)])
    for path, _, config in modules:
        if config is not None:
            (root / path).mkdir(exist_ok=True)
            (root / path / "config.json").write_text(json.dumps(config), encoding="utf-8")
    listed = [{"idx": i, "name": str(i), "path": path, "type": kind} for i, (path, kind, _) in enumerate(modules)]
    (root / "modules.json").write_text(json.dumps(listed), encoding="utf-8")
    settings: dict[str, object] = {"do_lower_case": do_lower_case}
    if max_seq_length is not None:
        settings["max_seq_length"] = max_seq_length
    (root / "sentence_bert_config.json").write_text(json.dumps(settings), encoding="utf-8")
    return folder


# modules.json's types as sentence-transformers 6 writes them, and as its versions before 5.4 did
TYPES = {"Transformer": "sentence_transformers.base.modules.transformer.Transformer",
         "Pooling": "sentence_transformers.sentence_transformer.modules.pooling.Pooling",
         "Dense": "sentence_transformers.base.modules.dense.Dense",
         "Normalize": "sentence_transformers.base.modules.normalize.Normalize"}
LEGACY_TYPES = {kind: f"sentence_transformers.models.{kind}" for kind in TYPES}
LEGACY_FLAG_NAMES = {"cls": "cls_token", "max": "max_tokens", "mean": "mean_tokens",
                     "mean_sqrt_len_tokens": "mean_sqrt_len_tokens", "weightedmean": "weightedmean_tokens",
                     "lasttoken": "lasttoken"}
