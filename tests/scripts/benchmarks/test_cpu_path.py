"""The CPU-per-request tool's own logic: its table, and how it sorts py-spy's samples into kinds of work."""

from __future__ import annotations

from collections import Counter

from scripts.benchmarks.studies.cpu_path import WAITING, breakdown, format_breakdown, format_table, kind_of

RAW = """\
process 10:"python -m gateway";thread (0x1);run (asyncio/base_events.py:600);dumps (json/__init__.py:231) 6
process 10:"python -m gateway";thread (0x1);run (asyncio/base_events.py:600);_run_once (asyncio/base_events.py:1890) 3
process 10:"python -m gateway";thread (0x1);handle (gateway/app.py:40);packb (zbatch/protocol/payloads.py:80) 1
process 10:"python -m gateway";thread (0x2);_main (worker/stages.py:9);take_gil (ceval_gil.c:300) 10
"""


def test_the_table_has_a_row_per_cell_with_each_daemon_and_the_total() -> None:
    cells = [{"path": "http", "clients": 32, "req_s": 1234.4, "other_cores": 0.04,
              "cpu_us": {"gateway": 300.2, "broker": 50.0, "worker": 100.0, "load generator": 200.0}},
             {"path": "zmq", "clients": 128, "req_s": 2000.0, "other_cores": None,
              "cpu_us": {"broker": 40.0, "worker": 90.0, "load generator": 150.0}}]
    lines = format_table(cells).splitlines()
    assert lines[0] == ("| path | clients | req/s | gateway µs | broker µs | worker µs | load generator µs | "
                        "total µs | other cores |")
    assert lines[1] == "|---|---|---|---|---|---|---|---|---|"
    assert lines[2] == "| HTTP | 32 | 1,234 | 300 | 50 | 100 | 200 | 650 | 0.04 |"
    assert lines[3] == "| ZeroMQ | 128 | 2,000 | – | 40 | 90 | 150 | 280 | – |"


def test_a_sample_is_the_kind_of_its_innermost_frame_that_names_one() -> None:
    assert kind_of(["main (worker/engine.py:10)", "_tokenized (worker/runners/text.py:300)"]) == "tokenizing"
    assert kind_of(["_tokenized (worker/runners/text.py:300)", "encode (zbatch/protocol/texts.py:105)"]) == "tokenizing"
    assert kind_of(["handle (gateway/app.py:40)", "dumps (json/__init__.py:231)"]) == "JSON"
    assert kind_of(["pump (broker/server.py:10)"]) == "broker loop"
    assert kind_of(["<module> (somewhere.py:1)"]) == "other"
    assert kind_of(["_main (worker/stages.py:9)", "encode (tokenizers.so)", "take_gil (ceval_gil.c:300)"]) == WAITING


def test_the_breakdown_prices_the_busy_samples_by_kind_and_keeps_the_waits_apart() -> None:
    kinds, functions = breakdown(RAW.splitlines())
    assert kinds == Counter({WAITING: 10, "JSON": 6, "event loop": 3, "msgpack": 1})
    assert functions.most_common(1) == [("dumps (json/__init__.py)", 6)]
    line = format_breakdown("gateway", 200.0, kinds, functions, top=1)
    assert line.splitlines() == [
        "- **gateway** (10 busy samples, 200 µs a request): JSON 60% (120 µs), event loop 30% (60 µs), msgpack 10% "
        "(20 µs)", "  - top functions: `dumps (json/__init__.py)` 60%",
        "  - samples that were waits (no CPU, left out above): 50%"]
