"""``zbatch-worker`` / ``python -m worker``: run one batching worker daemon."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from worker.config import load_config
from worker.server import WorkerServer
from zbatch.runtime import daemon, eventloop
from zbatch.runtime.logs import setup_logging


def main(argv: Sequence[str] | None = None) -> None:
    config = load_config(argv)
    setup_logging("zbatch-worker", config.log_level, config.log_format)
    try:
        eventloop.run(daemon.serve(WorkerServer(config)))
    except (ValueError, FileNotFoundError, OSError) as exc:
        # Startup problems (bad device, missing model folder, unknown task) end in one clear line.
        sys.exit(f"zbatch-worker: error: {exc}")


if __name__ == "__main__":
    main()
