"""A real worker (2 torch threads, the default model on torch) next to real busy processes drops to one thread,
and back.

The neighbours are plain Python busy loops in their own processes: the same
pressure the gateway, the broker and a load generator put on the cores in a
retry storm.  The test waits on the worker's log lines, never on a sleep.
"""

from __future__ import annotations

import multiprocessing
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.daemons import Daemon, running_stack, wait_until
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


def test_busy_neighbours_move_the_worker_to_one_thread_and_back(worker_with_traffic: Daemon) -> None:
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
    wait_until(lambda: "torch threads back to 2" in log(), SWITCH_TIMEOUT_S,
               "the worker to go back to two torch threads once the neighbours stopped", worker.log)
