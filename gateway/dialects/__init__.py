"""The HTTP dialects the gateway speaks besides its own, one module each, and which paths belong to which.

* :mod:`gateway.dialects.openai`: OpenAI's ``/v1/models`` and ``/v1/embeddings``.
* :mod:`gateway.dialects.tei`: Hugging Face Text Embeddings Inference (``/embed``,
  ``/rerank``, ``/predict``, ``/similarity``, ``/tokenize``, ``/info``, ``/health``).
* :mod:`gateway.dialects.kserve`: the Open Inference Protocol (KServe v2, Triton,
  MLServer) under ``/v2``, with Triton's binary tensor extension
  (:mod:`gateway.dialects.tensors`).
* :mod:`gateway.dialects.huggingface`: the Hugging Face Inference API shapes of
  ``POST /models/{model}`` (texts, sentence similarity, images).

Each dialect answers its errors in its own shape (gateway/errors.py renders
them from the one error table); :func:`dialect_of` tells by the path, so even
a 404 or 405 under ``/v2`` reaches a Triton client in a shape it reads.  This
module imports nothing of the gateway, so the error middleware can use it.
"""

from __future__ import annotations

import enum


class Dialect(enum.Enum):
    """Whose request and error shapes a path answers in."""

    ZBATCH = "zbatch"
    OPENAI = "openai"
    TEI = "tei"
    KSERVE = "kserve"


# TEI serves one model per server at the root; these are its routes the gateway answers.
TEI_PATHS = frozenset({"/embed", "/rerank", "/predict", "/similarity", "/tokenize", "/info", "/health"})
OPENAI_PREFIX = "/v1/"
ZBATCH_V1_PATHS = frozenset({"/v1/stats"})  # the gateway's own endpoint under /v1
KSERVE_ROOT = "/v2"


def dialect_of(path: str) -> Dialect:
    """The dialect of a request path: /v1/* is OpenAI's (but /v1/stats), /v2... KServe's, TEI's own paths TEI's."""
    if path.startswith(OPENAI_PREFIX) and path not in ZBATCH_V1_PATHS:
        return Dialect.OPENAI
    if path == KSERVE_ROOT or path.startswith(KSERVE_ROOT + "/"):
        return Dialect.KSERVE
    if path in TEI_PATHS:
        return Dialect.TEI
    return Dialect.ZBATCH
