"""The ceiling: the model called directly, in a tight loop, with no serving at all.

Run as a subprocess (``python -m scripts.benchmarks.limit``) so torch runs in
that process's main thread with 2 threads, like nothing else is there; prints
one JSON object on stdout. Texts come in a seeded random order, so batches mix
short and long sentences exactly as served traffic does.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from typing import Any

import numpy as np

from scripts.benchmarks import cpu
from scripts.benchmarks.texts import shuffled


def settled(runner: Any, batch_size: int, args: argparse.Namespace) -> dict[str, Any]:
    """Measure on a quiet machine, again (up to ``--retries`` times) if others disturbed it; keep the calmest."""
    best: dict[str, Any] | None = None
    for attempt in range(1, args.retries + 2):
        if args.quiet_wait > 0:
            cpu.wait_quiet_sync(args.quiet_wait)
        result = measure(runner, batch_size, args.warmup_s, args.duration_s) | {"attempts": attempt}
        other = result.get("other_cores") or 0.0
        if best is None or other < (best.get("other_cores") or 0.0):
            best = result
        if other < cpu.QUIET_CORES:
            break
        if attempt <= args.retries:
            print(f"[limit] disturbed ({other:.2f} other cores); measuring again", file=sys.stderr)
    assert best is not None
    return best


def measure(runner: Any, batch_size: int, warmup_s: float, duration_s: float) -> dict[str, Any]:
    """Texts/s over ``duration_s`` after ``warmup_s`` of the same work, plus per-call latency."""
    texts = itertools.cycle(shuffled())
    end_warmup = time.perf_counter() + warmup_s
    while time.perf_counter() < end_warmup:
        runner.run([next(texts) for _ in range(batch_size)], {})
    latencies = []
    before = cpu.snapshot()
    start = time.perf_counter()
    while (now := time.perf_counter()) - start < duration_s:
        runner.run([next(texts) for _ in range(batch_size)], {})
        latencies.append(time.perf_counter() - now)
    elapsed = time.perf_counter() - start
    noise = cpu.usage(before, cpu.snapshot())
    ms = np.asarray(latencies) * 1000
    return {"batch_size": batch_size, "calls": len(latencies), "duration_s": elapsed,
            "req_s": len(latencies) / elapsed, "texts_s": len(latencies) * batch_size / elapsed,
            "p50_ms": float(np.percentile(ms, 50)), "p99_ms": float(np.percentile(ms, 99)),
            "mean_ms": float(ms.mean())} | noise


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-sizes", default="1,8,32")
    parser.add_argument("--warmup-s", type=float, default=1.0)
    parser.add_argument("--duration-s", type=float, default=5.0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--quiet-wait", type=float, default=0.0)
    parser.add_argument("--retries", type=int, default=0)
    args = parser.parse_args()

    import torch

    from worker.models import DEFAULT_MODEL_NAME, ModelSpec, default_model_path, load_runner

    torch.set_num_threads(args.threads)
    runner = load_runner(ModelSpec(DEFAULT_MODEL_NAME, default_model_path(), device="cpu"))
    results = []
    for size in (int(s) for s in args.batch_sizes.split(",")):
        print(f"[limit] batch {size}", file=sys.stderr, flush=True)
        results.append(settled(runner, size, args))
    json.dump({"torch": torch.__version__, "threads": torch.get_num_threads(), "results": results}, sys.stdout)


if __name__ == "__main__":
    main()
