"""Cases with the real model: the limit, zbatch over HTTP and ZeroMQ, the Hugging Face guide's two servers.

They run together, in rounds.  A shared machine's speed drifts within a
minute (other virtual machines' load on the host), so a comparison only
holds between points measured close together: every system stays up, each
round measures every point once, the limit at a batch size right before the
systems at the matching concurrency, and each row reports the median over
the rounds.  The ratios that the targets use are taken inside each round and
then the median is reported (``paired``), so drift between rounds cancels
out.

``zbatch-serve`` is zbatch as ``scripts/serve`` ships it: a broker, two
workers that share the cores through their cores ledger, and the gateway.
It is held to the same limit and Hugging Face servers as ``zbatch-http``
(one worker); against real serving frameworks it runs in ``peers``.

``zbatch-bf16`` is the same gateway stack with ``--dtype bfloat16`` (faster
on CPUs with AVX512-BF16 or AMX), measured against a limit process in
bfloat16 too (rows ``limit-bf16``), and against float32 zbatch-http in the
same rounds when that case runs as well.  The Hugging Face guide's servers
stay float32, as the guide writes them.

``onnx`` (:mod:`scripts.benchmarks.cases.onnx`) is the model alone on ONNX
Runtime (rows ``limit-onnx``, next to the torch limit's) and the shipped
stack (``--runtime auto``: ONNX Runtime) against the same stack with
``--runtime torch``, in the same rounds.

``peers`` (:mod:`scripts.benchmarks.cases.peers`) is zbatch over HTTP next to
other serving frameworks, at the end of each concurrency's points: its own
zbatch points (the ``zbatch-serve`` stack, then the one-worker stack), then
each peer's, so that its ratios pair points measured one after the other.
"""

from __future__ import annotations

import asyncio
import statistics
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from scripts.benchmarks.cases import onnx as cases_onnx
from scripts.benchmarks.cases import peers as cases_peers
from scripts.benchmarks.cases.context import Context, row
from scripts.benchmarks.common import batches, procs
from scripts.benchmarks.common.procs import MODEL
from scripts.benchmarks.common.texts import shuffled
from scripts.benchmarks.load.calls import http_call, http_session, zmq_infer_call
from scripts.benchmarks.load.loops import closed_loop, quiet
from scripts.benchmarks.systems.stacks import ZbatchStack, system_key
from zbatch.client import AsyncClient

CASES = ("limit", "zbatch-http", "zbatch-zmq", "zbatch-serve", "baseline-naive", "baseline-batched", "zbatch-bf16",
         cases_onnx.CASE, "peers")
SYSTEM_NAMES = {"zbatch-http": "zbatch gateway", "zbatch-zmq": "zbatch AsyncClient",
                "zbatch-serve": "zbatch, scripts/serve (2 workers)",
                "baseline-naive": "HF guide, naive", "baseline-batched": "HF guide, batched",
                "zbatch-bf16": "zbatch gateway, bfloat16"}
# (batch size, padding-aware grouping) of each limit case's points.
LIMIT_POINTS = {"limit": ((1, False), (8, False), (32, False), (32, True)),
                "limit-bf16": ((1, False), (32, False), (32, True)),
                cases_onnx.LIMIT: ((1, False), (8, False), (32, False), (32, True))}
LIMIT_SETTINGS = {"limit": ("float32", "torch"), "limit-bf16": ("bfloat16", "torch"),
                  cases_onnx.LIMIT: ("float32", "onnx")}  # (dtype, runtime) of each limit process
# limit-bf16 and limit-onnx are not cases: zbatch-bf16 and onnx bring them (onnx compares with torch's limit too)
LIMITS_OF_CASE = {"limit": ("limit",), "zbatch-bf16": ("limit-bf16",), cases_onnx.CASE: ("limit", cases_onnx.LIMIT)}
# Each limit's points are measured right before the systems compared with it, at the matching concurrency.
GROUPS = (("limit", ("zbatch-http", "zbatch-zmq", "zbatch-serve", "baseline-naive", "baseline-batched", "peers")),
          ("limit-bf16", ("zbatch-bf16",)), (cases_onnx.LIMIT, (cases_onnx.CASE,)))
# the limit each system is held to (the peers case has no ratio to a limit)
LIMIT_OF_SERVED = {served: limit for limit, cases in GROUPS for served in cases if served in SYSTEM_NAMES}


@dataclass(frozen=True)
class Point:
    case: str
    system: str
    concurrency: int | str

    def key(self) -> tuple[str, str, int | str]:
        return self.case, self.system, self.concurrency


def limit_name(batch_size: int, grouped: bool) -> str:
    return f"direct, batch {batch_size}" + (", grouped by length" if grouped else "")


def needs(selected: list[str]) -> set[str]:
    """The long-lived systems the selected model cases run on (names as in Context.release)."""
    wanted = {"limit": {"limit"}, "zbatch-http": {"zbatch"}, "zbatch-zmq": {"zbatch"}, "zbatch-serve": {"serve"},
              "baseline-naive": {"naive"}, "baseline-batched": {"batched"},
              "zbatch-bf16": {system_key("zbatch", "bfloat16"), system_key("limit", "bfloat16")},
              cases_onnx.CASE: {"serve", "serve-torch", "limit", "limit-onnx"},
              "peers": {"serve", "zbatch", "peers"}}
    return set().union(*(wanted[case] for case in selected if case in wanted))


def _limit_cases(selected: list[str]) -> list[str]:
    """The limit cases (rows of the model called directly) the selected cases measure."""
    limits = [limit for case in selected for limit in LIMITS_OF_CASE.get(case, ())]
    return list(dict.fromkeys(limits))


async def run(ctx: Context, selected: list[str]) -> None:
    """Every selected model case, ``settings.rounds`` times, interleaved; then one row per point."""
    measures = await _measures(ctx, selected)
    results: dict[tuple[str, str, int | str], list[dict[str, Any]]] = {}
    for number in range(1, ctx.settings.rounds + 1):
        procs.log(f"model cases: round {number} of {ctx.settings.rounds}")
        for point, measure in _round(ctx, selected, measures):
            procs.log(f"{point.case}: {point.system} at {point.concurrency}")
            await quiet()
            results.setdefault(point.key(), []).append(await measure())
    for (case, system, concurrency), rounds in results.items():
        ctx.rows.append(row(case, system, concurrency, _median(rounds), rounds=rounds,
                            worker_batches=batches.merge([r.get("worker_batches", {}) for r in rounds])))
    _pair(ctx.rows)
    cases_onnx.pair(ctx.rows)
    if "peers" in selected:
        cases_peers.pair(ctx.rows)
        notes = (await ctx.peers()).notes()
        for r in ctx.rows:
            if r["case"] == cases_peers.CASE and r["system"] in cases_peers.ZBATCH_ROWS:
                r["detail"]["peers"] = notes


Measure = Callable[[], Awaitable[dict[str, Any]]]
Makers = dict[str, list[tuple[str, Callable[[int], Measure]]]]  # by case: (system, measure-maker) of each system


def _round(ctx: Context, selected: list[str], measures: Makers) -> list[tuple[Point, Measure]]:
    """One round's points: each limit batch size right before the systems at the matching concurrency."""
    order: list[tuple[Point, Measure]] = []
    limits = [(case, *point) for case in _limit_cases(selected) for point in LIMIT_POINTS[case]]
    for c in ctx.settings.concurrency:
        for limit_case, served in GROUPS:
            for point in [p for p in limits if p[0] == limit_case and p[1] <= c]:
                limits.remove(point)
                order.append(_limit_point(ctx, *point))
            order += [(Point(case, system, c), maker(c)) for case in served for system, maker in measures.get(case, [])]
    order += [_limit_point(ctx, *point) for point in limits]
    return order


def _limit_point(ctx: Context, case: str, batch_size: int, grouped: bool) -> tuple[Point, Measure]:
    async def measure() -> dict[str, Any]:
        s = ctx.settings
        limit = await ctx.limit(*LIMIT_SETTINGS[case])
        return await limit.measure(batch_size, grouped, s.warmup_s, s.duration_s)

    return Point(case, limit_name(batch_size, grouped), "-"), measure


# The zbatch stacks each served case measures: (its rows' system name, the stack, over HTTP or not).  A stack is
# ("zbatch", dtype): the one-worker stack of ``Context.zbatch``, or ("serve", runtime): ``Context.serve``'s.
StackKey = tuple[str, str]
SERVED: dict[str, tuple[tuple[str, StackKey, bool], ...]] = {
    "zbatch-http": ((SYSTEM_NAMES["zbatch-http"], ("zbatch", "float32"), True),),
    "zbatch-zmq": ((SYSTEM_NAMES["zbatch-zmq"], ("zbatch", "float32"), False),),
    "zbatch-serve": ((SYSTEM_NAMES["zbatch-serve"], ("serve", ""), True),),
    cases_onnx.CASE: ((cases_onnx.AUTO, ("serve", ""), True),  # the shipped stack, then --runtime torch: an A/B
                      (cases_onnx.TORCH, ("serve", "torch"), True)),
    "zbatch-bf16": ((SYSTEM_NAMES["zbatch-bf16"], ("zbatch", "bfloat16"), True),),
}


def _stack(ctx: Context, key: StackKey) -> Awaitable[ZbatchStack]:
    """The stack ``key`` names, started on first use."""
    kind, setting = key
    return ctx.zbatch(setting) if kind == "zbatch" else ctx.serve(setting)


async def _start_systems(ctx: Context, selected: list[str]) -> None:
    """Start the systems the selected cases measure (but the peers, which start on their own), side by side: a
    start is mostly one core importing and loading, so starts overlap on a host of two cores or more (one after
    another, --quick spent 105 s of its 10 minutes starting these 9)."""
    stacks = dict.fromkeys(key for case in selected for _, key, _ in SERVED.get(case, ()))
    starts: list[Awaitable[object]] = [ctx.limit(*LIMIT_SETTINGS[case]) for case in _limit_cases(selected)]
    starts += [_stack(ctx, key) for key in stacks]
    starts += [ctx.baseline(mode) for mode in ("naive", "batched") if f"baseline-{mode}" in selected]
    # Each start finishes, and what it started is kept (ctx stops it at the end), before a failure is raised.
    failures = [outcome for outcome in await asyncio.gather(*starts, return_exceptions=True)
                if isinstance(outcome, BaseException)]
    if failures:
        raise failures[0]


async def _measures(ctx: Context, selected: list[str]) -> Makers:
    """Start the systems and return the measure-makers of each served case."""
    s = ctx.settings
    await _start_systems(ctx, selected)
    makers: Makers = {case: [(name, _zbatch_maker(ctx, await _stack(ctx, key), http)) for name, key, http in served]
                      for case, served in SERVED.items() if case in selected}
    for mode in ("naive", "batched"):
        if f"baseline-{mode}" in selected:
            baseline = await ctx.baseline(mode)

            def baseline_maker(c: int, baseline: Any = baseline) -> Measure:
                async def measure() -> dict[str, Any]:
                    async with http_session(limit=c) as session:
                        return await closed_loop(http_call(session, baseline.url, shuffled()), c, s.warmup_s,
                                                 s.duration_s, watch=baseline.daemons.pids())
                return measure

            makers[f"baseline-{mode}"] = [(SYSTEM_NAMES[f"baseline-{mode}"], baseline_maker)]
    if "peers" in selected:
        peers = await ctx.peers()  # starts the zbatch stack first: the peers' vectors are checked against it
        makers["peers"] = [(cases_peers.ZBATCH, _zbatch_maker(ctx, await ctx.serve(), http=True)),
                           (cases_peers.ZBATCH_ONE, _zbatch_maker(ctx, await ctx.zbatch(), http=True)),
                           *cases_peers.makers(s.warmup_s, s.duration_s, peers)]
    return makers


def _zbatch_maker(ctx: Context, stack: ZbatchStack, http: bool) -> Callable[[int], Measure]:
    """Closed-loop measures of ``stack``, over HTTP through its gateway or with the ZMQ client."""
    s = ctx.settings
    client = None if http else AsyncClient(stack.frontend)  # closed by the process's exit; one for all rounds

    def maker(c: int) -> Measure:
        async def measure() -> dict[str, Any]:
            before = await stack.batches()
            if client is None:
                async with http_session(limit=c) as session:
                    result = await closed_loop(http_call(session, stack.url, shuffled()), c, s.warmup_s,
                                               s.duration_s, watch=stack.daemons.pids())
            else:
                result = await closed_loop(zmq_infer_call(client, MODEL, shuffled()), c, s.warmup_s,
                                           s.duration_s, watch=stack.daemons.pids())
            return result | {"worker_batches": batches.difference(before, await stack.batches())}
        return measure
    return maker


def _median(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """A point's result: medians over the rounds, errors summed, the most disturbed round's noise."""
    def med(key: str) -> float | None:
        values = [r[key] for r in rounds if r.get(key) is not None]
        return statistics.median(values) if values else None

    def by_process(key: str) -> dict[str, float]:
        figures = [r.get(key) or {} for r in rounds]
        return {n: statistics.median(f[n] for f in figures if n in f) for n in sorted(set().union(*figures))}

    return {"req_s": med("req_s"), "texts_s": med("texts_s"), "p50_ms": med("p50_ms"), "p99_ms": med("p99_ms"),
            "errors": sum(r.get("errors", 0) for r in rounds), "requests": sum(r.get("requests", 0) for r in rounds),
            "other_cores": max((r.get("other_cores") or 0.0 for r in rounds), default=None),
            "cpu_us_per_req": by_process("cpu_us_per_req"), "sleeps_per_req": by_process("sleeps_per_req"),
            "late": sum(r.get("late", 0) for r in rounds)}


def _pair(rows: list[dict[str, Any]]) -> None:
    """Ratios inside each round, then their median, for each served row (detail ``paired``).

    ``vs_limit``: texts/s over the limit at batch 32, ungrouped (the offline rate), in the row's dtype;
    ``vs_naive``, ``vs_batched``: over the HF guide's servers at the same concurrency (float32 rows);
    ``vs_float32``: the bfloat16 row over float32 zbatch-http at the same concurrency;
    ``p50_over_limit_ms``: at concurrency 1, p50 minus the limit's batch-1 p50.
    """
    by_key = {(r["case"], r["system"], r["concurrency"]): r for r in rows if r["detail"].get("rounds")}
    for (case, _, c), r in by_key.items():
        if case not in SYSTEM_NAMES:
            continue
        bf16 = case == "zbatch-bf16"
        limit_case = LIMIT_OF_SERVED[case]
        limit32 = by_key.get((limit_case, limit_name(32, False), "-"))
        limit1 = by_key.get((limit_case, limit_name(1, False), "-"))
        refs = {"vs_limit": limit32}
        if bf16:
            refs["vs_float32"] = by_key.get(("zbatch-http", SYSTEM_NAMES["zbatch-http"], c))
        else:
            refs |= {f"vs_{mode}": by_key.get((f"baseline-{mode}", SYSTEM_NAMES[f"baseline-{mode}"], c))
                     for mode in ("naive", "batched")}
        paired = {key: _paired(r, ref, lambda a, b: a["texts_s"] / b["texts_s"])
                  for key, ref in refs.items() if ref is not None and ref is not r}
        if c == 1 and limit1 is not None:
            paired["p50_over_limit_ms"] = _paired(r, limit1, lambda a, b: a["p50_ms"] - b["p50_ms"])
        r["detail"]["paired"] = {k: v for k, v in paired.items() if v is not None}


def _paired(r: dict[str, Any], ref: dict[str, Any], compare: Callable[[dict[str, Any], dict[str, Any]], float]
            ) -> float | None:
    values = [compare(a, b) for a, b in zip(r["detail"]["rounds"], ref["detail"]["rounds"], strict=False)
              if a.get("texts_s") and b.get("texts_s") and a.get("p50_ms") is not None and b.get("p50_ms") is not None]
    return statistics.median(values) if values else None
