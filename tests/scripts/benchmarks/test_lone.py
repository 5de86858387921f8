"""The lone request study's own logic: marks written by real processes, requests found among other marks, the table."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from scripts.benchmarks.common import marks
from scripts.benchmarks.load import lone
from scripts.benchmarks.load.lone_points import BETWEEN_REQUESTS, POINTS
from zbatch.testing import daemon_env

ZMQ = lone.labels("zmq")

SUBPROCESS_TIMEOUT_S = 120.0
PIDS = {"client": 10, "gateway": 10, "broker": 20, "worker": 30}  # over HTTP the gateway is the client
OTHER_WORKER = 31


def _request(start_ns: int, step_ns: int = 10_000, path: str = "zmq") -> list[marks.Mark]:
    """One whole request's marks over ``path``, ``step_ns`` apart, from ``start_ns``, each from its process."""
    return [(start_ns + index * step_ns, label, PIDS[lone.role(label)])
            for index, label in enumerate(lone.labels(path))]


def _times(request: list[marks.Mark]) -> list[int]:
    return [ns for ns, _, _ in request]


def test_a_request_is_found_among_other_processes_marks_and_one_left_incomplete() -> None:
    first = _request(0)
    unanswered = [(200_000, "client: sends", PIDS["client"]), (205_000, "broker: request in", PIDS["broker"])]
    second = _request(300_000, step_ns=20_000)
    noise = [(5_000, "broker: sends", PIDS["broker"]),  # a flush with nothing to send, before the request came in
             (35_000, "worker: request in", OTHER_WORKER),  # another worker's heartbeat, as the request travels
             (105_000, "worker: batch back", OTHER_WORKER)]
    whole, gaps = lone.timelines(sorted(first + unanswered + second + noise), ZMQ)
    assert whole == [_times(first), _times(second)]
    # From a whole request's answer to the next send; the request left incomplete starts no gap.
    assert gaps == [200_000 - first[-1][0]]


def test_a_process_other_than_the_request_s_cannot_finish_it() -> None:
    """Without the pids, another worker's marks would complete a request the first worker never answered."""
    request = _request(0)
    cut = ZMQ.index("worker: batch back")
    stolen = request[:cut] + [(ns, label, OTHER_WORKER if lone.role(label) == "worker" else pid)
                              for ns, label, pid in request[cut:]]
    assert lone.timelines(stolen, ZMQ) == ([], [])


def test_the_report_times_each_stage_from_the_marks_inside_its_window() -> None:
    marked = _request(0) + _request(1_000_000) + _request(5_000_000, step_ns=50_000)
    window = lone.Window("zmq", 0, 2_000_000, 1.5, 700.0)
    lines = lone.report("ZeroMQ", marked, window).splitlines()
    assert "2 of 2 requests marked whole" in lines[1]
    rows = [line for line in lines if line.startswith("| ") and not line.startswith("| stage")]
    # 16 stages of 10 µs, and 840 µs from the first answer (at 160 µs) to the second send (at 1,000 µs): the
    # third request and the gap before it lie outside the window.
    stages = lone.stages("zmq")
    assert len(rows) == len(stages) + 2 and len(stages) == 16
    assert rows[0] == f"| {stages[0]} | 10 | 10 | 1% |"
    assert rows[-2] == f"| {BETWEEN_REQUESTS['zmq']} | 840 | 840 | 84% |"
    assert rows[-1] == "| **one cycle, from a request to the next** | | **1,000** | |"


def test_over_http_a_request_runs_from_the_gateway_s_bytes_to_its_answer_written() -> None:
    """The gateway's own stages come first and last; its client's marks in between are the ZeroMQ path's."""
    http = lone.labels("http")
    assert http[0] == "gateway: bytes in" and http[-2:] == ("gateway: answer built", "gateway: answer written")
    assert http[1:-2] == ZMQ
    marked = _request(0, path="http") + _request(1_000_000, path="http")
    whole, gaps = lone.timelines(marked, http)
    assert len(whole) == 2 and gaps == [1_000_000 - marked[len(http) - 1][0]]
    assert lone.timelines(marked, ZMQ)[0] == [_times(marked[1:len(http) - 2]), _times(marked[len(http) + 1:-2])]


def test_a_window_without_a_whole_request_says_which_marks_it_saw() -> None:
    marked = [(10, "client: sends", PIDS["client"]), (20, "broker: request in", PIDS["broker"])]
    text = lone.report("HTTP", marked, lone.Window("http", 0, 100, None, 0))
    assert "no whole request" in text and "broker: request in" in text


def run_hooked(tmp_path: Path, points: str, code: str) -> tuple[subprocess.CompletedProcess[str], list[marks.Mark]]:
    """Run ``code`` in a real interpreter whose ``sitecustomize`` installs ``points`` (Python source of a list of
    Points) on a module ``sample_module`` (``work(value)`` doubles it); what it did, and the marks it wrote."""
    (tmp_path / "modules").mkdir()
    (tmp_path / "modules" / "sample_module.py").write_text("def work(value):\n    return value * 2\n")
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text("from scripts.benchmarks.common.marks import Point, install_at_import\n"
                                           f"install_at_import({points})\n")
    folder = tmp_path / "marks"
    folder.mkdir()
    env = marks.daemon_env(folder, hook)
    env["PYTHONPATH"] += f":{tmp_path / 'modules'}"
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=SUBPROCESS_TIMEOUT_S)
    return done, marks.read_marks(folder)


def test_a_process_started_with_the_hook_marks_a_module_it_imports(tmp_path: Path) -> None:
    """The import hook and the recorder in a real interpreter: calls and returns marked, written at exit."""
    done, marked = run_hooked(tmp_path, '[Point("sample_module", "work", on_call="work: in", on_return="work: out")]',
                              "import os, sample_module; assert sample_module.work(2) == 4; sample_module.work(3); "
                              "print(os.getpid())")
    assert done.returncode == 0, done.stderr
    assert [label for _, label, _ in marked] == ["work: in", "work: out", "work: in", "work: out"]
    assert {pid for _, _, pid in marked} == {int(done.stdout)}


def test_a_point_its_module_lacks_is_left_out_and_the_process_runs(tmp_path: Path) -> None:
    """Another release of a library without a marked method must not stop a daemon from starting."""
    done, marked = run_hooked(tmp_path, '[Point("sample_module", "gone", on_call="gone: in"), '
                                        'Point("sample_module", "work", on_call="work: in")]',
                              "import sample_module; sample_module.work(1)")
    assert done.returncode == 0 and "sample_module.gone is not a plain function" in done.stderr, done.stderr
    assert [label for _, label, _ in marked] == ["work: in"]


def test_every_point_of_the_study_names_a_function_the_daemons_have(tmp_path: Path) -> None:
    """A renamed method would crash a marked daemon at import: each point is wrapped in a real interpreter."""
    modules = sorted({point.module for point in POINTS})
    code = "import importlib, sys\n" + "\n".join(
        f"assert hasattr(importlib.import_module({point.module!r}).{point.qualname}, '__wrapped__'), "
        f"{point.qualname!r}" for point in POINTS)
    env = daemon_env(lone.marked_env(tmp_path))
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                            timeout=SUBPROCESS_TIMEOUT_S)
    assert result.returncode == 0, (modules, result.stderr[-2000:])


def test_marks_installed_in_this_process_come_off_again(tmp_path: Path) -> None:
    from zbatch.client.aio import AsyncClient

    original = AsyncClient._send
    uninstall = marks.install_now(lone.CLIENT_POINTS, tmp_path)
    try:
        assert AsyncClient._send is not original
        assert AsyncClient._send.__wrapped__ is original  # type: ignore[attr-defined]
    finally:
        uninstall()
    assert AsyncClient._send is original
