"""Shared fixtures: real daemons on free loopback ports, always stopped at the end."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.daemons import Daemon, start_broker, start_gateway, start_worker, wait_for_worker
from worker.runners import DEFAULT_MODEL_NAME


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Daemon]]:
    """One broker, two workers serving the default model, and a gateway, shared by the session."""
    log_dir = tmp_path_factory.mktemp("stack")
    daemons: dict[str, Daemon] = {}
    try:
        # "reserved-model" is known to the broker but never served: it produces
        # deadline and no-worker answers on demand.
        daemons["broker"] = start_broker(log_dir, models=(DEFAULT_MODEL_NAME, "reserved-model"))
        daemons["w1"] = start_worker(daemons["broker"], log_dir, "w1", wait=False)
        daemons["w2"] = start_worker(daemons["broker"], log_dir, "w2")
        wait_for_worker(daemons["broker"], daemons["w1"])
        daemons["gateway"] = start_gateway(daemons["broker"], log_dir)
        yield daemons
    finally:
        for daemon in reversed(list(daemons.values())):
            daemon.stop()


@pytest.fixture
def log_dir(tmp_path: Path) -> Path:
    return tmp_path
