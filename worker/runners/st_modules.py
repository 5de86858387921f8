"""A model's sentence-transformers modules, read from its folder: what turns its token vectors into one vector.

Theory of operation
-------------------
A sentence-transformers model lists its modules in ``modules.json``, in the
order they run: the Transformer (the model in the folder itself, its
settings in ``sentence_bert_config.json``), then a Pooling (its
``config.json``: the mode, and whether a prompt's tokens count), then any
Dense layers (a linear map and an activation, their weights in the module's
folder) and a Normalize (unit length).  :func:`read_modules` reads them into
a :class:`SentenceModules`, which :mod:`worker.runners.pooling` computes
exactly as sentence-transformers does, on every path the worker runs
(:mod:`worker.runners.embeddings`).

A folder without ``modules.json`` is not a sentence-transformers model: it
gets mean pooling and normalization, what zbatch always did (and what
sentence-transformers does for such a folder), and the log says so.

Anything this reader does not know (a module type, a pooling mode, an
activation, a Dense that reads or writes other vectors than the sentence
embedding) raises :class:`UnsupportedModule`: the worker does not start,
and its one error line names the module and what to do.  Serving vectors
that differ from the model's own, without a word, would be worse.

Nothing here imports torch: the reading, and any refusal, comes before the
model loads.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MODULES_FILE = "modules.json"
TRANSFORMER_CONFIG = "sentence_bert_config.json"
POOLING_MODES = ("cls", "max", "mean", "mean_sqrt_len_tokens", "weightedmean", "lasttoken")
# sentence-transformers' older pooling configs: one flag per mode, in the order the modes concatenate
LEGACY_MODE_FLAGS = {"pooling_mode_cls_token": "cls", "pooling_mode_max_tokens": "max",
                     "pooling_mode_mean_tokens": "mean", "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
                     "pooling_mode_weightedmean_tokens": "weightedmean", "pooling_mode_lasttoken": "lasttoken"}
ACTIVATIONS = ("Identity", "Tanh", "ReLU", "GELU", "Sigmoid", "SiLU", "Mish", "ELU", "LeakyReLU", "Softplus",
               "Softsign", "Hardtanh", "ReLU6", "SELU", "CELU", "Hardswish", "Hardsigmoid", "LogSigmoid")
ACTIVATION_MODULES = ("torch.nn", "torch.nn.modules.activation", "torch.nn.modules.linear")
SENTENCE_EMBEDDING = "sentence_embedding"
KNOWN_KINDS = ("Transformer", "Pooling", "Dense", "Normalize", "Dropout")
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")


class UnsupportedModule(ValueError):
    """A module of the model that zbatch cannot compute as sentence-transformers does; the message says which
    and what to do."""


@dataclass(frozen=True, slots=True)
class Pooling:
    """The pooling modes, concatenated in this order, and whether a prompt's tokens are pooled."""

    modes: tuple[str, ...] = ("mean",)
    include_prompt: bool = True


@dataclass(frozen=True, slots=True)
class Dense:
    """A Dense module: ``activation(x @ W.T + b)``, plus ``x`` (or its projection) where ``residual``."""

    folder: Path
    in_features: int
    out_features: int
    bias: bool
    activation: str  # one of ACTIVATIONS
    residual: bool


@dataclass(frozen=True, slots=True)
class Normalize:
    """A Normalize module: unit length (L2)."""


Step = Dense | Normalize


@dataclass(frozen=True, slots=True)
class SentenceModules:
    """What the model declares (or zbatch's default for a folder that declares nothing).

    ``steps`` run after the pooling, in order; a Normalize that ends the list is ``normalized`` instead, so
    that a request's ``normalize`` parameter can turn it off (or on, for a model without one).
    """

    pooling: Pooling = Pooling()
    steps: tuple[Step, ...] = ()
    normalized: bool = True
    declared: bool = False  # read from modules.json; False: zbatch's default
    max_seq_length: int | None = None
    do_lower_case: bool = False

    def describe(self) -> str:
        """One phrase for the log: the pooling, each Dense, the normalization, and where they come from."""
        parts = [f"{'+'.join(self.pooling.modes)} pooling"]
        if not self.pooling.include_prompt:
            parts[0] += " (prompt tokens excluded)"
        for step in self.steps:
            parts.append("normalized" if isinstance(step, Normalize) else
                         f"Dense {step.in_features}->{step.out_features} ({step.activation}"
                         f"{', residual' if step.residual else ''})")
        parts.append("normalized" if self.normalized else "not normalized")
        origin = ("as its sentence-transformers modules declare" if self.declared else
                  f"zbatch's default: the folder has no {MODULES_FILE}, so it declares no pooling")
        return f"{', '.join(parts)} ({origin})"


def read_modules(folder: str | Path) -> SentenceModules:
    """The modules ``folder`` declares, or the default where it has no ``modules.json``; UnsupportedModule for
    one zbatch cannot run."""
    root = Path(folder)
    listed = _json(root / MODULES_FILE)
    transformer = _transformer_settings(root)
    if listed is None:
        return SentenceModules(max_seq_length=transformer[0], do_lower_case=transformer[1])
    if not isinstance(listed, list) or not all(isinstance(each, dict) for each in listed) or not listed:
        raise UnsupportedModule(f"{root / MODULES_FILE} is not a list of modules, as sentence-transformers "
                                "writes it; fix or remove the file")
    kinds = [_kind(root, each) for each in listed]
    _check_order(root, listed, kinds)
    pooling = _pooling(root / str(listed[1].get("path", "")))
    steps: list[Step] = []
    for entry, kind in zip(listed[2:], kinds[2:], strict=True):
        if kind == "Dense":
            steps.append(_dense(root, root / str(entry.get("path", ""))))
        elif kind == "Normalize":
            steps.append(_normalize(root / str(entry.get("path", ""))))
    normalized = bool(steps) and isinstance(steps[-1], Normalize)
    return SentenceModules(pooling, tuple(steps[:-1] if normalized else steps), normalized, True,
                           *transformer)


def _json(path: Path) -> Any:
    """The file's JSON, None where there is no file; UnsupportedModule where it does not parse."""
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise UnsupportedModule(f"{path} is not valid JSON ({exc}); fix or remove it") from None


def _kind(root: Path, entry: dict[str, Any]) -> str:
    """The module's kind (one of KNOWN_KINDS), from its ``type``; UnsupportedModule for any other."""
    type_name = str(entry.get("type", ""))
    package, _, kind = type_name.rpartition(".")
    if package.startswith("sentence_transformers") and kind in KNOWN_KINDS:
        return kind
    hint = (" (a sparse encoder: serve it with task sparse-embeddings)" if "sparse" in type_name.lower()
            else "")
    raise UnsupportedModule(
        f"model in {root}: module {entry.get('idx', '?')} of {MODULES_FILE}, {type_name or 'of no type'!r} "
        f"(in {entry.get('path') or 'the model folder'!r}), is not one zbatch runs{hint}; zbatch runs "
        f"{', '.join(KNOWN_KINDS)} (sentence_transformers), so it would not compute this model's vectors: "
        "serve the model with sentence-transformers, or a model without that module")


def _check_order(root: Path, listed: list[dict[str, Any]], kinds: list[str]) -> None:
    """A Transformer in the folder itself, then a Pooling, then Dense, Normalize and Dropout modules only."""
    where = f"model in {root}: {MODULES_FILE}"
    if kinds[0] != "Transformer" or len(kinds) < 2 or kinds[1] != "Pooling":
        raise UnsupportedModule(f"{where} lists {', '.join(kinds)}; zbatch runs a Transformer, then a Pooling, "
                                "then Dense, Normalize or Dropout modules: serve the model with "
                                "sentence-transformers, or give it that shape")
    if str(listed[0].get("path", "")) not in ("", "."):
        raise UnsupportedModule(f"{where} keeps its Transformer in {listed[0].get('path')!r}; zbatch loads the "
                                "transformer from the model folder itself: move that folder's files up into the "
                                "model folder and set its path to \"\"")
    for entry, kind in zip(listed[2:], kinds[2:], strict=True):
        if kind in ("Transformer", "Pooling"):
            raise UnsupportedModule(f"{where}: module {entry.get('idx', '?')} is a second {kind}, which zbatch "
                                    "does not run; serve the model with sentence-transformers")


def _transformer_settings(root: Path) -> tuple[int | None, bool]:
    """``max_seq_length`` and ``do_lower_case`` of ``sentence_bert_config.json``; UnsupportedModule for a
    Transformer that is not a plain feature extractor."""
    config = _json(root / TRANSFORMER_CONFIG) or {}
    if not isinstance(config, dict):
        raise UnsupportedModule(f"{root / TRANSFORMER_CONFIG} is not a JSON object; fix or remove it")
    task = config.get("transformer_task", "feature-extraction")
    output = (config.get("modality_config") or {}).get("text", {}).get("method_output_name", "last_hidden_state")
    if task != "feature-extraction" or output != "last_hidden_state":
        raise UnsupportedModule(f"model in {root}: its Transformer ({TRANSFORMER_CONFIG}) runs task {task!r} and "
                                f"pools {output!r}; zbatch pools the last hidden state of a feature-extraction "
                                "model: serve the model with sentence-transformers")
    length = config.get("max_seq_length")
    if length is not None and (isinstance(length, bool) or not isinstance(length, int) or length < 1):
        raise UnsupportedModule(f"{root / TRANSFORMER_CONFIG}: max_seq_length must be a whole number of tokens, "
                                f"not {length!r}")
    return length, bool(config.get("do_lower_case", False))


def _pooling(folder: Path) -> Pooling:
    """The Pooling module's modes (the ``pooling_mode`` key, or the older per-mode flags) and prompt rule."""
    config = _json(folder / "config.json") or {}
    if not isinstance(config, dict):
        raise UnsupportedModule(f"{folder / 'config.json'} is not a JSON object; fix it")
    mode = config.get("pooling_mode")
    if mode is None:  # the older flags; none set means mean, as sentence-transformers reads them
        modes = tuple(name for flag, name in LEGACY_MODE_FLAGS.items() if config.get(flag)) or ("mean",)
    else:
        modes = (mode,) if isinstance(mode, str) else tuple(mode) if isinstance(mode, list) else ()
    unknown = [name for name in modes if name not in POOLING_MODES]
    if not modes or unknown:
        raise UnsupportedModule(f"the Pooling module in {folder} asks for pooling mode {mode!r}, which zbatch does "
                                f"not run; it runs {', '.join(POOLING_MODES)}: serve the model with "
                                "sentence-transformers, or set one of those modes")
    return Pooling(modes, bool(config.get("include_prompt", True)))


def _dense(root: Path, folder: Path) -> Dense:
    """A Dense module's shape, activation and residual; UnsupportedModule for what zbatch cannot compute."""
    config = _json(folder / "config.json")
    if not isinstance(config, dict) or not all(isinstance(config.get(key), int)
                                                for key in ("in_features", "out_features")):
        raise UnsupportedModule(f"the Dense module in {folder} has no config.json with in_features and "
                                "out_features; fix the module or serve the model with sentence-transformers")
    names = {config.get("module_input_name", SENTENCE_EMBEDDING), config.get("module_output_name")} - {None}
    if names != {SENTENCE_EMBEDDING}:
        raise UnsupportedModule(f"the Dense module in {folder} maps {sorted(map(str, names))}; zbatch runs Dense "
                                f"layers over the {SENTENCE_EMBEDDING} only: serve the model with "
                                "sentence-transformers")
    activation = _activation(folder, config.get("activation_function", "torch.nn.modules.activation.Tanh"))
    if not any((folder / name).is_file() for name in WEIGHT_FILES):
        raise UnsupportedModule(f"the Dense module in {folder} has no weights ({' or '.join(WEIGHT_FILES)}); "
                                "copy them from the model's repository")
    return Dense(folder, int(config["in_features"]), int(config["out_features"]), bool(config.get("bias", True)),
                 activation, bool(config.get("use_residual", False)))


def _activation(folder: Path, name: Any) -> str:
    """The activation's class name, if it is one of ACTIVATIONS in torch.nn (sentence-transformers' Dense
    writes its full path); UnsupportedModule for any other."""
    if name is None:  # sentence-transformers' Dense takes None for no activation
        return "Identity"
    package, _, kind = str(name).rpartition(".")
    if package in ACTIVATION_MODULES and kind in ACTIVATIONS:
        return kind
    raise UnsupportedModule(f"the Dense module in {folder} uses activation function {name!r}, which zbatch does "
                            f"not run; it runs torch.nn's {', '.join(ACTIVATIONS)}: serve the model with "
                            "sentence-transformers")


def _normalize(folder: Path) -> Normalize:
    config = _json(folder / "config.json") or {}
    names = ({config.get("module_input_name", SENTENCE_EMBEDDING), config.get("module_output_name")} - {None}
             if isinstance(config, dict) else {"?"})
    if names != {SENTENCE_EMBEDDING}:
        raise UnsupportedModule(f"the Normalize module in {folder} normalizes {sorted(map(str, names))}; zbatch "
                                f"normalizes the {SENTENCE_EMBEDDING} only: serve the model with "
                                "sentence-transformers")
    return Normalize()
