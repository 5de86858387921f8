"""What the e2e tests of the client libraries share: the texts, sentence-transformers' vectors of them, and how
close two answers for the same text must be."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from worker.runners import default_model_path

TEXTS = ["The quick brown fox jumps over the lazy dog.", "hello world", "ZeroMQ sockets carry messages."]
SAME = 0.99999  # cosine of two answers for the same text
NOWHERE = "http://127.0.0.1:9"  # the discard port, closed: where a client's hub calls would go, and fail


def reference_vectors() -> np.ndarray:
    """sentence-transformers' normalized vectors of TEXTS by the default model."""
    from sentence_transformers import SentenceTransformer

    return np.asarray(SentenceTransformer(default_model_path(), device="cpu").encode(TEXTS, normalize_embeddings=True))


def cosine(a: Any, b: Any) -> float:
    a, b = np.asarray(a, dtype=np.float64).ravel(), np.asarray(b, dtype=np.float64).ravel()
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


def hub_pointed_nowhere(monkeypatch: pytest.MonkeyPatch) -> None:
    """huggingface_hub refuses a URL model while offline: online, with its hub and providers pointed nowhere."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "ENDPOINT", NOWHERE)
    monkeypatch.setattr(constants, "INFERENCE_PROXY_TEMPLATE", NOWHERE + "/{provider}")
    monkeypatch.setenv("HF_TOKEN", "unused")
