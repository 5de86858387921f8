"""What the documentation site takes from the code, so that it cannot drift: the settings tables, and the pages
that are files of the repository (the protocol, the benchmarks); and the code samples of every page, for tests.

``docs/hooks.py`` (an MkDocs hook) calls :func:`render` on each page as the site is built: a page holding
``<!-- zbatch:settings -->`` gets every daemon's settings as its own ``--help`` knows them, and
``<!-- zbatch:include PATH -->`` the file at PATH (from the repository's root), its links mended for the site.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zbatch.runtime.settings import env_name, flag_name

ROOT = Path(__file__).resolve().parent.parent
SETTINGS_MARK = "<!-- zbatch:settings -->"
INCLUDE = re.compile(r"<!-- zbatch:include (\S+) -->")
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```", re.DOTALL | re.MULTILINE)
RUN_MARK = "<!-- zbatch:run -->"  # the next code block is a runnable example (tests/e2e/test_docs_examples.py)


def programs() -> list[tuple[str, type[Any]]]:
    """Each program's name as its TOML table and the configuration class it reads."""
    from broker.config import BrokerConfig
    from gateway.config import GatewayConfig
    from worker.config import WorkerConfig
    from zbatch.supervisor.config import ServeConfig
    from zbatch.tools.status import StatusConfig

    return [("broker", BrokerConfig), ("worker", WorkerConfig), ("gateway", GatewayConfig), ("serve", ServeConfig),
            ("status", StatusConfig)]


def settings_table() -> str:
    """One row per setting of every program: its variable, flag, default and help, as ``--help`` says them."""
    rows = ["| program | variable | flag | default | meaning |", "|---|---|---|---|---|"]
    for program, config in programs():
        for field in dataclasses.fields(config):
            meaning = str(field.metadata["help"]).replace("|", "\\|")
            choices = field.metadata.get("choices")
            if choices:
                meaning += " (one of " + ", ".join(f"`{choice}`" for choice in choices) + ")"
            rows.append(f"| {program} | `{env_name(field.name)}` | `{flag_name(field.name)}` | "
                        f"{_default(field.default)} | {meaning} |")
    return "\n".join(rows)


def _default(value: Any) -> str:
    if value == "" or value == ():
        return "(empty)"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    return f"`{value}`"


def render(markdown: str, page: str) -> str:
    """``markdown`` of the page at ``page`` (its path under docs/) with the generated parts filled in."""
    markdown = markdown.replace(SETTINGS_MARK, settings_table())
    return INCLUDE.sub(lambda match: _included(match.group(1), page), markdown)


def _included(path: str, page: str) -> str:
    """A repository file for the site: its title dropped (the page has one) and its links to files mended."""
    text = (ROOT / path).read_text(encoding="utf-8")
    text = re.sub(r"\A# [^\n]*\n", "", text)
    depth = len(Path(page).parent.parts)
    up = "../" * depth

    def mend(match: re.Match[str]) -> str:
        label, target = match.group(1), match.group(2)
        if target.startswith(("http://", "https://", "#", "mailto:")):
            return match.group(0)
        if target.startswith("bench-out/"):
            return f"[{label}]({up}{target})"
        page_of = {"BENCHMARKS.md": "benchmarks.md", "zbatch/protocol/PROTOCOL.md": "protocol.md"}
        if target in page_of:
            return f"[{label}]({up}{page_of[target]})"
        if target.startswith("docs/") and target.endswith(".md"):
            return f"[{label}]({up}{target.removeprefix('docs/')})"
        return label  # a file of the repository, not a page of the site: named, not linked

    return re.sub(r"(?<!!)\[([^\]]+)\]\(([^)\s]+)\)", mend, text).replace("](bench-out/", f"]({up}bench-out/")


@dataclass(frozen=True)
class Sample:
    page: str
    language: str
    code: str
    runnable: bool


def samples(folder: Path | None = None) -> Iterator[Sample]:
    """Every fenced code block of every page under docs/ (and the README), with its language."""
    folder = folder or ROOT / "docs"
    pages = [*sorted(folder.rglob("*.md")), ROOT / "README.md"]
    for path in pages:
        text = path.read_text(encoding="utf-8")
        for match in FENCE.finditer(text):
            before = text[:match.start()].rstrip().splitlines()[-1:] or [""]
            yield Sample(str(path.relative_to(ROOT)), match.group(1), match.group(2), before[0] == RUN_MARK)
