"""``python -m scripts.benchmarks.studies.ort_threads``: ONNX Runtime's thread counts under the cores ledger's rule.

ORT fixes a session's intra-op threads when the session is made, so a worker
cannot shrink a session to the cores the ledger grants it.  This measures the
options side by side, with the worker's own runner (``runtime onnx``) on the
bench's texts, each process running batches in a closed loop for the same
seconds:

* ``1 worker``: one process alone on its 2-thread session and on its 1-thread
  one (what a lone busy worker gets, and what it would get from a fixed split);
* ``2 workers, ledger``: two processes side by side, each on its 1-thread
  session (the ledger's share when both are busy: what zbatch does);
* ``2 workers, fixed 2 threads``: both on 2-thread sessions, 4 threads on 2
  cores (what one session per worker, made for the lone case, would do).

Printed as a Markdown table of texts/s summed over the processes.  With
``--idle``: instead, what ORT's idle threads cost between batches, for each
spinning setting: a 2-thread session runs batch 1, then waits 20 ms, 40 times;
the CPU the process burns while it waits is what a worker would take from the
cores the ledger hands to the next one.
"""

from __future__ import annotations

import argparse
import itertools
import multiprocessing
import time
from typing import Any

BATCH_SIZES = (1, 8, 32)


def _run(threads: int, batch_size: int, seconds: float, start: Any, results: Any) -> None:
    import torch

    from scripts.benchmarks.common.texts import shuffled
    from scripts.benchmarks.systems.model import load

    runner = load(2, grouped=True, runtime="onnx")
    torch.set_num_threads(threads)  # as the inference thread does: the session of this count runs
    texts = itertools.cycle(shuffled())
    for _ in range(3):
        runner.run([next(texts) for _ in range(batch_size)], {})
    start.wait()
    done, began = 0, time.perf_counter()
    while time.perf_counter() - began < seconds:
        runner.run([next(texts) for _ in range(batch_size)], {})
        done += batch_size
    results.put(done / (time.perf_counter() - began))


def measure(processes: int, threads: int, batch_size: int, seconds: float) -> float:
    """Texts/s of ``processes`` processes side by side, each on its ``threads``-thread session."""
    context = multiprocessing.get_context("spawn")
    start = context.Barrier(processes + 1)
    results = context.Queue()
    workers = [context.Process(target=_run, args=(threads, batch_size, seconds, start, results))
               for _ in range(processes)]
    for worker in workers:
        worker.start()
    start.wait()
    total = sum(results.get(timeout=seconds + 600) for _ in workers)
    for worker in workers:
        worker.join()
    return float(total)


SPIN_SETTINGS: tuple[tuple[str, dict[str, str]], ...] = (
    ("spinning (ORT's default)", {}),
    ("force_spinning_stop", {"session.force_spinning_stop": "1"}),
    ("no spinning (zbatch)", {"session.intra_op.allow_spinning": "0"}))


def idle_cost(gap_s: float = 0.02, runs: int = 40) -> None:
    """Per spinning setting: a batch-1 run's time and the CPU burnt in the gap after it."""
    import onnxruntime

    from scripts.benchmarks.systems.model import load

    runner = load(2, runtime="onnx")
    arrays = runner._pad(runner.encode(["a short text to embed"], {}))  # type: ignore[arg-type]  # refuses none
    feed = runner._model.feed(arrays)
    print("| ORT setting, 2 threads | ms a run | CPU ms burnt in the 20 ms after each run |")
    print("|---|---|---|")
    for name, entries in SPIN_SETTINGS:
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads, options.inter_op_num_threads = 2, 1
        for key, value in entries.items():
            options.add_session_config_entry(key, value)
        session = onnxruntime.InferenceSession(str(runner._model.path), options, providers=["CPUExecutionProvider"])
        session.run(None, feed)
        run_s = idle_s = 0.0
        for _ in range(runs):
            began = time.perf_counter()
            session.run(None, feed)
            run_s += time.perf_counter() - began
            cpu = time.process_time()
            time.sleep(gap_s)
            idle_s += time.process_time() - cpu
        print(f"| {name} | {run_s / runs * 1000:.1f} | {idle_s / runs * 1000:.2f} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--idle", action="store_true", help="measure the idle threads' CPU between batches instead")
    args = parser.parse_args()
    if args.idle:
        idle_cost()
        return
    shapes = (("1 worker, 2 threads", 1, 2), ("1 worker, 1 thread", 1, 1), ("2 workers, ledger (1 thread each)", 2, 1),
              ("2 workers, fixed 2 threads each", 2, 2))
    print("| processes | " + " | ".join(f"batch {b}, texts/s" for b in BATCH_SIZES) + " |")
    print("|---|" + "---|" * len(BATCH_SIZES))
    for name, processes, threads in shapes:
        rates = [measure(processes, threads, b, args.seconds) for b in BATCH_SIZES]
        print(f"| {name} | " + " | ".join(f"{rate:.0f}" for rate in rates) + " |", flush=True)


if __name__ == "__main__":
    main()
