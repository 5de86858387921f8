"""The broker's settings: one frozen object, built once at start by :func:`load_config`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from broker.core import CoreSettings
from broker.limits import ModelLimits, check_model_limits, parse_model_limits
from zbatch.runtime import common_options
from zbatch.runtime.curve import check_broker_settings, check_key_dir
from zbatch.runtime.settings import MODELS_HELP, check_endpoint, check_exposure, load, option


@dataclass(frozen=True)
class BrokerConfig:
    """zbatch-broker: routes requests from clients (frontend) to batching workers (backend)."""

    frontend: str = option(
        "tcp://127.0.0.1:5555", "ZeroMQ endpoint clients and gateways connect to", check=check_endpoint
    )
    backend: str = option(
        "tcp://127.0.0.1:5556", "ZeroMQ endpoint workers connect to", check=check_endpoint
    )
    max_queue_ms: int = option(
        0, "longest predicted wait for an answer at which a request is still admitted; 0: only the request's own "
        "deadline bounds it (a longer predicted wait is refused, 503)", minimum=0,
    )
    cold_backlog: int = option(
        512, "items waiting per model before new requests are refused (503) while no worker has measured the "
        "model's service rate yet (its first second or so of work)", minimum=1,
    )
    max_backlog: int = option(
        262_144, "memory bound: items waiting per model before new requests are refused (503), whatever the time",
        minimum=1,
    )
    max_backlog_bytes: int = option(
        128 * 1024 * 1024, "memory bound: payload bytes held per model before new requests are refused (503)",
        minimum=1024,
    )
    priority_reserve: float = option(
        0.25, "share of the deadline (and of the counts) by which low priority is refused earlier; high priority "
        "may use that share more of the counts",
        minimum=0, check=lambda v: None if v < 1 else "must be below 1 (low priority needs some room)",
    )
    deadline_headroom: float = option(
        0.2, "share of each request's deadline that admission keeps free: a predicted wait past the rest is "
        "refused (503), so a pace that drops after admission still answers in time; costs no throughput",
        minimum=0, check=lambda v: None if v < 1 else "must be below 1 (a request needs some of its deadline)",
    )
    timeout_ms: int = option(30_000, "deadline of a request that does not set one", minimum=1)
    max_timeout_ms: int = option(60_000, "longest deadline a client may ask for", minimum=1)
    no_worker_grace_ms: int = option(
        2_000, "how long a request waits for a worker to appear before 'no worker available'", minimum=0
    )
    heartbeat_ms: int = option(1_000, "heartbeat interval between broker and workers", minimum=10)
    heartbeat_liveness: int = option(3, "missed heartbeat intervals before a worker is declared dead", minimum=1)
    max_retries: int = option(1, "times a request is re-dispatched after its worker died", minimum=0)
    drain_timeout_ms: int = option(10_000, "on SIGTERM, how long in-flight work may take to finish", minimum=0)
    model_limits: str = option(
        "", "per-model limits 'name=M,max_queue_ms=N,cold_backlog=N,max_backlog=N,max_backlog_bytes=N,timeout_ms=N,"
        "max_timeout_ms=N' separated by ';'",
        check=check_model_limits,
    )
    models: tuple[str, ...] = option((), MODELS_HELP)
    max_message_bytes: int = option(
        16 * 1024 * 1024, "largest client message (all frames); larger ones are refused unread", minimum=1024
    )
    max_client_requests: int = option(
        4096, "unanswered requests one client connection may hold; more are refused (503)", minimum=1
    )
    log_level: str = common_options.log_level()
    log_format: str = common_options.log_format()
    metrics_port: int = common_options.metrics_port()
    metrics_host: str = common_options.metrics_host()
    curve_secret_key_file: str = common_options.curve_secret_key_file(
        "the broker's CURVE key pair (NAME.key_secret); empty: no encryption, anyone may connect")
    curve_clients_dir: str = option("", "folder of the public keys (NAME.key) of clients and gateways allowed "
                                    "on the frontend", check=check_key_dir)
    curve_workers_dir: str = option("", "folder of the public keys of workers allowed on the backend",
                                    check=check_key_dir)
    insecure: bool = common_options.insecure()

    def __post_init__(self) -> None:
        problem = check_broker_settings(self.curve_secret_key_file, self.curve_clients_dir, self.curve_workers_dir)
        problem = problem or check_exposure({"frontend": self.frontend, "backend": self.backend},
                                            curve=bool(self.curve_secret_key_file), insecure=self.insecure)
        if problem:
            raise ValueError(problem)

    def core_settings(self) -> CoreSettings:
        """The part of this configuration the routing core uses, with per-model limits parsed."""
        defaults = ModelLimits(self.max_backlog, self.max_backlog_bytes, self.timeout_ms, self.max_timeout_ms,
                               self.max_queue_ms, self.cold_backlog)
        return CoreSettings(
            max_backlog=self.max_backlog, max_backlog_bytes=self.max_backlog_bytes,
            max_queue_ms=self.max_queue_ms, cold_backlog=self.cold_backlog,
            priority_reserve=self.priority_reserve, deadline_headroom=self.deadline_headroom,
            timeout_ms=self.timeout_ms,
            max_timeout_ms=self.max_timeout_ms, no_worker_grace_ms=self.no_worker_grace_ms,
            heartbeat_ms=self.heartbeat_ms, heartbeat_liveness=self.heartbeat_liveness,
            max_retries=self.max_retries, max_message_bytes=self.max_message_bytes,
            max_client_requests=self.max_client_requests, models=self.models,
            model_limits=parse_model_limits(self.model_limits, defaults),
        )


def load_config(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> BrokerConfig:
    return load(BrokerConfig, argv, environ, prog="zbatch-broker", section="broker")
