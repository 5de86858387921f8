"""The broker's I/O shell: two ROUTER sockets around :class:`broker.core.BrokerCore`.

Both sockets are read by one :class:`~zbatch.runtime.sockets.PolledSockets`:
each round takes the messages waiting on either socket and lets the core
decide, then the core's outbox is sent; after each wake the core fires its
timers, and the next wake is set for the core's next wakeup.  Sends never
block: ROUTER_MANDATORY turns a vanished peer into an error the core hears
about, instead of a silent drop.

The lifecycle is :mod:`zbatch.runtime.daemon`'s; the drain is staged: stop
admitting, let admitted work finish for up to ``drain_timeout_ms``, answer
whatever is left, then close both sockets before terminating the context.
SIGHUP reads the CURVE allow-lists again.

With CURVE, a worker is the name of its key (:mod:`zbatch.runtime.curve`):
the backend reads through a :class:`~broker.keyguard.WorkerKeyGuard`,
which refuses a message whose routing id is not its connection's key name
and cuts connections that show no such message within the liveness window
(it watches the backend's socket monitor).  ROUTER_HANDOVER is off then, so
no connection can take over another's routing id; ZMTP heartbeats let libzmq
close the connection of a worker whose host died, freeing its name for the
restarted worker.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import zmq
import zmq.asyncio

from broker import NATIVE_STATUS
from broker.config import BrokerConfig
from broker.core import BrokerCore, Peer
from broker.curve import CurveServer
from broker.keyguard import WorkerKeyGuard
from broker.metrics import broker_families
from zbatch.runtime import daemon
from zbatch.runtime.curve import CLIENTS_DOMAIN, WORKERS_DOMAIN
from zbatch.runtime.sockets import Handler, PolledSockets, Receiver, Socket, open_socket, recv_frames

log = logging.getLogger("zbatch.broker")
FINAL_LINGER_MS = 1_000
FINAL_FLUSH_S = 0.2
WORKER_QUEUE = 100_000  # messages to or from the workers: requests are bounded by their credit anyway
CLIENT_INBOX = 1_000  # messages read ahead from the clients; more wait in the kernel and on the senders
MAX_FRAME_FACTOR = 4  # the frame size libzmq refuses, in max_message_bytes (64 MiB by default)


class BrokerServer(daemon.Service):
    name = "zbatch-broker"
    log = log

    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        self.core = BrokerCore(config.core_settings(), time.monotonic)
        self._context = zmq.asyncio.Context()
        self._curve: CurveServer | None = None
        self._guard: WorkerKeyGuard | None = None
        self._sockets: dict[Peer, Socket] = {}
        self._monitor: Socket | None = None
        self._poller: PolledSockets | None = None
        self._pumped = asyncio.Event()

    async def start(self) -> daemon.Essentials:
        config = self.config
        if config.curve_secret_key_file:  # the authenticator shares the sockets' context and runs on this loop
            self._curve = CurveServer(self._context, config.curve_secret_key_file, {
                CLIENTS_DOMAIN: config.curve_clients_dir, WORKERS_DOMAIN: config.curve_workers_dir,
            })
        # A client's answers queue at most max_client_requests deep; one that does not read them loses the rest.
        self._sockets[Peer.CLIENT] = self._router(config.frontend, CLIENTS_DOMAIN, send_hwm=config.max_client_requests,
                                                  receive_hwm=CLIENT_INBOX)
        handlers: dict[Socket, Handler] = {}
        receivers: dict[Socket, Receiver] = {}
        if self._curve is None:
            # a restarted worker with the same identity takes over its old connection
            self._sockets[Peer.WORKER] = self._router(config.backend, WORKERS_DOMAIN, handover=True)
        else:
            self._guard = guard = WorkerKeyGuard(self._curve.refusals, self._liveness_ms / 1000)
            self._sockets[Peer.WORKER], self._monitor = self._keyed_backend(guard)
            handlers[self._monitor] = guard.on_monitor_event
            receivers[self._sockets[Peer.WORKER]] = guard.receive
        handlers |= {self._sockets[Peer.CLIENT]: self._from_client, self._sockets[Peer.WORKER]: self._from_worker}
        self._poller = PolledSockets(handlers, after_round=self._flush, after_wake=self._tick, receivers=receivers)
        log.info("zbatch-broker: clients on %s, workers on %s; routing core %s", config.frontend, config.backend,
                 NATIVE_STATUS)
        return {"the socket pump": self._poller.stopped}

    def _router(self, endpoint: str, domain: str, *, send_hwm: int = WORKER_QUEUE,
                receive_hwm: int = WORKER_QUEUE, handover: bool = False, **options: Any) -> Socket:
        # libzmq drops the connection of a peer sending a frame MAX_FRAME_FACTOR times the limit, before
        # buffering it; messages between max_message_bytes and that get a "message too large" answer.
        return open_socket(self._context, zmq.ROUTER, bind=endpoint, mandatory=True, handover=handover,
                           send_hwm=send_hwm, receive_hwm=receive_hwm,
                           max_message_bytes=MAX_FRAME_FACTOR * self.config.max_message_bytes,
                           curve=None if self._curve is None else (self._curve, domain), **options)

    @property
    def _liveness_ms(self) -> int:
        return self.config.heartbeat_ms * self.config.heartbeat_liveness

    def _keyed_backend(self, guard: WorkerKeyGuard) -> tuple[Socket, Socket]:
        """The CURVE backend, without handover, and the socket monitor ``guard`` reads."""
        endpoint = f"inproc://zbatch-backend-monitor-{id(self)}"
        backend = self._router(self.config.backend, WORKERS_DOMAIN, heartbeat_ms=self.config.heartbeat_ms,
                               heartbeat_timeout_ms=self._liveness_ms,
                               monitor=(endpoint, WorkerKeyGuard.MONITOR_EVENTS))
        monitor = open_socket(self._context, zmq.PAIR, connect=endpoint)

        def drain_monitor() -> None:
            """Every monitor event waiting now, to the guard (it asks before cutting a connection)."""
            while True:
                try:
                    guard.on_monitor_event(recv_frames(monitor))
                except zmq.Again:
                    return

        guard.watch(drain_monitor)
        return backend, monitor

    def reload(self) -> None:
        """SIGHUP: read the CURVE allow-lists again, so keys rotate without a restart."""
        if self._curve is None:
            log.info("SIGHUP: CURVE is off, no keys to reload")
        else:
            self._curve.reload()

    def metrics(self) -> daemon.MetricsPage:
        return daemon.MetricsPage(self.config.metrics_host, self.config.metrics_port,
                                  lambda: broker_families(self.core))

    def status_line(self) -> str:
        stats = self.core.stats()
        backlog = sum(model["backlog_items"] for model in stats["models"].values())
        return f"{len(stats['workers'])} worker(s), {backlog} item(s) waiting"

    async def drain(self) -> None:
        log.info("draining: refusing new requests, waiting up to %d ms", self.config.drain_timeout_ms)
        self.core.begin_drain()
        await self._until_idle(self.config.drain_timeout_ms / 1000)
        self.core.abandon_all("the broker stopped before this request finished; retry")
        self._flush()
        # Let the last answers leave before the connection closes: a peer that reads them
        # in the same TCP segment as the close can lose them (seen with libzmq here).
        await asyncio.sleep(FINAL_FLUSH_S)

    async def close(self) -> None:
        if self._poller is not None:
            self._poller.close()
        if self._monitor is not None:
            self._sockets[Peer.WORKER].disable_monitor()
            self._monitor.close(linger=0)
        for socket in self._sockets.values():  # the last answers (drain leftovers) must still reach their peers
            socket.close(linger=FINAL_LINGER_MS)
        if self._curve is not None:
            self._curve.stop()
        self._context.term()

    # ------------------------------------------------------------ the pump

    def _from_client(self, frames: list[bytes]) -> None:
        self.core.client_message(frames[0], frames[1:])

    def _from_worker(self, frames: list[bytes]) -> None:
        self.core.worker_message(frames[0], frames[1:])

    def _tick(self) -> float:
        """After each wake: fire the core's timers, send what they decided; the next wake is the core's."""
        self.core.tick()
        self._flush()
        self._pumped.set()
        wake_at = self.core.next_wakeup()
        if self._guard is not None and (cut_at := self._guard.expire()) is not None:
            wake_at = min(wake_at, cut_at)
        return wake_at

    def _flush(self) -> None:
        """Send the core's outbox, and what the core decides when a peer turns out to be gone."""
        assert self._poller is not None
        send, sockets, core = self._poller.send, self._sockets, self.core
        while core.outbox:
            outbox, core.outbox = core.outbox, []
            for peer, identity, frames in outbox:
                try:
                    send(sockets[peer], [identity, *frames])
                except zmq.ZMQError as exc:
                    # EHOSTUNREACH: the peer is gone; EAGAIN: it stopped reading (at HWM).
                    log.debug("could not send to %s %s: %s", peer.value, identity.hex(), exc)
                    core.unreachable(peer, identity)

    async def _until_idle(self, timeout_s: float) -> None:
        """Let admitted work finish: re-check after every wake, for at most ``timeout_s``."""
        end = time.monotonic() + timeout_s
        while not self.core.idle and (left := end - time.monotonic()) > 0:
            self._pumped.clear()
            try:
                await asyncio.wait_for(self._pumped.wait(), left)
            except TimeoutError:
                return
