"""``zbatch serve``: a whole stack on this host, kept running until SIGTERM or Ctrl-C.

A model named with ``--model`` (a Hub id or a folder; :mod:`zbatch.hub`)
is found, or downloaded into the Hugging Face cache, once, before anything
starts; a model that cannot be had ends it there, with the reason and exit
status 78.  The workers get the commit it found, and the gateway the model's
name as its default model (unless one is set).

It starts the brokers, then the workers and the gateway
(:mod:`zbatch.supervisor.stack`), logs when the stack serves (and tells
systemd READY=1 when it runs as a ``Type=notify`` service), restarts any
daemon that exits with a growing delay while the others keep serving
(:mod:`zbatch.supervisor.policy`), and stops the gateway, the workers and
the brokers in that order, each within its drain time.  A second SIGTERM or
Ctrl-C stops everything at once.  A closed terminal (SIGHUP) stops it as
SIGTERM does.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from collections.abc import Sequence

from zbatch.hub import CONFIG_EXIT_CODE, Fetched, ModelUnavailable, fetch, is_hub_id
from zbatch.runtime import wakeup
from zbatch.runtime.logs import setup_logging
from zbatch.supervisor.config import ServeConfig, load_config
from zbatch.supervisor.policy import BAD_SETTINGS_EXIT, Backoff, Supervision
from zbatch.supervisor.shell import Shell, child_watchdog_s
from zbatch.supervisor.stack import STOP_ORDER, Placement, build, place

log = logging.getLogger("zbatch.serve")


def main(argv: Sequence[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    config = load_config(argv)
    setup_logging("zbatch-serve", config.log_level, config.log_format)
    try:
        placement = place(config, os.environ)
    except ValueError as exc:  # before any download: the same one line and status as any bad setting
        sys.stderr.write(f"zbatch serve: error: {exc}\n")
        sys.exit(BAD_SETTINGS_EXIT)
    fetched = fetch_model(config) if placement.devices else None
    stack = build(config, os.environ, _config_flag(argv), fetched, placement)
    supervision = Supervision(
        stack.units, STOP_ORDER,
        Backoff(config.restart_delay_ms / 1000, config.restart_max_delay_ms / 1000, config.restart_reset_ms / 1000),
        watchdog_s=child_watchdog_s(),
    )
    shell = Shell("zbatch-serve", supervision, stack.programs, log,
                  stop_signals=(signal.SIGTERM, signal.SIGINT, signal.SIGHUP),
                  serving=lambda: serving_line(config, placement))
    log.info("starting %s and the gateway on port %d; fronts: %s; %s; SIGTERM or Ctrl-C stops them",
             started(placement), config.port, placement.fronts.describe(), stack.tokenizing)
    with wakeup.held(config.cpu_wake_latency_us, log):
        code = asyncio.run(shell.run())
    sys.exit(code)


def started(placement: Placement) -> str:
    """``2 brokers, 4 workers on 1 GPU (cuda:0)``: what ``zbatch serve`` starts besides the gateway."""
    brokers, devices = len(placement.fronts.endpoints), placement.devices
    gpus = sorted(set(devices) - {""})
    on = f" on {len(gpus)} GPU{'' if len(gpus) == 1 else 's'} ({', '.join(gpus)})" if gpus else ""
    return f"{brokers} broker{'' if brokers == 1 else 's'}, {len(devices)} worker{'' if len(devices) == 1 else 's'}{on}"


def fetch_model(config: ServeConfig) -> Fetched | None:
    """``config.model`` on local disk, downloaded once for every worker of the host; None where the workers'
    own setting names it.  A model that cannot be had ends ``zbatch serve`` with its reason and status 78, before
    anything starts."""
    if not config.model and not config.revision:
        return None
    if is_hub_id(config.model):
        at = f" at revision {config.revision}" if config.revision else ""
        log.info("model %s%s: looking in the Hugging Face cache, or downloading it once for every worker",
                 config.model, at)
    try:
        fetched = fetch(config.model, config.revision, progress=sys.stderr.isatty())
    except ModelUnavailable as exc:
        log.error("cannot serve the model: %s", exc)
        sys.exit(CONFIG_EXIT_CODE)
    commit = f" at commit {fetched.commit}" if fetched.commit else ""
    log.info("model %s%s: %s", config.model, commit, fetched.path)
    return fetched


def serving_line(config: ServeConfig, placement: Placement) -> str:
    """The line logged once the whole stack serves: where, with what, and a request to try."""
    host = f"[{config.host}]" if ":" in config.host else config.host
    local = "127.0.0.1" if config.host in ("0.0.0.0", "::", "") else host
    processes = placement.fronts.gateway_processes
    gateway = f"the gateway in {processes} process{'' if processes == 1 else 'es'}" if processes else "the gateway"
    return (f"{started(placement)} and {gateway} are serving on http://{host}:{config.port}; try: "
            f"curl -X POST -d 'hello world' http://{local}:{config.port}/")


def _config_flag(argv: Sequence[str]) -> str | None:
    """The ``--config`` flag's file, which the daemons must read too (the variable reaches them by itself)."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--config")
    known, _ = parser.parse_known_args(argv)
    return str(known.config) if known.config else None


if __name__ == "__main__":
    main()
