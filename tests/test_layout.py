"""The layout's rules, as stated at the top of ``zbatch/__init__.py``, checked against the code.

Imports are read from the source with ``ast`` (every ``import`` and ``from``
statement, including those inside functions), so a crossing cannot hide in a
lazy import.  The purity of the sans-I/O cores is checked for real: a fresh
interpreter imports the module and must not have loaded ``zmq`` or ``asyncio``.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DAEMONS = ("broker", "worker", "gateway")
PACKAGES = ("zbatch", *DAEMONS)
# Sans-I/O: they take a clock and return decisions; the shells around them do the I/O.
PURE_MODULES = ("broker.core", "broker.state", "zbatch.protocol.messages", "zbatch.protocol.wire",
                "zbatch.protocol.payloads", "zbatch.protocol.vocabulary", "worker.batching", "worker.assembler",
                "worker.threads", "worker.core", "zbatch.supervisor.policy")


def imported_packages(path: Path) -> set[str]:
    """The top-level packages a source file imports, wherever the import statement stands."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found


def crossings(package: str) -> list[str]:
    """``file: imports X`` for every import of another daemon package (or of any daemon, from zbatch)."""
    forbidden = set(DAEMONS) - {package}
    return [f"{path.relative_to(ROOT)}: imports {name}"
            for path in sorted((ROOT / package).rglob("*.py"))
            for name in sorted(imported_packages(path) & forbidden)]


@pytest.mark.parametrize("package", PACKAGES)
def test_daemons_import_zbatch_and_never_one_another(package: str) -> None:
    assert crossings(package) == []


def test_the_walk_sees_a_crossing(tmp_path: Path) -> None:
    """The check itself can fail: a lazy import inside a function counts."""
    source = tmp_path / "sample.py"
    source.write_text("def f():\n    from gateway.app import create_app\n    import worker.runners\n")
    assert imported_packages(source) == {"gateway", "worker"}


DIALECTS = ROOT / "gateway" / "dialects"
DIALECTS_PACKAGE = "gateway.dialects"


def imported_modules(source: str, package: str) -> set[str]:
    """Every module ``source`` (a module of ``package``) imports, by full name: ``from a import b`` counts a.b too;
    relative imports are resolved."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{parent}.{base}" if base else parent
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def dialect_crossings(sources: dict[str, str]) -> list[str]:
    """``module: imports X`` for every dialect module (name -> source) that imports another one."""
    return [f"{name}: imports {imported}" for name, source in sorted(sources.items())
            for imported in sorted(imported_modules(source, DIALECTS_PACKAGE))
            if imported.removeprefix(f"{DIALECTS_PACKAGE}.") in set(sources) - {name}]


def test_a_dialect_never_imports_another() -> None:
    """Each dialect is one module: what two share lives in the gateway's shared modules, never in a dialect."""
    sources = {path.stem: path.read_text(encoding="utf-8") for path in DIALECTS.glob("*.py")
               if path.stem != "__init__"}
    assert {"zbatch", "huggingface", "openai", "tei", "kserve"} <= set(sources)
    assert dialect_crossings(sources) == []


@pytest.mark.parametrize("source", ["from gateway.dialects.tei import embed", "from gateway.dialects import tei",
                                    "from . import tei", "from .tei import embed",
                                    "def f():\n    import gateway.dialects.tei"])
def test_the_dialect_check_sees_a_crossing(source: str) -> None:
    """The check itself can fail: absolute, from-package, relative and lazy imports of a sibling all count."""
    assert dialect_crossings({"openai": source, "tei": ""}) == ["openai: imports gateway.dialects.tei"]


@pytest.mark.parametrize("module", PURE_MODULES)
def test_sans_io_modules_load_neither_zmq_nor_asyncio(module: str) -> None:
    code = (f"import sys, {module}; "
            "loaded = [m for m in ('zmq', 'asyncio') if m in sys.modules]; "
            "print(', '.join(loaded)); sys.exit(1 if loaded else 0)")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=False)
    assert result.returncode == 0, f"importing {module} loaded: {result.stdout.strip()} {result.stderr.strip()}"


def test_importing_zbatch_is_cheap_but_the_client_is_there() -> None:
    code = ("import sys, zbatch; assert 'zmq' not in sys.modules; "
            "from zbatch import AsyncClient, Client; assert 'zmq' in sys.modules; print(Client.__module__)")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "zbatch.client.sync"
