"""Real zbatch daemons for integration tests and benchmarks: start them, wait until they serve, stop them.

What :mod:`aiohttp.test_utils` is to an aiohttp app, this is to the daemons,
but with real processes: each one runs as ``python -m <module>`` with
command-line flags, on free loopback ports, its output in a log file.
Nothing here imports a daemon package, so the same calls start any module
that takes flags (a fake worker, a baseline server).

* Every wait polls a condition until a timeout, never a bare sleep, and a
  failed wait raises :class:`DaemonFailure` with the log of the daemon at
  fault, so a broken start reads at a glance.
* A ``start_*`` function returns a daemon that serves, or stops it and raises.
* :meth:`Daemon.stop` sends SIGTERM, then SIGKILL if the daemon does not exit
  in time; :class:`Daemons` stops a whole group, newest first.
* A daemon gets the caller's environment minus its zbatch settings and
  systemd's variables (:func:`daemon_env`), so a test run under systemd, or
  in a shell with ``ZBATCH_*`` exported, configures nothing by accident.

The calls block.  From async code, run them in a thread
(``await asyncio.to_thread(start_broker, log_dir)``).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import zmq

from zbatch.client import ZBatchError
from zbatch.client.errors import BrokerUnavailable, raise_for_status
from zbatch.client.stats import merge_stats
from zbatch.protocol import payloads, wire
from zbatch.runtime import native
from zbatch.runtime.curve import CurveKeys
from zbatch.runtime.settings import split_endpoints
from zbatch.runtime.sockets import Socket, open_socket

T = TypeVar("T")

ROOT = Path(__file__).resolve().parent.parent  # holds zbatch/ and the daemon packages: each daemon's cwd
START_TIMEOUT_S = 180.0  # long enough to load a model on a busy machine
STOP_TIMEOUT_S = 20.0
POLL_S = 0.05
LOG_LINES = 40
STRIPPED_ENV = ("ZBATCH_", "NOTIFY_SOCKET", "WATCHDOG_")  # prefixes of variables a daemon never inherits
# Except these, chosen for a whole run: a compiled build, and the workers' start cache (the ONNX graphs, verdicts
# and calibrations each worker would otherwise work out again).
START_CACHE_ENV = "ZBATCH_ONNX_CACHE"
KEPT_ENV = (native.ENV, START_CACHE_ENV)
RECENT_PORTS = 4096  # ports free_port will not give again
_GIVEN: dict[int, None] = {}  # the ports free_port gave, oldest first
_GIVEN_LOCK = threading.Lock()
_SPAWNED: list[Daemon] = []  # every daemon spawn_wrapped started in this process, oldest first


class DaemonFailure(AssertionError):
    """A daemon did not start, answer or stop as it should; the message ends with its log.

    An ``AssertionError``, so a test reports it as a failed check.
    """


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now, and none this process was given lately.

    The kernel may hand out a port it has just handed out, once that socket is closed, so two calls in a row
    could name the same port (a broker's frontend and backend, which then fails to bind).
    """
    with _GIVEN_LOCK:
        for _ in range(100):
            with socket.socket() as sock:
                sock.bind(("127.0.0.1", 0))
                port = int(sock.getsockname()[1])
            if port not in _GIVEN:
                _GIVEN[port] = None
                while len(_GIVEN) > RECENT_PORTS:
                    del _GIVEN[next(iter(_GIVEN))]  # the oldest
                return port
    raise DaemonFailure("no free TCP port on 127.0.0.1 that this process was not given lately, in 100 tries")


def endpoint() -> str:
    """A ZeroMQ endpoint on a free loopback port."""
    return f"tcp://127.0.0.1:{free_port()}"


def free_port_run(count: int, tries: int = 100) -> int:
    """The first of ``count`` TCP ports in a row on 127.0.0.1 that nothing listens on right now."""
    for _ in range(tries):
        with contextlib.ExitStack() as held:
            first = held.enter_context(socket.socket())
            first.bind(("127.0.0.1", 0))
            start = int(first.getsockname()[1])
            try:
                for port in range(start + 1, start + count):
                    held.enter_context(socket.socket()).bind(("127.0.0.1", port))
            except OSError:
                continue
            return start
    raise DaemonFailure(f"no {count} free TCP ports in a row on 127.0.0.1 after {tries} tries")


def wait_until(condition: Callable[[], T | None], timeout_s: float, what: str,
               log: Callable[[], str] = str) -> T:
    """Poll ``condition`` until it returns something truthy, and return that.

    After ``timeout_s`` this raises :class:`DaemonFailure` naming ``what``, with ``log()`` appended.
    An exception from ``condition`` ends the wait at once.
    """
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        result = condition()
        if result:
            return result
        time.sleep(POLL_S)
    raise DaemonFailure(f"timed out after {timeout_s:g} s waiting for {what}\n{log()}")


@dataclass
class Daemon:
    """One process started by :func:`spawn`, with its log and the addresses it serves on."""

    name: str
    process: subprocess.Popen[bytes]
    log_path: Path
    endpoints: dict[str, str] = field(default_factory=dict)  # "frontend", "backend", "url", or the caller's own
    curve: CurveKeys | None = None  # a CURVE broker: the client keys its statistics are asked with

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def url(self) -> str:
        return self.endpoints["url"]

    @property
    def frontend(self) -> str:
        return self.endpoints["frontend"]

    @property
    def backend(self) -> str:
        return self.endpoints["backend"]

    def log(self, lines: int = LOG_LINES) -> str:
        """The last ``lines`` of the log, under a header naming the daemon and the file."""
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        tail = "\n".join(text.splitlines()[-lines:])
        return f"--- last lines of {self.name} log ({self.log_path}) ---\n{tail}"

    def alive(self) -> bool:
        return self.process.poll() is None

    def check(self) -> None:
        """Raise :class:`DaemonFailure`, with the log, if the process has exited."""
        if not self.alive():
            raise DaemonFailure(f"{self.name} exited with code {self.process.returncode}\n{self.log()}")

    def signal(self, signum: int) -> None:
        """Send ``signum`` if the process still runs."""
        if self.alive():
            self.process.send_signal(signum)

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> int:
        """SIGTERM and wait; returns the exit code.

        A daemon still running after ``timeout_s`` is killed, and then this
        raises :class:`DaemonFailure`: a daemon must exit on SIGTERM.
        """
        self.signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise DaemonFailure(f"{self.name} ignored SIGTERM for {timeout_s:g} s\n{self.log()}") from None


def flags(settings: Mapping[str, object]) -> list[str]:
    """Command-line flags: ``max_batch_size=8`` gives ``--max-batch-size 8``, a tuple a comma-separated list."""
    args: list[str] = []
    for key, value in settings.items():
        text = ",".join(str(v) for v in value) if isinstance(value, tuple) else str(value)
        args += ["--" + key.replace("_", "-"), text]
    return args


def daemon_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment a daemon starts with; ``extra`` is applied last.

    The caller's, without ``ZBATCH_*`` settings (a daemon's settings come
    from its flags) or ``NOTIFY_SOCKET``/``WATCHDOG_*`` (a run under systemd
    must not have its daemons notify that systemd), but with
    ``ZBATCH_NATIVE_DIR`` and ``ZBATCH_ONNX_CACHE`` (:data:`KEPT_ENV`);
    offline for Hugging Face, and with :data:`ROOT` importable ahead of the
    caller's ``PYTHONPATH``.
    """
    env = {k: v for k, v in os.environ.items() if k in KEPT_ENV or not k.startswith(STRIPPED_ENV)}
    # ROOT first, then whatever path the caller runs with (packages carried to a host without an index).
    paths = [str(ROOT), *(p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != str(ROOT))]
    env |= {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONPATH": os.pathsep.join(paths)}
    return env | dict(extra or {})


def spawn(module: str, name: str, log_dir: Path, /, *args: str, env: Mapping[str, str] | None = None,
          interpreter: str | None = None, **settings: object) -> Daemon:
    """Start ``python -m module *args`` plus ``settings`` as flags, logging to ``log_dir/name.log``; no wait.

    ``env`` adds variables to :func:`daemon_env`.  ``interpreter``: the Python that runs the module,
    this one by default (another virtual environment's, for a program that cannot share this one's
    packages).  A setting may be called ``name`` (the worker's ``--name``): ``module``, ``name`` and
    ``log_dir`` are positional only.
    """
    return spawn_wrapped((), module, name, log_dir, *args, env=env, interpreter=interpreter, **settings)


def spawn_wrapped(wrap: Sequence[str], module: str, name: str, log_dir: Path, /, *args: str,
                  env: Mapping[str, str] | None = None, interpreter: str | None = None,
                  **settings: object) -> Daemon:
    """:func:`spawn` under ``wrap``, a command that runs the daemon's command line by ``exec``, so the
    pid and signals stay the daemon's: ``["ip", "netns", "exec", NAME]`` starts it in a network namespace."""
    log_path = log_dir / f"{name}.log"
    command = [*wrap, interpreter or sys.executable, "-m", module, *args, *flags(settings)]
    with log_path.open("wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=daemon_env(env), cwd=ROOT)
    daemon = Daemon(name, process, log_path)
    _SPAWNED.append(daemon)
    return daemon


def stop_strays() -> list[str]:
    """Stop every daemon this process spawned that still runs, and name them: at the end of a test run, what
    a test or fixture left behind (a failed assertion before its own ``stop()``), so nothing outlives the run
    (a worker would reconnect to its vanished broker for as long as the host runs)."""
    strays = [daemon for daemon in _SPAWNED if daemon.alive()]
    for daemon in strays:
        with contextlib.suppress(DaemonFailure):
            daemon.stop()
    _SPAWNED.clear()
    return [f"{daemon.name} (pid {daemon.pid})" for daemon in strays]


def _started(daemon: Daemon, condition: Callable[[], object], what: str) -> Daemon:
    """``daemon`` once ``condition`` holds; if it exits first or the wait times out, stop it and fail."""
    def ready() -> object:
        daemon.check()
        return condition()

    try:
        wait_until(ready, START_TIMEOUT_S, what, daemon.log)
    except BaseException:
        with contextlib.suppress(DaemonFailure):
            daemon.stop()
        raise
    return daemon


def _on_free_ports(start: Callable[[], Daemon], chosen: bool, tries: int = 3) -> Daemon:
    """``start()``, again on fresh ports while the daemon could not bind the ones it was given because another
    process took them between :func:`free_port` and the bind (``chosen``: the harness chose them, so any free
    ones will do); a port the caller gave, or any other failure, fails at once."""
    for attempt in range(1, tries + 1):
        try:
            return start()
        except DaemonFailure as failure:
            if not chosen or attempt == tries or "address already in use" not in str(failure).lower():
                raise
    raise AssertionError("unreachable: the last try returns or raises")


def broker_stats(frontend: str, timeout_ms: int = 1000, curve: CurveKeys | None = None) -> dict[str, Any] | None:
    """The broker's statistics (several brokers, comma-separated: their merged view), or None if none answers
    within ``timeout_ms``.

    Waits poll this every :data:`POLL_S`, so it asks with one plain DEALER socket per broker and one STATS
    query: an :class:`AsyncClient` (an event loop, socket monitors, a catalog), built and torn down at each
    poll, cost several times the CPU of the question itself.
    """
    context: zmq.Context[Any] = zmq.Context.instance()
    endpoints = split_endpoints(frontend)
    dealers = {open_socket(context, zmq.DEALER, connect=end, immediate=True, curve=curve): end for end in endpoints}
    try:
        answers = _ask_stats(dealers, time.monotonic() + timeout_ms / 1000)
    finally:
        for dealer in dealers:
            dealer.close(linger=0)
    by_broker = {end: answers.get(end, BrokerUnavailable(f"{end} gave no statistics")) for end in endpoints}
    if all(isinstance(answer, ZBatchError) for answer in by_broker.values()):
        return None
    if len(by_broker) > 1:
        return merge_stats(by_broker)
    only = by_broker[endpoints[0]]
    return only if isinstance(only, dict) else None


def _ask_stats(dealers: Mapping[Socket, str], give_up_at: float) -> dict[str, dict[str, Any] | ZBatchError]:
    """Each broker's STATS answer (or the error it gave) that arrives before ``give_up_at``, by endpoint.

    A socket queues nothing until its connection is made (``immediate``), so each query is sent once its
    socket is writable, and only an answer to that query is read (the id is this call's own).
    """
    query_id = os.urandom(8)
    unsent = set(dealers)
    answers: dict[str, dict[str, Any] | ZBatchError] = {}
    poller = zmq.Poller()
    for dealer in dealers:
        poller.register(dealer, zmq.POLLIN | zmq.POLLOUT)
    while len(answers) < len(dealers) and (left_s := give_up_at - time.monotonic()) > 0:
        for dealer, events in poller.poll(max(1, round(left_s * 1000))):
            if events & zmq.POLLOUT and dealer in unsent:
                dealer.send_multipart(wire.encode_stats_query(query_id))
                unsent.discard(dealer)
                poller.modify(dealer, zmq.POLLIN)
            if events & zmq.POLLIN and (answer := _stats_answer(dealer.recv_multipart(), query_id)) is not None:
                answers[dealers[dealer]] = answer
    return answers


def _stats_answer(frames: list[bytes], query_id: bytes) -> dict[str, Any] | ZBatchError | None:
    """The statistics (or the error) ``frames`` answer ``query_id`` with; None if they answer something else
    (a heartbeat, say) or cannot be read."""
    try:
        reply = wire.decode_reply(frames)
    except wire.ProtocolError:
        return None
    if reply.request_id != query_id:
        return None
    try:
        raise_for_status(reply)
    except ZBatchError as error:
        return error
    stats: dict[str, Any] = payloads.decode_payload(reply.payload)
    return stats


def http_status(url: str, timeout_s: float = 2.0) -> int | None:
    """The status of ``GET url``, or None if nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        return int(error.code)
    except OSError:
        return None


def start_broker(log_dir: Path, name: str = "broker", *, env: Mapping[str, str] | None = None,
                 curve: CurveKeys | None = None, **settings: object) -> Daemon:
    """A broker on fresh ports, or on ``frontend``/``backend`` if given (a restart); ready once it answers.

    ``curve``: a client's keys, for a broker started with CURVE settings.
    """
    given = {end: settings.pop(end, None) for end in ("frontend", "backend")}

    def start() -> Daemon:
        ends = {end: str(value or endpoint()) for end, value in given.items()}
        daemon = spawn("broker", name, log_dir, env=env, interpreter=None, **ends, **settings)
        daemon.endpoints, daemon.curve = ends, curve
        return _started(daemon, lambda: broker_stats(daemon.frontend, curve=curve) is not None,
                        "the broker to answer")

    return _on_free_ports(start, chosen=not any(given.values()))


def _lists(broker: Daemon, worker: Daemon) -> bool:
    """Whether ``broker`` lists ``worker`` (by its name); fails at once if either has exited."""
    worker.check()
    broker.check()
    stats = broker_stats(broker.frontend, curve=broker.curve) or {"workers": []}
    return any(w["name"] == worker.name for w in stats["workers"])


def wait_for_worker(broker: Daemon, worker: Daemon, timeout_s: float = START_TIMEOUT_S) -> None:
    """Until ``broker`` lists ``worker``; fails at once if either exits."""
    wait_until(lambda: _lists(broker, worker), timeout_s, f"worker {worker.name} to register", worker.log)


def start_worker(broker: Daemon, log_dir: Path, name: str, *, wait: bool = True,
                 env: Mapping[str, str] | None = None, **settings: object) -> Daemon:
    """A worker of ``broker`` (2 inference workers unless told otherwise); ready once the broker lists it.

    The workers started into one ``log_dir`` share a cores ledger there, as the workers of one host do,
    and no other group's: test runs side by side on a machine do not hand each other their cores.
    With ``wait=False`` it returns at once: start several, then :func:`wait_for_worker` on each.
    """
    settings = {"backend": broker.backend, "name": name, "workers": 2, "cores_ledger": str(log_dir / "cores")
                } | settings
    daemon = spawn("worker", name, log_dir, env=env, interpreter=None, **settings)
    if wait:
        _started(daemon, lambda: _lists(broker, daemon), f"worker {name} to register")
    return daemon


def start_http(module: str, name: str, log_dir: Path, /, *args: str, ready: str = "/healthz",
               env: Mapping[str, str] | None = None, interpreter: str | None = None, **settings: object) -> Daemon:
    """A module that serves HTTP on ``--port``, on a free port; ready once ``GET ready`` answers 200.

    ``interpreter``: as for :func:`spawn`.
    """
    def start() -> Daemon:
        port = free_port()
        daemon = spawn(module, name, log_dir, *args, env=env, interpreter=interpreter, **settings, port=port)
        daemon.endpoints["url"] = f"http://127.0.0.1:{port}"
        return _started(daemon, lambda: http_status(daemon.url + ready) == 200, f"{name} to answer {ready}")

    return _on_free_ports(start, chosen=True)


def start_gateway(broker: Daemon, log_dir: Path, *, ready: str = "/healthz", env: Mapping[str, str] | None = None,
                  **settings: object) -> Daemon:
    """A gateway in front of ``broker``; ``ready="/readyz"`` also waits until it reaches the broker.

    One process unless ``processes=`` says otherwise (the gateway's own default is one per core): a test's
    limits and counts are then those of one process, whatever the host.
    """
    settings = {"frontend": broker.frontend, "processes": 1} | settings
    return start_http("gateway", "gateway", log_dir, ready=ready, env=env, interpreter=None, **settings)


def spawn_serve(log_dir: Path, name: str = "zbatch-serve", /, *args: str, brokers: int = 1,
                derive_ports: bool = False, env: Mapping[str, str] | None = None, **settings: object) -> Daemon:
    """``zbatch serve`` with ``brokers`` brokers and its gateway on free ports; no wait (see :func:`serves`).

    The brokers' endpoints are listed, or with ``derive_ports`` one frontend and one backend on a run of free
    ports and ``--brokers``, so that ``zbatch serve`` derives the others (broker i on each port + 2i).
    Its daemons log into its own log, each line under its name and pid.  The endpoints: ``url`` (the
    gateway), ``frontend`` (the brokers' frontends, comma-separated, as a client of all of them takes them).
    """
    if derive_ports:
        first = free_port_run(2 * brokers)
        frontends = [f"tcp://127.0.0.1:{first + 2 * i}" for i in range(brokers)]
        backends = [f"tcp://127.0.0.1:{first + 2 * i + 1}" for i in range(brokers)]
        settings |= {"frontend": frontends[0], "backend": backends[0], "brokers": brokers}
        taken = range(first, first + 2 * brokers)
    else:
        frontends, backends = [endpoint() for _ in range(brokers)], [endpoint() for _ in range(brokers)]
        settings |= {"frontend": ",".join(frontends), "backend": ",".join(backends)}
        taken = range(0)
    port = free_port()
    while port in taken:
        port = free_port()
    daemon = spawn("zbatch", name, log_dir, "serve", *args, env=env, interpreter=None, port=port, **settings)
    daemon.endpoints |= {"url": f"http://127.0.0.1:{port}", "frontend": ",".join(frontends)}
    return daemon


def serves(daemon: Daemon) -> bool:
    """Whether ``zbatch serve`` has said that its whole stack serves; fails at once if it has exited."""
    daemon.check()
    return "serving on http://" in daemon.log_path.read_text(errors="replace")


def supervised_pids(daemon: Daemon) -> dict[str, int]:
    """The pid of each daemon ``zbatch serve`` started last ("broker", "broker-1", "worker-0", ...), from its log."""
    text = daemon.log_path.read_text(errors="replace")
    return {match[0]: int(match[1]) for match in re.findall(r"zbatch.serve: started (\S+) \(pid (\d+)\)", text)}


def wait_ready_again(daemon: Daemon, unit: str, old_pid: int, timeout_s: float = START_TIMEOUT_S) -> float:
    """Until ``zbatch serve`` says its ``unit`` is ready again in a process other than ``old_pid``; returns how long
    it was out, as the supervisor counts it (from the exit it saw to READY=1)."""
    pattern = re.compile(rf"zbatch.serve: {re.escape(unit)} \(pid (\d+)\) is ready again, ([\d.]+) s after it exited")

    def ready_again() -> float | None:
        daemon.check()
        text = daemon.log_path.read_text(errors="replace")
        found = [match for match in pattern.finditer(text) if int(match[1]) != old_pid]
        current = supervised_pids(daemon).get(unit)
        return float(found[-1][2]) if found and int(found[-1][1]) == current else None

    return wait_until(ready_again, timeout_s, f"{unit} to be ready again", daemon.log)


class Daemons(dict[str, Daemon]):
    """Daemons by name that live and die together, logging to one folder (a fresh one by default).

    ``close``, or the end of a ``with`` block, stops them all, newest first.
    """

    def __init__(self, log_dir: Path | None = None) -> None:
        super().__init__()
        self.log_dir = log_dir or Path(tempfile.mkdtemp(prefix="zbatch-"))

    def __enter__(self) -> Daemons:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def add(self, daemon: Daemon) -> Daemon:
        """Take ``daemon`` into the group (its name must be new); returns it."""
        if daemon.name in self:
            raise ValueError(f"a daemon named {daemon.name!r} is already in this group")
        self[daemon.name] = daemon
        return daemon

    def pids(self) -> dict[str, int]:
        return {name: daemon.pid for name, daemon in self.items()}

    def logs(self) -> str:
        return "\n".join(daemon.log() for daemon in self.values())

    def wait(self, condition: Callable[[], T], what: str, timeout_s: float = START_TIMEOUT_S) -> T:
        """:func:`wait_until` ``condition``, failing at once if any member exits; a timeout shows every log."""
        def check() -> T:
            for daemon in self.values():
                daemon.check()
            return condition()

        return wait_until(check, timeout_s, what, self.logs)

    def close(self) -> None:
        """Stop every member, newest first, even if one fails; then raise what went wrong, if anything."""
        failures: list[str] = []
        for daemon in reversed(list(self.values())):
            try:
                daemon.stop()
            except DaemonFailure as failure:
                failures.append(str(failure))
        if failures:
            raise DaemonFailure("\n".join(failures))


@contextlib.contextmanager
def running_stack(log_dir: Path, workers: int = 2, *, broker: Mapping[str, Any] | None = None,
                  worker: Mapping[str, Any] | None = None, gateway: bool | Mapping[str, Any] = True
                  ) -> Iterator[Daemons]:
    """A broker, ``workers`` workers named w1, w2, ... and a gateway, each with its settings; stopped on exit.

    ``gateway``: the gateway's settings (True: its defaults; False: no gateway).
    """
    with Daemons(log_dir) as daemons:
        started = daemons.add(start_broker(log_dir, **(broker or {})))
        names = [f"w{i + 1}" for i in range(workers)]
        for name in names:
            daemons.add(start_worker(started, log_dir, name, wait=False, **(worker or {})))
        for name in names:
            wait_for_worker(started, daemons[name])
        if gateway is not False:
            daemons.add(start_gateway(started, log_dir, **(gateway if isinstance(gateway, Mapping) else {})))
        yield daemons
