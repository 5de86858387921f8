"""The socket factory and the polled reader, over real ZeroMQ sockets, on asyncio's loop and on uvloop."""

from __future__ import annotations

import asyncio
import select
import time
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

import pytest
import zmq

from tests.daemons import free_port
from zbatch.runtime import eventloop
from zbatch.runtime.sockets import MAX_ROUNDS_PER_WAKE, PolledSockets, Socket, open_socket, send_frames

Runner = Callable[[Coroutine[Any, Any, None]], None]
WAIT_S = 5.0


@pytest.fixture(params=["asyncio", "uvloop"])
def run(request: pytest.FixtureRequest) -> Runner:
    """Run a test's coroutine on the standard loop, and on the daemons' loop (uvloop where installed)."""
    return asyncio.run if request.param == "asyncio" else eventloop.run


@pytest.fixture
def context() -> Iterator[zmq.Context[Any]]:
    context: zmq.Context[Any] = zmq.Context()
    yield context
    context.destroy(linger=0)


def pair(context: zmq.Context[Any], address: str) -> tuple[Socket, Socket]:
    """A bound DEALER (the reader's) and a DEALER connected to it (the peer), both with room for a flood."""
    ours = open_socket(context, zmq.DEALER, bind=address, send_hwm=100_000, receive_hwm=100_000)
    peer = open_socket(context, zmq.DEALER, connect=address, send_hwm=100_000, receive_hwm=100_000)
    return ours, peer


async def until(condition: Callable[[], bool], what: str) -> None:
    """Let the loop run until ``condition`` holds, for at most WAIT_S."""
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.001)


def readable(socket: Socket, timeout_s: float) -> bool:
    """Whether the socket's descriptor is readable (its edge is up), without touching the socket."""
    return bool(select.select([socket.FD], [], [], timeout_s)[0])


def test_open_socket_sets_every_option(context: zmq.Context[Any]) -> None:
    port = free_port()
    router = open_socket(context, zmq.ROUTER, bind=f"tcp://127.0.0.1:{port}", linger_ms=250, send_hwm=7,
                         receive_hwm=9, mandatory=True, handover=True, max_message_bytes=4096)
    dealer = open_socket(context, zmq.DEALER, connect=f"tcp://127.0.0.1:{port}", routing_id=b"w1", immediate=True)
    assert type(router) is zmq.Socket and type(dealer) is zmq.Socket  # synchronous: no future per call
    assert [router.getsockopt(option) for option in (zmq.LINGER, zmq.SNDHWM, zmq.RCVHWM, zmq.MAXMSGSIZE)] == [
        250, 7, 9, 4096]
    assert dealer.getsockopt(zmq.ROUTING_ID) == b"w1" and dealer.getsockopt(zmq.IMMEDIATE) == 1
    assert dealer.getsockopt(zmq.LINGER) == 0  # the default: closing never waits for a gone peer
    # ROUTER_MANDATORY: a send to an unknown peer raises instead of vanishing.
    with pytest.raises(zmq.ZMQError) as unreachable:
        send_frames(router, [b"nobody", b"hello"])
    assert unreachable.value.errno == zmq.EHOSTUNREACH


def test_a_failed_bind_is_an_oserror_naming_the_endpoint(context: zmq.Context[Any]) -> None:
    address = f"tcp://127.0.0.1:{free_port()}"
    taken = open_socket(context, zmq.ROUTER, bind=address)
    with pytest.raises(OSError, match=f"cannot bind {address}: Address already in use"):
        open_socket(context, zmq.ROUTER, bind=address)
    taken.close()


def test_two_sockets_are_read_together_and_each_message_reaches_its_handler(
        run: Runner, context: zmq.Context[Any]) -> None:
    first, first_peer = pair(context, "inproc://first")
    second, second_peer = pair(context, "inproc://second")
    got: list[tuple[str, list[bytes]]] = []
    rounds: list[int] = []

    async def scenario() -> None:
        poller = PolledSockets({first: lambda m: got.append(("first", m)), second: lambda m: got.append(("second", m))},
                               after_round=lambda: rounds.append(len(got)))
        send_frames(first_peer, [b"a", b"1"])
        send_frames(second_peer, [b"b"])
        send_frames(first_peer, [b"c"])
        await until(lambda: len(got) == 3, "three messages")
        poller.close()

    run(scenario())
    assert sorted(got) == [("first", [b"a", b"1"]), ("first", [b"c"]), ("second", [b"b"])]
    assert rounds[0] == 2, "one round takes one message from each ready socket"


def test_a_flood_is_read_in_bounded_rounds_so_the_loop_keeps_turning(run: Runner, context: zmq.Context[Any]) -> None:
    ours, peer = pair(context, "inproc://flood")
    flood = 5 * MAX_ROUNDS_PER_WAKE
    for i in range(flood):  # all queued before the reader starts: inproc delivers at once
        send_frames(peer, [b"%d" % i])
    handled: list[bytes] = []
    seen_by_others: list[int] = []

    async def scenario() -> None:
        loop = asyncio.get_running_loop()

        def handle(message: list[bytes]) -> None:
            if not handled:  # something else wants the loop as soon as the flood starts
                loop.call_soon(lambda: seen_by_others.append(len(handled)))
            handled.append(message[0])

        poller = PolledSockets({ours: handle})
        await until(lambda: len(handled) == flood, "the whole flood")
        poller.close()

    run(scenario())
    # Other callbacks ran between wakes (the descriptor's reader may add a second wake before them).
    assert len(seen_by_others) == 1 and MAX_ROUNDS_PER_WAKE <= seen_by_others[0] < flood, seen_by_others
    assert handled == [b"%d" % i for i in range(flood)]


def test_a_send_can_take_down_the_edge_that_announced_waiting_input(context: zmq.Context[Any]) -> None:
    """Why the reader looks again after a send: libzmq processes its pending commands in a send (at most
    every millisecond or so; a socket's first send always), and that takes the edge down."""
    ours, peer = pair(context, "inproc://plain")
    assert not zmq.zmq_poll([(ours, zmq.POLLIN)], 0)  # nothing waits: the edge is armed
    send_frames(peer, [b"announced"])
    assert readable(ours, WAIT_S)
    send_frames(ours, [b"a plain send"])
    assert not readable(ours, 0), "the edge is down"
    assert zmq.zmq_poll([(ours, zmq.POLLIN)], 0), "while the message waits"


def test_input_whose_edge_a_send_took_down_is_still_read(run: Runner, context: zmq.Context[Any]) -> None:
    ours, peer = pair(context, "inproc://edge")
    got: list[list[bytes]] = []

    async def scenario() -> None:
        poller = PolledSockets({ours: got.append})
        send_frames(peer, [b"settle"])  # a first message read through the loop: every wake so far has run
        await until(lambda: bool(got), "the first message")
        send_frames(peer, [b"announced"])
        assert readable(ours, WAIT_S)
        poller.send(ours, [b"the reader's send"])  # within this callback: the loop cannot see the edge first
        assert not readable(ours, 0)
        await until(lambda: len(got) == 2, "the message whose edge the send took down")
        poller.close()

    run(scenario())
    assert got == [[b"settle"], [b"announced"]]
    assert peer.recv_multipart() == [b"the reader's send"]


def test_input_that_arrives_as_after_wake_sends_is_still_read(run: Runner, context: zmq.Context[Any]) -> None:
    """The broker's tick sends heartbeats after the wake's last poll: input that came meanwhile must not wait."""
    ours, peer = pair(context, "inproc://tick")
    got: list[list[bytes]] = []
    poller: PolledSockets | None = None

    def tick() -> None:
        if got[-1:] == [[b"go"]]:
            got.append([b"(ticked)"])
            send_frames(peer, [b"came during the tick"])
            assert poller is not None
            poller.send(ours, [b"heartbeat"])  # the socket's first send: it takes the edge down

    async def scenario() -> None:
        nonlocal poller
        poller = PolledSockets({ours: got.append}, after_wake=tick)
        send_frames(peer, [b"settle"])  # a first message read through the loop: every wake so far has run
        await until(lambda: bool(got), "the first message")
        send_frames(peer, [b"go"])
        await until(lambda: len(got) == 4, "the message that came during the tick")
        poller.close()

    run(scenario())
    assert got == [[b"settle"], [b"go"], [b"(ticked)"], [b"came during the tick"]]


def test_after_wake_sets_the_next_wake_without_input(run: Runner, context: zmq.Context[Any]) -> None:
    """The broker's timers: no input comes, and the reader still wakes when the core asks."""
    ours, _ = pair(context, "inproc://timer")
    wakes: list[float] = []

    async def scenario() -> None:
        started = time.monotonic()

        def after_wake() -> float | None:
            wakes.append(time.monotonic() - started)
            return started + 0.1 if wakes[-1] < 0.1 else None

        poller = PolledSockets({ours: lambda _: None}, after_wake=after_wake)
        await until(lambda: wakes[-1] >= 0.1 if wakes else False, "the timed wake")
        poller.close()

    run(scenario())
    assert 0.1 <= wakes[-1] < 1.0


def test_a_handler_that_raises_stops_the_reading_and_fails_stopped(run: Runner, context: zmq.Context[Any]) -> None:
    ours, peer = pair(context, "inproc://broken")
    got: list[list[bytes]] = []

    def handle(message: list[bytes]) -> None:
        if message == [b"bad"]:
            raise KeyError("a bug in the handler")
        got.append(message)

    async def scenario() -> None:
        poller = PolledSockets({ours: handle})
        send_frames(peer, [b"good"])
        send_frames(peer, [b"bad"])
        with pytest.raises(KeyError, match="a bug in the handler"):
            await asyncio.wait_for(poller.stopped, WAIT_S)
        assert not asyncio.get_running_loop().remove_reader(ours.FD), "the reader was removed"

    run(scenario())
    assert got == [[b"good"]]


def test_close_ends_stopped_with_none_and_a_new_reader_takes_a_new_socket(
        run: Runner, context: zmq.Context[Any]) -> None:
    """The worker's link on reconnection: close the reader and the socket, open both anew."""
    got: list[list[bytes]] = []

    async def connection(generation: int) -> None:
        ours, peer = pair(context, f"inproc://link-{generation}")
        poller = PolledSockets({ours: got.append})
        send_frames(peer, [b"%d" % generation])
        await until(lambda: len(got) == generation + 1, f"message {generation}")
        poller.close()
        assert poller.stopped.result() is None
        ours.close()

    async def scenario() -> None:
        for generation in range(2):
            await connection(generation)

    run(scenario())
    assert got == [[b"0"], [b"1"]]
