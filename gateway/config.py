"""The gateway's settings: one frozen dataclass, loaded from flags and ``ZBATCH_*`` variables."""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gateway.guard import check_api_keys_file
from zbatch.client.aio import RESTART_WAIT_MS
from zbatch.runtime import common_options
from zbatch.runtime.curve import check_client_settings
from zbatch.runtime.settings import MODELS_HELP, check_endpoints, check_exposure, load, option

# processes = 0: one per core, up to this.  One process is one event loop on one core; past 4 the broker behind
# them, itself on one core, is the limit, and each more process only costs memory and a broker connection
# (what one core of each serves: BENCHMARKS.md, Analysis).
MAX_AUTO_PROCESSES = 4


@dataclass(frozen=True)
class GatewayConfig:
    """HTTP front for zbatch brokers: Hugging Face style /models/{model}, OpenAI's /v1, TEI's routes,
    KServe v2 (/v2), plain-text POST /, plus /healthz, /readyz, /models and /v1/stats."""

    host: str = option("127.0.0.1", "address to listen on")
    port: int = option(8000, "TCP port to listen on; 0 picks any free port", minimum=0)
    grpc_port: int = option(
        0, "TCP port of the KServe v2 gRPC service (inference.GRPCInferenceService; Triton's is 8001), on the same "
        "host, in each gateway process beside HTTP; 0: off. Needs grpcio (pip install 'zbatch[grpc]')",
        minimum=0, check=lambda port: check_grpc_port(port))
    processes: int = option(
        0, f"gateway processes sharing the port, each with its own broker client; 0: one per core, at most "
        f"{MAX_AUTO_PROCESSES}; 1: this process alone", minimum=0
    )
    reuse_port: bool = option(
        False, "let other processes listen on the same port (SO_REUSEPORT), the kernel spreading new connections "
        "over them; the processes of --processes have it"
    )
    frontend: str = option(
        "tcp://127.0.0.1:5555", "the brokers' frontend endpoints, comma-separated (several brokers: requests "
        "spread over the live ones)", check=check_endpoints
    )
    default_model: str = option("", "the model behind plain-text POST / (and TEI's routes, unless tei_model says "
                                "otherwise); empty: the first of models, else the one model the brokers serve, or the "
                                "one embeddings model among several (else POST / asks the caller to name one)")
    tei_model: str = option("", "model behind TEI's /embed, /embed_all, /similarity, /tokenize, /decode, /info "
                                "and /health; empty: the default model")
    tei_sparse_model: str = option("", "model behind TEI's /embed_sparse (a sparse-embeddings model); empty: the "
                                       "TEI model")
    tei_rerank_model: str = option("", "model behind TEI's /rerank (a rerank model); empty: the TEI model")
    tei_predict_model: str = option("", "model behind TEI's /predict (a text-classification model); empty: "
                                        "the TEI model")
    models: tuple[str, ...] = option((), MODELS_HELP)
    timeout_ms: int = option(
        30000,
        "request timeout in ms; match the broker's default: it bounds how long the gateway waits",
        minimum=1,
    )
    heartbeat_ms: int = option(1_000, "heartbeat interval to each broker (with several brokers)", minimum=10)
    heartbeat_liveness: int = option(3, "missed intervals before a broker is given up and its requests move "
                                        "to another (with several brokers)", minimum=1)
    broker_restart_wait_ms: int = option(
        RESTART_WAIT_MS, "with one broker: how long after its connection drops requests wait for it to come "
        "back (zbatch serve or systemd restarting it), each within its own timeout; what was outstanding there is "
        "sent again once it is back, and after the wait requests fail 503 broker_unavailable; cover the restart "
        "delay (systemd's RestartSec) and a loaded host's start", minimum=0)
    edge_tokenize: bool = option(False, "tokenize texts here for a model whose workers announce their tokenizer, "
                                 "and send token ids (zbatch/client/tokenizing.py), taking that work off the workers: "
                                 "set it in front of GPU workers (zbatch serve does where its workers run on GPUs); "
                                 "off: texts go to the workers (on a 2-core host it cost more CPU than it saved)")
    max_body_bytes: int = option(1048576, "largest request body accepted", minimum=1)
    max_inputs: int = option(256, "most inputs in one request (413 too_many_inputs)", minimum=1)
    max_input_chars: int = option(100_000, "most characters in one input (400 input_too_long)", minimum=1)
    max_connections: int = option(
        1024, "requests answered at once, counted once their body is in; the next one is refused with 503 "
        "overloaded", minimum=1
    )
    max_open_connections: int = option(
        4096, "connections open at once, idle and slow ones included; a new one past it is answered 503 "
        "overloaded and closed; keep it below the open-file limit", minimum=1
    )
    header_timeout_ms: int = option(
        10000, "time a connection has to send a request's complete headers, from its opening or from the "
        "first byte of a later request; then it is closed", minimum=1
    )
    body_timeout_ms: int = option(
        30000, "time a request's body has to arrive once its headers are in; then 408 request_timeout "
        "and the connection is closed", minimum=1
    )
    idle_timeout_ms: int = option(
        75000, "how long a keep-alive connection may wait between requests; keep it above the idle "
        "timeout of a load balancer in front", minimum=1
    )
    listen_backlog: int = option(
        4096, "connections the kernel queues for accepting; net.core.somaxconn caps it", minimum=1
    )
    api_keys_file: str = option(
        "", "file of API keys, one per line; when set, requests need 'Authorization: Bearer KEY'",
        check=check_api_keys_file,
    )
    protect_metrics: bool = option(False, "GET /metrics needs an API key too (when api_keys_file is set)")
    curve_server_key_file: str = common_options.curve_server_key_file()
    curve_secret_key_file: str = common_options.client_secret_key_file("the gateway's")
    insecure: bool = common_options.insecure()
    log_level: str = common_options.log_level()
    access_log: bool = option(False, "one log line per request, with its id (costs throughput: off by default)")
    log_format: str = common_options.log_format()

    def __post_init__(self) -> None:
        problem = check_client_settings(self.curve_server_key_file, self.curve_secret_key_file)
        problem = problem or check_exposure({"frontend": self.frontend}, curve=bool(self.curve_server_key_file),
                                            insecure=self.insecure)
        if not problem and self.grpc_port and self.grpc_port == self.port:
            problem = f"grpc_port and port are both {self.port}: HTTP and gRPC each need a port of their own"
        if problem:
            raise ValueError(problem)

    @property
    def named_default_model(self) -> str:
        """The default model the settings name: ``default_model``, else the first of ``models``; "": none, and
        the gateway follows the brokers (:meth:`gateway.catalog.Catalog.default_model`)."""
        return self.default_model or (self.models[0] if self.models else "")

    @property
    def process_count(self) -> int:
        """How many processes serve: ``processes``, or for 0 the cores this process may run on, at most 4."""
        return self.processes or min(usable_cores(), MAX_AUTO_PROCESSES)

    @property
    def required_models(self) -> tuple[str, ...]:
        """The models that must have a worker before the gateway calls itself ready; none named: any one model."""
        return self.models or ((self.default_model,) if self.default_model else ())


def check_grpc_port(port: int) -> str | None:
    """A gRPC port is a TCP port, and serving one needs grpcio installed."""
    if port > 65535:
        return "must be at most 65535"
    if port and importlib.util.find_spec("grpc") is None:
        return "the gRPC service needs grpcio: pip install 'zbatch[grpc]' (or set 0 to turn it off)"
    return None


def usable_cores() -> int:
    """The CPU cores this process may run on (its affinity, under a cgroup's cpuset too), at least 1."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return os.cpu_count() or 1


def load_config(
    argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None
) -> GatewayConfig:
    """Flags over environment over config file over defaults; exits with status 2 naming any bad value."""
    return load(GatewayConfig, argv, environ, prog="zbatch-gateway", section="gateway")
