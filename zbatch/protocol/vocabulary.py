"""The names a client and a worker must agree on: tasks, operations, the payload's keys and its parameters.

They are written once, here (``zbatch/protocol/PROTOCOL.md`` section 5 is
what they mean), and the gateway and the worker both import them: the
gateway to choose a route's task and ask for an operation, the worker to
read the request and pick the runner.  The broker never reads a payload,
so it needs none of them.  Plain constants, no imports: any process may
load this module for free.
"""

from __future__ import annotations

from typing import Final

# ------------------------------------------------------------------ tasks (PROTOCOL.md 5.2)

EMBEDDINGS: Final = "embeddings"
SPARSE_EMBEDDINGS: Final = "sparse-embeddings"  # a masked-LM (SPLADE) model: a weight per vocabulary entry
RERANK: Final = "rerank"
TEXT_CLASSIFICATION: Final = "text-classification"
CLASSIFICATION: Final = frozenset({TEXT_CLASSIFICATION, "sentiment-analysis"})  # the second: its old alias
IMAGE_CLASSIFICATION: Final = "image-classification"
OBJECT_DETECTION: Final = "object-detection"
IMAGE_TASKS: Final = (IMAGE_CLASSIFICATION, OBJECT_DETECTION)
CUSTOM_TASK_PREFIX: Final = "python:"  # a runner of your own: python:package.module:Class

# ------------------------------------------------------------------ operations (PROTOCOL.md 5.3)

RUN: Final = "run"  # the model (the default)
TOKENIZE: Final = "tokenize"  # the tokenizer alone: each text's tokens
EMBED_ALL: Final = "embed_all"  # an embeddings model without pooling: a vector per token
DECODE: Final = "decode"  # the tokenizer backwards: token ids to text
TOKENIZER: Final = "tokenizer"  # the tokenizer itself, serialized, for a sender that tokenizes at the edge
OPERATIONS: Final = (RUN, TOKENIZE, EMBED_ALL, DECODE, TOKENIZER)

# ------------------------------------------------------------------ payload keys (PROTOCOL.md 5.1)

INPUTS: Final = "inputs"
PARAMETERS: Final = "parameters"
OPERATION: Final = "operation"
OUTPUTS: Final = "outputs"
TOKENS: Final = "tokens"
# A sparse embedding's output: the vocabulary entries with a weight above 0, and their weights.
SPARSE_INDICES: Final = "indices"
SPARSE_VALUES: Final = "values"

# ------------------------------------------------------------------ parameters (PROTOCOL.md 5.2, 5.3)

NORMALIZE: Final = "normalize"
DIMENSIONS: Final = "dimensions"
TRUNCATE: Final = "truncate"
TRUNCATION_DIRECTION: Final = "truncation_direction"
PROMPT_NAME: Final = "prompt_name"  # a prompt of the model's config_sentence_transformers.json, put before each text
RAW_SCORES: Final = "raw_scores"
TOP_K: Final = "top_k"
THRESHOLD: Final = "threshold"
ADD_SPECIAL_TOKENS: Final = "add_special_tokens"
SKIP_SPECIAL_TOKENS: Final = "skip_special_tokens"
PRECISION: Final = "precision"  # the numbers of an embedding as sent: float32 (the default) or float16
PRECISIONS: Final = ("float32", "float16")
TOKENIZED_BY: Final = "tokenized_by"  # the fingerprint of the tokenizer that made a request's token ids
