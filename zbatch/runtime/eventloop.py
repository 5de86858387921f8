"""The event loop every daemon runs on: uvloop where it is installed, asyncio's own otherwise.

uvloop runs the same asyncio code with its loop, timers and futures in C;
the daemons here spend most of their CPU in the loop's machinery, not in
their own logic (see BENCHMARKS.md for what it changed).
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def run(main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(main)``, on uvloop when it is installed."""
    try:
        import uvloop
    except ImportError:  # not on this platform (Windows): the standard loop works the same, only slower
        return asyncio.run(main)
    return uvloop.run(main)
