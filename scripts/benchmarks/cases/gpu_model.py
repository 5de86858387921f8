"""The model alone on this host's accelerator (or its CPU): what the gpu case compares the stack with.

``python -m scripts.benchmarks.cases.gpu_model --model DIR [--quick]`` prints one JSON object: rows for
the gpu case and the machine it ran on.  Each runner is the worker's own
(:func:`worker.runners.load_runner`: buckets warmed, CUDA graphs captured as asked), driven from one
Python thread, for each batch size:

* ``one thread``: ``run`` (tokenize, copy, forward, pool, copy back), as a worker without its pool;
* ``planned``: ``run_planned`` over batches tokenized and padded beforehand, what the inference thread
  does once the pool has prepared the batch: the ceiling of a worker whose CPU side keeps up;
* ``tokenizer``: ``encode`` alone, one thread: what one pool thread can prepare.

On CUDA the runners are float32, float16 and float16 with CUDA graphs, then the last with
``--unpadded-attention auto`` (each batch packed where warm-up's timings say it beats its graphed bucket).
Also: float16 against float32 vectors (cosine), the start-up time of each runner, and the time of
batches of one text of lengths no batch had before, with buckets (the worker's way) and without.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from scripts.benchmarks.common.texts import shuffled

BATCHES = (1, 8, 32, 128, 256, 512)
QUICK_BATCHES = (1, 8)


def rate(call: Callable[[], int], seconds: float) -> float:
    """Inputs per second of ``call`` (it returns how many it did) repeated for ``seconds``, after one call."""
    call()
    done, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        done += call()
    return done / (time.perf_counter() - started)


def _cycle(batches: list[Any]) -> Callable[[], Any]:
    state = {"next": 0}

    def take() -> Any:
        state["next"] = (state["next"] + 1) % len(batches)
        return batches[state["next"]]

    return take


def measure_runner(runner: Any, label: str, batch_sizes: tuple[int, ...], seconds: float,
                   texts: list[str], sync: Callable[[], None]) -> list[dict[str, Any]]:
    return [row for size in batch_sizes for row in _measure_size(runner, label, size, seconds, texts, sync)]


def _measure_size(runner: Any, label: str, size: int, seconds: float, texts: list[str],
                  sync: Callable[[], None]) -> list[dict[str, Any]]:
    pool = texts * (1 + 4 * size // len(texts))
    inputs = [pool[i * size:(i + 1) * size] for i in range(4)]  # four batches of mixed lengths, in turn
    take = _cycle(inputs)
    take_plan = _cycle([runner.plan(runner.encode(batch, {}), {}) for batch in inputs])

    def whole() -> int:
        runner.run(take(), {})
        return size

    def planned() -> int:
        runner.run_planned(take_plan())
        return size

    def tokenizer() -> int:
        runner.encode(take(), {})
        return size

    rows = []
    for mode, call in (("one thread", whole), ("planned", planned)):
        sync()
        rows.append({"system": f"{label}, {mode}", "concurrency": size, "texts_s": rate(call, seconds)})
    if label.startswith("float32") or label == "cpu":
        rows.append({"system": "tokenizer, one thread", "concurrency": size, "texts_s": rate(tokenizer, seconds)})
    return rows


def new_shapes(runner: Any, texts: list[str], bucketed: bool, sync: Callable[[], None]) -> dict[str, Any]:
    """Milliseconds of batches of one text, each of a length no batch had before (with buckets: all warmed)."""
    saved = runner.buckets
    runner.buckets = saved if bucketed else None
    seen: set[int] = set()
    times = []
    try:
        for text in texts:
            (encoding,) = runner.encode([text], {})
            if encoding.length in seen:
                continue
            seen.add(encoding.length)
            started = time.perf_counter()
            runner.run([text], {})
            sync()
            times.append((time.perf_counter() - started) * 1000)
    finally:
        runner.buckets = saved
    return {"batches": len(times), "p50_ms": statistics.median(times), "max_ms": max(times),
            "p99_ms": float(np.percentile(times, 99))}


def cosines(first: list[Any], second: list[Any]) -> float:
    a, b = np.stack([np.asarray(x, np.float64) for x in first]), np.stack([np.asarray(x, np.float64) for x in second])
    return float(np.min((a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch
    import transformers

    from worker.runners import ModelSpec, load_runner

    transformers.logging.disable_progress_bar()  # type: ignore[no-untyped-call, unused-ignore]

    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    sizes = QUICK_BATCHES if args.quick else BATCHES
    seconds = 0.3 if args.quick else 0.7
    texts = shuffled()
    long_text = " ".join(texts[:20])  # past the model's 256 tokens: truncated the same way in every dtype

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    rows: list[dict[str, Any]] = []
    startup: dict[str, float] = {}
    variants = ([("float32", "off", False), ("float16", "off", False), ("float16", "auto", False),
                 ("float16", "auto", True)] if cuda else [("float32", "off", False)])
    outputs: dict[str, list[Any]] = {}
    reference = load_runner(ModelSpec("cpu", args.model, device="cpu"))
    sample = [*texts[:63], long_text]
    outputs["cpu float32"] = reference.run(sample, {})
    extra: dict[str, Any] = {}
    for dtype, graphs, unpadded in variants:
        label = f"{dtype}, graphs {graphs}{', unpadded attention auto' * unpadded}" if cuda else "cpu"
        started = time.perf_counter()
        runner = load_runner(ModelSpec(label, args.model, device=device, dtype=dtype, max_batch_size=max(sizes),
                                       cuda_graphs=graphs != "off", unpadded_attention=unpadded))
        startup[label] = round(time.perf_counter() - started, 2)
        outputs[label] = runner.run(sample, {})
        rows += measure_runner(runner, label, sizes, seconds, texts, sync)
        if dtype == "float16" and graphs == "off":
            extra["new_shapes_bucketed"] = new_shapes(runner, texts[100:300], True, sync)
            extra["new_shapes_unbucketed"] = new_shapes(runner, texts[300:500], False, sync)
        del runner
        if cuda:
            torch.cuda.empty_cache()
    extra["cosine_vs_cpu_float32"] = {label: cosines(vectors, outputs["cpu float32"])
                                      for label, vectors in outputs.items() if label != "cpu float32"}
    import platform

    info = {"device": torch.cuda.get_device_name(0) if cuda else "cpu", "cpus": os.cpu_count(),
            "torch": torch.__version__, "cuda_version": torch.version.cuda, "transformers": transformers.__version__,
            "python": platform.python_version(), "runner_startup_s": startup}
    print(json.dumps({"rows": rows, "extra": extra, "info": info}))


if __name__ == "__main__":
    main()
