"""``zbatch-worker`` / ``python -m worker``: run one batching worker daemon."""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Sequence

from worker.config import load_config
from worker.server import serve


def main(argv: Sequence[str] | None = None) -> None:
    config = load_config(argv)
    logging.basicConfig(
        level=config.log_level.upper(),
        format="%(asctime)s %(levelname)s zbatch-worker[%(process)d] %(message)s",
    )
    try:
        asyncio.run(serve(config))
    except (ValueError, FileNotFoundError, OSError) as exc:
        # Startup problems (bad device, missing model folder, unknown task) end in one clear line.
        sys.exit(f"zbatch-worker: error: {exc}")


if __name__ == "__main__":
    main()
