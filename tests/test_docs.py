"""The documentation holds to the code: every setting it names exists, every code sample parses, the generated
settings table covers every program, and the site's pages are the ones the navigation lists.

``scripts/test`` also builds the site with ``mkdocs build --strict`` (broken links and anchors fail it), and
tests/e2e/test_docs_examples.py runs every example marked runnable against a real stack.
"""

from __future__ import annotations

import dataclasses
import re
import subprocess
import tomllib
from pathlib import Path

import pytest

from scripts.docs import ROOT, SETTINGS_MARK, Sample, programs, render, samples
from zbatch.runtime.settings import env_name, flag_name

# Variables that are not settings of a program: read by scripts/, the bench, or the runtime itself.
OTHER_VARIABLES = {"ZBATCH_CONFIG", "ZBATCH_NATIVE_DIR", "ZBATCH_TORCH", "ZBATCH_VENV", "ZBATCH_BENCH_CACHE",
                   "ZBATCH_TEST_PROCESSES"}
PAGES = sorted((ROOT / "docs").rglob("*.md"))
ALL_SAMPLES = list(samples())


def settings() -> set[str]:
    return {env_name(field.name) for _, config in programs() for field in dataclasses.fields(config)}


def test_the_generated_table_has_every_setting_of_every_program() -> None:
    table = render(SETTINGS_MARK, "configuration.md")
    for program, config in programs():
        for field in dataclasses.fields(config):
            assert f"| {program} | `{env_name(field.name)}` | `{flag_name(field.name)}` |" in table
    assert SETTINGS_MARK in (ROOT / "docs" / "configuration.md").read_text()


@pytest.mark.parametrize("path", [ROOT / "README.md", *PAGES], ids=lambda path: str(path.relative_to(ROOT)))
def test_every_variable_named_is_a_setting(path: Path) -> None:
    known = settings() | OTHER_VARIABLES
    for name in re.findall(r"ZBATCH_[A-Z0-9_]+\*?", path.read_text()):
        if name.endswith("*"):
            assert any(setting.startswith(name[:-1]) for setting in known), name
        else:
            assert name in known, f"{path.name} names {name}, which no program reads"


def test_every_page_is_in_the_navigation() -> None:
    config = (ROOT / "mkdocs.yml").read_text()
    listed = set(re.findall(r":\s*(\S+\.md)\s*$", config, re.MULTILINE))
    assert listed == {str(path.relative_to(ROOT / "docs")) for path in PAGES}


def by_language(*languages: str) -> list[Sample]:
    return [sample for sample in ALL_SAMPLES if sample.language in languages]


@pytest.mark.parametrize("sample", by_language("python"), ids=lambda sample: sample.page)
def test_python_samples_compile(sample: Sample) -> None:
    compile(sample.code, sample.page, "exec")


@pytest.mark.parametrize("sample", by_language("toml"), ids=lambda sample: sample.page)
def test_toml_samples_hold_only_real_settings(sample: Sample) -> None:
    tables = dict(programs())
    for table, keys in tomllib.loads(sample.code).items():
        assert table in tables, f"{sample.page}: [{table}] is no program's table"
        fields = {field.name for field in dataclasses.fields(tables[table])}
        assert set(keys) <= fields, f"{sample.page}: [{table}] has {sorted(set(keys) - fields)}"


@pytest.mark.parametrize("sample", by_language("sh", "bash"), ids=lambda sample: sample.page)
def test_shell_samples_parse(sample: Sample) -> None:
    code = "\n".join(line.removeprefix("$ ") for line in sample.code.splitlines() if not line.startswith(("[", "{")))
    done = subprocess.run(["bash", "-n"], input=code, text=True, capture_output=True, check=False)
    assert done.returncode == 0, f"{sample.page}: {done.stderr}"


def test_every_dialect_page_has_a_runnable_example_for_each_of_its_clients() -> None:
    runnable = {(sample.page, sample.language) for sample in ALL_SAMPLES if sample.runnable}
    for page in ("huggingface", "openai", "tei", "kserve", "zeromq", "cohere"):
        assert (f"docs/dialects/{page}.md", "python") in runnable, page
    for page in ("huggingface", "openai", "tei", "kserve", "cohere"):
        assert (f"docs/dialects/{page}.md", "sh") in runnable, page


# "issue 33", "issues 23–25", "(issue #34)": the project's own tracker, which users cannot read.
INTERNAL_ISSUE = re.compile(r"\bissues? #?\d+", re.IGNORECASE)
NUMBER = re.compile(r"\d+(?:,\d{3})*(?:\.\d+)?")
# A throughput a page quotes: one or more numbers (a range, a list) before texts/s, requests/s...
THROUGHPUT = re.compile(r"(?:\d+(?:,\d{3})*(?:\.\d+)?(?:–| to | and |, )?)+ ?(?:texts|requests|req|answers|refusals)/s")
USER_PAGES = [ROOT / "README.md", *PAGES]


@pytest.mark.parametrize("path", USER_PAGES, ids=lambda path: str(path.relative_to(ROOT)))
def test_no_page_cites_an_internal_issue(path: Path) -> None:
    """Users read the docs without the project's issue tracker: a page says what it means, not "issue 33"."""
    assert INTERNAL_ISSUE.findall(path.read_text()) == []


@pytest.mark.parametrize("path", USER_PAGES, ids=lambda path: str(path.relative_to(ROOT)))
def test_every_throughput_a_page_quotes_is_in_benchmarks(path: Path) -> None:
    """A measured rate on a page is BENCHMARKS.md's, as it wrote it, not a rounding or an older run's."""
    measured = set(NUMBER.findall((ROOT / "BENCHMARKS.md").read_text()))
    quoted = [(figure.group(0), number) for figure in THROUGHPUT.finditer(path.read_text())
              for number in NUMBER.findall(figure.group(0))]
    assert [(figure, number) for figure, number in quoted if number not in measured] == []
