"""``zbatch serve``'s settings: flags, ``ZBATCH_*`` variables and the ``[serve]`` table, as for every daemon.

Where a setting of ``zbatch serve`` has a daemon's name (``workers``,
``model``, ``revision``, ``model_name``, ``trust_remote_code``, ``port``,
``host``, ``frontend``, ``backend``, ``processes``, ``log_*``) it means the
same thing, so one environment serves the supervisor and the daemons alike.
Everything else in the environment reaches the daemons untouched.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from zbatch.runtime import wakeup
from zbatch.runtime.logs import LOG_FORMATS
from zbatch.runtime.settings import check_endpoints, load, option, split_endpoints
from zbatch.supervisor import layout
from zbatch.supervisor.gpus import check_gpus
from zbatch.supervisor.layout import FrontLayout, Fronts, front_layout, resolve_fronts


@dataclass(frozen=True)
class ServeConfig:
    """zbatch serve: run a whole zbatch stack on this host (brokers, workers, the HTTP gateway), restart any
    daemon that exits, and stop them in order (gateways, workers, brokers) on SIGTERM or Ctrl-C. Every other
    ZBATCH_* variable reaches the daemons."""

    workers: int = option(2, "worker daemons to start on a host without GPUs (worker-0, worker-1, ...); they "
                             "share the cores through the host's cores ledger (a lone busy one gets them all), and "
                             "each also takes it as its own 'workers' setting, the fixed split of --cores-ledger "
                             "off; 0: none on this host, GPUs or not", minimum=0)
    model: str = option("", "the model every worker serves: a Hugging Face Hub id, downloaded once into the Hugging "
                        "Face cache before the workers start (HF_HUB_OFFLINE=1: from the cache only), or a folder; "
                        "empty: the workers' own setting (default: the bundled all-MiniLM-L6-v2)")
    revision: str = option("", "the Hub model's branch, tag or commit (empty: main); the workers get the commit it "
                           "names when they start, so all of them serve the same one")
    model_name: str = option("", "the name the model is served as (vLLM's --served-model-name; default: the Hub id, "
                             "or the folder's name), and the gateway's default model unless it has one set")
    trust_remote_code: bool = option(False, "let the workers run Python code the model brings with it (config.json "
                                     "auto_map), as transformers' trust_remote_code=True")
    gpus: str = option("auto", "GPUs to run workers on, workers_per_gpu on each, pinned with --device cuda:N: "
                       "auto (those CUDA_VISIBLE_DEVICES or nvidia-smi -L shows, none where ZBATCH_DEVICE is set), "
                       "none (CPU workers), or indices such as 0,1", check=check_gpus)
    workers_per_gpu: int = option(0, "worker daemons on each GPU; 0: one for every 4 of the host's cores a GPU has, "
                                     "1 to 4 (a worker's CPU side limits a small model, so several serve more than "
                                     "one, and more than 4 served less; BENCHMARKS.md, GPU)", minimum=0)
    host: str = option("127.0.0.1", "address the gateway listens on")
    port: int = option(8000, "TCP port the gateway listens on", minimum=1)
    processes: int = option(0, f"gateway processes sharing the port; 0: auto, the gateway's own default (one per "
                               f"core, at most {layout.GATEWAY_MAX_AUTO_PROCESSES}) on a host without GPUs, and with "
                               f"GPUs one for every {layout.CORES_PER_GATEWAY_PROCESS} of the host's cores, 1 to "
                               f"{layout.MAX_GATEWAY_PROCESSES} (zbatch/supervisor/layout.py says why)", minimum=0)
    brokers: int = option(0, f"brokers to start; with one frontend and backend endpoint set, broker i binds their "
                             f"ports + {layout.PORT_STEP}i (5555/5556, 5557/5558, ...), and a list of several "
                             f"endpoints is that many brokers; 0: auto, one, or {layout.GPU_HOST_BROKERS} on a host "
                             f"with GPUs and {layout.CORES_FOR_MORE_BROKERS} cores or more", minimum=0)
    frontend: str = option("tcp://127.0.0.1:5555", "the brokers' frontend endpoints, comma-separated: one broker "
                           "is started for each (or brokers from one), and the gateway spreads requests over them",
                           check=check_endpoints)
    backend: str = option("tcp://127.0.0.1:5556", "the brokers' worker endpoints, comma-separated, one for each "
                          "frontend and in the same order; every worker registers with each broker",
                          check=check_endpoints)
    restart_delay_ms: int = option(1_000, "wait before restarting a daemon that exited; it doubles with each exit "
                                          "in a row", minimum=0)
    restart_max_delay_ms: int = option(30_000, "the longest wait before a restart", minimum=0)
    restart_reset_ms: int = option(60_000, "a daemon that has been ready this long starts again from "
                                           "restart_delay_ms when it next exits", minimum=0)
    cpu_wake_latency_us: int = option(
        wakeup.HOST_POLICY, "while the stack runs, keep this host's idle cores in idle states they leave within this "
        "many µs (Linux PM QoS, /dev/cpu_dma_latency; needs root): 0 keeps them polling, which takes the cores' "
        "wake-ups out of each hop of a lone request, at the cost of idle power; -1: the host's own policy",
        minimum=wakeup.HOST_POLICY,
        check=lambda us: None if us <= wakeup.MAX_WAKE_US else f"must be at most {wakeup.MAX_WAKE_US:,}")
    log_level: str = option("info", "logging level", choices=("debug", "info", "warning", "error"))
    log_format: str = option("text", "log lines as text for people or json for a log pipeline", choices=LOG_FORMATS)

    def __post_init__(self) -> None:
        frontends, backends = split_endpoints(self.frontend), split_endpoints(self.backend)
        if len(frontends) != len(backends):
            raise ValueError(f"frontend lists {len(frontends)} endpoints and backend {len(backends)}: each broker "
                             f"needs one of each, in the same order")
        if self.brokers:  # auto is checked once the host is known (fronts), a setting at once
            resolve_fronts(frontends, backends, self.brokers, self.processes, self.port, FrontLayout(1, 0, ""))
        if self.restart_max_delay_ms < self.restart_delay_ms:
            raise ValueError(f"restart_max_delay_ms ({self.restart_max_delay_ms}) is below restart_delay_ms "
                             f"({self.restart_delay_ms}); raise it or lower restart_delay_ms")

    def fronts(self, cores: int, gpus: int) -> Fronts:
        """The brokers and gateway processes to start on a host of ``cores`` cores and ``gpus`` GPUs with workers:
        the settings, and :func:`~zbatch.supervisor.layout.front_layout` where they say auto.  Raises ValueError
        where auto's brokers cannot have the ports derived for them."""
        return resolve_fronts(split_endpoints(self.frontend), split_endpoints(self.backend), self.brokers,
                              self.processes, self.port, front_layout(cores, gpus))


def load_config(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> ServeConfig:
    """Flags over environment over config file over defaults; exits with status 2 naming any bad value."""
    return load(ServeConfig, argv, environ, prog="zbatch serve", section="serve")
