"""JSON bodies of the gateway's answers: worker outputs, embeddings and the broker's statistics.

Outputs come back from :class:`zbatch.client.AsyncClient` with numpy arrays in
them, which orjson writes directly (:func:`json_response`); the statistics can
hold bytes and numpy scalars too, so they go through :func:`jsonable`.  The
stats follow the STATS payload of zbatch/protocol/PROTOCOL.md (section 3.6).
"""

from __future__ import annotations

import base64
import importlib.metadata
from collections.abc import Mapping
from typing import Any

import numpy as np
import orjson
from aiohttp import web

from gateway.catalog import followed_config, models_of
from gateway.config import GatewayConfig
from gateway.dialects import routes_by_dialect

JSON_OPTIONS = orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS


def _version() -> str:
    try:
        return importlib.metadata.version("zbatch")
    except importlib.metadata.PackageNotFoundError:  # run from a checkout that was never installed
        return "0"


VERSION = _version()  # what /info (TEI) and /v2 (KServe) say the server's version is


def json_response(value: Any) -> web.Response:
    """Model outputs as JSON, numpy arrays written by orjson itself rather than converted to lists first.

    Inference answers go through here: converting a vector to a list of Python
    floats costs far more than writing it, on the path whose throughput matters.
    """
    return web.Response(body=orjson.dumps(value, option=JSON_OPTIONS), content_type="application/json")


def encode_embedding(output: Any, encoding: str) -> Any:
    """One embedding as OpenAI sends it: as it is for "float", little-endian float32 bytes in base64 for "base64"."""
    if encoding == "base64":
        return base64.b64encode(np.asarray(output, dtype="<f4").tobytes()).decode("ascii")
    return output  # json_response writes numpy arrays itself


def jsonable(value: Any) -> Any:
    """``value`` with arrays and numpy scalars as lists and numbers, bytes as hex, keys as text."""
    if isinstance(value, np.ndarray | np.generic):
        return value.tolist()
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, Mapping):
        return {
            key.hex() if isinstance(key, bytes) else str(key): jsonable(v)
            for key, v in value.items()
        }
    if isinstance(value, list | tuple):
        return [jsonable(item) for item in value]
    return value


def models_listing(stats: Mapping[str, Any], config: GatewayConfig) -> dict[str, Any]:
    """``GET /models``: every model the broker knows, its task, the routes of each dialect that answer it
    (as each dialect declares; TEI's only where ``config`` puts it), its figures and the workers serving it."""
    workers = stats.get("workers", [])
    config = followed_config(config, models_of(stats))
    listing = []
    for name, figures in sorted(stats.get("models", {}).items()):
        task = (figures.get("info") or {}).get("task")
        listing.append({
            "name": name,
            "task": task,
            "dialects": routes_by_dialect(task, name, config),
            "workers": [jsonable(w) for w in workers if name in w.get("models", ())],
            "stats": jsonable(figures),
        })
    return {"models": listing}
