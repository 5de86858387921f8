"""Where and how a model runs: the device (``auto``, ``cpu``, ``cuda:N``), the weights dtype, CPU features.

torch is imported inside the functions, so importing this module stays cheap.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

DTYPES = ("auto", "float32", "float16", "bfloat16")
CPU_BATCH_SIZE = 32  # the default largest batch on the CPU, where a batch's time grows with its tokens
ACCELERATOR_BATCH_SIZE = 128  # on CUDA, where a pass's time is mostly fixed (BENCHMARKS.md, the gpu case)
NATIVE_BFLOAT16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})  # x86 CPU flags of bfloat16 arithmetic


def resolve_device(requested: str) -> str:
    """Turn "auto"/"cpu"/"cuda"/"cuda:N" into a device that exists here, or fail with a one-line reason."""
    import torch

    if requested in ("auto", "cpu"):
        return "cuda" if requested == "auto" and torch.cuda.is_available() else "cpu"
    kind, _, index = requested.partition(":")
    if kind != "cuda" or (index and not index.isdigit()):
        raise ValueError(f"unsupported device {requested!r}; use auto, cpu, cuda or cuda:N")
    if not torch.cuda.is_available():
        raise ValueError(
            f"device {requested!r} requested but CUDA is not available on this host; use --device cpu or auto"
        )
    count = torch.cuda.device_count()
    if index and int(index) >= count:
        raise ValueError(
            f"device {requested!r} requested but this host has {count} CUDA device(s); "
            f"use cuda:0..cuda:{count - 1}"
        )
    return requested


def torch_dtype(requested: str, device: str, model_path: str = "") -> torch.dtype:
    """Map the dtype option to torch: "auto" is float32 on the CPU and float16 on CUDA (bfloat16 for a model
    saved in bfloat16: such models can overflow float16's range); float16 is CUDA-only, bfloat16 runs anywhere.

    On CUDA, half precision runs several times faster than float32 and its
    vectors match float32's closely (BENCHMARKS.md, GPU: vectors).  On the
    CPU bfloat16 is opt-in because it changes the outputs slightly: on a CPU
    with AVX512-BF16 or AMX it runs faster than float32 (BENCHMARKS.md,
    bfloat16 on the CPU); without them torch emulates it, so loading warns.
    float16 on a CPU is emulated and slower than float32, so it is refused
    there.
    """
    import torch

    if requested not in DTYPES:
        raise ValueError(f"unsupported dtype {requested!r}; use one of {', '.join(DTYPES)}")
    if requested == "auto":
        requested = "float32" if not device.startswith("cuda") else saved_half_dtype(model_path) or "float16"
    if requested == "float16" and not device.startswith("cuda"):
        raise ValueError(
            f"dtype 'float16' needs a CUDA device but the model runs on {device}, where it is several times "
            "slower than float32; use --dtype float32, or bfloat16 on a CPU with AVX512-BF16 or AMX"
        )
    dtype: torch.dtype = getattr(torch, requested)
    return dtype


def saved_half_dtype(model_path: str) -> str | None:
    """"bfloat16" for a model whose config says it was saved in bfloat16, else None."""
    try:
        config = json.loads((Path(model_path) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    saved = config.get("dtype") or config.get("torch_dtype") if isinstance(config, dict) else None
    return "bfloat16" if saved == "bfloat16" else None


def batch_size(device: str) -> int:
    """The largest batch when the model's own setting is 0: the device's default."""
    return CPU_BATCH_SIZE if device == "cpu" else ACCELERATOR_BATCH_SIZE


def cpu_flags(cpuinfo: str | None = None) -> set[str]:
    """The CPU's feature flags from ``/proc/cpuinfo`` (Linux); empty where it cannot be read."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(errors="replace")
        except OSError:
            return set()
    return {flag for line in cpuinfo.splitlines() if line.startswith("flags")
            for flag in line.split(":", 1)[-1].split()}


def cpu_model_name(cpuinfo: str | None = None) -> str:
    """The CPU's model name from ``/proc/cpuinfo`` (Linux), else what :mod:`platform` says ("" if nothing)."""
    import platform

    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(errors="replace")
        except OSError:
            cpuinfo = ""
    for line in cpuinfo.splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[-1].strip()
    return platform.processor()


def cpu_identity() -> dict[str, str]:
    """The CPU, as far as what a library computes and how fast depends on it: its architecture, model and flags
    (a hash of them), for the keys of what a start keeps (:mod:`worker.runners.start_cache`)."""
    import hashlib
    import platform

    flags = " ".join(sorted(cpu_flags()))
    return {"machine": platform.machine(), "model": cpu_model_name(),
            "flags": hashlib.sha256(flags.encode()).hexdigest()[:16]}


def cpu_lacks_native_bfloat16(cpuinfo: str | None = None, machine: str | None = None) -> bool:
    """True on an x86 CPU whose flags show neither AVX512-BF16 nor AMX-BF16 (False when it cannot tell).

    Reads the flags rather than torch's private CPU checks, whose names change between releases.
    """
    import platform

    if (machine or platform.machine()).lower() not in ("x86_64", "amd64"):
        return False
    flags = cpu_flags(cpuinfo)
    return bool(flags) and not flags & NATIVE_BFLOAT16_FLAGS
