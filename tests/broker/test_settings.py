"""Config loading: flag > environment > default, and one clear line for a bad value."""

from __future__ import annotations

import pytest

from broker.config import load_config


def test_flag_beats_environment_beats_default() -> None:
    assert load_config([], {}).max_backlog == 256
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
