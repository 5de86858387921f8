"""Sentence similarity, which two dialects answer (Hugging Face's sentence-similarity, TEI's ``/similarity``).

One request to an embeddings model for the source and the sentences, then
the cosine of each sentence's vector with the source's, here.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from gateway.errors import ApiError, bad_request
from gateway.inference import Call, Result, run


def similarity_inputs(inputs: dict[str, Any]) -> tuple[str, list[str]]:
    """``{"source_sentence": str, "sentences": [str]}``, checked."""
    source, sentences = inputs.get("source_sentence"), inputs.get("sentences")
    if not isinstance(source, str) or not source:
        raise bad_request('"inputs.source_sentence" must be a non-empty string')
    if (not isinstance(sentences, list) or not sentences
            or not all(isinstance(s, str) and s for s in sentences)):
        raise bad_request('"inputs.sentences" must be a non-empty list of non-empty strings')
    return source, sentences


async def similarity(
    call: Call, model: str, source: str, sentences: list[str], parameters: dict[str, Any], route: str,
) -> tuple[list[float], Result]:
    """The cosine similarity of each sentence with ``source``, from one request to an embeddings model.

    The caller has refused a model known to do another task (``require_task`` of gateway/dialects/, whose
    message names the routes that answer it); a model that still answers no vectors is refused here.
    """
    result = await run(call, model, [source, *sentences], parameters)
    vectors = np.asarray(result.outputs, dtype=np.float32)
    if vectors.ndim != 2:
        raise ApiError("wrong_task", f"{route} needs an embeddings model; {model!r} does not answer vectors")
    norms = np.linalg.norm(vectors, axis=1)
    norms[norms == 0] = 1.0
    unit = vectors / norms[:, None]
    scores: list[float] = (unit[1:] @ unit[0]).tolist()
    return scores, result
