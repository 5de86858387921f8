"""Where one request's time goes at one client, on the CPU's simulated accelerator.

``python -m scripts.benchmarks.studies.lone_path [--paths zmq,http] [--seconds 8] [--batch-ms 0.05]`` starts
:mod:`~scripts.benchmarks.studies.cpu_path`'s stack (a broker, one worker whose model is a sleep, a gateway of
one process) with every daemon marking its points, and prints :mod:`scripts.benchmarks.load.lone`'s table for
each path: the median and mean µs of each stage of a request, from the client's send through the broker, the
worker's I/O loop and inference thread and back.  ``--shallow-idle`` measures with every core held out of deep idle
states (:mod:`zbatch.runtime.wakeup`), to tell the cores' wake-ups from the path's own work.
"""

from __future__ import annotations

import argparse
import logging
import tempfile
from pathlib import Path

from scripts.benchmarks.common import marks, procs
from scripts.benchmarks.load import lone
from scripts.benchmarks.studies import cpu_path
from scripts.benchmarks.systems.accelerator import MODEL
from zbatch.runtime import eventloop, wakeup


async def run(args: argparse.Namespace) -> None:
    folder = Path(tempfile.mkdtemp(prefix="zbatch-marks-"))
    uninstall = marks.install_now(lone.CLIENT_POINTS, folder)
    try:
        with procs.running() as daemons:
            stack = await procs.start(daemons, cpu_path.start_stack, args.batch_ms, 0.0, False,
                                      lone.marked_env(folder))
            hold_us = 0 if args.shallow_idle else wakeup.HOST_POLICY
            with wakeup.held(hold_us, logging.getLogger("zbatch.bench")) as held:
                if args.shallow_idle and not held:
                    raise SystemExit(f"--shallow-idle: {wakeup.PM_QOS} cannot be held by this process")
                windows = await lone.lone_windows(args.paths.split(","), stack.url,
                                                  stack.frontend, MODEL, args.warmup, args.seconds)
    finally:
        uninstall()  # the daemons wrote theirs as they stopped
    print(f"Simulated accelerator: {args.batch_ms} ms a batch, one worker; marks in {folder}; {wakeup.idle_states()}"
          + ("; cores held out of deep idle" if args.shallow_idle else ""))
    marked = marks.read_marks(folder)
    for window in windows:
        print(lone.report(lone.path_title(window.path), marked, window))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--paths", default="zmq,http", help="comma-separated: zmq, http")
    parser.add_argument("--seconds", type=float, default=8.0, help="each path's measured window")
    parser.add_argument("--warmup", type=float, default=2.0, help="load before each window")
    parser.add_argument("--batch-ms", type=float, default=0.05, help="the simulated model's cost per batch")
    parser.add_argument("--shallow-idle", action="store_true",
                        help="hold every core out of deep idle states while measuring (needs root)")
    eventloop.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
