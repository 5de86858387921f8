"""scripts/fuzz/run: both targets side by side, each one's output shown whole, and a failure of either fails the run."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from zbatch.testing import ROOT

pytest.importorskip("atheris", reason="atheris has no wheel for this platform; scripts/test skips the fuzzing too")
TARGETS = ("protocol", "worker")


def fuzz(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = os.environ | {"ZBATCH_FUZZ_DIR": str(folder)}
    return subprocess.run(["bash", str(ROOT / "scripts" / "fuzz" / "run"), *args], env=env, capture_output=True,
                          text=True, timeout=300, check=False)


def test_both_targets_run_and_each_reports_its_own_run(tmp_path: Path) -> None:
    result = fuzz(tmp_path, "-max_total_time=1")
    assert result.returncode == 0, result.stderr[-2000:]
    for target in TARGETS:
        assert f"zbatch: fuzzing {target}\n" in result.stderr
        assert list((tmp_path / target / "seeds").iterdir()), f"{target} wrote no seeds"
    assert result.stderr.count("stat::number_of_executed_units") == len(TARGETS)


def test_a_target_that_fails_fails_the_run_and_is_named(tmp_path: Path) -> None:
    # libFuzzer refuses a dictionary that does not exist before it runs an input: a failure of both, made quickly.
    result = fuzz(tmp_path, "-max_total_time=1", f"-dict={tmp_path / 'missing.dict'}")
    assert result.returncode != 0
    for target in TARGETS:
        assert f"zbatch: fuzzing {target} failed (exit " in result.stderr
