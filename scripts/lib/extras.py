"""``python3 scripts/lib/extras.py PYPROJECT INSTALLED WANTED``: exit 0 if the extras INSTALLED (comma-separated)
include everything the extras WANTED take, following the project's own references (``bench = ["zbatch[test]",
...]``), else 1.  scripts/lib/venv.sh asks it before installing, so a venv with the bench's extras serves the tests.
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

REFERENCE = re.compile(r"zbatch\[([^\]]+)\]")


def taken(extras: dict[str, list[str]], names: list[str]) -> set[str]:
    """``names`` and every extra they reference, transitively."""
    seen: set[str] = set()
    pending = list(names)
    while pending:
        name = pending.pop()
        if name and name not in seen:
            seen.add(name)
            for requirement in extras.get(name, []):
                if reference := REFERENCE.match(requirement):
                    pending += [each.strip() for each in reference.group(1).split(",")]
    return seen


def main(argv: list[str]) -> int:
    pyproject, installed, wanted = argv
    extras = tomllib.loads(Path(pyproject).read_text())["project"]["optional-dependencies"]
    return 0 if taken(extras, wanted.split(",")) <= taken(extras, installed.split(",")) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
