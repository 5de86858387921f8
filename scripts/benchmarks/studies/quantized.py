"""``python -m scripts.benchmarks.studies.quantized``: speed and accuracy of ``--quantize int8`` beside float32.

Loads the default model three ways, as the worker does (2 threads, length groups on): torch, ONNX
Runtime in float32, and ONNX Runtime with int8 weights.  Accuracy: every bench text embedded in
batches of 32 and alone, each vector's cosine to torch's (lowest and median).  Speed: texts/s of
batches of 1 and 32 in a closed loop, the three runners in turn, ``--rounds`` times (medians).
Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import time
from typing import Any

import numpy as np

from scripts.benchmarks.common.texts import shuffled
from scripts.benchmarks.systems.model import load

VARIANTS = (("torch", "torch", "none"), ("ONNX Runtime, float32", "onnx", "none"),
            ("ONNX Runtime, int8", "onnx", "int8"))


def cosines(reference: list[np.ndarray], vectors: list[np.ndarray]) -> list[float]:
    return [float(a @ b / np.linalg.norm(a) / np.linalg.norm(b)) for a, b in zip(reference, vectors, strict=True)]


def embedded(runner: Any, texts: list[str], batch_size: int) -> list[np.ndarray]:
    return [vector for start in range(0, len(texts), batch_size)
            for vector in runner.run(texts[start:start + batch_size], {})]


def rate(runner: Any, batch_size: int, seconds: float) -> float:
    texts = itertools.cycle(shuffled())
    runner.run([next(texts) for _ in range(batch_size)], {})
    done, began = 0, time.perf_counter()
    while time.perf_counter() - began < seconds:
        runner.run([next(texts) for _ in range(batch_size)], {})
        done += batch_size
    return done / (time.perf_counter() - began)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    runners = {name: load(2, grouped=True, runtime=runtime, quantize=quantize) for name, runtime, quantize in VARIANTS}
    texts = shuffled()
    reference = {size: embedded(runners["torch"], texts, size) for size in (32, 1)}
    speeds: dict[str, dict[int, list[float]]] = {name: {1: [], 32: []} for name in runners}
    for _ in range(args.rounds):
        for name, runner in runners.items():
            for size in (1, 32):
                speeds[name][size].append(rate(runner, size, args.seconds))
    print("| runtime | batch 1, texts/s | batch 32, texts/s | cosine to torch: lowest, median (batches of 32; alone) |")
    print("|---|---|---|---|")
    for name, runner in runners.items():
        accuracy = []
        for size in (32, 1):
            values = cosines(reference[size], embedded(runner, texts, size))
            accuracy.append(f"{min(values):.5f}, {statistics.median(values):.5f}")
        print(f"| {name} | {statistics.median(speeds[name][1]):.0f} | {statistics.median(speeds[name][32]):.0f} | "
              f"{'; '.join(accuracy)} |", flush=True)


if __name__ == "__main__":
    main()
