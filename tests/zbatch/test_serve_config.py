"""``zbatch serve``'s settings and the stack it builds from them; the ``zbatch`` command's dispatch."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
from pathlib import Path

import pytest

from broker.config import BrokerConfig
from gateway.config import GatewayConfig
from worker.config import WorkerConfig
from zbatch.client import AsyncClient
from zbatch.client.aio import REPLY_GRACE_MS
from zbatch.supervisor import stack
from zbatch.supervisor.config import ServeConfig, load_config
from zbatch.supervisor.gpus import check_gpus, gpu_devices, visible_gpus, workers_per_gpu
from zbatch.supervisor.policy import STOP_MARGIN_S
from zbatch.testing import ROOT, daemon_env

NO_GPUS = {"CUDA_VISIBLE_DEVICES": ""}


def test_defaults_are_scripts_serves() -> None:
    config = load_config([], {})
    assert config == ServeConfig()
    assert (config.workers, config.port, config.host, config.processes) == (2, 8000, "127.0.0.1", 0)
    assert stack.place(config, NO_GPUS).fronts.endpoints == (("tcp://127.0.0.1:5555", "tcp://127.0.0.1:5556"),)


def test_settings_come_from_flags_variables_and_the_serve_table(tmp_path: Path) -> None:
    file = tmp_path / "zbatch.toml"
    file.write_text('[serve]\nworkers = 3\nport = 9000\n\n[worker]\ndrain_timeout_ms = 4000\n')
    config = load_config(["--config", str(file), "--port", "9100"], {"ZBATCH_WORKERS": "4"})
    assert (config.workers, config.port) == (4, 9100)
    assert load_config(["--config", str(file)], {}).workers == 3


@pytest.mark.parametrize(("environ", "message"), [
    ({"ZBATCH_FRONTEND": "tcp://127.0.0.1:5555,tcp://127.0.0.1:5557"}, "frontend lists 2 endpoints and backend 1"),
    ({"ZBATCH_RESTART_DELAY_MS": "5000", "ZBATCH_RESTART_MAX_DELAY_MS": "1000"},
     "restart_max_delay_ms (1000) is below"),
    ({"ZBATCH_WORKERS": "-1"}, "ZBATCH_WORKERS='-1': must be at least 0"),
])
def test_a_bad_setting_stops_with_one_line(environ: dict[str, str], message: str,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stop:
        load_config([], environ)
    assert stop.value.code == 2
    assert message in capsys.readouterr().err


def test_the_stack_has_its_brokers_workers_and_gateway_in_order() -> None:
    config = load_config(["--workers", "2", "--port", "9000", "--processes", "2",
                          "--frontend", "tcp://127.0.0.1:5555,tcp://127.0.0.1:5557",
                          "--backend", "tcp://127.0.0.1:5556,tcp://127.0.0.1:5558"], {})
    built = stack.build(config, NO_GPUS)
    assert [(u.name, u.group, u.after) for u in built.units] == [
        ("broker-0", "broker", ()), ("broker-1", "broker", ()), ("worker-0", "worker", ("broker",)),
        ("worker-1", "worker", ("broker",)), ("gateway", "gateway", ("broker",))]
    python = [sys.executable, "-m"]
    assert built.programs["broker-1"].argv == [*python, "broker", "--frontend", "tcp://127.0.0.1:5557",
                                               "--backend", "tcp://127.0.0.1:5558"]
    assert built.programs["worker-1"].argv == [*python, "worker", "--name", "worker-1", "--backend",
                                               config.backend, "--workers", "2"]
    assert built.programs["gateway"].argv == [*python, "gateway", "--host", "127.0.0.1", "--port", "9000",
                                              "--frontend", config.frontend, "--processes", "2"]
    assert all(not program.env for program in built.programs.values())


def test_on_a_host_with_gpus_each_gets_its_workers_pinned_to_it() -> None:
    built = stack.build(load_config(["--workers-per-gpu", "2"], {}), {"CUDA_VISIBLE_DEVICES": "0,1"})
    workers = [built.programs[unit.name].argv for unit in built.units if unit.group == "worker"]
    assert [argv[argv.index("--device") + 1] for argv in workers] == ["cuda:0", "cuda:0", "cuda:1", "cuda:1"]
    assert all(argv[argv.index("--workers") + 1] == "4" for argv in workers)  # they share the host's cores
    auto = stack.worker_devices(ServeConfig(), {"CUDA_VISIBLE_DEVICES": "0"})
    assert auto == ["cuda:0"] * workers_per_gpu(os.cpu_count() or 1, 1)
    three = stack.worker_devices(load_config(["--workers-per-gpu", "3", "--gpus", "1"], {}), {})
    assert three == ["cuda:1"] * 3


@pytest.mark.parametrize(("argv", "environ", "devices"), [
    ([], NO_GPUS, ["", ""]),  # no GPU: the CPU workers
    (["--workers", "3", "--gpus", "none"], {"CUDA_VISIBLE_DEVICES": "0"}, ["", "", ""]),
    ([], {"CUDA_VISIBLE_DEVICES": "0", "ZBATCH_DEVICE": "cpu"}, ["", ""]),  # the user pinned the devices
    (["--workers", "0"], {"CUDA_VISIBLE_DEVICES": "0"}, []),  # none on this host, GPUs or not
])
def test_workers_run_on_the_cpu_without_gpus_or_when_told(argv: list[str], environ: dict[str, str],
                                                         devices: list[str]) -> None:
    assert stack.worker_devices(load_config(argv, {}), environ) == devices


def test_the_default_is_one_worker_for_every_four_cores_a_gpu_has_from_one_to_four() -> None:
    assert workers_per_gpu(16, 1) == 4  # an H200 host: 4 served most (BENCHMARKS.md, GPU)
    assert workers_per_gpu(64, 8) == 2 and workers_per_gpu(128, 8) == 4 and workers_per_gpu(256, 2) == 4
    assert workers_per_gpu(2, 1) == 1 and workers_per_gpu(8, 4) == 1 and workers_per_gpu(0, 0) == 1


def test_gpus_are_counted_as_cuda_will_number_them() -> None:
    smi = ["GPU 0: NVIDIA H200 (UUID: GPU-1)", "  MIG 1g.18gb Device 0: (UUID: MIG-1)",
           "GPU 1: NVIDIA H200 (UUID: GPU-2)"]
    assert visible_gpus({}, smi) == 2
    assert visible_gpus({}, None) == 0
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "3,1"}, smi) == 2
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": ""}, smi) == 0
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "0,-1,1"}, smi) == 1  # CUDA stops at the first invalid one
    assert gpu_devices("none", {"CUDA_VISIBLE_DEVICES": "0"}) == []
    assert gpu_devices("auto", {"CUDA_VISIBLE_DEVICES": "0,1"}) == ["cuda:0", "cuda:1"]
    assert gpu_devices("2, 3") == ["cuda:2", "cuda:3"]
    assert [check_gpus(each) for each in ("auto", "none", "0", "0,1")] == [None] * 4
    assert all(check_gpus(each) for each in ("", "cuda:0", "0,0", "one", "-1"))


def test_stop_timeouts_are_the_daemons_drains_wherever_they_are_set(tmp_path: Path) -> None:
    def timeouts(environ: dict[str, str], config_file: str | None = None) -> dict[str, float]:
        return {u.group: u.stop_timeout_s for u in stack.build(ServeConfig(), NO_GPUS | environ, config_file).units}

    grace_s = REPLY_GRACE_MS / 1000
    assert timeouts({}) == {"broker": 10 + STOP_MARGIN_S, "worker": 10 + STOP_MARGIN_S,
                            "gateway": 30 + grace_s + 2 * STOP_MARGIN_S}
    file = tmp_path / "zbatch.toml"
    file.write_text("[broker]\ndrain_timeout_ms = 3000\n[gateway]\ntimeout_ms = 5000\n")
    found = timeouts({"ZBATCH_DRAIN_TIMEOUT_MS": "1000"}, str(file))
    assert found == {"broker": 1 + STOP_MARGIN_S, "worker": 1 + STOP_MARGIN_S,
                     "gateway": 5 + grace_s + 2 * STOP_MARGIN_S}, "the variable beats the file"
    assert timeouts({"ZBATCH_CONFIG": str(file)})["broker"] == 3 + STOP_MARGIN_S
    assert timeouts({"ZBATCH_DRAIN_TIMEOUT_MS": "soon"})["worker"] == 10 + STOP_MARGIN_S, "the worker will say why"
    flagged = stack.build(ServeConfig(), NO_GPUS, "relative.toml")
    assert flagged.programs["worker-0"].env == {"ZBATCH_CONFIG": str(Path("relative.toml").resolve())}


def test_the_defaults_copied_here_are_the_daemons() -> None:
    assert stack.BROKER_DRAIN_MS == BrokerConfig().drain_timeout_ms
    assert stack.WORKER_DRAIN_MS == WorkerConfig().drain_timeout_ms
    assert stack.GATEWAY_TIMEOUT_MS == GatewayConfig().timeout_ms
    assert REPLY_GRACE_MS == inspect.signature(AsyncClient).parameters["reply_grace_ms"].default
    assert ServeConfig().workers == 2 and ServeConfig().port == GatewayConfig().port


def zbatch(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "zbatch", *args], capture_output=True, text=True, cwd=ROOT,
                          env=daemon_env(), timeout=60, check=False)


def test_the_zbatch_command_runs_its_subcommands() -> None:
    listing = zbatch("--help")
    assert listing.returncode == 0 and all(name in listing.stdout for name in ("serve", "status", "keys"))
    assert "ZBATCH_RESTART_DELAY_MS" in zbatch("serve", "--help").stdout
    assert "--refresh-ms" in zbatch("status", "--help").stdout
    unknown = zbatch("serf")
    assert unknown.returncode == 2 and "unknown command 'serf': expected one of serve, status, keys" in unknown.stderr
    assert zbatch().returncode == 2
