"""Config loading: flag > environment > config file > default, and one clear line for a bad value."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from broker.config import load_config
from gateway.config import load_config as load_gateway_config
from worker.config import load_config as load_worker_config
from zbatch.runtime.settings import check_exposure, is_loopback_endpoint, split_endpoints
from zbatch.tools.status import load_config as load_status_config


def test_flag_beats_environment_beats_default() -> None:
    assert load_config([], {}).max_backlog == 262_144
    assert load_config([], {"ZBATCH_MAX_BACKLOG": "10"}).max_backlog == 10
    assert load_config(["--max-backlog", "20"], {"ZBATCH_MAX_BACKLOG": "10"}).max_backlog == 20


def test_lists_are_comma_separated() -> None:
    assert load_config(["--models", "a, b,,c"], {}).models == ("a", "b", "c")


@pytest.mark.parametrize(
    ("argv", "environ", "complaint"),
    [
        (["--max-backlog", "lots"], {}, "--max-backlog='lots': must be a whole number"),
        ([], {"ZBATCH_HEARTBEAT_MS": "1"}, "ZBATCH_HEARTBEAT_MS='1': must be at least 10"),
        (["--frontend", "localhost:5555"], {}, "must be a ZeroMQ endpoint"),
        (["--log-level", "loud"], {}, "must be one of debug, info, warning, error"),
    ],
)
def test_bad_values_fail_with_one_line_naming_the_setting(
    argv: list[str], environ: dict[str, str], complaint: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        load_config(argv, environ)
    assert exit_info.value.code == 2
    error = capsys.readouterr().err
    assert complaint in error and error.count("\n") == 1


def _config_file(tmp_path: Path, text: str) -> str:
    path = tmp_path / "zbatch.toml"
    path.write_text(text)
    return str(path)


def test_config_file_sits_between_environment_and_default(tmp_path: Path) -> None:
    path = _config_file(tmp_path, '[broker]\nmax_backlog = 30\nheartbeat_ms = 500\nmodels = ["a", "b"]\n'
                                  '[worker]\nmax_batch_size = 8\n')
    assert load_config([], {}).max_backlog == 262_144
    from_file = load_config(["--config", path], {})
    assert (from_file.max_backlog, from_file.heartbeat_ms, from_file.models) == (30, 500, ("a", "b"))
    assert load_config([], {"ZBATCH_CONFIG": path}).max_backlog == 30
    environ = {"ZBATCH_CONFIG": path, "ZBATCH_MAX_BACKLOG": "10"}
    assert load_config([], environ).max_backlog == 10
    assert load_config([], environ).heartbeat_ms == 500
    assert load_config(["--max-backlog", "20"], environ).max_backlog == 20


def test_config_flag_beats_config_variable(tmp_path: Path) -> None:
    first = _config_file(tmp_path, "[broker]\nmax_backlog = 1\n")
    second = tmp_path / "other.toml"
    second.write_text("[broker]\nmax_backlog = 2\n")
    assert load_config(["--config", str(second)], {"ZBATCH_CONFIG": first}).max_backlog == 2


def test_config_file_values_may_be_native_or_text(tmp_path: Path) -> None:
    path = _config_file(tmp_path, '[broker]\nmax_backlog = "12"\nmodels = "x, y"\n')
    assert load_config(["--config", path], {}).max_backlog == 12
    assert load_config(["--config", path], {}).models == ("x", "y")
    worker = load_worker_config(["--config", _config_file(tmp_path, "[worker]\nmax_batch_delay_ms = 2\n")], {})
    assert worker.max_batch_delay_ms == 2.0


@pytest.mark.parametrize(
    ("text", "complaint"),
    [
        ("[broker]\nmax_backlg = 3\n", "[broker] unknown setting 'max_backlg'"),
        ("[broker]\nmax-backlog = 3\n", "unknown setting 'max-backlog' (did you mean 'max_backlog'?)"),
        ("[brokers]\n", "unknown section 'brokers'"),
        ('frontend = "tcp://x:1"\n', "unknown section 'frontend'"),
        ("broker = 3\n", "'broker' must be a [broker] table"),
        ("[broker]\nmax_backlog = 0\n", "[broker] max_backlog=0: must be at least 1"),
        ("[broker]\nmax_backlog = true\n", "[broker] max_backlog=True: must be a whole number"),
        ("[broker]\nmax_backlog = 2.5\n", "[broker] max_backlog=2.5: must be a whole number"),
        ("[broker]\nmodels = [1, 2]\n", "[broker] models=[1, 2]: must be a list of strings"),
        ("[broker]\nlog_level = 3\n", "[broker] log_level=3: must be a string"),
        ("[broker]\nlog_level = 'loud'\n", "[broker] log_level='loud': must be one of debug"),
        ('[broker]\nfrontend = "localhost"\n', "[broker] frontend='localhost': must be a ZeroMQ endpoint"),
        ("[broker\n", "not valid TOML"),
    ],
)
def test_bad_config_files_fail_with_one_line_naming_file_and_key(
    tmp_path: Path, text: str, complaint: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _config_file(tmp_path, text)
    with pytest.raises(SystemExit) as exit_info:
        load_config(["--config", path], {})
    assert exit_info.value.code == 2
    error = capsys.readouterr().err
    assert path in error and complaint in error and error.count("\n") == 1, error


def test_other_daemons_sections_are_not_checked_by_this_one(tmp_path: Path) -> None:
    path = _config_file(tmp_path, "[worker]\nno_such_setting = 1\n[gateway]\nport = 1\n")
    assert load_config(["--config", path], {}).max_backlog == 262_144


@pytest.mark.parametrize(("argv", "environ", "source"), [
    (["--config", "/nonexistent/zbatch.toml"], {}, "--config='/nonexistent/zbatch.toml'"),
    ([], {"ZBATCH_CONFIG": "/nonexistent/zbatch.toml"}, "ZBATCH_CONFIG='/nonexistent/zbatch.toml'"),
])
def test_missing_config_file_is_an_error(
    argv: list[str], environ: dict[str, str], source: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        load_config(argv, environ)
    assert exit_info.value.code == 2
    assert f"{source}: no such file" in capsys.readouterr().err


def test_every_daemon_reads_its_own_section(tmp_path: Path) -> None:
    path = _config_file(tmp_path, "[broker]\nmax_retries = 4\n[worker]\nmax_batch_size = 7\n"
                                  "[gateway]\nport = 9123\n")
    assert load_config(["--config", path], {}).max_retries == 4
    assert load_worker_config(["--config", path], {}).max_batch_size == 7
    assert load_gateway_config(["--config", path], {}).port == 9123


# ------------------------------------------------------------------ endpoints off loopback need CURVE or --insecure

@pytest.mark.parametrize("endpoint", [
    "tcp://127.0.0.1:5555", "tcp://127.0.0.2:5555", "tcp://127.255.255.254:1", "tcp://localhost:5555",
    "tcp://LOCALHOST:5555", "tcp://[::1]:5555", "tcp://::1:5555", "tcp://[::ffff:127.0.0.1]:5555",
    "ipc:///run/zbatch/broker", "inproc://broker", "tcp://127.0.0.1:0;127.0.0.1:5555", "ws://127.0.0.1:80/zbatch",
])
def test_loopback_endpoints(endpoint: str) -> None:
    assert is_loopback_endpoint(endpoint)


@pytest.mark.parametrize("endpoint", [
    "tcp://0.0.0.0:5555", "tcp://*:5555", "tcp://[::]:5555", "tcp://10.0.0.1:5555", "tcp://128.0.0.1:5555",
    "tcp://broker-host:5555", "tcp://localhost.example.com:5555", "tcp://eth0:5555", "tcp://lo:5555",
    "tcp://127.0.0.1:0;10.0.0.1:5555", "tcp://10.0.0.1:0;127.0.0.1:5555", "ws://10.0.0.1:80/zbatch",
    "wss://127.0.0.1.example.com:443", "tcp://[::ffff:10.0.0.1]:5555",
])
def test_network_endpoints(endpoint: str) -> None:
    assert not is_loopback_endpoint(endpoint)


def test_every_endpoint_of_a_list_is_checked() -> None:
    assert split_endpoints(" tcp://127.0.0.1:1, ,tcp://10.0.0.1:2") == ["tcp://127.0.0.1:1", "tcp://10.0.0.1:2"]
    assert check_exposure({"backend": "tcp://127.0.0.1:1,ipc:///x"}, curve=False, insecure=False) is None
    problem = check_exposure({"backend": "tcp://127.0.0.1:1,tcp://10.0.0.1:2"}, curve=False, insecure=False)
    assert problem and "backend tcp://10.0.0.1:2 is not a loopback address" in problem
    assert check_exposure({"backend": ("tcp://127.0.0.1:1", "tcp://10.0.0.1:2")}, curve=False, insecure=False)
    assert check_exposure({"backend": "tcp://10.0.0.1:2"}, curve=True, insecure=False) is None
    assert check_exposure({"backend": "tcp://10.0.0.1:2"}, curve=False, insecure=True) is None


LOADERS: dict[str, Callable[[list[str], dict[str, str]], Any]] = {
    "broker": load_config, "worker": load_worker_config, "gateway": load_gateway_config, "status": load_status_config,
}


@pytest.mark.parametrize(("daemon", "setting"), [("broker", "frontend"), ("broker", "backend"),
                                                 ("worker", "backend"), ("gateway", "frontend"),
                                                 ("status", "frontend")])
def test_a_network_endpoint_without_curve_needs_insecure(
    daemon: str, setting: str, capsys: pytest.CaptureFixture[str]
) -> None:
    load = LOADERS[daemon]
    flag = f"--{setting}"
    with pytest.raises(SystemExit) as exit_info:
        load([flag, "tcp://0.0.0.0:5555"], {})
    assert exit_info.value.code == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1, error
    for words in (f"{setting} tcp://0.0.0.0:5555 is not a loopback address and CURVE is off", "configure CURVE",
                  "--insecure (ZBATCH_INSECURE=true)"):
        assert words in error, error
    assert getattr(load([flag, "tcp://0.0.0.0:5555", "--insecure"], {}), setting) == "tcp://0.0.0.0:5555"
    assert load([flag, "tcp://0.0.0.0:5555"], {"ZBATCH_INSECURE": "1"}).insecure
    assert not load([flag, "tcp://127.0.0.1:5555"], {}).insecure
def test_brokers_are_listed_with_commas_and_each_endpoint_is_checked(capsys: pytest.CaptureFixture[str]) -> None:
    both = "tcp://10.0.0.1:5555, tcp://10.0.0.2:5555"
    assert load_gateway_config(["--frontend", both, "--insecure"], {}).frontend == both
    lists = {"ZBATCH_BACKEND": "tcp://a:1,tcp://b:1", "ZBATCH_INSECURE": "true"}  # a and b: network hosts
    assert load_worker_config([], lists).backend == "tcp://a:1,tcp://b:1"
    for bad, complaint in [("tcp://a:1,b:1", "'b:1' must be a ZeroMQ endpoint"), (" , ", "at least one"),
                           ("tcp://a:1,tcp://a:1", "names a broker twice")]:
        with pytest.raises(SystemExit):
            load_gateway_config(["--frontend", bad], {})
        error = capsys.readouterr().err
        assert complaint in error and error.count("\n") == 1, error
    with pytest.raises(SystemExit):
        load_config(["--frontend", "tcp://a:1,tcp://b:1"], {})  # a broker binds one endpoint
    assert "must be one ZeroMQ endpoint, not a list" in capsys.readouterr().err
