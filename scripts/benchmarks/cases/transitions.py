"""Transitions at GPU rates: kills under load (chaos) and workers that register one after another (staggered).

Both run on the simulated accelerator of :mod:`scripts.benchmarks.systems.accelerator` (the real worker, its
model a sleep of :data:`BATCH_MS` a batch plus :data:`ITEM_MS` an item, batches of up to 128, no CPU; a fresh worker's
first batches slow (:data:`COLD`), so that a broker's first measurement of it is a poor one), so that this
host plays a GPU host: the accelerator is never what limits, and every refusal is the stack's own doing.  Load
comes from several processes (:mod:`scripts.benchmarks.load.processes`) that record every request, so each one is
placed against the moments something was killed or registered.

* **chaos**: ``zbatch serve`` with two brokers and four workers; closed-loop clients over HTTP through its
  gateway and over ZeroMQ straight to both brokers, 30 s deadline; kill -9 of a worker or a broker at
  intervals, each restarted by the supervisor (a kill waits until the previous victim is ready again).
  Per kill window (requests by the time they were sent): answered 200, refused (503 or ``overloaded``),
  lost (no answer: a timeout, a dropped connection, no answer at all), and every status.
* **staggered**: a broker and the gateway, then four workers that register :data:`STAGGER_S` apart;
  the clients start the moment ``/readyz`` answers 200 (the first registration).  The share of answers
  that were 200 from 1 s and from 2 s after the last registration on.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from itertools import pairwise
from typing import Any

from scripts.benchmarks.cases.context import Context, row
from scripts.benchmarks.common import procs
from scripts.benchmarks.load.processes import collect, merge, start_children
from scripts.benchmarks.systems import accelerator
from zbatch.testing import (
    START_TIMEOUT_S,
    Daemon,
    Daemons,
    serves,
    spawn_serve,
    start_broker,
    start_gateway,
    start_worker,
    supervised_pids,
    wait_ready_again,
)

BATCH_MS, ITEM_MS = accelerator.BATCH_MS, accelerator.ITEM_MS  # a GPU's pace: a batch of 128 in 45.6 ms
COLD = (2, 1_000.0)  # a fresh worker's first 2 batches each take 1 s longer, as a GPU's first real batches may
REFUSED = frozenset({"503", "overloaded"})
STAGGER_S = 0.5
WORKERS = 4
RESTART_WAIT_S = 120.0  # how long a kill waits for the previous victim to be ready again
Record = tuple[float, float, str]  # time.time() sent, time.time() answered, status


@dataclass(frozen=True)
class ChaosPlan:
    clients: int  # a quarter of them over ZeroMQ, the rest over HTTP
    duration_s: float
    first_kill_s: float
    every_s: float
    victims: tuple[str, ...]


CHAOS = ChaosPlan(256, 62.0, 6.0, 8.0, ("worker-0", "worker-1", "broker-0", "worker-2", "worker-3", "broker-1"))
QUICK_CHAOS = ChaosPlan(64, 11.0, 2.0, 4.5, ("worker-0", "broker-1"))  # the broker's loss seen within 4.5 s
STAGGERED_CLIENTS, QUICK_STAGGERED_CLIENTS = 512, 128


def outcome(status: str) -> str:
    """ok, refused, lost (no answer: not a status the stack gives), or failed (any other answer)."""
    if status == "ok":
        return "ok"
    if status in REFUSED:
        return "refused"
    return "failed" if status.isdigit() or status.islower() else "lost"


def tally(records: list[Record], abandoned: int = 0) -> dict[str, Any]:
    """Answered 200, refused, failed and lost among ``records``, and every status; ``abandoned``: no answer."""
    kinds = Counter(outcome(status) for _, _, status in records)
    return {"sent": len(records) + abandoned, "ok": kinds["ok"], "refused": kinds["refused"],
            "failed": kinds["failed"], "lost": kinds["lost"] + abandoned,
            "statuses": dict(Counter(status for _, _, status in records))}


def records_of(results: list[dict[str, Any]]) -> list[Record]:
    """Every request the load generators recorded."""
    return [(float(sent), float(answered), str(status)) for result in results
            for sent, answered, status in result["records"]]


def log_time(line: str) -> float:
    """The time.time() of a daemon's log line (``2026-11-26 19:17:13,129 ...``, local time)."""
    return datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()


# ------------------------------------------------------------------------------------------------- chaos

async def chaos(ctx: Context) -> None:
    plan = QUICK_CHAOS if ctx.settings.quick else CHAOS
    env = accelerator.accelerator_env(tempfile.mkdtemp(prefix="zbatch-simulated-"), BATCH_MS, ITEM_MS, cold=COLD)
    system = f"zbatch serve, 2 brokers, {WORKERS} workers, simulated accelerator"
    ctx.rows.append(await run_chaos(plan, accelerator.MODEL, env, system, workers=WORKERS))


async def run_chaos(plan: ChaosPlan, model: str, env: dict[str, str], system: str,
                    workers: int | None = None) -> dict[str, Any]:
    """``plan`` against ``zbatch serve`` with two brokers serving ``model`` (its daemons get ``env``; ``workers``:
    its CPU workers, where no GPU decides them); the row of what every request met."""
    with procs.running() as daemons:
        spawned = (spawn_serve(daemons.log_dir, "zbatch-serve", brokers=2, env=env) if workers is None
                   else spawn_serve(daemons.log_dir, "zbatch-serve", brokers=2, env=env, workers=workers))
        served = daemons.add(spawned)
        await procs.blocking(daemons.wait, lambda: serves(served), "zbatch serve to serve")
        procs.log(f"chaos: {plan.clients} clients for {plan.duration_s:.0f} s; kill -9 of "
                  f"{', '.join(plan.victims)}, {plan.every_s:.0f} s apart")
        http = plan.clients - plan.clients // 4
        url = f"{served.url}/models/{model}"
        children = [*await start_children("http", url, model, http, 0.0, plan.duration_s, 3, 1, "--records"),
                    *await start_children("zmq", served.frontend, model, plan.clients // 4, 0.0,
                                          plan.duration_s, 1, 1, "--records")]
        kills = await _kill_in_turn(served, plan)
        results = await collect(children)
        served.stop(120)
    return _chaos_row(plan, results, kills, system)


async def _kill_in_turn(served: Daemon, plan: ChaosPlan) -> list[dict[str, Any]]:
    """kill -9 each victim on the plan's schedule, each once the one before is ready again."""
    started = time.time()
    kills: list[dict[str, Any]] = []
    for index, victim in enumerate(plan.victims):
        await asyncio.sleep(max(0.0, started + plan.first_kill_s + index * plan.every_s - time.time()))
        if kills:
            kills[-1]["back_s"] = await _back(served, kills[-1])
        pid = supervised_pids(served)[victim]
        os.kill(pid, signal.SIGKILL)
        kills.append({"victim": victim, "pid": pid, "at": time.time()})
        procs.log(f"chaos: killed {victim} (pid {pid}) at {kills[-1]['at'] - started:.1f} s")
    kills[-1]["back_s"] = await _back(served, kills[-1])
    return kills


async def _back(served: Daemon, kill: dict[str, Any]) -> float:
    """Once the supervisor says the victim of ``kill`` is ready again: how long it was out, by its count."""
    return await procs.blocking(wait_ready_again, served, kill["victim"], kill["pid"], RESTART_WAIT_S)


def _chaos_row(plan: ChaosPlan, results: list[dict[str, Any]], kills: list[dict[str, Any]],
               system: str) -> dict[str, Any]:
    records = records_of(results)
    abandoned = sum(result["abandoned"] for result in results)
    edges = [min(result["started"] for result in results), *(kill["at"] for kill in kills), float("inf")]
    windows = []
    for index, (start, end) in enumerate(pairwise(edges)):
        inside = [r for r in records if start <= r[0] < end]
        kill = kills[index - 1] if index else None
        windows.append({"after": f"{kill['victim']} killed" if kill else "start",
                        "at_s": round(start - edges[0], 1), "back_s": kill["back_s"] if kill else None,
                        **tally(inside)})
    totals = tally(records, abandoned)
    return row("chaos", system, plan.clients, merge(results, 1), windows=windows, kills=len(kills), **totals,
               http_clients=plan.clients - plan.clients // 4, zmq_clients=plan.clients // 4)


# ---------------------------------------------------------------------------------------------- staggered

async def staggered(ctx: Context) -> None:
    clients = QUICK_STAGGERED_CLIENTS if ctx.settings.quick else STAGGERED_CLIENTS
    duration_s = WORKERS * STAGGER_S + (3.0 if ctx.settings.quick else 6.0)
    folder = tempfile.mkdtemp(prefix="zbatch-simulated-")
    with procs.running() as daemons:
        gateway = await procs.start(daemons, _start_front, folder)
        url = f"{gateway.url}/models/{accelerator.MODEL}"
        children = await start_children("http", url, accelerator.MODEL, clients, 0.0, duration_s, 4, 1,
                                        "--records", "--ready", f"{gateway.url}/readyz")
        gates = [str(daemons.log_dir / f"gate-{index}") for index in range(WORKERS)]
        for index, gate in enumerate(gates):
            env = accelerator.accelerator_env(folder, BATCH_MS, ITEM_MS, ready_gate=gate, cold=COLD)
            daemons.add(start_worker(daemons["broker"], daemons.log_dir, f"worker-{index}", wait=False,
                                     env=env, workers=1, cores_ledger="off"))
        await procs.blocking(accelerator.open_gates, gates, STAGGER_S, START_TIMEOUT_S)
        procs.log(f"staggered: {WORKERS} workers registering {STAGGER_S} s apart; {clients} clients from /readyz")
        results = await collect(children)
        registered = registrations(daemons["broker"])
    ctx.rows.append(staggered_row(clients, results, registered))


def _start_front(daemons: Daemons, folder: str) -> Daemon:
    """The broker and the gateway as deployed (its processes one per core), before any worker; the gateway."""
    broker = daemons.add(start_broker(daemons.log_dir))
    return daemons.add(start_gateway(broker, daemons.log_dir, processes=0,
                                     env=accelerator.accelerator_env(folder, BATCH_MS, ITEM_MS)))


def registrations(broker: Daemon) -> list[float]:
    """When the broker registered each worker (time.time(), from its log or ``zbatch serve``'s), in order."""
    lines = broker.log_path.read_text(errors="replace").splitlines()
    return sorted(log_time(line) for line in lines if re.search(r"worker \S+ registered: ", line))


def staggered_row(clients: int, results: list[dict[str, Any]], registered: list[float],
                  system: str = f"{WORKERS} workers registering {STAGGER_S:g} s apart, simulated accelerator",
                  ) -> dict[str, Any]:
    """The staggered start's row: every answer placed against the last registration."""
    records = records_of(results)
    ready = min(result["started"] for result in results)
    last = registered[-1]
    phases = {"before the last registration": (ready, last), "its first second": (last, last + 1.0),
              "the second after": (last + 1.0, last + 2.0), "later": (last + 2.0, float("inf"))}
    by_phase = {name: tally([r for r in records if start <= r[1] < end])
                for name, (start, end) in phases.items()}

    def share(since: float) -> float | None:
        answered = [r for r in records if r[1] >= since]
        return sum(r[2] == "ok" for r in answered) / len(answered) if answered else None

    return row("staggered", system, clients,
               merge(results, 1), phases=by_phase, share_ok_after_1s=share(last + 1.0),
               share_ok_after_2s=share(last + 2.0), registered_s=[round(t - ready, 2) for t in registered],
               **tally(records, sum(result["abandoned"] for result in results)))


# ------------------------------------------------------------------------------------------------- report

MIN_KILLS = 5  # the chaos target's: at least this many kills


def targets(rows: list[dict[str, Any]]) -> Iterator[tuple[str, str, str, bool | None]]:
    """Issue 38's targets for the two cases, from this run's rows (a short chaos run shows no verdict)."""
    for r in rows:
        d = r["detail"]
        if r["case"] == "chaos":
            clean = d["refused"] == d["lost"] == d["failed"] == 0
            yield (f"chaos: {r['concurrency']} clients, {d['kills']} kills at GPU rates",
                   f"0 refused and 0 lost through ≥ {MIN_KILLS} kills",
                   f"{d['ok']:,} answered 200 of {d['sent']:,}; {d['refused']} refused, {d['lost']} lost, "
                   f"{d['failed']} other errors", clean if d["kills"] >= MIN_KILLS or not clean else None)
        elif r["case"] == "staggered" and d["share_ok_after_2s"] is not None:
            first, second = d["share_ok_after_1s"], d["share_ok_after_2s"]
            yield (f"staggered start: {r['concurrency']} clients, {WORKERS} workers {STAGGER_S:g} s apart",
                   "≥ 99.9 % answered 200 from 1 s after the last registration, 100 % from 2 s",
                   f"{first:.2%} from 1 s, {second:.2%} from 2 s", first >= 0.999 and second == 1.0)


def section(rows: list[dict[str, Any]]) -> list[str]:
    """The detail tables: each chaos run's kill windows, each staggered start's phases."""
    out: list[str] = []
    for r in (r for r in rows if r["case"] == "chaos"):
        d = r["detail"]
        out += ["", "### Chaos", "", f"{r['system']}: {d['http_clients']} closed-loop clients over HTTP and "
                f"{d['zmq_clients']} over ZeroMQ to both brokers, 30 s deadline; kill -9 of a daemon at intervals, "
                "each restarted by the supervisor (out: its own count, from the exit to ready again). Requests "
                "by the window they were sent in.", "",
                "| window | from s | out s | sent | 200 | refused | lost | statuses |", "|---" * 8 + "|"]
        out += [f"| after {w['after']} | {w['at_s']} | {'–' if w['back_s'] is None else w['back_s']} | "
                f"{w['sent']} | {w['ok']} | {w['refused']} | {w['lost']} | {_statuses(w['statuses'])} |"
                for w in d["windows"]]
    for r in (r for r in rows if r["case"] == "staggered"):
        d = r["detail"]
        out += ["", "### Staggered start", "", f"{r['system']}; {r['concurrency']} closed-loop HTTP clients from the "
                f"moment /readyz answered 200. Registrations at {d['registered_s']} s from then. Answers by the "
                "time they came.", "", "| answered in | answers | 200 | refused | lost | statuses |",
                "|---|---|---|---|---|---|"]
        out += [f"| {name} | {p['sent']} | {p['ok']} | {p['refused']} | {p['lost']} | {_statuses(p['statuses'])} |"
                for name, p in d["phases"].items()]
    return out


def _statuses(statuses: dict[str, int]) -> str:
    return ", ".join(f"{k}: {v:,}" for k, v in sorted(statuses.items()))
