"""CURVE on zbatch's ZeroMQ sockets: encryption, an allow-list of named keys per broker socket, and
a worker's identity bound to its key.

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
import socket as stdlib_socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import zmq
import zmq.auth
from zmq.auth.asyncio import AsyncioAuthenticator
from zmq.backend import Socket as CythonSocket
from zmq.utils import z85
from zmq.utils.monitor import parse_monitor_message

from zbatch.protocol import wire

log = logging.getLogger("zbatch.broker")
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


_recv = CythonSocket.recv
_READY_HEADER = wire.HEADERS[wire.Command.READY]


class WorkerKeyGuard:
    """The broker's backend under CURVE: a worker's routing id must be the name of its key.

    :meth:`receive` reads the backend in place of the plain reader: a message whose routing id is not
    its connection's User-Id (the key's name, from :class:`KeyAuthenticator`), or a READY naming
    another worker, is dropped and logged.  :meth:`on_monitor_event` reads the backend's socket
    monitor (:data:`MONITOR_EVENTS`): every accepted connection must show one good message within
    ``grace_s``, or :meth:`expire` cuts it (``shutdown`` of its descriptor: libzmq then closes it as
    if the peer had).  That frees a name held by a connection of another key that stays silent or
    is refused, and ends a connection libzmq left unrouted because its routing id was taken.
    """

    MONITOR_EVENTS = zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED | zmq.EVENT_CLOSED

    def __init__(self, refusals: RefusalLog, grace_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.refusals = refusals
        self.cut = 0  # connections cut so far
        self._grace_s = grace_s
        self._clock = clock
        self._unproven: dict[int, tuple[float, _Connection]] = {}  # descriptor -> (deadline, connection)
        self._drain_monitor: Callable[[], None] = lambda: None

    def watch(self, drain_monitor: Callable[[], None]) -> None:
        """``drain_monitor`` reads every waiting monitor event now: called before cutting anything, so a
        descriptor closed and reused since is known as the new connection's."""
        self._drain_monitor = drain_monitor

    def receive(self, socket: CythonSocket) -> list[bytes] | None:
        """The next message, if its connection may use its routing id; None if it was refused."""
        first = _recv(socket, zmq.NOBLOCK, False)
        frames = [first.bytes]
        frame = first
        while frame.more:
            frame = _recv(socket, zmq.NOBLOCK, False)
            frames.append(frame.bytes)
        try:
            key = str(first.get("User-Id"))
        except zmq.ZMQError:  # no ZAP answer behind this connection: CURVE is off on it
            key = ""
        routing_id = frames[0]
        if routing_id != key.encode():
            self.refusals.warn(f"routing id {key}",
                               "CURVE: refused a message on the backend from a connection with key %r under "
                               "routing id %r: a worker's routing id must be its key's name (start it with "
                               "--name %s, or give it a key pair named as it)", key, _shown(routing_id), key)
            return None
        if len(frames) > 1 and frames[1] == _READY_HEADER and (name := _ready_name(frames[1:])) not in ("", key):
            self.refusals.warn(f"name {key}", "CURVE: refused READY from worker %r: it calls itself %r, but a "
                               "worker's name must be its key's name", key, name)
            return None
        if self._unproven:
            self._unproven.pop(int(first.get(zmq.SRCFD)), None)
        return frames

    def on_monitor_event(self, frames: list[bytes]) -> None:
        """One event of the backend's socket monitor: a connection accepted, or gone."""
        event = parse_monitor_message(frames)
        descriptor = int(event["value"])
        if event["event"] == zmq.EVENT_ACCEPTED:
            connection = _Connection.on(descriptor)
            if connection is not None:
                self._unproven[descriptor] = (self._clock() + self._grace_s, connection)
        else:
            self._unproven.pop(descriptor, None)

    def expire(self) -> float | None:
        """Cut the connections that showed no good message in time; the ``clock()`` of the next deadline."""
        now = self._clock()
        if any(deadline <= now for deadline, _ in self._unproven.values()):
            self._drain_monitor()
            for descriptor, (deadline, connection) in list(self._unproven.items()):
                if deadline <= now:
                    del self._unproven[descriptor]
                    self._cut(descriptor, connection)
        return min((deadline for deadline, _ in self._unproven.values()), default=None)

    def _cut(self, descriptor: int, connection: _Connection) -> None:
        if _Connection.on(descriptor) != connection:
            return  # closed since, and the number reused: not the connection we were watching
        self.cut += 1
        self.refusals.warn(f"cut {connection.host}",
                           "CURVE: cut the backend connection from %s: nothing came from it under its key's "
                           "name for %.1f s (its routing id is another key's name, or held by another "
                           "connection)", connection.peer, self._grace_s)
        try:
            with stdlib_socket.socket(fileno=os.dup(descriptor)) as duplicate:
                duplicate.shutdown(stdlib_socket.SHUT_RDWR)
        except OSError as exc:
            log.debug("could not cut descriptor %d: %s", descriptor, exc)


@dataclass(frozen=True)
class _Connection:
    """Which socket a descriptor holds (its inode: a reused number is another socket), and its peer."""

    inode: tuple[int, int]
    peer: str

    @property
    def host(self) -> str:
        return self.peer.rsplit(":", 1)[0]

    @classmethod
    def on(cls, descriptor: int) -> _Connection | None:
        """The socket on ``descriptor`` now, or None if there is none."""
        try:
            status = os.fstat(descriptor)
            with stdlib_socket.socket(fileno=os.dup(descriptor)) as duplicate:
                address = duplicate.getpeername()
        except OSError:
            return None
        peer = f"{address[0]}:{address[1]}" if isinstance(address, tuple) else f"a local socket ({address or 'ipc'})"
        return cls((status.st_dev, status.st_ino), peer)


def _ready_name(frames: list[bytes]) -> str:
    """The ``name`` a READY announces; "" for a malformed one (the routing core refuses those)."""
    try:
        message = wire.decode_worker_message(frames)
    except wire.ProtocolError:
        return ""
    return message.name if isinstance(message, wire.Ready) else ""


def _shown(routing_id: bytes) -> str:
    text = routing_id.decode(errors="replace")
    return text if text.isprintable() else "0x" + routing_id.hex()
