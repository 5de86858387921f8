"""The ceiling: the model called directly, in a tight loop, with no serving at all.

Runs as a subprocess (``python -m scripts.benchmarks.systems.limit``) so torch runs in
that process's main thread with 2 threads, like nothing else is there.  It
loads the model once, then measures on command, so its runs can alternate
with the served systems' in the same minutes: one JSON object per line on
stdin (``{"batch_size": 32, "grouped": false, "warmup_s": 1, "duration_s": 5}``),
one JSON result per line on stdout.  Texts come in a seeded random order, so
batches mix short and long sentences exactly as served traffic does.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import sys
import time
from typing import Any

import numpy as np

from scripts.benchmarks.common import cpu
from scripts.benchmarks.common.texts import shuffled
from scripts.benchmarks.systems.model import load
from zbatch.testing import ROOT


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
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--dtype", default="float32", help="the model's weights dtype, as the worker's --dtype")
    parser.add_argument("--runtime", default="torch", help="torch or onnx (ONNX Runtime), as the worker's --runtime")
    parser.add_argument("--quantize", default="none", help="none or int8 (ONNX Runtime), as the worker's --quantize")
    args = parser.parse_args()
    import torch

    runner = load(args.threads, dtype=args.dtype, runtime=args.runtime, quantize=args.quantize)
    print(json.dumps({"ready": True, "torch": torch.__version__, "threads": torch.get_num_threads(),
                      "runtime": getattr(runner, "runtime", f"torch {torch.__version__}"),
                      "graph": str(getattr(runner._model, "path", ""))}), flush=True)
    for line in sys.stdin:
        order = json.loads(line)
        runner.set_length_grouping(bool(order.get("grouped")))
        result = measure(runner, int(order["batch_size"]), float(order["warmup_s"]), float(order["duration_s"]))
        print(json.dumps(result | {"grouped": bool(order.get("grouped"))}), flush=True)



class LimitProcess:
    """The parent's handle on a running limit process: start once, measure on demand, close."""

    def __init__(self, process: asyncio.subprocess.Process, info: dict[str, Any]) -> None:
        self._process = process
        self.info = info

    @classmethod
    async def start(cls, threads: int = 2, dtype: str = "float32", runtime: str = "torch") -> LimitProcess:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "scripts.benchmarks.systems.limit", "--threads", str(threads), "--dtype", dtype,
            "--runtime", runtime, cwd=ROOT, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)
        return cls(process, await cls._read(process))

    async def measure(self, batch_size: int, grouped: bool, warmup_s: float, duration_s: float) -> dict[str, Any]:
        order = {"batch_size": batch_size, "grouped": grouped, "warmup_s": warmup_s, "duration_s": duration_s}
        assert self._process.stdin is not None
        self._process.stdin.write((json.dumps(order) + "\n").encode())
        await self._process.stdin.drain()
        return await self._read(self._process)

    @staticmethod
    async def _read(process: asyncio.subprocess.Process) -> dict[str, Any]:
        assert process.stdout is not None
        line = await process.stdout.readline()
        if not line:
            raise RuntimeError(f"the limit process exited (code {await process.wait()})")
        result: dict[str, Any] = json.loads(line)
        return result

    async def close(self) -> None:
        if self._process.returncode is None:
            self._process.kill()
            await self._process.wait()


if __name__ == "__main__":
    main()
