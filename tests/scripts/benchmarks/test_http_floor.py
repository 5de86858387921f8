"""The HTTP floor study's bare servers, run for real: each answers a text with the vector, and its table."""

from __future__ import annotations

import asyncio

import aiohttp
import numpy as np
import pytest

from scripts.benchmarks.studies.http_floor import SERVERS, VECTOR, format_table, started


async def answers(kind: str, body: object, times: int) -> list[tuple[int, object]]:
    """Each status and JSON answer of ``times`` POSTs of ``body``, all at once, to a bare server of ``kind``."""
    timeout = aiohttp.ClientTimeout(total=60)  # a server that never answers fails the test, not the suite's timeout
    async with started(kind, wait_s=0.001) as (url, pid), aiohttp.ClientSession(timeout=timeout) as session:
        assert pid > 0

        async def post() -> tuple[int, object]:
            async with session.post(url, json=body) as response:
                return response.status, await response.json(content_type=None) if response.status == 200 else None

        return list(await asyncio.gather(*(post() for _ in range(times))))


@pytest.mark.parametrize("kind", SERVERS)
def test_each_bare_server_answers_a_text_with_the_vector_as_json(kind: str) -> None:
    got = asyncio.run(answers(kind, {"inputs": "a text"}, times=4))  # the relay's come back on one DEALER
    assert [status for status, _ in got] == [200] * 4
    for _, vector in got:
        np.testing.assert_allclose(np.asarray(vector, dtype=np.float32), VECTOR)


@pytest.mark.parametrize("kind", ["json", "relay"])
def test_the_parsing_servers_refuse_a_body_without_a_text(kind: str) -> None:
    assert asyncio.run(answers(kind, {"inputs": 3}, times=1)) == [(400, None)]


def test_the_table_has_a_row_per_number_of_clients_with_the_gateway_first() -> None:
    cell = {"req_s": 2000.4, "cpu_us": 99.6}
    rows = [{"clients": 32, "gateway": {"req_s": 2100.0, "cpu_us": 210.0}, **dict.fromkeys(SERVERS, cell)}]
    lines = format_table(rows).splitlines()
    assert lines[0] == ("| clients | gateway req/s · µs | server req/s · µs | application req/s · µs | json req/s · µs"
                        " | relay req/s · µs |")
    assert lines[2] == "| 32 | 2,100 · 210 | 2,000 · 100 | 2,000 · 100 | 2,000 · 100 | 2,000 · 100 |"
