"""Model runners: what turns a batch of inputs into outputs on the worker's inference thread.

* :mod:`~worker.runners.spec`: the model spec, input checks and the default model;
* :mod:`~worker.runners.device`: device and dtype rules, CPU features;
* :mod:`~worker.runners.base`: the :class:`Runner` protocol and :func:`load_runner`;
* :mod:`~worker.runners.encoding`: inputs as a text model takes them: truncation,
  token counts, the ``tokenize`` operation, rows padded or concatenated;
* :mod:`~worker.runners.text`: what the text runners share: a batch encoded, then
  run in length groups (:mod:`~worker.runners.grouping`) or packed
  (:mod:`~worker.runners.packing`);
* :mod:`~worker.runners.embeddings`: sentence embeddings;
* :mod:`~worker.runners.classify`: cross-encoders (``rerank``) and text classifiers;
* :mod:`~worker.runners.images`: image classification and object detection;
* :mod:`~worker.runners.pipeline`: any other string-input transformers pipeline.

torch and transformers load inside the runners, so importing this package is cheap.
"""

from worker.runners.base import Runner, details_of, load_runner, operation_of, runner_class
from worker.runners.spec import (
    CUSTOM_TASK_PREFIX,
    DEFAULT_MODEL_NAME,
    InputError,
    ModelDetails,
    ModelSpec,
    Outputs,
    check_inputs,
    check_request,
    default_model_path,
)

__all__ = [
    "CUSTOM_TASK_PREFIX", "DEFAULT_MODEL_NAME", "InputError", "ModelDetails", "ModelSpec",
    "Outputs", "Runner", "check_inputs", "check_request", "default_model_path", "details_of", "load_runner",
    "operation_of", "runner_class",
]
