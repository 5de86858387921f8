"""Without CURVE, a daemon keeps its ZeroMQ endpoints on loopback unless told ``--insecure``.

Every daemon runs for real inside the test's own network namespace (``unshare --net``), where
``10.123.0.1`` sits on that namespace's ``lo``: an address that is not loopback by the rule, yet
reachable from nowhere else, so nothing here listens on a real network.  Each daemon must refuse
it (and ``0.0.0.0``, ``*``) at start with one line and status 2, and start with ``--insecure``.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.daemons import ROOT, Daemon, Daemons
from zbatch.testing import daemon_env

ADDRESS = "10.123.0.1"  # on lo inside the namespace only
FRONTEND, BACKEND, HTTP_PORT = f"tcp://{ADDRESS}:15555", f"tcp://{ADDRESS}:15556", 18000
REFUSAL = "is not a loopback address and CURVE is off"


class Namespace:
    """A network namespace held open by a sleeping process; commands enter it with nsenter."""

    def __init__(self, holder: subprocess.Popen[str]) -> None:
        self.holder = holder

    def command(self, *args: str) -> list[str]:
        return ["nsenter", f"--target={self.holder.pid}", "--user", "--net", "--preserve-credentials", *args]

    def run(self, module: str, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.command(sys.executable, "-m", module, *args), env=daemon_env(), cwd=ROOT,
                              capture_output=True, text=True, timeout=120, check=False)

    def spawn(self, module: str, name: str, log_dir: Path, *args: str) -> Daemon:
        log_path = log_dir / f"{name}.log"
        with log_path.open("wb") as log:
            process = subprocess.Popen(self.command(sys.executable, "-m", module, *args), stdout=log,
                                       stderr=subprocess.STDOUT, env=daemon_env(), cwd=ROOT)
        return Daemon(name, process, log_path)

    def stats(self) -> dict[str, object] | None:
        """The broker's statistics through ``zbatch-status --json --insecure``, or None."""
        done = self.run("zbatch.tools.status", "--frontend", FRONTEND, "--insecure", "--json")
        return json.loads(done.stdout) if done.returncode == 0 else None

    def http_status(self, url: str) -> int | None:
        probe = ("import sys, urllib.request, urllib.error\n"
                 "try:\n    print(urllib.request.urlopen(sys.argv[1], timeout=5).status)\n"
                 "except urllib.error.HTTPError as e:\n    print(e.code)\n"
                 "except OSError:\n    print(0)\n")
        done = subprocess.run(self.command(sys.executable, "-c", probe, url), capture_output=True, text=True,
                              timeout=60, check=False)
        if done.returncode != 0 or not done.stdout.strip():
            return None
        return int(done.stdout) or None


@pytest.fixture(scope="module")
def namespace() -> Iterator[Namespace]:
    missing = [tool for tool in ("unshare", "nsenter", "ip") if shutil.which(tool) is None]
    if missing:
        pytest.skip(f"needs {', '.join(missing)} for a network namespace of its own")
    setup = f"ip link set lo up && ip addr add {ADDRESS}/32 dev lo && echo ready && exec sleep infinity"
    holder = subprocess.Popen(["unshare", "--net", "--map-root-user", "sh", "-c", setup], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    assert holder.stdout is not None and holder.stderr is not None
    if holder.stdout.readline().strip() != "ready":
        holder.kill()
        pytest.skip(f"cannot make a network namespace here: {holder.stderr.read().strip()}")
    yield Namespace(holder)
    holder.kill()
    holder.wait()


@pytest.mark.parametrize(("module", "args"), [
    ("broker", ["--frontend", FRONTEND]),
    ("broker", ["--backend", "tcp://0.0.0.0:15556"]),
    ("broker", ["--backend", "tcp://*:15556"]),
    ("worker", ["--backend", f"tcp://127.0.0.1:15556,{BACKEND}"]),  # each endpoint of a list
    ("worker", ["--backend", BACKEND]),
    ("gateway", ["--frontend", FRONTEND]),
    ("zbatch.tools.status", ["--frontend", FRONTEND, "--once"]),
])
def test_a_network_endpoint_without_curve_stops_the_daemon_at_start(
    namespace: Namespace, module: str, args: list[str]
) -> None:
    done = namespace.run(module, *args)
    assert done.returncode == 2, done
    # One line and nothing else: the daemon stopped before it bound or connected anything.
    assert done.stderr.count("\n") == 1 and not done.stdout, done
    assert REFUSAL in done.stderr and "configure CURVE" in done.stderr and "--insecure" in done.stderr, done.stderr


def test_with_insecure_every_daemon_starts_on_a_network_address(namespace: Namespace, tmp_path: Path) -> None:
    """Broker, worker (the real model), gateway and zbatch-status, all on 10.123.0.1 with --insecure."""
    with Daemons(tmp_path) as daemons:
        daemons.add(namespace.spawn("broker", "broker", tmp_path, "--insecure", "--frontend", FRONTEND,
                                    "--backend", BACKEND))
        daemons.wait(namespace.stats, "the insecure broker to answer zbatch-status", 60)
        daemons.add(namespace.spawn("worker", "worker", tmp_path, "--insecure", "--backend", BACKEND,
                                    "--name", "ns-worker", "--workers", "1"))
        daemons.add(namespace.spawn("gateway", "gateway", tmp_path, "--insecure", "--frontend", FRONTEND,
                                    "--port", str(HTTP_PORT)))

        def worker_listed() -> bool:
            stats = namespace.stats() or {}
            workers = stats.get("workers", [])
            return isinstance(workers, list) and any(w["name"] == "ns-worker" for w in workers)

        daemons.wait(worker_listed, "the worker to register")
        ready = daemons.wait(lambda: namespace.http_status(f"http://127.0.0.1:{HTTP_PORT}/readyz") == 200,
                             "the gateway to be ready", 60)
        assert ready
        for name in ("gateway", "worker", "broker"):
            assert daemons.pop(name).stop() == 0
