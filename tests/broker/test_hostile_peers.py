"""A real broker under hostile peers (tests/hostile.py): bounded by its settings, honest traffic all answered.

Each attack runs while honest clients keep asking an echo worker: every one
of their requests must be answered ok, and the broker must still answer
STATS afterwards.  Memory is judged by what the broker holds (its backlog's
bytes, its models), not by timings; scripts/benchmarks/studies/hostile.py measures
the RSS of the same attacks at full size.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq

from tests.daemons import Daemon, broker_stats, spawn, start_broker, wait_until
from tests.hostile import HostileWorker, NormalTraffic, blast, never_read
from zbatch.protocol import wire
from zbatch.protocol.wire import BatchCounters

MIB = 1 << 20
GRACE_MS = 200  # the broker's no-worker grace
ECHO, VICTIM = "echo", "m"
Context = zmq.Context[zmq.Socket[bytes]]


@pytest.fixture
def context() -> Iterator[Context]:
    context: Context = zmq.Context()
    yield context
    context.term()


@pytest.fixture
def broker(log_dir: Path) -> Iterator[Daemon]:
    broker = start_broker(log_dir, models=(VICTIM, ECHO), max_backlog_bytes=8 * MIB,
                          no_worker_grace_ms=GRACE_MS)
    echo = spawn("scripts.benchmarks.systems.echo_worker", "echo", log_dir, "broker", backend=broker.backend,
                 name="echo", model=ECHO, outputs="vector")
    try:
        wait_until(lambda: len(stats(broker)["workers"]) == 1, 60, "the echo worker to register", echo.log)
        yield broker
    finally:
        echo.stop()
        broker.stop()


def stats(broker: Daemon) -> dict[str, Any]:
    answer = broker_stats(broker.frontend, timeout_ms=5_000)
    assert answer is not None, broker.log()
    return answer


def assert_unharmed(broker: Daemon, traffic: NormalTraffic) -> None:
    summary = traffic.summary()
    assert summary["ok"] == summary["sent"] > 0, summary
    assert broker.alive() and stats(broker)["uptime_s"] > 0


def test_a_backlog_is_bounded_in_bytes_and_lets_its_payloads_go(broker: Daemon, context: Context) -> None:
    """40 requests of 1 MiB for a model whose one worker never answers: 8 MiB wait, the rest are refused."""
    stuck = HostileWorker(context, broker.backend, b"stuck").start()
    stuck.ready([VICTIM], 1)
    wait_until(lambda: len(stats(broker)["workers"]) == 2, 10, "the stuck worker to register")
    try:
        with NormalTraffic(broker.frontend, ECHO) as traffic:
            statuses = blast(context, broker.frontend, VICTIM, b"\x00" * MIB, 40, timeout_ms=3_000, wait_s=30)
            traffic.stop()
        assert sum(statuses.values()) == 40, statuses
        assert statuses["overloaded"] >= 40 - 9 and statuses["deadline_exceeded"] >= 1, statuses
        assert stats(broker)["models"][VICTIM]["backlog_bytes"] == 0
        assert_unharmed(broker, traffic)
    finally:
        stuck.close()


def test_a_worker_lying_about_its_capacity_is_refused(broker: Daemon, context: Context) -> None:
    liar = HostileWorker(context, broker.backend, b"liar").start()
    liar.ready([VICTIM], 10**9)
    try:
        with NormalTraffic(broker.frontend, ECHO) as traffic:
            statuses = blast(context, broker.frontend, VICTIM, b"\x00" * 1000, 10, timeout_ms=1_000, wait_s=30)
            traffic.stop()
        assert liar.received == 0 and sum(statuses.values()) == 10
        assert [w["name"] for w in stats(broker)["workers"]] == ["echo"]
        assert_unharmed(broker, traffic)
    finally:
        liar.close()


def test_a_worker_lying_in_grouped_answers_settles_nothing_it_does_not_hold(broker: Daemon, context: Context) -> None:
    """A worker answers its jobs in a REPLIES whose last answer is garbage (dropped whole: the jobs end at their
    deadlines), then in a valid REPLIES answers job ids it forged around its own, which belong to the echo
    worker's honest traffic or to nobody: none of them is settled by it."""
    liar = HostileWorker(context, broker.backend, b"liar").start()
    liar.ready([VICTIM], 2)
    wait_until(lambda: len(stats(broker)["workers"]) == 2, 10, "the lying worker to register")
    statuses: list[Any] = []
    try:
        with NormalTraffic(broker.frontend, ECHO) as traffic:
            victims = threading.Thread(target=lambda: statuses.append(
                blast(context, broker.frontend, VICTIM, b"\x80", 2, timeout_ms=2_000, wait_s=30)))
            victims.start()
            wait_until(lambda: len(liar.job_ids) == 2, 10, "the lying worker to hold both requests")
            ok = wire.pack({"status": "ok", "message": ""})
            first, second = liar.job_ids
            liar.send([wire.HEADERS[wire.Command.REPLIES], first, ok, b"\x80", second, b"\xc1 not msgpack", b""])
            wait_until(lambda: traffic.answered >= 20, 30, "honest traffic to run beside the lie")
            epoch, counter = first[:4], int.from_bytes(first[4:], "big")
            around = (epoch + (counter + step).to_bytes(8, "big") for step in range(-min(counter, 50), 300))
            forged = [job for job in around if job not in liar.job_ids]
            for start in range(0, len(forged), 100):
                liar.send([wire.HEADERS[wire.Command.REPLIES],
                           *(frame for job in forged[start:start + 100] for frame in (job, ok, b"forged"))])
            wait_until(lambda: traffic.answered >= 40, 30, "honest traffic after the forged answers")
            victims.join(40)
            traffic.stop()
        assert statuses == [Counter({"deadline_exceeded": 2})], statuses
        assert_unharmed(broker, traffic)
    finally:
        liar.close()


def test_clients_that_never_read_cost_a_bounded_queue_and_others_are_served(broker: Daemon, context: Context) -> None:
    with NormalTraffic(broker.frontend, ECHO) as traffic:
        greedy = [never_read(context, broker.frontend, 20_000) for _ in range(3)]
        wait_until(lambda: traffic.answered >= 200, 30, "honest traffic next to the greedy clients")
        traffic.stop()
    for socket in greedy:
        socket.close(linger=0)
    assert_unharmed(broker, traffic)


def test_a_flood_of_model_names_is_bounded_and_stats_stay_small(broker: Daemon, context: Context) -> None:
    flood = HostileWorker(context, broker.backend, b"flood").start()
    try:
        with NormalTraffic(broker.frontend, ECHO) as traffic:
            flood.ready([f"too-many-{i}" for i in range(1_024)], 1)  # refused whole: over 64 models
            for number in range(100):
                flood.ready([f"fake-{number}-{i}" for i in range(64)], 1)
            wait_until(lambda: "fake-99-0" in stats(broker)["models"], 30, "the last registration")
            traffic.stop()
        known = stats(broker)["models"]
        assert "too-many-0" not in known and len(known) <= 2 + 1_024 + 64
        assert_unharmed(broker, traffic)
    finally:
        flood.close()


def test_counters_past_their_range_are_refused_and_stats_still_answer(broker: Daemon, context: Context) -> None:
    huge = HostileWorker(context, broker.backend, b"huge").start()
    try:
        huge.ready([VICTIM], 2**64 - 1)
        huge.ready([VICTIM], 4)
        wait_until(lambda: len(stats(broker)["workers"]) == 2, 10, "the worker's second, valid, READY")
        big = 2**64 - 1
        huge.heartbeat({VICTIM: BatchCounters(big, big, big, big)})
        huge.heartbeat({VICTIM: BatchCounters(2**48, 2**48, 0, 0)})
        wait_until(lambda: stats(broker)["models"][VICTIM]["batches"] == 2**48, 10, "the valid counters")
        assert stats(broker)["workers"][-1]["capacity"] == 4
    finally:
        huge.close()


def test_a_flood_of_refusals_writes_a_bounded_log(broker: Daemon, context: Context) -> None:
    """20,000 requests for a model nobody serves, each answered ``unknown_model``, and a log line per kind
    per 10 s, not per request.

    The exact count depends on two things the host's pace could change, each bounded here.  Every request
    must reach the broker past its no-worker grace: inside it, a request for a model no worker has announced
    is admitted to wait for one, and once the connection holds 4,096 unanswered (its cap) the rest are
    refused ``overloaded``; so the blast waits for the broker's own uptime to pass the grace.  And the
    answers must be read as they come: the blast keeps at most a quarter of the connection's cap
    unanswered (tests/hostile.py), so a client slowed by a busy host reads late but loses nothing.
    """
    wait_until(lambda: stats(broker)["uptime_s"] > GRACE_MS / 1000, 10, "the broker's no-worker grace to pass")
    before = broker.log_path.stat().st_size
    statuses = blast(context, broker.frontend, "nobody-serves-this", b"", 20_000, timeout_ms=1_000, wait_s=60)
    assert statuses == {"unknown_model": 20_000}
    assert broker.log_path.stat().st_size - before < 20_000  # a line per kind per 10 s, not per request
