"""The gateway's settings: one frozen dataclass, loaded from flags and ``ZBATCH_*`` variables."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from broker.logs import LOG_FORMATS
from broker.settings import check_endpoint, load, option


@dataclass(frozen=True)
class GatewayConfig:
    """HTTP front for a zbatch broker: Hugging Face style /models/{model}, OpenAI style
    /v1/embeddings, plain-text POST /, plus /healthz, /readyz, /models and /v1/stats."""

    host: str = option("127.0.0.1", "address to listen on")
    port: int = option(8000, "TCP port to listen on; 0 picks any free port", minimum=0)
    frontend: str = option(
        "tcp://127.0.0.1:5555", "the broker's frontend endpoint", check=check_endpoint
    )
    default_model: str = option("all-MiniLM-L6-v2", "model that serves plain-text POST /")
    models: tuple[str, ...] = option(
        (),
        "comma-separated models that /readyz requires a worker for; empty means the default model",
    )
    timeout_ms: int = option(
        30000,
        "request timeout in ms; match the broker's default: it bounds how long the gateway waits",
        minimum=1,
    )
    max_body_bytes: int = option(1048576, "largest request body accepted", minimum=1)
    log_level: str = option("info", "logging level", choices=("debug", "info", "warning", "error"))
    log_format: str = option(
        "text", "log lines as text for people or json for a log pipeline", choices=LOG_FORMATS
    )

    @property
    def required_models(self) -> tuple[str, ...]:
        """The models that must have a worker before the gateway calls itself ready."""
        return self.models or (self.default_model,)


def load_config(
    argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None
) -> GatewayConfig:
    """Flags over environment over config file over defaults; exits with status 2 naming any bad value."""
    return load(GatewayConfig, argv, environ, prog="zbatch-gateway", section="gateway")
