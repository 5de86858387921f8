"""The gpu case: the model alone, then ``zbatch serve`` as shipped, on whatever accelerator this host has.

On a host with CUDA it measures what an operator of a GPU host asks:

* the model alone (:mod:`scripts.benchmarks.cases.gpu_model`): each batch size in float32 and float16, CUDA
  graphs on and off, the tokenizer alone, vectors against float32 on the CPU, shapes never seen;
* ``zbatch serve`` with its defaults (its workers per GPU, ``--dtype auto``), from start to serving, then
  closed-loop clients over HTTP and over ZeroMQ at :data:`CLIENTS`, one text a request, and
  :data:`UPLOAD` clients of 32 texts a request; the same stack with one worker per GPU at the largest
  load, for the rule that sets the number;
* mosec on the same GPU in float16, with the same largest batch, where it is installed (infinity-emb too).

Load comes from several processes (:mod:`scripts.benchmarks.load.processes`), which share the host's cores with
the stack: each row says how many cores the whole machine used, and how busy the GPU was.  On a host
without CUDA the same steps run in a short form on the CPU (``--quick``, CI's smoke run), so that the
case cannot rot.  It needs no installs: ``python -m scripts.benchmarks --cases gpu`` runs it from the
environment at hand (a GPU host may have no network).
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from scripts.benchmarks.cases.context import Context, row
from scripts.benchmarks.common import procs
from scripts.benchmarks.common.texts import sentences
from scripts.benchmarks.load.processes import spread_closed_loop
from scripts.benchmarks.peers.venvs import cache_root
from scripts.benchmarks.systems.shapes import BERT_BASE, E5_SMALL, mean_tokens, shaped_model
from worker.runners.spec import DEFAULT_MODEL_NAME, default_model_path
from zbatch.testing import ROOT, Daemon, Daemons, daemon_env, endpoint, free_port, http_status, spawn, start_http

CASE = "gpu"
CLIENTS, QUICK_CLIENTS = (1, 64, 256, 512), (1, 8)
UPLOAD = (16, 32)  # clients, texts a request: a corpus upload
SHAPES = (E5_SMALL, BERT_BASE)  # the anchors' model shapes (issue 41)
SHAPE_LOADS = ((512, 1), (64, 32))  # (clients, texts a request) for each shape, on CUDA
QUICK_SHAPE_LOADS = ((2, 1), (2, 8))
SHAPE_MODEL = "shaped"
LOAD_PROCESSES = 4
MOSEC_TEXT = "mosec 0.9.8, float16"
GPU_HEADING = "## GPU"


def cuda_available() -> bool:
    """Whether this host has CUDA, asked in a child: the bench's own process stays free of a CUDA context."""
    import subprocess

    probe = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.is_available())"],
                           capture_output=True, text=True, env=daemon_env(), check=False)
    return probe.stdout.strip() == "True"


def model_folder() -> tuple[str, str]:
    """The model folder and name to serve: ``ZBATCH_MODEL_PATH`` (a GPU host's copy) or the bundled one."""
    path = os.environ.get("ZBATCH_MODEL_PATH") or default_model_path()
    return path, os.environ.get("ZBATCH_MODEL_NAME") or DEFAULT_MODEL_NAME


async def gpu(ctx: Context) -> None:
    cuda = await asyncio.to_thread(cuda_available)
    quick = ctx.settings.quick and not cuda
    path, name = model_folder()
    procs.log(f"gpu: on {'CUDA' if cuda else 'the CPU (short form)'}; the model alone first")
    tokens = await asyncio.to_thread(mean_tokens, path, sentences())
    alone = await _model_alone(path, quick)
    ctx.gpu_info = alone["info"] | {"extra": alone["extra"], "cuda": cuda}
    for r in alone["rows"]:
        _keep(ctx, row(f"{CASE}-model", r["system"], r["concurrency"], r))
    clients = QUICK_CLIENTS if quick else CLIENTS
    warmup_s, duration_s = (0.5, 1.5) if quick else (2.0, 8.0)
    with Daemons() as daemons:
        served = await serve(daemons, path, name, "default")
        ctx.gpu_info["startup_s"] = served.startup_s
        for kind in ("http", "zmq"):
            for c in clients:
                procs.log(f"gpu: zbatch serve over {kind.upper()} at {c} clients")
                result = await spread_closed_loop(kind, served.target(kind), name, c, warmup_s, duration_s,
                                                  LOAD_PROCESSES)
                _keep(ctx, row(CASE, f"zbatch serve, {kind.upper()}", c, with_tokens(result, tokens)))
        upload_clients, texts = (2, 8) if quick else UPLOAD
        procs.log(f"gpu: {upload_clients} clients x {texts} texts a request over HTTP")
        result = await spread_closed_loop("http", served.target("http"), name, upload_clients, warmup_s,
                                          duration_s, LOAD_PROCESSES, texts=texts)
        _keep(ctx, row(f"{CASE}-upload", f"zbatch serve, HTTP, {texts} texts a request", upload_clients,
                            with_tokens(result, tokens)))
    if cuda:
        await _one_worker_per_gpu(ctx, path, name, warmup_s, duration_s)
    await _shapes(ctx, cuda, quick, warmup_s, duration_s, tokens)
    await _mosec(ctx, path, name, clients, warmup_s, duration_s, cuda)


def _keep(ctx: Context, measured: dict[str, Any]) -> None:
    """A row kept for the report and logged whole at once, so a device run cut short still brings it back."""
    ctx.rows.append(measured)
    procs.log(f"gpu row: {json.dumps(measured, default=str)}")


def with_tokens(result: dict[str, Any], tokens_per_text: float) -> dict[str, Any]:
    """``result`` with its tokens/s: its texts/s times the mean tokens of the texts the load sends (every load
    process cycles through the same texts)."""
    return result | {"tokens_s": (result.get("texts_s") or 0.0) * tokens_per_text,
                     "tokens_per_text": round(tokens_per_text, 1)}


async def _shapes(ctx: Context, cuda: bool, quick: bool, warmup_s: float, duration_s: float,
                  tokens: float) -> None:
    """``zbatch serve`` with models of the anchors' shapes (random weights: only speed is measured), one text
    a request at the most clients and 32 texts a request; in the CPU's short form, the small shape alone on
    torch (an ONNX export of it would be most of the case's time) with a few clients."""
    shapes, loads = (SHAPES, SHAPE_LOADS) if cuda else ((E5_SMALL,), QUICK_SHAPE_LOADS)
    env = {} if cuda else {"ZBATCH_RUNTIME": "torch"}
    for shape in shapes:
        folder = await asyncio.to_thread(shaped_model, shape, cache_root() / "shapes", model_folder()[0])
        with Daemons() as daemons:
            served = await serve(daemons, str(folder), SHAPE_MODEL, f"shape-{shape.folder_name}", env=env)
            for clients, texts in loads:
                procs.log(f"gpu: {shape.name}: {clients} clients x {texts} texts a request over HTTP")
                result = await spread_closed_loop("http", served.target("http"), SHAPE_MODEL, clients, warmup_s,
                                                  duration_s, LOAD_PROCESSES, texts=texts)
                _keep(ctx, row(f"{CASE}-shape", f"{shape.name}, HTTP, {texts} text{'s' * (texts > 1)} a "
                                    "request", clients, with_tokens(result, tokens), startup_s=served.startup_s))


async def _model_alone(path: str, quick: bool) -> dict[str, Any]:
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "scripts.benchmarks.cases.gpu_model", "--model", path, *(["--quick"] if quick else []),
        stdout=asyncio.subprocess.PIPE, env=daemon_env(), cwd=ROOT)
    stdout, _ = await child.communicate()
    if child.returncode != 0:
        raise RuntimeError(f"the model-alone measurement failed with status {child.returncode}")
    result: dict[str, Any] = json.loads(stdout)
    return result


class Served:
    """A running ``zbatch serve`` and its two doors."""

    def __init__(self, daemon: Daemon, url: str, frontend: str, model: str, startup_s: float) -> None:
        self.daemon, self.url, self.frontend, self.model, self.startup_s = daemon, url, frontend, model, startup_s

    def target(self, kind: str) -> str:
        return f"{self.url}/models/{self.model}" if kind == "http" else self.frontend


async def serve(daemons: Daemons, path: str, name: str, layout: str, *args: str,
                env: dict[str, str] | None = None, brokers: int = 1) -> Served:
    """``zbatch serve`` with the model at ``path``, ``brokers`` brokers and the ``ZBATCH_*`` settings of this run's
    environment (then ``env``); it counts as started once an embedding comes back."""
    port = free_port()
    frontend, backend = (",".join(endpoint() for _ in range(brokers)) for _ in range(2))
    started = time.monotonic()
    settings = {key: value for key, value in os.environ.items() if key.startswith("ZBATCH_")}  # the operator's
    daemon = daemons.add(spawn("zbatch", f"serve-{layout}", daemons.log_dir, "serve", *args, port=port,
                               frontend=frontend, backend=backend, interpreter=None,
                               env=settings | (env or {}) | {"ZBATCH_MODEL_PATH": path, "ZBATCH_MODEL_NAME": name}))
    url = f"http://127.0.0.1:{port}"
    body = json.dumps({"inputs": "warm"}).encode()

    def answers() -> bool:
        daemon.check()
        if http_status(f"{url}/readyz") != 200:
            return False
        return _post_status(f"{url}/models/{name}", body) == 200

    await procs.blocking(daemons.wait, answers, "zbatch serve to answer", 300.0)
    startup = time.monotonic() - started
    procs.log(f"gpu: zbatch serve ({layout}) answered {startup:.1f} s after it was started")
    return Served(daemon, url, frontend, name, startup)


def _post_status(url: str, body: bytes) -> int | None:
    import urllib.error
    import urllib.request

    request = urllib.request.Request(url, body, {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return None


async def _one_worker_per_gpu(ctx: Context, path: str, name: str, warmup_s: float, duration_s: float) -> None:
    """The rule for workers per GPU: one against the default, at the largest load, over HTTP."""
    with Daemons() as daemons:
        served = await serve(daemons, path, name, "one-per-gpu", "--workers-per-gpu", "1")
        c = CLIENTS[-2]
        procs.log(f"gpu: zbatch serve, 1 worker per GPU, over HTTP at {c} clients")
        result = await spread_closed_loop("http", served.target("http"), name, c, warmup_s, duration_s,
                                          LOAD_PROCESSES)
        _keep(ctx, row(CASE, "zbatch serve, 1 worker per GPU, HTTP", c, result))


async def _mosec(ctx: Context, path: str, name: str, clients: tuple[int, ...], warmup_s: float, duration_s: float,
                 cuda: bool) -> None:
    """mosec on the same device, where it is installed: its batcher with zbatch's largest batch there."""
    if importlib.util.find_spec("mosec") is None:
        procs.log("gpu: mosec is not installed here; no peer row")
        return
    from scripts.benchmarks.peers import DEVICE_ENV, DTYPE_ENV, MAX_BATCH_ENV

    env = {DEVICE_ENV: "cuda", DTYPE_ENV: "float16", MAX_BATCH_ENV: "128"} if cuda else {}
    with Daemons() as daemons:
        mosec = daemons.add(start_http("scripts.benchmarks.peers.mosec_server", "mosec", daemons.log_dir,
                                       "--model", path, ready="/", env=env))
        url = f"{mosec.url}/inference"
        for c in clients:
            procs.log(f"gpu: mosec at {c} clients")
            result = await spread_closed_loop("http", url, name, c, warmup_s, duration_s, LOAD_PROCESSES)
            _keep(ctx, row(CASE, MOSEC_TEXT if cuda else "mosec 0.9.8", c, result))


def section(rows: list[dict[str, Any]], info: dict[str, Any] | None) -> list[str]:
    """BENCHMARKS.md's GPU section from this run's rows, if it ran on CUDA; else nothing (the old one stays)."""
    if not info or not info.get("cuda"):
        return []
    lines = [GPU_HEADING, "", f"{info['device']}, {info['cpus']} CPU cores, torch {info['torch']} "
             f"(CUDA {info['cuda_version']}), transformers {info['transformers']}, Python {info['python']}; "
             "`zbatch serve` as shipped "
             f"(answered {info['startup_s']:.1f} s after its start). Load from {LOAD_PROCESSES} processes on the "
             "same host; each row gives the host's busy cores and the GPU's mean utilization.", "",
             "Tokens/s: texts/s times the mean tokens of the texts sent "
             f"({_tokens_per_text(rows)} a text with the bundled model's tokenizer, special tokens included). "
             "The shaped models have the bundled model's tokenizer and random weights.", "",
             "| what | clients | requests/s | texts/s | tokens/s | p50 ms | p99 ms | errors | host cores "
             "| GPU busy % |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r["case"] in (CASE, f"{CASE}-upload", f"{CASE}-shape"):
            detail = r["detail"]
            lines.append(f"| {r['system']} | {r['concurrency']} | {_n(r['req_s'])} | {_n(r['texts_s'])} | "
                         f"{_n(detail.get('tokens_s'))} | {_n(r['p50_ms'])} | {_n(r['p99_ms'])} | {r['errors']} | "
                         f"{_n(detail.get('machine_cores'))} | {_n(detail.get('gpu_busy_pct'))} |")
    lines += ["", "The model alone, one Python thread (texts/s by batch size):", "",
              "| runner | " + " | ".join(str(b) for b in _batches(rows)) + " |",
              "|---|" + "---|" * len(_batches(rows))]
    systems = dict.fromkeys(r["system"] for r in rows if r["case"] == f"{CASE}-model")
    for system in systems:
        by_batch = {r["concurrency"]: r["texts_s"] for r in rows if r["case"] == f"{CASE}-model"
                    and r["system"] == system}
        lines.append(f"| {system} | " + " | ".join(_n(by_batch.get(b)) for b in _batches(rows)) + " |")
    extra = info.get("extra", {})
    startup = "; ".join(f"{label} {seconds:.1f} s" for label, seconds in info.get("runner_startup_s", {}).items())
    cosines = "; ".join(f"{label} {cosine:.7f}" for label, cosine in extra.get("cosine_vs_cpu_float32", {}).items())
    lines += ["", f"Start-up of each runner (load, warm every bucket, capture graphs): {startup}.",
              f"Cosine against float32 on the CPU (lowest of 64 texts, one over 256 tokens): {cosines}.",
              "Batches of one text of a length not seen before, float16: with buckets "
              f"{_timings(extra.get('new_shapes_bucketed'))}; without, {_timings(extra.get('new_shapes_unbucketed'))}."]
    return lines


def _timings(measured: dict[str, Any] | None) -> str:
    if not measured:
        return "not measured"
    return (f"p50 {measured['p50_ms']:.1f} ms, p99 {measured['p99_ms']:.1f} ms, "
            f"the slowest {measured['max_ms']:.1f} ms ({measured['batches']} batches)")


def _tokens_per_text(rows: list[dict[str, Any]]) -> str:
    counts = {r["detail"].get("tokens_per_text") for r in rows if r["case"].startswith(CASE)} - {None}
    return ", ".join(str(count) for count in sorted(counts)) or "–"


def _batches(rows: list[dict[str, Any]]) -> list[int]:
    return sorted({r["concurrency"] for r in rows if r["case"] == f"{CASE}-model"})


def _n(value: Any) -> str:
    if value is None:
        return "–"
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.1f}"


def write_raw(rows: list[dict[str, Any]], info: dict[str, Any] | None, folder: Path) -> None:
    """The case's rows and machine as JSON next to the other outputs, for the device run to bring back."""
    ours = [r for r in rows if r["case"].startswith(CASE)]
    if ours:
        (folder / "gpu-results.json").write_text(json.dumps({"info": info, "rows": ours}, indent=1, default=str))
