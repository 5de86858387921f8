"""A model's prompts: the texts sentence-transformers puts before an input, by name, from the model's folder.

Models trained with instructions (E5, BGE, Nomic, GTE...) ship them in
``config_sentence_transformers.json``: ``{"prompts": {"query": "query: ", ...},
"default_prompt_name": ...}``.  A request names one with the ``prompt_name``
parameter; without one the default applies: the worker's
``--default-prompt-name`` (a model of ``--extra-models``: its
``default_prompt_name=``), else the model's own ``default_prompt_name``, as
sentence-transformers applies it, else none.  The prompt is put before the
text, and the whole is tokenized, truncated, counted and pooled as one input,
as sentence-transformers does for a model whose pooling includes the prompt.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from worker.runners.spec import InputError, quoted_names
from zbatch.protocol.vocabulary import PROMPT_NAME

CONFIG_FILE = "config_sentence_transformers.json"


@dataclass(frozen=True)
class Prompts:
    """The prompts by name and the name of the default one ("" for none)."""

    by_name: Mapping[str, str] = field(default_factory=dict)
    default: str = ""

    @classmethod
    def load(cls, folder: str, default_name: str = "") -> Prompts:
        """The prompts in ``folder``'s sentence-transformers config; ``default_name`` (if set) must be one of them.

        Raises ValueError, naming the prompts there are, for a default that is not one: the worker does not
        start, as TEI does not.
        """
        path = Path(folder) / CONFIG_FILE
        config: Any = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
        prompts = config.get("prompts") if isinstance(config, dict) else None
        if not isinstance(prompts, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                     for k, v in prompts.items()):
            prompts = {}
        own_default = config.get("default_prompt_name") if isinstance(config, dict) else None
        chosen = default_name or (own_default if isinstance(own_default, str) else "")
        if chosen and chosen not in prompts:
            known = f"its prompts are {quoted_names(sorted(prompts))}" if prompts else f"it has none ({CONFIG_FILE})"
            raise ValueError(f"default prompt name {chosen!r} is not a prompt of the model in {folder}: {known}")
        return cls(dict(prompts), chosen)

    def prefix(self, parameters: Mapping[str, Any]) -> str:
        """The text to put before each input: the named prompt's, else the default's, else ""."""
        name = parameters.get(PROMPT_NAME)
        if name is None:
            return self.by_name[self.default] if self.default else ""
        if not isinstance(name, str) or name not in self.by_name:
            known = (f"its prompts are {quoted_names(sorted(self.by_name))}" if self.by_name
                     else f"it has none (the model's {CONFIG_FILE} lists none)")
            raise InputError(f"parameter {PROMPT_NAME!r} must name a prompt of this model, not {name!r}: {known}")
        return self.by_name[name]


def prompted(prefix: str, inputs: list[Any]) -> list[Any]:
    """Each text input with ``prefix`` before it; a prompt cannot go before a pair of texts."""
    if not prefix:
        return inputs
    if any(not isinstance(item, str) for item in inputs):
        raise InputError(f"{PROMPT_NAME!r} cannot be set for pairs of texts")
    return [prefix + item for item in inputs]
