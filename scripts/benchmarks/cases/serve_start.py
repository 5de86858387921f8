"""How long ``zbatch serve`` takes to answer, and where each worker's start went.

``python -m scripts.benchmarks.cases.serve_start [--runs N] [--env NAME=VALUE ...]``: starts ``zbatch serve``
(the model of ``ZBATCH_MODEL_PATH``, else the bundled one) ``N`` times in a row, each until its first embedding
comes back, and prints the seconds to that answer, when each worker registered (from the spawn), and every
worker's log line of its start phases (:mod:`worker.runners.phases`).  The runs after the first meet the start
cache and the page cache warm, as an autoscaler's restarts do.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import time

from scripts.benchmarks.cases.gpu import model_folder, serve
from scripts.benchmarks.cases.transitions import registrations
from scripts.benchmarks.common import procs
from zbatch.testing import Daemons, serves

SHOWN = re.compile(r"loaded on .* in [\d.]+ s|CUDA graphs captured|registered: |serving on http")


async def one_start(index: int, env: dict[str, str]) -> None:
    path, name = model_folder()
    spawned = time.time()
    with Daemons() as daemons:
        served = await serve(daemons, path, name, f"start-{index}", env=env)
        await procs.blocking(daemons.wait, lambda: serves(served.daemon), "every daemon to be ready", 120.0)
        lines = served.daemon.log_path.read_text(errors="replace").splitlines()
        registered = [round(at - spawned, 2) for at in registrations(served.daemon)]
    print(f"run {index}: answered {served.startup_s:.1f} s after the spawn; workers registered at {registered} s")
    for line in lines:
        if SHOWN.search(line):
            print("   ", line[:300])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--env", action="append", default=[], help="NAME=VALUE for the daemons, repeatable")
    args = parser.parse_args()
    env = dict(pair.split("=", 1) for pair in args.env)
    for index in range(args.runs):
        asyncio.run(one_start(index, env))


if __name__ == "__main__":
    main()
