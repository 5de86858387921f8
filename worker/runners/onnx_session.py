"""An exported graph in ONNX Runtime, called as the runners call a transformers model, on the ledger's threads.

Theory of operation
-------------------
:class:`OrtModel` stands in for the model object a
:class:`~worker.runners.text.TextRunner` holds: ``model(**tensors)`` feeds
the batch's arrays to an ``onnxruntime.InferenceSession`` and returns the
graph's output under the name the runner reads (``last_hidden_state`` or
``logits``), so tokenizing, planning, length groups, pooling and scoring
stay the runner's own, one implementation for either runtime.  CPU tensors
and numpy arrays share memory both ways, so nothing is copied.  Position ids
are made here (0, 1, 2, ... on every row) where the graph takes them, and
token type ids are zeros where the caller has none (calibration batches).

Threads.  ORT fixes a session's intra-op thread count when the session is
made, while the cores ledger (:mod:`worker.cores`) grants each batch its own
count: every core to a lone busy worker, a share to workers busy together,
one while foreign processes hold the cores (:mod:`worker.threads`).  The
inference thread sets torch's thread count to the grant before each batch
(:mod:`worker.engine`); this model reads it and runs the session made for
that count.  Sessions are made at load for :func:`thread_counts`, every
power of two below the full count and the full count itself, so no batch
waits for a session to be built and memory stays at a few copies of the
weights; a grant between two counts runs on the lower one, so the worker
never runs more threads than it was granted.  ORT's threads do not spin
while they wait (its default spins through the gaps between batches, on
cores the ledger has handed to another worker): they sleep and leave the
cores to the next worker.

Packed passes.  Where the export wrote a packed graph and it validated,
:class:`OrtPacker` runs a batch's inputs as one row with no padding
(:mod:`worker.runners.packing`'s contract, so the runner's packed plan and
pooling serve it unchanged).  Its attention is one dense call over the whole
row, masked to each input's own tokens, so its cost grows with the square of
the row: a packed group holds at most :data:`PACKED_MAX_TOKENS` tokens, where
it still beat the padded graph on this project's CPU (BENCHMARKS.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from worker.runners.onnx_export import ATTENTION_BIAS, OUTPUT, attention_bias
from worker.runners.packing import restarting_positions

if TYPE_CHECKING:
    import onnxruntime
    import torch


def thread_counts(full: int) -> list[int]:
    """The counts a model keeps a session for: powers of two below ``full``, and ``full``."""
    counts = []
    count = 1
    while count < full:
        counts.append(count)
        count *= 2
    return [*counts, max(1, full)]


def session_threads(granted: int, counts: list[int]) -> int:
    """The largest kept count that does not exceed ``granted`` (at least the smallest)."""
    return max((count for count in counts if count <= granted), default=counts[0])


def make_session(path: Path, threads: int) -> onnxruntime.InferenceSession:
    """A CPU session of ``threads`` intra-op threads, one batch at a time, every graph optimisation."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = onnxruntime.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.log_severity_level = 4  # fatal only: a failing run raises, and the worker says why
    # ORT's idle pool threads spin by default, here for the whole gap between two runs (BENCHMARKS.md, ONNX
    # Runtime): a worker that just ran a batch would take the cores the ledger hands to the next one.
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


class ModelOutput:
    """The graph's output where a transformers output would have it: ``output.<name>`` and ``output[0]``."""

    def __init__(self, name: str, tensor: torch.Tensor) -> None:
        self._name = name
        self._tensor = tensor

    def __getattr__(self, name: str) -> torch.Tensor:
        if name == self.__dict__.get("_name"):
            return self._tensor
        raise AttributeError(name)

    def __getitem__(self, index: int) -> torch.Tensor:
        if index != 0:
            raise IndexError(index)
        return self._tensor


PACKED_MAX_TOKENS = 256


class OrtModel:
    """An exported graph run by ONNX Runtime, called like the transformers model it was exported from."""

    def __init__(self, path: Path, inputs: tuple[str, ...], head: str, config: Any, full_threads: int) -> None:
        import torch

        self.path = path
        self.config = config
        self.dtype = torch.float32
        self.head = head
        self.inputs = inputs
        self.counts = thread_counts(full_threads)
        self.sessions = {count: make_session(path, count) for count in self.counts}

    def packer(self, path: Path, inputs: tuple[str, ...]) -> OrtPacker:
        """The packed graph at ``path`` (taking ``inputs``) in sessions for this model's thread counts."""
        return OrtPacker({count: make_session(path, count) for count in self.counts}, inputs, self.counts)

    def __call__(self, **tensors: torch.Tensor) -> ModelOutput:
        import torch

        session = self.sessions[session_threads(torch.get_num_threads(), self.counts)]
        output = session.run([OUTPUT], self.feed({name: tensor.numpy() for name, tensor in tensors.items()}))[0]
        return ModelOutput(self.head, torch.from_numpy(output))

    def feed(self, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The graph's inputs from a batch's arrays: position ids made, missing token types zero."""
        ids = arrays["input_ids"]
        feed = {}
        for name in self.inputs:
            if name in arrays:
                feed[name] = np.ascontiguousarray(arrays[name], dtype=np.int64)
            elif name == "position_ids":
                feed[name] = np.tile(np.arange(ids.shape[1], dtype=np.int64), (ids.shape[0], 1))
            else:
                feed[name] = np.zeros(ids.shape, dtype=np.int64)
        return feed


class OrtPacker:
    """A packed graph in ONNX Runtime: :class:`~worker.runners.packing.Packer`'s call over a packed group."""

    max_tokens = PACKED_MAX_TOKENS
    min_inputs = 2  # one input alone has no padding, and the fused padded graph runs it faster

    def __init__(self, sessions: dict[int, onnxruntime.InferenceSession], inputs: tuple[str, ...],
                 counts: list[int]) -> None:
        self.sessions = sessions
        self.inputs = inputs
        self.counts = counts

    def __call__(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None,
                 lengths: Sequence[int]) -> torch.Tensor:
        """The last hidden state of each token, ``(sum(lengths), hidden)``, for inputs concatenated in order."""
        import torch

        ids = input_ids.numpy().astype(np.int64, copy=False)[None]
        arrays = {"input_ids": ids,
                  "token_type_ids": (token_type_ids.numpy().astype(np.int64, copy=False)[None]
                                     if token_type_ids is not None else np.zeros_like(ids)),
                  "position_ids": restarting_positions(lengths)[None],
                  ATTENTION_BIAS: attention_bias(lengths)}
        session = self.sessions[session_threads(torch.get_num_threads(), self.counts)]
        output = session.run([OUTPUT], {name: arrays[name] for name in self.inputs})[0]
        return torch.from_numpy(output[0])
