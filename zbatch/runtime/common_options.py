"""The settings the daemons share, declared once: logging, the ``/metrics`` page, CURVE key files, ``insecure``.

Each function returns one ``option(...)`` (zbatch/runtime/settings.py) that a daemon's config class gives a field
of its own, so every daemon keeps its flags, variables, TOML keys and ``--help`` order, and a change to one of
these settings' help, bounds or checks reaches all of them.
"""

from __future__ import annotations

from typing import Any

from zbatch.runtime.curve import check_public_key_file, check_secret_key_file
from zbatch.runtime.logs import LOG_FORMATS
from zbatch.runtime.settings import option

LOG_LEVELS = ("debug", "info", "warning", "error")


def log_level() -> Any:
    return option("info", "logging level", choices=LOG_LEVELS)


def log_format() -> Any:
    return option("text", "log lines as text for people or json for a log pipeline", choices=LOG_FORMATS)


def metrics_port() -> Any:
    return option(0, "TCP port of the Prometheus /metrics page; 0 turns it off", minimum=0, check=_check_port)


def metrics_host() -> Any:
    return option("127.0.0.1", "address the /metrics page listens on")


def curve_server_key_file() -> Any:
    """A client's (the gateway's, a worker's, zbatch-status') copy of the broker's public key."""
    return option("", "the broker's CURVE public key (NAME.key); empty: no CURVE", check=check_public_key_file)


def curve_secret_key_file(help: str) -> Any:
    """A daemon's own key pair; ``help`` says whose, and what an empty value means for it."""
    return option("", help, check=check_secret_key_file)


def client_secret_key_file(whose: str) -> Any:
    """A client's key pair, whose public key the broker allows: ``whose`` is "the gateway's", "this worker's"..."""
    return curve_secret_key_file(f"{whose} CURVE key pair (NAME.key_secret), whose public key the broker allows")


def insecure() -> Any:
    """Whether endpoints off this host may go without CURVE (:func:`zbatch.runtime.settings.check_exposure`)."""
    return option(False, "allow ZeroMQ endpoints on a network address without CURVE: anyone who reaches them is "
                         "trusted (default: such endpoints need CURVE)")


def _check_port(port: int) -> str | None:
    return None if port <= 65535 else "must be at most 65535"
