"""Turn result rows into ratios, a Markdown table, BENCHMARKS.md and bench-results.json.

Ratios compare rows of the same run only: on a shared 2-core machine the
absolute numbers drift from run to run, their ratios much less.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import time
from pathlib import Path
from typing import Any

from scripts.benchmarks.cases.model import LIMIT_OF_SERVED, LIMIT_POINTS
from worker.runners.device import NATIVE_BFLOAT16_FLAGS, cpu_flags

CASE_ORDER = ("limit", "zbatch-http", "zbatch-zmq", "zbatch-serve", "baseline-naive", "baseline-batched",
              "limit-bf16", "zbatch-bf16", "peers", "routing", "gateway", "idle", "overload", "storm", "shed", "scale",
              "overlap", "chaos", "staggered")
NOISY_CORES = 0.25  # CPU used by other processes during a window that makes its row suspect
SECTION_ONLY = ("start",)  # cases with no requests to count: their figures are in a section of their own
COLUMNS = ("case", "system", "concurrency", "req/s", "texts/s", "p50 ms", "p99 ms", "errors", "ratio", "other cpu")


def find(rows: list[dict[str, Any]], case: str, system: str | None = None,
         concurrency: Any = None) -> dict[str, Any] | None:
    for r in rows:
        if r["case"] == case and system in (None, r["system"]) and concurrency in (None, r["concurrency"]):
            return r
    return None


def scale_one(rows: list[dict[str, Any]], series: str) -> dict[str, Any] | None:
    """The one-worker row of a scale series: the unit its other rows are compared with."""
    return next((r for r in rows if r["case"] == "scale" and r["detail"].get("series") == series
                 and r["detail"]["workers"] == 1), None)


def idle_added(rows: list[dict[str, Any]]) -> dict[str, float]:
    """The idle case's ms over its sleeping model, by server ("zbatch gateway", "bare aiohttp")."""
    return {r["detail"]["server"]: r["detail"]["added_ms"] for r in rows if r["case"] == "idle"}


def times(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _ratio_text(value: float | None, what: str) -> str | None:
    return None if value is None else f"{value:.2f}× {what}"


def _added(r: dict[str, Any], ref: dict[str, Any] | None) -> str | None:
    if ref is None or r["p50_ms"] is None or ref["p50_ms"] is None:
        return None
    return f"{r['p50_ms'] - ref['p50_ms']:+.2f} ms p50"


def add_ratios(rows: list[dict[str, Any]]) -> None:
    """Fill each row's ``ratio`` against its reference in the same run (see RATIO_NOTE)."""
    ceilings = {case: find(rows, case, "direct, batch 32") for case in LIMIT_POINTS}
    for r in rows:
        case, c = r["case"], r["concurrency"]
        paired = r["detail"].get("paired", {})
        parts: list[str | None] = []
        if case in ceilings:
            ceiling = ceilings[case]
            if r is not ceiling:
                parts.append(_ratio_text(times(r["texts_s"], ceiling["texts_s"] if ceiling else None), "batch 32"))
            if case == "limit-bf16":  # the same shape in float32: a ratio of the two rows' medians
                float32_row = find(rows, "limit", r["system"])
                parts.append(_ratio_text(times(r["texts_s"], float32_row["texts_s"] if float32_row else None),
                                         "float32"))
        elif case in LIMIT_OF_SERVED:
            limit = LIMIT_OF_SERVED[case]
            parts.append(_ratio_text(paired.get("vs_limit"), f"{limit} b32"))
            parts.append(_ratio_text(paired.get("vs_batched"), "batched") if case.startswith("zbatch") else None)
            parts.append(_ratio_text(paired.get("vs_float32"), "float32"))
            if "p50_over_limit_ms" in paired:
                parts.append(f"{paired['p50_over_limit_ms']:+.1f} ms p50 over {limit} b1")
        elif case == "peers":
            if "vs_best_peer" in paired:
                parts.append(f"{paired['vs_best_peer']:.2f}× best peer ({paired['best_peer']})")
            parts.append(_ratio_text(paired.get("vs_zbatch"), "zbatch"))
        elif case in ("routing", "gateway"):
            ref = find(rows, case, "zmq.proxy" if case == "routing" else "bare aiohttp", c)
            if ref is not None and ref is not r:
                name = "proxy" if case == "routing" else "bare"
                parts += [_ratio_text(times(r["req_s"], ref["req_s"]), name), _added(r, ref)]
        elif case == "idle":
            parts.append(f"{r['detail']['added_ms']:+.2f} ms p50 over its model")
        elif case in ("overload", "storm"):
            parts.append(_ratio_text(times(r["req_s"], r["detail"]["capacity_req_s"]), "capacity"))
        elif case == "shed" and "capacity_texts_s" in r["detail"]:
            parts.append(_ratio_text(times(r["texts_s"], r["detail"]["capacity_texts_s"]), "capacity"))
        elif case == "overlap":
            parts.append(_ratio_text(paired.get("vs_inline"), "inline"))
        elif case == "scale":
            one = scale_one(rows, r["detail"]["series"])
            n = r["detail"]["workers"]
            if one is not None and n > 1:
                parts.append(_ratio_text(times(r["req_s"], one["req_s"] and n * one["req_s"]), f"{n}×(N=1)"))
            parts.append(_ratio_text(times(r["req_s"], r["detail"]["ideal_req_s"]), "ideal"))
        r["ratio"] = " · ".join(p for p in parts if p)


def number(value: float | None) -> str:
    if value is None:
        return "–"
    return f"{value:,.0f}" if value >= 100 else f"{value:.1f}" if value >= 10 else f"{value:.2f}"


def _errors(r: dict[str, Any]) -> str:
    """Errors, or a loud note when nothing finished inside the window (the system stalled)."""
    late = r["detail"].get("late") or 0
    if not r["detail"].get("requests") and late:
        return f"**stalled: {late} answered after the window**"
    return str(r["errors"])


def _noise(r: dict[str, Any]) -> str:
    other = r.get("other_cores")
    if other is None:
        return "–"
    return f"**{other:.2f}**" if other >= NOISY_CORES else f"{other:.2f}"


def sorted_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(rows, key=lambda r: CASE_ORDER.index(r["case"]) if r["case"] in CASE_ORDER else 99)


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for r in sorted_rows(rows):
        if r["case"] in SECTION_ONLY:
            continue
        cells = [r["case"], r["system"], str(r["concurrency"]), number(r["req_s"]), number(r["texts_s"]),
                 number(r["p50_ms"]), number(r["p99_ms"]), _errors(r), r["ratio"], _noise(r)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def machine() -> dict[str, Any]:
    """What the numbers were measured on, without importing torch into the load generator."""
    cpuinfo = Path("/proc/cpuinfo").read_text(errors="replace") if Path("/proc/cpuinfo").exists() else ""
    models = [line.split(":", 1)[1].strip() for line in cpuinfo.splitlines() if line.startswith("model name")]
    meminfo = Path("/proc/meminfo").read_text() if Path("/proc/meminfo").exists() else ""
    mem_kb = next((int(line.split()[1]) for line in meminfo.splitlines() if line.startswith("MemTotal")), 0)

    def version(package: str) -> str:
        try:
            return importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            return "not installed"

    import zmq

    bf16 = sorted(cpu_flags(cpuinfo) & NATIVE_BFLOAT16_FLAGS)
    return {"cpu": models[0] if models else platform.processor() or "unknown", "cpus_listed": len(models),
            "bfloat16": ", ".join(bf16) if bf16 else "emulated (no avx512_bf16 or amx_bf16)",
            "nproc": len(os.sched_getaffinity(0)), "memory_gib": round(mem_kb / 2**20, 1),
            "kernel": platform.release(), "python": platform.python_version(), "torch": version("torch"),
            "transformers": version("transformers"), "pyzmq": zmq.__version__, "libzmq": zmq.zmq_version(),
            "aiohttp": version("aiohttp")}


CASE_NOTES = """
## Cases

* **limit**: the model called directly in one process, 2 torch threads, texts in seeded random order;
  one padded forward pass per batch (the offline rate), and once more as zbatch runs a batch (the rows "grouped by
  length": for this BERT on a CPU, one packed pass with no padding, `worker/runners/packing.py`).
* **zbatch-http / zbatch-zmq**: broker + one worker (2 torch threads) + gateway as real processes;
  closed loop, one text per request, over HTTP (aiohttp client) or the project's AsyncClient.
* **zbatch-serve**: zbatch as `scripts/serve` ships it: broker + its default 2 workers, which share the
  cores through their cores ledger (`worker/cores.py`), + gateway with its default settings; over HTTP like
  zbatch-http.
* **baseline-naive / baseline-batched**: the Hugging Face *pipelines for a webserver* guide as written,
  and with its batching done right (`scripts/benchmarks/systems/baselines.py`); same model code as the limit.
* **zbatch-bf16**: the zbatch-http stack with the worker's `--dtype bfloat16`, over HTTP, and its own limit
  in bfloat16 (the limit-bf16 rows); `float32` in their ratio is the same point in float32 (zbatch-http,
  limit: select those cases too). bfloat16 is opt-in: faster on CPUs with AVX512-BF16 or AMX (see the
  machine line), and its vectors differ slightly from float32's.
* These eight are measured **in rounds**: every system stays loaded, each round measures each point once
  (the limit right before the systems it is compared with), rows show the median over the rounds, and the
  ratios in their `ratio` column are taken inside each round, then the median (this machine drifts 10-30 %
  within a minute).
* **peers**: zbatch over HTTP as `scripts/serve` ships it (the zbatch-serve stack: 2 workers sharing the
  cores) and with one worker (the zbatch-http stack) next to other serving frameworks, each installed on
  first use in its own venv (`$ZBATCH_BENCH_CACHE/peers/NAME`, default `~/.cache/zbatch-bench/peers/NAME`)
  with torch's CPU build, and started from a small script of ours (`scripts/benchmarks/peers/`): Infinity,
  mosec, Triton through PyTriton
  (the real `tritonserver` and its dynamic batcher), LitServe, Ray Serve. All serve the same model folder the
  same way (max batch 32, about 5 ms batching wait, 2 torch threads, truncation at 256 tokens, mean pooling,
  L2 norm), and must give zbatch's vectors (cosine ≥ 0.9999) to be measured; each is frozen (SIGSTOP) except
  while it is measured. Measured in the rounds above, after the other systems at each concurrency: zbatch's
  two rows first, then each peer. Not in `--quick`; `scripts/bench --cases peers` runs it alone (`--peers` picks some).
* **routing**: the zbatch broker vs `zmq.proxy`, each with 2 instant echo workers, same AsyncClient load;
  the same broker with its hot path compiled by mypyc (`scripts/compile-native`, `ZBATCH_NATIVE_DIR`);
  plus a Python forwarder with no logic on the broker's event loop and socket calls: the floor for any
  broker written in Python.
* **gateway**: gateway + broker + echo workers (384-float outputs) vs a bare aiohttp handler answering
  the same bytes.
* **idle**: one closed-loop HTTP client around a model that sleeps 10 ms a call instead of computing (no
  CPU, as on a GPU host): zbatch (gateway, broker, worker) against a bare aiohttp handler that sleeps in
  the handler, the least an HTTP server can add; the middle of the rounds. `python -m scripts.benchmarks.cases.idle`
  goes further: other model times, the ZMQ client, and idle CPUs held polling.
* **overload**: open loop at 4× the capacity measured at concurrency 32, Poisson arrivals.
* **storm**: 512 closed-loop clients that send again at once on 503, against zbatch and against
  baseline-batched, each compared with its own capacity.
* **simulated accelerator** (overload and storm): zbatch with a worker whose batches take as long as
  the real model's here (15 ms + 7 ms per item) but sleep instead of using the CPU, as a GPU host's would.
* **shed**: issue 33's corpus uploads, closed-loop clients of 32 texts a request that follow Retry-After
  on a 503: 16 of them on the `scripts/serve` stack (default deadline), then 64 on one worker with a 5 s
  deadline (`X-Request-Timeout-Ms`), goodput over the same 64 clients' texts/s with the default deadline,
  which they fit; both again on a
  simulated accelerator (2 ms a batch of up to 32) with a 50 ms deadline.
* **scale**: N simulated workers behind one broker, 64 closed-loop clients per worker; "CPU-class"
  sleeps like the real model on this CPU (15 ms + 7 ms per item per batch of at most 32), "GPU-class"
  (5 ms + 0.2 ms per item) is cheap enough that the broker and the Python client become the limit.
* **overlap**: 32 closed-loop clients against the simulated-accelerator worker of
  `python -m scripts.benchmarks.studies.delay`, its model sleeping 2 ms a batch behind the real tokenizer: texts
  tokenized in the model's shadow by the preparation pool (as the worker runs text models), and tokenized by
  the inference thread before each batch; `inline` in its ratio is the first over the second, paired in rounds.
  Then the same pair on the real model: two real workers of one broker, one with the preparation pool and one
  without (`--tokenize-ahead false`), under 32 closed-loop ZeroMQ clients, alternating in rounds.
* **chaos** and **staggered** (issue 38): the stack's transitions on the simulated accelerator of
  `python -m scripts.benchmarks.studies.delay` at GPU rates (the real worker; a batch of up to 128 sleeps 20 ms +
  0.2 ms an item, a fresh worker's first two a second longer each; two batches in flight), so that a refusal is
  the stack's own doing. chaos: `zbatch serve` with 2 brokers and 4 workers, 256 closed-loop clients (3/4
  over HTTP, 1/4 over ZeroMQ to both brokers), kill -9 of 4 workers and 2 brokers 8 s apart, each restarted
  by the supervisor; every request is placed in the window after the kill it was sent in. staggered: 4
  workers that register 0.5 s apart, 512 HTTP clients from the moment `/readyz` answers 200; the share of
  answers that were 200 from 1 s and 2 s after the last registration. `--quick`: 64 clients and 2 kills;
  128 clients.
* **start**: a worker of the default model on the CPU, at its defaults, started again and again beside one
  broker, alternately on a new, empty start cache (cold: it exports, validates and calibrates) and on one a
  start filled first (warm: it reads its ONNX verdict and calibration); seconds from spawning it to the broker
  listing it, and the phases of its start (the Worker start section).
"""

RATIO_NOTE = (
    "ratio: `limit b32` = texts/s over the limit at batch 32 (one padded pass), `limit-bf16 b32` the same in "
    "bfloat16, `batched` = over baseline-batched at the same concurrency, `float32` = a bfloat16 row over "
    "the same point in float32, `over limit b1` = p50 minus the limit's batch-1 p50 (all paired within rounds, "
    "except the limit-bf16 rows' `float32`: a ratio of medians); `best peer` = zbatch's texts/s over the "
    "fastest peer's in the same round (named: the fastest by median), `zbatch` = a peer's over zbatch's (paired "
    "too); `proxy` / `bare` = req/s over zmq.proxy / "
    "bare aiohttp, with the added p50 latency; `over its model` = p50 minus the sleeping model's own mean "
    "time per call; `capacity` = goodput over the capacity measured at concurrency "
    "32; scale: over N times one worker of the same series, and over the simulated workers' ideal. other cpu: "
    "cores used by processes outside this benchmark during the "
    f"measurement (bold from {NOISY_CORES}: that row was disturbed)."
)


ANALYSIS_HEADING = "## Analysis"
ANALYSIS_PLACEHOLDER = "_Write here, by hand, why a target is not met; every run keeps this section as it is._"


def markdown(rows: list[dict[str, Any]], info: dict[str, Any], command: str, quick: bool, charts: list[str],
             failed: list[str], sections: dict[str, list[str]]) -> str:
    """The whole BENCHMARKS.md.

    ``sections``: "targets" and "details" (generated lines), "analysis", "issues" and
    "history" (carried over from the previous file: hand-written, each issue's own section, and the log), and
    "gpu" (the gpu case's section: this run's when it ran on CUDA, else the previous file's).
    """
    m = info
    when = time.strftime("%Y-%m-%d %H:%M %Z")
    header = f"Command: `{command}` ({when})." + (" **Quick run: a smoke test, the numbers are rough.**"
                                                  if quick else "")
    machine_line = (
        f"Machine: {m['cpu']}, {m['nproc']} CPU(s) available (nproc), bfloat16: {m.get('bfloat16', '?')}, "
        f"{m['memory_gib']} GiB, "
        f"Linux {m['kernel']}, Python {m['python']}, torch {m['torch']}, transformers {m['transformers']}, "
        f"pyzmq {m['pyzmq']} (libzmq {m['libzmq']}), aiohttp {m['aiohttp']}. Everything, load generator "
        "included, shares these cores over loopback: read the ratios, which compare rows of this same run."
    )
    lines = ["# Benchmarks", "", header, "", machine_line, *sections["targets"], "", ANALYSIS_HEADING, "",
             *(sections["analysis"] or [ANALYSIS_PLACEHOLDER]), "", "## Results", "", table(rows), "", RATIO_NOTE]
    if failed:
        lines += ["", f"**Failed case(s): {', '.join(failed)}** (the run's stderr has the reason)."]
    lines += sections["details"]
    if sections.get("gpu"):
        gpu = sections["gpu"]
        lines += ["", *(gpu if gpu[0].startswith("## ") else ["## GPU", "", *gpu])]
    if charts:
        lines += ["", "## Charts", ""] + [f"![{Path(c).stem}]({c})" for c in charts]
    lines += sections.get("issues", [])
    return "\n".join(lines) + "\n" + CASE_NOTES + "\n".join(sections["history"]) + "\n"


def write_json(path: Path, rows: list[dict[str, Any]], info: dict[str, Any], command: str, settings: Any,
               failed: list[str]) -> None:
    data = {"command": command, "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "machine": info, "failed": failed,
            "settings": settings, "rows": sorted_rows(rows)}
    path.write_text(json.dumps(data, indent=1, default=str) + "\n")
