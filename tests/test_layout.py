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
    return set().union(*statement_imports(source, package))


def statement_imports(source: str, package: str) -> list[set[str]]:
    """What each import statement of ``source`` names, as :func:`imported_modules` counts it."""
    statements: list[set[str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            statements.append({alias.name for alias in node.names})
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{parent}.{base}" if base else parent
            statements.append({base, *(f"{base}.{alias.name}" for alias in node.names)})
    return statements


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


def test_the_broker_never_loads_numpy_or_a_model_library() -> None:
    """The broker never decodes payloads: what it loads is its start, and a restarted lone broker's outage."""
    code = ("import sys, broker.__main__, broker.server; "
            "loaded = [m for m in ('numpy', 'torch', 'transformers', 'tokenizers') if m in sys.modules]; "
            "print(', '.join(loaded)); sys.exit(1 if loaded else 0)")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=False)
    assert result.returncode == 0, f"the broker loaded: {result.stdout.strip()} {result.stderr.strip()}"


def test_importing_zbatch_is_cheap_but_the_client_is_there() -> None:
    code = ("import sys, zbatch; assert 'zmq' not in sys.modules; "
            "from zbatch import AsyncClient, Client; assert 'zmq' in sys.modules; print(Client.__module__)")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "zbatch.client.sync"


# --------------------------------------------------------------------------- the gateway's arrows run one way

GATEWAY = ROOT / "gateway"
# The wiring that mounts the dialects and gathers their parts: the only gateway modules beside the dialects
# package that may import it (no dialect imports them back).
GATEWAY_WIRING = frozenset({"gateway.app", "gateway.openapi"})


def package_modules(folder: Path) -> dict[str, tuple[str, str]]:
    """Every module of the package in ``folder`` by full name, with the package its relative imports start from
    and its source."""
    modules = {}
    for path in sorted(folder.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        package = ".".join(parts[:-1])
        name = package if parts[-1] == "__init__" else f"{package}.{parts[-1]}"
        modules[name] = (name if parts[-1] == "__init__" else package, path.read_text(encoding="utf-8"))
    return modules


def import_graph(modules: dict[str, tuple[str, str]]) -> dict[str, set[str]]:
    """Module -> the modules among ``modules`` it imports: at the top, in a function or for type checking only."""
    graph: dict[str, set[str]] = {}
    for name, (package, source) in modules.items():
        found = set()
        for statement in statement_imports(source, package):
            submodules = {imported for imported in statement if imported in modules}
            for imported in statement:
                if any(sub.startswith(f"{imported}.") for sub in submodules):
                    continue  # from package import submodule: the submodule, not the package's other names
                owner = imported if imported in modules else imported.rpartition(".")[0]  # from m import name
                if owner in modules and owner != name:
                    found.add(owner)
        graph[name] = found
    return graph


def arrows_into_dialects(graph: dict[str, set[str]]) -> list[str]:
    """``module: imports X`` for every import of the dialects package from outside it and its wiring."""
    def in_dialects(module: str) -> bool:
        return module == DIALECTS_PACKAGE or module.startswith(f"{DIALECTS_PACKAGE}.")

    return [f"{name}: imports {target}" for name, targets in sorted(graph.items())
            if not in_dialects(name) and name not in GATEWAY_WIRING
            for target in sorted(targets) if in_dialects(target)]


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Each circle of imports found by a depth-first walk, as the modules around it, the first again at its end."""
    cycles: list[list[str]] = []
    done: set[str] = set()

    def walk(module: str, path: list[str]) -> None:
        for target in sorted(graph[module]):
            if target in path:
                cycles.append([*path[path.index(target):], target])
            elif target not in done:
                walk(target, [*path, target])
        done.add(module)

    for module in sorted(graph):
        if module not in done:
            walk(module, [module])
    return cycles


def test_no_shared_gateway_module_imports_a_dialect() -> None:
    """The dialects import the gateway's shared modules, never the other way: only the wiring mounts them."""
    graph = import_graph(package_modules(GATEWAY))
    assert {DIALECTS_PACKAGE, f"{DIALECTS_PACKAGE}.tei", *GATEWAY_WIRING} <= set(graph)
    assert arrows_into_dialects(graph) == []


@pytest.mark.parametrize("package", ["zbatch", "broker", "worker", "gateway"])
def test_no_import_cycle_among_a_packages_modules(package: str) -> None:
    """Type-only and lazy imports count: a circle is two rooms a reader has to hold at once."""
    assert import_cycles(import_graph(package_modules(ROOT / package))) == []


@pytest.mark.parametrize("source", ["from gateway.dialects import routes_by_dialect", "from gateway import dialects",
                                    "def f():\n    from gateway.dialects.tei import route_models",
                                    "if TYPE_CHECKING:\n    from .dialects import tei"])
def test_the_gateway_checks_see_an_arrow_into_the_dialects(source: str) -> None:
    """The checks themselves can fail: an absolute, from-package, lazy or type-only import of the dialects counts,
    and makes a circle where the dialect imports the module back."""
    modules = {"gateway.responses": ("gateway", source),
               "gateway.dialects": ("gateway.dialects", "from gateway.responses import json_response"),
               "gateway.dialects.tei": ("gateway.dialects", "from gateway.responses import json_response")}
    graph = import_graph(modules)
    assert arrows_into_dialects(graph)[0].startswith("gateway.responses: imports gateway.dialects")
    assert import_cycles(graph)
    del modules["gateway.responses"]
    assert arrows_into_dialects(import_graph(modules)) == []


def test_the_cycle_check_sees_a_type_only_circle_and_not_a_submodule_taken_from_its_package() -> None:
    settings = {"w.config": ("w", "from w.model_settings import served_models"),
                "w.model_settings": ("w", "if TYPE_CHECKING:\n    from w.config import WorkerConfig")}
    assert import_cycles(import_graph(settings)) == [["w.config", "w.model_settings", "w.config"]]
    package = {"w": ("w", "from w.base import load"), "w.base": ("w", "from w import device"),
               "w.device": ("w", "")}
    assert import_cycles(import_graph(package)) == []
    package["w.base"] = ("w", "from w import load")  # a name the package itself defines: a circle
    assert import_cycles(import_graph(package)) == [["w", "w.base", "w"]]
