"""Starting, stopping and configuring the gateway process."""

from __future__ import annotations

import asyncio
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer

from gateway.app import create_app
from gateway.config import GatewayConfig, load_config
from tests.daemons import free_port, wait_until
from tests.gateway.conftest import REPO, START_TIMEOUT_S, STOP_TIMEOUT_S, spawn_gateway


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_stop_signal_exits_cleanly(tmp_path: Path, sig: signal.Signals) -> None:
    gateway = spawn_gateway(tmp_path)
    try:
        wait_until(gateway.is_healthy, START_TIMEOUT_S, "/healthz", gateway.log)
        gateway.process.send_signal(sig)
        assert gateway.process.wait(STOP_TIMEOUT_S) == 0, gateway.log()
    finally:
        gateway.stop()
    log = gateway.log()
    assert "zbatch-gateway stopped" in log
    assert "Traceback" not in log


def test_port_zero_logs_the_bound_port(tmp_path: Path) -> None:
    gateway = spawn_gateway(tmp_path, port=0)
    pattern = re.compile(
        r"zbatch-gateway\[\d+\] zbatch.gateway: zbatch-gateway listening on http://127\.0\.0\.1:(\d+)"
    )
    try:
        wait_until(lambda: pattern.search(gateway.log()) is not None, START_TIMEOUT_S,
                   "the 'listening on' log line", gateway.log)
        match = pattern.search(gateway.log())
        assert match is not None
        gateway.port = int(match.group(1))
        assert gateway.port != 0
        assert gateway.request("GET", "/healthz").status == 200
    finally:
        assert gateway.stop() == 0


def test_taken_port_exits_with_one_line(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        gateway = spawn_gateway(tmp_path, port=taken.getsockname()[1])
        assert gateway.process.wait(STOP_TIMEOUT_S * 2) == 1
    log = gateway.log()
    assert "cannot serve on 127.0.0.1" in log
    assert "Traceback" not in log


def test_config_defaults() -> None:
    config = load_config([], {})
    assert config == GatewayConfig()
    assert (config.host, config.port, config.frontend) == (
        "127.0.0.1",
        8000,
        "tcp://127.0.0.1:5555",
    )
    assert (config.timeout_ms, config.max_body_bytes, config.log_level) == (30000, 1048576, "info")
    assert config.required_models == () and config.named_default_model == "", "it follows what the brokers serve"
    named = load_config([], {"ZBATCH_MODELS": "a,b"})
    assert (named.required_models, named.named_default_model) == (("a", "b"), "a")
    assert load_config(["--default-model", "c"], {"ZBATCH_MODELS": "a,b"}).named_default_model == "c"


def test_config_flags_override_environment() -> None:
    environ = {
        "ZBATCH_PORT": "9000",
        "ZBATCH_FRONTEND": "tcp://10.0.0.1:5555",
        "ZBATCH_LOG_LEVEL": "debug",
    }
    config = load_config(["--port", "9001", "--frontend", "ipc:///tmp/zb"], environ)
    assert (config.port, config.frontend, config.log_level) == (9001, "ipc:///tmp/zb", "debug")


def test_config_models_is_a_comma_separated_list() -> None:
    config = load_config(["--models", "a,b"], {})
    assert config.models == config.required_models == ("a", "b")
    assert load_config([], {"ZBATCH_MODELS": " a, ,b "}).models == ("a", "b")


@pytest.mark.parametrize(
    "argv",
    [
        ["--port", "-1"],
        ["--port", "http"],
        ["--frontend", "localhost:5555"],
        ["--max-body-bytes", "0"],
        ["--timeout-ms", "0"],
        ["--log-level", "verbose"],
    ],
)
def test_config_rejects_bad_values(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        load_config(argv, {})
    assert exited.value.code == 2
    assert argv[0] in capsys.readouterr().err


def test_create_app_opens_its_own_client_when_given_none() -> None:
    async def probe() -> tuple[int, str]:
        config = GatewayConfig(frontend=f"tcp://127.0.0.1:{free_port()}")
        async with TestClient(TestServer(create_app(config))) as client:
            response = await client.post("/models/m", json={"inputs": "a"})
            return response.status, (await response.json())["error"]["code"]

    assert asyncio.run(probe()) == (503, "broker_unavailable")


def test_gateway_imports_no_model_code() -> None:
    """The gateway is a thin front: loading it must not pull in torch, transformers or worker/."""
    check = (
        "import sys, gateway.__main__; "
        "roots = {m.split('.')[0] for m in sys.modules}; "
        "heavy = sorted(roots & {'torch', 'transformers', 'worker'}); "
        "print(heavy); sys.exit(1 if heavy else 0)"
    )
    result = subprocess.run([sys.executable, "-c", check], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
