"""How many brokers and gateway processes ``zbatch serve`` starts: its fronts, from the settings or the host.

Sans-I/O: plain functions of numbers and endpoint texts; the caller counts
the cores and the GPUs (:mod:`zbatch.supervisor.stack`).

The operator's settings come first.  A ``frontend`` list of several
endpoints is that many brokers; with one endpoint, ``brokers`` N starts N
brokers on ports derived from it (:func:`derived_endpoints`: broker i
binds the frontend's port + 2i and the backend's port + 2i); ``processes``
N starts N gateway processes.  Where either is 0, :func:`front_layout`
chooses from the host:

* **No GPU** (CPU workers): one broker, and the gateway's own default
  processes (one per core, at most 4: gateway/config.py).  The workers
  take the cores; a front that took more would take them from the model.
* **GPUs**: the workers' model runs on the GPU, and the host's cores go to
  the workers' CPU side, the broker and the gateway.  One broker is one
  event loop on one core, and one gateway process is one more: a big host
  gets :data:`GPU_HOST_BROKERS` brokers from :data:`CORES_FOR_MORE_BROKERS`
  cores up, and one gateway process for every :data:`CORES_PER_GATEWAY_PROCESS`
  cores, from 1 to :data:`MAX_GATEWAY_PROCESSES`: the processes share the
  cores with the workers and the clients, so more than the cores allow
  serve less, not more.  And the gateway processes tokenize the texts
  (the gateway's ``edge_tokenize``), so token ids reach the workers: a
  worker is one interpreter whose tokenizing holds it, and the gateway's
  processes scale with the cores.  Where the gateway's own setting is set
  (its variable or its table), that stands (:mod:`zbatch.supervisor.stack`).

The constants come from a measurement of these layouts on a GPU host
(BENCHMARKS.md, "One H200, 2026-11-27 (issues 38 and 41)"), and the gateway's
tokenizing from the next ("One H200, 2026-11-27, second lease"); the figures
stay there.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

CORES_FOR_MORE_BROKERS = 16  # a host with GPUs and at least these cores runs GPU_HOST_BROKERS brokers
GPU_HOST_BROKERS = 2
CORES_PER_GATEWAY_PROCESS = 2  # with GPUs: one gateway process for every this many of the host's cores
MAX_GATEWAY_PROCESSES = 8
GATEWAY_DEFAULT = 0  # processes = 0: the gateway's own default, one per core, at most the next
GATEWAY_MAX_AUTO_PROCESSES = 4  # gateway/config.py: MAX_AUTO_PROCESSES (the supervisor imports no daemon)
PORT_STEP = 2  # broker i binds each port + 2i, so 5555/5556 gives 5557/5558 next
MAX_PORT = 65_535


@dataclass(frozen=True)
class FrontLayout:
    """What :func:`front_layout` chose for a host, and why, in words for the log."""

    brokers: int
    gateway_processes: int  # GATEWAY_DEFAULT: the gateway chooses
    why: str
    edge_tokenize: bool = False  # the gateway processes tokenize the texts, unless the gateway's setting says


def front_layout(cores: int, gpus: int) -> FrontLayout:
    """The brokers and gateway processes for a host of ``cores`` cores and ``gpus`` GPUs with workers on them."""
    if gpus <= 0:
        return FrontLayout(1, GATEWAY_DEFAULT, "a host without GPUs, whose workers take the cores")
    brokers = GPU_HOST_BROKERS if cores >= CORES_FOR_MORE_BROKERS else 1
    processes = max(1, min(cores // CORES_PER_GATEWAY_PROCESS, MAX_GATEWAY_PROCESSES))
    plural = "" if gpus == 1 else "s"
    return FrontLayout(brokers, processes,
                       f"a host of {cores} cores and {gpus} GPU{plural}: {GPU_HOST_BROKERS} brokers from "
                       f"{CORES_FOR_MORE_BROKERS} cores, and a gateway process for every "
                       f"{CORES_PER_GATEWAY_PROCESS} cores, at most {MAX_GATEWAY_PROCESSES}", edge_tokenize=True)


@dataclass(frozen=True)
class Fronts:
    """The brokers (each one's frontend and backend) and the gateway's processes ``zbatch serve`` starts."""

    endpoints: tuple[tuple[str, str], ...]
    gateway_processes: int  # GATEWAY_DEFAULT: the gateway's own default
    why: str  # where each number came from, for the log
    edge_tokenize: bool = False  # the layout's choice; the gateway's own setting, where set, stands

    @property
    def frontends(self) -> str:
        """Every broker's frontend, comma-separated: the gateway's ``--frontend``."""
        return ",".join(frontend for frontend, _ in self.endpoints)

    @property
    def backends(self) -> str:
        """Every broker's backend, comma-separated: each worker's ``--backend``."""
        return ",".join(backend for _, backend in self.endpoints)

    def describe(self) -> str:
        """``2 brokers and 4 gateway processes`` with the reason, for the log."""
        brokers = len(self.endpoints)
        processes = (f"the gateway's default processes (one per core, at most {GATEWAY_MAX_AUTO_PROCESSES})"
                     if self.gateway_processes == GATEWAY_DEFAULT
                     else f"{self.gateway_processes} gateway process{'' if self.gateway_processes == 1 else 'es'}")
        return f"{brokers} broker{'' if brokers == 1 else 's'} and {processes} ({self.why})"


def resolve_fronts(frontends: Sequence[str], backends: Sequence[str], brokers: int, processes: int,
                   gateway_port: int, layout: FrontLayout) -> Fronts:
    """The fronts from the settings (``brokers``, ``processes``: 0 for auto) over ``layout``, the host's choice.

    Raises ValueError where the settings disagree or derived ports would collide, naming what to change.
    """
    reasons: list[str] = []  # what the settings fixed, then what auto chose
    auto: list[str] = []
    if len(frontends) > 1:
        if brokers and brokers != len(frontends):
            raise ValueError(f"brokers is {brokers} but frontend lists {len(frontends)} endpoints: set brokers to "
                             f"0 or {len(frontends)}, or list one endpoint to derive {brokers} from it")
        endpoints = list(zip(frontends, backends, strict=True))
        reasons.append("brokers: one for each frontend listed")
    else:
        count = brokers or layout.brokers
        if brokers:
            reasons.append("brokers as set")
        elif count > 1 and not derivable(frontends[0], backends[0]):
            count = 1  # auto must not turn a working ipc:// setting into an error: it keeps one broker
            reasons.append(f"one broker, as {frontends[0]} is not TCP with a port to derive more from")
        else:
            auto.append("brokers")
        endpoints = derived_endpoints(frontends[0], backends[0], count, gateway_port)
    if processes:
        reasons.append("gateway processes as set")
    else:
        auto.append("gateway processes")
    if auto:
        reasons.append(f"{' and '.join(auto)} auto for {layout.why}")
    return Fronts(tuple(endpoints), processes or layout.gateway_processes, "; ".join(reasons), layout.edge_tokenize)


def derivable(frontend: str, backend: str) -> bool:
    """Whether further brokers' endpoints can be derived from these by port (TCP, with a number for a port)."""
    return _tcp_port(frontend) is not None and _tcp_port(backend) is not None


def derived_endpoints(frontend: str, backend: str, count: int, gateway_port: int) -> list[tuple[str, str]]:
    """``count`` brokers' (frontend, backend): broker i on each port + 2i; raises ValueError where they cannot be."""
    if count == 1:
        return [(frontend, backend)]
    front, back = _tcp_port(frontend), _tcp_port(backend)
    if front is None or back is None:
        raise ValueError(f"brokers is {count} but the frontend {frontend} or backend {backend} is not a TCP "
                         f"endpoint with a port number to derive the others from: list {count} endpoints in each")
    fronts = [front[1] + PORT_STEP * i for i in range(count)]
    backs = [back[1] + PORT_STEP * i for i in range(count)]
    taken = sorted(set(fronts) & set(backs) | ({gateway_port} & set(fronts + backs)))
    if taken or max(fronts + backs) > MAX_PORT:
        problem = (f"port {', '.join(map(str, taken))} would be bound twice (the gateway's port is {gateway_port})"
                   if taken else f"ports would pass {MAX_PORT}")
        raise ValueError(f"brokers is {count}: from frontend port {front[1]} and backend port {back[1]}, broker i "
                         f"binds each + {PORT_STEP}i, and {problem}; choose ports an odd number apart, such as "
                         f"frontend 5555 and backend 5556, away from the gateway's, or list every broker's endpoints")
    return [(f"{front[0]}:{f}", f"{back[0]}:{b}") for f, b in zip(fronts, backs, strict=True)]


def _tcp_port(endpoint: str) -> tuple[str, int] | None:
    """``tcp://host:5555`` -> (``tcp://host``, 5555); None for another transport or a port that is no number."""
    if not endpoint.startswith("tcp://"):
        return None
    head, _, port = endpoint.rpartition(":")
    return (head, int(port)) if port.isdigit() and head != "tcp" else None
