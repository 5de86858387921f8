"""A model served by its Hugging Face Hub id, offline, through the real stack: ``scripts/serve --model ID``.

One stack for the module: ``scripts/serve`` (which runs ``zbatch serve``) with ``--model
sentence-transformers/all-MiniLM-L6-v2 --revision v1.0``, ``HF_HUB_OFFLINE=1`` and ``HF_HUB_CACHE`` at a
Hugging Face cache built from the bundled model (tests/hub.py), so nothing is downloaded.  The stack is
held to what the issue asked: ``/readyz`` is 200, the ``curl`` that ``zbatch serve`` prints works as printed,
``/v1/models`` shows the id, POST / and TEI's routes answer with that model (the gateway's default model
follows it), and the tag is resolved once to its commit, which every worker loads.  Then ``zbatch serve``
with a model it cannot get: it says why and exits 78 at once, or, when only the workers know the model,
stops the whole stack with 78 instead of restarting the worker.
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tests.daemons import Daemon, free_port, http_json, http_status, spawn, wait_until
from tests.hub import COMMIT, MODEL_ID, TAG, cache_env
from zbatch.hub import CONFIG_EXIT_CODE, bundled_model_path
from zbatch.testing import ROOT, START_TIMEOUT_S, daemon_env, endpoint

SERVE_EXTRAS = "worker,onnx,grpc"  # scripts/serve's ensure_venv
SAME = 0.99999


def stand_in_venv(folder: Path) -> Path:
    """A virtual environment folder that scripts/lib/venv.sh takes as installed: this Python, and a ``zbatch``
    that runs this checkout's; so the test runs scripts/serve itself without installing anything."""
    bin_dir = folder / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "python").symlink_to(sys.executable)
    zbatch = bin_dir / "zbatch"
    zbatch.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -m zbatch "$@"\n')
    zbatch.chmod(0o755)
    digest = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()[:16]
    (folder / ".zbatch-installed").write_text(f"{SERVE_EXTRAS} {digest} torch==2.13.0\n")
    return folder


@pytest.fixture(scope="module")
def cache(hub_cache: Path) -> Path:
    return hub_cache


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, cache: Path) -> Iterator[Daemon]:
    """``scripts/serve --model ID --revision v1.0`` with one worker, offline; its ``url`` once it serves."""
    log_dir = tmp_path_factory.mktemp("serve")
    port = free_port()
    env = daemon_env(cache_env(cache) | {"ZBATCH_VENV": str(stand_in_venv(log_dir / "venv"))})
    command = [str(ROOT / "scripts" / "serve"), "--model", MODEL_ID, "--revision", TAG, "--workers", "1",
               "--port", str(port), "--frontend", endpoint(), "--backend", endpoint(), "--processes", "1"]
    log_path = log_dir / "serve.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    daemon = Daemon("scripts-serve", process, log_path, {"url": f"http://127.0.0.1:{port}"})
    try:
        def serving() -> bool:
            daemon.check()
            return "serving on http://" in log_path.read_text()

        wait_until(serving, START_TIMEOUT_S, "the stack to serve", daemon.log)
        yield daemon
    finally:
        daemon.stop(120)


def log_of(daemon: Daemon) -> str:
    return daemon.log_path.read_text(errors="replace")


def cosine(a: object, b: object) -> float:
    x, y = np.asarray(a, dtype=np.float64).ravel(), np.asarray(b, dtype=np.float64).ravel()
    return float(x @ y / (np.linalg.norm(x) * np.linalg.norm(y)))


def test_readyz_is_200_and_the_printed_curl_works_as_printed(served: Daemon) -> None:
    assert http_status(served.url + "/readyz") == 200
    printed = re.search(r"serving on http://\S+; try: (curl .*)$", log_of(served), re.MULTILINE)
    assert printed is not None, log_of(served)
    done = subprocess.run(shlex.split(printed.group(1)), capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done
    vector = np.asarray(json.loads(done.stdout))
    _, _, [by_name] = http_json(f"{served.url}/models/{MODEL_ID}", {"inputs": ["hello world"]})
    assert vector.shape == (384,) and cosine(vector, by_name) > SAME


def test_the_models_list_shows_the_hub_id(served: Daemon) -> None:
    status, _, listing = http_json(served.url + "/v1/models")
    assert status == 200 and [model["id"] for model in listing["data"]] == [MODEL_ID]
    _, _, models = http_json(served.url + "/models")
    [model] = models["models"]
    assert model["name"] == MODEL_ID and "POST /" in model["dialects"]["zbatch"], model["dialects"]
    assert "POST /embed" in model["dialects"]["tei"]


def test_teis_routes_and_openais_answer_with_the_served_model(served: Daemon) -> None:
    status, _, info = http_json(served.url + "/info")
    assert status == 200 and info["model_id"] == MODEL_ID
    assert http_status(served.url + "/health") == 200
    status, _, [embedded] = http_json(served.url + "/embed", {"inputs": "hello world"})
    assert status == 200 and len(embedded) == 384
    status, _, answer = http_json(served.url + "/v1/embeddings", {"model": MODEL_ID, "input": "hello world"})
    assert status == 200 and answer["model"] == MODEL_ID
    assert cosine(answer["data"][0]["embedding"], embedded) > SAME


def test_the_tag_is_resolved_once_and_every_worker_loads_its_commit(served: Daemon) -> None:
    log = log_of(served)
    assert f"zbatch.serve: model {MODEL_ID} at commit {COMMIT}: " in log, log
    assert re.search(rf"zbatch.worker: model {re.escape(MODEL_ID)}: {re.escape(MODEL_ID)} at commit {COMMIT} "
                     rf"\(revision {COMMIT}\), from the Hugging Face cache: ", log), log


def test_a_sigterm_stops_the_stack(served: Daemon) -> None:
    """Last: the shared stack stops cleanly (scripts/serve execs zbatch serve, so the signal is its)."""
    served.signal(signal.SIGTERM)
    assert served.process.wait(120) == 0, log_of(served)


def test_a_model_only_the_workers_know_is_followed_by_the_gateway(tmp_path: Path) -> None:
    """Issue 39 as it was found: ZBATCH_MODEL_PATH=/models/my-model zbatch serve.  zbatch serve knows no model,
    the workers serve my-model, and the gateway, whose settings name none, follows it: the printed curl answers
    and /readyz is 200."""
    folder = tmp_path / "my-model"
    folder.symlink_to(bundled_model_path(), target_is_directory=True)
    port = free_port()
    daemon = spawn("zbatch", "zbatch-serve", tmp_path, "serve", env={"ZBATCH_MODEL_PATH": str(folder)},
                   interpreter=None, port=port, frontend=endpoint(), backend=endpoint(), processes=1, workers=1)
    try:
        def serving() -> re.Match[str] | None:
            daemon.check()
            return re.search(r"serving on http://\S+; try: (curl .*)$", log_of(daemon), re.MULTILINE)

        printed = wait_until(serving, START_TIMEOUT_S, "the stack to serve", daemon.log)
        done = subprocess.run(shlex.split(printed.group(1)), capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode == 0 and len(json.loads(done.stdout)) == 384, done
        assert http_status(f"http://127.0.0.1:{port}/readyz") == 200
        assert http_json(f"http://127.0.0.1:{port}/info")[2]["model_id"] == "my-model"
    finally:
        assert daemon.stop(120) == 0, log_of(daemon)


# ------------------------------------------------------------------------------------------- failures


def serve_failing(log_dir: Path, *args: str, env: dict[str, str], **settings: object) -> tuple[int, str]:
    """``zbatch serve`` that must give up: its exit status and log."""
    daemon = spawn("zbatch", "zbatch-serve", log_dir, "serve", *args, env=env, interpreter=None, port=free_port(),
                   frontend=endpoint(), backend=endpoint(), processes=1, **settings)
    try:
        return daemon.process.wait(START_TIMEOUT_S), log_of(daemon)
    finally:
        daemon.stop()


def test_a_model_not_in_the_cache_offline_stops_zbatch_serve_before_anything_starts(
        cache: Path, tmp_path: Path) -> None:
    status, log = serve_failing(tmp_path, "--model", "org/absent", env=cache_env(cache))
    assert status == CONFIG_EXIT_CODE, log
    assert (f"zbatch.serve: cannot serve the model: model 'org/absent' is not in the Hugging Face cache {cache}, "
            f"and HF_HUB_OFFLINE=1 forbids downloading it") in log, log
    assert "started " not in log, "nothing was started"


def test_a_model_only_the_workers_know_stops_the_stack_instead_of_restarting_the_worker(
        cache: Path, tmp_path: Path) -> None:
    """The model is in the workers' own table of the config file: zbatch serve learns it cannot be had from
    the worker's exit status, 78, and stops everything rather than restart a worker that would fail again."""
    config = tmp_path / "zbatch.toml"
    config.write_text(f'[worker]\nmodel = "{tmp_path / "no-such-model"}"\n')
    status, log = serve_failing(tmp_path, "--config", str(config), env=cache_env(cache), workers=1)
    assert status == CONFIG_EXIT_CODE, log
    assert f"zbatch-worker: error: model folder '{tmp_path / 'no-such-model'}' does not exist" in log, log
    assert re.search(r"worker-0 \(pid \d+\) exited with status 78 after [\d.]+ s: not restarting it, and stopping "
                     r"everything: exit status 78 is a worker's answer to a model it cannot get", log), log
    assert log.count("started worker-0") == 1 and "restarting in" not in log
    assert re.search(r"zbatch.serve: zbatch-serve stopped with status 78", log), log
