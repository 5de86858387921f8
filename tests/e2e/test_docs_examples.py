"""Every example the documentation marks runnable (``<!-- zbatch:run -->``) runs against a real stack.

A stack of this module's (a broker, a worker with the real default model and a tiny cross-encoder served as
``reranker``, a gateway with its gRPC port on) stands in for the one the pages assume: their
``localhost:8000``, ``127.0.0.1:8001`` (gRPC) and ``tcp://127.0.0.1:5555`` become the stack's addresses, and
each example runs as the reader would run it, Python with this interpreter and the clients users have
(openai, huggingface_hub, tritonclient, requests, cohere), shell with bash and curl.  An example passes when it exits
0; curl is made to fail on an HTTP error status.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest

from scripts.docs import Sample, samples
from tests.worker.tiny_models import make_tiny_bert
from zbatch.testing import ROOT, Daemons, daemon_env, free_port, start_broker, start_http, start_worker

RUNNABLE = [sample for sample in samples() if sample.runnable]
NOWHERE = "http://127.0.0.1:9"  # the discard port, closed: where a client's hub calls would go, and fail
CURL = 'curl() { command curl --silent --show-error --fail-with-body --max-time 30 "$@"; echo; }\n'


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemons]:
    logs = tmp_path_factory.mktemp("docs")
    with Daemons(logs) as daemons:
        broker = daemons.add(start_broker(logs))
        reranker = f"name=reranker,path={make_tiny_bert(logs, 'rerank')},task=rerank"  # the pages' rerank model
        daemons.add(start_worker(broker, logs, "w1", workers=1, extra_models=reranker))
        port = free_port()
        gateway = daemons.add(start_http("gateway", "gateway", logs, frontend=broker.frontend, processes=1,
                                         grpc_port=port, ready="/readyz"))
        gateway.endpoints["grpc"] = f"127.0.0.1:{port}"
        yield daemons


def localized(code: str, stack: Daemons) -> str:
    gateway = stack["gateway"].url.removeprefix("http://")
    return (code.replace("localhost:8000", gateway).replace("127.0.0.1:8001", stack["gateway"].endpoints["grpc"])
            .replace("tcp://127.0.0.1:5555", stack["broker"].frontend))


@pytest.mark.parametrize("sample", RUNNABLE, ids=lambda sample: f"{sample.page}:{sample.language}")
def test_the_example_runs(sample: Sample, stack: Daemons) -> None:
    code = localized(sample.code, stack)
    # huggingface_hub refuses a URL model while offline: online, with the hub pointed nowhere.
    env = daemon_env({"HF_HUB_OFFLINE": "0", "HF_ENDPOINT": NOWHERE, "HF_TOKEN": "unused"})
    if sample.language == "python":
        command = [sys.executable, "-c", code]
    else:
        assert sample.language == "sh", f"{sample.page}: a runnable {sample.language} example"
        command = ["bash", "-e", "-c", CURL + code]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env, cwd=ROOT, check=False)
    assert done.returncode == 0, f"{sample.page}:\n{code}\nstdout: {done.stdout[-2000:]}\nstderr: {done.stderr[-2000:]}"
    assert done.stdout.strip(), f"{sample.page}: the example printed nothing"


def test_there_are_runnable_examples() -> None:
    assert len(RUNNABLE) >= 9
