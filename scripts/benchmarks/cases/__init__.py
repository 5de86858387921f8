"""The cases of ``scripts/bench``: one module per case or family of cases, each saying how it measures.

``context`` is what every case is handed: the run's settings, the result rows, and the long-lived
systems that several cases share.  The model cases (``model``, with ``onnx`` and ``peers``) run
together in rounds; every other case runs on its own.  README.md beside this package maps each
case name to its module.
"""
