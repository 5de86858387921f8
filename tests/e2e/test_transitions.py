"""No refusal while a worker is free, at the stack's transitions: workers registering one after another, and
kill -9 of a worker and of a broker under load (issue 38).

Real daemons (the harness, and ``zbatch serve`` for the kills) on the simulated accelerator of
``scripts/benchmarks/systems/accelerator.py``: the real worker, whose model sleeps as a GPU computes (batches of up to
128, two in flight, the first two batches after a start slow, as a GPU's may be) and takes no CPU.  So this host
plays a GPU host: the accelerator is never what limits, a worker of the model has free credit throughout,
and every refusal is the stack's own doing.  Closed-loop HTTP clients (tests/load.py) load the stack.

What the tests assert are invariants, whatever the host's pace: every request is answered, each with 200.
They wait on counts (answers, registrations, the supervisor's own "ready again"), each with a timeout far
beyond what a loaded host needs; no figure of speed is asserted.  Each prints what it measured (``-s``).
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

from scripts.benchmarks.systems import accelerator as simulated
from tests.daemons import Daemons, broker_stats, http_status, start_broker, start_gateway, start_worker, wait_until
from tests.load import Load
from zbatch.testing import serves, spawn_serve, supervised_pids, wait_ready_again

MODEL = simulated.MODEL
STAGGER_S = 0.5  # between two registrations, as in scripts/bench's staggered case
COLD = (2, 1_000.0)  # a fresh worker's first two batches each 1 s slower: its broker's first rate is a poor one
CLIENTS = 256  # issue 38's chaos load: one worker's credit, a third of the three workers' of the kill test
STAGGERED_CLIENTS = 384  # one worker's credit and half as much again, under the broker's cold count (512)
TIMEOUT_S = 120.0  # any wait here; a loaded host needs a fraction of it


def report(name: str, **figures: Any) -> None:
    print(f"\nFIGURES {name}: {json.dumps(figures, default=str)}")


def accelerator(log_dir: Path, **settings: Any) -> dict[str, str]:
    folder = log_dir / "simulated-model"
    folder.mkdir(exist_ok=True)
    return simulated.accelerator_env(str(folder), cold=COLD, **settings)


def more_answers(load: Load, count: int) -> Any:
    """A condition: ``count`` more answers than now, whatever they are (a refusal ends the wait as well)."""
    before = len(load.answers)
    return lambda: len(load.answers) >= before + count


def refused_by_brokers(frontends: str) -> int:
    """The ``overloaded`` answers of every broker of ``frontends`` (comma-separated) since it started."""
    total = 0
    for frontend in frontends.split(","):
        stats = broker_stats(frontend) or {"models": {}}
        total += stats["models"].get(MODEL, {}).get("requests", {}).get("overloaded", 0)
    return total


def test_workers_registering_half_a_second_apart_under_load_refuse_nothing(log_dir: Path) -> None:
    """Four workers register 0.5 s apart while clients load the stack from the moment /readyz answers 200.

    Bounded: the clients are more than the first worker's credit (two batches of 128), so work waits at the
    broker until the second registers, but never more of it than one simulated GPU clears in a fraction of
    a second, far inside the 30 s deadline, and less than the broker's cold count: a refusal can only come
    from a rate trusted on too little evidence (a fresh worker's first batches are slow) or from a verdict
    that outlived it.  The stagger is set by the simulated model, which ends its warm-up when told to
    (simulated.open_gates) once every worker has loaded, so it does not depend on how fast this host loads them.
    """
    with Daemons(log_dir) as daemons:
        broker = daemons.add(start_broker(log_dir))
        gateway = daemons.add(start_gateway(broker, log_dir, processes=2, env=accelerator(log_dir)))
        gates = [str(log_dir / f"gate-{index}") for index in range(4)]
        for index, gate in enumerate(gates):
            daemons.add(start_worker(broker, log_dir, f"worker-{index}", wait=False, workers=1, cores_ledger="off",
                                     env=accelerator(log_dir, ready_gate=gate)))
        simulated.open_gates(gates, STAGGER_S, TIMEOUT_S)
        daemons.wait(lambda: http_status(f"{gateway.url}/readyz", 0.5) == 200, "the first worker", TIMEOUT_S)
        ready = time.time()
        with Load(f"{gateway.url}/models/{MODEL}", STAGGERED_CLIENTS) as load:
            daemons.wait(lambda: len((broker_stats(broker.frontend) or {"workers": []})["workers"]) == 4,
                         "every worker to register", TIMEOUT_S)
            registered = time.time()
            daemons.wait(more_answers(load, 10 * STAGGERED_CLIENTS),
                         "ten answers a client after the last registration", TIMEOUT_S)
        refused = refused_by_brokers(broker.frontend)
    summary = load.summary()
    report("staggered start", **summary, all_registered_s=round(registered - ready, 2), refused_by_broker=refused)
    assert summary["answered"] == summary["sent"]
    assert summary["by_code"] == {"ok": summary["answered"]}, "no refusal with a GPU's work of a fraction of a second"
    assert refused == 0


def kill(served: Any, unit: str, load: Load) -> dict[str, Any]:
    """kill -9 ``unit`` of ``zbatch serve`` under ``load``; returns once it is back and answers flowed again."""
    pid = supervised_pids(served)[unit]
    os.kill(pid, signal.SIGKILL)
    out_s = wait_ready_again(served, unit, pid, TIMEOUT_S)
    wait_until(more_answers(load, 10 * CLIENTS), TIMEOUT_S, f"answers after {unit} came back", served.log)
    return {"unit": unit, "pid": pid, "out_s": out_s}


def test_kill_9_of_a_worker_and_of_a_broker_under_load_loses_and_refuses_nothing(log_dir: Path) -> None:
    """``zbatch serve`` with two brokers and three workers: kill -9 a worker, then a broker, under load.

    Bounded: two workers and a broker remain through each kill, so capacity remains and the 30 s deadline
    is far off.  What was at the killed worker is sent again by its broker; what was at the killed broker,
    by the gateway to the other one.  Each kill waits for the supervisor's "ready again" and for more
    answers, and the restarted broker must answer requests again before the load stops.
    """
    served = spawn_serve(log_dir, brokers=2, workers=3, processes=2, env=accelerator(log_dir))
    try:
        wait_until(lambda: serves(served), TIMEOUT_S, "zbatch serve to serve", served.log)
        restarted = served.frontend.split(",")[0]
        with Load(f"{served.url}/models/{MODEL}", CLIENTS) as load:
            wait_until(more_answers(load, 10 * CLIENTS), TIMEOUT_S, "the load to flow", served.log)
            kills = [kill(served, "worker-0", load), kill(served, "broker-0", load)]

            def restarted_broker_answers() -> bool:
                stats = broker_stats(restarted) or {"models": {}}
                return int(stats["models"].get(MODEL, {}).get("requests", {}).get("ok", 0)) > 0

            wait_until(restarted_broker_answers, TIMEOUT_S, "the restarted broker to answer", served.log)
        refused = refused_by_brokers(served.frontend)
    finally:
        served.stop(120)
    summary = load.summary()
    report("kill -9 under load", **summary, kills=kills, refused_by_brokers_since_their_start=refused)
    assert summary["answered"] == summary["sent"], "none lost"
    assert summary["by_code"] == {"ok": summary["answered"]}, "every request answered 200, none refused"
    assert refused == 0


def test_kill_9_of_the_only_broker_under_load_loses_and_refuses_nothing(log_dir: Path) -> None:
    """``zbatch serve`` as shipped, one broker: kill -9 it under load; its supervisor restarts it.

    Bounded: the gateway takes the dropped connection for a broker restarting (zbatch/client/aio.py): what
    was outstanding there is sent to it again once it is back, and new requests wait for it, each for at
    most the gateway's ``broker_restart_wait_ms`` (10 s) after the drop.  So this holds while the broker is
    back within that wait (the supervisor's 1 s restart delay and a start, seconds on a loaded host) and its
    workers register again within the broker's no-worker grace.  The 30 s deadline is far off.
    """
    served = spawn_serve(log_dir, workers=2, processes=2, env=accelerator(log_dir))
    try:
        wait_until(lambda: serves(served), TIMEOUT_S, "zbatch serve to serve", served.log)
        with Load(f"{served.url}/models/{MODEL}", CLIENTS) as load:
            wait_until(more_answers(load, 10 * CLIENTS), TIMEOUT_S, "the load to flow", served.log)
            kills = [kill(served, "broker", load)]
        refused = refused_by_brokers(served.frontend)
    finally:
        served.stop(120)
    summary = load.summary()
    report("kill -9 of the only broker", **summary, kills=kills, refused_by_broker_since_its_start=refused)
    assert summary["answered"] == summary["sent"], "none lost"
    assert summary["by_code"] == {"ok": summary["answered"]}, "every request answered 200, none refused"
    assert refused == 0
