"""Which GPUs this host has, and which device each worker of ``zbatch serve`` is pinned to.

The supervisor imports no torch (a broker or gateway host has none), so it
finds the GPUs the way CUDA will number them in the workers: the indices
``CUDA_VISIBLE_DEVICES`` leaves visible where it is set (an empty value, or
one that starts with ``-1``, hides them all), else one per line of
``nvidia-smi -L``, else none.

On a host with GPUs, ``zbatch serve`` runs ``workers_per_gpu`` workers on
each, pinned with ``--device cuda:N``: a worker's CPU side (its I/O loop,
its tokenizer pool, the Python that launches each batch) is what limits a
small model on a big GPU, so several processes per GPU keep it busier than
one.  By default (:func:`workers_per_gpu`) a GPU gets one worker for every
:data:`CORES_PER_WORKER` of the host's cores it has to itself, from 1 to
:data:`MAX_WORKERS_PER_GPU`: each worker more serves more until the host's
cores or the GPU's contexts run out, and past that a worker more serves less
(BENCHMARKS.md, GPU: workers per GPU, which set both).  The workers
interleave on the GPU, each in its own CUDA context.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping

NVIDIA_SMI_TIMEOUT_S = 10.0
CORES_PER_WORKER = 4  # host cores a GPU worker's CPU side, with its share of the gateway and broker, keeps busy
MAX_WORKERS_PER_GPU = 4  # past it, workers on one GPU served less (BENCHMARKS.md, GPU: workers per GPU)


def visible_gpus(environ: Mapping[str, str], nvidia_smi_lines: list[str] | None) -> int:
    """How many GPUs the workers will see: from ``CUDA_VISIBLE_DEVICES``, else ``nvidia-smi -L``'s GPU lines."""
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        ids = [each.strip() for each in visible.split(",") if each.strip()]
        if "-1" in ids:  # CUDA stops at the first invalid index
            ids = ids[:ids.index("-1")]
        return len(ids)
    return sum(1 for line in nvidia_smi_lines or [] if line.startswith("GPU "))


def gpu_devices(setting: str, environ: Mapping[str, str] | None = None) -> list[str]:
    """The CUDA devices workers are pinned to: ``auto`` (every GPU found), ``none``, or indices ``0,2``."""
    if setting == "none":
        return []
    if setting != "auto":
        return [f"cuda:{index.strip()}" for index in setting.split(",") if index.strip()]
    environ = os.environ if environ is None else environ
    return [f"cuda:{index}" for index in range(visible_gpus(environ, _nvidia_smi_lines()))]


def workers_per_gpu(cores: int, gpus: int) -> int:
    """The default workers per GPU: one per :data:`CORES_PER_WORKER` cores a GPU has, 1 to 4."""
    return max(1, min(MAX_WORKERS_PER_GPU, cores // (CORES_PER_WORKER * max(1, gpus))))


def check_gpus(setting: str) -> str | None:
    """A ``gpus`` setting's problem, or None."""
    if setting in ("auto", "none"):
        return None
    indices = [index.strip() for index in setting.split(",")]
    if indices and all(index.isdigit() for index in indices) and len(set(indices)) == len(indices):
        return None
    return "must be auto, none, or distinct GPU indices such as 0,1"


def _nvidia_smi_lines() -> list[str] | None:
    """``nvidia-smi -L``'s lines; None where it is missing or fails (no driver, no GPU)."""
    command = shutil.which("nvidia-smi")
    if command is None:
        return None
    try:
        done = subprocess.run([command, "-L"], capture_output=True, text=True, timeout=NVIDIA_SMI_TIMEOUT_S,
                              check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.splitlines() if done.returncode == 0 else None
