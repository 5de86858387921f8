"""One client's requests, timed mark by mark across the client, the broker and the worker: what sets its pace.

The daemons run with :func:`marked_env` (each marks :data:`~scripts.benchmarks.load.lone_points.POINTS` through
:mod:`scripts.benchmarks.common.marks`), and the measuring process marks its own ``AsyncClient`` with
:data:`CLIENT_POINTS`.  :func:`lone_windows` sends one text a request from one closed-loop client over each path
in turn, over ZeroMQ (this process's ``AsyncClient``) and over HTTP (through the gateway, whose own
``AsyncClient`` is then the client marked, with the gateway's HTTP side marked too); :func:`report` gives, per
stage between two marks (:data:`~scripts.benchmarks.load.lone_points.SEQUENCES`), the median and mean µs and the
stage's share of the mean cycle from one request to the next.  A mark costs about a microsecond, so stages of a
few µs are within it.

``python -m scripts.benchmarks.studies.lone_path`` runs it on the CPU's simulated accelerator; the ``gpu_session``
step ``lone`` against ``zbatch serve`` on CUDA.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from scripts.benchmarks.common import marks
from scripts.benchmarks.load import calls
from scripts.benchmarks.load import loops as load
from scripts.benchmarks.load.lone_points import BETWEEN_REQUESTS, CLIENT_SENDS, POINTS, SEQUENCES

HOOK = Path(__file__).with_name("marks_hook")  # its sitecustomize marks POINTS in a daemon
CLIENT_POINTS = tuple(point for point in POINTS if point.module == "zbatch.client.aio")  # the measuring process's


def labels(path: str) -> tuple[str, ...]:
    """The marks of one request over ``path``, in order."""
    return tuple(label for label, _ in SEQUENCES[path])


def stages(path: str) -> tuple[str, ...]:
    """What runs between each mark of a request over ``path`` and the next."""
    return tuple(stage for _, stage in SEQUENCES[path][:-1])


@dataclass(frozen=True)
class Window:
    """One path's measured window on the marks' clock (perf_counter_ns), and the client's figures in it."""

    path: str
    start_ns: int
    end_ns: int
    p50_ms: float | None
    req_s: float


def marked_env(folder: Path) -> dict[str, str]:
    """What a daemon's environment needs to mark :data:`POINTS` into ``folder``."""
    return marks.daemon_env(folder, HOOK)


def role(label: str) -> str:
    """The process a mark comes from, by its label: the client, the gateway, the broker or the worker (whose
    threads, tokenizer, plan and model are one process)."""
    name = label.partition(":")[0]
    return name if name in ("client", "gateway", "broker") else "worker"


def timelines(marked: Sequence[marks.Mark], order: Sequence[str]) -> tuple[list[list[int]], list[int]]:
    """Each whole request's marks (ns, in the ``order`` of :func:`labels`), and the gaps from a whole request's
    last mark to the next one's first.  A request starts at each mark of ``order[0]``; the first later mark of
    each next label is its own if it comes from the process that made the request's earlier marks of the same
    role (:func:`role`): a broker's flush with nothing to send, or another worker's heartbeat, is skipped.  A
    request left incomplete when the next one starts is dropped.  A mark of the right label from the right
    process can still be another message's (a heartbeat the worker receives just then): rare at one client,
    and it shows in the table's means rather than its medians.  Over HTTP the gateway may read a request in two
    pieces (its headers, then its body): the request is then timed from the last."""
    whole: list[list[int]] = []
    gaps: list[int] = []
    current: list[int] = []
    pids: dict[str, int] = {}
    last_answer: int | None = None
    for ns, label, pid in marked:
        if label == order[0]:
            if last_answer is not None:
                gaps.append(ns - last_answer)
            current, pids, last_answer = [ns], {role(label): pid}, None
        elif current and label == order[len(current)] and pids.setdefault(role(label), pid) == pid:
            current.append(ns)
            if len(current) == len(order):
                whole.append(current)
                current, last_answer = [], ns
    return whole, gaps


def report(title: str, marked: Sequence[marks.Mark], window: Window) -> str:
    """The Markdown table of one window's stages, from the marks inside it."""
    inside = [mark for mark in marked if window.start_ns <= mark[0] <= window.end_ns]
    order = labels(window.path)
    whole, gaps = timelines(inside, order)
    if not whole:
        return f"\n{title}: no whole request was marked (labels seen: {sorted({mark[1] for mark in inside})})"
    started = sum(mark[1] == CLIENT_SENDS for mark in inside)  # one a request (the gateway may read one in two)
    rows = [(stage, [(each[i + 1] - each[i]) / 1000 for each in whole])
            for i, stage in enumerate(stages(window.path))]
    if gaps:
        rows.append((BETWEEN_REQUESTS[window.path], [gap / 1000 for gap in gaps]))
    cycle = sum(statistics.fmean(spans) for _, spans in rows)
    lines = [f"\n{title}: {len(whole):,} of {started:,} requests marked whole, {window.req_s:,.0f} req/s, the "
             f"client's p50 {window.p50_ms or 0:.2f} ms", "",
             "| stage | p50 µs | mean µs | share of the mean cycle |", "|---|---|---|---|"]
    for stage, spans in rows:
        mean = statistics.fmean(spans)
        lines.append(f"| {stage} | {statistics.median(spans):,.0f} | {mean:,.0f} | {mean / cycle:.0%} |")
    lines.append(f"| **one cycle, from a request to the next** | | **{cycle:,.0f}** | |")
    return "\n".join(lines)


async def lone_windows(paths: Sequence[str], url: str, frontend: str, model: str, warmup_s: float,
                       seconds: float) -> list[Window]:
    """One client's closed loop over each path in turn ("zmq", "http"), each measured window on the marks' clock
    (the loop's warm-up, then its window: the loop must not retry or wait for a quiet host, or the two part)."""
    windows = []
    for path in paths:
        async with calls.one_text_calls(path, url, frontend, model, 1) as call:
            began = time.perf_counter_ns()
            result = await load.closed_loop(call, 1, warmup_s, seconds)
        windows.append(Window(path, began + int(warmup_s * 1e9), began + int((warmup_s + seconds) * 1e9),
                              result.get("p50_ms"), result["req_s"]))
    return windows


def path_title(path: str) -> str:
    """How a table names the path it times."""
    return "HTTP (through the gateway)" if path == "http" else "ZeroMQ (the client is this process's AsyncClient)"
