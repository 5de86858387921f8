"""Infinity with ``--engine optimum``: the same server, the model run by ONNX Runtime through Hugging Face Optimum.

What a CPU user picks for speed: infinity exports the model to ONNX with Optimum on first start (into
its own cache beside the model, or the Hugging Face cache), lets ONNX Runtime optimize the graph, and
pools and normalizes with numpy.  Everything else is :mod:`scripts.benchmarks.peers.infinity_server`'s.
"""

from __future__ import annotations

from scripts.benchmarks.peers.infinity_server import main

if __name__ == "__main__":
    main("optimum")
