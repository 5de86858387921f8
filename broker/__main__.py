"""``zbatch-broker`` / ``python -m broker``: run the broker daemon."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from broker.config import load_config
from broker.server import serve


def main(argv: Sequence[str] | None = None) -> None:
    config = load_config(argv)
    logging.basicConfig(
        level=config.log_level.upper(),
        format="%(asctime)s %(levelname)s zbatch-broker[%(process)d] %(message)s",
    )
    asyncio.run(serve(config))


if __name__ == "__main__":
    main()
