"""Per-model admission limits: the longest predicted wait, the count before a rate is measured, the memory bounds
(items and bytes) and timeouts, with the broker-wide values as defaults.

``--model-limits "name=small,max_queue_ms=500,timeout_ms=2000;name=big,max_timeout_ms=120000"``
gives some models their own limits; every other model uses the broker's.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from zbatch.runtime.settings import parse_entries

LIMIT_KEYS = ("max_backlog", "max_backlog_bytes", "timeout_ms", "max_timeout_ms", "max_queue_ms", "cold_backlog")


@dataclass(frozen=True, slots=True)
class ModelLimits:
    max_backlog: int
    max_backlog_bytes: int
    timeout_ms: int
    max_timeout_ms: int
    max_queue_ms: int = 0  # 0: a request's own deadline is its only bound
    cold_backlog: int = 512


def parse_model_limits(text: str, defaults: ModelLimits) -> dict[str, ModelLimits]:
    """Model name -> its limits; ValueError names the entry and what is wrong with it."""
    limits: dict[str, ModelLimits] = {}
    for entry in parse_entries(text, ("name", *LIMIT_KEYS), "model limits"):
        fields = dict(entry)
        name = fields.pop("name", "")
        if not name or not fields:
            raise ValueError(f"model limits {entry}: expected name=MODEL plus any of {', '.join(LIMIT_KEYS)}")
        try:
            values = {key: int(value) for key, value in fields.items()}
        except ValueError:
            raise ValueError(f"{entry!r}: limits must be whole numbers") from None
        if min(values.values()) < 1:
            raise ValueError(f"{entry!r}: limits must be at least 1")
        limits[name] = replace(defaults, **values)
    return limits


def check_model_limits(text: str) -> str | None:
    """Settings check: the text parses (with placeholder defaults)."""
    try:
        parse_model_limits(text, ModelLimits(1, 1, 1, 1))
    except ValueError as exc:
        return str(exc)
    return None
