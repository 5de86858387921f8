"""Typed daemon configuration: flags, ``ZBATCH_*`` variables and a TOML file, merged once.

Each daemon declares one frozen dataclass whose fields are its settings
(``option(...)`` gives the help text and bounds).  :func:`load` builds the
``--help``, reads flags, falls back to the environment, then to the daemon's
section of the ``--config`` file (``ZBATCH_CONFIG``), converts and checks
every value, and exits with a one-line message naming the bad setting.  The
rest of the daemon only ever sees a valid config object.

Precedence: flag > environment variable > config file > default.
"""

from __future__ import annotations

import argparse
import dataclasses
import ipaddress
import os
import tomllib
import typing
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, TypeVar

ConfigT = TypeVar("ConfigT")
ENV_PREFIX = "ZBATCH_"
CONFIG_ENV = ENV_PREFIX + "CONFIG"
# One file serves a whole host: each program reads its own section and ignores the others.
SECTIONS = ("broker", "worker", "gateway", "status", "serve")


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
    *,
    section: str,
) -> ConfigT:
    """Parse, merge and validate; on a bad value print one line and exit with status 2.

    ``section`` names the table of the config file that holds this program's settings.
    """
    environ = os.environ if environ is None else environ
    parser = _parser(config_class, prog, section)
    namespace = parser.parse_args(argv)
    hints = typing.get_type_hints(config_class)
    names = [field.name for field in dataclasses.fields(config_class)]  # type: ignore[arg-type]
    from_file, path = _file_settings(parser, namespace.config_file, environ, section, names)
    values: dict[str, Any] = {}
    for field in dataclasses.fields(config_class):  # type: ignore[arg-type]
        raw, source = getattr(namespace, field.name), flag_name(field.name)
        if raw is None and env_name(field.name) in environ:
            raw, source = environ[env_name(field.name)], env_name(field.name)
        if raw is None and field.name in from_file:
            raw, source = from_file[field.name], f"{path}: [{section}] {field.name}"
        if raw is None:
            continue
        try:
            values[field.name] = _convert(raw, hints[field.name], field.metadata)
        except ValueError as exc:
            parser.error(f"{source}={raw!r}: {exc}")
    try:
        return config_class(**values)
    except ValueError as exc:  # a check across settings, in the class's __post_init__
        parser.error(str(exc))


class _OneLineErrors(argparse.ArgumentParser):
    """A bad setting is reported in one line, without the usage block."""

    def error(self, message: str) -> typing.NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def _file_settings(
    parser: argparse.ArgumentParser,
    flag: str | None,
    environ: Mapping[str, str],
    section: str,
    names: Sequence[str],
) -> tuple[dict[str, Any], str]:
    """The ``[section]`` table of the config file (empty without one) and the file's name for errors."""
    path, source = (flag, "--config") if flag is not None else (environ.get(CONFIG_ENV), CONFIG_ENV)
    if not path:
        return {}, ""
    try:
        with open(path, "rb") as file:
            document = tomllib.load(file)
    except FileNotFoundError:
        parser.error(f"{source}={path!r}: no such file")
    except OSError as exc:
        parser.error(f"{source}={path!r}: {exc.strerror}")
    except tomllib.TOMLDecodeError as exc:
        parser.error(f"{path}: not valid TOML: {exc}")
    for key, value in document.items():
        if key not in SECTIONS:
            parser.error(f"{path}: unknown section {key!r} (expected one of {', '.join(SECTIONS)})")
        if not isinstance(value, dict):
            parser.error(f"{path}: {key!r} must be a [{key}] table of settings")
    table: dict[str, Any] = document.get(section, {})
    for key in table:
        if key not in names:
            hint = f" (did you mean {key.replace('-', '_')!r}?)" if key.replace("-", "_") in names else ""
            parser.error(f"{path}: [{section}] unknown setting {key!r}{hint}")
    return table, path


def _parser(config_class: type, prog: str | None, section: str) -> argparse.ArgumentParser:
    parser = _OneLineErrors(prog=prog, description=(config_class.__doc__ or "").strip())
    parser.add_argument(
        "--config",
        dest="config_file",
        metavar="PATH",
        help=f"TOML file whose [{section}] table sets defaults for the options below (env {CONFIG_ENV})",
    )
    hints = typing.get_type_hints(config_class)
    for field in dataclasses.fields(config_class):
        default = field.default
        # A bare boolean flag (--once) means true; --once=false still works.
        switch: dict[str, Any] = {"nargs": "?", "const": "true"} if hints[field.name] is bool else {}
        parser.add_argument(
            flag_name(field.name),
            default=None,
            metavar="BOOL" if switch else field.name.split("_")[-1].upper(),
            help=f"{field.metadata['help']} (env {env_name(field.name)}; default {default!r})",
            **switch,
        )
    return parser


def _convert(raw: Any, kind: Any, metadata: Mapping[str, Any]) -> Any:
    """Flags and variables are text; a config file may also hold native TOML values."""
    value = _parse_scalar(raw, kind) if isinstance(raw, str) else _check_native(raw, kind)
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


def _check_native(raw: Any, kind: Any) -> Any:
    if typing.get_origin(kind) is tuple:
        if isinstance(raw, list) and all(isinstance(part, str) for part in raw):
            return tuple(part.strip() for part in raw if part.strip())
        raise ValueError("must be a list of strings")
    # bool is an int in Python: true must not pass for 1.
    if kind is bool and isinstance(raw, bool):
        return raw
    if kind is int and isinstance(raw, int) and not isinstance(raw, bool):
        return raw
    if kind is float and isinstance(raw, int | float) and not isinstance(raw, bool):
        return float(raw)
    expected = {bool: "true or false", int: "a whole number", float: "a number"}.get(kind, "a string")
    raise ValueError(f"must be {expected}")


def check_endpoint(value: str) -> str | None:
    """ZeroMQ endpoints look like transport://address."""
    if "," in value:
        return "must be one ZeroMQ endpoint, not a list: a broker binds one frontend and one backend"
    transport, sep, address = value.partition("://")
    if not sep or not address or transport not in ("tcp", "ipc", "inproc", "ws", "wss"):
        return "must be a ZeroMQ endpoint such as tcp://127.0.0.1:5555 or ipc:///run/zbatch/broker"
    return None


# --------------------------------------------------------------------------- who may reach an endpoint

# One meaning for ZBATCH_MODELS, which the broker and the gateway both read: each says what it does with it.
MODELS_HELP = ("the models this stack serves, comma-separated: a broker accepts their requests before any worker "
               "has announced them, and a gateway's /readyz needs a worker for each; the first is the gateway's "
               "default model where default_model is empty")
LOCAL_TRANSPORTS = ("ipc", "inproc")
LOCAL_HOSTS = ("localhost",)


def split_endpoints(value: str | Sequence[str]) -> list[str]:
    """The endpoints of a setting: one endpoint, a comma-separated list of them, or a sequence."""
    parts = value.split(",") if isinstance(value, str) else value
    return [part.strip() for part in parts if part.strip()]


def is_loopback_endpoint(endpoint: str) -> bool:
    """Whether only this host can use ``endpoint``: ``ipc://``, ``inproc://``, or TCP (or WebSocket) on
    127.0.0.0/8, ::1 or ``localhost``.

    ``*``, ``0.0.0.0``, an interface name and any other host name count as the network: nothing is
    resolved, so the answer depends only on the text.  In ``tcp://SOURCE;DESTINATION`` both must be loopback.
    """
    transport, _, address = endpoint.strip().partition("://")
    if transport in LOCAL_TRANSPORTS:
        return True
    if transport.startswith("ws"):
        address = address.split("/", 1)[0]  # ws://host:port/path
    return bool(address) and all(_is_loopback_host(part) for part in address.split(";"))


def _is_loopback_host(host_port: str) -> bool:
    host = (host_port.rsplit(":", 1)[0] if ":" in host_port else host_port).strip("[]")  # no port: no colon
    if host.lower() in LOCAL_HOSTS:
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback


def check_exposure(endpoints: Mapping[str, str | Sequence[str]], *, curve: bool, insecure: bool) -> str | None:
    """The rule every daemon applies at start: without CURVE, its ZeroMQ endpoints stay on this host.

    ``endpoints`` maps each setting's name to its value (one endpoint or a list).  With CURVE configured,
    or ``insecure`` given, anything goes; otherwise a network endpoint is an error that says why and
    what to do instead.
    """
    if curve or insecure:
        return None
    for name, value in endpoints.items():
        for endpoint in split_endpoints(value):
            if not is_loopback_endpoint(endpoint):
                return (f"{name} {endpoint} is not a loopback address and CURVE is off: nothing sent there would "
                        f"be encrypted and anyone who reaches it would be trusted; configure CURVE (docs/security.md) "
                        f"or, on a network you trust, give --insecure (ZBATCH_INSECURE=true)")
    return None


def check_endpoints(value: str) -> str | None:
    """A comma-separated list of brokers' endpoints (one is a list too), each checked as :func:`check_endpoint`."""
    endpoints = split_endpoints(value)
    if not endpoints:
        return "must name at least one ZeroMQ endpoint, such as tcp://127.0.0.1:5555"
    for endpoint in endpoints:
        problem = check_endpoint(endpoint)
        if problem:
            return f"{endpoint!r} {problem}; separate several brokers with commas"
    if len(set(endpoints)) != len(endpoints):
        return "names a broker twice; list each broker once"
    return None


def parse_entries(text: str, keys: Collection[str], what: str) -> list[dict[str, str]]:
    """``a=1,b=2;a=3`` -> ``[{"a": "1", "b": "2"}, {"a": "3"}]``, for settings that list several things.

    ValueError names the bad entry (``what`` says what an entry is) and the keys allowed.
    """
    entries = []
    for entry in filter(None, (part.strip() for part in text.split(";"))):
        fields = {}
        for pair in entry.split(","):
            key, sep, value = pair.partition("=")
            if not sep or key.strip() not in keys:
                raise ValueError(f"{what} {entry!r}: expected key=value pairs with keys {', '.join(sorted(keys))}")
            fields[key.strip()] = value.strip()
        entries.append(fields)
    return entries
