"""The detail sections under the main table: overload, storm, peers, CPU per request, worker batches, worker
starts.

Each is Markdown, printed with the table and written into BENCHMARKS.md, and
appears only when the run has rows for it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from scripts.benchmarks.cases import peers as cases_peers
from scripts.benchmarks.cases import start as cases_start
from scripts.benchmarks.cases import transitions as cases_transitions
from scripts.benchmarks.report.results import number, sorted_rows


def _table_start(title: str, intro: str, columns: list[str]) -> list[str]:
    """A section heading, its explanation and a table header; the caller appends the rows."""
    return ["", f"### {title}", "", intro, "", "| " + " | ".join(columns) + " |", "|---" * len(columns) + "|"]


def _overload(over_rows: list[dict[str, Any]]) -> list[str]:
    d = over_rows[0]["detail"]
    intro = (f"Offered {d['factor']:.0f}× the capacity each system showed at concurrency 32, for "
             f"{d['duration_s']:.0f} s, Poisson arrivals, open loop; requests still unanswered a grace period "
             "later count as unanswered.")
    out = _table_start("Overload", intro, [
        "system", "capacity req/s", "offered req/s", "sent", "answered", "unanswered", "goodput req/s",
        "goodput / capacity", "accepted p50 / p99 ms", "503 p99 ms", "statuses"])
    for r in over_rows:
        d = r["detail"]
        accepted = d["all_latency_by_status"].get("ok", {})
        statuses = ", ".join(f"{k}: {v}" for k, v in sorted(d["all_statuses"].items()))
        cells = [r["system"], number(d["capacity_req_s"]), number(d["offered_rate"]), str(d["sent"]),
                 str(d["answered"]), str(d["unanswered"]), number(d["req_s"]),
                 f"{d['req_s'] / d['capacity_req_s']:.2f}",
                 f"{number(accepted.get('p50_ms'))} / {number(accepted.get('p99_ms'))}", number(d["p99_503_ms"]),
                 statuses]
        out.append("| " + " | ".join(cells) + " |")
    return out


def _storm(storm_rows: list[dict[str, Any]]) -> list[str]:
    d = storm_rows[0]["detail"]
    intro = (f"{storm_rows[0]['concurrency']} closed-loop clients on as many connections for {d['duration_s']:.0f} s "
             "after a warm-up; each sends again at once on 503 (no backoff, Retry-After ignored) until the window "
             "closes. Meanwhile a probe in its own process sends 50 requests/s and times them: 503 p99 is the "
             "probe's (the storm's own clients saturate their event loop, whose queueing their figure includes). "
             "Accepted p99 is timed from the send that was accepted, then from the first send (zbatch's "
             f"deadline: {d['deadline_ms'] / 1000:.0f} s). Capacity: req/s at concurrency 32 in this run. "
             "Unanswered: no answer within the grace period, a timeout or a lost connection; never admitted: "
             "clients still refused when the window closed (each of their requests was answered 503).")
    out = _table_start("Storm", intro, [
        "system", "capacity req/s", "goodput req/s", "goodput / capacity", "503s",
        "503 p99 ms (probe / storm clients)", "accepted p99 ms (accepted send / first send)", "unanswered",
        "never admitted"])
    for r in storm_rows:
        d = r["detail"]
        cells = [r["system"], number(d["capacity_req_s"]), number(r["req_s"]),
                 f"{r['req_s'] / d['capacity_req_s']:.2f}", str(d["refused_503"]),
                 f"{number(d['p99_503_ms'])} / {number(d.get('p99_503_ms_storm_clients'))}",
                 f"{number(d['accepted_p99_ms'])} / {number(r['p99_ms'])}", str(d["unanswered"]),
                 str(d.get("never_admitted", "–"))]
        out.append("| " + " | ".join(cells) + " |")
    return out


def _shed(shed_rows: list[dict[str, Any]]) -> list[str]:
    d = shed_rows[0]["detail"]
    intro = (f"Closed-loop clients sending 32 texts a request for {d['duration_s']:.0f} s after a warm-up; a "
             "refused one waits the 503's Retry-After (up to a tenth more) and sends the same request again. "
             "Goodput: texts/s answered 200 over those of the same clients on the same stack with the default "
             "deadline, which they fit (capacity). Accepted p99 is over the admitted requests (answered 200, or "
             "504 when late), timed from the send that was admitted, at the client: it includes the client's "
             "and the gateway's own queueing, the deadline does not. Retries admitted: sends after a "
             "Retry-After that were answered 200.")
    out = _table_start("Shedding by time", intro, [
        "system", "clients", "deadline ms", "texts/s", "goodput / capacity", "statuses", "accepted p99 ms",
        "503 p50 / p99 ms", "Retry-After s", "retries admitted", "clients admitted"])
    for r in shed_rows:
        d = r["detail"]
        capacity = d.get("capacity_texts_s")
        cells = [r["system"], str(d["clients"]), str(d["deadline_ms"] or "30000 (default)"), number(d["texts_s"]),
                 f"{d['texts_s'] / capacity:.2f}" if capacity else "–",
                 ", ".join(f"{k}: {v}" for k, v in sorted(d["statuses"].items())), number(d["accepted_p99_ms"]),
                 f"{number(d['p50_503_ms'])} / {number(d['p99_503_ms'])}",
                 ", ".join(f"{k}: {v}" for k, v in sorted(d["retry_after_s"].items())) or "–",
                 f"{d['retries_admitted']} of {d['retries']}", f"{d['clients_admitted']} of {d['clients']}"]
        out.append("| " + " | ".join(cells) + " |")
    return out


def _peers(peer_rows: list[dict[str, Any]]) -> list[str]:
    """zbatch and each peer by concurrency (req/s, p50), zbatch over the best peer, then each peer's install."""
    zbatch = [r for r in peer_rows if r["system"] in cases_peers.ZBATCH_ROWS and "peers" in r["detail"]]
    notes = zbatch[0]["detail"]["peers"] if zbatch else {}
    systems = list(dict.fromkeys(r["system"] for r in peer_rows))
    levels = list(dict.fromkeys(r["concurrency"] for r in peer_rows))
    rounds = max(len(r["detail"].get("rounds") or []) for r in peer_rows)
    intro = ("zbatch over HTTP as `scripts/serve` ships it (broker, two workers sharing the cores through the "
             "ledger, gateway, each at its defaults) and with one worker on 2 torch threads (the zbatch-http stack), "
             "next to other serving frameworks, each in its "
             "own venv, serving the same model folder the same way: at most 32 items "
             "a batch, about 5 ms batching wait, 2 torch threads, truncation at 256 tokens, mean pooling, L2 norm. "
             "Before it was measured, each embedded five texts sent at once (one over 256 tokens) and had to give "
             "zbatch's vectors "
             "(lowest cosine below). The bench's closed-loop aiohttp load generator and texts, one text per request, "
             f"a warm-up before each point; medians over {rounds} round(s), each peer frozen while the others ran. "
             "Cells: requests/s · p50 ms.")
    out = _table_start("Peers", intro, ["system", *(f"c={c}" for c in levels)])
    cell = {(r["system"], r["concurrency"]): r for r in peer_rows}
    for system in systems:
        cells = [f"{number(r['req_s'])} · {number(r['p50_ms'])} ms" if (r := cell.get((system, c))) else "–"
                 for c in levels]
        out.append(f"| {system} | " + " | ".join(cells) + " |")
    for system in (name for name in cases_peers.ZBATCH_ROWS if name in systems):
        ratios = []
        for c in levels:
            paired = cell[(system, c)]["detail"].get("paired", {}) if (system, c) in cell else {}
            ratios.append(f"{paired['vs_best_peer']:.2f}× ({paired['best_peer']})" if "vs_best_peer" in paired
                          else "–")
        out.append(f"| **{system} ÷ best peer** (texts/s, paired in rounds) | " + " | ".join(ratios) + " |")
    installed = notes.get("peers", {})
    if installed:
        out += ["", "| peer | served as (`scripts/benchmarks/peers/`) | lowest cosine to zbatch | venv install | "
                "venv size | packages |", "|---|---|---|---|---|---|"]
        for system, note in installed.items():
            versions = ", ".join(f"{k} {v}" for k, v in note["versions"].items())
            out.append(f"| {system} | {note.get('setup', '')} | {note['cosine']:.7f} | {note['install_s']:.0f} s | "
                       f"{note['size_mb']:,.0f} MB | {versions} |")
    for name, why in notes.get("left_out", {}).items():
        out += ["", f"Left out: **{name}**: {why}"]
    return out


def _batches(batch_rows: list[dict[str, Any]]) -> list[str]:
    out = _table_start("Batches the worker ran",
                       "From the worker's Prometheus histograms, scraped before and after each measurement "
                       "(warm-up included, all rounds together; several workers added up); model ms is the "
                       "workers' own time per batch.",
                       ["case", "system", "concurrency", "batches", "mean size", "mean model ms",
                        "sizes (size: count)"])
    for r in batch_rows:
        b = r["detail"]["worker_batches"]
        hist = ", ".join(f"{k}: {v}" for k, v in b["histogram"].items())
        out.append(f"| {r['case']} | {r['system']} | {r['concurrency']} | {b['batches']} | {b['mean_size']:.1f} | "
                   f"{b['mean_batch_ms']:.1f} | {hist} |")
    return out


def _cpu(cpu_rows: list[dict[str, Any]]) -> list[str]:
    out = _table_start("CPU per request",
                       "CPU time each process used during the measured window (from /proc; the load generator's "
                       "own process time), divided by the requests completed in it (storm: by the answers, 503s "
                       "included). On 2 shared cores throughput ratios mix a process's cost with its neighbours'; "
                       "this figure does not depend on how the cores were shared. Sleeps: how often the threads "
                       "of each process blocked (voluntary context switches, /proc), per request; each is a "
                       "wake-up later, which is what a hop costs where waking an idle CPU is slow.",
                       ["case", "system", "concurrency", "µs of CPU per request, by process",
                        "thread sleeps per request, by process"])
    for r in cpu_rows:
        sleeps = r["detail"].get("sleeps_per_req") or r["detail"].get("sleeps_per_answer")
        sleeps_cell = _by_process(sleeps, lambda value: f"{value:.1f}") if sleeps else "–"  # older rows had none
        out.append(f"| {r['case']} | {r['system']} | {r['concurrency']} | {_by_process(_cpu_used(r), number)} | "
                   f"{sleeps_cell} |")
    return out


def _by_process(figures: dict[str, float], show: Callable[[float], str]) -> str:
    """``name figure · ... · total figure``."""
    parts = [f"{name} {show(value)}" for name, value in figures.items()]
    return " · ".join([*parts, f"total {show(sum(figures.values()))}"])


def _cpu_used(r: dict[str, Any]) -> dict[str, float]:
    return r["detail"].get("cpu_us_per_req") or r["detail"].get("cpu_us_per_answer") or {}


def details(rows: list[dict[str, Any]]) -> list[str]:
    """Every detail section the rows allow, in reading order."""
    ordered = sorted_rows(rows)
    lines: list[str] = []
    over_rows = [r for r in ordered if r["case"] == "overload"]
    if over_rows:
        lines += _overload(over_rows)
    storm_rows = [r for r in ordered if r["case"] == "storm"]
    if storm_rows:
        lines += _storm(storm_rows)
    shed_rows = [r for r in ordered if r["case"] == "shed"]
    if shed_rows:
        lines += _shed(shed_rows)
    lines += cases_transitions.section(ordered)
    peer_rows = [r for r in ordered if r["case"] == "peers"]
    if peer_rows:
        lines += _peers(peer_rows)
    cpu_rows = [r for r in ordered if _cpu_used(r)]
    if cpu_rows:
        lines += _cpu(cpu_rows)
    batch_rows = [r for r in ordered if r["detail"].get("worker_batches")]
    if batch_rows:
        lines += _batches(batch_rows)
    return lines + cases_start.section(ordered)
