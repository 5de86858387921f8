"""The README's configuration table lists every setting of every daemon, and of ``zbatch serve``."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from broker.config import BrokerConfig
from gateway.config import GatewayConfig
from worker.config import WorkerConfig
from zbatch.runtime.settings import env_name, flag_name
from zbatch.supervisor.config import ServeConfig

README = (Path(__file__).resolve().parent.parent / "README.md").read_text()


@pytest.mark.parametrize(("daemon", "config"), [("broker", BrokerConfig), ("worker", WorkerConfig),
                                                ("gateway", GatewayConfig), ("serve", ServeConfig)])
def test_every_setting_is_documented(daemon: str, config: type) -> None:
    for field in dataclasses.fields(config):
        row = f"| {daemon} | `{env_name(field.name)}` | `{flag_name(field.name)}` |"
        assert row in README, f"README's configuration table lacks {row}"
