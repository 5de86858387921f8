"""A setting that several programs declare means the same thing to each (docs/configuration.md says so): one
environment file serves a whole host, so ``ZBATCH_X`` must not mean one thing to the broker and another to the
gateway, as ``ZBATCH_MODELS`` once did.

What the option tables can hold: a shared name has one type everywhere, one default unless :data:`OWN_DEFAULTS`
says why not, and one help text unless :data:`OWN_WORDS` says what the one meaning is that each program words
from its own side.  A new shared setting therefore needs the same declaration, or a line here.
"""

from __future__ import annotations

import dataclasses
import re
import typing
from pathlib import Path
from typing import Any

import pytest

from scripts.docs import programs
from zbatch.runtime.settings import env_name

ROOT = Path(__file__).resolve().parent.parent

# Where the programs' help texts differ: the one meaning they share.
OWN_WORDS = {
    "frontend": "the brokers' client endpoints: a broker binds its own, the others connect to the listed ones",
    "backend": "the brokers' worker endpoints: a broker binds its own, workers connect to the listed ones",
    "timeout_ms": "a request's deadline when it sets none (the gateway's also caps what a caller asks)",
    "heartbeat_ms": "the heartbeat interval on the links to and from the brokers",
    "heartbeat_liveness": "missed heartbeat intervals before the other end counts as gone",
    "drain_timeout_ms": "on SIGTERM, how long held work may take to finish",
    "max_inputs": "most inputs in one request (the gateway holds HTTP callers to it, the worker every caller)",
    "max_input_chars": "most characters in one input (as max_inputs)",
    "max_body_bytes": "largest request body (as max_inputs)",
    "curve_secret_key_file": "this program's own CURVE key pair",
    "workers": "worker processes on this host (zbatch serve starts them, and tells each how many there are)",
    "host": "the address the gateway listens on (zbatch serve passes it to its gateway)",
    "port": "the gateway's TCP port (zbatch serve passes it to its gateway)",
    "processes": "the gateway's processes (zbatch serve passes it to its gateway; for 0, its own choice on a "
                 "host with GPUs, the gateway's default without)",
    "model": "the model the workers serve (zbatch serve downloads it once and passes it to its workers)",
    "revision": "the Hub model's revision (as model)",
    "model_name": "the name the model is served as (as model; zbatch serve's gateway takes it as its default)",
    "trust_remote_code": "whether the workers may run the model's own code (as model)",
}
# Where the defaults differ, and why.
OWN_DEFAULTS = {"workers": "zbatch serve starts two workers; a worker started alone counts itself"}


def declarations() -> dict[str, list[tuple[str, Any, Any, str]]]:
    """Each setting name: (program, type, default, help) of every program that declares it."""
    found: dict[str, list[tuple[str, Any, Any, str]]] = {}
    for program, config in programs():
        hints = typing.get_type_hints(config)
        for field in dataclasses.fields(config):
            found.setdefault(field.name, []).append((program, hints[field.name], field.default,
                                                     str(field.metadata["help"])))
    return found


SHARED = {name: declared for name, declared in declarations().items() if len(declared) > 1}


@pytest.mark.parametrize("name", sorted(SHARED))
def test_a_shared_setting_has_one_type_one_default_and_one_help_text(name: str) -> None:
    declared = SHARED[name]
    assert len({kind for _, kind, _, _ in declared}) == 1, declared
    if name not in OWN_DEFAULTS:
        assert len({repr(default) for _, _, default, _ in declared}) == 1, declared
    if name not in OWN_WORDS:
        assert len({text for _, _, _, text in declared}) == 1, (
            f"{name}: programs word it differently; give them one help text, or say in OWN_WORDS what one "
            f"meaning they share: {declared}")


def test_models_is_one_setting_for_the_broker_and_the_gateway() -> None:
    assert {program for program, *_ in SHARED["models"]} == {"broker", "gateway"}
    assert "models" not in OWN_WORDS, "one help text, said once (zbatch.runtime.settings.MODELS_HELP)"


def test_the_exceptions_name_shared_settings_only() -> None:
    assert set(OWN_WORDS) <= set(SHARED) and set(OWN_DEFAULTS) <= set(SHARED)


def test_the_variables_the_configuration_page_calls_shared_are() -> None:
    page = (ROOT / "docs" / "configuration.md").read_text()
    paragraph = page[page.index("Variables shared by several daemons"):].split("\n\n", 1)[0]
    named = re.findall(r"`(ZBATCH_[A-Z_]+\*?)`", paragraph)
    assert "ZBATCH_MODELS" in named and "ZBATCH_MODEL" in named
    variables = {env_name(name) for name in SHARED}
    for variable in named:
        matches = [v for v in variables if v == variable or (variable.endswith("*") and v.startswith(variable[:-1]))]
        assert matches, f"configuration.md calls {variable} shared, but fewer than two programs declare it"
