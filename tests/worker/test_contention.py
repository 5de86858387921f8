"""A real worker (2 torch threads, the default model on torch) next to real busy processes drops to one thread,
and tries two again once they stop.

The neighbours are plain Python busy loops in their own processes: the same
pressure the gateway, the broker and a load generator put on the cores in a
retry storm.  The test waits on the worker's log lines and on the cores ledger
it holds its threads in, never on a sleep.
"""

from __future__ import annotations

import json
import multiprocessing
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.daemons import Daemon, DaemonFailure, running_stack, wait_until
from tests.worker.ledgers import sampling
from worker.runners import DEFAULT_MODEL_NAME
from zbatch.client import Client

if TYPE_CHECKING:
    from multiprocessing.synchronize import Event

SWITCH_TIMEOUT_S = 120.0
TEXTS = [f"sentence number {i} has a few more words " * (1 + i % 6) for i in range(16)]


def busy_loop(stop: Event) -> None:
    while not stop.is_set():
        sum(range(10_000))


BUSIER = 7.0  # how much slower than this host's a kept calibration says batches are (seen on a nightly run)
OWN_CALIBRATION = "calibrated at its start"
BUSY_CALIBRATION = "a calibration kept from a busier host"


def plant_busy_calibration(cache: Path, log_dir: Path, settings: dict[str, object]) -> None:
    """Start the worker once to write its calibration record, then make the record one made on a busier host.

    A fault planted by hand (named so): the record's batches cost BUSIER times what they cost here, and its short
    pass is one no start beats, so the next start keeps it, as every start on a host never quieter than the
    record's does. Made for real, it takes a host that is busy at every start and quiet later."""
    (log_dir / "first-start").mkdir()
    with running_stack(log_dir / "first-start", workers=1, gateway=False, worker=settings):
        pass
    records = list((cache / "calibrations").glob("*.json"))
    assert records, f"the worker's start kept no calibration in {cache}"
    for path in records:
        record = json.loads(path.read_text())
        record["seconds_per_token"] *= BUSIER
        record["short_seconds"] = 1e-9
        path.write_text(json.dumps(record))


@pytest.fixture
def worker_with_traffic(log_dir: Path, request: pytest.FixtureRequest) -> Iterator[Daemon]:
    """One worker with 2 torch threads, kept busy with batches of 16 texts from a client thread."""
    # torch: its 2-thread pass stalls whenever a thread loses its core, which is what the governor answers.
    # ONNX Runtime's sleeping threads degrade otherwise (issue 34; BENCHMARKS.md, Analysis, ONNX Runtime).
    # A start cache of its own: the worker calibrates at its start, so the governor's "quiet host" is the host as
    # it is before the test's busy processes (the run's shared record may come from a start on a busier host,
    # and next to it a contended batch would not even look slow: BUSY_CALIBRATION, where the governor must see it
    # from the quiet batches it ran before the busy processes came).
    cache = log_dir / "start-cache"
    settings: dict[str, object] = {"workers": 1, "torch_threads": 2, "runtime": "torch", "onnx_cache": str(cache)}
    planted = request.param == BUSY_CALIBRATION
    if planted:
        plant_busy_calibration(cache, log_dir, settings)
    with running_stack(log_dir, workers=1, gateway=False, worker=settings) as daemons:
        stop = threading.Event()

        def send() -> None:
            with Client(daemons["broker"].frontend) as client:
                while not stop.is_set():
                    client.infer(DEFAULT_MODEL_NAME, TEXTS)

        sender = threading.Thread(target=send, daemon=True)
        sender.start()
        worker = daemons["w1"]
        try:
            if planted:  # kept by the start, then seen through by the quiet batches before the busy processes
                assert "s (from the cache)" in worker.log_path.read_text(), worker.log()
                wait_until(lambda: "calibration ran on a busier host" in worker.log_path.read_text(),
                           SWITCH_TIMEOUT_S, "the worker's quiet batches to show its kept calibration came from a "
                           "busier host", worker.log)
            yield worker
        finally:
            stop.set()
            sender.join(30)


def ran_on(cores: int, samples: list[dict[int, int]]) -> bool:
    """A batch ran on ``cores`` cores (the test's worker is alone in its ledger: it holds what the governor chose)."""
    return any(cores in held.values() for held in samples)


@pytest.mark.parametrize("worker_with_traffic", [OWN_CALIBRATION, BUSY_CALIBRATION], indirect=True)
def test_busy_neighbours_move_the_worker_to_one_thread_and_it_tries_two_again(worker_with_traffic: Daemon,
                                                                               log_dir: Path) -> None:
    """Two busy processes of the test's own move the worker to one thread; once they stop, it runs a batch on two
    threads again.

    Bounded: the drop depends on the test's two busy processes alone (on a host already busy, the worker may be on
    one thread before they start, which is the same claim). On a host far busier than that (the nightly neighbour's
    stack, its busy loops and the suite's other process beside these two), two threads get twice one thread's share
    of the cores and one thread may rightly never win: the worker must then at least have tried one, a batch seen on
    one core. Whether two threads then win again depends on what else the host runs: on a quiet host the worker goes
    back to two for good, beside another engineer's load one thread stays faster and it rightly stays there. So the
    test waits for what holds on any host: a batch on two threads again (a probe, due within the governor's longest
    probe interval, or the switch back), seen as two cores held in the cores ledger the worker takes its threads
    from (the harness gives the test's workers a ledger of their own). Which count wins is the governor's unit
    tests' (test_threads.py).
    """
    worker = worker_with_traffic
    log = worker.log_path.read_text
    stop = multiprocessing.Event()
    neighbours = [multiprocessing.Process(target=busy_loop, args=(stop,)) for _ in range(2)]
    for process in neighbours:
        process.start()
    try:
        with sampling(log_dir / "cores") as samples:
            try:
                wait_until(lambda: "torch threads now 1" in log(), SWITCH_TIMEOUT_S,
                           "the worker to drop to one torch thread next to two busy processes", worker.log)
                print("\nnext to two busy processes: dropped to one thread")
            except DaemonFailure:
                assert ran_on(1, samples), f"no batch on one thread next to two busy processes\n{worker.log()}"
                print("\nnext to two busy processes: one thread tried, and two stayed faster on this busy host")
    finally:
        stop.set()
        for process in neighbours:
            process.join(10)
    with sampling(log_dir / "cores") as samples:
        wait_until(lambda: ran_on(2, samples), SWITCH_TIMEOUT_S,
                   "a batch on two torch threads once the neighbours stopped", worker.log)
    back = "torch threads back to 2" in log()
    print(f"\nonce the neighbours stopped: {'back to two threads' if back else 'a probe of two threads'}")
