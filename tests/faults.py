"""FAKE FAULTS for tests: runners that break the worker process in ways a real model cannot be made to.

A real model that kills its process on one input cannot be produced on
demand, so this wraps the real embeddings runner and exits the process
(no cleanup, like a segfault), hangs, or ends the inference thread (as model
code calling ``sys.exit()`` would) when it sees a marker input.  The workers
load it through the ``python:module:Class`` task form.

Two more lie about the tokenizer a gateway may tokenize with (zbatch/client/tokenizing.py),
which no honest worker does: one announces one tokenizer and sends another,
one announces something that is not a tokenizer at all.
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any

from worker.runners.embeddings import EmbeddingRunner
from zbatch.protocol.payloads import tokenizer_fingerprint

CRASH_MARKER = "FAULT: crash the worker"
HANG_MARKER = "FAULT: hang the worker"
END_THREAD_MARKER = "FAULT: end the inference thread"


MARKERS = (CRASH_MARKER, HANG_MARKER, END_THREAD_MARKER)


class FaultInjectingEmbeddings(EmbeddingRunner):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        """Announce no tokenizer (zbatch/client/tokenizing.py), so that the markers reach the worker as texts."""
        super().__init__(*args, **kwargs)
        self._edge_form = ""
        self.details = dataclasses.replace(self.details, tokenizer="")

    def encode(self, inputs: list[Any], parameters: dict[str, Any]) -> list[Any]:
        """A batch with a marker cannot be encoded ahead, so the inference thread runs it the plain way
        (:meth:`run`), where the fault happens, whichever thread encodes."""
        if any(marker in inputs for marker in MARKERS):
            raise ValueError("FAKE: a fault marker, for run()")
        return super().encode(inputs, parameters)

    def run(self, inputs: list[str], parameters: dict[str, Any]) -> list[Any]:
        if CRASH_MARKER in inputs:
            os._exit(139)
        if HANG_MARKER in inputs:
            time.sleep(3600)
        if END_THREAD_MARKER in inputs:
            raise SystemExit("FAKE: the model's code called sys.exit()")  # a BaseException: the thread ends
        return super().run(inputs, parameters)


class MisfingerprintedTokenizer(EmbeddingRunner):
    """FAKE: announces the fingerprint of its tokenizer with one vocabulary entry renamed, then sends its own."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        announced = tokenizer_fingerprint(self._edge_form.replace('"hello"', '"jello"', 1))
        self.details = dataclasses.replace(self.details, tokenizer=announced)


class UnreadableTokenizer(EmbeddingRunner):
    """FAKE: announces, under its true fingerprint, a "tokenizer" that is JSON but not a tokenizer."""

    NOT_A_TOKENIZER = '{"version": "1.0", "model": "none at all"}'

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._edge_form = self.NOT_A_TOKENIZER
        self.details = dataclasses.replace(self.details, tokenizer=tokenizer_fingerprint(self.NOT_A_TOKENIZER))
