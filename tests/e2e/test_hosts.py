"""Two brokers, active-active, on real hosts: network namespaces on one bridge, faults under steady load.

Hosts (tests/hosts.py): ``client`` (the load and the test's own probes),
``gateway``, ``broker1``, ``broker2``, ``worker1``, ``worker2``, each in its
own network namespace with an address in 10.200.0.0/24.  The workers serve
the real default model and register with both brokers; the gateway lists
both brokers.  Faults: a broker SIGSTOPped then resumed, a worker host's
link down then up, a broker killed (``kill -9``) then restarted, and 64
simulated workers (scripts/benchmarks/systems/echo_worker.py, a sleeping model)
spread over both brokers.  The fleet is shared by the tests, in order; each
test leaves it whole.  Each test prints its figures (``-s``): detection
and rejoin times, requests sent and answered.

The gateway's broker client keeps its default liveness (1,000 ms x 3).
"""

from __future__ import annotations

import json
import re
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gateway.server import PROCESS_HEADER
from tests.daemons import Daemon, Daemons, http_json
from tests.hosts import Host, Network, unavailable
from tests.load import Load
from worker.runners import DEFAULT_MODEL_NAME

REASON = unavailable()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"no test hosts: {REASON}")

MODEL = DEFAULT_MODEL_NAME
ROLES = ("client", "gateway", "broker1", "broker2", "worker1", "worker2")
HEARTBEAT: dict[str, Any] = {"heartbeat_ms": 500, "heartbeat_liveness": 3}
CLIENT_LIVENESS_S = 3.0  # the gateway's broker client: 1,000 ms x 3
# What the gateway says of a broker it gave up (zbatch/client/brokers.py): when, and the silence it measured then.
GIVEN_UP = re.compile(r"given up (\d+\.\d+) s ago, after (\d+\.\d+) s without an answer to heartbeats")
ROUNDED_S = 0.01  # the gateway's figures for a broker it gave up are rounded to this
START_S = 180.0
FRONTEND, BACKEND, HTTP = 5555, 5556, 8000


def report(name: str, **figures: Any) -> None:
    print(f"\nFIGURES {name}: {json.dumps(figures, default=str)}")


class Fleet:
    """The daemons on the hosts, and what the tests ask of them (always from the client host)."""

    def __init__(self, network: Network, daemons: Daemons) -> None:
        self.net = network
        self.daemons = daemons
        self.client: Host = network["client"]
        self.brokers = [network["broker1"], network["broker2"]]
        self.frontends = ",".join(host.endpoint(FRONTEND) for host in self.brokers)
        self.backends = ",".join(host.endpoint(BACKEND) for host in self.brokers)
        self.url = network["gateway"].url(HTTP)

    def start(self) -> None:
        for index in (1, 2):
            self.start_broker(index, wait=False)
        for index in (1, 2):
            self.wait_for_broker(index)
        for index in (1, 2):
            host = self.net[f"worker{index}"]
            self.daemons.add(host.spawn("worker", f"worker{index}", self.daemons.log_dir, backend=self.backends,
                                        name=f"worker{index}", workers=2, **HEARTBEAT))
        self.daemons.wait(self.workers_everywhere, "both workers on both brokers", START_S)
        gateway = self.net["gateway"]
        self.daemons.add(gateway.spawn("gateway", "gateway", self.daemons.log_dir, host=gateway.address, port=HTTP,
                                       frontend=self.frontends))
        self.daemons.wait(lambda: self.client.http_status(self.url + "/readyz") == 200, "the gateway", START_S)

    def start_broker(self, index: int, *, wait: bool = True, name: str = "") -> Daemon:
        host = self.brokers[index - 1]
        name = name or f"broker{index}"
        self.daemons.pop(name, None)
        daemon = self.daemons.add(host.spawn("broker", name, self.daemons.log_dir, frontend=host.endpoint(FRONTEND),
                                             backend=host.endpoint(BACKEND), **HEARTBEAT))
        if wait:
            self.wait_for_broker(index)
        return daemon

    def broker(self, index: int) -> Daemon:
        return self.daemons[f"broker{index}"]

    def wait_for_broker(self, index: int) -> None:
        self.daemons.wait(lambda: self.stats(index) is not None, f"broker{index} to answer", START_S)

    def stats(self, index: int) -> dict[str, Any] | None:
        return self.client.stats(self.brokers[index - 1].endpoint(FRONTEND))

    def worker_names(self, index: int) -> set[str]:
        stats = self.stats(index) or {"workers": []}
        return {worker["name"] for worker in stats["workers"]}

    def workers_everywhere(self) -> bool:
        return all(self.worker_names(index) >= {"worker1", "worker2"} for index in (1, 2))

    def answered_ok(self, index: int) -> int:
        stats = self.stats(index) or {"models": {}}
        return int(stats["models"].get(MODEL, {}).get("requests", {}).get("ok", 0))

    def removals(self, index: int) -> int:
        stats = self.stats(index) or {"worker_removals": {}}
        return sum(stats["worker_removals"].values())

    def readiness(self) -> dict[str, str]:
        """What the gateway's /readyz says of each broker."""
        return self.readiness_from()[0]

    def readiness_from(self) -> tuple[dict[str, str], str]:
        """What the gateway's /readyz says of each broker, and which of its processes said it (its pid)."""
        status, headers, body = self.client.call(http_json, self.url + "/readyz")
        process = {name.lower(): value for name, value in headers.items()}.get(PROCESS_HEADER.lower(), "")
        return (dict(body.get("brokers", {})) if status == 200 else {"error": json.dumps(body)}), process

    def verdict(self, index: int) -> str:
        return self.verdict_from(index)[0]

    def verdict_from(self, index: int) -> tuple[str, str]:
        """What the gateway's /readyz says of broker ``index``, and which gateway process said it."""
        verdicts, process = self.readiness_from()
        return verdicts.get(self.brokers[index - 1].endpoint(FRONTEND), ""), process

    def load(self, concurrency: int = 8, model: str = MODEL) -> Load:
        return Load(f"{self.url}/models/{model}", concurrency, enter=self.client.enter)

    def whole(self) -> None:
        """Every daemon up, both workers registered with both brokers, the gateway ready with both."""
        self.daemons.wait(lambda: self.workers_everywhere() and set(self.readiness().values()) == {"ready"},
                          "the fleet to be whole", 60)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    log_dir = tmp_path_factory.mktemp("hosts")
    with Network(ROLES) as network, Daemons(log_dir) as daemons:
        started = Fleet(network, daemons)
        started.start()
        yield started


def since(start: float) -> float:
    return round(time.monotonic() - start, 2)


def more_successes(load: Load, count: int) -> Callable[[], bool]:
    before = load.successes()
    return lambda: load.successes() >= before + count


def test_a_stopped_broker_is_given_up_within_liveness_and_rejoins_when_resumed(fleet: Fleet) -> None:
    """What detection takes, and what bounds it.

    Each gateway process keeps its own liveness: it gives broker1 up once it has read nothing from it for
    heartbeat_ms x liveness (3 s), counted from the last message it read (an answer, or for a process with
    nothing in flight there, a heartbeat's answer, up to one interval (1 s) before the stop), or from its
    first request if it had none before (its broker client starts reading, and counting, then).  It notices
    on its event loop's timer, which runs late while a busy host keeps the loop from running; it reports the
    silence it measured when it gave broker1 up (liveness plus that lateness) and how long ago that was, so
    the test asserts that the liveness rule gave it up, never earlier, without a margin for the lateness.

    What it must not do is hear from broker1 after the stop.  A busy host moves the stop and the last read
    apart by more than any fixed margin, so the test measures both ends instead.  The stop: when every
    thread of broker1 (its ZeroMQ I/O threads too) is seen stopped, not when the test meant to send the
    signal, which a starved test process sends late.  The last read: the gateway process may read what
    broker1 sent before the stop late, while the host keeps it from running, or start counting at its first
    request after the stop; either way it has done so by the time it answers a request that came after the
    stop (its loop reads its broker sockets on every pass, and each STATS it sends looks for input).  Every
    /readyz poll starts after the stop, so a process's first answer to one bounds its last read from
    broker1 (when it gave up, less the silence); a silence that started later heard something broker1 did
    not send.  The test holds every gateway process its polls reach to both rules.

    The test's own view of detection comes later still and is reported, not asserted: a /readyz poll
    through the same loaded gateway (one that started before the death waits for broker1's STATS until the
    death fails it, or for the 1 s the gateway gives that probe), and 50 ms between polls.
    """
    fleet.whole()
    with fleet.load() as load:
        fleet.daemons.wait(more_successes(load, 30), "load to flow", 60)
        expired = fleet.removals(1)
        stopped_at = stop_broker(fleet, 1)
        try:
            giving_up = GivingUp(fleet, 1)
            gave_up = fleet.daemons.wait(giving_up, "every gateway process to give broker1 up", 20)
            detected_s = round(giving_up.detected_at - stopped_at, 2)
            fleet.daemons.wait(more_successes(load, 40), "broker2 to carry the load", 60)
        finally:
            fleet.broker(1).signal(signal.SIGCONT)
        resumed_at = time.monotonic()
        # Resumed, broker1 expires the workers it last heard of long ago; they register again.
        fleet.daemons.wait(lambda: fleet.removals(1) >= expired + 2 and fleet.workers_everywhere()
                           and fleet.verdict(1) == "ready", "broker1 to rejoin with both workers", 60)
        rejoined_s = since(resumed_at)
        served = fleet.answered_ok(1)
        fleet.daemons.wait(lambda: fleet.answered_ok(1) >= served + 20, "broker1 to serve again", 60)
        serving_s = since(resumed_at)
        load.stop()
        summary = load.summary()
    report("broker SIGSTOP", stopped_s=round(resumed_at - stopped_at, 2), detected_s=detected_s, processes={
        process: {"given_up_s": round(g.at - stopped_at, 2), "silence_s": g.silence_s, "lateness_s":
                  round(g.silence_s - CLIENT_LIVENESS_S, 2), "last_read_s": round(g.at - g.silence_s - stopped_at, 2),
                  "read_by_s": round(g.read_by - stopped_at, 2)} for process, g in gave_up.items()},
        rejoined_s=rejoined_s, serving_again_s=serving_s, **summary)
    for process, g in gave_up.items():
        assert g.silence_s >= CLIENT_LIVENESS_S, process  # the liveness rule gave it up, never earlier
        assert g.at - g.silence_s <= g.read_by + ROUNDED_S, process  # silent since then: nothing heard after the stop
    assert summary["answered"] == summary["sent"] == summary["ok"]


def stop_broker(fleet: Fleet, index: int) -> float:
    """SIGSTOP broker ``index``; the time every one of its threads was seen stopped, after which it sends nothing."""
    broker = fleet.broker(index)
    broker.signal(signal.SIGSTOP)
    fleet.daemons.wait(lambda: threads_stopped(broker.process.pid), f"broker{index}'s threads to stop", 10)
    return time.monotonic()


def threads_stopped(pid: int) -> bool:
    """Whether every thread of process ``pid`` is stopped (state T in /proc)."""
    states = []
    for stat in Path("/proc", str(pid), "task").glob("*/stat"):
        try:
            states.append(stat.read_text().rsplit(")", 1)[1].split()[0])
        except FileNotFoundError:  # a thread that ended meanwhile
            continue
    return bool(states) and all(state == "T" for state in states)


@dataclass(frozen=True)
class GaveUp:
    """A gateway process found having given a broker up: when (at the earliest, on the test's clock), after
    what silence, and when the process first answered a poll after the stop."""

    at: float
    silence_s: float
    read_by: float


class GivingUp:
    """A wait's condition: every gateway process that /readyz reached has been found having given broker
    ``index`` up already; then each one's :class:`GaveUp`, by process.

    A poll whose STATS the death failed says "0.00 s ago" of a death somewhere within the poll; one that
    finds it given up already dates it to within that poll, from when it started.  Every poll starts after
    the stop.
    """

    def __init__(self, fleet: Fleet, index: int) -> None:
        self.fleet, self.index = fleet, index
        self.detected_at = 0.0  # when the test first saw a verdict of giving up
        self.first_answer: dict[str, float] = {}
        self.found: dict[str, GaveUp] = {}

    def __call__(self) -> dict[str, GaveUp]:
        polled_at = time.monotonic()
        verdict, process = self.fleet.verdict_from(self.index)
        answered_at = time.monotonic()
        self.first_answer.setdefault(process, answered_at)
        found = GIVEN_UP.search(verdict)
        if found is not None:
            self.detected_at = self.detected_at or answered_at
            ago_s = float(found[1])
            if ago_s > 0 and process not in self.found:
                self.found[process] = GaveUp(polled_at - ago_s, float(found[2]), self.first_answer[process])
        return self.found if self.found.keys() == self.first_answer.keys() else {}


def test_a_worker_host_cut_off_loses_nothing_and_rejoins_when_its_link_is_back(fleet: Fleet) -> None:
    fleet.whole()
    worker1 = fleet.net["worker1"]
    with fleet.load() as load:
        fleet.daemons.wait(more_successes(load, 30), "load to flow", 60)
        down_at = time.monotonic()
        worker1.link(up=False)
        try:
            fleet.daemons.wait(lambda: all("worker1" not in fleet.worker_names(i) for i in (1, 2)),
                               "both brokers to give worker1 up", 20)
            detected_s = since(down_at)
            fleet.daemons.wait(more_successes(load, 40), "worker2 to carry the load", 60)
        finally:
            worker1.link(up=True)
        up_at = time.monotonic()
        fleet.daemons.wait(fleet.workers_everywhere, "worker1 to register with both brokers again", 60)
        rejoined_s = since(up_at)
        batched = worker_items(fleet, "worker1")
        fleet.daemons.wait(lambda: worker_items(fleet, "worker1") >= batched + 10, "worker1 to serve again", 60)
        serving_s = since(up_at)
        load.stop()
        summary = load.summary()
    report("worker link down", down_s=round(up_at - down_at, 2), detected_s=detected_s, rejoined_s=rejoined_s,
           serving_again_s=serving_s, **summary)
    assert summary["answered"] == summary["sent"] == summary["ok"]


def worker_items(fleet: Fleet, name: str) -> int:
    """Items ``name`` has batched, as its heartbeats told the brokers (the same totals to each)."""
    counts = [0]
    for index in (1, 2):
        for worker in (fleet.stats(index) or {"workers": []})["workers"]:
            if worker["name"] == name:
                counts.append(sum(c["items"] for c in worker["batches"].values()))
    return max(counts)


def test_kill_9_of_a_broker_answers_every_request_and_a_restarted_one_rejoins(fleet: Fleet) -> None:
    fleet.whole()
    with fleet.load() as load:
        fleet.daemons.wait(more_successes(load, 30), "load to flow", 60)
        killed_at = time.monotonic()
        fleet.broker(1).process.kill()
        fleet.broker(1).process.wait()
        fleet.daemons.pop("broker1")
        fleet.daemons.wait(lambda: "heartbeats" in fleet.verdict(1), "the gateway to give broker1 up", 20)
        detected_s = since(killed_at)
        fleet.daemons.wait(more_successes(load, 40), "broker2 to carry the load", 60)
        restarted_at = time.monotonic()
        fleet.start_broker(1)
        fleet.daemons.wait(lambda: fleet.verdict(1) == "ready", "the restarted broker1 to rejoin", 60)
        rejoined_s = since(restarted_at)
        served = fleet.answered_ok(1)
        fleet.daemons.wait(lambda: fleet.answered_ok(1) >= served + 20, "broker1 to serve again", 60)
        serving_s = since(restarted_at)
        load.stop()
        summary = load.summary()
    report("broker kill -9", detected_s=detected_s, rejoined_s=rejoined_s, serving_again_s=serving_s, **summary)
    assert summary["answered"] == summary["sent"] == summary["ok"]


def test_64_simulated_workers_over_two_brokers_share_the_load_evenly(fleet: Fleet) -> None:
    fleet.whole()
    model, per_host = "simulated", 32
    for index in (1, 2):
        host = fleet.net[f"worker{index}"]
        fleet.daemons.add(host.spawn("scripts.benchmarks.systems.echo_worker", f"sim{index}", fleet.daemons.log_dir,
                                     "broker", backend=fleet.backends, name=f"sim{index}", count=per_host,
                                     model=model, batch_ms=20, capacity=4, max_batch=4, outputs="vector"))
    try:
        fleet.daemons.wait(lambda: len(simulated(fleet)) == 2 * per_host, "64 simulated workers", START_S)
        with fleet.load(32, model) as load:
            fleet.daemons.wait(lambda: load.successes() >= 1280, "1,280 answers", 120)
            load.stop()
            summary = load.summary()
        items = fleet.daemons.wait(lambda: counted(fleet, summary["ok"]), "the workers' heartbeats to count "
                                   "every answer", 30)
    finally:
        for index in (1, 2):
            fleet.daemons.pop(f"sim{index}").stop()
    per_broker = {f"broker{i}": sum(1 for name in items if int(name.split("-")[1]) % 2 == i - 1) for i in (1, 2)}
    spread = round(max(items.values()) / max(1, min(items.values())), 2)
    report("64 simulated workers", workers=len(items), per_broker=per_broker, least=min(items.values()),
           most=max(items.values()), most_over_least=spread, **summary)
    assert summary["answered"] == summary["sent"] == summary["ok"]
    assert spread <= 1.5


def simulated(fleet: Fleet) -> dict[str, int]:
    """Items each simulated worker has run, by name, from both brokers' statistics."""
    items: dict[str, int] = {}
    for index in (1, 2):
        for worker in (fleet.stats(index) or {"workers": []})["workers"]:
            if worker["name"].startswith("sim"):
                items[worker["name"]] = sum(c["items"] for c in worker["batches"].values())
    return items


def counted(fleet: Fleet, answered: int) -> dict[str, int]:
    """The items of each simulated worker once they add up to ``answered``; empty until then."""
    items = simulated(fleet)
    return items if sum(items.values()) >= answered and len(items) == 64 else {}


def test_the_hosts_are_cleaned_up_by_the_network_itself() -> None:
    roles = ("a", "b")
    with Network(roles) as network:
        names = [network[role].netns for role in roles]
        assert all(Path("/run/netns", name).exists() for name in names)
    assert not any(Path("/run/netns", name).exists() for name in names)
