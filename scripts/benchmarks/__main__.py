"""``scripts/bench [--quick] [--cases a,b] [--peers a,b] [--out DIR] [--quiet-wait S] [--note TEXT]``: run and report.

The peers case (other serving frameworks, installed on first use) runs in a full run and when
``--cases`` names it, never by default with ``--quick``, which CI runs.
"""

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

from scripts.benchmarks.cases import gpu as cases_gpu
from scripts.benchmarks.cases import infra as cases_infra
from scripts.benchmarks.cases import model as cases_model
from scripts.benchmarks.cases import overlap as cases_overlap
from scripts.benchmarks.cases import overload as cases_overload
from scripts.benchmarks.cases import start as cases_start
from scripts.benchmarks.cases import transitions as cases_transitions
from scripts.benchmarks.cases.context import Context, Settings
from scripts.benchmarks.common.procs import log
from scripts.benchmarks.load import loops
from scripts.benchmarks.peers import systems as peer_systems
from scripts.benchmarks.report import charts, history, results, sections, targets
from zbatch.runtime import eventloop, native
from zbatch.testing import ROOT

Case = Callable[[Context], Awaitable[None]]
# The model cases run together, interleaved in rounds (cases_model.run); the others one after another.
OTHER_CASES: dict[str, Case] = {
    "overload": cases_overload.overload,
    "storm": cases_overload.storm,
    "shed": cases_overload.shed,
    "routing": cases_infra.routing,
    "gateway": cases_infra.gateway,
    "idle": cases_infra.idle,
    "scale": cases_infra.scale,
    "overlap": cases_overlap.overlap,
    "gpu": cases_gpu.gpu,
    "start": cases_start.start,
    "chaos": cases_transitions.chaos,
    "staggered": cases_transitions.staggered,
}
CASES = (*cases_model.CASES, *OTHER_CASES)
NOT_QUICK = ("peers",)  # left out of --quick unless --cases names them: installs take minutes
# The long-lived systems each case uses (see Context.release); the model cases' come from cases_model.needs.
NEEDS: dict[str, set[str]] = {"overload": {"zbatch"}, "storm": {"zbatch", "batched"}, "shed": {"serve", "zbatch"}}


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="scripts/bench", description=__doc__)
    parser.add_argument("--quick", action="store_true",
                        help="smoke test: ~2.5 s per point after 1 s warm-up, fewer concurrency points")
    parser.add_argument("--note", default=None, metavar="TEXT",
                        help="append a dated line to BENCHMARKS.md's History: TEXT and this run's key ratios")
    parser.add_argument("--cases", default=None,
                        help=f"comma-separated cases to run (default: all; with --quick all but "
                             f"{', '.join(NOT_QUICK)}): {', '.join(CASES)}")
    parser.add_argument("--peers", default=",".join(peer_systems.PEER_NAMES),
                        help="the peers case's frameworks, comma-separated (default: all): "
                             f"{', '.join(peer_systems.PEER_NAMES)}")
    parser.add_argument("--quiet-wait", type=float, default=None, metavar="SECONDS",
                        help="before each measurement, wait up to this long for other processes to leave the "
                             "CPU idle, and measure once more if they disturbed it anyway "
                             "(default: 60; with --quick 0: no waiting, just record how busy it was)")
    parser.add_argument("--out", type=Path, default=None,
                        help="directory for every output (default: BENCHMARKS.md in the repo root, "
                             "bench-results.json and charts in bench-out/)")
    args = parser.parse_args(argv)
    if args.cases is None:
        args.cases = ",".join(c for c in CASES if not (args.quick and c in NOT_QUICK))
    chosen = [c.strip() for c in args.cases.split(",") if c.strip()]
    unknown = [c for c in chosen if c not in CASES]
    if unknown or not chosen:
        parser.error(f"unknown case(s) {', '.join(unknown) or '(none given)'}; choose from {', '.join(CASES)}")
    args.cases = [c for c in CASES if c in chosen]
    args.peers = [p.strip() for p in args.peers.split(",") if p.strip()]
    unknown = [p for p in args.peers if p not in peer_systems.PEER_NAMES]
    if unknown:
        parser.error(f"unknown peer(s) {', '.join(unknown)}; choose from {', '.join(peer_systems.PEER_NAMES)}")
    return args


async def run_cases(ctx: Context, names: list[str]) -> list[str]:
    """Run each step; a failing step is reported and the others still run. Returns the failed cases."""
    model = [n for n in names if n in cases_model.CASES]
    steps: list[tuple[list[str], Callable[[], Awaitable[None]]]] = []
    if model:
        steps.append((model, lambda: cases_model.run(ctx, model)))
    steps += [([n], lambda n=n: OTHER_CASES[n](ctx)) for n in names if n in OTHER_CASES]  # type: ignore[misc]
    failed: list[str] = []
    main_task = asyncio.current_task()
    assert main_task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, main_task.cancel)
    try:
        for i, (members, step) in enumerate(steps):
            started = time.monotonic()
            log(f"=== {', '.join(members)} ===")
            try:
                await step()
            except Exception:
                log(f"{', '.join(members)} FAILED:\n{traceback.format_exc()}")
                failed += members
            log(f"=== {', '.join(members)} done in {time.monotonic() - started:.0f} s ===")
            later = [name for later_members, _ in steps[i + 1:] for name in later_members]
            await ctx.release(cases_model.needs(later).union(*(NEEDS.get(name, set()) for name in later)))
    finally:
        await ctx.release(set())
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
    # Each row names the broker it measures: interpreted unless a case passes a compiled build itself.
    os.environ.pop(native.ENV, None)
    loops.QUIET["wait_s"] = args.quiet_wait if args.quiet_wait is not None else (0.0 if args.quick else 60.0)
    loops.QUIET["retries"] = 1 if loops.QUIET["wait_s"] > 0 else 0
    peer_systems.SELECTED["peers"] = tuple(args.peers)
    ctx = Context(settings)
    started = time.monotonic()
    try:
        failed = eventloop.run(run_cases(ctx, args.cases))
    except (KeyboardInterrupt, asyncio.CancelledError):
        log("interrupted; every process this run started has been stopped")
        return 130
    results.add_ratios(ctx.rows)
    info = results.machine()
    pngs = charts.write_charts(ctx.rows, data_dir)
    if not pngs:
        log("charts skipped (no results to chart, or matplotlib is not installed)")
    links = [os.path.relpath(p, md_dir) for p in pngs]
    md_path = md_dir / "BENCHMARKS.md"
    details = sections.details(ctx.rows)
    parts = {"targets": targets.section(ctx.rows), "details": details,
             "analysis": [line for line in history.previous(md_path, results.ANALYSIS_HEADING)
                          if line != results.ANALYSIS_PLACEHOLDER],
             "gpu": cases_gpu.section(ctx.rows, ctx.gpu_info) or history.previous(md_path, cases_gpu.GPU_HEADING),
             "issues": history.issue_sections(md_path),
             "history": history.section(history.previous(md_path), args.note, ctx.rows, args.quick)}
    md_path.write_text(results.markdown(ctx.rows, info, command, args.quick, links, failed, parts))
    results.write_json(data_dir / "bench-results.json", ctx.rows, info, command, dataclasses.asdict(settings),
                      failed)
    cases_gpu.write_raw(ctx.rows, ctx.gpu_info, data_dir)
    print("\n".join([results.table(ctx.rows), *parts["targets"], *details]))
    log(f"wrote {md_dir / 'BENCHMARKS.md'}, {data_dir / 'bench-results.json'}"
        + (f" and {len(pngs)} chart(s) in {data_dir}" if pngs else "") + f" in {time.monotonic() - started:.0f} s")
    if failed:
        log(f"failed case(s): {', '.join(failed)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
