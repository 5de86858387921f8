"""How much CPU the rest of the machine used while we measured, from /proc (Linux only).

On a shared 2-core box one foreign test suite loading a model halves what any
system under test gets. Each measurement records ``other_cores`` (CPU used by
processes outside this benchmark's process tree, in cores), so a disturbed
row can be spotted, and ``wait_quiet`` can hold a run until the box is idle.
``process_use`` prices each process under test in CPU per request (on 2
shared cores, throughput ratios mix one process's cost with its neighbours')
and counts how often its threads blocked, each a wake-up later: where waking
an idle CPU is slow (a VM), that count prices a path's hops.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
QUIET_CORES = 0.25  # below this, other processes are not disturbing a measurement


@dataclass(frozen=True)
class Snapshot:
    at: float
    busy_ticks: int
    ours_ticks: int


def _busy_ticks() -> int:
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return sum(fields[:8]) - idle  # user nice system idle iowait irq softirq steal; no guest double count


def _process_table() -> tuple[dict[int, list[int]], dict[int, int]]:
    """Every process's children and its utime + stime so far, in clock ticks."""
    children: dict[int, list[int]] = {}
    ticks: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        rest = stat[stat.rindex(")") + 2:].split()  # fields after "pid (comm)"
        children.setdefault(int(rest[1]), []).append(int(entry.name))
        ticks[int(entry.name)] = int(rest[11]) + int(rest[12])
    return children, ticks


def _tree(root: int, children: dict[int, list[int]]) -> list[int]:
    """``root`` and all its descendants alive now."""
    pids, stack = [], [root]
    while stack:
        pid = stack.pop()
        pids.append(pid)
        stack.extend(children.get(pid, []))
    return pids


def tree(root: int) -> list[int]:
    """``root`` and every descendant of it alive now (a server's worker processes, and theirs)."""
    try:
        return _tree(root, _process_table()[0])
    except (OSError, ValueError, IndexError):
        return [root]


def _tree_ticks(root: int, table: tuple[dict[int, list[int]], dict[int, int]] | None = None) -> int:
    """utime + stime of ``root`` and all its descendants alive now."""
    children, ticks = table or _process_table()
    return sum(ticks.get(pid, 0) for pid in _tree(root, children))


def _voluntary_switches(pid: int | str) -> int:
    """How often the threads of ``pid`` alive now have blocked (``voluntary_ctxt_switches``)."""
    total = 0
    for status in Path(f"/proc/{pid}/task").glob("*/status"):
        try:
            text = status.read_text()
        except OSError:  # the thread ended meanwhile
            continue
        total += int(text.split("\nvoluntary_ctxt_switches:", 1)[1].split(None, 1)[0])
    return total


def process_use(pids: dict[str, int]) -> tuple[dict[str, float], dict[str, float]]:
    """CPU seconds, and how often threads blocked, so far: each named process with its children, and the caller.

    One scan of /proc serves both.  The caller is the load generator: its CPU is read with
    ``time.process_time`` (all its threads, finer than a clock tick).  A voluntary context
    switch is a thread waiting (on epoll, a futex, a queue), and so one wake-up later;
    threads that end in between take their counts with them.
    """
    own_seconds = {"load generator": time.process_time()}
    try:
        children, ticks = _process_table() if pids else ({}, {})
        seconds = {name: _tree_ticks(root, (children, ticks)) / TICKS for name, root in pids.items() if root in ticks}
        blocked: dict[str, float] = {name: sum(_voluntary_switches(pid) for pid in _tree(root, children))
                                     for name, root in pids.items()}
        return seconds | own_seconds, blocked | {"load generator": _voluntary_switches("self")}
    except (OSError, ValueError, IndexError):
        return own_seconds, {}  # not Linux: the load generator's CPU alone


def per_request(start: dict[str, float], end: dict[str, float], requests: int, scale: float = 1.0
                ) -> dict[str, float]:
    """``scale`` × the growth per request of each figure seen at both ends of the window (1e6: seconds to µs)."""
    if not requests:
        return {}
    return {name: round((end[name] - start[name]) * scale / requests, 1) for name in start if name in end}


def snapshot(root: int | None = None) -> Snapshot | None:
    try:
        return Snapshot(time.monotonic(), _busy_ticks(), _tree_ticks(root or os.getpid()))
    except (OSError, ValueError, IndexError):
        return None  # not Linux, or /proc unreadable: no noise figures


def usage(start: Snapshot | None, end: Snapshot | None) -> dict[str, float]:
    """Cores used between the snapshots: by this benchmark's processes, and by everything else."""
    if start is None or end is None or end.at <= start.at:
        return {}
    seconds = end.at - start.at
    ours = (end.ours_ticks - start.ours_ticks) / TICKS / seconds
    busy = (end.busy_ticks - start.busy_ticks) / TICKS / seconds
    return {"ours_cores": round(ours, 2), "other_cores": round(max(0.0, busy - ours), 2)}


def other_cores(seconds: float) -> float | None:
    """Cores used by processes outside this benchmark over the next ``seconds`` (blocking)."""
    start = snapshot()
    time.sleep(seconds)
    return usage(start, snapshot()).get("other_cores")


def wait_quiet_sync(max_wait_s: float) -> float | None:
    """Block until other processes use under QUIET_CORES, or ``max_wait_s`` has passed."""
    deadline = time.monotonic() + max_wait_s
    while True:
        other = other_cores(0.5)
        if other is None or other < QUIET_CORES or time.monotonic() >= deadline:
            return other


async def wait_quiet(max_wait_s: float, log: Callable[[str], None] | None = None) -> float | None:
    """Wait (up to ``max_wait_s``) until other processes use under QUIET_CORES; returns their last usage."""
    deadline = time.monotonic() + max_wait_s
    warned = False
    while True:
        start = snapshot()
        await asyncio.sleep(0.5)
        other = usage(start, snapshot()).get("other_cores")
        if other is None or other < QUIET_CORES or time.monotonic() >= deadline:
            return other
        if not warned and log is not None:
            log(f"waiting for the machine to be quiet: other processes use {other:.2f} cores")
            warned = True
