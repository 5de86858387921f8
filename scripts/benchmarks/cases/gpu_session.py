"""One lent GPU, one run: issue 38's transitions and issue 41's rates, with real models on CUDA.

``python3 -m scripts.benchmarks.cases.gpu_session --out DIR`` on the device (after ``source .gpu/unpack.sh``):

1. **chaos** (:func:`scripts.benchmarks.cases.transitions.run_chaos`): ``zbatch serve`` with 2 brokers and its
   workers per GPU, serving a model of e5-small-v2's shape; 256 clients; kill -9 of workers and brokers;
2. **start under load**, on the same machine after the chaos run: a fresh ``zbatch serve`` as shipped, the same
   model, 512 HTTP clients from the moment ``/readyz`` first answers; when it answered, when each worker
   registered, and the share answered 200 after the last registration;
3. **rates**: the bundled model over HTTP and ZeroMQ at 1 and 512 clients and 64 clients of 32 texts, then the
   anchors' shapes (:data:`~scripts.benchmarks.systems.shapes.SHAPES`) at 512 × 1 and 64 × 32 over HTTP;
4. **fronts**: the bundled model with each (brokers, gateway processes) of :data:`LAYOUTS` at 512 clients;
5. **unpadded**: the base-size shape at 64 clients of 32 texts over HTTP, with ``--unpadded-attention`` off
   (batches padded to their graphed buckets) and auto (each batch packed where warm-up's timings say it wins);
6. **edge**: the bundled model at 512 HTTP clients of one text and 64 of 32, with the gateways' ``edge_tokenize``
   off (workers tokenize) and on (gateway processes tokenize, ids travel: ``zbatch serve``'s choice with GPUs);
7. **workers**: the base-size shape at 64 HTTP clients of 32 texts and 512 of one, with each of
   :data:`WORKERS_PER_GPU` workers on the GPU: once the gateway tokenizes, the GPU is the bound, and fewer
   processes time-slicing it may each run larger batches;
8. **client**: the bundled model over ZeroMQ at 1 and 512 clients of one text and 64 of 32, on one ``zbatch
   serve``, with the clients' ``tokenize`` off (workers tokenize) and on (the load generator's clients tokenize);
9. **lone**: one client's requests of one text, over ZeroMQ and HTTP, each timed mark by mark across the client,
   the broker and the worker (:mod:`scripts.benchmarks.load.lone`): what sets the one-client p50; then again with
   every core held out of deep idle states (:mod:`zbatch.runtime.wakeup`), to price the cores' wake-ups.

Each step has its own time limit (:data:`STEP_LIMITS_S`), so one that hangs costs only itself; together they
exceed one device call's 600 s, so run them in three calls (``--steps chaos,start,rates,fronts``, then
``--steps unpadded,edge,workers``, then ``--steps client,lone``) or choose the steps a lease needs.  The results
are written to ``DIR/gpu-session.json`` and ``DIR/gpu-session.md`` as each step ends.  Without CUDA,
``--quick`` runs every step in a short form on the CPU, to test the script before device time is spent on it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import shutil
import subprocess
import tempfile
import time
import traceback
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from scripts.benchmarks.cases.context import row
from scripts.benchmarks.cases.gpu import LOAD_PROCESSES, cuda_available, model_folder, serve, with_tokens
from scripts.benchmarks.cases.transitions import (
    ChaosPlan,
    registrations,
    run_chaos,
    section,
    staggered_row,
)
from scripts.benchmarks.common import marks, procs
from scripts.benchmarks.common.texts import sentences
from scripts.benchmarks.load import lone
from scripts.benchmarks.load.processes import collect, spread_closed_loop, start_children
from scripts.benchmarks.systems.shapes import BERT_BASE, E5_SMALL, Shape, mean_tokens, shaped_model
from zbatch.runtime import wakeup
from zbatch.testing import Daemons, spawn_serve

GPU_CHAOS = ChaosPlan(256, 75.0, 5.0, 12.0, ("worker-0", "worker-1", "broker-0", "worker-2", "broker-1"))
QUICK_CHAOS = ChaosPlan(16, 12.0, 3.0, 5.0, ("worker-0", "broker-1"))
START_CLIENTS, START_SECONDS = 512, 25.0
LAYOUTS = ((1, 4), (2, 4), (2, 8))  # (brokers, gateway processes); the first is zbatch serve's default
STEP_LIMITS_S = {"chaos": 150.0, "start": 90.0, "rates": 150.0, "fronts": 130.0, "unpadded": 120.0, "edge": 100.0,
                 "workers": 150.0, "client": 150.0, "lone": 90.0}
SHAPED = "shaped"
WORKERS_PER_GPU = (1, 2, 4)  # the last is zbatch serve's choice on a 16-core host


class Session:
    """The steps' rows, written out after each step."""

    def __init__(self, out: Path, quick: bool) -> None:
        self.out, self.quick = out, quick
        self.rows: list[dict[str, Any]] = []
        self.notes: list[str] = []
        self.tables: list[str] = []  # Markdown of the steps that report more than rows (lone)
        self.windows = (0.5, 1.5) if quick else (2.0, 6.0)

    def save(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "gpu-session.json").write_text(json.dumps({"notes": self.notes, "rows": self.rows,
                                                               "tables": self.tables}, indent=1, default=str))
        (self.out / "gpu-session.md").write_text("\n".join([*report(self.rows, self.notes), *self.tables]) + "\n")

    async def load(self, kind: str, target: str, model: str, clients: int, texts: int = 1,
                   tokenize: bool = False) -> dict[str, Any]:
        warmup, duration = self.windows
        return await spread_closed_loop(kind, target, model, clients, warmup, duration, LOAD_PROCESSES,
                                        texts=texts, tokenize=tokenize)


def shaped_env(quick: bool) -> dict[str, str]:
    """The daemons' settings for a shaped model: on the CPU's short form torch, whose start needs no export."""
    return {"ZBATCH_RUNTIME": "torch"} if quick else {}


async def chaos_step(session: Session, folder: Path) -> None:
    plan = QUICK_CHAOS if session.quick else GPU_CHAOS
    env = {"ZBATCH_MODEL_PATH": str(folder), "ZBATCH_MODEL_NAME": SHAPED} | shaped_env(session.quick)
    result = await run_chaos(plan, SHAPED, env, f"zbatch serve, 2 brokers, {E5_SMALL.name}, real model",
                             workers=2 if session.quick else None)
    session.rows.append(result)


async def start_step(session: Session, folder: Path) -> None:
    """A fresh ``zbatch serve`` as shipped, loaded the moment ``/readyz`` first answers."""
    clients = 32 if session.quick else START_CLIENTS
    seconds = 10.0 if session.quick else START_SECONDS
    env = {"ZBATCH_MODEL_PATH": str(folder), "ZBATCH_MODEL_NAME": SHAPED} | shaped_env(session.quick)
    with procs.running() as daemons:
        spawned = time.time()
        served = daemons.add(spawn_serve(daemons.log_dir, "zbatch-serve", env=env, workers=2) if session.quick
                             else spawn_serve(daemons.log_dir, "zbatch-serve", env=env))
        url = served.url
        children = await start_children("http", f"{url}/models/{SHAPED}", SHAPED, clients, 0.0, seconds,
                                        LOAD_PROCESSES, 1, "--records", "--ready", f"{url}/readyz")
        results = await collect(children)
        registered = registrations(served)
    ready = min(result["started"] for result in results)
    answered = [float(at) for result in results for _, at, status in result["records"] if status == "ok"]
    started = staggered_row(clients, results, registered, f"zbatch serve as shipped, {E5_SMALL.name}, from /readyz")
    started["detail"] |= {"readyz_s": round(ready - spawned, 2),
                          "registered_from_spawn_s": [round(t - spawned, 2) for t in registered],
                          "first_200_s": round(min(answered) - spawned, 2) if answered else None}
    session.rows.append(started)


async def rates_step(session: Session, path: str, name: str, folders: dict[Shape, Path]) -> None:
    tokens = await asyncio.to_thread(mean_tokens, path, sentences())
    loads = ((2, 1), (4, 8)) if session.quick else ((512, 1), (64, 32))
    with Daemons() as daemons:
        served = await serve(daemons, path, name, "default")
        session.notes.append(f"zbatch serve (the bundled model) answered {served.startup_s:.1f} s after its start")
        for kind in ("http", "zmq"):
            for clients, texts in ((1, 1), *loads):
                if kind == "zmq" and texts > 1:
                    continue
                result = await session.load(kind, served.target(kind), name, clients, texts)
                session.rows.append(row("rates", f"{name}, {kind.upper()}, {texts} a request", clients,
                                        with_tokens(result, tokens)))
                session.save()
    for shape, folder in folders.items():
        with Daemons() as daemons:
            served = await serve(daemons, str(folder), SHAPED, shape.folder_name, env=shaped_env(session.quick))
            for clients, texts in loads:
                result = await session.load("http", served.target("http"), SHAPED, clients, texts)
                session.rows.append(row("rates", f"{shape.name}, HTTP, {texts} a request", clients,
                                        with_tokens(result, tokens), startup_s=served.startup_s))
                session.save()


async def fronts_step(session: Session, path: str, name: str) -> None:
    clients = 8 if session.quick else 512
    for brokers, processes in LAYOUTS:
        with Daemons() as daemons:
            served = await serve(daemons, path, name, f"fronts-{brokers}x{processes}", "--processes",
                                 str(processes), brokers=brokers)
            for kind in ("http", "zmq"):
                result = await session.load(kind, served.target(kind), name, clients)
                session.rows.append(row("fronts", f"{brokers} broker(s), {processes} gateway processes, "
                                        f"{kind.upper()}", clients, result))
                session.save()


Variant = tuple[str, str, tuple[str, ...], dict[str, str]]  # (what the row adds, layout name, flags, environment)


async def compared(session: Session, path: str, model: str, label: str, variants: list[Variant],
                   loads: tuple[tuple[int, int], ...]) -> None:
    """Each variant on a fresh ``zbatch serve`` of the model at ``path``, under each (clients, texts) load over HTTP:
    a row each, saved as it comes."""
    tokens = await asyncio.to_thread(mean_tokens, path, sentences())
    for what, layout, args, env in variants:
        with Daemons() as daemons:
            served = await serve(daemons, path, model, layout, *args, env=env)
            for clients, texts in loads:
                result = await session.load("http", served.target("http"), model, clients, texts)
                session.rows.append(row("rates", f"{label}, HTTP, {texts} a request, {what}", clients,
                                        with_tokens(result, tokens), startup_s=served.startup_s))
                session.save()


async def unpadded_step(session: Session, folder: Path, shape: Shape) -> None:
    """Padded (graphed) batches against packed ones where they win, on a model where the GPU is the bound."""
    variants: list[Variant] = [(f"unpadded attention {setting}", f"unpadded-{setting}", (),
                                shaped_env(session.quick) | {"ZBATCH_UNPADDED_ATTENTION": setting})
                               for setting in ("off", "auto")]
    await compared(session, str(folder), SHAPED, shape.name, variants, ((4, 8),) if session.quick else ((64, 32),))


async def edge_step(session: Session, path: str, name: str) -> None:
    """Tokenizing in the workers against tokenizing in the gateway processes, on the same host."""
    variants: list[Variant] = [(f"edge_tokenize {setting}", f"edge-{setting}", (), {"ZBATCH_EDGE_TOKENIZE": setting})
                               for setting in ("false", "true")]
    await compared(session, path, name, name, variants, ((8, 1), (4, 8)) if session.quick else ((512, 1), (64, 32)))


async def workers_step(session: Session, folder: Path, shape: Shape) -> None:
    """Workers per GPU for a model whose batches the GPU, not the workers' CPU side, sets the pace of."""
    flag = "--workers" if session.quick else "--workers-per-gpu"
    variants: list[Variant] = [(f"{count} worker(s) per GPU", f"workers-{count}", (flag, str(count)),
                                shaped_env(session.quick)) for count in ((1, 2) if session.quick else WORKERS_PER_GPU)]
    await compared(session, str(folder), SHAPED, shape.name, variants,
                   ((4, 8), (8, 1)) if session.quick else ((64, 32), (512, 1)))


async def client_step(session: Session, path: str, name: str) -> None:
    """Texts tokenized in the workers against in the ZeroMQ clients (``AsyncClient``'s ``tokenize``), one stack."""
    tokens = await asyncio.to_thread(mean_tokens, path, sentences())
    loads = ((1, 1), (8, 1), (4, 8)) if session.quick else ((1, 1), (512, 1), (64, 32))
    with Daemons() as daemons:
        served = await serve(daemons, path, name, "client-tokenize")
        for tokenize in (False, True):
            for clients, texts in loads:
                result = await session.load("zmq", served.target("zmq"), name, clients, texts, tokenize)
                session.rows.append(row("rates", f"{name}, ZMQ, {texts} a request, client tokenize "
                                        f"{'on' if tokenize else 'off'}", clients, with_tokens(result, tokens)))
                session.save()


async def lone_step(session: Session, path: str, name: str) -> None:
    """One client, one text a request, over ZeroMQ and HTTP on one ``zbatch serve``, each stage of a request timed
    from the marks of every process (the client's in this process over ZeroMQ, in the gateway's over HTTP); then
    the same with the cores held out of deep idle states, where this process may hold them.  Each pass's tables
    are saved as it ends, and made again from every mark once the stack has stopped."""
    session.notes.append(f"lone: {wakeup.idle_states()}; the bound in force before the step: "
                         f"{wakeup.bound_us()} µs (None: unreadable)")
    if not session.quick:
        session.notes.append("lone: over HTTP zbatch serve's gateway tokenizes where its workers run on GPUs "
                             "(edge_tokenize), so its first stage holds the tokenizer and the worker's 'tokenizing' "
                             "turns ids into its encoding; over ZeroMQ the worker tokenizes the texts")
    folder = Path(tempfile.mkdtemp(prefix="zbatch-marks-"))
    uninstall = marks.install_now(lone.CLIENT_POINTS, folder)
    titled: list[tuple[str, lone.Window]] = []
    tables_before = len(session.tables)

    def tabulate() -> None:
        marked = marks.read_marks(folder)
        session.tables[tables_before:] = [lone.report(title, marked, window) for title, window in titled]
        session.save()

    try:
        with Daemons() as daemons:
            served = await serve(daemons, path, name, "lone", env=lone.marked_env(folder), brokers=1)

            async def timed(how: str) -> None:
                windows = await lone.lone_windows(("zmq", "http"), served.url, served.frontend, name, *session.windows)
                titled.extend((f"lone, {name}, {lone.path_title(w.path)}, {how}", w) for w in windows)
                await asyncio.to_thread(tabulate)

            await timed("cores idling as the host sets")
            with wakeup.held(0, logging.getLogger("zbatch.bench")) as held:
                if held:
                    await timed("cores held out of deep idle (cpu_dma_latency 0)")
                else:
                    session.notes.append("lone: no pass with the cores held out of deep idle (the hold could not "
                                         "be taken: see the log)")
    finally:
        uninstall()
    await asyncio.to_thread(tabulate)
    shutil.rmtree(folder, ignore_errors=True)


async def step(session: Session, name: str, work: Callable[[], Awaitable[None]]) -> None:
    """One step within its time limit; a failure is noted and the next step runs."""
    procs.log(f"gpu session: {name}")
    started = time.monotonic()
    try:
        await asyncio.wait_for(work(), STEP_LIMITS_S[name] * (3 if session.quick else 1))
        session.notes.append(f"{name}: done in {time.monotonic() - started:.0f} s")
    except Exception as exc:  # one step's failure must not cost the others
        session.notes.append(f"{name}: failed after {time.monotonic() - started:.0f} s: {exc!r}")
        traceback.print_exc()
    session.save()


def report(rows: list[dict[str, Any]], notes: list[str]) -> list[str]:
    """The run as Markdown: its notes, one table of the rates and fronts, the transitions' detail."""
    lines = [f"- {note}" for note in notes]
    lines += ["", "| step | what | clients | requests/s | texts/s | tokens/s | p50 ms | p99 ms | errors | host cores "
              "| GPU busy % |", "|---" * 11 + "|"]
    for r in rows:
        if r["case"] in ("rates", "fronts"):
            d = r["detail"]
            lines.append(f"| {r['case']} | {r['system']} | {r['concurrency']} | {_n(r['req_s'])} | "
                         f"{_n(r['texts_s'])} | {_n(d.get('tokens_s'))} | {_n(r['p50_ms'])} | {_n(r['p99_ms'])} | "
                         f"{r['errors']} | {_n(d.get('machine_cores'))} | {_n(d.get('gpu_busy_pct'))} |")
    for r in rows:
        if r["case"] in ("chaos", "staggered"):
            d = r["detail"]
            lines += ["", f"{r['case']}: {d['ok']:,} answered 200 of {d['sent']:,}; {d['refused']} refused, "
                      f"{d['lost']} lost, {d['failed']} other errors"]
            if r["case"] == "staggered":
                lines.append(f"/readyz at {d['readyz_s']} s, registrations at {d['registered_from_spawn_s']} s, "
                             f"first 200 at {d['first_200_s']} s from the spawn; 200 from 1 s after the last "
                             f"registration {d['share_ok_after_1s']}, from 2 s {d['share_ok_after_2s']}")
    return lines + section(rows)


def _n(value: Any) -> str:
    if value is None:
        return "–"
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.1f}"


def machine() -> str:
    """The GPU and the host's cores, in words."""
    smi = shutil.which("nvidia-smi")
    gpu = subprocess.run([smi, "--query-gpu=name,memory.total", "--format=csv,noheader"], capture_output=True,
                         text=True, check=False).stdout.strip() if smi else "no GPU"
    return f"{gpu}; {os.cpu_count()} CPU cores"


async def main(out: Path, quick: bool, steps: list[str]) -> None:
    cuda = await asyncio.to_thread(cuda_available)
    if not cuda and not quick:
        raise SystemExit("no CUDA here: run with --quick for the CPU's short form")
    session = Session(out, quick)
    session.notes.append(f"{machine()}; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    path, name = model_folder()
    root = Path(tempfile.mkdtemp(prefix="zbatch-shapes-"))
    shapes = (E5_SMALL,) if quick else (E5_SMALL, BERT_BASE)
    folders = {shape: await asyncio.to_thread(shaped_model, shape, root, path) for shape in shapes}
    work: dict[str, Callable[[], Awaitable[None]]] = {
        "chaos": lambda: chaos_step(session, folders[E5_SMALL]),
        "start": lambda: start_step(session, folders[E5_SMALL]),
        "rates": lambda: rates_step(session, path, name, folders),
        "fronts": lambda: fronts_step(session, path, name),
        "unpadded": lambda: unpadded_step(session, folders[shapes[-1]], shapes[-1]),
        "edge": lambda: edge_step(session, path, name),
        "workers": lambda: workers_step(session, folders[shapes[-1]], shapes[-1]),
        "client": lambda: client_step(session, path, name),
        "lone": lambda: lone_step(session, path, name),
    }
    for each in steps:
        await step(session, each, work[each])


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "gpu-session-out")))
    parser.add_argument("--quick", action="store_true", help="the CPU's short form, to test the script")
    parser.add_argument("--steps", default=",".join(STEP_LIMITS_S), help="comma-separated steps to run, in order")
    args = parser.parse_args()
    asyncio.run(main(args.out, args.quick, [s for s in args.steps.split(",") if s]))


if __name__ == "__main__":
    cli()
