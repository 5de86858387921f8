"""JSON bodies of the gateway's answers: worker outputs and the broker's statistics.

Outputs come back from :class:`zbatch.client.AsyncClient` with numpy arrays in
them, which orjson writes directly (:func:`json_response`); the statistics can
hold bytes and numpy scalars too, so they go through :func:`jsonable`.  The
stats follow the STATS payload of zbatch/protocol/PROTOCOL.md (section 3.6).
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Mapping
from typing import Any

import numpy as np
import orjson
from aiohttp import web

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
