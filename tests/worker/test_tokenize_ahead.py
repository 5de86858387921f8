"""``--tokenize-ahead``: with or without the encoder thread, a text model gives the same answers.

Two real workers of one broker serve the bundled model under two names, one with the encoder thread
(``true``; ``auto``, the default, uses it only off the CPU) and one without (``false``); a burst of
concurrent requests (so batches queue behind a running one, which is when the encoder thread works)
gets the same vectors from both.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np

from zbatch import testing
from zbatch.client import AsyncClient

TEXTS = [f"text number {n} " + "word " * (n % 40) for n in range(96)]


async def vectors(frontend: str, model: str) -> np.ndarray:
    async with AsyncClient(frontend) as client:
        answers = await asyncio.gather(*(client.infer(model, [text]) for text in TEXTS))
    return np.stack([np.asarray(answer[0]) for answer in answers])


def test_tokenizing_inline_gives_the_same_vectors_as_ahead(tmp_path: Path) -> None:
    with testing.Daemons(tmp_path) as daemons:
        broker = daemons.add(testing.start_broker(tmp_path))
        daemons.add(testing.start_worker(broker, tmp_path, "ahead", model_name="ahead", workers=1,
                                         tokenize_ahead="true"))
        inline = daemons.add(testing.start_worker(broker, tmp_path, "inline", model_name="inline",
                                                  tokenize_ahead="false", workers=1))
        ahead_vectors = asyncio.run(vectors(broker.frontend, "ahead"))
        inline_vectors = asyncio.run(vectors(broker.frontend, "inline"))
        assert inline.alive()
    assert np.allclose(ahead_vectors, inline_vectors, atol=1e-5)
    assert np.allclose(np.linalg.norm(inline_vectors, axis=1), 1.0, atol=1e-5)
