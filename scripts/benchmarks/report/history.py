"""The History section of BENCHMARKS.md: dated lines on what each optimisation did, kept across runs.

A run rewrites BENCHMARKS.md but carries its History over verbatim, so the
record of each change's effect survives; ``--note`` appends one line with
this run's key ratios.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

from scripts.benchmarks.cases.infra import COMPILED_BROKER
from scripts.benchmarks.cases.peers import ZBATCH, ZBATCH_ROWS
from scripts.benchmarks.report.results import find, idle_added, scale_one, sorted_rows, times

HEADING = "## History"
PLACEHOLDER = ("_Nothing recorded yet. Add one dated line per optimisation with its effect, e.g. "
               "`- 2026-11-22 padding-aware grouping: c=32 72 -> 100 texts/s`, or run "
               "`scripts/bench --note \"what changed\"` to append one with this run's key ratios._")


def previous(path: Path, heading: str = HEADING) -> list[str]:
    """A section of an existing BENCHMARKS.md, verbatim, heading and outer blank lines excluded."""
    lines = path.read_text(errors="replace").splitlines() if path.exists() else []
    if heading not in lines:
        return []
    start = lines.index(heading) + 1
    end = next((i for i in range(start, len(lines)) if lines[i].startswith("## ")), len(lines))
    body = lines[start:end]
    while body and not body[0].strip():
        body.pop(0)
    while body and not body[-1].strip():
        body.pop()
    return body


def issue_sections(path: Path) -> list[str]:
    """Every ``## ... (issue N)`` (or ``(issues N and M)``) section of an existing BENCHMARKS.md, heading included:
    written by hand with an issue's measured figures and the commands behind them, and kept as they are by every
    run."""
    lines = path.read_text(errors="replace").splitlines() if path.exists() else []
    kept: list[str] = []
    for heading in (line for line in lines if re.fullmatch(r"## .*\(issues? \d+(?:(?:, | and )\d+)*\)", line)):
        kept += ["", heading, "", *previous(path, heading)]
    return kept


def _ratio(label: str, value: float | None) -> str | None:
    return None if value is None else f"{label} {value:.2f}×"


def _value(rows: list[dict[str, Any]], key: str, case: str, system: str | None = None,
           concurrency: Any = None) -> float | None:
    r = find(rows, case, system, concurrency)
    return r[key] if r else None


def _scale(rows: list[dict[str, Any]]) -> list[str | None]:
    """8 workers against 8 x one worker, for each simulated model class."""
    out: list[str | None] = []
    for r in rows:
        one = scale_one(rows, r["detail"]["series"]) if r["case"] == "scale" else None
        if one is not None and r["detail"]["workers"] == 8:
            out.append(_ratio(f"scale 8 vs 8×1 ({r['detail']['series']})", times(r["req_s"], 8 * one["req_s"])))
    return out


def _paired(rows: list[dict[str, Any]], case: str, concurrency: int, key: str) -> float | None:
    r = find(rows, case, concurrency=concurrency)
    value: float | None = r["detail"].get("paired", {}).get(key) if r else None
    return value


def _peers(rows: list[dict[str, Any]]) -> list[str | None]:
    """zbatch over the fastest peer at each concurrency (paired in rounds), naming that peer."""
    out: list[str | None] = []
    for r in rows:
        paired = r["detail"].get("paired", {}) if r["case"] == "peers" and r["system"] in ZBATCH_ROWS else {}
        if "vs_best_peer" in paired:
            label = "zbatch (scripts/serve)" if r["system"] == ZBATCH else "zbatch (1 worker)"
            out.append(f"{label} vs best peer (c={r['concurrency']}, {paired['best_peer']}) "
                       f"{paired['vs_best_peer']:.2f}×")
    return out


def key_ratios(rows: list[dict[str, Any]]) -> list[str]:
    """The figures a change is judged by, each against its reference in the same run."""
    goodput = [(f"{r['case']} goodput/capacity ({r['system']})", times(r["req_s"], r["detail"]["capacity_req_s"]))
               for r in sorted_rows(rows) if r["case"] in ("overload", "storm")]
    over = _paired(rows, "zbatch-http", 1, "p50_over_limit_ms")
    fill = [f"HTTP c={r['concurrency']} mean batch {r['detail']['worker_batches']['mean_size']:.1f}" for r in rows
            if r["case"] == "zbatch-http" and r["concurrency"] in (8, 32) and r["detail"].get("worker_batches")]
    overlap = [_ratio(f"tokenized ahead vs inline ({r['system'].split(',')[0]})",
                      r["detail"]["paired"].get("vs_inline"))
               for r in rows if r["case"] == "overlap" and r["detail"].get("paired")]
    parts = [*fill, *overlap,
        _ratio("HTTP c=32 vs limit b32 (texts/s)", _paired(rows, "zbatch-http", 32, "vs_limit")),
        _ratio("HTTP c=32 vs batched", _paired(rows, "zbatch-http", 32, "vs_batched")),
        None if over is None else f"HTTP c=1 p50 {over:+.1f} ms over limit b1",
        *(f"{system} c=1 p50 {added:+.1f} ms over a sleeping model" for system, added in idle_added(rows).items()),
        _ratio("HTTP c=32 bfloat16 vs limit b32 in bfloat16", _paired(rows, "zbatch-bf16", 32, "vs_limit")),
        _ratio("HTTP c=32 bfloat16 vs float32", _paired(rows, "zbatch-bf16", 32, "vs_float32")),
        *_peers(rows),
        *(_ratio(f"{label} vs proxy (c=32)", times(_value(rows, "req_s", "routing", system, 32),
                                                   _value(rows, "req_s", "routing", "zmq.proxy", 32)))
          for label, system in (("broker", "zbatch broker"), ("compiled broker", COMPILED_BROKER))),
        _ratio("gateway vs bare (c=32)", times(_value(rows, "req_s", "gateway", "zbatch gateway + echo", 32),
                                               _value(rows, "req_s", "gateway", "bare aiohttp", 32))),
        _ratio("gateway 2 processes vs 1 (c=32)",
               times(_value(rows, "req_s", "gateway", "zbatch gateway + echo, 2 processes", 32),
                     _value(rows, "req_s", "gateway", "zbatch gateway + echo", 32))),
        *(_ratio(label, value) for label, value in goodput), *_scale(rows)]
    return [p for p in parts if p]


def section(old: list[str], note: str | None, rows: list[dict[str, Any]], quick: bool) -> list[str]:
    """The History section to write: ``old`` verbatim, plus this run's line if there is a note."""
    body = list(old)
    if note:
        body = [line for line in body if line.strip() != PLACEHOLDER]
        figures = "; ".join(key_ratios(rows)) or "no ratios (cases missing)"
        body.append(f"- {time.strftime('%Y-%m-%d')} {note}{' (quick run)' if quick else ''}: {figures}")
    return ["", HEADING, "", *(body or [PLACEHOLDER])]
