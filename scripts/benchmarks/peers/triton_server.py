"""Triton Inference Server through PyTriton: the real ``tritonserver`` and its dynamic batcher, the model in Python.

PyTriton ships the ``tritonserver`` binary and starts it; Triton's HTTP front end takes the
requests and its dynamic batcher groups them (``max_batch_size`` 32, ``max_queue_delay`` 5 ms),
then Triton's Python backend hands each batch over to this process, whose ``@batch`` function
embeds it.  The KServe v2 protocol is Triton's own: clients POST
``{"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1, 1], "data": [text]}]}`` to
``/v2/models/all-MiniLM-L6-v2/infer``.  Triton's Python backend stub links the interpreter's
``libpython``, so the bench starts this with ``LD_LIBRARY_PATH`` at that interpreter's own
library folder.  GRPC and metrics listeners are off (HTTP is what is measured).
SIGTERM stops Triton and cleans PyTriton's workspace, as Ctrl-C does.
"""

from __future__ import annotations

import signal

import numpy as np
from pytriton.decorators import batch
from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig

from scripts.benchmarks.peers import MAX_BATCH, MODEL_NAME, WAIT_MS, arguments, limit_threads


def main() -> None:
    args = arguments(__doc__.splitlines()[0])
    limit_threads()
    from scripts.benchmarks.peers.embed import Embedder

    embed = Embedder(args.model)

    @batch  # type: ignore[untyped-decorator]
    def infer(text: np.ndarray) -> dict[str, np.ndarray]:
        """One batch from Triton: ``text`` is a (batch, 1) array of UTF-8 bytes."""
        return {"embedding": embed([row[0].decode("utf-8") for row in text])}

    signal.signal(signal.SIGTERM, signal.default_int_handler)  # PyTriton's serve() stops cleanly on SIGINT
    config = TritonConfig(http_address="127.0.0.1", http_port=args.port, allow_grpc=False, allow_metrics=False,
                          exit_timeout_secs=5)
    with Triton(config=config) as triton:
        triton.bind(model_name=MODEL_NAME, infer_func=infer,
                    inputs=[Tensor(name="text", dtype=bytes, shape=(1,))],
                    outputs=[Tensor(name="embedding", dtype=np.float32, shape=(-1,))],
                    config=ModelConfig(max_batch_size=MAX_BATCH,
                                       batcher=DynamicBatcher(max_queue_delay_microseconds=int(WAIT_MS * 1000))))
        triton.serve()


if __name__ == "__main__":
    main()
