"""The multi-process load generator's children: each writes its result to its own file, and the parent reads them."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import pytest

from scripts.benchmarks.load.processes import Child, collect


async def _children(folder: Path, *programs: str) -> list[Child]:
    """Stand-ins for load generators (named so): each program gets its result file's path as ``sys.argv[1]``."""
    children = []
    for index, program in enumerate(programs):
        result = folder / f"child-{index}.json"
        process = await asyncio.create_subprocess_exec(sys.executable, "-c", program, str(result))
        children.append(Child(process, result))
    return children


WRITES = "import sys; open(sys.argv[1], 'w').write('{\"child\": %d}')"


def test_each_child_s_result_is_read_from_its_file_in_order(tmp_path: Path) -> None:
    async def run() -> list[dict[str, object]]:
        return await collect(await _children(tmp_path, WRITES % 0, WRITES % 1))

    assert asyncio.run(run()) == [{"child": 0}, {"child": 1}]
    assert not tmp_path.exists()  # the results and their folder are gone once read


@pytest.mark.parametrize("program, expected", [
    ("import sys; open(sys.argv[1], 'w').write('{\"cut\": [1, 2')", "wrote 13 bytes"),
    ("import sys; open(sys.argv[1], 'w').write('{}'); sys.exit(3)", "status 3"),
    ("pass", "wrote 0 bytes"),
])
def test_a_child_that_failed_or_left_no_result_is_an_error_that_says_which(tmp_path: Path, program: str,
                                                                             expected: str) -> None:
    async def run() -> None:
        await collect(await _children(tmp_path, WRITES % 0, program))

    with pytest.raises(RuntimeError, match="load generator 1 failed") as raised:
        asyncio.run(run())
    assert expected in str(raised.value)


def test_a_real_child_writes_its_whole_result_to_the_file_it_is_given(tmp_path: Path) -> None:
    """The load generator itself, against a port nothing listens on: its clients' failures are its result."""
    import socket

    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]

    async def run() -> list[dict[str, Any]]:
        from scripts.benchmarks.load.processes import start_children

        return await collect(await start_children("http", f"http://127.0.0.1:{port}/models/m", "m", 2, 0.0, 0.3,
                                                  1, 1, "--records"))

    [result] = asyncio.run(run())
    assert result["duration_s"] == 0.3
    assert result["records"] and all(status != "ok" for _, _, status in result["records"])
