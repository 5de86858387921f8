"""``inference.GRPCInferenceService``'s six methods, answered as the HTTP KServe dialect answers them.

Each call is one :class:`~gateway.inference.Call`, as an HTTP request is:

* its API key from the ``authorization`` metadata (``Bearer KEY``), when the
  gateway has keys; ``ServerLive`` needs none, as ``/healthz``;
* its deadline: the gRPC deadline (and ``x-request-timeout-ms`` metadata),
  within the gateway's ``timeout_ms``, becomes the request's at the broker;
  a call whose deadline passes, or that its caller cancels, is cancelled by
  gRPC, which cancels the request at the broker (CANCEL);
* its priority from ``x-priority`` and its id from ``x-request-id``
  metadata, the id echoed in the trailing metadata with ``x-tokens``;
* the gateway's limits: the message size (gRPC's receive limit is
  ``max_body_bytes``), ``max_inputs`` and ``max_input_chars``, and
  ``max_connections`` requests in flight, counted with HTTP's.

``ModelInfer`` is served as a stream whose one message is read here, so a
call that never sends it ends after ``body_timeout_ms`` (as an HTTP body
that does not arrive), holds no slot of the in-flight limit meanwhile, and a
message that is not protobuf is an ``INVALID_ARGUMENT`` that says so.
Failures are the gateway's error codes, answered with their gRPC status
(gateway/kserve_grpc/statuses.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import grpc

from gateway.catalog import Catalog
from gateway.config import GatewayConfig
from gateway.errors import ApiError, from_broker, internal_error
from gateway.guard import RETRY_AFTER_S, ApiKeys, InFlight
from gateway.inference import TOKENS_HEADER, Call
from gateway.kserve_grpc import codec
from gateway.kserve_grpc import grpc_predict_v2_pb2 as pb
from gateway.kserve_grpc import model_config_pb2 as triton
from gateway.kserve_grpc.statuses import retry_metadata, status_of
from gateway.metrics import GatewayMetrics
from gateway.model_config import model_config
from gateway.parsing import PRIORITY_HEADER, TIMEOUT_HEADER, priority_from, timeout_ms_from
from gateway.signatures import infer, known_model, model_metadata, model_ready, server_metadata, server_ready
from gateway.signatures import signature as task_signature
from gateway.tracing import REQUEST_ID_HEADER, request_id_from
from zbatch.client import AsyncClient, ZBatchError

log = logging.getLogger("zbatch.gateway")
Context = grpc.aio.ServicerContext[Any, Any]
Handler = Callable[[Any, Context], Awaitable[Any]]
SERVICE = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"]
OPEN_METHODS = frozenset({"ServerLive"})  # liveness must not depend on a key
TRITON_METHODS = frozenset({"ModelConfig"})  # Triton's, beside KServe's (model_config.proto)


@dataclass
class Gateway:
    """What the service shares with the process's HTTP application: settings, broker client, catalog, limits."""

    config: GatewayConfig
    client: AsyncClient
    catalog: Catalog
    in_flight: InFlight
    metrics: GatewayMetrics
    keys: ApiKeys | None


class Service:
    """The six methods; :meth:`handlers` gives them to a gRPC server."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway

    def handlers(self) -> grpc.GenericRpcHandler:
        """Every method of the proto's service, each behind :meth:`_answered` (the key, errors, metrics)."""
        unary: dict[str, tuple[Handler, Any]] = {
            "ServerLive": (self.server_live, pb.ServerLiveRequest),
            "ServerReady": (self.server_ready, pb.ServerReadyRequest),
            "ModelReady": (self.model_ready, pb.ModelReadyRequest),
            "ServerMetadata": (self.server_metadata, pb.ServerMetadataRequest),
            "ModelMetadata": (self.model_metadata, pb.ModelMetadataRequest),
            "ModelConfig": (self.model_config, triton.ModelConfigRequest)}
        handlers: dict[str, grpc.RpcMethodHandler[Any, Any]] = {
            name: grpc.unary_unary_rpc_method_handler(self._answered(name, method, kind),
                                                      response_serializer=_serialized)
            for name, (method, kind) in unary.items()}
        handlers["ModelInfer"] = grpc.stream_unary_rpc_method_handler(
            self._answered("ModelInfer", self.model_infer), response_serializer=_serialized)
        declared = {method.name for method in SERVICE.methods} | TRITON_METHODS
        if set(handlers) != declared:  # the protos are the contract: every method, no other
            raise RuntimeError(f"the service answers {sorted(handlers)} but the proto declares {sorted(declared)}")
        return grpc.method_handlers_generic_handler(SERVICE.full_name, handlers)

    def _answered(self, method: str, handler: Handler, kind: Any = None) -> Handler:
        """``handler`` after the key check, its failures answered with their gRPC status, counted and timed.

        ``kind``: the request's message class, which the raw request is parsed as (None: the handler reads it).
        """
        metrics, keys = self.gateway.metrics, self.gateway.keys

        async def answer(request: Any, context: Context) -> Any:
            started = time.perf_counter()
            code = grpc.StatusCode.OK
            try:
                try:
                    if keys is not None and method not in OPEN_METHODS:
                        if not keys.allows(metadata_of(context).get("authorization")):
                            raise ApiError("unauthorized", "this gateway needs an API key: send the metadata "
                                                           "'authorization: Bearer KEY'")
                    return await handler(request if kind is None else codec.parsed(kind, request), context)
                except (ApiError, ZBatchError) as exc:
                    error = exc if isinstance(exc, ApiError) else from_broker(exc)
                    retry_ms = None if isinstance(exc, ApiError) else exc.retry_after_ms
                except Exception:
                    log.exception("unexpected error answering gRPC %s", method)
                    error, retry_ms = internal_error(), None
                code = status_of(error)
                await context.abort(code, error.message, trailing_metadata=retry_metadata(error, retry_ms))
            except asyncio.CancelledError:
                code = grpc.StatusCode.CANCELLED  # the caller cancelled, or its deadline passed
                raise
            finally:
                metrics.grpc_answered(method, code.name, time.perf_counter() - started)

        return answer

    async def server_live(self, request: pb.ServerLiveRequest, context: Context) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=True)

    async def server_ready(self, request: pb.ServerReadyRequest, context: Context) -> pb.ServerReadyResponse:
        """Ready as ``/readyz``; not ready is an answer (``ready: false``), not an error, as Triton's."""
        try:
            await server_ready(self.gateway.client, self.gateway.config)
        except ApiError:
            return pb.ServerReadyResponse(ready=False)
        return pb.ServerReadyResponse(ready=True)

    async def model_ready(self, request: pb.ModelReadyRequest, context: Context) -> pb.ModelReadyResponse:
        """Ready while a worker serves the model; an unknown model or one without a worker is not ready."""
        try:
            await model_ready(self.gateway.client, self.gateway.catalog, request.name)
        except ApiError:
            return pb.ModelReadyResponse(ready=False)
        return pb.ModelReadyResponse(ready=True)

    async def server_metadata(self, request: pb.ServerMetadataRequest, context: Context) -> pb.ServerMetadataResponse:
        return pb.ServerMetadataResponse(**server_metadata())

    async def model_metadata(self, request: pb.ModelMetadataRequest, context: Context) -> pb.ModelMetadataResponse:
        info = await known_model(self.gateway.client, self.gateway.catalog, request.name)
        return codec.metadata_response(model_metadata(info))

    async def model_config(self, request: triton.ModelConfigRequest,
                           context: Context) -> triton.ModelConfigResponse:
        """Triton's configuration of the model, as ``GET /v2/models/{model}/config`` answers it."""
        info = await known_model(self.gateway.client, self.gateway.catalog, request.name)
        return codec.config_response(model_config(info, self.gateway.config.max_inputs))

    async def model_infer(self, requests: Any, context: Context) -> pb.ModelInferResponse:
        """The request message (within ``body_timeout_ms``), then the model's tensors as the HTTP dialect's."""
        gateway = self.gateway
        request = codec.parse_infer(await first_message(context, gateway.config.body_timeout_ms / 1000))
        in_flight = gateway.in_flight
        if in_flight.full():
            raise ApiError("overloaded", in_flight.refusal(), {"Retry-After": str(RETRY_AFTER_S)})
        in_flight.count += 1
        gateway.metrics.started()
        try:
            call = call_of(gateway, context)
            tensors = codec.inputs_of(request)
            info = await gateway.catalog.lookup(gateway.client, request.model_name)
            names = codec.requested(request, task_signature(info).output_names)
            result, outputs = await infer(call, request.model_name, info, tensors,
                                          codec.parameters_of(request.parameters))
        finally:
            in_flight.count -= 1
            gateway.metrics.finished()
        by_name = {output.name: output for output in outputs}
        trailing = [(REQUEST_ID_HEADER.lower(), call.request_id)]
        if result.total_tokens is not None:
            trailing.append((TOKENS_HEADER.lower(), str(result.total_tokens)))
        context.set_trailing_metadata(tuple(trailing))
        return codec.infer_response(request.model_name, request.id, [by_name[name] for name in names])


def _serialized(message: Any) -> bytes:
    data: bytes = message.SerializeToString()
    return data


def metadata_of(context: Context) -> Mapping[str, str]:
    """The call's text metadata by lowercase key (binary ``-bin`` values are left out)."""
    return {key: value for key, value in context.invocation_metadata() or () if isinstance(value, str)}


async def first_message(context: Context, timeout_s: float) -> bytes:
    """The call's request message, which must arrive within ``timeout_s``."""
    try:
        async with asyncio.timeout(timeout_s):
            message = await context.read()
    except TimeoutError:
        raise ApiError("request_timeout", f"the request message did not arrive within {timeout_s:g} s of the "
                                          "call's start; send it at once") from None
    if not isinstance(message, bytes):
        raise ApiError("bad_request", "the call ended without a request message")
    return message


def call_of(gateway: Gateway, context: Context) -> Call:
    """The call's id, deadline (the gRPC deadline and ``x-request-timeout-ms``, within the gateway's) and priority."""
    metadata = metadata_of(context)
    timeout_ms = timeout_ms_from(metadata.get(TIMEOUT_HEADER.lower()), gateway.config)
    remaining = context.time_remaining()
    if remaining is not None:
        if remaining <= 0:
            raise ApiError("deadline_exceeded", "the call's deadline passed before the request could be sent")
        timeout_ms = min(timeout_ms or gateway.config.timeout_ms, max(1, int(remaining * 1000)))
    return Call(gateway.config, gateway.client, gateway.catalog,
                request_id_from(metadata.get(REQUEST_ID_HEADER.lower())), timeout_ms,
                priority_from(metadata.get(PRIORITY_HEADER.lower())))
