"""What padding costs a model on this host: calibrated once per model, runtime, device, thread count and CPU, and
kept for the next start.

Theory of operation
-------------------
Warm-up fits the cost model of :mod:`worker.runners.grouping` from a few
timed passes (:func:`~worker.runners.grouping.calibrate`).  The fit is a
record of the start cache (:mod:`worker.runners.start_cache`,
``calibrations/`` in ``--onnx-cache``), keyed on what the timings depend on
(:func:`key_of`): the model's config and weights, what runs them (torch and
whether it packs, or ONNX Runtime and its graph), the device and dtype, the
thread count, the CPU and its core count, and the shapes calibration times.

The thread governor (:mod:`worker.threads`) reads a calibration as what a
batch takes on a quiet host, so a start that finds a record still times the
short shape, which costs a few milliseconds.  If it runs clearly faster than
when the record was made (under :data:`QUIETER` of the kept time), the host
was busier then: the whole calibration runs again and replaces the record.
A busy start keeps a quiet record, and a record made while the host was busy
is replaced by the next quiet start.  On a host busy at every start, such a
record stays, and the governor's own floor (rule 5 of
:mod:`worker.threads`) takes over from it once quieter batches show it.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from worker.runners import phases, start_cache
from worker.runners.device import cpu_identity
from worker.runners.grouping import CALIBRATION_LONG, CALIBRATION_RUNS, CALIBRATION_SHORT, CostModel, calibrate
from worker.runners.onnx_export import cache_dir, model_digest
from worker.runners.start_cache import Record, RecordKey

log = logging.getLogger("zbatch.worker")

KIND = "calibrations"
QUIETER = 0.8  # a short pass under this share of the kept one: the record was made on a busier host
SecondsFor = Callable[[int, int], float]


def key_of(runner: Any) -> RecordKey:
    """A text runner's calibration record (:class:`~worker.runners.text.TextRunner`): its model's config and
    weights, what runs them, the device, dtype and thread count, and the CPU."""
    import torch

    graph = getattr(runner._model, "path", None)  # ONNX Runtime's graph (worker.runners.onnx_session.OrtModel)
    runs: dict[str, Any] = {"runtime": getattr(runner, "runtime", f"torch {torch.__version__}"),
                            "packed": runner._packer is not None and runner._length_grouping}
    if isinstance(graph, Path):
        stat = graph.stat()
        runs["graph"] = [str(graph), stat.st_size, stat.st_mtime_ns]
    device = runner.device
    if device.startswith("cuda"):
        device = f"{device} {torch.cuda.get_device_name(device)}"
    spec = runner.spec
    parts = {"model": model_digest(spec.path), "runner": f"{type(runner).__module__}.{type(runner).__qualname__}",
             "runs": runs, "device": device, "dtype": runner.details.dtype, "threads": torch.get_num_threads(),
             "cpu": cpu_identity(), "cores": os.cpu_count()}
    return key_for(cache_dir(spec.onnx_cache), Path(spec.path).name, parts)


def key_for(cache: Path, name: str, parts: Mapping[str, Any]) -> RecordKey:
    """The record of a calibration: ``parts`` say what runs (the runner's), the shapes timed are added here."""
    shapes = {"short": CALIBRATION_SHORT, "long": CALIBRATION_LONG, "runs": CALIBRATION_RUNS}
    return RecordKey(cache, KIND, name, {**parts, "shapes": shapes})


def calibrated(key: RecordKey, seconds_for: SecondsFor) -> CostModel:
    """The cost model of ``key``: kept from an earlier start if this host is not quieter now, else measured now
    (by ``seconds_for(rows, tokens)``, one timed pass) and kept."""
    with start_cache.once(key, _usable) as record:
        if record is None:
            return _measured(key, seconds_for, "measured")
    probe = min(seconds_for(*CALIBRATION_SHORT) for _ in range(CALIBRATION_RUNS))
    if probe >= QUIETER * float(record["short_seconds"]):
        phases.note("calibration", "from the cache")
        return CostModel(float(record["overhead_tokens"]), float(record["seconds_per_token"]))
    log.info("start cache: %s was calibrated on a busier host (a short pass %.1f ms then, %.1f ms now); "
             "calibrating again", key.path, 1000 * float(record["short_seconds"]), 1000 * probe)
    with start_cache.holding(key):
        return _measured(key, seconds_for, "measured again: the host is quieter than when it was kept")


def _measured(key: RecordKey, seconds_for: SecondsFor, how: str) -> CostModel:
    shortest: list[float] = []

    def timed(rows: int, tokens: int) -> float:
        seconds = seconds_for(rows, tokens)
        if (rows, tokens) == CALIBRATION_SHORT:
            shortest.append(seconds)
        return seconds

    model = calibrate(timed)
    start_cache.write(key, {"overhead_tokens": model.overhead_tokens, "seconds_per_token": model.seconds_per_token,
                            "short_seconds": min(shortest)})
    phases.note("calibration", how)
    return model


def _usable(record: Record) -> str:
    """Why a calibration record cannot serve: numbers missing or out of range."""
    overhead, per_token, short = (float(record[name]) for name in ("overhead_tokens", "seconds_per_token",
                                                                   "short_seconds"))
    if not (overhead >= 0 and per_token >= 0 and short > 0):
        return "holds numbers no calibration gives"
    return ""
