"""The multi-process load generator's children: what the parent makes of what each printed."""

from __future__ import annotations

import asyncio
import sys

import pytest

from scripts.benchmarks.load.processes import collect


async def _children(*programs: str) -> list[asyncio.subprocess.Process]:
    return [await asyncio.create_subprocess_exec(sys.executable, "-c", program, stdout=asyncio.subprocess.PIPE,
                                                 stderr=asyncio.subprocess.PIPE) for program in programs]


def test_each_child_s_printed_result_is_collected_in_order() -> None:
    async def run() -> list[dict[str, object]]:
        return await collect(await _children('print(\'{"child": 0}\')', 'print(\'{"child": 1}\')'))

    assert asyncio.run(run()) == [{"child": 0}, {"child": 1}]


@pytest.mark.parametrize("program, expected", [
    ("import sys; print('{\"cut\": [1, 2'); sys.stderr.write('the end of its stderr')", "the end of its stderr"),
    ("import sys; sys.stderr.write('a traceback'); sys.exit(3)", "status 3"),
    ("pass", "printed 0 bytes"),
])
def test_a_child_that_failed_or_printed_no_result_is_an_error_that_shows_why(program: str, expected: str) -> None:
    async def run() -> None:
        await collect(await _children('print(\'{"child": 0}\')', program))

    with pytest.raises(RuntimeError, match="load generator 1 failed") as raised:
        asyncio.run(run())
    assert expected in str(raised.value)
