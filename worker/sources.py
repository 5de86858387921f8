"""Each model of a worker made a local folder before anything loads: from the Hub's cache or a folder, checked.

:func:`fetch_models` runs at start, before torch is imported: it gets every
model's folder (:func:`zbatch.hub.fetch`: a Hub id from, or into, the Hugging
Face cache; a folder as it is), then checks that the folder holds a model this
worker may run: a ``config.json`` (every transformers model has one), and no
code of the model's own unless ``--trust-remote-code`` allows it.  What fails
raises :class:`~zbatch.hub.ModelUnavailable`, and the worker exits with
:data:`~zbatch.hub.CONFIG_EXIT_CODE` and one line that says which model and
why: a restart would meet the same refusal.

A model needs its own code where its ``config.json`` maps the Auto classes to
modules of the repository (``auto_map``) for a ``model_type`` transformers
does not know: with ``trust_remote_code`` off, transformers would refuse it
deep inside the load (or, on a terminal, ask).  A known ``model_type`` loads
transformers' own classes whatever ``auto_map`` says, as transformers does.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from worker.runners.spec import CUSTOM_TASK_PREFIX, ModelSpec
from worker.slots import ModelSlot
from zbatch.hub import ModelUnavailable, fetch

log = logging.getLogger("zbatch.worker")


def fetch_models(slots: Mapping[str, ModelSlot]) -> None:
    """Point every slot's spec at its model's local folder, checked; raises ModelUnavailable."""
    for slot in slots.values():
        spec = slot.spec
        fetched = fetch(spec.path, spec.revision)  # its message names the model as set
        check_model_folder(fetched.path, spec)
        slot.spec = dataclasses.replace(spec, path=fetched.path)
        if fetched.commit:
            log.info("model %s: %s at commit %s (revision %s), from the Hugging Face cache: %s", spec.name,
                     spec.path, fetched.commit, spec.revision or "main", fetched.path)


def check_model_folder(path: str, spec: ModelSpec) -> None:
    """Refuse a folder without a transformers model in it, or one whose own code would have to run untrusted."""
    if spec.task.startswith(CUSTOM_TASK_PREFIX):
        return  # a runner of your own reads what it wants from the folder
    config_file = Path(path) / "config.json"
    if not config_file.is_file():
        raise ModelUnavailable(f"model {spec.name!r}: {path} holds no transformers model (it has no config.json); "
                               f"name the folder of a model, or its Hub id")
    try:
        config: Any = json.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelUnavailable(f"model {spec.name!r}: cannot read {config_file}: {exc}") from None
    if not isinstance(config, dict):
        raise ModelUnavailable(f"model {spec.name!r}: {config_file} is not a JSON object")
    needs = own_code(config)
    if needs and not spec.trust_remote_code:
        raise ModelUnavailable(f"model {spec.name!r} needs Python code of its own ({needs}), which zbatch runs only "
                               f"when told to: read that code, then set --trust-remote-code "
                               f"(ZBATCH_TRUST_REMOTE_CODE=true) if you trust it")


def own_code(config: Mapping[str, Any]) -> str:
    """What code of its own a model's ``config.json`` needs (its ``auto_map``), or "" if transformers has its own."""
    auto_map = config.get("auto_map")
    if not auto_map:
        return ""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    model_type = config.get("model_type")
    if isinstance(model_type, str) and model_type in CONFIG_MAPPING_NAMES:
        return ""
    modules = sorted({str(target) for target in (auto_map.values() if isinstance(auto_map, dict) else [auto_map])})
    kind = f"model_type {model_type!r}, which transformers does not know" if model_type else "no model_type"
    return f"{kind}; auto_map: {', '.join(modules)}"
