"""The models one worker serves, as its settings name them: the main model's flags, then ``--extra-models``.

Read once, at start (:attr:`worker.config.WorkerConfig.models`): each model's
settings are parsed, checked and typed here, so the runners and the batching
policy see numbers and flags, never the text they were written in.  An extra
model takes the main model's settings for every key it does not give, but
its name, revision and default prompt name, which are its own.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Protocol

from worker.runners.runtime import check_settings
from worker.runners.spec import ModelSpec, default_model_path
from zbatch.hub import public_name
from zbatch.protocol.messages import MAX_BATCH_TOKENS
from zbatch.runtime.settings import parse_entries

GRAPH_SETTINGS = ("auto", "off")  # --cuda-graphs: the runner captures graphs (ModelSpec.cuda_graphs) or not
UNPADDED_SETTINGS = ("off", "auto")  # --unpadded-attention: ModelSpec.unpadded_attention
SPEC_KEYS = {"name", "model", "revision", "path", "task", "device", "dtype", "runtime", "quantize", "max_batch_size",
             "max_batch_tokens", "max_batch_delay_ms", "cuda_graphs", "unpadded_attention", "default_prompt_name"}


class ModelFlags(Protocol):
    """The main model's flags as the worker's settings hold them (:class:`worker.config.WorkerConfig`, which
    imports this module: the arrow runs one way)."""

    @property
    def model(self) -> str: ...
    @property
    def model_path(self) -> str: ...
    @property
    def model_name(self) -> str: ...
    @property
    def revision(self) -> str: ...
    @property
    def trust_remote_code(self) -> bool: ...
    @property
    def task(self) -> str: ...
    @property
    def device(self) -> str: ...
    @property
    def dtype(self) -> str: ...
    @property
    def runtime(self) -> str: ...
    @property
    def quantize(self) -> str: ...
    @property
    def onnx_cache(self) -> str: ...
    @property
    def max_batch_size(self) -> int: ...
    @property
    def max_batch_tokens(self) -> int: ...
    @property
    def max_batch_delay_ms(self) -> float: ...
    @property
    def cuda_graphs(self) -> str: ...
    @property
    def unpadded_attention(self) -> str: ...
    @property
    def default_prompt_name(self) -> str: ...
    @property
    def extra_models(self) -> str: ...


@dataclass(frozen=True, slots=True)
class ServedModel:
    """One model to serve: what loads it (its spec) and how long its batch may wait for more items."""

    spec: ModelSpec
    max_batch_delay_s: float


def served_models(config: ModelFlags) -> tuple[ServedModel, ...]:
    """The main model from the flags, then any ``--extra-models``; names must be unique (ValueError says why not).

    A spec's ``path`` is the model as set, a Hub id or a folder (``model_path`` and ``path=``: a folder),
    until :func:`worker.sources.fetch_models` makes it the local folder.
    """
    extras = extra_entries(config.extra_models)
    models = [main_model(config)]
    for setting, given in extras:
        model = extra_model(setting, given, models[0])
        if any(each.spec.name == model.spec.name for each in models):
            raise ValueError(f"model name {model.spec.name!r} is served twice; give each model its own name")
        models.append(model)
    return tuple(models)


def main_model(config: ModelFlags) -> ServedModel:
    """The model of ``--model`` and the flags beside it, whose values the settings have checked already."""
    setting = config.model or (os.path.abspath(config.model_path) if config.model_path else "")
    spec = ModelSpec(config.model_name or public_name(setting), setting or default_model_path(), task=config.task,
                     device=config.device, dtype=config.dtype, max_batch_size=config.max_batch_size,
                     max_batch_tokens=config.max_batch_tokens,
                     cuda_graphs=config.cuda_graphs != "off", unpadded_attention=config.unpadded_attention == "auto",
                     runtime=config.runtime, quantize=config.quantize,
                     onnx_cache=config.onnx_cache, default_prompt_name=config.default_prompt_name,
                     revision=config.revision, trust_remote_code=config.trust_remote_code)
    check_settings(spec)
    return ServedModel(spec, config.max_batch_delay_ms / 1000)


def extra_entries(text: str) -> list[tuple[str, dict[str, str]]]:
    """``name=a,path=/m/a,task=fill-mask;model=org/b,revision=v2`` -> each model as set (``model=``, a Hub id
    or a folder, as ``--model``; ``path=``, a folder) and its other keys."""
    entries = []
    for given in parse_entries(text, SPEC_KEYS, "extra model"):
        if ("path" in given) == ("model" in given):
            raise ValueError(f"extra model {given}: needs a model= (a Hub id or a folder) or a path= (a folder), "
                             f"one of the two")
        setting = given.pop("model", "") or os.path.abspath(given.pop("path"))
        entries.append((setting, given))
    return entries


def extra_model(setting: str, given: dict[str, str], main: ServedModel) -> ServedModel:
    """An extra model's keys, typed and checked; those it does not give are the main model's."""
    name = given.get("name", public_name(setting))
    try:
        batch_size = int(given["max_batch_size"]) if "max_batch_size" in given else main.spec.max_batch_size
        budget = int(given["max_batch_tokens"]) if "max_batch_tokens" in given else main.spec.max_batch_tokens
        delay_ms = float(given["max_batch_delay_ms"]) if "max_batch_delay_ms" in given else None
    except ValueError:
        raise ValueError(f"model {name!r}: batch settings must be numbers") from None
    if batch_size < 0 or (delay_ms is not None and delay_ms < 0) or budget_refusal(budget):
        raise ValueError(f"model {name!r}: max_batch_size must be >= 0 (0: the device's default), "
                         f"max_batch_tokens 0 (no budget) to {MAX_BATCH_TOKENS} and max_batch_delay_ms >= 0")
    inherited = main.spec
    spec = dataclasses.replace(
        inherited, name=name, path=setting, revision=given.get("revision", ""),
        default_prompt_name=given.get("default_prompt_name", ""), max_batch_size=batch_size, max_batch_tokens=budget,
        cuda_graphs=_switch(name, given, "cuda_graphs", GRAPH_SETTINGS, inherited.cuda_graphs),
        unpadded_attention=_switch(name, given, "unpadded_attention", UNPADDED_SETTINGS,
                                   inherited.unpadded_attention),
        task=given.get("task", inherited.task), device=given.get("device", inherited.device),
        dtype=given.get("dtype", inherited.dtype), runtime=given.get("runtime", inherited.runtime),
        quantize=given.get("quantize", inherited.quantize))
    check_settings(spec)
    return ServedModel(spec, main.max_batch_delay_s if delay_ms is None else delay_ms / 1000)


def _switch(name: str, given: dict[str, str], key: str, choices: tuple[str, ...], inherited: bool) -> bool:
    """An extra model's on-or-off key (on unless "off"), or the main model's value where it is unset."""
    value = given.get(key)
    if value is None:
        return inherited
    if value not in choices:
        raise ValueError(f"model {name!r}: {key} must be one of {', '.join(choices)}")
    return value != "off"


def budget_refusal(budget: int) -> str | None:
    """Why ``budget`` cannot be a token budget (READY carries at most :data:`MAX_BATCH_TOKENS`), or None."""
    if not 0 <= budget <= MAX_BATCH_TOKENS:
        return f"must be 0 (no budget) to {MAX_BATCH_TOKENS}"
    return None
