"""Shared fixtures: real daemons on free loopback ports, always stopped at the end."""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.daemons import Daemon, start_broker, start_gateway, start_worker, wait_for_worker
from tests.hub import GATED_ID, MODEL_ID, FakeHub, Repo, build_cache
from worker.runners import DEFAULT_MODEL_NAME
from zbatch.hub import bundled_model_path
from zbatch.testing import START_CACHE_ENV, stop_strays


@pytest.fixture(scope="session", autouse=True)
def no_stray_daemons() -> Iterator[None]:
    """Whatever daemon is still running once every test and fixture is done is stopped, and named in a warning.

    Set up first, so torn down last: every fixture has stopped its own daemons by then, and one still running
    is a harness bug.  Only at the end: a module's fixture may start (or restart) daemons during its tests."""
    yield
    if strays := stop_strays():
        warnings.warn(f"daemons left running by the tests, stopped now: {', '.join(strays)}", stacklevel=1)


@pytest.fixture(scope="session", autouse=True)
def start_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """One start cache for the whole run, in-process loads and daemons alike (:data:`START_CACHE_ENV`): the first
    start of a model exports, validates and calibrates it, and every later one reads what it kept.  A developer's
    own ``ZBATCH_ONNX_CACHE`` wins, to keep it across runs.  A test of a cold start names a folder of its own.
    Under pytest-xdist the run's processes share one (in the base folder above each process's own): the cache is
    written for workers that start together (tests/worker/test_start_cache.py)."""
    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent
    chosen = os.environ.get(START_CACHE_ENV) or str(shared / "start-cache")
    Path(chosen).mkdir(parents=True, exist_ok=True)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(START_CACHE_ENV, chosen)
        yield Path(chosen)


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


@pytest.fixture(scope="session")
def hub_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Hugging Face cache (HF_HUB_CACHE) holding the bundled model as sentence-transformers/all-MiniLM-L6-v2 at a
    fake commit, with main and the tag v1.0 pointing at it (tests/hub.py)."""
    cache = tmp_path_factory.mktemp("hf") / "hub"
    build_cache(cache)
    return cache


@pytest.fixture(scope="session")
def fake_hub() -> Iterator[FakeHub]:
    """A fake of the Hub on a local port (tests/hub.py): the bundled model as sentence-transformers/all-MiniLM-L6-v2,
    and a gated copy of it whose files are refused as the Hub refuses a gated model's."""
    model = Path(bundled_model_path())
    with FakeHub({MODEL_ID: Repo(model), GATED_ID: Repo(model, gated=True)}) as hub:
        yield hub
