"""The peers as the bench runs them: how to install, start, check and stop each, from the bench's side.

Each peer's server script (``scripts/benchmarks/peers/NAME_server.py``) runs in the peer's own
virtual environment, installed on demand (:mod:`scripts.benchmarks.peers.venvs`), started through the
same harness as every other system.  Before it is measured, each peer embeds a few of the bench's
texts and one longer than 256 tokens, sent at once so that they share a batch, and its vectors must
match zbatch's at cosine ≥ :data:`MIN_COSINE`: a peer that computes something else is left out, with
the reason, and so is one that fails to install or start (the others go on).  A peer is frozen
(SIGSTOP) except while it is measured: LitServe's batching loop, for one, polls every millisecond
while idle.  Unlike the server scripts, this module runs in the bench's own environment.
"""

from __future__ import annotations

import asyncio
import math
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from scripts.benchmarks.common import procs
from scripts.benchmarks.common.texts import WORDS, shuffled
from scripts.benchmarks.load.calls import gateway_body
from scripts.benchmarks.peers import MODEL_NAME, venvs
from zbatch.testing import Daemons, start_http

MIN_COSINE = 0.9999
CHECK_TEXTS = (*shuffled()[:4], " ".join(WORDS[:320]).capitalize() + ".")  # the last one is over 256 tokens
TRANSFORMERS = "transformers==5.23.0"  # the peers that run our model code run it on zbatch's transformers

Json = Any


def _triton_body(text: str) -> Json:
    return {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1, 1], "data": [text]}]}


@dataclass(frozen=True)
class Peer:
    """How to install, start and call one peer."""

    name: str  # its venv's folder, and its script: scripts/benchmarks/peers/{name}_server.py
    label: str  # the row's system name: "{label} {version}"
    distribution: str  # the package whose version names the row
    requirements: tuple[str, ...]
    path: str  # POST one text here
    ready: str  # GET answers 200 here once it serves
    body: Callable[[str], Json]  # one text as the peer's API takes it
    vector: Callable[[Json], list[float]]  # the embedding in the peer's answer
    setup: str = ""  # how it serves, in a few words, for BENCHMARKS.md
    libpython: bool = False  # links the interpreter's libpython: LD_LIBRARY_PATH must point at it

    @property
    def module(self) -> str:
        return f"scripts.benchmarks.peers.{self.name}_server"


PEERS = (
    Peer("infinity", "Infinity", "infinity-emb", ("infinity-emb[server,torch]==0.0.78",), "/embeddings", "/health",
         lambda text: {"model": MODEL_NAME, "input": [text]}, lambda answer: answer["data"][0]["embedding"],
         "its own FastAPI server (uvicorn, uvloop) and sentence-transformers code; batch 32, its fixed 5 ms "
         "batch_delay, a length-sorted queue; OpenAI-style /embeddings"),
    Peer("infinity_onnx", "Infinity, --engine optimum", "infinity-emb", ("infinity-emb[server,optimum,torch]==0.0.78",),
         "/embeddings", "/health", lambda text: {"model": MODEL_NAME, "input": [text]},
         lambda answer: answer["data"][0]["embedding"],
         "its own CLI, `infinity_emb v2 --model-id . --engine optimum --pooling-method mean --batch-size 32 "
         "--device cpu`, in a folder holding the model exported to ONNX by Hugging Face Optimum: ONNX Runtime "
         "(what infinity offers CPU users for speed), 5 ms batch_delay"),
    Peer("mosec", "mosec", "mosec", ("mosec==0.9.8", TRANSFORMERS), "/inference", "/", gateway_body,
         lambda answer: answer, "its Rust HTTP server and batcher (max_batch_size 32, max_wait_time 5 ms), one "
         "Python worker process, default JSON"),
    Peer("triton", "Triton via PyTriton", "nvidia-pytriton", ("nvidia-pytriton==0.7.0", TRANSFORMERS),
         f"/v2/models/{MODEL_NAME}/infer", f"/v2/models/{MODEL_NAME}/ready", _triton_body,
         lambda answer: answer["outputs"][0]["data"], "tritonserver's HTTP front end and dynamic batcher "
         "(max_batch_size 32, max_queue_delay 5 ms), its Python backend handing batches to a @batch function; "
         "KServe v2 JSON", libpython=True),
    Peer("litserve", "LitServe", "litserve", ("litserve==0.2.19", TRANSFORMERS), "/predict", "/health",
         gateway_body, lambda answer: answer, "a LitAPI (max_batch_size 32, batch_timeout 5 ms), one API server "
         "and one inference worker process"),
    Peer("rayserve", "Ray Serve", "ray", ("ray[serve]==2.60.0", TRANSFORMERS), "/embed", "/embed/healthz",
         gateway_body, lambda answer: answer, "a local Ray cluster, Serve's proxy, one replica with a @serve.batch "
         "method (max_batch_size 32, batch_wait_timeout_s 5 ms, max_ongoing_requests 64)"),
)
PEER_NAMES = tuple(peer.name for peer in PEERS)
SELECTED = {"peers": PEER_NAMES}  # set once by the runner (--peers)


@dataclass
class RunningPeer:
    """A peer that passed its check, frozen between its measurements."""

    peer: Peer
    system: str
    venv: venvs.Venv
    daemons: Daemons
    url: str
    cosine: float  # the lowest cosine to zbatch's vectors over CHECK_TEXTS


@dataclass
class PeerSystems:
    """The peers this run measures, and those it had to leave out (system or peer name: why)."""

    running: list[RunningPeer] = field(default_factory=list)
    left_out: dict[str, str] = field(default_factory=dict)

    def close(self) -> None:
        for peer in self.running:
            procs.stop_tree(peer.daemons)
        self.running.clear()

    def notes(self) -> dict[str, Any]:
        """What BENCHMARKS.md's peers section says of each: version, install, check; and who was left out."""
        return {"peers": {p.system: {"install_s": p.venv.install_s, "size_mb": p.venv.size_mb, "cosine": p.cosine,
                                     "versions": p.venv.versions, "setup": p.peer.setup} for p in self.running},
                "left_out": dict(self.left_out)}


async def vectors(url: str, body: Callable[[str], Json], vector: Callable[[Json], list[float]],
                  texts: tuple[str, ...] = CHECK_TEXTS) -> list[list[float]]:
    """What ``url`` answers for each of ``texts``, all sent at once (so that a batcher may group them)."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(60)) as session:
        async def one(text: str) -> list[float]:
            async with session.post(url, json=body(text)) as response:
                if response.status != 200:
                    raise RuntimeError(f"{url} answered {response.status}: {(await response.text())[:300]}")
                return [float(x) for x in vector(await response.json(content_type=None))]

        return list(await asyncio.gather(*(one(text) for text in texts)))


def lowest_cosine(ours: list[list[float]], theirs: list[list[float]]) -> float:
    """The least cosine similarity between matching vectors (0 for vectors of different sizes)."""
    def cosine(a: list[float], b: list[float]) -> float:
        if len(a) != len(b) or not a:
            return 0.0
        dot = sum(x * y for x, y in zip(a, b, strict=True))
        return dot / (math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b)) or 1.0)

    return min(cosine(a, b) for a, b in zip(ours, theirs, strict=True))


def _start(daemons: Daemons, peer: Peer, venv: venvs.Venv, model_dir: str) -> str:
    """Start ``peer``'s script with its venv's interpreter, into ``daemons``; its base URL once it is ready."""
    env = {"LD_LIBRARY_PATH": venv.libdir()} if peer.libpython else {}
    daemon = start_http(peer.module, peer.name, daemons.log_dir, "--model", model_dir, ready=peer.ready, env=env,
                        interpreter=str(venv.python))
    return daemons.add(daemon).url


async def start(zbatch_url: str) -> PeerSystems:
    """Install, start and check every selected peer against zbatch's answers at ``zbatch_url``.

    A peer that fails any step is stopped and named in ``left_out``; the others are left frozen.
    """
    from worker.runners.spec import default_model_path

    model_dir = default_model_path()
    reference = await vectors(zbatch_url, gateway_body, lambda answer: answer)
    systems = PeerSystems()
    try:
        await _start_each(systems, model_dir, reference)
    except BaseException:  # cancelled (SIGTERM) while starting: stop the peers started so far
        systems.close()
        raise
    return systems


async def _start_each(systems: PeerSystems, model_dir: str, reference: list[list[float]]) -> None:
    for peer in [p for p in PEERS if p.name in SELECTED["peers"]]:
        daemons = Daemons()
        try:
            venv = await procs.blocking(venvs.ensure, peer.name, peer.requirements, procs.log)
            system = f"{peer.label} {venv.versions.get(peer.distribution, '?')}"
            procs.log(f"starting {system} (loads the model)")
            url = await procs.start(daemons, _start, peer, venv, model_dir)
            cosine = lowest_cosine(reference, await vectors(url + peer.path, peer.body, peer.vector))
        except Exception as exc:
            procs.log(f"peer {peer.name} left out:\n{traceback.format_exc()}")
            procs.stop_tree(daemons)
            systems.left_out[peer.name] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            continue
        except BaseException:
            procs.stop_tree(daemons)
            raise
        if cosine < MIN_COSINE:
            procs.stop_tree(daemons)
            systems.left_out[system] = f"computes something else: cosine {cosine:.6f} to zbatch's vectors"
            procs.log(f"{system} left out: {systems.left_out[system]}")
            continue
        procs.log(f"{system} serves the same vectors as zbatch (lowest cosine {cosine:.7f}); frozen until measured")
        procs.pause(daemons)
        systems.running.append(RunningPeer(peer, system, venv, daemons, url + peer.path, cosine))
