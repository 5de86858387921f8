"""The gateway's OpenAPI 3.0.3 document, served at ``GET /openapi.json``.

Written next to the handlers rather than generated from them: each dialect
declares its paths and schemas in its own module (gateway/dialects/), which
checks exactly what it promises, and this module gathers them with the
gateway's own ``/metrics`` and ``/openapi.json``.  What the gateway already
states as data is taken from there, not restated: the error codes, their
statuses (in each dialect's shape), descriptions and headers from
gateway/errors.py, the request headers and their values from
gateway/parsing.py.  Tests validate it, compare it with those sources and
the routes, and fuzz the live gateway against it.
"""

from __future__ import annotations

from typing import Any

from gateway.dialects import declared
from gateway.errors import ZBATCH_ERRORS
from gateway.inference import TOKENS_HEADER
from gateway.openapi_parts import answer, get
from gateway.parsing import MAX_TIMEOUT_DIGITS, PRIORITIES, PRIORITY_HEADER, TIMEOUT_HEADER
from gateway.tracing import MAX_REQUEST_ID_CHARS, REQUEST_ID_HEADER

# The gateway's own, whatever the dialects: its metrics and this document.
PATHS: dict[str, Any] = {
    "/metrics": get("Prometheus metrics of the gateway (text exposition format); needs a key only with "
                    "protect_metrics", answer("Metrics", {"type": "string"}, "text/plain"), "unauthorized"),
    "/openapi.json": get("This document", answer("OpenAPI 3.0.3 document", {"type": "object"}), "unauthorized"),
}


def _gathered(part: str) -> dict[str, Any]:
    """Every dialect's ``openapi_paths`` or ``openapi_schemas``, in route order; a name declared twice fails."""
    gathered: dict[str, Any] = {}
    for dialect in declared():
        for name, value in getattr(dialect, part).items():
            if name in gathered and gathered[name] != value:
                raise ValueError(f"the dialect {dialect.name} declares {name} again, differently")
            gathered[name] = value
    return gathered


DOCUMENT: dict[str, Any] = {
    "openapi": "3.0.3",
    "info": {"title": "zbatch gateway", "version": "1",
             "description": "Hugging Face models behind a batching ZeroMQ broker. Every answer carries "
                            f"{REQUEST_ID_HEADER} and every inference answer {TOKENS_HEADER}; every error is "
                            "`{\"error\": {\"code\", \"message\"}}`, except on other dialects' paths, in "
                            "their shape: OpenAI's under /v1, TEI's on TEI's routes, KServe's under /v2."},
    "paths": {**_gathered("openapi_paths"), **PATHS},
    # API keys are optional: with api_keys_file set, every endpoint but /healthz needs one.
    "security": [{}, {"apiKey": []}],
    "components": {
        "securitySchemes": {"apiKey": {"type": "http", "scheme": "bearer",
                                       "description": "A key from the gateway's api_keys_file"}},
        "schemas": {ZBATCH_ERRORS.schema_name: ZBATCH_ERRORS.schema, **_gathered("openapi_schemas")},
        "parameters": {
            "RequestId": {"name": REQUEST_ID_HEADER, "in": "header", "required": False,
                          "description": "Your id for this request, echoed back and written in the logs of the "
                                         "gateway, broker and worker; a new one is made if absent or not "
                                         f"1-{MAX_REQUEST_ID_CHARS} printable ASCII characters",
                          "schema": {"type": "string", "maxLength": MAX_REQUEST_ID_CHARS}},
            "RequestTimeout": {"name": TIMEOUT_HEADER, "in": "header", "required": False,
                               "description": "Shortens the request's deadline (never beyond the configured one)",
                               "schema": {"type": "string", "pattern": f"^[0-9]{{1,{MAX_TIMEOUT_DIGITS}}}$"}},
            "Priority": {"name": PRIORITY_HEADER, "in": "header", "required": False,
                         "description": "The request's priority at the broker: high, normal (the default) or low, "
                                        "or the protocol's 0, 1, 2; case is ignored",
                         "schema": {"type": "string", "enum": list(PRIORITIES), "default": "normal"}},
        },
        "headers": {
            "RequestId": {"description": "The request's id: yours if valid, else a new one",
                          "schema": {"type": "string"}},
            "Tokens": {"description": f"{TOKENS_HEADER}: the tokens the model took for the request (special tokens "
                                      "included, after truncation), for billing; absent for images",
                       "schema": {"type": "integer"}},
        },
    },
}
