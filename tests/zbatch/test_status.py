"""zbatch-status against a real broker, run the way an operator runs it: as a separate process."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from tests.daemons import ROOT, Daemon, free_port, start_broker
from zbatch.tools.status import Sample, render


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    daemon = start_broker(tmp_path_factory.mktemp("status"), models=("m",))
    yield daemon
    daemon.stop()


def status(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "zbatch.tools.status", *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=30, env={"PYTHONPATH": str(ROOT)} | (env or {}), check=False)


def test_json_prints_the_raw_statistics(broker: Daemon) -> None:
    result = status("--json", "--frontend", broker.frontend)
    assert result.returncode == 0, result.stderr
    stats = json.loads(result.stdout)
    assert stats["models"]["m"]["backlog_items"] == 0 and stats["workers"] == []


def test_once_prints_one_frame_with_the_model(broker: Daemon) -> None:
    result = status("--once", "--frontend", broker.frontend)
    assert result.returncode == 0, result.stderr
    assert "\x1b[" not in result.stdout, "no screen clearing when stdout is not a terminal"
    model_line = next(line for line in result.stdout.splitlines() if line.startswith("m "))
    assert model_line.split() == ["m", "0", "0", "0", "-", "-", "0.00"]


def test_frontend_comes_from_the_environment_too(broker: Daemon) -> None:
    result = status("--once", env={"ZBATCH_FRONTEND": broker.frontend})
    assert result.returncode == 0 and broker.frontend in result.stdout, result.stderr


def test_a_broker_that_does_not_answer_exits_1_quickly() -> None:
    started = time.monotonic()
    result = status("--once", "--frontend", f"tcp://127.0.0.1:{free_port()}")
    assert result.returncode == 1
    assert result.stderr.count("\n") == 1 and "zbatch-status:" in result.stderr, result.stderr
    assert time.monotonic() - started < 10


def test_rates_come_from_the_difference_between_refreshes() -> None:
    def stats(total_ok: int, overloaded: int) -> dict[str, object]:
        model = {"backlog_items": 3, "workers": 1, "free_credit": 60, "mean_batch_size": 4.5,
                 "requests": {"ok": total_ok, "overloaded": overloaded}}
        worker = {"identity": "7731", "name": "w1", "host": "gpu-host", "pid": 42, "device": "cuda:0",
                  "models": ["m"], "free_credit": 60, "in_flight": 4, "draining": False, "last_seen_s": 0.3,
                  "batches": {"m": {"batches": 7, "items": 30, "cancelled": 0, "expired": 0}}}
        return {"uptime_s": 3725.0, "draining": False, "models": {"m": model}, "workers": [worker]}

    frame = render("tcp://b:5555", Sample(12.0, stats(110, 8)), Sample(10.0, stats(100, 2)))
    lines = frame.splitlines()
    assert lines[0] == "zbatch broker tcp://b:5555  up 1h02m05s"
    assert next(line for line in lines if line.startswith("m ")).split() == ["m", "3", "1", "60", "8.0", "3.0",
                                                                             "4.50"]
    worker_line = next(line for line in lines if line.startswith("7731"))
    assert worker_line.split() == ["7731", "w1", "gpu-host", "42", "cuda:0", "m", "60", "4", "7", "0.3s",
                                   "ago", "serving"]


def test_help_lists_the_modes() -> None:
    result = status("--help")
    assert result.returncode == 0 and "--once" in result.stdout and "--json" in result.stdout


def test_several_brokers_get_a_frame_each_and_a_silent_one_says_so(broker: Daemon) -> None:
    silent = f"tcp://127.0.0.1:{free_port()}"
    result = status("--once", "--frontend", f"{broker.frontend},{silent}")
    assert result.returncode == 0, result.stderr
    assert f"zbatch broker {broker.frontend}  up" in result.stdout
    assert f"zbatch broker {silent}  NOT ANSWERING" in result.stdout
    merged = json.loads(status("--json", "--frontend", f"{broker.frontend},{silent}").stdout)
    assert merged["models"]["m"]["backlog_items"] == 0
    assert set(merged["brokers"]) == {broker.frontend, silent} and "error" in merged["brokers"][silent]
