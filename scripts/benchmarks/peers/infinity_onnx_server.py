"""Infinity with ``--engine optimum``, started by its own ``infinity_emb v2`` command, as a user starts it.

What a CPU user picks for speed: the model run by ONNX Runtime through Hugging Face Optimum.  Infinity's
optimum engine loads an ONNX file from the model's folder (it exports nothing itself for a local folder),
so this script first does what its documentation asks of the user: Optimum's exporter
(``optimum-cli export onnx``'s ``main_export``) writes ``model.onnx`` into a copy of the folder (links to
the model's files) under the bench's cache, once.  Then it replaces itself (``exec``, so the harness's pid,
signals and CPU meter stay the server's) with the venv's ``infinity_emb v2 --model-id . --engine optimum
--pooling-method mean --batch-size 32 --device cpu`` (:func:`command`), run from inside that folder: the
command of the issue that compares it, plus where to listen and the name to serve under.  Infinity then asks
Optimum's ORTOptimizer to fuse the graph (its level 99); with the optimum-onnx that its ``optimum`` extra
installs now, that call fails (its log says "Optimization failed") and infinity serves the exported graph,
which ONNX Runtime optimizes on load at its default level, as it would for a user who ran the same command.
It pools and normalizes with numpy, uvicorn serving on uvloop and httptools at the CLI's default log level.
Threads: ``OMP_NUM_THREADS`` and its kin are :data:`~scripts.benchmarks.peers.TORCH_THREADS`, as for every peer; ONNX
Runtime's own pool, which no infinity flag sets, takes one thread per physical core, the two of this host.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

from scripts.benchmarks.peers import MAX_BATCH, MAX_TOKENS, MODEL_NAME, arguments, limit_threads


def exported_folder(model: str) -> str:
    """A folder holding the model's files and Optimum's ONNX export of it (made on first use)."""
    cache = Path(os.environ.get("ZBATCH_BENCH_CACHE") or Path.home() / ".cache" / "zbatch-bench")
    folder = cache / "infinity-onnx-models" / Path(model).resolve().name
    if (folder / "model.onnx").is_file():
        return str(folder)
    from optimum.exporters.onnx import main_export

    folder.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(dir=folder.parent))
    for item in Path(model).resolve().iterdir():
        (work / item.name).symlink_to(item)
    # library "transformers": the output is last_hidden_state, which infinity pools (not sentence-transformers')
    main_export(str(work), output=str(work / "export"), task="feature-extraction", device="cpu",
                library_name="transformers")
    (work / "export" / "model.onnx").rename(work / "model.onnx")  # where Optimum looks, beside the weights
    shutil.rmtree(work / "export")
    # The optimum engine truncates at the config's max_position_embeddings (512); every peer truncates at the
    # model's 256 tokens, as sentence-transformers does, so this copy's config says 256.
    config = json.loads((work / "config.json").read_text())
    (work / "config.json").unlink()
    (work / "config.json").write_text(json.dumps(config | {"max_position_embeddings": MAX_TOKENS}, indent=1))
    shutil.rmtree(folder, ignore_errors=True)
    work.rename(folder)
    return str(folder)


def command(port: int, python: str = sys.executable) -> list[str]:
    """The ``infinity_emb v2`` command line of the venv of ``python``, serving the folder it runs in on ``port``.

    The model is ``.``: infinity 0.0.78 names the ONNX file by the path it globbed in the folder, and Optimum 2
    wants it relative to the folder.
    """
    return [str(Path(python).with_name("infinity_emb")), "v2", "--model-id", ".", "--engine", "optimum",
            "--pooling-method", "mean", "--batch-size", str(MAX_BATCH), "--device", "cpu",
            "--served-model-name", MODEL_NAME, "--host", "127.0.0.1", "--port", str(port)]


def main() -> None:
    """Export the model if needed, then become infinity's CLI serving it."""
    args = arguments(__doc__.splitlines()[0])
    folder = exported_folder(args.model)
    limit_threads()
    os.environ["DO_NOT_TRACK"] = "1"  # no usage statistics sent anywhere
    os.environ["INFINITY_ANONYMOUS_USAGE_STATS"] = "0"
    os.chdir(folder)
    cli = command(args.port)
    sys.stdout.flush()
    os.execv(cli[0], cli)


if __name__ == "__main__":
    main()
