"""PNG charts of one run: throughput and latency vs concurrency, batch sizes, peers, scaling.

matplotlib is optional (scripts/bench installs it): without it the run still
writes its table, BENCHMARKS.md and the JSON, and says the charts were skipped.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

SYSTEMS = ("zbatch-http", "zbatch-zmq", "zbatch-serve", "baseline-naive", "baseline-batched", "zbatch-bf16")
LIMIT_LABELS = {"limit": "limit float32", "limit-bf16": "limit bfloat16"}


def _series(rows: list[dict[str, Any]], case: str, key: str) -> tuple[list[int], list[float]]:
    points = sorted((r["concurrency"], r[key]) for r in rows
                    if r["case"] == case and isinstance(r["concurrency"], int) and r[key] is not None)
    return [c for c, _ in points], [v for _, v in points]


def _log2_axis(ax: Any, values: list[int]) -> None:
    """Log-2 x axis labelled with the measured points themselves (1, 8, 32, ...), not powers of two."""
    ax.set_xscale("log", base=2)
    ax.set_xticks(values)
    ax.set_xticklabels([str(v) for v in values])
    ax.minorticks_off()


def write_charts(rows: list[dict[str, Any]], out_dir: Path) -> list[Path]:
    """Write the charts the rows allow; returns their paths (empty if matplotlib is missing)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    written: list[Path] = []

    def save(fig: Any, name: str) -> None:
        path = out_dir / name
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)

    present = [case for case in SYSTEMS if any(r["case"] == case for r in rows)]
    concurrencies = sorted({r["concurrency"] for r in rows
                            if r["case"] in present and isinstance(r["concurrency"], int)})
    if present:
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for case in present:
            ax.plot(*_series(rows, case, "texts_s"), marker="o", label=case)
        for case, color in (("limit", "grey"), ("limit-bf16", "tab:brown")):
            limits = [r for r in rows if r["case"] == case and r["system"] != "direct, batch 8"]
            # in the legend: close values would hide labels; at most three limit lines per dtype
            for r, style in zip(limits, (":", "--", "-."), strict=False):
                ax.axhline(r["texts_s"], linestyle=style, color=color, linewidth=1,
                           label=f"{LIMIT_LABELS[case]}, {r['system'].removeprefix('direct, ')}")
        ax.set(xlabel="concurrent clients (closed loop)", ylabel="texts/s",
               title="Throughput vs concurrency (all-MiniLM-L6-v2, CPU)")
        _log2_axis(ax, concurrencies)
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=8, loc="lower right")
        ax.grid(alpha=0.3)
        save(fig, "throughput.png")

        fig, ax = plt.subplots(figsize=(7, 4.5))
        for i, case in enumerate(present):
            color = f"C{i}"
            ax.plot(*_series(rows, case, "p50_ms"), marker="o", color=color, label=f"{case} p50")
            ax.plot(*_series(rows, case, "p99_ms"), marker="x", linestyle="--", color=color, label=f"{case} p99")
        ax.set(yscale="log", xlabel="concurrent clients (closed loop)", ylabel="latency ms",
               title="Latency vs concurrency (p50 solid, p99 dashed)")
        _log2_axis(ax, concurrencies)
        ax.legend(fontsize=7, ncol=2)
        ax.grid(alpha=0.3, which="both")
        save(fig, "latency.png")

    batched = [r for r in rows if r["case"] == "zbatch-http" and r["detail"].get("worker_batches")]
    if batched:
        fig, axes = plt.subplots(len(batched), 1, figsize=(7, 1.8 + 1.4 * len(batched)), sharex=True, squeeze=False)
        for ax, r in zip(axes[:, 0], batched, strict=True):
            hist = r["detail"]["worker_batches"]["histogram"]
            ax.bar(list(hist), list(hist.values()), width=0.8)  # labels are the histogram's buckets, in order
            ax.set_ylabel("batches")
            ax.set_title(f"zbatch-http, concurrency {r['concurrency']}", fontsize=9)
        axes[-1, 0].set_xlabel("batch size (items, Prometheus buckets of the worker)")
        save(fig, "batch_sizes.png")

    peers = list(dict.fromkeys(r["system"] for r in rows if r["case"] == "peers"))
    if peers:  # zbatch and each peer: texts/s and p50 by concurrency, side by side
        fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.5))
        levels = sorted({r["concurrency"] for r in rows if r["case"] == "peers"})
        for i, system in enumerate(peers):
            points = sorted((r["concurrency"], r["texts_s"], r["p50_ms"]) for r in rows
                            if r["case"] == "peers" and r["system"] == system and r["texts_s"] is not None)
            look: dict[str, Any] = {"marker": "o", "color": f"C{i}", "label": system,
                                    "linewidth": 2.5 if i == 0 else 1.2}  # zbatch first, in bold
            left.plot([c for c, _, _ in points], [t for _, t, _ in points], **look)
            right.plot([c for c, _, _ in points], [p for _, _, p in points], **look)
        left.set(xlabel="concurrent clients (closed loop)", ylabel="texts/s", title="zbatch and its peers: throughput")
        right.set(xlabel="concurrent clients (closed loop)", ylabel="p50 ms", yscale="log", title="p50 latency")
        for ax in (left, right):
            _log2_axis(ax, levels)
            ax.grid(alpha=0.3, which="both")
        left.set_ylim(bottom=0)
        left.legend(fontsize=8, loc="lower right")
        save(fig, "peers.png")

    series = sorted({r["detail"]["series"] for r in rows if r["case"] == "scale"})
    if series:
        fig, ax = plt.subplots(figsize=(6, 4))
        for i, label in enumerate(series):
            points = sorted((r["detail"]["workers"], r["req_s"] or 0.0, r["detail"]["ideal_req_s"]) for r in rows
                            if r["case"] == "scale" and r["detail"]["series"] == label)
            workers = [n for n, _, _ in points]
            ax.plot(workers, [v for _, v, _ in points], marker="o", color=f"C{i}", label=f"{label}, measured")
            ax.plot(workers, [v for _, _, v in points], linestyle=":", color=f"C{i}", label=f"{label}, ideal")
        ax.set(xlabel="simulated workers (64 clients each)", ylabel="req/s", yscale="log",
               title="Broker throughput vs workers")
        _log2_axis(ax, sorted({r["detail"]["workers"] for r in rows if r["case"] == "scale"}))
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3, which="both")
        save(fig, "scale.png")
    return written
