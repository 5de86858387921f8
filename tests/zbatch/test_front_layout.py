"""``zbatch serve``'s fronts: how many brokers and gateway processes, from the settings or from the host's cores and
GPUs (zbatch/supervisor/layout.py), and the ports of brokers derived from one endpoint."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gateway import config as gateway_config
from gateway.config import MAX_AUTO_PROCESSES
from zbatch.supervisor import stack
from zbatch.supervisor.config import load_config
from zbatch.supervisor.layout import (
    CORES_FOR_MORE_BROKERS,
    CORES_PER_GATEWAY_PROCESS,
    GATEWAY_DEFAULT,
    GATEWAY_MAX_AUTO_PROCESSES,
    GPU_HOST_BROKERS,
    MAX_GATEWAY_PROCESSES,
    FrontLayout,
    derived_endpoints,
    front_layout,
    resolve_fronts,
)
from zbatch.testing import ROOT, daemon_env

NO_GPUS = {"CUDA_VISIBLE_DEVICES": ""}
ONE_GPU = {"CUDA_VISIBLE_DEVICES": "0"}
LOCAL = "tcp://127.0.0.1"


def test_a_host_without_gpus_keeps_one_broker_and_the_gateways_own_default() -> None:
    for cores in (1, 2, 16, 256):
        layout = front_layout(cores, 0)
        assert (layout.brokers, layout.gateway_processes) == (1, GATEWAY_DEFAULT)


def test_a_host_with_gpus_gets_brokers_from_its_cores_and_a_gateway_process_for_every_few_cores() -> None:
    big = front_layout(CORES_FOR_MORE_BROKERS, 1)
    assert big.brokers == GPU_HOST_BROKERS
    assert big.gateway_processes == min(CORES_FOR_MORE_BROKERS // CORES_PER_GATEWAY_PROCESS, MAX_GATEWAY_PROCESSES)
    assert front_layout(CORES_FOR_MORE_BROKERS - 1, 1).brokers == 1
    assert front_layout(1, 1) == FrontLayout(1, 1, front_layout(1, 1).why, edge_tokenize=True), "one process at least"
    assert front_layout(0, 2).gateway_processes == 1
    assert front_layout(1024, 8).gateway_processes == MAX_GATEWAY_PROCESSES
    assert front_layout(4 * CORES_PER_GATEWAY_PROCESS, 1).gateway_processes == min(4, MAX_GATEWAY_PROCESSES)
    assert "16 cores and 2 GPUs" in front_layout(16, 2).why and "without GPUs" in front_layout(16, 0).why


def test_broker_i_binds_each_port_plus_2i_on_the_same_host() -> None:
    assert derived_endpoints(f"{LOCAL}:5555", f"{LOCAL}:5556", 3, 8000) == [
        (f"{LOCAL}:5555", f"{LOCAL}:5556"), (f"{LOCAL}:5557", f"{LOCAL}:5558"), (f"{LOCAL}:5559", f"{LOCAL}:5560")]
    assert derived_endpoints("tcp://[::1]:7000", "tcp://*:7101", 2, 8000) == [
        ("tcp://[::1]:7000", "tcp://*:7101"), ("tcp://[::1]:7002", "tcp://*:7103")]
    assert derived_endpoints("ipc:///run/f", "ipc:///run/b", 1, 8000) == [("ipc:///run/f", "ipc:///run/b")]


@pytest.mark.parametrize(("frontend", "backend", "count", "gateway_port", "message"), [
    (f"{LOCAL}:5555", f"{LOCAL}:5557", 2, 8000, "port 5557 would be bound twice"),
    (f"{LOCAL}:5555", f"{LOCAL}:5556", 2, 5558, "port 5558 would be bound twice (the gateway's port is 5558)"),
    (f"{LOCAL}:65534", f"{LOCAL}:65535", 2, 8000, "ports would pass 65535"),
    ("ipc:///run/f", "ipc:///run/b", 2, 8000, "is not a TCP endpoint with a port number"),
    (f"{LOCAL}:5555", "tcp://127.0.0.1:*", 2, 8000, "list 2 endpoints in each"),
])
def test_derived_ports_that_cannot_be_bound_are_an_error_that_says_what_to_change(
        frontend: str, backend: str, count: int, gateway_port: int, message: str) -> None:
    with pytest.raises(ValueError, match="brokers is 2") as error:
        derived_endpoints(frontend, backend, count, gateway_port)
    assert message in str(error.value)


def test_settings_win_over_the_hosts_choice_and_say_so() -> None:
    gpu_host = front_layout(CORES_FOR_MORE_BROKERS, 1)
    listed = [f"{LOCAL}:5555", f"{LOCAL}:6555"], [f"{LOCAL}:5556", f"{LOCAL}:6556"]
    fronts = resolve_fronts(*listed, 0, 3, 8000, gpu_host)
    assert len(fronts.endpoints) == 2 and fronts.gateway_processes == 3
    assert fronts.why == "brokers: one for each frontend listed; gateway processes as set"
    assert fronts.describe().startswith("2 brokers and 3 gateway processes (")
    fronts = resolve_fronts([f"{LOCAL}:5555"], [f"{LOCAL}:5556"], 3, 0, 8000, gpu_host)
    assert len(fronts.endpoints) == 3 and fronts.gateway_processes == gpu_host.gateway_processes
    assert fronts.why == f"brokers as set; gateway processes auto for {gpu_host.why}"
    assert fronts.frontends == f"{LOCAL}:5555,{LOCAL}:5557,{LOCAL}:5559"
    assert fronts.backends == f"{LOCAL}:5556,{LOCAL}:5558,{LOCAL}:5560"
    auto = resolve_fronts([f"{LOCAL}:5555"], [f"{LOCAL}:5556"], 0, 0, 8000, gpu_host)
    assert len(auto.endpoints) == GPU_HOST_BROKERS and auto.why.startswith("brokers and gateway processes auto")
    cpu = resolve_fronts([f"{LOCAL}:5555"], [f"{LOCAL}:5556"], 0, 0, 8000, front_layout(2, 0))
    assert cpu.describe() == (f"1 broker and the gateway's default processes (one per core, at most "
                              f"{MAX_AUTO_PROCESSES}) (brokers and gateway processes auto for a host without GPUs, "
                              f"whose workers take the cores)")
    assert GATEWAY_MAX_AUTO_PROCESSES == MAX_AUTO_PROCESSES


def test_auto_keeps_one_broker_where_the_endpoint_has_no_port_to_derive_from() -> None:
    config = load_config(["--frontend", "ipc:///tmp/zbatch-f", "--backend", "ipc:///tmp/zbatch-b"], {})
    fronts = stack.place(config, ONE_GPU, cores=CORES_FOR_MORE_BROKERS).fronts
    assert fronts.endpoints == (("ipc:///tmp/zbatch-f", "ipc:///tmp/zbatch-b"),)
    assert "one broker, as ipc:///tmp/zbatch-f is not TCP" in fronts.why


def test_auto_brokers_whose_ports_collide_are_refused_before_anything_starts() -> None:
    config = load_config(["--frontend", f"{LOCAL}:5555", "--backend", f"{LOCAL}:5557"], {})
    assert len(stack.place(config, NO_GPUS, cores=CORES_FOR_MORE_BROKERS).fronts.endpoints) == 1
    with pytest.raises(ValueError, match="port 5557 would be bound twice"):
        stack.place(config, ONE_GPU, cores=CORES_FOR_MORE_BROKERS)


@pytest.mark.parametrize(("argv", "message"), [
    (["--brokers", "3", "--frontend", f"{LOCAL}:5555,{LOCAL}:5557", "--backend", f"{LOCAL}:5556,{LOCAL}:5558"],
     "brokers is 3 but frontend lists 2 endpoints: set brokers to 0 or 2"),
    (["--brokers", "2", "--backend", f"{LOCAL}:5557"], "port 5557 would be bound twice"),
    (["--brokers", "2", "--port", "5557"], "(the gateway's port is 5557)"),
    (["--brokers", "2", "--frontend", "ipc:///tmp/f", "--backend", "ipc:///tmp/b"], "list 2 endpoints in each"),
    (["--brokers", "-1"], "--brokers='-1': must be at least 0"),
])
def test_brokers_that_disagree_with_the_endpoints_stop_zbatch_serve_with_one_line(
        argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stop:
        load_config(argv, {})
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err


def test_the_stack_starts_every_broker_and_gives_the_gateway_and_the_workers_all_of_them() -> None:
    config = load_config(["--brokers", "2", "--workers", "1"], {})
    built = stack.build(config, NO_GPUS)
    python = [sys.executable, "-m"]
    assert [unit.name for unit in built.units] == ["broker-0", "broker-1", "worker-0", "gateway"]
    assert built.programs["broker-1"].argv == [*python, "broker", "--frontend", f"{LOCAL}:5557",
                                               "--backend", f"{LOCAL}:5558"]
    worker = built.programs["worker-0"].argv
    assert worker[worker.index("--backend") + 1] == f"{LOCAL}:5556,{LOCAL}:5558"
    gateway = built.programs["gateway"].argv
    assert gateway[gateway.index("--frontend") + 1] == f"{LOCAL}:5555,{LOCAL}:5557"
    assert gateway[gateway.index("--processes") + 1] == "0", "the gateway's own default without GPUs"
    placement = stack.place(load_config([], {}), ONE_GPU, cores=CORES_FOR_MORE_BROKERS)
    on_gpus = stack.build(load_config([], {}), ONE_GPU, placement=placement).programs
    assert [name for name in on_gpus if name.startswith("broker")] == [f"broker-{i}" for i in range(GPU_HOST_BROKERS)]
    gateway = on_gpus["gateway"].argv
    assert gateway[gateway.index("--processes") + 1] == str(placement.fronts.gateway_processes)


def test_on_gpus_the_gateway_processes_tokenize_unless_the_gateways_own_setting_says(tmp_path: Path) -> None:
    """GPU workers' tokenizing sets the pace, so the layout moves it to the gateway processes; an operator's
    ``edge_tokenize`` (variable or table) stands, and a host without GPUs keeps the gateway's default."""
    def gateway_argv(environ: dict[str, str], config_file: str | None = None) -> list[str]:
        placement = stack.place(load_config([], {}), environ, cores=CORES_FOR_MORE_BROKERS)
        built = stack.build(load_config([], {}), environ, config_file, placement=placement)
        return list(built.programs["gateway"].argv)

    on_gpus = gateway_argv(ONE_GPU)
    assert on_gpus[on_gpus.index("--edge-tokenize") + 1] == "true"
    assert gateway_config.load_config(on_gpus[on_gpus.index("--host"):], {}).edge_tokenize
    assert "--edge-tokenize" not in gateway_argv(NO_GPUS)
    for value in ("false", "true"):
        assert "--edge-tokenize" not in gateway_argv(ONE_GPU | {"ZBATCH_EDGE_TOKENIZE": value})
        table = tmp_path / f"zbatch-{value}.toml"
        table.write_text(f"[gateway]\nedge_tokenize = {value}\n")
        for argv in (gateway_argv(ONE_GPU, str(table)), gateway_argv(ONE_GPU | {"ZBATCH_CONFIG": str(table)})):
            assert "--edge-tokenize" not in argv
            read = gateway_config.load_config(argv[argv.index("--host"):], {"ZBATCH_CONFIG": str(table)})
            assert read.edge_tokenize is (value == "true")


def test_the_log_says_where_texts_are_tokenized_and_who_chose() -> None:
    def said(environ: dict[str, str]) -> str:
        placement = stack.place(load_config([], {}), environ, cores=CORES_FOR_MORE_BROKERS)
        return stack.build(load_config([], {}), environ, placement=placement).tokenizing

    assert said(ONE_GPU) == "texts tokenized in the gateway processes, for workers on GPUs"
    assert said(NO_GPUS) == "texts tokenized in the workers"
    assert "setting says" in said(ONE_GPU | {"ZBATCH_EDGE_TOKENIZE": "false"})


def test_zbatch_serve_help_says_how_the_fronts_are_chosen() -> None:
    shown = subprocess.run([sys.executable, "-m", "zbatch", "serve", "--help"], capture_output=True, text=True,
                           cwd=ROOT, env=daemon_env(), timeout=60, check=True).stdout
    assert "--brokers" in shown and "ZBATCH_BROKERS" in shown and "ports + 2i" in shown
    assert f"one for every {CORES_PER_GATEWAY_PROCESS} of the host's cores" in " ".join(shown.split())
