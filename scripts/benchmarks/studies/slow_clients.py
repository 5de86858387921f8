"""Slow and many connections: what each attack costs the daemons, and what it does to everyone else's requests.

``python -m scripts.benchmarks.studies.slow_clients [--baseline DIR] [--cases ...] [--seconds 20] [--files 1024]``
prints a Markdown table with a row per attack (and per source tree, with
``--baseline``): the largest resident memory of the gateway and the broker
during the attack, the CPU they used (and what other processes on the
machine used: on a shared machine, a row with busy neighbours is slower),
and the latency (p50, p99) and the share answered 200 of the normal traffic
meanwhile, both from clients that keep their connections (closed loop, 8)
and from new clients that open one per request (2).

The attacks are the ones tests/gateway/test_slow_clients.py and
tests/broker/test_many_connections.py make, from the same peers
(tests/slow_peers.py), but sustained for ``--seconds`` and against daemons
with their default settings:

* ``none``: the normal traffic alone, for reference;
* ``headers``: 1,100 connections sending a request's headers a byte a second;
* ``bodies``: 1,100 connections sending a request's body a byte a second;
* ``burst``: 300 new connections at once, each with a whole request, again
  every 2 s (their own p50 and p99 are in the notes, with how often the
  kernel dropped a new connection because the listen queue was full: a
  dropped one is retried a second later);
* ``zmq``: 1,100 idle ZeroMQ connections to the broker's frontend; the new
  clients here are ZeroMQ clients asking the broker for its statistics.

A connection the daemons close is replaced at once, so the attack stays at
full strength.  Every daemon starts with a soft limit of ``--files`` open
files (1024: what systemd gives a unit without ``LimitNOFILE=``; 0 keeps
this process's), as they would under systemd without the units' setting.
The daemons are the real broker and gateway, with two instant workers
(systems/echo_worker.py), so what is measured is the HTTP and routing path, not a
model.

``--baseline DIR`` runs every case on the daemons of another source tree
first (``git worktree add /tmp/base <commit>``), so the rows compare.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

import zbatch.testing
from scripts.benchmarks.common import cpu
from scripts.benchmarks.common.procs import MODEL, log, running, start_echo_system
from tests.load import Answer, Load
from tests.slow_peers import (
    SYSTEMD_DEFAULT_FILES,
    IdleZmq,
    burst,
    cpu_seconds,
    http_request,
    listen_overflows,
    open_file_limit,
    raise_open_files,
    rss_bytes,
    slow_bodies,
    slow_headers,
)
from zbatch.client import AsyncClient, ZBatchError
from zbatch.testing import Daemon, Daemons, start_gateway

CASES = ("none", "headers", "bodies", "burst", "zmq")
ATTACKERS = 1100
BURST = 300
BURST_EVERY_S = 2.0
CLIENTS = 8
NEW_CLIENTS = 2
SAMPLE_S = 0.25


@dataclass
class Peaks:
    """The largest resident memory of each process, sampled in a thread until stopped."""

    pids: dict[str, int]
    rss: dict[str, int] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)

    def __enter__(self) -> Peaks:
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()

    def _sample(self) -> None:
        while not self._stop.wait(SAMPLE_S):
            for name, pid in self.pids.items():
                with contextlib.suppress(OSError, ValueError):
                    self.rss[name] = max(self.rss.get(name, 0), rss_bytes(pid))


@dataclass
class NewZmqClients:
    """Closed-loop ZeroMQ clients, each asking the broker for its statistics on a new connection every time."""

    frontend: str
    concurrency: int = NEW_CLIENTS
    answers: list[Answer] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def __enter__(self) -> NewZmqClients:
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join(60)

    async def _run(self) -> None:
        await asyncio.gather(*(self._client() for _ in range(self.concurrency)))

    async def _client(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                async with AsyncClient(self.frontend, connect_timeout_ms=5000) as client:
                    await client.stats(timeout_ms=5000)
                status, code = 200, "ok"
            except ZBatchError as exc:
                status, code = 0, type(exc).__name__
            self.answers.append(Answer(started, time.monotonic() - started, status, code))
            if status != 200:
                await asyncio.sleep(0.01)


def traffic(answers: list[Answer], window: tuple[float, float]) -> dict[str, Any]:
    """p50, p99 (of the 200s, in ms) and the share answered 200, of the requests sent inside ``window``."""
    inside = [a for a in answers if window[0] <= a.sent_at <= window[1]]
    ok = [a.latency_s * 1000 for a in inside if a.status == 200]
    p50, p99 = np.percentile(ok, [50, 99]) if ok else (float("nan"), float("nan"))
    return {"sent": len(inside), "ok": len(ok) / len(inside) if inside else float("nan"), "p50": p50, "p99": p99}


@contextlib.contextmanager
def attack(case: str, gateway: Daemon, broker: Daemon, notes: dict[str, str]) -> Iterator[None]:
    """The attack of ``case``, on while the block runs; what it learns about itself goes into ``notes``."""
    port = int(gateway.url.rsplit(":", 1)[1])
    if case == "none":
        yield
    elif case in ("headers", "bodies"):
        peers = slow_headers if case == "headers" else slow_bodies
        with peers(port, ATTACKERS, reconnect=True) as slow:
            yield
        notes[case] = f"{len(slow.endings)} closed by the gateway, {slow.refused} refused"
    elif case == "burst":
        overflows = listen_overflows()
        with bursts(port) as times:
            yield
        overflows = listen_overflows() - overflows
        answered = [t for t, status in times if status is not None]
        p50, p99 = np.percentile(answered, [50, 99]) if answered else (float("nan"), float("nan"))
        notes[case] = (f"burst connections: {len(answered)}/{len(times)} answered, p50 {p50:.0f} ms, "
                       f"p99 {p99:.0f} ms; listen queue overflows (machine-wide): {overflows}")
    elif case == "zmq":
        with IdleZmq(broker.frontend, ATTACKERS):
            yield
    else:
        raise ValueError(f"no case {case}")


@contextlib.contextmanager
def bursts(port: int) -> Iterator[list[tuple[float, int | None]]]:
    """Bursts of new connections every BURST_EVERY_S while the block runs: (ms to the answer, status) each."""
    times: list[tuple[float, int | None]] = []
    stop = threading.Event()
    request = http_request(f"/models/{MODEL}", b'{"inputs": "one of a burst"}')

    def fire() -> None:
        while not stop.is_set():
            times.extend((e.seconds * 1000, e.status) for e in burst(port, BURST, request, timeout_s=30))
            stop.wait(BURST_EVERY_S)

    thread = threading.Thread(target=fire, daemon=True)
    thread.start()
    try:
        yield times
    finally:
        stop.set()
        thread.join()


def start_system(daemons: Daemons, files: int) -> tuple[Daemon, Daemon]:
    """A broker, two instant workers and a gateway, all with default settings and ``files`` open files."""
    limit = open_file_limit(files) if files else contextlib.nullcontext()
    with limit:
        broker = start_echo_system(daemons, 2, "--outputs", "vector")
        gateway = daemons.add(start_gateway(broker, daemons.log_dir, ready="/readyz"))
    return broker, gateway


def measure(case: str, code: str, files: int, seconds: float) -> dict[str, Any]:
    """One row: ``case`` on the daemons of the source tree ``code``."""
    zbatch.testing.ROOT = Path(code)  # the daemons run as python -m ... from here: which code they are
    with running() as daemons:
        broker, gateway = start_system(daemons, files)
        url = f"{gateway.url}/models/{MODEL}"
        notes: dict[str, str] = {}
        new_clients: Callable[[], Any] = (
            (lambda: NewZmqClients(broker.frontend)) if case == "zmq"
            else (lambda: Load(url, NEW_CLIENTS, timeout_s=30, fresh_connections=True)))
        with Load(url, CLIENTS, timeout_s=30) as load, new_clients() as fresh:
            zbatch.testing.wait_until(lambda: load.successes() and fresh.answers, 60, "normal traffic")
            pids = {"gateway": gateway.pid, "broker": broker.pid}
            with Peaks(pids) as peaks, attack(case, gateway, broker, notes):
                window = (time.monotonic(), time.monotonic() + seconds)
                used, machine = {name: cpu_seconds(pid) for name, pid in pids.items()}, cpu.snapshot()
                time.sleep(seconds)  # the measurement window: the attack and the traffic go on meanwhile
                cores = {name: (cpu_seconds(pid) - used[name]) / seconds for name, pid in pids.items()}
                others = cpu.usage(machine, cpu.snapshot()).get("other_cores", float("nan"))
        dead = [name for name, daemon in daemons.items() if not daemon.alive()]
    return {"case": case, "code": code, "rss": peaks.rss, "cores": cores, "others": others,
            "kept": traffic(load.answers, window), "new": traffic(fresh.answers, window),
            "notes": notes.get(case, ""), "dead": ", ".join(dead)}


def table(rows: list[dict[str, Any]], labels: dict[str, str]) -> str:
    lines = ["| attack | daemons | RSS MiB: gateway, broker | CPU cores: gateway, broker (others) "
             "| kept connections: p50 / p99 ms, answered | new clients: p50 / p99 ms, answered | notes |",
             "|---|---|---|---|---|---|---|"]
    for row in rows:
        rss = {name: f"{value / 2**20:.0f}" for name, value in row["rss"].items()}
        cores = row["cores"]
        kept, new = row["kept"], row["new"]
        notes = "; ".join(filter(None, [row["notes"], f"dead: {row['dead']}" if row["dead"] else ""]))
        lines.append(
            f"| {row['case']} | {labels[row['code']]} | {rss.get('gateway', '?')}, {rss.get('broker', '?')} "
            f"| {cores['gateway']:.2f}, {cores['broker']:.2f} ({row['others']:.2f}) "
            f"| {kept['p50']:.1f} / {kept['p99']:.1f}, {kept['ok']:.1%} of {kept['sent']} "
            f"| {new['p50']:.1f} / {new['p99']:.1f}, {new['ok']:.1%} of {new['sent']} | {notes} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", default="", help="source tree of daemons to compare with, measured first")
    parser.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of {', '.join(CASES)}")
    parser.add_argument("--seconds", type=float, default=20.0, help="how long each attack lasts")
    parser.add_argument("--files", type=int, default=SYSTEMD_DEFAULT_FILES,
                        help="the daemons' soft limit on open files; 0 keeps this process's")
    args = parser.parse_args()
    raise_open_files(4 * (ATTACKERS + BURST) + 1024)
    here = str(zbatch.testing.ROOT)
    codes = [args.baseline, here] if args.baseline else [here]
    labels = {args.baseline: "baseline", here: "this tree"}
    rows = []
    for case in args.cases.split(","):
        for code in codes:
            log(f"{case}: {labels[code]} ({code})")
            rows.append(measure(case, code, args.files, args.seconds))
    print(table(rows, labels))


if __name__ == "__main__":
    main()
