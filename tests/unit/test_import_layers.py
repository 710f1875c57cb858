"""Import direction between our modules, read from the source with ``ast``.

Every import counts: module level, inside functions (lazy imports), under
``TYPE_CHECKING``, and ``importlib.import_module("...")`` with a literal name, since a
lazy import hides a cycle rather than removing it. Importing ``a.b.c`` also runs
``a`` and ``a.b``.
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("pipeline", "detectors", "schemas")
SERVICE_CLIS = (
    "pipeline.actuator.cli",
    "pipeline.worker.cli",
    "pipeline.services.alertmanager.cli",
)
#: ``python -m`` entry points: nothing imports them, so they close no loop.
ENTRY_POINTS = {"pipeline.__main__", "pipeline.worker.__main__"}


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def _sources() -> dict[str, Path]:
    return {_module_name(p): p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))}


def _imported(name: str, path: Path) -> set[str]:
    """Every module ``name`` imports (ours or not), with the packages above each."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                stem = ".".join([*base, node.module] if node.module else base)
            else:
                stem = node.module or ""
            found.add(stem)
            found.update(f"{stem}.{alias.name}" for alias in node.names)  # maybe modules
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute | ast.Name)
            and getattr(node.func, "attr", getattr(node.func, "id", None)) == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            found.add(node.args[0].value)
    with_parents = set()
    for module in found:
        parts = module.split(".")
        with_parents.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
    return with_parents


@cache
def _graph() -> dict[str, frozenset[str]]:
    """Our module -> the modules of ours it imports."""
    ours = _sources()
    return {
        name: frozenset(m for m in _imported(name, path) if m in ours and m != name)
        for name, path in ours.items()
    }


def _reachable(start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for nxt in _graph()[todo.pop()]:
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def test_the_graph_sees_lazy_imports():
    # pipeline.cli imports the demo inside a command function
    assert "pipeline.demo" in _graph()["pipeline.cli"]
    assert set(SERVICE_CLIS) <= _graph()["pipeline.cli"]


def test_only_entry_points_import_the_command_line():
    importers = {m for m, deps in _graph().items() if "pipeline.cli" in deps}
    assert importers <= ENTRY_POINTS, (
        f"{sorted(importers - ENTRY_POINTS)} import pipeline.cli; shared CLI helpers "
        "belong in pipeline.cliutil"
    )


@pytest.mark.parametrize("module", [*SERVICE_CLIS, "pipeline.cliutil"])
def test_service_clis_never_lead_back_to_the_command_line(module):
    assert "pipeline.cli" not in _reachable(module)


def test_no_module_imports_another_packages_private_module():
    wrong = []
    for name, deps in _graph().items():
        for dep in deps:
            parts = dep.split(".")
            private = [i for i, p in enumerate(parts) if p.startswith("_") and p[:2] != "__"]
            if private:
                owner = ".".join(parts[: private[0]])  # the package the private name is in
                if name != owner and not name.startswith(owner + "."):
                    wrong.append(f"{name} -> {dep}")
    assert not wrong, f"private modules imported from outside their package: {wrong}"
