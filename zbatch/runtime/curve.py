"""CURVE on zbatch's ZeroMQ sockets: encryption, and an allow-list of keys per broker socket.

Off unless configured, so loopback development needs no keys.  The broker holds
one key pair; its frontend admits only the client public keys found in
``curve_clients_dir`` and its backend only the worker keys in
``curve_workers_dir``.  The two lists are separate ZAP domains ("clients",
"workers"), checked by one :class:`AsyncioAuthenticator` in the broker's own
context, so a client's key cannot register a worker.  Every worker, gateway
and client holds a key pair of its own plus the broker's public key.  Key
files are zmq.auth certificates: ``NAME.key`` (public) and ``NAME.key_secret``
(both halves), made by ``zbatch-keys``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import zmq
import zmq.auth
from zmq.auth.asyncio import AsyncioAuthenticator

log = logging.getLogger("zbatch.broker")
CLIENTS_DOMAIN = "clients"
WORKERS_DOMAIN = "workers"


def load_key_pair(path: str) -> tuple[bytes, bytes]:
    """The public and secret key of a ``.key_secret`` file; ValueError if it has no secret half."""
    public, secret = zmq.auth.load_certificate(path)
    if not secret:
        raise ValueError(f"{path} holds no secret key: give the NAME.key_secret file")
    return public, secret


def load_public_key(path: str) -> bytes:
    public, _ = zmq.auth.load_certificate(path)
    return public


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


class CurveServer:
    """The broker's side: its key pair, and the ZAP handler that checks each connecting key."""

    def __init__(self, context: zmq.Context[Any], secret_key_file: str,
                 allowed_dirs: dict[str, str]) -> None:
        self.public, self.secret = load_key_pair(secret_key_file)
        self._allowed_dirs = allowed_dirs
        # Needs the running event loop: the ZAP handler is a task on it, next to the broker's loop.
        self.authenticator = AsyncioAuthenticator(context)
        self.authenticator.start()
        self.reload()

    def reload(self) -> None:
        """Read the allow-list folders again: added keys may connect from now on, removed ones may not
        (connections made before stay up)."""
        for domain, folder in self._allowed_dirs.items():
            self.authenticator.configure_curve(domain=domain, location=folder)
            log.info("CURVE: %d %s key(s) allowed, from %s", len(self.authenticator.certs.get(domain, {})),
                     domain, folder)

    def secure(self, socket: zmq.Socket[Any], domain: str) -> None:
        """Call before ``bind``: peers need one of ``domain``'s keys."""
        socket.curve_server = True
        socket.curve_publickey = self.public
        socket.curve_secretkey = self.secret
        socket.zap_domain = domain.encode()

    def stop(self) -> None:
        self.authenticator.stop()
