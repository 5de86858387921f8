"""``zbatch-worker`` / ``python -m worker``: run one batching worker daemon."""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence

from worker.config import load_config
from worker.server import WorkerServer
from zbatch.hub import CONFIG_EXIT_CODE, ModelUnavailable
from zbatch.runtime import daemon, eventloop
from zbatch.runtime.logs import setup_logging


def main(argv: Sequence[str] | None = None) -> None:
    config = load_config(argv)
    setup_logging("zbatch-worker", config.log_level, config.log_format)
    if config.model_path:
        logging.getLogger("zbatch.worker").warning(
            "model_path (ZBATCH_MODEL_PATH) is deprecated: set model (ZBATCH_MODEL), which takes a folder too")
    try:
        eventloop.run(daemon.serve(WorkerServer(config)))
    except ModelUnavailable as exc:
        # A model that cannot be had as set: no restart would get it (systemd: RestartPreventExitStatus).
        print(f"zbatch-worker: error: {exc}", file=sys.stderr, flush=True)
        sys.exit(CONFIG_EXIT_CODE)
    except (ValueError, FileNotFoundError, OSError) as exc:
        # Other startup problems (bad device, unknown task, a port taken) end in one clear line.
        sys.exit(f"zbatch-worker: error: {exc}")


if __name__ == "__main__":
    main()
