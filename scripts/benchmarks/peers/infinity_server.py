"""Infinity (``infinity-emb``): its own FastAPI server and batching engine, configured as the bench's peers are.

Infinity is built for exactly this job, so it brings its own model code (sentence-transformers'
modules: the model's own 256-token truncation, mean pooling, L2 norm) and its own batching:
a priority queue that groups similar lengths, at most ``--batch-size`` items, and a fixed 5 ms
``batch_delay`` between its stages (its default, and the bench's wait).  The server is the one its
``infinity_emb v2`` command builds (:func:`infinity_emb.infinity_server.create_server`), run by
uvicorn on uvloop and httptools as that command runs it; telemetry is off.  Clients POST the
OpenAI-style ``{"model": ..., "input": [text]}`` to ``/embeddings``.
"""

from __future__ import annotations

import asyncio
import os

from scripts.benchmarks.peers import MAX_BATCH, MODEL_NAME, TORCH_THREADS, arguments, limit_threads


def main() -> None:
    """Serve the model with infinity's torch engine (sentence-transformers' modules in PyTorch)."""
    args = arguments(__doc__.splitlines()[0])
    limit_threads()
    os.environ["DO_NOT_TRACK"] = "1"  # no usage statistics sent anywhere
    os.environ["INFINITY_ANONYMOUS_USAGE_STATS"] = "0"
    import torch
    import uvicorn
    import uvloop
    from infinity_emb.args import EngineArgs
    from infinity_emb.infinity_server import create_server

    torch.set_num_threads(TORCH_THREADS)
    engine = EngineArgs(model_name_or_path=args.model, served_model_name=MODEL_NAME, batch_size=MAX_BATCH,
                        engine="torch", device="cpu", dtype="float32", bettertransformer=False)
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    uvicorn.run(create_server(engine_args_list=[engine]), host="127.0.0.1", port=args.port, log_level="warning",
                http="httptools", loop="uvloop")


if __name__ == "__main__":
    main()
