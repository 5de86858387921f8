"""Triton's model configuration of a served model: what ``GET /v2/models/{model}/config`` and gRPC ``ModelConfig``
answer.

Triton's clients and tools read it beside the model's metadata:
``tritonclient``'s ``get_model_config``, and ``perf_analyzer``, which needs
``max_batch_size`` and each tensor's data type and dims before it sends
anything.  It is written from the task's KServe tensors (gateway/signatures.py)
in Triton's JSON form, the fields of Triton's ``model_config.proto`` by their
names, data types as ``TYPE_*``; the gRPC service turns the same dictionary
into the message (gateway/kserve_grpc/model_config.proto).

* ``max_batch_size``: the most inputs one request may carry (the gateway's
  ``max_inputs``), for a task whose every tensor has the batch as its first
  dimension; 0 where outputs are flat lists over the whole request (sparse
  embeddings, detections), whose dims are then their whole shapes.
* ``dims``: a batched tensor's shape after the batch dimension; one element
  per input (KServe shape ``[-1]``) is Triton's ``dims [1]`` reshaped to ``[]``
  (a request may send ``[N, 1]``, as Triton's clients do from these dims, or
  ``[N]``, as the metadata says).
* ``dynamic_batching``: the workers batch requests together, up to the
  model's batch size on its workers (READY's ``max_batch_size``), which is the
  preferred batch size.
"""

from __future__ import annotations

from typing import Any

from gateway.catalog import ModelInfo
from gateway.signatures import SERVER, Tensor, signature

# Triton's data types (model_config.proto's DataType) of the KServe datatypes the gateway answers in.
DATA_TYPES = {"BYTES": "TYPE_STRING", "FP32": "TYPE_FP32", "FP64": "TYPE_FP64", "INT32": "TYPE_INT32",
              "INT64": "TYPE_INT64"}


def tensor_config(tensor: Tensor, batched: bool) -> dict[str, Any]:
    """One input or output: its name, data type and dims (and reshape), as Triton configures it."""
    name, datatype, shape = tensor
    entry: dict[str, Any] = {"name": name, "data_type": DATA_TYPES[datatype]}
    dims = shape[1:] if batched else shape
    if dims:
        entry["dims"] = dims
    else:  # one element per input
        entry["dims"], entry["reshape"] = [1], {"shape": []}
    return entry


def model_config(info: ModelInfo, max_inputs: int) -> dict[str, Any]:
    """The model's configuration in Triton's JSON form (see the module's doc)."""
    shape = signature(info)
    inputs = [tensor_config(tensor, shape.batched) | ({"optional": True} if tensor[0] in shape.optional else {})
              for tensor in shape.inputs]
    config: dict[str, Any] = {
        "name": info.name, "platform": f"{SERVER}/{info.task or 'unknown'}", "backend": SERVER,
        "max_batch_size": max_inputs if shape.batched else 0, "input": inputs,
        "output": [tensor_config(tensor, shape.batched) for tensor in shape.outputs],
    }
    if shape.batched and info.max_batch_size:
        config["dynamic_batching"] = {"preferred_batch_size": [min(info.max_batch_size, max_inputs)]}
    return config
