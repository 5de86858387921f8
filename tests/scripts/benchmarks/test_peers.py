"""The bench's peers as it starts them (scripts/benchmarks/peers/): infinity's ONNX engine through its own CLI.

Infinity is not installed for the tests: the CLI's start is checked with a stand-in ``infinity_emb`` (a fake, named
so) that records how it was started, in place of the program the peer's venv holds.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from scripts.benchmarks.peers import MAX_BATCH, MODEL_NAME, TORCH_THREADS
from scripts.benchmarks.peers.infinity_onnx_server import command
from scripts.benchmarks.peers.systems import PEERS
from zbatch.testing import ROOT

# The command the issue compares zbatch with, flag for flag.
ISSUE_FLAGS = ["v2", "--model-id", ".", "--engine", "optimum", "--pooling-method", "mean", "--batch-size", "32",
               "--device", "cpu"]
STAND_IN = """#!{python}
import json, os, sys
with open(os.environ["STAND_IN_RECORD"], "w") as out:
    json.dump({{"argv": sys.argv[1:], "cwd": os.getcwd(), "pid": os.getpid(),
               "env": {{k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "DO_NOT_TRACK")}}}}, out)
"""


def test_the_onnx_peer_runs_the_issues_infinity_command_from_its_venv() -> None:
    cli = command(8123, python="/venvs/infinity_onnx/bin/python")
    assert cli[0] == "/venvs/infinity_onnx/bin/infinity_emb"
    assert cli[1:len(ISSUE_FLAGS) + 1] == ISSUE_FLAGS and MAX_BATCH == 32
    assert cli[len(ISSUE_FLAGS) + 1:] == ["--served-model-name", MODEL_NAME, "--host", "127.0.0.1", "--port", "8123"]


def test_the_onnx_peer_becomes_the_cli_in_the_exported_folder_keeping_its_pid(tmp_path: Path) -> None:
    """The harness pauses, meters and stops the pid it started: the script must exec the CLI, not run it below."""
    model = tmp_path / "model"
    model.mkdir()
    exported = tmp_path / "cache" / "infinity-onnx-models" / "model"
    exported.mkdir(parents=True)
    (exported / "model.onnx").write_bytes(b"")  # exported already: no Optimum needed
    venv_bin = tmp_path / "venv" / "bin"
    venv_bin.mkdir(parents=True)
    (venv_bin / "python").symlink_to(sys.executable)
    stand_in = venv_bin / "infinity_emb"
    stand_in.write_text(STAND_IN.format(python=sys.executable))
    stand_in.chmod(0o755)
    record = tmp_path / "record.json"
    env = os.environ | {"ZBATCH_BENCH_CACHE": str(tmp_path / "cache"), "STAND_IN_RECORD": str(record),
                        "PYTHONPATH": str(ROOT)}
    process = subprocess.Popen([str(venv_bin / "python"), "-m", "scripts.benchmarks.peers.infinity_onnx_server",
                                "--port", "8124", "--model", str(model)], cwd=ROOT, env=env)
    assert process.wait(timeout=60) == 0
    started = json.loads(record.read_text())
    assert started["pid"] == process.pid
    assert Path(started["cwd"]) == exported.resolve()
    assert started["argv"] == command(8124)[1:]
    assert started["env"] == {"OMP_NUM_THREADS": str(TORCH_THREADS), "DO_NOT_TRACK": "1"}


def test_the_onnx_peer_is_served_by_that_command_on_infinitys_route() -> None:
    [peer] = [p for p in PEERS if p.name == "infinity_onnx"]
    assert peer.module == "scripts.benchmarks.peers.infinity_onnx_server"
    assert (peer.path, peer.ready) == ("/embeddings", "/health")
    assert peer.body("a text") == {"model": MODEL_NAME, "input": ["a text"]}
    assert " ".join(ISSUE_FLAGS) in peer.setup
