"""``zbatch-status``: a live terminal view of one broker, or several, built from their STATS answers.

The broker keeps only running totals, so rates (requests/s, shed/s) are the
difference between two refreshes; the first frame, and ``--once``, show
``-`` for them.  ``--json`` prints the raw statistics for scripts.

With several brokers (``--frontend`` lists them) each broker gets its own
frame, one under the other, and one that does not answer says so;
``--json`` prints their merged view (:mod:`zbatch.client.stats`), each
broker's own under ``brokers``.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from zbatch.client import AsyncClient, ZBatchError
from zbatch.client.stats import merge_stats
from zbatch.runtime import common_options
from zbatch.runtime.curve import check_client_settings, client_keys
from zbatch.runtime.settings import check_endpoints, check_exposure, load, option

CLEAR_SCREEN = "\x1b[H\x1b[2J"
STATS_TIMEOUT_MS = 2_000


@dataclass(frozen=True)
class StatusConfig:
    """zbatch-status: live view of a zbatch broker's models, backlogs and workers."""

    frontend: str = option("tcp://127.0.0.1:5555", "the brokers' frontend endpoints, comma-separated",
                           check=check_endpoints)
    refresh_ms: int = option(1_000, "time between refreshes", minimum=100)
    once: bool = option(False, "print one frame and exit")
    json: bool = option(False, "print the raw statistics as JSON once and exit (for scripts)")
    curve_server_key_file: str = common_options.curve_server_key_file()
    curve_secret_key_file: str = common_options.client_secret_key_file("this client's")
    insecure: bool = common_options.insecure()

    def __post_init__(self) -> None:
        problem = check_client_settings(self.curve_server_key_file, self.curve_secret_key_file)
        problem = problem or check_exposure({"frontend": self.frontend}, curve=bool(self.curve_server_key_file),
                                            insecure=self.insecure)
        if problem:
            raise ValueError(problem)


def load_config(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> StatusConfig:
    return load(StatusConfig, argv, environ, prog="zbatch-status", section="status")


@dataclass(frozen=True)
class Sample:
    at: float
    stats: dict[str, Any]


def render(endpoint: str, current: Sample, previous: Sample | None) -> str:
    """One frame of text: a header, a table of models, a table of workers."""
    stats = current.stats
    elapsed = current.at - previous.at if previous else 0.0
    before = previous.stats["models"] if previous and elapsed > 0 else {}

    def per_second(name: str, count: Callable[[dict[str, int]], int]) -> str:
        if name not in before:
            return "-"
        return f"{(count(stats['models'][name]['requests']) - count(before[name]['requests'])) / elapsed:.1f}"

    model_rows = [
        [name, model["backlog_items"], model["workers"], model["free_credit"],
         per_second(name, lambda requests: sum(requests.values())),
         per_second(name, lambda requests: requests.get("overloaded", 0)),
         f"{model['mean_batch_size']:.2f}"]
        for name, model in sorted(stats["models"].items())
    ]
    worker_rows = []
    for worker in sorted(stats["workers"], key=lambda w: (w["name"], w["identity"])):
        batches = sum(counters["batches"] for counters in worker["batches"].values())
        worker_rows.append([_shorten(worker["identity"]), worker["name"], worker["host"], worker["pid"],
                            worker["device"], ",".join(worker["models"]), worker["free_credit"],
                            worker["in_flight"], batches, f"{worker['last_seen_s']:.1f}s ago",
                            "draining" if worker["draining"] else "serving"])
    state = "  DRAINING" if stats["draining"] else ""
    return "\n".join([
        f"zbatch broker {endpoint}  up {_duration(stats['uptime_s'])}{state}",
        "",
        _table(["MODEL", "BACKLOG", "WORKERS", "FREE", "REQ/S", "SHED/S", "MEAN BATCH"], "<>>>>>>",
               model_rows),
        "",
        _table(["IDENTITY", "NAME", "HOST", "PID", "DEVICE", "MODELS", "FREE", "IN FLIGHT", "BATCHES",
                "HEARTBEAT", "STATE"], "<<<><<>>>><", worker_rows),
    ])


def _table(headers: list[str], align: str, rows: list[list[Any]]) -> str:
    """Columns padded to their widest cell; ``align`` holds one ``<`` or ``>`` per column."""
    cells = [headers] + [[str(cell) for cell in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = ["  ".join(f"{cell:{side}{width}}" for cell, side, width in zip(row, align, widths, strict=True))
             .rstrip() for row in cells]
    return "\n".join(lines if rows else [*lines, "(none)"])


def _shorten(identity_hex: str) -> str:
    return identity_hex if len(identity_hex) <= 16 else identity_hex[:15] + "…"


def _duration(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m{secs:02d}s" if hours else f"{minutes}m{secs:02d}s"


async def run(config: StatusConfig) -> int:
    """The exit status: 1 when no broker answers the first query."""
    curve = client_keys(config.curve_server_key_file, config.curve_secret_key_file)
    async with AsyncClient(config.frontend, curve=curve) as client:
        if len(client.endpoints) > 1:
            return await _watch_several(config, client)
        try:
            current = Sample(time.monotonic(), await client.stats(timeout_ms=STATS_TIMEOUT_MS))
        except ZBatchError as exc:
            print(f"zbatch-status: {exc}", file=sys.stderr)
            return 1
        if config.json:
            print(json.dumps(current.stats, indent=2))
            return 0
        previous: Sample | None = None
        problem = ""
        while True:
            frame = render(config.frontend, current, previous) + (f"\n\n{problem}" if problem else "")
            _show(frame)
            if config.once:
                return 0
            await asyncio.sleep(config.refresh_ms / 1000)
            try:  # after a good start, keep watching through a broker restart
                stats = await client.stats(timeout_ms=STATS_TIMEOUT_MS)
                previous, current, problem = current, Sample(time.monotonic(), stats), ""
            except ZBatchError as exc:
                problem = f"broker not answering ({exc}); showing its last answer"


async def _watch_several(config: StatusConfig, client: AsyncClient) -> int:
    """Like the view of one broker, a frame per broker; the brokers are asked at once at each refresh."""
    by_broker = await client.stats_by_broker(timeout_ms=STATS_TIMEOUT_MS)
    if all(isinstance(stats, ZBatchError) for stats in by_broker.values()):
        for error in by_broker.values():
            print(f"zbatch-status: {error}", file=sys.stderr)
        return 1
    if config.json:
        print(json.dumps(merge_stats(by_broker), indent=2))
        return 0
    current: dict[str, Sample] = {}
    previous: dict[str, Sample] = {}
    while True:
        now = time.monotonic()
        for endpoint, stats in by_broker.items():
            if not isinstance(stats, ZBatchError):
                if endpoint in current:
                    previous[endpoint] = current[endpoint]
                current[endpoint] = Sample(now, stats)
        _show("\n\n".join(_broker_frame(endpoint, answer, current.get(endpoint), previous.get(endpoint))
                           for endpoint, answer in by_broker.items()))
        if config.once:
            return 0
        await asyncio.sleep(config.refresh_ms / 1000)
        by_broker = await client.stats_by_broker(timeout_ms=STATS_TIMEOUT_MS)


def _broker_frame(endpoint: str, answer: dict[str, Any] | ZBatchError, current: Sample | None,
                  previous: Sample | None) -> str:
    if not isinstance(answer, ZBatchError):
        assert current is not None
        return render(endpoint, current, previous)
    if current is None:
        return f"zbatch broker {endpoint}  NOT ANSWERING: {answer}"
    return f"{render(endpoint, current, None)}\n\nbroker not answering ({answer}); showing its last answer"


def _show(frame: str) -> None:
    if sys.stdout.isatty():
        sys.stdout.write(CLEAR_SCREEN)
    print(frame, end="\n" if sys.stdout.isatty() else "\n\n", flush=True)


def main(argv: Sequence[str] | None = None) -> None:
    config = load_config(argv)
    try:
        sys.exit(asyncio.run(run(config)))
    except KeyboardInterrupt:
        sys.exit(0)  # Ctrl-C is how a live view ends
    except BrokenPipeError:  # `zbatch-status --json | head`: the reader left; say nothing more
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(1)


if __name__ == "__main__":
    main()
