"""One host's stack as units and command lines: what ``zbatch serve`` runs, in which order, stopped how.

Brokers first; the workers and the gateway once every broker is ready (they
would reconnect anyway, but starting them later keeps the first seconds'
logs free of retries); stopped the other way round: the gateway first, so no
request comes in that the workers could not finish, then the workers, which
hand back or finish what they hold, then the brokers.

Each daemon gets SIGKILL once its drain time, plus :data:`STOP_MARGIN_S`, has
passed since its SIGTERM.  The drain times are the daemons' own settings,
read where the daemon reads them (its ``ZBATCH_*`` variable, else its table
in the config file, else its default), since the supervisor imports no
daemon: the defaults here are checked against the daemons' in the tests.
"""

from __future__ import annotations

import os
import sys
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass

from zbatch.client.aio import REPLY_GRACE_MS
from zbatch.hub import Fetched, is_hub_id, public_name
from zbatch.runtime.settings import CONFIG_ENV, env_name
from zbatch.supervisor.config import ServeConfig
from zbatch.supervisor.gpus import gpu_devices, workers_per_gpu
from zbatch.supervisor.layout import Fronts
from zbatch.supervisor.policy import STOP_MARGIN_S, Unit
from zbatch.supervisor.shell import Program

STOP_ORDER = ("gateway", "worker", "broker")
BROKER_DRAIN_MS = 10_000  # broker/config.py: drain_timeout_ms
WORKER_DRAIN_MS = 10_000  # worker/config.py: drain_timeout_ms
GATEWAY_TIMEOUT_MS = 30_000  # gateway/config.py: timeout_ms; the gateway drains for it plus the grace below


@dataclass(frozen=True)
class Stack:
    units: list[Unit]
    programs: dict[str, Program]
    tokenizing: str = ""  # where texts are tokenized, and who chose: for the log


@dataclass(frozen=True)
class Placement:
    """How many of each daemon run where: each worker's ``--device`` ("": unpinned), the brokers and the
    gateway's processes, with why those."""

    devices: list[str]
    fronts: Fronts


def place(config: ServeConfig, environ: Mapping[str, str], cores: int | None = None) -> Placement:
    """``config``'s daemons on a host of ``cores`` cores (by default, this one's) and the GPUs ``environ`` shows.

    Raises ValueError where the brokers auto chooses cannot be given ports (:meth:`ServeConfig.fronts`).
    """
    cores = cores or host_cores()
    devices = worker_devices(config, environ, cores)
    return Placement(devices, config.fronts(cores, len(set(devices) - {""})))


def build(config: ServeConfig, environ: Mapping[str, str], config_file: str | None = None,
          fetched: Fetched | None = None, placement: Placement | None = None) -> Stack:
    """The units of ``config``'s stack and how to run each; ``config_file`` is ``zbatch serve --config``'s,
    ``fetched`` where ``config.model`` is on disk (:func:`zbatch.hub.fetch`), ``placement`` :func:`place`'s
    (found here by default)."""
    placement = placement or place(config, environ)
    devices, fronts = placement.devices, placement.fronts
    config_file = config_file or environ.get(CONFIG_ENV) or None
    env = {CONFIG_ENV: os.path.abspath(config_file)} if config_file else {}

    def setting(section: str, name: str, default: int) -> int:
        return daemon_setting(section, name, default, environ, config_file)

    broker_s = setting("broker", "drain_timeout_ms", BROKER_DRAIN_MS) / 1000 + STOP_MARGIN_S
    worker_s = setting("worker", "drain_timeout_ms", WORKER_DRAIN_MS) / 1000 + STOP_MARGIN_S
    # The gateway with several processes supervises them with the same margin: one more for it.
    gateway_s = (setting("gateway", "timeout_ms", GATEWAY_TIMEOUT_MS) + REPLY_GRACE_MS) / 1000 + 2 * STOP_MARGIN_S
    units: list[Unit] = []
    programs: dict[str, Program] = {}
    for i, (frontend, backend) in enumerate(fronts.endpoints):
        name = "broker" if len(fronts.endpoints) == 1 else f"broker-{i}"
        units.append(Unit(name, "broker", broker_s))
        programs[name] = Program(_module("broker", "--frontend", frontend, "--backend", backend), env)
    model = model_flags(config, fetched)
    for i, device in enumerate(devices):
        name = f"worker-{i}"
        units.append(Unit(name, "worker", worker_s, after=("broker",)))
        pinned = ("--device", device) if device else ()
        programs[name] = Program(_module("worker", "--name", name, "--backend", fronts.backends,
                                         "--workers", str(len(devices)), *pinned, *model), env)
    units.append(Unit("gateway", "gateway", gateway_s, after=("broker",)))
    served = served_name(config)
    explicit = daemon_text("gateway", "default_model", environ, config_file)
    default = ("--default-model", served) if served and not explicit else ()
    edge, tokenizing = edge_tokenizing(fronts, environ, config_file)
    programs["gateway"] = Program(_module("gateway", "--host", config.host, "--port", str(config.port),
                                          "--frontend", fronts.frontends, "--processes",
                                          str(fronts.gateway_processes), *default, *edge), env)
    return Stack(units, programs, tokenizing)


def edge_tokenizing(fronts: Fronts, environ: Mapping[str, str], config_file: str | None) -> tuple[list[str], str]:
    """The gateway's flags for the layout's ``edge_tokenize`` (none where the gateway's own setting is set), and
    where texts are tokenized, in words for the log."""
    if _daemon_raw("gateway", "edge_tokenize", environ, config_file) is not None:
        return [], "texts tokenized where the gateway's edge_tokenize setting says"
    if fronts.edge_tokenize:
        return ["--edge-tokenize", "true"], "texts tokenized in the gateway processes, for workers on GPUs"
    return [], "texts tokenized in the workers"


def model_flags(config: ServeConfig, fetched: Fetched | None) -> list[str]:
    """The workers' model flags: the folder, or the Hub id at the commit ``zbatch serve`` found, so every worker
    (and every restart) loads the same files from the cache; none where ``zbatch serve`` names no model."""
    flags: list[str] = []
    if fetched is not None and config.model:
        hub = is_hub_id(config.model)
        flags += ["--model", config.model if hub else fetched.path]
        if hub and (fetched.commit or config.revision):
            flags += ["--revision", fetched.commit or config.revision]
    if config.model_name:
        flags += ["--model-name", config.model_name]
    if config.trust_remote_code:
        flags += ["--trust-remote-code", "true"]
    return flags


def served_name(config: ServeConfig) -> str:
    """The name the workers serve the model as, where ``zbatch serve`` knows it ("": the workers' own setting)."""
    return config.model_name or (public_name(config.model) if config.model else "")


def host_cores() -> int:
    """The host's cores, which the GPU hosts' defaults (workers per GPU, the fronts) are counted from."""
    return os.cpu_count() or 1


def worker_devices(config: ServeConfig, environ: Mapping[str, str], cores: int | None = None) -> list[str]:
    """Each worker's ``--device``: ``workers_per_gpu`` on each GPU (:mod:`zbatch.supervisor.gpus`), or
    ``workers`` unpinned ones ("") on a host without GPUs, with ``gpus`` none, or where ZBATCH_DEVICE is set."""
    if config.workers == 0:
        return []
    gpus = "none" if config.gpus == "auto" and env_name("device") in environ else config.gpus
    devices = gpu_devices(gpus, environ)
    if not devices:
        return [""] * config.workers
    per_gpu = config.workers_per_gpu or workers_per_gpu(cores or host_cores(), len(devices))
    return [device for device in devices for _ in range(per_gpu)]


def daemon_setting(section: str, name: str, default: int, environ: Mapping[str, str],
                   config_file: str | None) -> int:
    """A daemon's whole-number setting as the daemon will see it (short of flags, which the stack does not set).

    A value the daemon would refuse counts as the default here: the daemon exits at start and says why.
    """
    raw = _daemon_raw(section, name, environ, config_file)
    if isinstance(raw, bool):
        return default
    try:
        return int(raw) if isinstance(raw, int | str) else default
    except ValueError:
        return default


def daemon_text(section: str, name: str, environ: Mapping[str, str], config_file: str | None) -> str:
    """A daemon's text setting as the daemon will see it from its variable or its table ("": not set there)."""
    raw = _daemon_raw(section, name, environ, config_file)
    return raw if isinstance(raw, str) else ""


def _daemon_raw(section: str, name: str, environ: Mapping[str, str], config_file: str | None) -> object:
    """A daemon's setting from its ``ZBATCH_*`` variable, else its table of the config file; None if neither."""
    raw: object = environ.get(env_name(name))
    if raw is None and config_file:
        try:
            with open(config_file, "rb") as file:
                table = tomllib.load(file).get(section, {})
        except (OSError, tomllib.TOMLDecodeError):
            table = {}
        raw = table.get(name) if isinstance(table, dict) else None
    return raw


def _module(module: str, *args: str) -> list[str]:
    return [sys.executable, "-m", module, *args]
