"""Where each core goes at GPU rates: CPU per request in each daemon, over HTTP and over ZeroMQ.

``python -m scripts.benchmarks.studies.cpu_path [--concurrency 32,128] [--seconds 8] [--batch-ms 2] [--item-ms 0.01]
[--profile DIR] [--edge-tokenize true] [--client-tokenize true] [--paths http,zmq]`` starts one real stack (a broker,
one worker, a gateway of one process: the harness the bench uses) and drives it with closed-loop clients, one text a
request, over HTTP (the bench's aiohttp calls) and over ZeroMQ (the project's AsyncClient). It prints a Markdown table:
for each path and number of clients, the requests a second and the µs of CPU per request each daemon took (the load
generator, this process, included) and their total, read from /proc (:func:`scripts.benchmarks.common.cpu.process_use`).

The worker's model is a sleep, as in :mod:`scripts.benchmarks.systems.accelerator`: :class:`EmbeddingSleepRunner`
tokenizes the texts with the bundled model's real tokenizer (ahead, as a worker on an accelerator does), sleeps a fixed
time per batch plus a little per item, like a GPU, and answers one 384-float vector per text, as the bundled
model does.  It takes token ids as well as texts, so with ``--edge-tokenize true`` the gateway tokenizes for it
(``zbatch/client/tokenizing.py``; off as shipped).  So the accelerator never sets the pace: the CPU the serving path
spends does, and that is what the table prices.  Issue 41 asks for it to fall by half.

With ``--profile DIR`` each cell runs a second window of the same length with py-spy sampling every daemon
(``py-spy record --nonblocking``: the daemons are never paused; with ``--native`` C and Rust frames too, which
needs a pause at each sample); the first window's figures stay free of the profiler's own CPU.  The raw stacks
go to DIR, and a breakdown follows the table: per daemon, the share of its busy samples in each kind of work
(HTTP parsing, JSON, msgpack, tokenizing, the broker's loop, the worker's Python, socket sends and receives, the
load generator's own work; see :data:`KINDS`), priced in µs per request from the first window's CPU, and the
functions that ran in the most samples.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import re
import shutil
import tempfile
from collections import Counter
from collections.abc import Iterable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from scripts.benchmarks.common import procs
from scripts.benchmarks.load import calls
from scripts.benchmarks.load import loops as load
from scripts.benchmarks.systems.accelerator import COST_ENV, MODEL, TokenizingSleepRunner
from worker.runners.spec import InputKind
from zbatch.runtime import eventloop
from zbatch.testing import Daemons, free_port, start_broker, start_worker

BATCH_MS = 2.0  # an accelerator's fixed cost of one batch of a small embedding model
ITEM_MS = 0.01  # and of each item in it
MAX_BATCH = 128  # the worker's default batch on CUDA (worker/config.py)
DIMENSIONS = 384  # the bundled model's vectors: what each reply carries
WARMUP_S = 2.0
PATHS = ("http", "zmq")
DAEMONS = ("gateway", "broker", "worker", "load generator")
PROFILE_RATE = 200  # py-spy samples a second
LINE = re.compile(r":\d+\)$")  # a frame's line number: a function's samples are counted together
WAITING = "waiting, no CPU"
# Kinds of work, each named by pieces of the frames it shows in (Python's, and with --native C's and Rust's); a
# sample is the first kind found in its frames from the innermost outwards, and at each frame the first in this
# order.  py-spy counts a thread busy by its state when it looks, so some waits show: they are kept apart.
KINDS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (WAITING, ("take_gil", "futex", "sem_wait", "sem_timedwait", "pthread_cond", "PyThread_acquire_lock",
               "epoll_wait", "epoll_pwait", "select_poll", "nanosleep", "_Sleeping.__call__",
               "acquire (threading.py")),
    ("tokenizing", ("tokenizers", "tokenization_utils", "_tokenized", "protocol/texts.py")),
    ("msgpack", ("msgpack", "payloads.py")),
    ("JSON", ("json/", "_json.c", "orjson", "json.py", "dumps ", "loads ")),
    ("HTTP parsing and writing", ("aiohttp/", "multidict", "yarl/", "http_", "_http_parser")),
    ("socket sends and receives", ("zmq/", "libzmq", "send", "recv", "read (libc", "write (libc", "writev (libc",
                                   "selector_events", "sock_", "transports", "stream.c")),
    ("garbage collection", ("gc_collect", "gcmodule.c")),
    ("numpy", ("numpy/", "multiarray")),
    ("event loop", ("asyncio/", "uvloop", "eventloop", "loop.c", "uv_run", "uv__", "_asynciomodule")),
    ("broker loop", ("broker/",)),
    ("worker's Python", ("worker/",)),
    ("gateway's Python", ("gateway/",)),
    ("client library", ("zbatch/client",)),
    ("zbatch runtime", ("zbatch/",)),
    ("load generator's own Python", ("scripts/benchmarks", "load.py", "calls.py")),
)


class EmbeddingSleepRunner(TokenizingSleepRunner):
    """:class:`~scripts.benchmarks.systems.accelerator.TokenizingSleepRunner` answering as the bundled model does:
    one unit float32 vector of :data:`DIMENSIONS` numbers per text, so replies weigh what real ones do, and taking
    token ids as the bundled model does."""

    kind = InputKind.TEXT_OR_IDS

    def __init__(self, spec: Any, device: str, dtype: Any) -> None:
        super().__init__(spec, device, dtype)
        vectors = np.random.default_rng(0).standard_normal((MAX_BATCH, DIMENSIONS)).astype(np.float32)
        self._vectors = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)

    def _forward(self, encoded: Any, options: Any) -> list[Any]:
        self._model(**encoded)
        rows = len(encoded["input_ids"])
        return list(np.resize(self._vectors, (rows, DIMENSIONS)))


@dataclass(frozen=True)
class Stack:
    """The system under test: where to send requests, and each daemon's pid."""

    url: str  # the gateway's
    frontend: str
    pids: dict[str, int]
    client_tokenize: bool = False  # the ZeroMQ clients tokenize for the worker (AsyncClient's ``tokenize``)


def start_stack(daemons: Daemons, batch_ms: float, item_ms: float, edge_tokenize: bool = False,
                env: dict[str, str] | None = None) -> Stack:
    """A broker, one worker serving model ``simulated`` on :class:`EmbeddingSleepRunner` (batches of up to
    :data:`MAX_BATCH`, tokenized ahead, one torch thread), and a gateway of one process in front, each daemon
    with ``env`` added to its environment.  The worker finds the runner by this module's import name, which
    ``python -m`` keeps in ``__spec__``."""
    env = env or {}
    broker = daemons.add(start_broker(daemons.log_dir, env=env))
    daemons.add(start_worker(broker, daemons.log_dir, "worker", env=env | {COST_ENV: f"{batch_ms},{item_ms}"},
                             workers=1, torch_threads=1, task=f"python:{__spec__.name}:{EmbeddingSleepRunner.__name__}",
                             model_path=tempfile.mkdtemp(), model_name=MODEL, metrics_port=free_port(),
                             tokenize_ahead="true", max_batch_size=MAX_BATCH))
    url = procs.start_deployed_gateway(daemons, broker, edge_tokenize=edge_tokenize, env=env)
    return Stack(url, broker.frontend, daemons.pids())


def caller(path: str, stack: Stack, concurrency: int) -> AbstractAsyncContextManager[load.Call]:
    """One request of one text over ``path``: POST to the gateway (http) or infer through the broker (zmq)."""
    return calls.one_text_calls(path, stack.url, stack.frontend, MODEL, concurrency, tokenize=stack.client_tokenize)


async def measure(path: str, stack: Stack, concurrency: int, warmup_s: float, seconds: float) -> dict[str, Any]:
    """One closed-loop window: requests a second, and each daemon's CPU per request in µs."""
    async with caller(path, stack, concurrency) as call:
        result = await load.closed_loop(call, concurrency, warmup_s, seconds, watch=stack.pids)
    return {"path": path, "clients": concurrency, "req_s": result["req_s"], "errors": result["errors"],
            "other_cores": result.get("other_cores"), "cpu_us": result.get("cpu_us_per_req", {})}


def path_name(path: str) -> str:
    return "HTTP" if path == "http" else "ZeroMQ"


def format_table(cells: Iterable[dict[str, Any]]) -> str:
    """The Markdown table of :func:`measure`'s cells: one row per path and number of clients."""
    header = ("| path | clients | req/s | " + " | ".join(f"{name} µs" for name in DAEMONS)
              + " | total µs | other cores |")
    lines = [header, "|" + "---|" * (header.count("|") - 1)]
    for cell in cells:
        used = [cell["cpu_us"].get(name) for name in DAEMONS]
        total = sum(value for value in used if value is not None)
        other = cell.get("other_cores")
        figures = " | ".join("–" if value is None else f"{value:,.0f}" for value in used)
        lines.append(f"| {path_name(cell['path'])} | {cell['clients']} | {cell['req_s']:,.0f} | {figures} | "
                     f"{total:,.0f} | {'–' if other is None else f'{other:.2f}'} |")
    return "\n".join(lines)


def frames_of(line: str) -> tuple[list[str], int]:
    """A py-spy raw line's frames, outermost first, and its sample count (``frame;frame;... count``)."""
    stack, _, count = line.rstrip().rpartition(" ")
    return [frame for frame in stack.split(";") if frame], int(count)


def kind_of(frames: list[str]) -> str:
    """The kind of work of one stack (:data:`KINDS`): the innermost frame that names one decides."""
    for frame in reversed(frames):
        for kind, pieces in KINDS:
            if any(piece in frame for piece in pieces):
                return kind
    return "other"


def breakdown(lines: Iterable[str]) -> tuple[Counter[str], Counter[str]]:
    """Samples by kind of work, and by the innermost frame (the function that ran, whatever its line), from
    py-spy's raw lines."""
    kinds: Counter[str] = Counter()
    functions: Counter[str] = Counter()
    for line in lines:
        if not line.strip():
            continue
        frames, count = frames_of(line)
        code = [frame for frame in frames if not frame.startswith(("process ", "thread "))]
        kind = kind_of(code)
        kinds[kind] += count
        if kind != WAITING:
            functions[LINE.sub(")", code[-1]) if code else "(no frame)"] += count
    return kinds, functions


def format_breakdown(name: str, cpu_us: float | None, kinds: Counter[str], functions: Counter[str],
                     top: int = 6) -> str:
    """One daemon's line of the breakdown: each kind's share of the busy samples (and so of the µs per request),
    then the functions that ran in the most busy samples, then the share of samples that were waits."""
    busy = sum(kinds.values()) - kinds[WAITING]
    if not busy:
        return f"- **{name}**: no busy samples"

    def priced(count: int) -> str:
        share = count / busy
        return f"{share:.0%}" + ("" if cpu_us is None else f" ({share * cpu_us:,.0f} µs)")

    ranked = ", ".join(f"{kind} {priced(count)}" for kind, count in kinds.most_common() if kind != WAITING)
    leaders = "; ".join(f"`{function}` {count / busy:.0%}" for function, count in functions.most_common(top))
    cost = "" if cpu_us is None else f", {cpu_us:,.0f} µs a request"
    return (f"- **{name}** ({busy} busy samples{cost}): {ranked}\n  - top functions: {leaders}\n"
            f"  - samples that were waits (no CPU, left out above): {kinds[WAITING] / sum(kinds.values()):.0%}")


async def profiled(path: str, stack: Stack, concurrency: int, warmup_s: float, seconds: float, folder: Path,
                   native: bool = False) -> dict[str, Path]:
    """A second window of the cell with py-spy recording each daemon (this process as the load generator);
    ``native``: C and Rust frames too, which py-spy reads only while it pauses the process."""
    pids = stack.pids | {"load generator": os.getpid()}
    async with caller(path, stack, concurrency) as call:
        runner = asyncio.create_task(load.closed_loop(call, concurrency, warmup_s, seconds))
        await asyncio.sleep(warmup_s)
        files = {name: folder / f"{path}-c{concurrency}-{name.replace(' ', '-')}.txt" for name in pids}
        # A daemon's children are its own (--subprocesses); this process's are the daemons.
        spies = [await asyncio.create_subprocess_exec(
            "py-spy", "record", "--pid", str(pid), "--duration", str(max(1, round(seconds))), "--rate",
            str(PROFILE_RATE), "--format", "raw", "--output", str(files[name]),
            *(("--native",) if native else ("--nonblocking",)),
            *(() if name == "load generator" else ("--subprocesses",)),
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL) for name, pid in pids.items()]
        await asyncio.gather(*(spy.wait() for spy in spies))
        await runner
    return {name: file for name, file in files.items() if file.exists()}


def report_profile(cell: dict[str, Any], files: dict[str, Path]) -> str:
    """The breakdown of one cell's profile, per daemon in :data:`DAEMONS` order."""
    lines = [f"\n### {path_name(cell['path'])}, {cell['clients']} clients"]
    for name in DAEMONS:
        if name in files:
            kinds, functions = breakdown(files[name].read_text().splitlines())
            lines.append(format_breakdown(name, cell["cpu_us"].get(name), kinds, functions))
    return "\n".join(lines)


async def run(args: argparse.Namespace) -> None:
    """Every cell on one stack: the table first, then each cell's breakdown."""
    clients = [int(c) for c in args.concurrency.split(",")]
    cells, profiles = [], []
    with procs.running() as daemons:
        stack = await procs.start(daemons, start_stack, args.batch_ms, args.item_ms, args.edge_tokenize == "true")
        stack = dataclasses.replace(stack, client_tokenize=args.client_tokenize == "true")
        for path in args.paths.split(","):
            for concurrency in clients:
                procs.log(f"{path}, {concurrency} clients")
                cells.append(await measure(path, stack, concurrency, args.warmup, args.seconds))
                if args.profile:
                    files = await profiled(path, stack, concurrency, args.warmup, args.seconds, args.profile,
                                           args.native)
                    profiles.append(report_profile(cells[-1], files))
    print(format_table(cells))
    for profile in profiles:
        print(profile)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", default="32,128", help="comma-separated numbers of closed-loop clients")
    parser.add_argument("--seconds", type=float, default=8.0, help="measuring time per cell")
    parser.add_argument("--warmup", type=float, default=WARMUP_S, help="load before each window, not measured")
    parser.add_argument("--batch-ms", type=float, default=BATCH_MS, help="the simulated model's cost per batch")
    parser.add_argument("--item-ms", type=float, default=ITEM_MS, help="and per item in a batch")
    parser.add_argument("--edge-tokenize", choices=("true", "false"), default="false",
                        help="the gateway's edge_tokenize setting: texts tokenized there, or in the worker")
    parser.add_argument("--client-tokenize", choices=("true", "false"), default="false",
                        help="the ZeroMQ clients' tokenize setting: texts tokenized in the load generator, or in the "
                             "worker")
    parser.add_argument("--paths", default=",".join(PATHS), help="comma-separated paths to measure: http, zmq")
    parser.add_argument("--profile", type=Path, default=None, metavar="DIR",
                        help="also profile each daemon with py-spy in a second window per cell; raw stacks to DIR")
    parser.add_argument("--native", action="store_true",
                        help="with --profile, C and Rust frames too (py-spy --native: it pauses a daemon at each "
                             "sample)")
    args = parser.parse_args()
    if args.profile:
        if shutil.which("py-spy") is None:
            raise SystemExit("--profile needs py-spy on the PATH (pip install py-spy)")
        args.profile.mkdir(parents=True, exist_ok=True)
    print(f"Simulated accelerator: {args.batch_ms:g} ms per batch + {args.item_ms:g} ms per item, batches of up "
          f"to {MAX_BATCH}, texts tokenized ahead; {DIMENSIONS} float32 numbers a reply; one gateway process.\n")
    eventloop.run(run(args))


if __name__ == "__main__":
    main()
