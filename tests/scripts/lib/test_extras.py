"""scripts/lib/extras.py: which installed extras already take the ones a script asks for (scripts/lib/venv.sh)."""

from __future__ import annotations

import subprocess
import sys

from scripts.lib.extras import taken
from zbatch.testing import ROOT

EXTRAS = {"worker": ["torch>=2.1"], "onnx": ["onnxruntime"], "test": ["zbatch[worker,onnx]", "pytest"],
          "bench": ["zbatch[test]", "matplotlib"], "docs": ["mkdocs"]}


def test_an_extra_takes_the_extras_it_references_transitively() -> None:
    assert taken(EXTRAS, ["bench"]) == {"bench", "test", "worker", "onnx"}
    assert taken(EXTRAS, ["test", "docs"]) == {"test", "worker", "onnx", "docs"}
    assert taken(EXTRAS, [""]) == set()


def run(installed: str, wanted: str) -> int:
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "lib" / "extras.py"), str(ROOT / "pyproject.toml"),
                           installed, wanted]).returncode


def test_the_projects_bench_extras_serve_the_tests_and_serve_but_not_the_other_way_round() -> None:
    assert run("bench", "test") == 0
    assert run("test", "worker,onnx,grpc") == 0  # scripts/serve's, in a venv scripts/test made
    assert run("test", "bench") == 1
    assert run("", "test") == 1  # nothing installed yet
