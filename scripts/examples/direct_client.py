"""Talk to the broker directly over ZeroMQ, without HTTP.

Start the stack (scripts/serve), then: .venv/bin/python scripts/examples/direct_client.py
"""

from __future__ import annotations

from zbatch.client import Client, Overloaded

with Client("tcp://127.0.0.1:5555", overload_retries=3) as client:
    vectors = client.infer("all-MiniLM-L6-v2", ["ZeroMQ is a messaging library", "a socket library"])
    similarity = float(vectors[0] @ vectors[1])  # embeddings are L2-normalised: dot = cosine
    print(f"{len(vectors)} vectors of {vectors[0].shape[0]} floats, cosine similarity {similarity:.3f}")

    # Pipelining: submit many, then collect; each future raises the request's typed error.
    futures = [client.submit("all-MiniLM-L6-v2", [f"sentence number {i}"], priority=2) for i in range(10)]
    try:
        print("pipelined:", sum(len(f.result(timeout=30)) for f in futures), "results")
    except Overloaded as exc:
        print("the broker is overloaded:", exc.message)
    print("mean batch size so far:", client.stats()["models"]["all-MiniLM-L6-v2"]["mean_batch_size"])
