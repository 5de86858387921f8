"""Reading an inference request: its body, its JSON fields, its limits and its headers.

Each function either returns what the handler needs or raises an
:class:`~gateway.errors.ApiError` that says what was wrong, so the broker only
ever sees well-formed work.  The OpenAPI document (gateway/openapi.py) takes the
headers' names and values from here.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Collection, Iterable, Mapping
from typing import Any

import numpy as np
import orjson
from aiohttp import hdrs, web

from gateway.appkeys import CONFIG
from gateway.config import GatewayConfig
from gateway.errors import ApiError, bad_request
from zbatch.protocol.vocabulary import PROMPT_NAME
from zbatch.protocol.wire import MAX_NAME_CHARS

TIMEOUT_HEADER = "X-Request-Timeout-Ms"
PRIORITY_HEADER = "X-Priority"
PRIORITIES = {"high": 0, "normal": 1, "low": 2, "0": 0, "1": 1, "2": 2}
# Ten digits is over 100 days, and keeps int() away from absurdly long strings.
MAX_TIMEOUT_DIGITS = 10
MAX_TOKEN_ID = 2**32 - 1  # TEI's ids are u32; a model's vocabulary, far smaller, is the worker's check
JSON_TYPES = frozenset({"application/json"})
# curl -d sends form-urlencoded; POST / takes the raw body as the text either way.
TEXT_TYPES = frozenset({"text/plain", "application/x-www-form-urlencoded"})
MAX_PROMPT_NAME_CHARS = 256


async def read_body(
    request: web.Request, content_types: Collection[str], *, optional: bool = False
) -> bytes:
    """The body, after refusing a content type we cannot read.

    ``optional`` accepts a request without a Content-Type header.  The in-flight
    guard (gateway/guard.py) has read the body already, within the body timeout
    and the size limit, so this only hands it over.
    """
    if (
        not (optional and hdrs.CONTENT_TYPE not in request.headers)
        and request.content_type not in content_types
    ):
        expected = " or ".join(sorted(content_types))
        raise ApiError("unsupported_media_type", f"Content-Type must be {expected}")
    return await request.read()


async def read_json(request: web.Request) -> dict[str, Any]:
    """The body as a JSON object."""
    return json_object(await read_body(request, JSON_TYPES))


def json_object(body: bytes | memoryview) -> dict[str, Any]:
    """``body`` parsed as a JSON object, or a 400 that says what is wrong with it."""
    if not body:
        raise bad_request("the body is empty; send a JSON object")
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise bad_request("the body is not valid JSON") from None
    if not isinstance(data, dict):
        raise bad_request("the body must be a JSON object")
    return data


def decode_text(body: bytes, charset: str | None) -> str:
    """A raw body as one non-empty text, in its declared charset (utf-8 by default)."""
    try:
        text = body.decode(charset or "utf-8")
    except (UnicodeDecodeError, LookupError):
        raise bad_request("the body is not text in its declared charset (default utf-8)") from None
    if not text:
        raise bad_request("the body is empty; send the text to process")
    return text


def parse_inputs(body: Mapping[str, Any], field: str) -> tuple[list[str], bool]:
    """The texts to run, and whether a single string came in (so a single output goes out)."""
    if field not in body:
        raise bad_request(f'missing "{field}"', param=field)
    value = body[field]
    if isinstance(value, str):
        texts, single = [value], True
    elif isinstance(value, list) and value and all(isinstance(item, str) for item in value):
        texts, single = value, False
    else:
        raise bad_request(f'"{field}" must be a string or a non-empty list of strings', param=field)
    if not all(texts):
        raise bad_request(f'"{field}" must not contain empty strings', param=field)
    return texts, single


def parse_parameters(body: Mapping[str, Any]) -> dict[str, Any]:
    """The optional ``parameters`` object, passed to the model as it is."""
    parameters = body.get("parameters")
    if parameters is None:
        return {}
    if not isinstance(parameters, dict):
        raise bad_request('"parameters" must be a JSON object')
    return parameters


def optional_flag(body: Mapping[str, Any], name: str) -> bool | None:
    """A true/false field, None when absent or null."""
    value = body.get(name)
    if value is not None and not isinstance(value, bool):
        raise bad_request(f'"{name}" must be true or false', param=name)
    return value


def model_options(body: Mapping[str, Any], names: Iterable[str]) -> dict[str, Any]:
    """The model parameters among ``names`` that the body sets (null: unset), checked and in the worker's terms.

    ``normalize``, ``truncate``, ``raw_scores`` and ``add_special_tokens`` are true or false;
    ``truncation_direction`` is left or right (any case, as TEI takes it); ``dimensions`` a whole
    number of at least 1 (the worker knows the model's size, and refuses more); ``prompt_name`` a short
    string (the worker knows the model's prompts, and refuses a name it has none of).
    """
    parameters: dict[str, Any] = {}
    for name in names:
        value = body.get(name)
        if value is None:
            continue
        if name == "truncation_direction":
            if not isinstance(value, str) or value.lower() not in ("left", "right"):
                raise bad_request('"truncation_direction" must be "left" or "right"', param=name)
            parameters[name] = value.lower()
        elif name == "dimensions":
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise bad_request('"dimensions" must be a whole number of at least 1', param=name)
            parameters[name] = value
        elif name == PROMPT_NAME:
            if not isinstance(value, str) or not 1 <= len(value) <= MAX_PROMPT_NAME_CHARS:
                raise bad_request(f'"{PROMPT_NAME}" must be the name of one of the model\'s prompts, a string of 1 '
                                  f"to {MAX_PROMPT_NAME_CHARS} characters", param=name)
            parameters[name] = value
        else:
            parameters[name] = optional_flag(body, name)
    return parameters


def truncate_prompt_tokens(body: Mapping[str, Any]) -> None:
    """vLLM's ``truncate_prompt_tokens`` (its benchmark sends -1), which the workers' own truncation covers.

    -1 (or null) cuts each input at the model's maximum length, as the workers do unless ``truncate`` is
    false; a count of tokens is refused, since the workers cut only at the model's maximum.
    """
    value = body.get("truncate_prompt_tokens")
    if value is None or (type(value) is int and value == -1):
        return
    raise bad_request('"truncate_prompt_tokens" may only be -1 (cut each input at the model\'s maximum length, '
                      "which zbatch does anyway) or null; zbatch cannot cut inputs at another number of tokens",
                      param="truncate_prompt_tokens")


def check_limits(config: GatewayConfig, model: str, items: int, texts: Iterable[str] = ()) -> None:
    """Refuse a model name, more inputs or longer texts than this gateway takes, before the broker sees them.

    ``items``: how many inputs; ``texts``: every text in them (both of a pair; none for images, which
    the body size bounds).
    """
    check_inputs(config, items, texts)
    if not 1 <= len(model) <= MAX_NAME_CHARS:
        raise bad_request(f"the model name must have 1 to {MAX_NAME_CHARS} characters")


def check_inputs(config: GatewayConfig, items: int, texts: Iterable[str] = ()) -> None:
    """Refuse more inputs or longer texts than this gateway takes (as :func:`check_limits`, without a model)."""
    if items > config.max_inputs:
        raise ApiError("too_many_inputs", f"{items} inputs; the limit is {config.max_inputs} per request: split it")
    longest = max(map(len, texts), default=0)
    if longest > config.max_input_chars:
        raise ApiError("input_too_long",
                       f"an input has {longest} characters; the limit is {config.max_input_chars}")


def request_timeout_ms(request: web.Request) -> int | None:
    """``X-Request-Timeout-Ms``: the caller's timeout, which may shorten but never extend the configured one."""
    return timeout_ms_from(request.headers.get(TIMEOUT_HEADER), request.app[CONFIG])


def timeout_ms_from(raw: str | None, config: GatewayConfig) -> int | None:
    """A timeout header's value (HTTP's, or gRPC metadata's of the same name), within ``config.timeout_ms``."""
    if raw is None:
        return None
    if not (raw.isascii() and raw.isdigit() and len(raw) <= MAX_TIMEOUT_DIGITS and int(raw) > 0):
        raise bad_request(f"{TIMEOUT_HEADER} must be a positive whole number of milliseconds")
    return min(int(raw), config.timeout_ms)


def request_priority(request: web.Request) -> int:
    """``X-Priority``: high, normal (the default) or low, or the protocol's 0, 1, 2; case is ignored."""
    return priority_from(request.headers.get(PRIORITY_HEADER))


def priority_from(raw: str | None) -> int:
    """A priority header's value (HTTP's, or gRPC metadata's of the same name); absent: normal."""
    value = ("normal" if raw is None else raw).strip().lower()
    if value not in PRIORITIES:
        raise bad_request(f"{PRIORITY_HEADER} must be high, normal or low")
    return PRIORITIES[value]


def decode_base64(text: str, where: str) -> bytes:
    """One base64 image, a ``data:...;base64,`` prefix allowed; 400 for anything else."""
    if text.startswith("data:"):
        text = text.partition(",")[2]
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise bad_request(f"{where} is not base64: send the image file's bytes in base64") from None


def token_ids(value: Any, field: str) -> list[np.ndarray]:
    """Token ids from JSON, as TEI's ``/decode`` and OpenAI's ``input`` take them: one list of whole numbers, or
    a non-empty list of such lists; each an int64 array (ext-1 on the way to the worker)."""
    def ids(item: Any) -> np.ndarray | None:
        if isinstance(item, list) and all(type(i) is int and 0 <= i <= MAX_TOKEN_ID for i in item):
            return np.asarray(item, dtype=np.int64)
        return None

    if isinstance(value, list) and value and all(isinstance(item, list) for item in value):
        batch = [ids(item) for item in value]
        if all(item is not None for item in batch):
            return [item for item in batch if item is not None]
    else:
        one = ids(value)
        if one is not None:
            return [one]
    raise bad_request(f'"{field}" must be a list of token ids (whole numbers from 0 to {MAX_TOKEN_ID}), or a '
                      "non-empty list of such lists", param=field)
