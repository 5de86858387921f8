"""Model runners: what turns a batch of inputs into outputs on the worker's inference thread.

* :mod:`~worker.runners.spec`: the model spec, input checks and the default model;
* :mod:`~worker.runners.device`: device and dtype rules, CPU features;
* :mod:`~worker.runners.base`: the :class:`Runner` protocol and :func:`load_runner`;
* :mod:`~worker.runners.embeddings`: sentence embeddings, grouped by length
  (:mod:`~worker.runners.grouping`);
* :mod:`~worker.runners.pipeline`: any string-input transformers pipeline.

torch and transformers load inside the runners, so importing this package is cheap.
"""

from worker.runners.base import Runner, load_runner, runner_class
from worker.runners.spec import (
    CUSTOM_TASK_PREFIX,
    DEFAULT_MODEL_NAME,
    EMBEDDINGS_TASK,
    InputError,
    ModelSpec,
    check_inputs,
    default_model_path,
)

__all__ = [
    "CUSTOM_TASK_PREFIX", "DEFAULT_MODEL_NAME", "EMBEDDINGS_TASK", "InputError", "ModelSpec", "Runner",
    "check_inputs", "default_model_path", "load_runner", "runner_class",
]
