"""``zbatch-gateway`` / ``python -m gateway``: load the config, set up logging, serve.

With ``--processes`` above 1 (its default: one per core, at most 4) this
process supervises that many gateway processes on the port instead
(:mod:`gateway.processes`); with 1 it is the gateway itself.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence

from gateway.config import load_config
from gateway.server import GatewayServer
from zbatch.runtime import daemon, eventloop
from zbatch.runtime.logs import setup_logging


def main(argv: Sequence[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else list(argv)
    config = load_config(args)
    setup_logging("zbatch-gateway", config.log_level, config.log_format)
    processes = config.process_count
    if processes > 1:
        from gateway.processes import serve_processes  # the supervisor: not loaded by one gateway process

        sys.exit(serve_processes(config, args, processes))
    # Formatting a line per request costs a large share of the gateway's throughput: opt in.
    logging.getLogger("zbatch.gateway.access").setLevel(logging.INFO if config.access_log else logging.WARNING)
    try:
        eventloop.run(daemon.serve(GatewayServer(config)))
    except OSError as exc:  # typically the port is taken; one line beats a traceback
        logging.getLogger("zbatch.gateway").error(
            "cannot serve on %s:%s: %s", config.host, config.port, exc
        )
        raise SystemExit(1) from None


if __name__ == "__main__":
    main()
