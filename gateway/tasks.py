"""The workers' tasks as the gateway sees them: refusing a route a model's task cannot answer, naming those that can.

A worker announces each model's task in READY (zbatch/protocol/PROTOCOL.md
3.4, 5.2); the gateway reads it from the brokers' STATS (gateway/catalog.py).
The task names are the protocol's (zbatch/protocol/vocabulary.py).  Routes
that need a task refuse a model of another one with ``wrong_task``, whose
message (:func:`task_routes`) names the routes that do answer it: each
dialect declares which of its routes answer which task
(gateway/dialects/__init__.py).
"""

from __future__ import annotations

from collections.abc import Collection

from gateway.errors import ApiError
from zbatch.protocol.vocabulary import IMAGE_TASKS


def is_text_task(task: str | None) -> bool:
    """Whether the model takes text (and so has a tokenizer); an unknown task is taken to."""
    return task not in IMAGE_TASKS


def task_routes(task: str) -> str:
    """In words, where a model of ``task`` is answered, for an error message."""
    from gateway.dialects import declared, routes_by_dialect  # the dialects import this module

    titles = {dialect.name: dialect.title for dialect in declared()}
    return "; ".join(f"{titles[name]}'s {', '.join(routes)}" for name, routes in routes_by_dialect(task).items())


def require_task(model: str, task: str | None, needed: Collection[str], route: str, setting: str = "") -> None:
    """Raise ``wrong_task`` if ``model`` is known to do another task than ``route`` needs (unknown: let it try)."""
    if task is None or task in needed:
        return
    wanted = " or ".join(sorted(needed))
    hint = f"; point {setting} at a {wanted} model" if setting else ""
    raise ApiError("wrong_task", f"{route} needs a {wanted} model, but {model!r} is a {task} model, answered by "
                                 f"{task_routes(task)}{hint}")
