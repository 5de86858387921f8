"""Models of a given shape for speed measurements: the bundled model's tokenizer, config and sentence-transformers
modules, with the layers and widths of a bigger model and random (seeded) weights.

Only the speed of such a model is measured, never its vectors, so a model of e5-small-v2's or a base-size
BERT's shape needs no download: it is built once into the folder the caller names (the bench's cache) and
kept.  Tokens per text are counted with the same tokenizer, so that a row's texts/s can be given in tokens/s
as the anchors give theirs.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from worker.runners.spec import default_model_path


@dataclass(frozen=True)
class Shape:
    """A BERT's layers and widths; ``name`` is how rows and folders name it."""

    name: str
    layers: int
    hidden: int
    heads: int
    intermediate: int

    @property
    def folder_name(self) -> str:
        return f"bert-{self.layers}x{self.hidden}-random"


E5_SMALL = Shape("e5-small-v2's shape (12 x 384)", 12, 384, 12, 1536)
BERT_BASE = Shape("a base-size BERT (12 x 768)", 12, 768, 12, 3072)
WEIGHTS = ("*.safetensors", "*.bin", "*.onnx", "*.pt", "onnx", "openvino")


def shaped_model(shape: Shape, root: Path, base: str | None = None) -> Path:
    """The folder of a model of ``shape`` in ``root`` (built on the first call, then kept): the tokenizer, config
    and modules of ``base`` (default: the bundled model) with ``shape``'s layers and widths, and weights drawn
    from a fixed seed."""
    folder = root / shape.folder_name
    if (folder / "model.safetensors").exists():
        return folder
    import torch
    from transformers import AutoConfig, AutoModel

    print(f"[shapes {time.strftime('%H:%M:%S')}] building {shape.name} with random weights in {folder}",
          file=sys.stderr, flush=True)
    bundled = Path(base or default_model_path())
    partial = folder.with_name(folder.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    shutil.copytree(bundled, partial, ignore=shutil.ignore_patterns(*WEIGHTS))
    config = AutoConfig.from_pretrained(bundled, num_hidden_layers=shape.layers, hidden_size=shape.hidden,
                                        num_attention_heads=shape.heads, intermediate_size=shape.intermediate)
    torch.manual_seed(0)
    AutoModel.from_config(config).save_pretrained(partial)
    pooling = partial / "1_Pooling" / "config.json"
    if pooling.exists():  # the pooling module declares the width it pools
        declared = json.loads(pooling.read_text())
        pooling.write_text(json.dumps(declared | {"word_embedding_dimension": shape.hidden}, indent=2))
    partial.rename(folder)
    return folder


def mean_tokens(model: Path | str, texts: list[str]) -> float:
    """The mean tokens a text of ``texts`` is to ``model``'s tokenizer, special tokens included, truncated where
    the model truncates (its ``max_seq_length``, else the tokenizer's limit)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model))
    settings = Path(model) / "sentence_bert_config.json"
    limit = json.loads(settings.read_text()).get("max_seq_length") if settings.exists() else None
    encoded = tokenizer(texts, truncation=True, max_length=limit or tokenizer.model_max_length)
    return sum(len(ids) for ids in encoded["input_ids"]) / len(texts)
