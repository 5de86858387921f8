"""The bench's rooms (``scripts/benchmarks/README.md``), checked against its imports.

Imports go one way: report, cases, then systems and peers, then load, then common; the studies
use systems, load and common.  The peers' server scripts run in the peers' own venvs, so they
import nothing of zbatch nor of the bench beyond the peers package itself.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.test_layout import imported_modules

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "scripts" / "benchmarks"
PREFIX = "scripts.benchmarks"
LOWER: dict[str, set[str]] = {"common": set(), "load": {"common"}}
LOWER |= {"systems": {"load", *LOWER["load"]}, "peers": {"load", *LOWER["load"]}}
LOWER["cases"] = {"systems", "peers", *LOWER["systems"]}
LOWER["report"] = {"cases", *LOWER["cases"]}
LOWER["studies"] = {"systems", *LOWER["systems"]}
PROJECT = ("zbatch", "broker", "worker", "gateway")
BENCH_SIDE_OF_PEERS = (f"{PREFIX}.peers.systems", f"{PREFIX}.peers.venvs")


def room_of(module: str) -> str:
    """The room a bench module is in ("cases", "load", ...); "" for anything else."""
    return module.removeprefix(f"{PREFIX}.").split(".")[0] if module.startswith(f"{PREFIX}.") else ""


def crossings(module: str, package: str, source: str) -> list[str]:
    """``module imports X`` for each import of a bench room that is neither the module's own nor below it."""
    room = room_of(module)
    return sorted(f"{module} imports {name}" for name in imported_modules(source, package)
                  if (target := room_of(name)) in LOWER and target != room and target not in LOWER[room])


def room_crossings(room: str) -> list[str]:
    found = []
    for path in sorted((BENCH / room).rglob("*.py")):
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        found += crossings(module, package, path.read_text(encoding="utf-8"))
    return found


@pytest.mark.parametrize("room", sorted(LOWER))
def test_each_room_imports_only_the_rooms_below_it(room: str) -> None:
    assert room_crossings(room) == []


def test_the_check_sees_an_arrow_upwards() -> None:
    """The check itself can fail: a lazy import of a case from the load room is an arrow the wrong way."""
    source = "def f():\n    from scripts.benchmarks.cases.model import run\n"
    assert crossings(f"{PREFIX}.load.loops", f"{PREFIX}.load", source) == [
        f"{PREFIX}.load.loops imports {PREFIX}.cases.model", f"{PREFIX}.load.loops imports {PREFIX}.cases.model.run"]


def test_the_peer_servers_import_nothing_of_zbatch_or_the_bench() -> None:
    """They run in each peer's own venv, where neither zbatch nor the bench's dependencies are installed."""
    peers = BENCH / "peers"
    scripts = [*sorted(peers.glob("*_server.py")), peers / "embed.py", peers / "__init__.py"]
    found = [f"{path.name} imports {name}" for path in scripts
             for name in imported_modules(path.read_text(encoding="utf-8"), f"{PREFIX}.peers")
             if name.split(".")[0] in PROJECT or name.startswith(BENCH_SIDE_OF_PEERS)
             or (name.startswith(f"{PREFIX}.") and room_of(name) != "peers")]
    assert found == []
