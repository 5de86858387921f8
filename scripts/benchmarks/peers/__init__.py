"""Other serving frameworks ("peers") serving the bench's model, one module per peer, each a small server script.

Each ``NAME_server`` module runs as ``python -m scripts.benchmarks.peers.NAME_server --port P --model DIR``
with the interpreter of the peer's own virtual environment (:mod:`scripts.benchmarks.peers.venvs`
installs it: the peer's pinned release next to torch's CPU build), so a server module, ``embed`` and
this package import only the standard library and what that environment holds, never zbatch.  The
bench's side of the peers, run in the bench's own environment, is ``venvs`` (the installs) and
``systems`` (which peers there are, and how each is started, checked against zbatch's vectors and
stopped); the peers case that measures them is :mod:`scripts.benchmarks.cases.peers`.  Every peer serves the
model the same way, with the settings below, which are zbatch's defaults as ``scripts/serve``
ships it: the comparison is of the serving, not of the model.
"""

from __future__ import annotations

import argparse
import os

MODEL_NAME = "all-MiniLM-L6-v2"  # the name each peer serves the model under
# On a GPU host (the gpu case) the peer runs where and as zbatch's worker does there: these say how.
DEVICE_ENV, DTYPE_ENV, MAX_BATCH_ENV = "ZBATCH_PEER_DEVICE", "ZBATCH_PEER_DTYPE", "ZBATCH_PEER_MAX_BATCH"
MAX_BATCH = int(os.environ.get(MAX_BATCH_ENV, "32"))  # items per forward pass at most
WAIT_MS = 5.0  # how long a peer's batcher may hold the first item for more to arrive
TORCH_THREADS = 2  # the whole machine's cores, as the zbatch worker's --torch-threads in the bench
MAX_TOKENS = 256  # truncation: the model's max_seq_length (its sentence_bert_config.json)
TIMEOUT_S = 30.0  # a request's deadline where a peer has one: zbatch's gateway default


def arguments(description: str) -> argparse.Namespace:
    """The flags every peer script takes: the HTTP port (given by the harness) and the model folder."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--port", type=int, required=True, help="HTTP port on 127.0.0.1")
    parser.add_argument("--model", required=True, help="folder of the sentence-transformers model")
    args, _ = parser.parse_known_args()  # some peers read sys.argv themselves (mosec)
    return args


def limit_threads() -> None:
    """Cap every thread pool at TORCH_THREADS before torch or numpy load, in this process and its children."""
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[name] = str(TORCH_THREADS)
