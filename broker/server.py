"""The broker's I/O shell: two ROUTER sockets around :class:`broker.core.BrokerCore`.

A readable socket or the core's next wakeup runs one pump: take the
messages waiting on either socket, let the core decide, send its outbox.
Sends never block: ROUTER_MANDATORY turns a vanished peer into an error the
core hears about, instead of a silent drop.

Shutdown runs in stages (SIGTERM or SIGINT): stop admitting, let admitted
work finish for up to ``drain_timeout_ms``, answer whatever is left, then
close both sockets before terminating the context.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time

import zmq
import zmq.asyncio

from broker import NATIVE_STATUS
from broker.config import BrokerConfig
from broker.core import BrokerCore, Peer
from broker.metrics import broker_families
from zbatch.runtime import sockets
from zbatch.runtime.curve import CLIENTS_DOMAIN, WORKERS_DOMAIN, CurveServer
from zbatch.runtime.metrics import start_metrics
from zbatch.runtime.sdnotify import Notifier

log = logging.getLogger("zbatch.broker")
FINAL_LINGER_MS = 1_000
FINAL_FLUSH_S = 0.2
MAX_SLEEP_S = 0.1
# Rounds one pump routes before it yields the loop (then it runs again at once): a sustained
# flood must not starve the core's timers, CURVE authentication, signals or /metrics.
MAX_ROUNDS_PER_PUMP = 256
MAX_FRAME_FACTOR = 4  # the frame size libzmq refuses, in max_message_bytes (64 MiB by default)


class BrokerServer:
    def __init__(self, config: BrokerConfig, context: zmq.asyncio.Context | None = None) -> None:
        self.config = config
        self.core = BrokerCore(config.core_settings(), time.monotonic)
        self._context = context or zmq.asyncio.Context()
        self._owns_context = context is None
        # CURVE (off unless configured): the authenticator must share the sockets' context.
        self._curve = CurveServer(self._context, config.curve_secret_key_file, {
            CLIENTS_DOMAIN: config.curve_clients_dir, WORKERS_DOMAIN: config.curve_workers_dir,
        }) if config.curve_secret_key_file else None
        self.frontend = self._router(config.frontend, CLIENTS_DOMAIN)
        self.backend = self._router(config.backend, WORKERS_DOMAIN, handover=True)
        # Non-blocking sends and receives go through synchronous views of the same sockets,
        # so errors surface at the call instead of inside futures; only the wait is async.
        self._sync = {
            sock: zmq.Socket.shadow(sock.underlying) for sock in (self.frontend, self.backend)
        }
        self._inputs = [(sync, zmq.POLLIN) for sync in self._sync.values()]
        self._handlers = {self._sync[self.frontend]: self.core.client_message,
                          self._sync[self.backend]: self.core.worker_message}
        self._stop = asyncio.Event()
        self._pumped = asyncio.Event()
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0
        self.notifier = Notifier(self.status_line)

    def _router(self, endpoint: str, domain: str, *, handover: bool = False) -> zmq.asyncio.Socket:
        socket = self._context.socket(zmq.ROUTER)
        if self._curve is not None:
            self._curve.secure(socket, domain)
        socket.setsockopt(zmq.ROUTER_MANDATORY, 1)
        if handover:  # a restarted worker with the same identity takes over its old connection
            socket.setsockopt(zmq.ROUTER_HANDOVER, 1)
        socket.setsockopt(zmq.LINGER, 0)
        socket.setsockopt(zmq.SNDHWM, 100_000)
        socket.setsockopt(zmq.RCVHWM, 100_000)
        # libzmq drops the connection of a peer sending a frame this large, before buffering it;
        # messages between max_message_bytes and this get a "message too large" answer.
        socket.setsockopt(zmq.MAXMSGSIZE, MAX_FRAME_FACTOR * self.config.max_message_bytes)
        socket.bind(endpoint)
        return socket

    def request_stop(self) -> None:
        self._stop.set()

    def reload_keys(self) -> None:
        """SIGHUP: read the CURVE allow-lists again, so keys rotate without a restart."""
        if self._curve is None:
            log.info("SIGHUP: CURVE is off, no keys to reload")
        else:
            self._curve.reload()

    def status_line(self) -> str:
        """One line for ``systemctl status``."""
        stats = self.core.stats()
        backlog = sum(model["backlog_items"] for model in stats["models"].values())
        draining = ", draining" if stats["draining"] else ""
        return f"{len(stats['workers'])} worker(s), {backlog} item(s) waiting{draining}"

    async def run(self) -> None:
        log.info("zbatch-broker: clients on %s, workers on %s; routing core %s", self.config.frontend,
                 self.config.backend, NATIVE_STATUS)
        loop = asyncio.get_running_loop()
        for sync in self._sync.values():
            loop.add_reader(sync.FD, self._pump)
        stop_metrics = start_metrics(self.config.metrics_host, self.config.metrics_port,
                                     lambda: broker_families(self.core))
        self.notifier.ready()  # both sockets were bound in __init__
        self._pump()  # whatever arrived before the readers were installed
        try:
            await self._stop.wait()
            log.info("draining: refusing new requests, waiting up to %d ms", self.config.drain_timeout_ms)
            self.core.begin_drain()
            self.notifier.stopping()
            await self._until_idle(self.config.drain_timeout_ms / 1000)
            self.core.abandon_all("the broker stopped before this request finished; retry")
            self._flush()
            # Let the last answers leave before the connection closes: a peer that reads them
            # in the same TCP segment as the close can lose them (seen with libzmq here).
            await asyncio.sleep(FINAL_FLUSH_S)
        finally:
            stop_metrics()
            if self._timer is not None:
                self._timer.cancel()
            for sync in self._sync.values():
                loop.remove_reader(sync.FD)
            self.close()
        log.info("zbatch-broker stopped")

    def _pump(self) -> None:
        """Route everything that is ready; runs when a socket's descriptor or the core's next wakeup fires.

        A plain callback, not a task awaiting a future per wakeup: at thousands of
        messages a second the future and its timer cost more than routing.  Each
        round asks zmq_poll which sockets hold a message (one C call for both:
        1.6 us, where a failed non-blocking recv costs 4.4 us to raise), takes one
        message from each, and sends what the core decided at once.  The socket
        descriptors are edge-triggered; zmq_poll also re-arms them, so when it
        finds nothing, the next input wakes this callback again.  After
        MAX_ROUNDS_PER_PUMP rounds with input still waiting, the pump reschedules
        itself behind whatever else the loop has to do.
        """
        inputs = self._inputs
        for _ in range(MAX_ROUNDS_PER_PUMP):
            if not (ready := zmq.zmq_poll(inputs, 0)):
                break
            for socket, _ in ready:
                try:
                    identity, *frames = sockets.recv_frames(socket)
                except zmq.Again:  # announced but gone (a peer dropped for an oversized frame)
                    continue
                self._handlers[socket](identity, frames)
            self._flush()
        else:
            asyncio.get_running_loop().call_soon(self._pump)
        self.core.tick()
        self._flush()
        self.notifier.tick()  # the watchdog ping proves the loop turns (the timer pumps at least every 100 ms)
        self._arm_timer()
        self._pumped.set()

    def _arm_timer(self) -> None:
        """One timer at the core's next wakeup, at most MAX_SLEEP_S away; an earlier one already set stands."""
        now = time.monotonic()
        when = min(self.core.next_wakeup(), now + MAX_SLEEP_S)
        if self._timer is not None:
            if self._timer_at <= when:
                return
            self._timer.cancel()
        self._timer_at = when
        self._timer = asyncio.get_running_loop().call_later(max(0.0, when - now), self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self._pump()

    async def _until_idle(self, timeout_s: float) -> None:
        """Let admitted work finish: re-check after every pump, for at most ``timeout_s``."""
        end = time.monotonic() + timeout_s
        while not self.core.idle and (left := end - time.monotonic()) > 0:
            self._pumped.clear()
            try:
                await asyncio.wait_for(self._pumped.wait(), left)
            except TimeoutError:
                return

    def _flush(self) -> None:
        """Send the core's outbox, and what the core decides when a peer turns out to be gone."""
        while self.core.outbox:
            outbox, self.core.outbox = self.core.outbox, []
            for peer, identity, frames in outbox:
                socket = self._sync[self.frontend if peer is Peer.CLIENT else self.backend]
                try:
                    sockets.send_frames(socket, [identity, *frames])
                except zmq.ZMQError as exc:
                    # EHOSTUNREACH: the peer is gone; EAGAIN: it stopped reading (at HWM).
                    log.debug("could not send to %s %s: %s", peer.value, identity.hex(), exc)
                    self.core.unreachable(peer, identity)

    def close(self) -> None:
        # The last answers (drain leftovers) must still reach their clients.
        self.frontend.close(linger=FINAL_LINGER_MS)
        self.backend.close(linger=FINAL_LINGER_MS)
        if self._curve is not None:
            self._curve.stop()
        if self._owns_context:
            self._context.term()


async def serve(config: BrokerConfig) -> None:
    server = BrokerServer(config)
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, server.request_stop)
    loop.add_signal_handler(signal.SIGHUP, server.reload_keys)
    await server.run()
