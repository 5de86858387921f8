"""A noisy neighbour: the load another engineer's benchmark puts on a shared host, beside a command of yours.

``python -m scripts.neighbour [--loaders N] [--clients N] [--busy-loops N] [--layers N] [-- COMMAND ...]``
starts, and keeps running while COMMAND runs (or until SIGTERM or Ctrl-C without one):

* ``--busy-loops`` processes that spin on a core each (``yes >/dev/null``);
* a second zbatch stack (broker, two workers, gateway, on its own free ports and its own cores ledger)
  serving a bigger model than the bundled one: a BERT of ``--layers`` layers built from the bundled model's
  config and tokenizer with random weights (12 layers: e5-small-v2's shape), made once and kept in
  ``$ZBATCH_BENCH_CACHE/neighbour`` (default ``~/.cache/zbatch-bench/neighbour``);
* ``--loaders`` load-generator processes (:mod:`scripts.benchmarks.load.processes`) with ``--clients`` closed-loop
  HTTP clients in all, one text a request, against that stack.

COMMAND starts once the neighbour's stack answers, and its exit status is this program's; everything the
neighbour started is stopped on the way out, and a line says how many requests the neighbour's stack
answered meanwhile (so a run shows that the neighbour really ran).  ``scripts/test --busy`` runs the suite
this way (docs/development.md).
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

from scripts.benchmarks.peers.venvs import cache_root
from scripts.benchmarks.systems.shapes import Shape, shaped_model
from zbatch.testing import ROOT, Daemons, broker_stats, daemon_env, start_broker, start_gateway, start_worker

MODEL = "neighbour"
LOAD_HOURS_S = 24 * 3600.0  # a load generator's window: it is stopped long before
COMMAND_STOP_S = 60.0  # how long the command may take to stop its own processes when we are stopped


def log(message: str) -> None:
    print(f"[neighbour {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def model_folder(layers: int) -> Path:
    """The bundled model's config and tokenizer with ``layers`` layers of random (seeded) weights; built once."""
    return shaped_model(Shape(f"{layers} x 384", layers, 384, 12, 1536), cache_root() / "neighbour")


def start_stack(daemons: Daemons, folder: Path) -> str:
    """Broker, two workers of ``folder`` (torch, sharing their own ledger) and a gateway; the URL to POST to."""
    broker = daemons.add(start_broker(daemons.log_dir, "neighbour-broker"))
    workers = [daemons.add(start_worker(broker, daemons.log_dir, f"neighbour-{index}", wait=False, workers=2,
                                        model_path=str(folder), model_name=MODEL, runtime="torch"))
               for index in range(2)]
    daemons.wait(lambda: len((broker_stats(broker.frontend) or {"workers": []})["workers"]) == len(workers),
                 "the neighbour's workers to register")
    gateway = daemons.add(start_gateway(broker, daemons.log_dir, ready="/readyz", default_model=MODEL))
    return f"{gateway.url}/models/{MODEL}"


def start_load(url: str, loaders: int, clients: int) -> list[subprocess.Popen[bytes]]:
    shares = [clients // loaders + (index < clients % loaders) for index in range(loaders)]
    return [subprocess.Popen([sys.executable, "-m", "scripts.benchmarks.load.processes", "http", url, "--model", MODEL,
                              "--concurrency", str(share), "--warmup", "0", "--duration", str(LOAD_HOURS_S),
                              "--seed", str(index)], stdout=subprocess.DEVNULL, env=daemon_env(), cwd=ROOT)
            for index, share in enumerate(shares) if share]


def run_command(command: list[str]) -> int:
    """``command``'s exit status; stopped with us (SIGTERM, Ctrl-C), it gets SIGINT, on which pytest runs its
    teardown (the daemons its tests started), and time for it."""
    process = subprocess.Popen(command)
    try:
        return process.wait()
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(COMMAND_STOP_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def run(args: argparse.Namespace) -> int:
    """Start the neighbour, run the command (or wait for a signal), stop the neighbour; the command's status."""
    spinners: list[subprocess.Popen[bytes]] = []
    loaders: list[subprocess.Popen[bytes]] = []
    daemons = Daemons()
    try:
        url = start_stack(daemons, model_folder(args.layers))
        loaders = start_load(url, args.loaders, args.clients)
        spinners = [subprocess.Popen(["yes"], stdout=subprocess.DEVNULL) for _ in range(args.busy_loops)]
        log(f"{args.busy_loops} busy loops; a {args.layers}-layer model behind {url} under {args.clients} clients "
            f"from {len(loaders)} processes; logs in {daemons.log_dir}")
        if not args.command:
            while True:
                signal.pause()
        return run_command(args.command)
    except KeyboardInterrupt:
        return 130
    finally:
        for process in [*loaders, *spinners]:
            process.terminate()
            process.wait()
        stats = broker_stats(daemons["neighbour-broker"].frontend) if "neighbour-broker" in daemons else None
        answered = json.dumps(stats["models"].get(MODEL, {}).get("requests", {})) if stats else "nothing"
        daemons.close()
        log(f"stopped; its stack answered {answered}")


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m scripts.neighbour", description=__doc__.splitlines()[0])
    parser.add_argument("--loaders", type=int, default=4, help="load-generator processes (default 4)")
    parser.add_argument("--clients", type=int, default=32, help="closed-loop clients, over all of them (default 32)")
    parser.add_argument("--busy-loops", type=int, default=2, help="processes spinning on a core (default 2)")
    parser.add_argument("--layers", type=int, default=12, help="the neighbour model's layers (default 12)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command to run beside it")
    args = parser.parse_args()
    args.command = args.command[1:] if args.command[:1] == ["--"] else args.command
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))  # to the finally: stop it all
    sys.exit(run(args))


if __name__ == "__main__":
    main()
