"""BENCHMARKS.md's hand-written issue sections survive a bench run that rewrites the rest of the file."""

from __future__ import annotations

from pathlib import Path

from scripts.benchmarks.report.history import issue_sections

TEXT = """# Benchmarks

## Results

generated, replaced by each run

## Shedding by time (issue 33)

figures of issue 33

## One H200, 2026-11-27 (issues 38 and 41)

figures of two issues

## GPU

generated too

## One H200, second lease (issue 41)

figures of issue 41

## History
"""


def test_every_section_named_for_an_issue_or_several_is_kept_with_its_text(tmp_path: Path) -> None:
    path = tmp_path / "BENCHMARKS.md"
    path.write_text(TEXT)
    kept = "\n".join(issue_sections(path))
    for heading, body in (("## Shedding by time (issue 33)", "figures of issue 33"),
                          ("## One H200, 2026-11-27 (issues 38 and 41)", "figures of two issues"),
                          ("## One H200, second lease (issue 41)", "figures of issue 41")):
        assert heading in kept and body in kept
    assert "generated" not in kept and "## Results" not in kept and "## GPU" not in kept
