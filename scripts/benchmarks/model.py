"""The model as the reference systems run it: loaded once, plain padded batches, a fixed thread count.

The limit and the Hugging Face guide's servers call the same runner the
worker uses, so the numbers compare serving, not two implementations of
mean pooling.  Without ``grouped`` the runner never splits a batch by length:
one padded forward pass per batch, as the guide's code and the offline
"batch 32" rate of the issue do; padding-aware grouping is zbatch's own.
``dtype`` is the worker's ``--dtype``: the bfloat16 case compares like with like.
"""

from __future__ import annotations

from typing import Any


def load(threads: int, grouped: bool = False, dtype: str = "float32") -> Any:
    import torch

    from worker.runners import DEFAULT_MODEL_NAME, ModelSpec, default_model_path, load_runner
    from worker.runners.grouping import NEVER_SPLIT

    torch.set_num_threads(threads)
    runner = load_runner(ModelSpec(DEFAULT_MODEL_NAME, default_model_path(), device="cpu", dtype=dtype))
    if not grouped:
        runner.cost_model = NEVER_SPLIT
    return runner
