"""The workers' tasks as the gateway sees them: which routes of which dialect answer a model of each task.

A worker announces each model's task in READY (zbatch/protocol/PROTOCOL.md
3.4, 5.2); the gateway reads it from the brokers' STATS (gateway/catalog.py).
Routes that need a task refuse a model of another one with ``wrong_task``,
whose message (:func:`wrong_task`) names the routes that do answer it.  The
names are restated here, not imported: the gateway never imports the worker.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from gateway.errors import ApiError

EMBEDDINGS = "embeddings"
RERANK = "rerank"
CLASSIFICATION = frozenset({"text-classification", "sentiment-analysis"})  # the second: its old alias
IMAGE_CLASSIFICATION = "image-classification"
OBJECT_DETECTION = "object-detection"
IMAGE_TASKS = frozenset({IMAGE_CLASSIFICATION, OBJECT_DETECTION})


def is_text_task(task: str | None) -> bool:
    """Whether the model takes text (and so has a tokenizer); an unknown task is taken to."""
    return task not in IMAGE_TASKS


def dialect_routes(model: str, task: str | None, tei_models: Mapping[str, str]) -> dict[str, list[str]]:
    """The routes, by dialect, that can run ``model`` given its task and the gateway's TEI settings.

    TEI routes appear only where the settings put this model behind them and its task fits.
    """
    routes: dict[str, list[str]] = {
        "huggingface": [f"POST /models/{model}"],
        "kserve": [f"POST /v2/models/{model}/infer"],
    }
    if task == EMBEDDINGS:
        routes["huggingface"].append(f"POST /models/{model} (sentence-similarity)")
        routes["openai"] = ["POST /v1/embeddings"]
    fitting = {"/embed": task == EMBEDDINGS, "/similarity": task == EMBEDDINGS, "/rerank": task == RERANK,
               "/predict": task in CLASSIFICATION, "/tokenize": is_text_task(task),
               "/info": True, "/health": True}
    tei = [path for path, fits in fitting.items() if fits and tei_models.get(path) == model]
    if tei:
        routes["tei"] = [f"{'GET' if path in ('/info', '/health') else 'POST'} {path}" for path in tei]
    return routes


def task_routes(task: str) -> str:
    """In words, where a model of ``task`` is answered, for an error message."""
    if task == EMBEDDINGS:
        return "POST /v1/embeddings, TEI's /embed and /similarity, /models/{model} and KServe's /v2"
    if task == RERANK:
        return "TEI's /rerank, /models/{model} and KServe's /v2"
    if task in CLASSIFICATION:
        return "TEI's /predict, /models/{model} and KServe's /v2"
    return "/models/{model} and KServe's /v2"


def require_task(model: str, task: str | None, needed: Collection[str], route: str, setting: str = "") -> None:
    """Raise ``wrong_task`` if ``model`` is known to do another task than ``route`` needs (unknown: let it try)."""
    if task is None or task in needed:
        return
    wanted = " or ".join(sorted(needed))
    hint = f"; point {setting} at a {wanted} model" if setting else ""
    raise ApiError("wrong_task", f"{route} needs a {wanted} model, but {model!r} is a {task} model, which "
                                 f"{task_routes(task)} answer{hint}")
