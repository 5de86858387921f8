"""MkDocs hook: the generated parts of the site (scripts/docs.py) and the benchmark charts."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from mkdocs.structure.files import File, Files  # noqa: E402

from scripts.docs import render  # noqa: E402


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    return render(markdown, page.file.src_path)


def on_files(files: Files, config: Any) -> Files:
    """The charts BENCHMARKS.md shows, served beside its page."""
    for chart in sorted((ROOT / "bench-out").glob("*.png")):
        files.append(File(f"bench-out/{chart.name}", str(ROOT), config["site_dir"], config["use_directory_urls"]))
    return files
