"""Nothing lost: real processes, real faults (kill -9, SIGSTOP, restarts), under steady load.

Each test prints its figures (requests sent, answered, succeeded, detection
and recovery times); run with ``-s`` to see them.
"""

from __future__ import annotations

import asyncio
import json
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import zmq

from tests.daemons import (
    Daemon,
    Daemons,
    broker_stats,
    running_stack,
    start_broker,
    start_gateway,
    start_worker,
    wait_for_worker,
    wait_until,
)
from tests.faults import CRASH_MARKER, HANG_MARKER
from tests.hostile import HostileWorker
from tests.load import Load
from worker.runners import DEFAULT_MODEL_NAME
from zbatch.client import AsyncClient, NoWorker, Overloaded
from zbatch.protocol.wire import Status
from zbatch.testing import START_TIMEOUT_S

MODEL = DEFAULT_MODEL_NAME
HEARTBEAT: dict[str, Any] = {"heartbeat_ms": 250, "heartbeat_liveness": 3}
BROKER_RESTART_WAIT_MS = 3_000  # the gateway's wait for a lone broker to come back, short of its 10 s default
POISON_TIMEOUT_S = 60.0  # how long the crashing-input test waits for the poison's answer
SERVICE_S = 60.0  # ...and for service once its restarted workers are back
# The deadline of a request that waits through both crashes and the restart (that test's docstring says why).
THROUGH_THE_CRASHES_MS = int((POISON_TIMEOUT_S + START_TIMEOUT_S + SERVICE_S) * 1000)


def more_successes(load: Load, count: int) -> Callable[[], bool]:
    """A condition: ``count`` more requests answered 200 than now."""
    before = load.successes()
    return lambda: load.successes() >= before + count


def report(name: str, **figures: Any) -> None:
    print(f"\nFIGURES {name}: {json.dumps(figures, default=str)}")


def model_url(stack: dict[str, Daemon]) -> str:
    return f"{stack['gateway'].url}/models/{MODEL}"


def live_workers(stack: dict[str, Daemon]) -> int:
    stats = broker_stats(stack["broker"].frontend) or {"models": {}}
    return int(stats["models"].get(MODEL, {}).get("workers", 0))


def in_flight_count(stack: dict[str, Daemon]) -> int:
    stats = broker_stats(stack["broker"].frontend) or {"workers": []}
    return sum(w["in_flight"] for w in stats["workers"])


def answered_by_broker(stack: dict[str, Daemon]) -> int:
    stats = broker_stats(stack["broker"].frontend) or {"models": {}}
    return sum(stats["models"][MODEL]["requests"].values())


def test_kill_9_of_a_worker_mid_batch_loses_nothing(log_dir: Path) -> None:
    with running_stack(log_dir, broker=HEARTBEAT, worker=HEARTBEAT) as stack, Load(model_url(stack), 16) as load:
        wait_until(lambda: load.successes() >= 50, 60, "load to flow")
        killed_at = time.monotonic()
        stack["w1"].process.kill()
        wait_until(lambda: live_workers(stack) == 1, 10, "the broker to notice the dead worker")
        detected_s = time.monotonic() - killed_at
        before = load.successes()
        wait_until(lambda: load.successes() >= before + 100, 60, "the other worker to carry the load")
        load.stop()
        summary = load.summary()
    report("kill -9", detected_s=round(detected_s, 2), **summary)
    assert summary["answered"] == summary["sent"]
    assert summary["ok"] >= 0.99 * summary["sent"]


def test_a_hung_worker_is_detected_and_not_double_answered(log_dir: Path) -> None:
    with running_stack(log_dir, broker=HEARTBEAT, worker=HEARTBEAT) as stack, Load(model_url(stack), 16) as load:
        wait_until(lambda: load.successes() >= 50, 60, "load to flow")
        stopped_at = time.monotonic()
        stack["w1"].signal(signal.SIGSTOP)
        wait_until(lambda: live_workers(stack) == 1, 10, "the broker to expire the hung worker")
        detected_s = time.monotonic() - stopped_at
        before = load.successes()
        wait_until(lambda: load.successes() >= before + 100, 60, "the other worker to carry the load")
        stack["w1"].signal(signal.SIGCONT)
        wait_until(lambda: live_workers(stack) == 2, 20, "the resumed worker to register again")
        load.stop()
        summary = load.summary()
        broker_answers = answered_by_broker(stack)
    report("SIGSTOP", detected_s=round(detected_s, 2), broker_answers=broker_answers, **summary)
    assert detected_s < 0.25 * 3 + 5.0  # interval x liveness, plus a margin for a loaded machine
    assert summary["answered"] == summary["sent"] and summary["ok"] >= 0.99 * summary["sent"]
    assert broker_answers == summary["sent"]  # one answer per request, none twice


def test_broker_restart_gives_fast_errors_then_service_resumes(log_dir: Path) -> None:
    """A lone broker killed and started again by hand, long after the gateway's restart wait: the requests sent
    meanwhile wait that long for it, then fail 503 broker_unavailable, well before their 30 s deadline."""
    gateway = {"broker_restart_wait_ms": BROKER_RESTART_WAIT_MS}
    with (running_stack(log_dir, broker=HEARTBEAT, worker=HEARTBEAT, gateway=gateway) as stack,
          Load(model_url(stack), 8) as load):
        wait_until(lambda: load.successes() >= 30, 60, "load to flow")
        broker = stack["broker"]
        broker.process.kill()
        broker.process.wait()
        wait_until(lambda: any(a.code == "broker_unavailable" for a in list(load.answers)), 10,
                   "requests to fail fast while the broker is down")
        restarted_at = time.monotonic()
        stack["broker"] = start_broker(log_dir, "broker-restarted", frontend=broker.frontend,
                                       backend=broker.backend, **HEARTBEAT)
        wait_until(lambda: live_workers(stack) == 2, 30, "workers to register with the new broker")
        registered_s = time.monotonic() - restarted_at
        count = len(load.answers)
        wait_until(lambda: any(a.status == 200 for a in list(load.answers)[count:]), 30, "service to resume")
        resumed_s = time.monotonic() - restarted_at
        load.stop()
        summary = load.summary()
    outage = [a for a in load.answers if a.code == "broker_unavailable"]
    report("broker restart", workers_back_s=round(registered_s, 2), service_back_s=round(resumed_s, 2),
           slowest_outage_error_s=round(max(a.latency_s for a in outage), 3), **summary)
    assert summary["answered"] == summary["sent"]
    assert set(summary["by_code"]) <= {"ok", "broker_unavailable"}
    assert max(a.latency_s for a in outage) < 10.0  # the gateway's 3 s wait and a loaded host's margin, not 30 s


def test_rolling_sigterm_restart_of_both_workers_fails_nothing(log_dir: Path) -> None:
    with running_stack(log_dir, broker=HEARTBEAT, worker=HEARTBEAT) as stack, Load(model_url(stack), 16) as load:
        wait_until(lambda: load.successes() >= 30, 60, "load to flow")
        exit_codes = []
        for name in ("w1", "w2"):
            exit_codes.append(stack[name].stop(timeout_s=30))
            stack[name] = start_worker(stack["broker"], log_dir, name, **HEARTBEAT)
            wait_until(more_successes(load, 30), 60, f"traffic after restarting {name}")
        load.stop()
        summary = load.summary()
    report("rolling restart", exit_codes=exit_codes, **summary)
    assert exit_codes == [0, 0]
    assert summary["answered"] == summary["sent"] == summary["ok"]


def test_an_input_that_crashes_the_worker_fails_alone(log_dir: Path) -> None:
    """The poison is answered worker_error once it has killed two workers; every other request is served.

    Both workers die (the poison's second run is alone), so the load's requests wait in the broker through an
    outage: from the second death until a restarted worker registers, a process start and a model load, which
    a busy host stretches past the default 30 s deadline (and such a request is rightly answered
    deadline_exceeded).  The claim is that a request waiting through the crashes is served once a worker is
    back, so its deadline, and the broker's no-worker grace, cover what the test itself allows each step it
    waits through: the poison's answer (the broker gives it as it removes the second dead worker, as the
    outage starts), a restarted worker's registration (``START_TIMEOUT_S``, past which ``wait_for_worker``
    fails the test naming the slow start) and the service after it.  A host slower than that fails at those
    waits, not as a count of deadline_exceeded; the load's own timeout lies past the deadline and the
    gateway's reply grace, so every answer it counts is the stack's.
    """
    faulty = {"task": "python:tests.faults:FaultInjectingEmbeddings", "model_name": MODEL} | HEARTBEAT
    deadline = {"timeout_ms": THROUGH_THE_CRASHES_MS}
    broker_settings = deadline | {"max_timeout_ms": THROUGH_THE_CRASHES_MS,
                                  "no_worker_grace_ms": THROUGH_THE_CRASHES_MS} | HEARTBEAT
    load_timeout_s = THROUGH_THE_CRASHES_MS / 1000 + SERVICE_S
    with (running_stack(log_dir, broker=broker_settings, worker=faulty, gateway=deadline) as stack,
          Load(model_url(stack), 8, timeout_s=load_timeout_s) as load):
        wait_until(lambda: load.successes() >= 20, 60, "load to flow")
        poison = asyncio.run(_post(model_url(stack), {"inputs": ["fine", CRASH_MARKER]}, POISON_TIMEOUT_S))
        restarted_at = time.monotonic()
        for name in ("w1", "w2"):  # what systemd would do: restart the crashed workers
            if not stack[name].alive():
                stack[name] = start_worker(stack["broker"], log_dir, name, wait=False, **faulty)
        for name in ("w1", "w2"):
            wait_for_worker(stack["broker"], stack[name])
        workers_back_s = time.monotonic() - restarted_at
        wait_until(more_successes(load, 20), SERVICE_S, "service after the crashes")
        load.stop()
        summary = load.summary()
    report("crashing input", poison=poison, workers_back_s=round(workers_back_s, 2), **summary)
    assert poison[0] == 502 and poison[1]["error"]["code"] == "worker_error"
    assert "died 2 times" in poison[1]["error"]["message"]
    assert summary["answered"] == summary["sent"] == summary["ok"]


async def _post(url: str, body: dict[str, Any], timeout_s: float = 60) -> tuple[int, Any]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as session:
        async with session.post(url, json=body) as response:
            return response.status, await response.json()


def test_a_worker_that_answers_cancelled_unasked_is_a_502_naming_it_not_a_500(log_dir: Path) -> None:
    """A fake worker that lies (a raw DEALER, tests/hostile.py): the only one serving its model, so the request
    cannot go elsewhere; the caller gets 502 naming the worker, and the gateway keeps 500 for its own faults."""
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    with Daemons(log_dir) as daemons:
        broker = daemons.add(start_broker(log_dir, heartbeat_ms=200))
        gateway = daemons.add(start_gateway(broker, log_dir))
        liar = HostileWorker(context, broker.backend, b"fake-liar").start()
        try:
            liar.ready(["lying-model"], 4)
            wait_until(lambda: (broker_stats(broker.frontend) or {"workers": []})["workers"], 10, "the fake worker")

            async def scenario() -> tuple[int, Any]:
                answer = asyncio.create_task(_post(f"{gateway.url}/models/lying-model", {"inputs": "hello"}))
                await asyncio.to_thread(wait_until, lambda: liar.job_ids, 10, "the request to reach the worker")
                liar.reply(liar.job_ids[0], Status.CANCELLED, "skipped")
                return await answer

            status, body = asyncio.run(scenario())
        finally:
            liar.close()
            context.term()
    report("stray cancelled", status=status, body=body)
    assert (status, body["error"]["code"]) == (502, "worker_lost")
    assert "fake-liar" in body["error"]["message"] and "not cancelled" in body["error"]["message"]


def test_a_hung_model_trips_the_watchdog_and_its_work_moves(log_dir: Path) -> None:
    faulty = {"task": "python:tests.faults:FaultInjectingEmbeddings", "model_name": MODEL,
              "batch_timeout_ms": 1000} | HEARTBEAT
    with running_stack(log_dir, workers=1, broker=HEARTBEAT, worker=faulty) as stack:
        stuck = asyncio.run(_post(model_url(stack), {"inputs": [HANG_MARKER]}, timeout_s=60))
        exit_code = stack["w1"].process.wait(30)
    report("watchdog", answer=stuck, exit_code=exit_code)
    assert exit_code == 70
    assert stuck[0] in (502, 503) and stuck[1]["error"]["code"] in ("worker_error", "no_worker")


def test_a_caller_who_hangs_up_never_reaches_the_model(log_dir: Path) -> None:
    with running_stack(log_dir, workers=1) as stack:
        url = model_url(stack)

        async def scenario() -> None:
            busy = asyncio.create_task(_post(url, {"inputs": ["a long text to keep the model busy " * 30] * 32}))
            await asyncio.to_thread(wait_until, lambda: in_flight_count(stack) >= 1, 10,
                                    "the big batch to be dispatched")
            with pytest.raises(asyncio.TimeoutError):
                await _post(url, {"inputs": ["nobody waits for this"]}, timeout_s=0.3)
            status, _ = await busy
            assert status == 200

        asyncio.run(scenario())

        def counters() -> dict[str, int] | None:
            stats = broker_stats(stack["broker"].frontend) or {"models": {}}
            model = stats["models"].get(MODEL, {})
            return model if model.get("cancelled_items", 0) >= 1 and model.get("batched_items", 0) >= 32 else None

        model = wait_until(counters, 10, "the worker to report the cancelled item")
    report("client disconnect", batched_items=model["batched_items"], cancelled_items=model["cancelled_items"])
    assert model["batched_items"] == 32 and model["cancelled_items"] == 1


def test_broker_sigterm_refuses_new_work_finishes_in_flight_and_exits_0(log_dir: Path) -> None:
    with running_stack(log_dir, workers=1, broker={"drain_timeout_ms": 60_000}, gateway=False) as stack:
        async def scenario() -> tuple[list[Any], Any]:
            async with AsyncClient(stack["broker"].frontend) as client:
                calls = [client.infer(MODEL, [f"text {i} " * 60] * 32) for i in range(3)]  # about a second of work
                in_flight = [asyncio.create_task(call) for call in calls]
                await asyncio.to_thread(wait_until, lambda: in_flight_count(stack) >= 2, 10, "work in flight")
                stack["broker"].signal(signal.SIGTERM)
                await asyncio.wait_for(_until_draining(client), 10)
                refused = await asyncio.gather(client.infer(MODEL, ["after the stop"]), return_exceptions=True)
                return await asyncio.gather(*in_flight, return_exceptions=True), refused[0]

        finished, refused = asyncio.run(scenario())
        exit_code = stack["broker"].process.wait(30)
    assert all(isinstance(r, list) and len(r) == 32 for r in finished), finished
    assert isinstance(refused, Overloaded) and "shutting down" in refused.message
    assert exit_code == 0


def test_broker_sigterm_answers_what_is_left_when_the_drain_times_out(log_dir: Path) -> None:
    with running_stack(log_dir, workers=1, broker={"drain_timeout_ms": 100}, gateway=False) as stack:
        async def scenario() -> list[Any]:
            async with AsyncClient(stack["broker"].frontend) as client:
                calls = [client.infer(MODEL, [f"text {i} " * 200] * 32) for i in range(3)]  # seconds of work
                in_flight = [asyncio.create_task(call) for call in calls]
                await asyncio.to_thread(wait_until, lambda: in_flight_count(stack) >= 2, 10, "work in flight")
                stack["broker"].signal(signal.SIGTERM)
                return list(await asyncio.gather(*in_flight, return_exceptions=True))

        answers = asyncio.run(scenario())
        exit_code = stack["broker"].process.wait(30)
    assert exit_code == 0
    assert all(isinstance(a, NoWorker) and "broker stopped" in a.message for a in answers), answers


async def _until_draining(client: AsyncClient) -> None:
    while not (await client.stats())["draining"]:
        await asyncio.sleep(0.01)


def test_gateway_sigterm_finishes_requests_in_flight(log_dir: Path) -> None:
    with running_stack(log_dir, workers=1) as stack:
        async def scenario() -> tuple[int, Any]:
            request = asyncio.create_task(_post(model_url(stack), {"inputs": ["long text " * 100] * 32}))
            await asyncio.to_thread(wait_until, lambda: in_flight_count(stack) >= 1, 10,
                                    "the request to reach the worker")
            stack["gateway"].signal(signal.SIGTERM)
            return await request

        status, body = asyncio.run(scenario())
        exit_code = stack["gateway"].process.wait(30)
    assert status == 200 and len(body) == 32
    assert exit_code == 0
