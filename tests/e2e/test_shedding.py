"""Shedding by time (broker/admission.py) on real daemons and the real model: the two loads of issue 33.

16 closed-loop clients sending 32 texts a request fit in the default deadline of the shipped stack: every
request is answered.  64 of them against one worker with a 5 s deadline do not: the broker refuses what
would wait past the deadline, at once, with a Retry-After, and what it admits is answered, on the real
model and on a simulated accelerator whose pace the host cannot change.  Each test
prints its figures (``-s``); the speeds are measured in scripts/bench (overload cases), not asserted here.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from scripts.benchmarks.systems.accelerator import COST_ENV, RUNNERS
from scripts.benchmarks.systems.accelerator import MODEL as SIMULATED
from tests.daemons import Daemon, broker_stats, running_stack, wait_until
from tests.load import Answer, Load
from worker.runners import DEFAULT_MODEL_NAME

MODEL = DEFAULT_MODEL_NAME
TEXTS = 32
CLIENTS = 64
DEADLINE_MS = 5_000
HEADROOM = 0.2  # the broker's ZBATCH_DEADLINE_HEADROOM, as shipped


def report(name: str, **figures: Any) -> None:
    print(f"\nFIGURES {name}: {json.dumps(figures, default=str)}")


def model_url(stack: dict[str, Daemon]) -> str:
    return f"{stack['gateway'].url}/models/{MODEL}"


def model_stats(stack: dict[str, Daemon], model: str = MODEL) -> dict[str, Any]:
    stats = broker_stats(stack["broker"].frontend) or {"models": {}}
    return dict(stats["models"].get(model, {}))


def p99_ms(answers: list[Answer]) -> float | None:
    return round(float(np.percentile([a.latency_s for a in answers], 99)) * 1000, 1) if answers else None


def test_16_clients_of_32_texts_on_the_shipped_stack_are_all_answered(log_dir: Path) -> None:
    """512 texts outstanding at most: a few seconds of work on two CPU workers, well inside 30 s."""
    with running_stack(log_dir) as stack:
        with Load(model_url(stack), 16, texts=TEXTS) as load:
            wait_until(lambda: load.successes() >= 48, 300, "three answers a client")
            load.stop()
        stats = model_stats(stack)
    summary = load.summary()
    report("16 x 32", **summary, p99_ms=p99_ms(load.answers), service_rate=stats.get("service_rate"),
           refused_by_broker=stats["requests"].get("overloaded", 0))
    assert summary["answered"] == summary["sent"] == summary["ok"]
    assert stats["requests"].get("overloaded", 0) == 0


def overloading_deadline_ms(service_rate: float) -> int:
    """5 s, or shorter on a host fast enough to answer the 64 clients' texts within it: the deadline whose
    admitted share (``ZBATCH_DEADLINE_HEADROOM``, 0.2, kept free) their work fills twice over at the
    measured rate, so that shedding happens on any host, however fast."""
    full_load_s = CLIENTS * TEXTS / service_rate
    return min(DEADLINE_MS, round(full_load_s / 2 / (1 - HEADROOM) * 1000))


def shed(url: str, stack: dict[str, Daemon], model: str = MODEL) -> tuple[Load, dict[str, Any]]:
    """16 clients until the model's rate is established, as a server that has been serving would have it;
    then 64 clients with a deadline that their work overloads (:func:`overloading_deadline_ms`), who follow
    Retry-After, until 30 answers, one of them to a client that followed it.  The load and the model's
    broker stats after it, with the deadline under ``deadline_ms``."""
    with Load(url, 16, texts=TEXTS) as warm:
        rate = wait_until(lambda: warm.successes() >= 16 and model_stats(stack, model).get("service_rate"), 300,
                          "the model's rate, measured under load")
        warm.stop()
    deadline_ms = overloading_deadline_ms(rate)
    load = Load(url, CLIENTS, texts=TEXTS, headers={"X-Request-Timeout-Ms": str(deadline_ms)},
                follow_retry_after=True)
    with load:
        wait_until(lambda: load.successes() >= 30 and any(a.retry and a.status == 200 for a in load.answers),
                   300, "30 answers, one of them to a client that followed Retry-After")
        load.stop()
    return load, model_stats(stack, model) | {"deadline_ms": deadline_ms}


def check_shed(name: str, load: Load, stats: dict[str, Any]) -> Counter[int]:
    """What shedding guarantees whatever the host's pace: every request answered once, 200, 503 or 504; every
    503 an ``overloaded`` with a Retry-After; the broker itself shed.  The statuses."""
    answers = list(load.answers)
    statuses = Counter(a.status for a in answers)
    refused = [a for a in answers if a.status == 503]
    accepted = [a for a in answers if a.status in (200, 504)]
    report(name, statuses=dict(statuses), refused_p99_ms=p99_ms(refused), accepted_p99_ms=p99_ms(accepted),
           retries=sum(a.retry for a in answers), retries_admitted=sum(a.retry and a.status == 200 for a in answers),
           retry_after_s=dict(Counter(a.retry_after_s for a in refused)), service_rate=stats.get("service_rate"),
           lateness_ms=stats.get("lateness_ms"), deadline_ms=stats["deadline_ms"],
           refused_by_broker=stats["requests"].get("overloaded", 0),
           late_at_broker=stats["requests"].get("deadline_exceeded", 0))
    assert load.summary()["answered"] == load.summary()["sent"]
    assert set(statuses) <= {200, 503, 504}
    assert refused and all(a.code == "overloaded" and (a.retry_after_s or 0) >= 1 for a in refused)
    assert stats["requests"].get("overloaded", 0) >= 1  # the broker shed, not only the gateway's breaker
    return statuses


def test_64_clients_of_32_texts_with_a_5_s_deadline_on_one_worker_are_shed_with_retry_after(log_dir: Path) -> None:
    """Waiting would pass the deadline: refusals (503 overloaded, Retry-After) instead of late answers.

    The deadline is 5 s, or shorter where the host runs the model fast enough to answer all 64 clients
    within 5 s (a quiet host does): the test is about shedding, so it makes sure there is some to do.
    On the real model the worker's pace is the host's: a prediction misses when the pace drops after a
    request was admitted by more than the deadline's headroom (a neighbour's load on a shared host, the 64
    clients' own HTTP work), and those requests end 504.  How many depends on how often and how deep the
    host's pace drops, which this test cannot bound, so it does not count them: it holds what the broker
    guarantees whatever the pace (every request answered, the refusals with Retry-After) and that it learns
    from late answers (its lateness).  The bound on late answers is held where the model's pace is the
    model's own: the simulated accelerator's test below.
    """
    with running_stack(log_dir, workers=1) as stack:
        load, stats = shed(model_url(stack), stack)
    statuses = check_shed("64 x 32, 5 s deadline", load, stats)
    if statuses[504]:
        assert stats["requests"].get("deadline_exceeded", 0) or stats["lateness_ms"] > 0, stats


def test_on_a_simulated_accelerator_late_answers_are_few(log_dir: Path) -> None:
    """The same loads against a worker whose model sleeps a fixed time a batch
    (``scripts.benchmarks.systems.accelerator``: 40 ms plus 1.5 ms an item, 88 ms for 32 texts, so a deadline of
    about 3.5 s), as an accelerator's would: its pace does not depend on what else runs on the host, only the
    worker's and gateway's own handling of each request does, which is small beside a batch.  So here the
    broker's predictions hold, and at most a tenth of the admitted requests may end 504 (what is late is the
    handling on a host so busy that it delays even those)."""
    worker = {"task": f"python:scripts.benchmarks.systems.accelerator:{RUNNERS['none']}", "model_name": SIMULATED,
              "model_path": str(log_dir), "workers": 1, "torch_threads": 1, "env": {COST_ENV: "40,1.5"}}
    with running_stack(log_dir, workers=1, worker=worker) as stack:
        load, stats = shed(f"{stack['gateway'].url}/models/{SIMULATED}", stack, SIMULATED)
    statuses = check_shed("64 x 32, 5 s deadline, simulated accelerator", load, stats)
    assert statuses[504] <= 0.1 * (statuses[200] + statuses[504]), statuses
