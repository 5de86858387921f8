"""What every case shares: the run's settings, the result rows, and the long-lived systems under test.

Loading the model takes seconds, and the comparisons only hold if their
points are measured close together, so the systems that carry the model
(the limit process, the zbatch stack, the two baselines) start once, stay up
while their points alternate in rounds, and are stopped when no remaining
case needs them (``Context.release``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from scripts.benchmarks.common import procs
from scripts.benchmarks.common.procs import MODEL
from scripts.benchmarks.peers import systems as peer_systems
from scripts.benchmarks.systems.limit import LimitProcess
from scripts.benchmarks.systems.stacks import (
    SERVE_WORKERS,
    Baseline,
    ZbatchStack,
    start_serve,
    start_zbatch,
    system_key,
)
from zbatch.testing import Daemons


@dataclass(frozen=True)
class Settings:
    quick: bool
    rounds: int  # model cases: each point is measured once per round, rounds alternate
    warmup_s: float
    duration_s: float
    concurrency: tuple[int, ...]  # zbatch and the baselines
    side_concurrency: tuple[int, ...]  # routing and gateway
    overload_s: float
    overload_grace_s: float
    scale_workers: tuple[int, ...]
    scale_per_worker: int  # closed-loop clients per simulated worker: two full batches in flight each

    @classmethod
    def make(cls, quick: bool) -> Settings:
        if quick:
            return cls(True, 1, 0.3, 1.0, (1, 32), (1, 32), 3.0, 6.0, (1, 8), 64)  # a smoke test (CI): seconds
        return cls(False, 3, 1.5, 6.0, (1, 8, 32, 128), (1, 32, 128), 20.0, 15.0, (1, 2, 4, 8), 64)


def row(case: str, system: str, concurrency: int | str, result: dict[str, Any], **detail: Any) -> dict[str, Any]:
    """One line of the results table; the raw measurement stays under ``detail``."""
    return {
        "case": case, "system": system, "concurrency": concurrency,
        "req_s": result.get("req_s"), "texts_s": result.get("texts_s"),
        "p50_ms": result.get("p50_ms"), "p99_ms": result.get("p99_ms"),
        "errors": result.get("errors", 0), "ratio": "", "other_cores": result.get("other_cores"),
        "detail": result | detail,
    }



@dataclass
class Context:
    settings: Settings
    rows: list[dict[str, Any]] = field(default_factory=list)
    capacities: dict[str, float] = field(default_factory=dict)  # req/s at concurrency 32, by case
    gpu_info: dict[str, Any] = field(default_factory=dict)  # the gpu case's machine and one-off figures
    _stacks: dict[str, ZbatchStack] = field(default_factory=dict)  # by system_key("zbatch", dtype)
    _limits: dict[str, LimitProcess] = field(default_factory=dict)  # by system_key("limit", dtype)
    _baselines: dict[str, Baseline] = field(default_factory=dict)
    _peers: peer_systems.PeerSystems | None = None

    def find(self, case: str, system: str | None = None, concurrency: int | str | None = None) -> dict[str, Any] | None:
        for r in self.rows:
            if r["case"] == case and system in (None, r["system"]) and concurrency in (None, r["concurrency"]):
                return r
        return None

    async def zbatch(self, dtype: str = "float32") -> ZbatchStack:
        key = system_key("zbatch", dtype)
        if key not in self._stacks:
            procs.log(f"starting the zbatch stack: broker, 1 worker (2 torch threads, {dtype}), gateway")
            self._stacks[key] = await procs.start(Daemons(), start_zbatch, dtype)
        return self._stacks[key]

    async def serve(self, runtime: str = "") -> ZbatchStack:
        """The stack as ``scripts/serve`` ships it (system key "serve"), or with its workers' ``--runtime``
        set (system key "serve-RUNTIME")."""
        key = f"serve-{runtime}" if runtime else "serve"
        if key not in self._stacks:
            procs.log(f"starting the scripts/serve stack: broker, {SERVE_WORKERS} workers sharing the cores, gateway"
                      + (f"; --runtime {runtime}" if runtime else ""))
            self._stacks[key] = await procs.start(Daemons(), start_serve, runtime)
        return self._stacks[key]

    async def limit(self, dtype: str = "float32", runtime: str = "torch") -> LimitProcess:
        """The model called directly (system key "limit", "limit-bfloat16", or "limit-onnx" on ONNX Runtime)."""
        key = system_key("limit", dtype) + ("" if runtime == "torch" else f"-{runtime}")
        if key not in self._limits:
            procs.log(f"starting the limit process (the model called directly, {dtype}, {runtime})")
            self._limits[key] = await LimitProcess.start(dtype=dtype, runtime=runtime)
        return self._limits[key]

    async def baseline(self, mode: str) -> Baseline:
        """The Hugging Face guide's server, ``naive`` or ``batched`` (see systems/baselines.py)."""
        if mode not in self._baselines:
            procs.log(f"starting baseline-{mode} (loads the model)")
            daemons = Daemons()
            url = await procs.start(daemons, procs.start_http_server, procs.BASELINES,
                                    f"baseline-{mode}", mode, "--threads", "2")
            self._baselines[mode] = Baseline(daemons, f"{url}/models/{MODEL}")
        return self._baselines[mode]

    async def peers(self) -> peer_systems.PeerSystems:
        """The other serving frameworks (see peers/systems.py), checked against the float32 zbatch stack's answers."""
        if self._peers is None:
            stack = await self.zbatch()
            self._peers = await peer_systems.start(stack.url)
        return self._peers

    async def release(self, keep: set[str]) -> None:
        """Stop the long-lived systems not named in ``keep`` (system keys, "naive", "batched" or "peers")."""
        if self._peers is not None and "peers" not in keep:
            procs.log("stopping the peers")
            self._peers.close()
            self._peers = None
        for key in [k for k in self._stacks if k not in keep]:
            procs.log(f"stopping the {key} stack")
            procs.stop(self._stacks.pop(key).daemons)
        for key in [k for k in self._limits if k not in keep]:
            await self._limits.pop(key).close()
        for mode in [m for m in self._baselines if m not in keep]:
            procs.stop(self._baselines.pop(mode).daemons)
