"""Hostile peers against a real broker: its memory, its log and the normal traffic during each attack.

Usage: python -m scripts.benchmarks.studies.hostile [--attacks big-backlog,...] [--root DIR]

Each attack starts a fresh broker with default settings, an echo worker for
the normal traffic (model ``echo``), and the hostile peers of ``tests/hostile.py``.
It prints, per attack, the broker's RSS before, at its peak and after, what
the attack got, and the normal traffic's answers and latency meanwhile.
``--root`` runs the daemons of another checkout (e.g. the commit before a
fix, from ``git worktree add``) with the same peers, for before/after tables.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import zmq

from tests.hostile import HostileWorker, NormalTraffic, PeakRss, blast, never_read, rss_bytes
from zbatch import testing
from zbatch.protocol.wire import BatchCounters

MIB = 1 << 20
ECHO = "echo"
VICTIM = "m"
SETTLE_S = 2.0

Attack = Callable[[testing.Daemon, zmq.Context[zmq.Socket[bytes]]], dict[str, Any]]


def big_backlog(broker: testing.Daemon, context: zmq.Context[zmq.Socket[bytes]]) -> dict[str, Any]:
    """40 requests of 15 MiB waiting in one model's backlog (its one worker holds a request and never answers)."""
    worker = HostileWorker(context, broker.backend, b"stuck").start()
    worker.ready([VICTIM], 1)
    try:
        statuses = blast(context, broker.frontend, VICTIM, b"\x00" * (15 * MIB), 40, timeout_ms=5_000, wait_s=30)
    finally:
        worker.close()
    return {"answers": dict(statuses)}


def lying_worker(broker: testing.Daemon, context: zmq.Context[zmq.Socket[bytes]]) -> dict[str, Any]:
    """A worker announcing a capacity of 10^9 (65,536 where that is refused) that never answers; 40 x 15 MiB."""
    worker = HostileWorker(context, broker.backend, b"liar").start()
    worker.ready([VICTIM], 10**9)
    time.sleep(0.5)
    if not any(w["name"] == "" and VICTIM in w["models"] for w in (testing.broker_stats(broker.frontend) or {})
               .get("workers", [])):
        worker.ready([VICTIM], 65_536)
    try:
        statuses = blast(context, broker.frontend, VICTIM, b"\x00" * (15 * MIB), 40, timeout_ms=3_000, wait_s=30)
    finally:
        worker.close()
    return {"answers": dict(statuses), "requests the liar received": worker.received}


def non_reading_clients(broker: testing.Daemon, context: zmq.Context[zmq.Socket[bytes]]) -> dict[str, Any]:
    """Three clients that send 100,000 STATS queries each and never read an answer."""
    sockets = [never_read(context, broker.frontend, 100_000) for _ in range(3)]
    time.sleep(SETTLE_S * 2)  # the broker answers as fast as it can; its queues fill meanwhile
    for socket in sockets:
        socket.close(linger=0)
    return {}


def model_flood(broker: testing.Daemon, context: zmq.Context[zmq.Socket[bytes]]) -> dict[str, Any]:
    """One peer announcing 400,000 model names: READYs of 1,024 names, or 64 where that is the most allowed."""
    worker = HostileWorker(context, broker.backend, b"flood").start()
    for per_ready in (1_024, 64):
        for number in range(400_000 // per_ready):
            worker.ready([f"fake-{per_ready}-{number}-{i}" for i in range(per_ready)], 1)
        time.sleep(SETTLE_S)
    worker.close()
    started = time.perf_counter()
    stats = testing.broker_stats(broker.frontend, timeout_ms=10_000)
    took_ms = (time.perf_counter() - started) * 1000
    return {"models known": len(stats["models"]) if stats else None, "STATS ms": round(took_ms, 1),
            "STATS answered": stats is not None}


def huge_counters(broker: testing.Daemon, context: zmq.Context[zmq.Socket[bytes]]) -> dict[str, Any]:
    """Two workers with capacity 2^64-1 and heartbeat counters of 2^64-1, whose sums pass a uint64;
    then STATS must still answer."""
    big = 2**64 - 1
    workers = [HostileWorker(context, broker.backend, b"huge-%d" % i).start() for i in range(2)]
    for worker in workers:
        worker.ready([VICTIM], big)
        worker.heartbeat({VICTIM: BatchCounters(big, big, big, big)})
    time.sleep(SETTLE_S)
    stats = testing.broker_stats(broker.frontend, timeout_ms=5_000)
    for worker in workers:
        worker.close()
    return {"STATS answered": stats is not None}


def log_flood(broker: testing.Daemon, context: zmq.Context[zmq.Socket[bytes]]) -> dict[str, Any]:
    """100,000 requests for models nobody serves."""
    before = broker.log_path.stat().st_size
    statuses = blast(context, broker.frontend, "nobody-serves-this", b"", 100_000, timeout_ms=1_000, wait_s=60)
    time.sleep(SETTLE_S)
    return {"answers": dict(statuses), "log bytes": broker.log_path.stat().st_size - before}


ATTACKS: dict[str, Attack] = {"big-backlog": big_backlog, "lying-worker": lying_worker,
                              "non-reading-clients": non_reading_clients, "model-flood": model_flood,
                              "huge-counters": huge_counters, "log-flood": log_flood}


def measure(name: str, attack: Attack, context: zmq.Context[zmq.Socket[bytes]]) -> dict[str, Any]:
    with testing.Daemons(Path(tempfile.mkdtemp(prefix=f"zbatch-hostile-{name}-"))) as daemons:
        broker = daemons.add(testing.start_broker(daemons.log_dir, models=(VICTIM, ECHO)))
        daemons.add(testing.spawn("scripts.benchmarks.systems.echo_worker", "echo", daemons.log_dir, "broker",
                                  backend=broker.backend, name="echo", model=ECHO, outputs="vector"))
        testing.wait_until(lambda: len((testing.broker_stats(broker.frontend) or {}).get("workers", [])) >= 1,
                           60, "the echo worker to register")
        pid = broker.process.pid
        before = rss_bytes(pid)
        with NormalTraffic(broker.frontend, ECHO) as traffic, PeakRss(pid) as peak:
            outcome = attack(broker, context)
            time.sleep(SETTLE_S)
            traffic.stop()
        after = rss_bytes(pid)
        alive = broker.alive() and testing.broker_stats(broker.frontend) is not None
        return {"attack": name, "rss_before_mib": round(before / MIB), "rss_peak_mib": round(peak.peak / MIB),
                "rss_after_mib": round(after / MIB), "broker_alive": alive, **outcome,
                "normal_traffic": traffic.summary()}


def run_cli(doc: str | None, attacks: Sequence[str], measure_one: Callable[[str], dict[str, Any]]) -> None:
    """The command line of a hostile-peer measurement: ``--attacks`` (of ``attacks``) and ``--root``; one JSON
    line per attack."""
    parser = argparse.ArgumentParser(description=(doc or "").splitlines()[0])
    parser.add_argument("--attacks", default=",".join(attacks), help=f"comma-separated, of {', '.join(attacks)}")
    parser.add_argument("--root", type=Path, help="run the daemons of this checkout instead of this one's")
    args = parser.parse_args()
    if args.root is not None:
        testing.ROOT = args.root.resolve()
    for name in args.attacks.split(","):
        print(json.dumps(measure_one(name)), flush=True)


def main() -> None:
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    try:
        run_cli(__doc__, list(ATTACKS), lambda name: measure(name, ATTACKS[name], context))
    finally:
        context.term()


if __name__ == "__main__":
    main()
