"""The model as the reference systems run it: loaded once, plain padded batches, a fixed thread count.

The limit and the Hugging Face guide's servers call the same runner the
worker uses, so the numbers compare serving, not two implementations of
mean pooling.  Without ``grouped`` the runner neither packs a batch nor
splits it by length
(:meth:`~worker.runners.embeddings.EmbeddingRunner.set_length_grouping`):
one padded forward pass per batch, as the guide's code and a plain offline
loop run it; not paying for padding is zbatch's own.  ``dtype`` is the
worker's ``--dtype``: the bfloat16 case compares like with like; ``runtime``
the worker's ``--runtime`` (torch here unless asked: the reference systems
run the model in PyTorch, as the guide writes them), ``quantize`` its
``--quantize``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from worker.runners.embeddings import EmbeddingRunner


def load(threads: int, grouped: bool = False, dtype: str = "float32", runtime: str = "torch",
         quantize: str = "none") -> EmbeddingRunner:
    import torch

    from worker.runners import DEFAULT_MODEL_NAME, ModelSpec, default_model_path, load_runner
    from worker.runners.embeddings import EmbeddingRunner

    torch.set_num_threads(threads)
    runner = load_runner(ModelSpec(DEFAULT_MODEL_NAME, default_model_path(), device="cpu", dtype=dtype,
                                   runtime=runtime, quantize=quantize))
    assert isinstance(runner, EmbeddingRunner), f"{DEFAULT_MODEL_NAME} loads as {type(runner).__name__}"
    runner.set_length_grouping(grouped)
    return runner
