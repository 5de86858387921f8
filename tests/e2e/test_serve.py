"""``zbatch serve`` (what scripts/serve runs) under load: a worker killed, or stopped from outside, is restarted
while every request is answered; SIGTERM stops the gateway, the workers and the broker in that order.

The real stack and the real default model: ``python -m zbatch serve`` with its defaults (two workers, the
gateway with its default processes) on free ports, 16 closed-loop clients (tests/load.py).  What each test
measured is printed (``pytest -s`` shows it).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from tests.daemons import Daemon, broker_stats, http_status, wait_until
from tests.load import Load
from worker.runners import DEFAULT_MODEL_NAME, default_model_path
from zbatch.testing import START_TIMEOUT_S, spawn_serve

CLIENTS = 16


@dataclass
class Served:
    """A running ``zbatch serve`` and where it serves."""

    daemon: Daemon
    url: str
    frontend: str

    def log(self) -> str:
        return self.daemon.log_path.read_text(errors="replace")

    def workers(self) -> dict[str, dict[str, Any]]:
        """The broker's workers by name (each with its pid and batches)."""
        self.daemon.check()
        stats = broker_stats(self.frontend) or {"workers": []}
        return {worker["name"]: worker for worker in stats["workers"]}


def serve(log_dir: Path, *args: str, env: dict[str, str] | None = None, **settings: Any) -> Served:
    daemon = spawn_serve(log_dir, "zbatch-serve", *args, env=env, **settings)
    return Served(daemon, daemon.url, daemon.frontend)


def wait_for_log(served: Served, pattern: str, what: str, timeout_s: float = START_TIMEOUT_S) -> re.Match[str]:
    def found() -> re.Match[str] | None:
        served.daemon.check()
        return re.search(pattern, served.log())

    return wait_until(found, timeout_s, what, served.daemon.log)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    served = serve(tmp_path_factory.mktemp("serve"))
    try:
        wait_for_log(served, r"serving on http://", "the stack to serve")
        yield served
    finally:
        served.daemon.stop(120)


def lose_a_worker(served: Served, name: str, how: signal.Signals) -> dict[str, Any]:
    """Under load, end worker ``name`` with ``how``; returns what happened once it serves again."""
    victim = served.workers()[name]["pid"]
    with Load(f"{served.url}/models/{DEFAULT_MODEL_NAME}", concurrency=CLIENTS) as load:
        wait_until(lambda: load.successes() >= 100, 60, "the load to run", served.daemon.log)
        signalled = time.monotonic()
        os.kill(victim, how)

        def back() -> bool:
            worker = served.workers().get(name)
            return worker is not None and worker["pid"] != victim and bool(worker["batches"])

        wait_until(back, START_TIMEOUT_S, f"{name} to serve again", served.daemon.log)
        serving_again_s = time.monotonic() - signalled
        answered = load.successes()
        wait_until(lambda: load.successes() >= answered + 100, 60, "more answers", served.daemon.log)
    summary = load.summary()
    result = {"how": how.name, "sent": summary["sent"], "answered": summary["answered"],
              "by_code": summary["by_code"], "serving_again_s": round(serving_again_s, 1), "victim": victim}
    print(f"\n{name} ended with {how.name} under {CLIENTS} clients: {result}")
    return result


def test_the_workers_share_the_hosts_cores_through_the_default_ledger(served: Served) -> None:
    """As shipped, the workers take their cores from the host's ledger: a lone request gets them all."""
    shared = re.findall(r"zbatch-worker\[\d+\] zbatch.worker: sharing this host's \d+ cores with its other "
                        r"workers \(cores ledger /dev/shm/zbatch-cores-\d+\)", served.log())
    assert len(shared) >= 2, served.log()


def test_a_killed_worker_is_restarted_and_no_request_is_lost(served: Served) -> None:
    result = lose_a_worker(served, "worker-0", signal.SIGKILL)
    assert result["by_code"] == {"ok": result["answered"]}, result
    assert result["answered"] == result["sent"]
    log = served.log()
    assert re.search(rf"worker-0 \(pid {result['victim']}\) exited unexpectedly with signal SIGKILL after [\d.]+ s "
                     r"\(1 exit in a row\): restarting in 1\.0 s", log), log
    back = wait_until(lambda: re.search(r"worker-0 \(pid \d+\) is ready again, ([\d.]+) s after it exited",
                                        served.log()), 30, "the supervisor to log worker-0 ready", served.daemon.log)
    print(f"worker-0 ready again {back.group(1)} s after it exited (the supervisor's log)")


def test_a_worker_stopped_from_outside_drains_and_is_restarted_too(served: Served) -> None:
    result = lose_a_worker(served, "worker-1", signal.SIGTERM)
    assert result["by_code"] == {"ok": result["answered"]}, result
    assert result["answered"] == result["sent"]
    log = served.log()
    assert re.search(rf"worker-1 \(pid {result['victim']}\) exited unexpectedly with status 0 after [\d.]+ s "
                     r"\(1 exit in a row\): restarting in 1\.0 s", log), log
    assert re.search(rf"zbatch-worker\[{result['victim']}\] zbatch.worker: draining", log), "it drained"


def stamp(line: str) -> float:
    return datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()


def test_sigterm_stops_the_gateway_then_the_workers_then_the_broker(served: Served) -> None:
    served.daemon.signal(signal.SIGTERM)
    assert served.daemon.process.wait(120) == 0, served.daemon.log()
    lines = served.log().splitlines()
    lines = lines[next(i for i, line in enumerate(lines) if "SIGTERM: stopping in order" in line):]

    def when(pattern: str) -> list[float]:
        return [stamp(line) for line in lines if re.search(pattern, line)]

    stopped = {name: when(rf"zbatch-serve\[\d+\] zbatch.serve: {name} \(pid \d+\) stopped with status 0")
               for name in ("gateway", "worker-0", "worker-1", "broker")}
    assert all(len(times) == 1 for times in stopped.values()), "\n".join(lines[-40:])
    [gateway], [worker_0], [worker_1], [broker] = stopped.values()
    [workers_asked, _] = when(r"stopping worker-")
    [broker_asked] = when(r"stopping broker")
    assert gateway <= workers_asked and max(worker_0, worker_1) <= broker_asked <= broker
    # The daemons' own last lines, in the same order.
    own = {daemon: when(rf"{daemon}\[\d+\] \S+: {daemon} stopped")
           for daemon in ("zbatch-gateway", "zbatch-worker", "zbatch-broker")}
    assert max(own["zbatch-gateway"]) <= min(own["zbatch-worker"])
    assert max(own["zbatch-worker"]) <= min(own["zbatch-broker"])
    assert not any("killing" in line for line in lines), "each stopped within its drain time"
    print(f"\nstopped in {broker - when('SIGTERM: stopping in order')[0]:.1f} s: gateway, workers, broker")


def test_a_worker_that_cannot_start_is_restarted_with_growing_delays(log_dir: Path) -> None:
    """A model folder whose weights are not there yet (still being copied, say): the worker fails to load it
    and exits 1, which a later start may not, so it is restarted (a missing folder is exit 78: test_hub_models)."""
    partial = log_dir / "being-copied"
    partial.mkdir()
    shutil.copy(Path(default_model_path()) / "config.json", partial)
    served = serve(log_dir, env={"ZBATCH_MODEL": str(partial)}, workers=1,
                   restart_delay_ms=200, restart_max_delay_ms=400)
    try:  # three restarts: the delay doubles, then stays at its cap (each start imports torch: a few CPU-s)
        wait_for_log(served, r"(?s:restarting in.*){3}", "three restarts of the worker", 180)
        log = served.log()
        delays = re.findall(r"worker-0 \(pid \d+\) exited unexpectedly with status 1 after [\d.]+ s "
                            r"\((\d+) exits? in a row\): restarting in ([\d.]+) s", log)
        assert delays[:3] == [("1", "0.2"), ("2", "0.4"), ("3", "0.4")], log
        assert log.count("zbatch-worker: error: ") >= 3, "the worker says why, each time"
        assert http_status(served.url + "/healthz") == 200, "the gateway keeps serving"
        assert log.count("started broker (pid") == 1 and log.count("started gateway (pid") == 1, "they keep running"
        assert "serving on" not in log, "the stack never served as a whole"
    finally:
        assert served.daemon.stop(60) == 0, served.daemon.log()


def test_brokers_derived_from_one_endpoint_each_answer_through_the_gateway(log_dir: Path) -> None:
    """``--brokers 2`` with one frontend and one backend endpoint: ``zbatch serve`` starts a second broker on each
    port + 2, gives the gateway and the worker both, and requests sent to the gateway are answered over each."""
    served = serve(log_dir, brokers=2, derive_ports=True, workers=1, processes=1)
    try:
        wait_for_log(served, r"serving on http://", "the stack to serve")
        log = served.log()
        assert "fronts: 2 brokers and 1 gateway process (brokers as set; gateway processes as set)" in log, log
        assert re.search(r"2 brokers, 1 worker and the gateway in 1 process are serving on http://", log), log
        frontends = served.frontend.split(",")

        def answered(frontend: str) -> int:
            stats = broker_stats(frontend) or {"models": {}}
            return int(stats["models"].get(DEFAULT_MODEL_NAME, {}).get("requests", {}).get("ok", 0))

        with Load(f"{served.url}/models/{DEFAULT_MODEL_NAME}", concurrency=4) as load:
            wait_until(lambda: all(answered(frontend) > 0 for frontend in frontends), START_TIMEOUT_S,
                       "answers over each broker", served.daemon.log)
        summary = load.summary()
        print(f"\n2 brokers from one endpoint: {summary['answered']} answered, by broker "
              f"{[answered(frontend) for frontend in frontends]}")
        assert summary["by_code"] == {"ok": summary["answered"]} and summary["answered"] == summary["sent"], summary
    finally:
        assert served.daemon.stop(120) == 0, served.daemon.log()
