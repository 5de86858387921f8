"""The systemd units, their installer and the example config file in scripts/systemd."""

from __future__ import annotations

import inspect
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from broker.config import BrokerConfig
from broker.config import load_config as load_broker_config
from gateway.config import GatewayConfig
from gateway.config import load_config as load_gateway_config
from gateway.server import RESERVED_FILES
from worker.config import WorkerConfig
from worker.config import load_config as load_worker_config
from zbatch.client import AsyncClient
from zbatch.hub import CONFIG_EXIT_CODE
from zbatch.tools.status import load_config as load_status_config

ROOT = Path(__file__).resolve().parent.parent
UNITS = ROOT / "scripts" / "systemd"
SERVICES = {"broker": "zbatch-broker.service", "gateway": "zbatch-gateway.service",
            "worker": "zbatch-worker@.service"}
HARDENING = {
    "ProtectSystem": "strict", "ProtectHome": "yes", "NoNewPrivileges": "yes", "PrivateTmp": "yes",
    "ProtectKernelTunables": "yes", "ProtectKernelModules": "yes", "ProtectControlGroups": "yes",
    "RestrictSUIDSGID": "yes", "LockPersonality": "yes", "RestrictRealtime": "yes",
    "SystemCallArchitectures": "native",
}
HIDES_GPUS = ("PrivateDevices", "DevicePolicy", "DeviceAllow", "ProtectClock", "MemoryDenyWriteExecute",
              "DynamicUser", "PrivateUsers")


def directives(path: Path) -> list[tuple[str, str, str]]:
    """(section, key, value) for every setting, in order; comments skipped."""
    found, section = [], ""
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        key, _, value = line.partition("=")
        found.append((section, key.strip(), value.strip()))
    return found


def values(path: Path, key: str) -> list[str]:
    return [value for _, name, value in directives(path) if name == key]


def seconds(value: str) -> float:
    assert value.isdigit(), f"expected plain seconds, got {value!r}"
    return float(value)


def test_every_unit_passes_systemd_analyze_verify(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    assert analyze, "systemd-analyze is missing: apt-get install systemd (scripts/test does so as root)"
    # verify checks that ExecStart= can run: point it at stand-ins for the venv's scripts.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for daemon in SERVICES:
        stub = bin_dir / f"zbatch-{daemon}"
        stub.write_text("#!/bin/sh\n")
        stub.chmod(0o755)
    units = []
    for source in [*sorted(UNITS.glob("zbatch*.service")), UNITS / "zbatch.target"]:
        copy = tmp_path / source.name
        copy.write_text(source.read_text().replace("/opt/zbatch/venv/bin/", f"{bin_dir}/"))
        units.append(str(copy))
    assert len(units) == 4
    options = ["--man=no"]
    if "--recursive-errors" in subprocess.run([analyze, "--help"], capture_output=True, text=True,
                                             check=False).stdout:
        options.append("--recursive-errors=no")  # judge our units, not the host's
    result = subprocess.run([analyze, "verify", *options, *units], capture_output=True, text=True,
                            cwd=tmp_path, timeout=60, check=False)
    complaints = [line for line in (result.stdout + result.stderr).splitlines() if "zbatch" in line]
    assert result.returncode == 0 and not complaints, result.stdout + result.stderr


@pytest.mark.parametrize("daemon", SERVICES)
def test_services_are_set_up_for_production(daemon: str) -> None:
    path = UNITS / SERVICES[daemon]
    settings = {key: value for _, key, value in directives(path)}
    for key, value in ({"Type": "notify", "NotifyAccess": "main", "WatchdogSec": "30",
                       "Restart": "on-failure", "RestartSec": "2", "User": "zbatch", "Group": "zbatch",
                       "PartOf": "zbatch.target", "WantedBy": "zbatch.target", "LimitNOFILE": "65536"}
                      | HARDENING).items():
        assert settings.get(key) == value, f"{path.name}: {key}={settings.get(key)}, want {value}"
    # What zbatch serve does not restart either (zbatch/supervisor/policy.py): bad settings, a model not to be had.
    prevented = f"2 {CONFIG_EXIT_CODE}" if daemon == "worker" else "2"
    assert settings.get("RestartPreventExitStatus") == prevented, path.name
    assert values(path, "ExecStart") == [
        f"/opt/zbatch/venv/bin/zbatch-{daemon} --config /etc/zbatch/zbatch.toml"
        + (" --device cuda:0 --name %H-gpu%i" if daemon == "worker" else "")
    ]
    env_files = values(path, "EnvironmentFile")
    assert env_files[0] == "-/etc/zbatch/zbatch.env" and env_files[-1] == "-/etc/zbatch/%N.env"
    if daemon != "gateway":  # the gateway serves /metrics on its HTTP port
        ports = [v for v in values(path, "Environment") if v.startswith("ZBATCH_METRICS_PORT=")]
        assert ports, "metrics are on in the units (the daemons' default is off)"


def test_the_gateway_connection_cap_fits_in_the_open_file_limit() -> None:
    limit = int(values(UNITS / SERVICES["gateway"], "LimitNOFILE")[0])
    assert GatewayConfig().max_open_connections + RESERVED_FILES <= limit


def test_stop_timeouts_outlast_the_drains() -> None:
    drain_s = max(BrokerConfig().drain_timeout_ms, WorkerConfig().drain_timeout_ms) / 1000
    for daemon in ("broker", "worker"):
        assert seconds(values(UNITS / SERVICES[daemon], "TimeoutStopSec")[0]) >= drain_s + 10
    grace_ms = inspect.signature(AsyncClient).parameters["reply_grace_ms"].default
    gateway_drain_s = (GatewayConfig().timeout_ms + grace_ms) / 1000
    assert seconds(values(UNITS / SERVICES["gateway"], "TimeoutStopSec")[0]) >= gateway_drain_s + 10


def test_open_files_outnumber_the_connections() -> None:
    """systemd's default soft limit (1024) is below a gateway's max_connections plus its idle keep-alives."""
    for daemon in SERVICES:
        limit = values(UNITS / SERVICES[daemon], "LimitNOFILE")
        assert limit and int(limit[0]) >= 4 * GatewayConfig().max_connections, f"{daemon}: LimitNOFILE={limit}"

def test_worker_sees_exactly_its_gpu_and_explains_what_it_leaves_out() -> None:
    path = UNITS / SERVICES["worker"]
    keys = {key for _, key, _ in directives(path)}
    assert not keys & set(HIDES_GPUS), "these hide /dev/nvidia* or break CUDA"
    assert "CUDA_VISIBLE_DEVICES=%i" in values(path, "Environment")
    comments = "\n".join(line for line in path.read_text().splitlines() if line.startswith("#"))
    for option in HIDES_GPUS:
        assert option in comments, f"say why {option} is left out"


def test_target_groups_the_units() -> None:
    target = UNITS / "zbatch.target"
    assert values(target, "WantedBy") == ["multi-user.target"]
    for name in SERVICES.values():
        assert values(UNITS / name, "Also") == ["zbatch.target"]


def test_install_into_a_prefix_is_idempotent_and_keeps_the_config(tmp_path: Path) -> None:
    def install() -> None:
        subprocess.run([str(ROOT / "scripts" / "install-systemd"), "--prefix", str(tmp_path)], check=True,
                       capture_output=True, timeout=60)

    install()
    installed = tmp_path / "etc" / "systemd" / "system"
    expected = sorted(path.name for path in UNITS.iterdir() if path.suffix in (".service", ".target"))
    assert sorted(path.name for path in installed.iterdir()) == expected
    for name in expected:
        assert (installed / name).read_text() == (UNITS / name).read_text()
    config = tmp_path / "etc" / "zbatch" / "zbatch.toml"
    assert config.read_text() == (UNITS / "zbatch.toml").read_text()
    config.write_text("[broker]\nmax_backlog = 5\n")
    install()
    assert config.read_text() == "[broker]\nmax_backlog = 5\n"


def test_example_config_is_valid_with_every_line_uncommented(tmp_path: Path) -> None:
    example = (UNITS / "zbatch.toml").read_text()
    assert re.findall(r"^\[(\w+)\]", example, re.MULTILINE) == ["broker", "worker", "gateway", "status"]
    uncommented = tmp_path / "zbatch.toml"
    uncommented.write_text(re.sub(r"^# (\w+ = )", r"\1", example, flags=re.MULTILINE))
    loaders = (load_broker_config, load_worker_config, load_gateway_config, load_status_config)
    for load in loaders:
        load(["--config", str(UNITS / "zbatch.toml")], {})
        # The example's endpoints are on the network and its CURVE lines empty: refused unless insecure.
        with pytest.raises(SystemExit):
            load(["--config", str(uncommented)], {})
        load(["--config", str(uncommented)], {"ZBATCH_INSECURE": "true"})
    insecure = {"ZBATCH_INSECURE": "true"}
    assert load_broker_config(["--config", str(uncommented)], insecure).frontend == "tcp://0.0.0.0:5555"
    assert load_worker_config(["--config", str(uncommented)], insecure).dtype == "float16"
