"""``zbatch-broker`` / ``python -m broker``: run the broker daemon."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from broker.config import load_config
from broker.server import BrokerServer
from zbatch.runtime import daemon, eventloop
from zbatch.runtime.logs import setup_logging


def main(argv: Sequence[str] | None = None) -> None:
    config = load_config(argv)
    setup_logging("zbatch-broker", config.log_level, config.log_format)
    try:
        eventloop.run(daemon.serve(BrokerServer(config)))
    except (OSError, ValueError) as exc:  # a port taken, an unreadable key: one line beats a traceback
        sys.exit(f"zbatch-broker: error: {exc}")


if __name__ == "__main__":
    main()
