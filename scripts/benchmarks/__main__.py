"""``scripts/bench [--quick] [--cases a,b] [--out DIR] [--quiet-wait S] [--note TEXT]``: run, print, write reports."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import resource
import shlex
import signal
import sys
import time
import traceback
from collections.abc import Awaitable, Callable
from pathlib import Path

from broker import eventloop
from scripts.benchmarks import cases_infra, cases_model, cases_overload, charts, history, load, report, sections
from scripts.benchmarks.common import Context, Settings
from scripts.benchmarks.procs import ROOT, log

Case = Callable[[Context], Awaitable[None]]
# Run order keeps the cases that share the real zbatch stack together, so it starts once, and runs the
# baselines before them, so the storm finds baseline-batched's capacity instead of measuring it again.
CASES: dict[str, Case] = {
    "limit": cases_model.limit,
    "baseline-naive": cases_model.baseline_naive,
    "baseline-batched": cases_model.baseline_batched,
    "zbatch-http": cases_model.zbatch_http,
    "zbatch-zmq": cases_model.zbatch_zmq,
    "overload": cases_overload.overload,
    "storm": cases_overload.storm,
    "routing": cases_infra.routing,
    "gateway": cases_infra.gateway,
    "scale": cases_infra.scale,
}
USES_ZBATCH_STACK = frozenset({"zbatch-http", "zbatch-zmq", "overload", "storm"})


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="scripts/bench", description=__doc__)
    parser.add_argument("--quick", action="store_true",
                        help="smoke test: ~2.5 s per point after 1 s warm-up, fewer concurrency points")
    parser.add_argument("--note", default=None, metavar="TEXT",
                        help="append a dated line to BENCHMARKS.md's History: TEXT and this run's key ratios")
    parser.add_argument("--cases", default=",".join(CASES),
                        help=f"comma-separated cases to run (default: all): {', '.join(CASES)}")
    parser.add_argument("--quiet-wait", type=float, default=None, metavar="SECONDS",
                        help="before each measurement, wait up to this long for other processes to leave the "
                             "CPU idle, and measure once more if they disturbed it anyway "
                             "(default: 60; with --quick 0: no waiting, just record how busy it was)")
    parser.add_argument("--out", type=Path, default=None,
                        help="directory for every output (default: BENCHMARKS.md in the repo root, "
                             "bench-results.json and charts in bench-out/)")
    args = parser.parse_args(argv)
    chosen = [c.strip() for c in args.cases.split(",") if c.strip()]
    unknown = [c for c in chosen if c not in CASES]
    if unknown or not chosen:
        parser.error(f"unknown case(s) {', '.join(unknown) or '(none given)'}; choose from {', '.join(CASES)}")
    args.cases = [c for c in CASES if c in chosen]
    return args


async def run_cases(ctx: Context, names: list[str]) -> list[str]:
    """Run each case; a failing case is reported and the others still run. Returns the failed ones."""
    failed: list[str] = []
    main_task = asyncio.current_task()
    assert main_task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, main_task.cancel)
    try:
        for i, name in enumerate(names):
            started = time.monotonic()
            log(f"=== case {name} ===")
            try:
                await CASES[name](ctx)
            except Exception:
                log(f"case {name} FAILED:\n{traceback.format_exc()}")
                failed.append(name)
            log(f"=== case {name} done in {time.monotonic() - started:.0f} s ===")
            if not USES_ZBATCH_STACK & set(names[i + 1:]):
                ctx.close_zbatch()
    finally:
        ctx.close_zbatch()
    return failed


def raise_file_limit() -> None:
    """The overload and storm cases open hundreds of connections; the default soft limit can be 1024."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 65536 if hard == resource.RLIM_INFINITY else min(hard, 65536)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    command = os.environ.get("BENCH_COMMAND") or shlex.join(["python", "-m", "scripts.benchmarks", *sys.argv[1:]])
    settings = Settings.make(args.quick)
    md_dir, data_dir = (args.out, args.out) if args.out else (ROOT, ROOT / "bench-out")
    md_dir.mkdir(parents=True, exist_ok=True)
    data_dir.mkdir(parents=True, exist_ok=True)
    raise_file_limit()
    load.QUIET["wait_s"] = args.quiet_wait if args.quiet_wait is not None else (0.0 if args.quick else 60.0)
    load.QUIET["retries"] = 1 if load.QUIET["wait_s"] > 0 else 0
    ctx = Context(settings)
    started = time.monotonic()
    try:
        failed = eventloop.run(run_cases(ctx, args.cases))
    except (KeyboardInterrupt, asyncio.CancelledError):
        log("interrupted; every process this run started has been stopped")
        return 130
    report.add_ratios(ctx.rows)
    info = report.machine()
    pngs = charts.write_charts(ctx.rows, data_dir)
    if not pngs:
        log("charts skipped (no results to chart, or matplotlib is not installed)")
    links = [os.path.relpath(p, md_dir) for p in pngs]
    md_path = md_dir / "BENCHMARKS.md"
    past = history.section(history.previous(md_path), args.note, ctx.rows, args.quick)
    details = sections.details(ctx.rows)
    md_path.write_text(report.markdown(ctx.rows, info, command, args.quick, links, failed, details, past))
    report.write_json(data_dir / "bench-results.json", ctx.rows, info, command, dataclasses.asdict(settings),
                      failed)
    print("\n".join([report.table(ctx.rows), *details]))
    log(f"wrote {md_dir / 'BENCHMARKS.md'}, {data_dir / 'bench-results.json'}"
        + (f" and {len(pngs)} chart(s) in {data_dir}" if pngs else "") + f" in {time.monotonic() - started:.0f} s")
    if failed:
        log(f"failed case(s): {', '.join(failed)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
