"""The broker's side of CURVE: an allow-list of named keys per socket, and the ZAP handler that checks them.

Off unless configured, so loopback development needs no keys.  The broker holds
one key pair; its frontend admits only the client public keys found in
``curve_clients_dir`` and its backend only the worker keys in
``curve_workers_dir``.  The two lists are separate ZAP domains ("clients",
"workers"), checked by one :class:`KeyAuthenticator` in the broker's own
context, so a client's key cannot register a worker.  Every worker, gateway
and client holds a key pair of its own plus the broker's public key.  Key
files are zmq.auth certificates: ``NAME.key`` (public) and ``NAME.key_secret``
(both halves), made by ``zbatch-keys``.

A key's name is its identity
----------------------------
The ZAP handler answers each accepted handshake with the key's file name as
its User-Id, which libzmq then attaches to every message of that connection.
On the backend, :class:`WorkerKeyGuard` holds a worker to it: a message whose
routing id is not the User-Id of its connection (a READY whose ``name`` is
not either) never reaches the routing core, and is logged.

That check cannot happen in the handshake itself: libzmq's ZAP request carries
the *server* socket's own routing id in its "identity" frame, not the
connecting peer's (libzmq 4.3.5 ``zap_client.cpp``; zeromq/libzmq#4161), and
the peer's routing id is only read after the ZAP reply.  So the backend
does not use ROUTER_HANDOVER with CURVE: a connection whose routing id is held
by another connection is left unrouted by libzmq, and cannot take it over.
What remains is a connection that never shows a message under its own key's
name (unrouted, or holding a name that is not its key's): the guard watches
the backend's connections (a socket monitor) and cuts any that has not done so
within the liveness window, so a name held that way is freed; ZMTP heartbeats
free the name of a connection whose host died.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import zmq
import zmq.auth
from zmq.auth.asyncio import AsyncioAuthenticator
from zmq.utils import z85

from zbatch.runtime.curve import (
    PUBLIC_SUFFIX,
    ZAP_VERSION,
    check_name,
    key_name,
    load_key_pair,
    load_public_key,
)

log = logging.getLogger("zbatch.broker")


class _Bucket:
    """A token bucket: ``burst`` at once, then ``per_s`` a second."""

    def __init__(self, burst: float, per_s: float, now: float) -> None:
        self.burst, self.per_s = burst, per_s
        self.tokens, self.at = burst, now
        self.left_out = 0

    def take(self, now: float) -> bool:
        self.tokens = min(self.burst, self.tokens + (now - self.at) * self.per_s)
        self.at = now
        if self.tokens < 1:
            return False
        self.tokens -= 1
        return True


class RefusalLog:
    """Warnings about refused peers, rate-limited per subject and overall, so a flood costs a few lines.

    Each subject (what was refused and whose: a kind and a key name or address) may log a burst of
    :data:`SUBJECT_BURST` lines, then one a second; all subjects together :data:`TOTAL_BURST`, then
    :data:`TOTAL_PER_S` a second.  A refusal left out is counted, and the subject's next line says how
    many; past :data:`MAX_SUBJECTS` subjects, new ones share one.  ``total`` counts every refusal.
    """

    SUBJECT_BURST, SUBJECT_PER_S = 5, 1.0
    TOTAL_BURST, TOTAL_PER_S = 50, 10.0
    MAX_SUBJECTS = 256

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.total = 0
        self._clock = clock
        self._all = _Bucket(self.TOTAL_BURST, self.TOTAL_PER_S, clock())
        self._subjects: dict[str, _Bucket] = {}

    def warn(self, subject: str, message: str, *args: object) -> None:
        self.total += 1
        now = self._clock()
        if subject not in self._subjects and len(self._subjects) >= self.MAX_SUBJECTS:
            subject = "(other subjects)"
        bucket = self._subjects.get(subject)
        if bucket is None:
            bucket = self._subjects[subject] = _Bucket(self.SUBJECT_BURST, self.SUBJECT_PER_S, now)
        if not (bucket.take(now) and self._all.take(now)):
            bucket.left_out += 1
            return
        if bucket.left_out:
            message += f" (and {bucket.left_out} more like it not logged)"
            bucket.left_out = 0
        log.warning(message, *args)


def read_named_keys(folder: str) -> dict[bytes, str]:
    """The public keys of ``folder/*.key`` (32 raw bytes each, as ZAP sees them) and their names.

    A file that cannot be read, a name that cannot be a routing id, and a key that appears under two
    names are left out, each with a warning: a key must name exactly one peer.
    """
    names: dict[bytes, str] = {}
    duplicates: set[bytes] = set()
    for path in sorted(Path(folder).glob("*" + PUBLIC_SUFFIX)):
        name = key_name(path.name)
        problem = check_name(name)
        try:
            public = z85.decode(load_public_key(str(path)))
        except (OSError, ValueError) as exc:
            problem = problem or f"not a readable zmq.auth key file ({exc})"
        if problem:
            log.warning("CURVE: left out %s: %s", path, problem)
            continue
        if public in names:
            log.error("CURVE: the key in %s is also %s%s: a key must name one peer, so neither is allowed",
                      path, names[public], PUBLIC_SUFFIX)
            duplicates.add(public)
        names[public] = name
    for public in duplicates:
        del names[public]
    return names


class KeyAuthenticator(AsyncioAuthenticator):
    """pyzmq's asyncio ZAP handler, answering from allow-lists of named keys.

    An allowed key's handshake succeeds with the key's name as User-Id; any other is refused, and
    logged (rate-limited).  Only CURVE is answered: the broker's sockets use nothing else.  The
    request's "identity" frame is not used: libzmq puts the broker socket's own routing id there,
    not the peer's (see the module's docstring).
    """

    def __init__(self, context: zmq.Context[Any], refusals: RefusalLog) -> None:
        super().__init__(context)
        self.names: dict[str, dict[bytes, str]] = {}  # ZAP domain -> public key -> name
        self.folders: dict[str, str] = {}
        self.refusals = refusals

    def allow(self, *addresses: str) -> None:  # the base class's address lists would bypass the names
        raise NotImplementedError("KeyAuthenticator checks keys only")

    def load(self, domain: str, folder: str) -> None:
        """Allow the keys of ``folder`` in ``domain`` from now on; if it cannot be read, keep the last list."""
        try:
            if not os.path.isdir(folder):
                raise FileNotFoundError(f"{folder} is not a folder")
            names = read_named_keys(folder)
        except OSError as exc:
            log.error("CURVE: cannot read the %s keys (%s); keeping the %d allowed before", domain, exc,
                      len(self.names.get(domain, {})))
            return
        self.names[domain], self.folders[domain] = names, folder
        log.info("CURVE: %d %s key(s) allowed, from %s", len(names), domain, folder)

    async def handle_zap_message(self, msg: list[bytes]) -> None:
        """Answer one ZAP request (RFC 27): 200 with the key's name, or 400."""
        if len(msg) < 6:
            if len(msg) >= 2:
                self._reply(msg[1], b"400", b"Not enough frames")
            return
        version, request_id, domain_frame, address_frame, _, mechanism = msg[:6]
        credentials = msg[6:]
        if version != ZAP_VERSION:
            self._reply(request_id, b"400", b"Invalid version")
            return
        domain, address = domain_frame.decode(errors="replace"), address_frame.decode(errors="replace")
        if mechanism != b"CURVE" or len(credentials) != 1:
            self.refusals.warn(f"handshake {domain} {address}",
                               "CURVE: refused a %s handshake from %s on the %s socket: only CURVE is accepted",
                               mechanism.decode(errors="replace"), address, domain)
            self._reply(request_id, b"400", b"CURVE only")
            return
        name = self.names.get(domain, {}).get(credentials[0])
        if name is None:
            self.refusals.warn(f"key {domain} {address}",
                               "CURVE: refused a connection from %s on the %s socket: its key %s is not in %s "
                               "(add its NAME.key there and reload the broker)", address, domain,
                               z85.encode(credentials[0]).decode(), self.folders.get(domain, "its allow-list"))
            self._reply(request_id, b"400", b"Unknown key")
            return
        self._reply(request_id, b"200", b"OK", name.encode())

    def _reply(self, request_id: bytes, status: bytes, text: bytes, user_id: bytes = b"") -> None:
        self.zap_socket.send_multipart([ZAP_VERSION, request_id, status, text, user_id, b""])


class CurveServer:
    """The broker's side: its key pair, and the ZAP handler that checks each connecting key."""

    def __init__(self, context: zmq.Context[Any], secret_key_file: str,
                 allowed_dirs: dict[str, str]) -> None:
        self.public, self.secret = load_key_pair(secret_key_file)
        self._allowed_dirs = allowed_dirs
        self.refusals = RefusalLog()
        # Needs the running event loop: the ZAP handler is a task on it, next to the broker's loop.
        self.authenticator = KeyAuthenticator(context, self.refusals)
        self.authenticator.start()
        self.reload()

    def reload(self) -> None:
        """Read the allow-list folders again: added keys may connect from now on, removed ones may not
        (connections made before stay up)."""
        for domain, folder in self._allowed_dirs.items():
            self.authenticator.load(domain, folder)

    def secure(self, socket: zmq.Socket[Any], domain: str) -> None:
        """Call before ``bind``: peers need one of ``domain``'s keys."""
        socket.curve_server = True
        socket.curve_publickey = self.public
        socket.curve_secretkey = self.secret
        socket.zap_domain = domain.encode()

    def stop(self) -> None:
        self.authenticator.stop()

