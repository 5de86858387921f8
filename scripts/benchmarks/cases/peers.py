"""The peers case: zbatch next to other serving frameworks, each serving the same model the same way.

Infinity, mosec and Triton (through PyTriton, the real ``tritonserver`` and its dynamic batcher)
are the peers the issue names; LitServe and Ray Serve join them, and infinity again with its ONNX
engine (``--engine optimum``, issue 34).  Each runs from a small server script of ours
(``scripts/benchmarks/peers/``, written from the peer's documentation) in its own virtual
environment; :mod:`scripts.benchmarks.peers.systems` installs, starts and checks them.  All serve
all-MiniLM-L6-v2 from the same folder with zbatch's settings as ``scripts/serve`` ships them: at
most 32 items a batch, about 5 ms batching wait, 2 torch threads, truncation at 256 tokens, mean
pooling, L2 norm; a peer whose vectors differ from zbatch's is left out.

The points run in the model cases' rounds (:mod:`scripts.benchmarks.cases.model`): at each
concurrency zbatch over HTTP, as ``scripts/serve`` ships it (two workers sharing the cores through
their cores ledger, the gateway's default settings) and with one worker, then each peer, with the
bench's closed-loop aiohttp load generator and texts, one text per request, a warm-up before each
point.  A peer is thawed only while it is measured.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from scripts.benchmarks.common import procs
from scripts.benchmarks.common.texts import shuffled
from scripts.benchmarks.load.calls import http_call, http_session
from scripts.benchmarks.load.loops import closed_loop
from scripts.benchmarks.peers.systems import PeerSystems, RunningPeer

CASE = "peers"
ZBATCH = "zbatch, scripts/serve (2 workers)"  # zbatch as shipped: the row the targets hold to the peers
ZBATCH_ONE = "zbatch, 1 worker"  # the one-worker stack of the other model cases, for comparison
ZBATCH_ROWS = (ZBATCH, ZBATCH_ONE)

Measure = Callable[[], Awaitable[dict[str, Any]]]


def makers(warmup_s: float, duration_s: float, systems: PeerSystems) -> list[tuple[str, Callable[[int], Measure]]]:
    """One closed-loop measure-maker per running peer, by system name; each thaws its peer only while it runs."""
    def maker_of(running: RunningPeer) -> Callable[[int], Measure]:
        def maker(c: int) -> Measure:
            async def measure() -> dict[str, Any]:
                procs.resume(running.daemons)
                try:
                    async with http_session(limit=c) as session:
                        call = http_call(session, running.url, shuffled(), body=running.peer.body)
                        return await closed_loop(call, c, warmup_s, duration_s, watch=running.daemons.pids())
                finally:
                    procs.pause(running.daemons)
            return measure
        return maker

    return [(running.system, maker_of(running)) for running in systems.running]


def pair(rows: list[dict[str, Any]]) -> None:
    """Ratios within each round for the peers case (detail ``paired``), then their median over the rounds.

    Each zbatch row gets ``vs_best_peer`` (its texts/s over the fastest peer's in the same round) and
    ``best_peer`` (the peer with the highest median texts/s at that concurrency); each peer row gets
    ``vs_zbatch`` (its texts/s over zbatch as shipped, :data:`ZBATCH`, in the same round).
    """
    import statistics

    by_c: dict[Any, dict[str, dict[str, Any]]] = {}
    for r in rows:
        if r["case"] == CASE and r["detail"].get("rounds"):
            by_c.setdefault(r["concurrency"], {})[r["system"]] = r
    for systems in by_c.values():
        peers = {name: r for name, r in systems.items() if name not in ZBATCH_ROWS}
        shipped = systems.get(ZBATCH)
        if shipped is not None:
            ours = shipped["detail"]["rounds"]
            for r in peers.values():
                ratios = [a["texts_s"] / b["texts_s"] for a, b in zip(r["detail"]["rounds"], ours, strict=False)
                          if a.get("texts_s") and b.get("texts_s")]
                r["detail"]["paired"] = {"vs_zbatch": statistics.median(ratios)} if ratios else {}
        for zbatch in (systems[name] for name in ZBATCH_ROWS if name in systems):
            ours = zbatch["detail"]["rounds"]
            best = [max((r["detail"]["rounds"][i].get("texts_s") or 0.0 for r in peers.values()
                         if i < len(r["detail"]["rounds"])), default=0.0) for i in range(len(ours))]
            ratios = [one["texts_s"] / top for one, top in zip(ours, best, strict=True)
                      if one.get("texts_s") and top]
            paired: dict[str, Any] = {"vs_best_peer": statistics.median(ratios)} if ratios else {}
            if peers:
                paired["best_peer"] = max(peers, key=lambda name: peers[name]["texts_s"] or 0.0)
            zbatch["detail"]["paired"] = paired
