"""The batch delay against the clients' round trip, on a simulated accelerator behind the real worker.

``python -m scripts.benchmarks.studies.delay [--delays 0,2,5] [--concurrency 8,32] [--batch-ms 20] [--item-ms 0.2]
[--tokenize none|inline|ahead]`` prints a Markdown table: for each
``--max-batch-delay-ms``, the throughput of closed-loop clients (the
project's AsyncClient) over what full batches would give, and the batch
sizes the worker ran.  The worker, broker and policy are the real ones; only
the model is replaced by :class:`~scripts.benchmarks.systems.accelerator.SleepRunner`, which costs a fixed time per
batch plus a little per item, like a GPU, and uses no CPU.  Not a case of
``scripts/bench``: it answers an operator's question (how long a delay does
a GPU host need?), and the answer is in docs/deployment/gpu-hosts.md.

With ``--tokenize`` the simulated model takes real texts through the real
tokenizer of the bundled model first (:class:`~scripts.benchmarks.systems.accelerator.TokenizingSleepRunner`, a text
runner whose forward pass sleeps): ``ahead`` as the worker runs text models,
encoding and planning in the preparation pool while the model runs
(:mod:`worker.stages`); ``inline`` with the same work done by the inference
thread before each batch, as a runner without the three steps is run.  The
difference is what tokenizing in the model's shadow buys.

Why it matters: if the delay is shorter than the time the last batch's
clients take to send again, one early client's item runs alone and the rest
form the next batch, and the two alternate for good.  With a fixed cost per
batch that halves throughput (see :mod:`worker.batching`).
"""

from __future__ import annotations

import argparse

from scripts.benchmarks.systems.accelerator import BATCH_MS, ITEM_MS, MAX_BATCH, RUNNERS, measure
from worker.runners.spec import DEFAULT_MODEL_NAME
from zbatch.runtime import eventloop


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--delays", default="0,2,5", help="comma-separated --max-batch-delay-ms values")
    parser.add_argument("--concurrency", default="8,32", help="comma-separated numbers of closed-loop clients")
    parser.add_argument("--seconds", type=float, default=8.0, help="measuring time per cell")
    parser.add_argument("--batch-ms", type=float, default=BATCH_MS, help="the simulated model's cost per batch")
    parser.add_argument("--item-ms", type=float, default=ITEM_MS, help="and per item in a batch")
    parser.add_argument("--tokenize", choices=tuple(RUNNERS), default="none",
                        help="real texts through the real tokenizer first: in the model's shadow (ahead) or on "
                             "the inference thread before each batch (inline)")
    args = parser.parse_args()
    print(f"Simulated accelerator: {args.batch_ms:g} ms per batch + {args.item_ms:g} ms per item, "
          f"batches of up to {MAX_BATCH}" + ("." if args.tokenize == "none" else
                                             f"; texts tokenized {args.tokenize} ({DEFAULT_MODEL_NAME}'s tokenizer)."))
    print("\n| delay ms | clients | req/s | over full batches | p50 ms | batch sizes (size: count) |")
    print("|---|---|---|---|---|---|")
    for delay in (float(d) for d in args.delays.split(",")):
        for concurrency in (int(c) for c in args.concurrency.split(",")):
            cell = eventloop.run(measure(delay, concurrency, args.seconds, args.batch_ms, args.item_ms,
                                         args.tokenize))
            sizes = ", ".join(f"{size}: {count}" for size, count in cell["batches"].get("histogram", {}).items())
            print(f"| {delay:g} | {concurrency} | {cell['req_s']:.0f} | {cell['req_s'] / cell['ideal']:.2f}× | "
                  f"{cell['p50_ms']:.1f} | {sizes} |", flush=True)


if __name__ == "__main__":
    main()
