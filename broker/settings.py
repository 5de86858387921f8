"""Typed daemon configuration: command-line flags and ``ZBATCH_*`` variables, merged once.

Each daemon declares one frozen dataclass whose fields are its settings
(``option(...)`` gives the help text and bounds).  :func:`load` builds the
``--help``, reads flags, falls back to the environment, converts and checks
every value, and exits with a one-line message naming the bad setting.  The
rest of the daemon only ever sees a valid config object.

Precedence: flag > environment variable > default.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

ConfigT = TypeVar("ConfigT")
ENV_PREFIX = "ZBATCH_"


def option(
    default: Any,
    help: str,
    *,
    minimum: float | None = None,
    choices: Sequence[str] | None = None,
    check: Callable[[Any], str | None] | None = None,
) -> Any:
    """A setting: ``check`` returns an error text for a bad value, or None."""
    metadata = {"help": help, "minimum": minimum, "choices": choices, "check": check}
    return dataclasses.field(default=default, metadata=metadata)


def env_name(field_name: str) -> str:
    return ENV_PREFIX + field_name.upper()


def flag_name(field_name: str) -> str:
    return "--" + field_name.replace("_", "-")


def load(
    config_class: type[ConfigT],
    argv: Sequence[str] | None = None,
    environ: Mapping[str, str] | None = None,
    prog: str | None = None,
) -> ConfigT:
    """Parse, merge and validate; on a bad value print one line and exit with status 2."""
    environ = os.environ if environ is None else environ
    parser = _parser(config_class, prog)
    namespace = parser.parse_args(argv)
    hints = typing.get_type_hints(config_class)
    values: dict[str, Any] = {}
    for field in dataclasses.fields(config_class):  # type: ignore[arg-type]
        raw, source = getattr(namespace, field.name), flag_name(field.name)
        if raw is None and env_name(field.name) in environ:
            raw, source = environ[env_name(field.name)], env_name(field.name)
        if raw is None:
            continue
        try:
            values[field.name] = _convert(raw, hints[field.name], field.metadata)
        except ValueError as exc:
            parser.error(f"{source}={raw!r}: {exc}")
    return config_class(**values)


class _OneLineErrors(argparse.ArgumentParser):
    """A bad setting is reported in one line, without the usage block."""

    def error(self, message: str) -> typing.NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def _parser(config_class: type, prog: str | None) -> argparse.ArgumentParser:
    parser = _OneLineErrors(prog=prog, description=(config_class.__doc__ or "").strip())
    for field in dataclasses.fields(config_class):
        default = field.default
        parser.add_argument(
            flag_name(field.name),
            default=None,
            metavar=field.name.split("_")[-1].upper(),
            help=f"{field.metadata['help']} (env {env_name(field.name)}; default {default!r})",
        )
    return parser


def _convert(raw: str, kind: Any, metadata: Mapping[str, Any]) -> Any:
    value = _parse_scalar(raw, kind)
    minimum = metadata.get("minimum")
    if minimum is not None and value < minimum:
        raise ValueError(f"must be at least {minimum}")
    choices = metadata.get("choices")
    if choices is not None and value not in choices:
        raise ValueError(f"must be one of {', '.join(choices)}")
    check = metadata.get("check")
    problem = check(value) if check else None
    if problem:
        raise ValueError(problem)
    return value


def _parse_scalar(raw: str, kind: Any) -> Any:
    if kind is bool:
        lowered = raw.strip().lower()
        if lowered in ("1", "true", "yes", "on"):
            return True
        if lowered in ("0", "false", "no", "off"):
            return False
        raise ValueError("must be true or false")
    if kind is int:
        try:
            return int(raw)
        except ValueError:
            raise ValueError("must be a whole number") from None
    if kind is float:
        try:
            return float(raw)
        except ValueError:
            raise ValueError("must be a number") from None
    if typing.get_origin(kind) is tuple:
        return tuple(part.strip() for part in raw.split(",") if part.strip())
    return raw


def check_endpoint(value: str) -> str | None:
    """ZeroMQ endpoints look like transport://address."""
    transport, sep, address = value.partition("://")
    if not sep or not address or transport not in ("tcp", "ipc", "inproc", "ws", "wss"):
        return "must be a ZeroMQ endpoint such as tcp://127.0.0.1:5555 or ipc:///run/zbatch/broker"
    return None
