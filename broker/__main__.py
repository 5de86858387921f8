"""``zbatch-broker`` / ``python -m broker``: run the broker daemon."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from broker.config import load_config
from broker.server import serve
from zbatch.runtime import eventloop
from zbatch.runtime.logs import setup_logging


def main(argv: Sequence[str] | None = None) -> None:
    config = load_config(argv)
    setup_logging("zbatch-broker", config.log_level, config.log_format)
    try:
        eventloop.run(serve(config))
    except OSError as exc:  # the metrics port is taken: one line beats a traceback
        sys.exit(f"zbatch-broker: error: {exc}")


if __name__ == "__main__":
    main()
