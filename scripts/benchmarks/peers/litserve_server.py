"""LitServe: its FastAPI server and batching loop, the model in one inference worker process.

The documented LitAPI: ``decode_request`` takes one request's text, LitServe's loop collects up
to ``max_batch_size`` 32 of them within ``batch_timeout`` 5 ms, ``predict`` embeds the batch
and ``encode_response`` answers each request with its vector.  One inference worker on the CPU
(``workers_per_device=1``: the machine's 2 torch threads), one API server (LitServe's default:
as many as inference workers).  No client file is written.  Clients POST ``{"inputs": text}``
to ``/predict``; ``/health`` answers 200 once the worker is ready.  SIGTERM shuts down as Ctrl-C.
"""

from __future__ import annotations

import signal

import litserve as ls

from scripts.benchmarks.peers import MAX_BATCH, TIMEOUT_S, WAIT_MS, arguments, limit_threads


class EmbedAPI(ls.LitAPI):  # type: ignore[misc]
    """all-MiniLM-L6-v2 as a LitAPI; the model folder is set before LitServe starts the worker."""

    model_path = ""

    def setup(self, device: str) -> None:
        from scripts.benchmarks.peers.embed import Embedder

        self.embed = Embedder(self.model_path)

    def decode_request(self, request):  # type: ignore[no-untyped-def]
        """The request's text.  Unannotated on purpose: LitServe reads the annotation to choose how to
        parse the body, and without one it passes the JSON body as a dict, as its documentation shows."""
        return str(request["inputs"])

    def predict(self, texts: list[str]) -> list[list[float]]:
        return self.embed(texts).tolist()  # type: ignore[no-any-return]

    def encode_response(self, output: list[float]) -> list[float]:
        return output


def main() -> None:
    args = arguments(__doc__.splitlines()[0])
    limit_threads()
    api = EmbedAPI(max_batch_size=MAX_BATCH, batch_timeout=WAIT_MS / 1000)
    api.model_path = args.model
    server = ls.LitServer(api, accelerator="cpu", devices=1, workers_per_device=1, timeout=TIMEOUT_S)
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # LitServe shuts its processes down on SIGINT
    server.run(host="127.0.0.1", port=args.port, log_level="warning", generate_client_file=False)


if __name__ == "__main__":
    main()
