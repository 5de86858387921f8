"""CURVE on zbatch's ZeroMQ sockets, as every peer needs it: key files, the settings' checks, a peer's keys.

Off unless configured, so loopback development needs no keys.  The broker
holds one key pair; its frontend admits only the client public keys found in
``curve_clients_dir`` and its backend only the worker keys in
``curve_workers_dir`` (ZAP domains ``clients`` and ``workers``; the broker's
side is :mod:`broker.curve`).  Every worker, gateway and client holds a key
pair of its own plus the broker's public key: :class:`CurveKeys`.  Key files
are zmq.auth certificates: ``NAME.key`` (public) and ``NAME.key_secret``
(both halves), made by ``zbatch-keys``; a key's name is its holder's identity
(a worker registers under its key's name).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import zmq
import zmq.auth

CLIENTS_DOMAIN = "clients"
WORKERS_DOMAIN = "workers"
PUBLIC_SUFFIX = ".key"
SECRET_SUFFIX = ".key_secret"
ZAP_VERSION = b"1.0"
MAX_NAME_BYTES = 255  # a ZeroMQ routing id


def load_key_pair(path: str) -> tuple[bytes, bytes]:
    """The public and secret key of a ``.key_secret`` file; ValueError if it has no secret half."""
    public, secret = zmq.auth.load_certificate(path)
    if not secret:
        raise ValueError(f"{path} holds no secret key: give the NAME.key_secret file")
    return public, secret


def load_public_key(path: str) -> bytes:
    """The public key (Z85 text, as bytes) of a ``.key`` or ``.key_secret`` file."""
    public, _ = zmq.auth.load_certificate(path)
    return public


def key_name(path: str) -> str:
    """The name of a key file: ``NAME`` for ``NAME.key`` and ``NAME.key_secret``.

    With CURVE, this is who a worker is: the broker registers the holder of ``NAME.key`` as worker ``NAME``.
    """
    base = os.path.basename(path)
    for suffix in (SECRET_SUFFIX, PUBLIC_SUFFIX):
        if base.endswith(suffix) and len(base) > len(suffix):
            return base[:-len(suffix)]
    return base


def check_name(name: str) -> str | None:
    """A key name must work as a routing id and a displayed worker name: printable, 1 to 255 bytes."""
    if not name or not name.isprintable() or len(name.encode()) > MAX_NAME_BYTES:
        return f"{name!r} is not a usable name: 1 to {MAX_NAME_BYTES} bytes of printable text"
    return None


def _check(load: Callable[[str], object], path: str) -> str | None:
    if not path:
        return None
    try:
        load(path)
    except (OSError, ValueError) as exc:
        return f"not a readable zmq.auth key file ({exc})"
    return None


def check_secret_key_file(path: str) -> str | None:
    """A settings check: empty (CURVE off) or a readable NAME.key_secret."""
    return _check(load_key_pair, path)


def check_public_key_file(path: str) -> str | None:
    """A settings check: empty (CURVE off) or a readable NAME.key (or .key_secret)."""
    return _check(load_public_key, path)


def check_key_dir(path: str) -> str | None:
    """A settings check: empty or a folder of NAME.key public key files."""
    return None if not path or os.path.isdir(path) else "must be a folder of public key files (NAME.key)"


def check_client_settings(server_key_file: str, secret_key_file: str) -> str | None:
    """The broker's public key and the peer's own key pair come together, or not at all."""
    if bool(server_key_file) != bool(secret_key_file):
        return "curve_server_key_file and curve_secret_key_file must be set together (CURVE) or both left empty"
    return None


def check_broker_settings(secret_key_file: str, clients_dir: str, workers_dir: str) -> str | None:
    """With a key pair the broker needs both allow-lists; without one, neither means anything."""
    if bool(secret_key_file) != bool(clients_dir) or bool(secret_key_file) != bool(workers_dir):
        return ("curve_secret_key_file, curve_clients_dir and curve_workers_dir must be set together "
                "(CURVE) or all left empty")
    return None


@dataclass(frozen=True)
class CurveKeys:
    """What a connecting peer needs: the broker's public key and its own key pair."""

    server_public: bytes
    public: bytes
    secret: bytes

    @classmethod
    def from_files(cls, server_key_file: str, secret_key_file: str) -> CurveKeys:
        return cls(load_public_key(server_key_file), *load_key_pair(secret_key_file))

    def apply(self, socket: zmq.Socket[Any]) -> None:
        """Call before ``connect``."""
        socket.curve_serverkey = self.server_public
        socket.curve_publickey = self.public
        socket.curve_secretkey = self.secret


def client_keys(server_key_file: str, secret_key_file: str) -> CurveKeys | None:
    """The keys a worker, gateway or client configured, or None when CURVE is off."""
    return CurveKeys.from_files(server_key_file, secret_key_file) if server_key_file else None


