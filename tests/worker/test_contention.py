"""A real worker (2 torch threads, the default model on torch) next to real busy processes drops to one thread,
and tries two again once they stop.

The neighbours are plain Python busy loops in their own processes: the same
pressure the gateway, the broker and a load generator put on the cores in a
retry storm.  The test waits on the worker's log lines and on the cores ledger
it holds its threads in, never on a sleep.
"""

from __future__ import annotations

import multiprocessing
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.daemons import Daemon, running_stack, wait_until
from worker.cores import holders
from worker.runners import DEFAULT_MODEL_NAME
from zbatch.client import Client

if TYPE_CHECKING:
    from multiprocessing.synchronize import Event

SWITCH_TIMEOUT_S = 120.0
TEXTS = [f"sentence number {i} has a few more words " * (1 + i % 6) for i in range(16)]


def busy_loop(stop: Event) -> None:
    while not stop.is_set():
        sum(range(10_000))


@pytest.fixture
def worker_with_traffic(log_dir: Path) -> Iterator[Daemon]:
    """One worker with 2 torch threads, kept busy with batches of 16 texts from a client thread."""
    # torch: its 2-thread pass stalls whenever a thread loses its core, which is what the governor answers.
    # ONNX Runtime's sleeping threads degrade otherwise (issue 34; BENCHMARKS.md, Analysis, ONNX Runtime).
    settings = {"workers": 1, "torch_threads": 2, "runtime": "torch"}
    with running_stack(log_dir, workers=1, gateway=False, worker=settings) as daemons:
        stop = threading.Event()

        def send() -> None:
            with Client(daemons["broker"].frontend) as client:
                while not stop.is_set():
                    client.infer(DEFAULT_MODEL_NAME, TEXTS)

        sender = threading.Thread(target=send, daemon=True)
        sender.start()
        try:
            yield daemons["w1"]
        finally:
            stop.set()
            sender.join(30)


def ran_on_two_cores(ledger: Path, seen: threading.Event, stop: threading.Event) -> None:
    """Read the worker's holding in ``ledger`` every half millisecond until ``stop``; set ``seen`` at two cores."""
    while not stop.is_set() and not seen.is_set():
        if any(cores >= 2 for cores in holders(str(ledger)).values()):
            seen.set()
        time.sleep(0.0005)


def test_busy_neighbours_move_the_worker_to_one_thread_and_it_tries_two_again(worker_with_traffic: Daemon,
                                                                               log_dir: Path) -> None:
    """Two busy processes of the test's own move the worker to one thread; once they stop, it runs a batch on two
    threads again.

    Bounded: the drop depends on the test's two busy processes alone (on a host already busy, the worker may be
    on one thread before they start, which is the same claim).  Whether two threads then win again depends on
    what else the host runs: on a quiet host the worker goes back to two for good, beside another engineer's
    load one thread stays faster and it rightly stays there.  So the test waits for what holds on any host: a
    batch on two threads again (a probe, due within the governor's longest probe interval, or the switch
    back), seen as two cores held in the cores ledger the worker takes its threads from (the harness gives
    the test's workers a ledger of their own).  Which count wins is the governor's unit tests' (test_threads.py).
    """
    worker = worker_with_traffic
    log = worker.log_path.read_text
    stop = multiprocessing.Event()
    neighbours = [multiprocessing.Process(target=busy_loop, args=(stop,)) for _ in range(2)]
    for process in neighbours:
        process.start()
    try:
        wait_until(lambda: "torch threads now 1" in log(), SWITCH_TIMEOUT_S,
                   "the worker to drop to one torch thread next to two busy processes", worker.log)
    finally:
        stop.set()
        for process in neighbours:
            process.join(10)
    seen, done = threading.Event(), threading.Event()
    reader = threading.Thread(target=ran_on_two_cores, args=(log_dir / "cores", seen, done))
    reader.start()
    try:
        wait_until(seen.is_set, SWITCH_TIMEOUT_S, "a batch on two torch threads once the neighbours stopped",
                   worker.log)
    finally:
        done.set()
        reader.join()
    back = "torch threads back to 2" in log()
    print(f"\nonce the neighbours stopped: {'back to two threads' if back else 'a probe of two threads'}")
