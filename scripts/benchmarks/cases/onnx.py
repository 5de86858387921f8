"""The onnx case: ONNX Runtime against torch, for the model alone and for the stack as shipped (issue 34).

Two comparisons, each paired inside the model cases' rounds
(:mod:`scripts.benchmarks.cases.model`):

* the model alone: the limit process on ONNX Runtime (rows ``limit-onnx``,
  the worker's own runner with ``runtime onnx``, 2 threads) at the torch
  limit's points, against the torch limit (``limit``): padded batches of 1,
  8 and 32, and batch 32 with zbatch's padding trim, which on torch is the
  packed BERT pass and on ONNX Runtime length groups;
* the stack as ``scripts/serve`` ships it (its workers' default ``--runtime
  auto``, which picks ONNX Runtime on this CPU) against the same stack
  started with ``--runtime torch``: an A/B of the one flag.

The ratios (detail ``paired``, ``vs_torch``) are taken inside each round and
their median reported, like every other paired figure of the bench.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterator
from typing import Any

CASE = "onnx"
LIMIT = "limit-onnx"
AUTO = "zbatch, scripts/serve (2 workers), --runtime auto"  # the shipped stack: ONNX Runtime on this CPU
TORCH = "zbatch, scripts/serve (2 workers), --runtime torch"
# The goals: the model alone at batch 1 against padded torch, at batch 32 against the packed pass,
# and the shipped stack against itself on torch.
LIMIT_GOALS = {("direct, batch 1", "direct, batch 1"): 2.0,
               ("direct, batch 32, grouped by length", "direct, batch 32, grouped by length"): 1.5}
STACK_GOAL = 1.5
STACK_CONCURRENCY = (1, 8, 32)


def _ratio(rounds: list[dict[str, Any]], reference: list[dict[str, Any]]) -> float | None:
    ratios = [a["texts_s"] / b["texts_s"] for a, b in zip(rounds, reference, strict=False)
              if a.get("texts_s") and b.get("texts_s")]
    return statistics.median(ratios) if ratios else None


def pair(rows: list[dict[str, Any]]) -> None:
    """``vs_torch`` on each limit-onnx row (the torch limit's same point) and each AUTO row (TORCH's, same c)."""
    by_key = {(r["case"], r["system"], r["concurrency"]): r for r in rows if r["detail"].get("rounds")}
    for (case, system, c), r in by_key.items():
        if case == LIMIT:
            reference = by_key.get(("limit", system, c))
        elif case == CASE and system == AUTO:
            reference = by_key.get((CASE, TORCH, c))
        else:
            continue
        ratio = _ratio(r["detail"]["rounds"], reference["detail"]["rounds"]) if reference else None
        if ratio is not None:
            r["detail"].setdefault("paired", {})["vs_torch"] = ratio


def targets(rows: list[dict[str, Any]]) -> Iterator[tuple[str, str, str, bool | None]]:
    """The issue's ONNX Runtime targets, from this run's paired rows."""
    for r in rows:
        ratio = r["detail"].get("paired", {}).get("vs_torch")
        if ratio is None:
            continue
        if r["case"] == LIMIT:
            goal = LIMIT_GOALS.get((r["system"], r["system"]))
            if goal is None:
                continue
            torch_pass = "the packed torch pass" if "grouped" in r["system"] else "padded torch"
            yield (f"the model alone on ONNX Runtime, {r['system'].removeprefix('direct, ')}",
                   f"≥ {goal:.1f}× {torch_pass}", f"{ratio:.2f}× ({r['texts_s']:.0f} texts/s)", ratio >= goal)
        elif r["case"] == CASE and r["concurrency"] in STACK_CONCURRENCY:
            yield (f"the shipped stack, --runtime auto vs torch, c={r['concurrency']}", f"≥ {STACK_GOAL:.1f}×",
                   f"{ratio:.2f}×", ratio >= STACK_GOAL)
