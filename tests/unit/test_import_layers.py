"""Import direction between our modules, read from the source with ``ast``.

Every import counts: module level, inside functions (lazy imports), under
``TYPE_CHECKING``, and ``importlib.import_module("...")`` with a literal name, since a
lazy import hides a cycle rather than removing it. Importing ``a.b.c`` also runs
``a`` and ``a.b``.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("pipeline", "detectors", "schemas")
SERVICE_CLIS = ("pipeline.cli.actuator", "pipeline.cli.worker", "pipeline.cli.alertmanager")
#: ``python -m`` entry points: nothing imports them, so they close no loop.
ENTRY_POINTS = {"pipeline.__main__", "pipeline.services.worker.__main__"}


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


#: The floors, lowest first: a module may import its own floor and the floors below it,
#: never one above it nor a sibling on the same level (``client`` and ``policy`` both stand
#: on ``io`` and know nothing of each other).
FLOORS: tuple[tuple[str, ...], ...] = (
    ("schemas",),
    ("detectors",),
    ("pipeline.io",),
    ("pipeline.client", "pipeline.policy"),
    ("pipeline.agents",),
    ("pipeline.services",),
    ("pipeline.tools",),
    ("pipeline.cli",),
)
#: ``python -m`` entry points: nothing imports them, so they may reach any floor.
FLOOR_EXEMPT = {"pipeline", *ENTRY_POINTS}
#: What training code imports must not load these (a training node installs only the client).
HEAVY = ("faust", "aiokafka", "chdb", "clickhouse_driver", "matplotlib", "numpy", "yaml", "river")


def _floor(module: str) -> tuple[int, str] | None:
    for level, names in enumerate(FLOORS):
        for floor in names:
            if module == floor or module.startswith(floor + "."):
                return level, floor
    return None


def _ancestors(module: str) -> set[str]:
    parts = module.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts))}


def test_every_module_stands_on_a_floor():
    homeless = [m for m in _sources() if _floor(m) is None and m not in FLOOR_EXEMPT]
    assert not homeless, f"modules outside every floor: {homeless}"


def test_the_graph_sees_lazy_imports():
    # the command line imports the demo inside a command function
    assert "pipeline.tools.demo" in _graph()["pipeline.cli.app"]
    assert set(SERVICE_CLIS) <= _graph()["pipeline.cli.app"]


def test_no_import_runs_up_a_floor_or_across_to_a_sibling():
    wrong = []
    for name, deps in _graph().items():
        if name in FLOOR_EXEMPT:
            continue
        here = _floor(name)
        assert here is not None
        for dep in deps - _ancestors(name):
            there = _floor(dep)
            if there is None:
                continue  # the top package ``pipeline`` itself
            if there[0] > here[0] or (there[0] == here[0] and there[1] != here[1]):
                wrong.append(f"{name} ({here[1]}) -> {dep} ({there[1]})")
    assert not wrong, "imports running up the floors:\n" + "\n".join(sorted(wrong))


def _cycles() -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), ignoring the
    edge from a module to the packages above it (importing ``a.b`` runs ``a``)."""
    graph = {m: sorted(d - _ancestors(m)) for m, d in _graph().items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycle():
    assert not _cycles(), f"import cycles: {_cycles()}"


def test_the_cycle_check_sees_a_cycle(monkeypatch):
    graph = dict(_graph())
    graph["detectors.signals"] = graph["detectors.signals"] | {"detectors.frame"}
    graph["detectors.frame"] = graph["detectors.frame"] | {"detectors.signals"}
    monkeypatch.setattr(sys.modules[__name__], "_graph", lambda: graph)
    assert ["detectors.frame", "detectors.signals"] in _cycles()


def test_the_floor_check_sees_an_import_running_up():
    assert _floor("pipeline.client.exporter") < _floor("pipeline.services.worker.app")
    assert _floor("pipeline.services.worker") < _floor("pipeline.tools.up")
    assert _floor("pipeline.client")[0] == _floor("pipeline.policy")[0]


def test_only_entry_points_import_the_command_line():
    importers = {
        m
        for m, deps in _graph().items()
        if _floor(m) != _floor("pipeline.cli")
        and any(_floor(d) == _floor("pipeline.cli") for d in deps)
    }
    assert importers <= ENTRY_POINTS, f"{sorted(importers - ENTRY_POINTS)} import pipeline.cli"


@pytest.mark.parametrize("module", [*SERVICE_CLIS, "pipeline.cli.util"])
def test_service_clis_never_lead_back_to_the_command_line(module):
    assert "pipeline.cli.app" not in _reachable(module)


def test_importing_the_client_loads_nothing_heavy():
    # in a fresh interpreter: what ``import pipeline.client`` really runs, third-party
    # imports of the modules it reaches included
    code = (
        "import sys, pipeline.client, pipeline.client.listener\n"
        f"print(sorted({{m.partition('.')[0] for m in sys.modules}} & set({HEAVY!r})))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()
    assert out == "[]", f"import pipeline.client loads {out}"


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


def test_the_step_detector_protocol_stands_below_the_suite():
    # what a step detector implements (detectors.protocol) must not lead to the suite
    # that drives the detectors, nor to the adapters or the job core: a detector
    # module importing the protocol would close a loop through them
    reached = _reachable("detectors.protocol")
    drivers = {"detectors.engine", "detectors.step_detectors", "detectors.job"}
    assert not reached & drivers, f"detectors.protocol reaches {sorted(reached & drivers)}"
    assert "detectors.protocol" in _graph()["detectors.step_detectors"]
    assert "detectors.protocol" in _graph()["detectors.engine"]
