"""The stacks that carry the model, as the cases share them: zbatch (one worker, or ``scripts/serve``'s shape)
and the Hugging Face guide's servers.

Loading the model takes seconds, so a run starts each of these once and keeps it up while the
cases that use it run (:class:`scripts.benchmarks.cases.context.Context` owns them).
"""

from __future__ import annotations

from dataclasses import dataclass

from scripts.benchmarks.common import batches, procs
from scripts.benchmarks.common.procs import MODEL
from zbatch.testing import Daemons, broker_stats, start_broker

IDLE_TIMEOUT_S = 60.0
SERVE_WORKERS = 2  # scripts/serve's default ZBATCH_WORKERS

@dataclass
class ZbatchStack:
    """Broker, ONE worker (2 torch threads, Prometheus metrics on) and the gateway, as deployed; or the
    workers of ``scripts/serve`` (:func:`start_serve`), whose batches add up."""

    daemons: Daemons
    frontend: str
    url: str
    metrics_urls: list[str]

    async def batches(self) -> batches.Snapshot:
        return await batches.snapshots(self.metrics_urls)

    async def wait_idle(self) -> None:
        """Until the broker holds no work: a storm's cancelled leftovers must not run into the next measurement."""
        def idle() -> bool:
            stats = broker_stats(self.frontend)
            if stats is None:
                return False
            backlog = sum(m["backlog_items"] for m in stats["models"].values())
            return backlog == 0 and all(w["in_flight"] == 0 for w in stats["workers"])

        await procs.blocking(self.daemons.wait, idle, "the zbatch stack to finish its leftover work", IDLE_TIMEOUT_S)


def start_zbatch(daemons: Daemons, dtype: str) -> ZbatchStack:
    """Broker, one real worker in ``dtype`` and the gateway, into ``daemons``."""
    broker = daemons.add(start_broker(daemons.log_dir))
    worker = procs.start_model_worker(daemons, broker, dtype)
    url = procs.start_deployed_gateway(daemons, broker)
    return ZbatchStack(daemons, broker.frontend, f"{url}/models/{MODEL}", [worker.endpoints["metrics"]])


def start_serve(daemons: Daemons, runtime: str = "") -> ZbatchStack:
    """What ``scripts/serve`` starts: a broker, its default 2 workers and the gateway with its default settings
    (``--processes 0``: one process per core), into ``daemons``; ``runtime``: the workers' ``--runtime``
    ("": their default)."""
    broker = daemons.add(start_broker(daemons.log_dir))
    flags = {"runtime": runtime} if runtime else {}
    workers = procs.start_serve_workers(daemons, broker, SERVE_WORKERS, **flags)
    url = procs.start_deployed_gateway(daemons, broker, processes=0)  # the gateway's default: one per core
    return ZbatchStack(daemons, broker.frontend, f"{url}/models/{MODEL}",
                       [worker.endpoints["metrics"] for worker in workers])


@dataclass
class Baseline:
    daemons: Daemons
    url: str  # POST one text here


def system_key(kind: str, dtype: str) -> str:
    """A long-lived system's name in ``Context.release``: "zbatch", "limit", or e.g. "zbatch-bfloat16"."""
    return kind if dtype == "float32" else f"{kind}-{dtype}"

