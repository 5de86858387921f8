"""Virtual environments for the peers, installed on demand, one per peer, under a cache folder.

A peer cannot share the bench's environment: each pins its own versions of fastapi, numpy,
transformers and the rest.  So each gets its own venv in ``$ZBATCH_BENCH_CACHE/peers/NAME``
(default ``~/.cache/zbatch-bench/peers/NAME``), built from this interpreter's base Python, with
torch's CPU build installed first and pinned while the peer's own requirements go in: an
unpinned torch would pull a multi-GB CUDA build.  A stamp file records what was installed,
so the next run reuses the venv unless the requirements changed, and how long it took and how
much disk it used (BENCHMARKS.md reports both).  pip's output goes to ``install.log`` beside the
venv, so a failed install can be read there.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

CACHE_ENV = "ZBATCH_BENCH_CACHE"
TORCH = "torch==2.13.0"  # the CPU build this machine carries, as scripts/lib/venv.sh pins it
STAMP = ".zbatch-installed"
INSTALL_TIMEOUT_S = 1800.0


@dataclass(frozen=True)
class Venv:
    """A peer's installed environment."""

    name: str
    python: Path
    install_s: float  # how long its install took (when it was made, perhaps in an earlier run)
    size_mb: float
    versions: dict[str, str]  # what pip installed for the requirements' own packages

    def libdir(self) -> str:
        """The folder of this interpreter's own libpython, for programs that link it (Triton's Python stub)."""
        out = subprocess.run([str(self.python), "-c", "import sysconfig; print(sysconfig.get_config_var('LIBDIR'))"],
                             capture_output=True, text=True, check=True)
        return out.stdout.strip() or str(sysconfig.get_config_var("LIBDIR"))


def cache_root() -> Path:
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "zbatch-bench")


def _size_mb(folder: Path) -> float:
    total = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and not p.is_symlink())
    return round(total / 2**20, 1)


def _project(requirement: str) -> str:
    """The distribution a requirement names: ``ray[serve]==2.60.0`` gives ``ray``."""
    for stop in "[=<>~!; ":
        requirement = requirement.split(stop, 1)[0]
    return requirement


def _run(command: list[str], log: Path) -> None:
    with log.open("ab") as out:
        out.write(f"\n$ {' '.join(command)}\n".encode())
        out.flush()
        done = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, timeout=INSTALL_TIMEOUT_S, check=False)
    if done.returncode != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:])
        raise RuntimeError(f"`{' '.join(command)}` failed ({done.returncode}); end of {log}:\n{tail}")


def _versions(python: Path, requirements: tuple[str, ...]) -> dict[str, str]:
    names = [_project(r) for r in requirements] + ["torch"]
    code = ("import importlib.metadata as m, json, sys; "
            "print(json.dumps({n: m.version(n) for n in sys.argv[1:]}))")
    out = subprocess.run([str(python), "-c", code, *names], capture_output=True, text=True, check=True)
    return dict(json.loads(out.stdout))


def ensure(name: str, requirements: tuple[str, ...], log: Callable[[str], None] | None = None) -> Venv:
    """The venv of peer ``name`` with ``requirements``, made now if missing or made for other requirements.

    Blocks for as long as pip takes (a minute or two per peer here); ``log`` hears when an install
    starts and ends.
    """
    folder = cache_root() / "peers" / name
    python = folder / "bin" / "python"
    stamp = folder / STAMP
    want = {"requirements": list(requirements), "torch": TORCH}
    try:
        made = json.loads(stamp.read_text())
    except (OSError, ValueError):
        made = {}
    if python.exists() and {k: made.get(k) for k in want} == want:
        return Venv(name, python, float(made["install_s"]), float(made["size_mb"]), dict(made["versions"]))
    say = log or (lambda line: None)
    say(f"installing peer {name} into {folder}: {TORCH}, then {' '.join(requirements)} (pip's output: "
        f"{folder.parent / f'{name}-install.log'})")
    started = time.monotonic()
    if folder.exists():
        shutil.rmtree(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    install_log = folder.parent / f"{name}-install.log"
    install_log.write_text("")
    base = getattr(sys, "_base_executable", sys.executable)  # a venv's python makes a venv of its base
    _run([base, "-m", "venv", str(folder)], install_log)
    pin = folder / "constraints.txt"
    pin.write_text(TORCH + "\n")
    pip = [str(python), "-m", "pip", "install", "--disable-pip-version-check", "--no-input"]
    _run([*pip, TORCH], install_log)
    _run([*pip, "-c", str(pin), *requirements], install_log)
    venv = Venv(name, python, round(time.monotonic() - started, 1), _size_mb(folder), _versions(python, requirements))
    made = want | {"install_s": venv.install_s, "size_mb": venv.size_mb, "versions": venv.versions}
    stamp.write_text(json.dumps(made, indent=1) + "\n")
    say(f"installed peer {name} in {venv.install_s:.0f} s, {venv.size_mb:.0f} MB")
    return venv
