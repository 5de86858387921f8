"""Infinity with ``--engine optimum``: the same server, the model run by ONNX Runtime through Hugging Face Optimum.

What a CPU user picks for speed.  Infinity's optimum engine loads an ONNX file from the model's folder
(it exports nothing itself for a local folder), so this script first does what its documentation asks
of the user: Optimum's exporter (``optimum-cli export onnx``'s ``main_export``) writes ``model.onnx``
into a copy of the folder (links to the model's files) under the bench's cache, once.  Infinity then has
Optimum's ORTOptimizer fuse the graph (its level 99) and pools and normalizes with numpy.  Everything else is
:mod:`scripts.benchmarks.peers.infinity_server`'s.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

from scripts.benchmarks.peers import MAX_TOKENS, arguments
from scripts.benchmarks.peers.infinity_server import main


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


if __name__ == "__main__":
    args = arguments(__doc__.splitlines()[0])
    # infinity 0.0.78 names the ONNX file by the path it globbed in the folder, and Optimum 2 wants it relative
    # to the folder: serve the folder as "." from inside it.
    os.chdir(exported_folder(args.model))
    sys.argv[sys.argv.index("--model") + 1] = "."
    main("optimum")
