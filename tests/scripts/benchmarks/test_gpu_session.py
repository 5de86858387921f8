"""The GPU session's report (scripts/benchmarks/cases/gpu_session.py): what one device call brings back must
say every rate with its host cores and GPU busy, and each transition's outcome, from the rows alone."""

from __future__ import annotations

from scripts.benchmarks.cases.context import row
from scripts.benchmarks.cases.gpu_session import report
from scripts.benchmarks.cases.transitions import staggered_row


def test_the_report_gives_each_rate_and_the_start_under_load() -> None:
    rate = row("rates", "model, HTTP, 1 a request", 512, {"req_s": 9615.2, "texts_s": 9615.2, "p50_ms": 53.0,
                                                         "p99_ms": 82.7, "errors": 0, "tokens_s": 343890.0,
                                                         "machine_cores": 12.4, "gpu_busy_pct": 38.1})
    result = {"started": 100.0, "abandoned": 0, "duration_s": 3.0, "ok_ms": [1.0, 2.0], "statuses": {"ok": 2},
              "refused_ms": [], "records": [[100.1, 100.5, "ok"], [100.2, 103.4, "ok"]]}
    started = staggered_row(2, [result], [100.0, 101.0], "zbatch serve as shipped")
    started["detail"] |= {"readyz_s": 20.2, "registered_from_spawn_s": [20.1, 21.1], "first_200_s": 20.6}
    lines = "\n".join(report([rate, started], ["a note"]))
    assert "- a note" in lines
    assert ("| rates | model, HTTP, 1 a request | 512 | 9,615 | 9,615 | 343,890 | 53.0 | 82.7 | 0 | 12.4 | 38.1 |"
            in lines)
    assert "staggered: 2 answered 200 of 2; 0 refused, 0 lost" in lines
    assert "/readyz at 20.2 s, registrations at [20.1, 21.1] s, first 200 at 20.6 s" in lines
    assert "### Staggered start" in lines
