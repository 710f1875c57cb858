"""Rules on the shape of the product code (``pipeline/``, ``detectors/``, ``schemas/``),
beside the floors of ``test_import_layers.py``, read from the source with ``ast``:

- no module over :data:`MAX_LINES` lines, no function over :data:`MAX_PARAMS`
  parameters (``self``/``cls`` not counted);
- inside ``detectors/``, a family (a sub-package: ``steps``, ``hang``, ``hardware``,
  ``training``, ``series``, ``grading``) imports no other family, and no module above
  the families (a top-level module that leads to a family: the config, the suite, the
  job core); what families share sits below them, in a top-level module that leads to
  no family (the vocabulary: ``base``, ``frame``, ``_stats``, ...).

What breaks a rule today is listed below, each with the reason it stands and the most it
may grow to: a new breach fails, an old one may not grow, and an entry that no longer
breaks its rule fails until it is deleted, so the lists only shrink (issue 38 item 5).
"""

from __future__ import annotations

import ast
import sys
from functools import cache
from pathlib import Path

from tests.unit.test_import_layers import _ancestors, _graph, _sources

ROOT = Path(__file__).resolve().parents[2]
MAX_LINES = 600
MAX_PARAMS = 12

#: module -> (the most lines it may have, why it stands over MAX_LINES)
LONG_MODULES: dict[str, tuple[int, str]] = {
    "detectors/job.py": (817, "the one detection core; its split by concern is issue 38 item 3"),
    "pipeline/cli/actuator.py": (617, "typer commands; split into groups as cli/archive.py is"),
    "pipeline/cli/app.py": (664, "typer commands; split into groups as cli/archive.py is"),
    "pipeline/client/pytorch/guard.py": (746, "TorchGuard: exporter, listener, relaunch, work"),
}

#: "module::Qualified.name" -> (the most parameters it may take, why it stands over MAX_PARAMS)
WIDE_FUNCTIONS: dict[str, tuple[int, str]] = {
    "detectors/frame.py::StepFrame.from_arrays": (16, "a column per rank field, optionals by name"),
    "pipeline/cli/actuator.py::control": (17, "a typer command: a parameter per option"),
    "pipeline/cli/app.py::calibrate": (15, "a typer command: a parameter per option"),
    "pipeline/client/exporter.py::StepExporter.record_step": (
        19, "the public per-rank record as keywords, work too; from the schema's columns in item 2",
    ),
    "pipeline/client/pytorch/guard.py::watch": (13, "the public one-call PyTorch setup"),
    "pipeline/cli/replay.py::replay": (13, "a typer command: a parameter per option"),
    "pipeline/tools/calibrate/command.py::run_calibrate": (14, "the calibrate command's options"),
}  # fmt: skip

#: (family module, module of another family) -> why the arrow stands: none stands (issue
#: 38 item 3 recut the families by what they watch; keep it so)
SIDEWAYS: dict[tuple[str, str], str] = {}

#: (family module, module above the families) -> why the arrow stands: none stands
UPWARD: dict[tuple[str, str], str] = {}


def _product_files() -> dict[str, Path]:
    return {p.relative_to(ROOT).as_posix(): p for p in _sources().values()}


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines())


def _functions(tree: ast.Module) -> dict[str, int]:
    """Every function and method by qualified name -> its parameter count."""
    found: dict[str, int] = {}

    def visit(node: ast.AST, prefix: str, in_class: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                a = child.args
                names = [*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg]
                count = sum(x is not None for x in names)
                if (
                    in_class
                    and (a.posonlyargs or a.args)[:1]
                    and ((a.posonlyargs or a.args)[0].arg in ("self", "cls"))
                ):
                    count -= 1
                name = f"{prefix}{child.name}"
                found[name] = max(count, found.get(name, 0))  # an overload: the widest
                visit(child, f"{name}.", False)
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.", True)
            else:
                visit(child, prefix, in_class)

    visit(tree, "", False)
    return found


@cache
def _widths() -> dict[str, int]:
    out: dict[str, int] = {}
    for rel, path in _product_files().items():
        tree = ast.parse(path.read_text(), rel)
        out.update({f"{rel}::{name}": n for name, n in _functions(tree).items()})
    return out


def _breaches(sizes: dict[str, int], limit: int, allowed: dict[str, tuple[int, str]]) -> list[str]:
    """What breaks a size rule beyond its listed allowance, and listed entries now fine."""
    wrong = [
        f"{name}: {n} > {limit}" for name, n in sizes.items() if n > limit and name not in allowed
    ]
    for name, (most, _why) in allowed.items():
        n = sizes.get(name)
        if n is None or n <= limit:
            wrong.append(f"{name}: no longer over {limit}: delete it from the list")
        elif n > most:
            wrong.append(f"{name}: grew to {n} (listed at {most}): shrink it, do not raise it")
    return sorted(wrong)


def test_no_module_over_600_lines():
    sizes = {rel: _lines(path) for rel, path in _product_files().items()}
    wrong = _breaches(sizes, MAX_LINES, LONG_MODULES)
    assert not wrong, "modules over the line limit:\n" + "\n".join(wrong)


def test_no_function_over_12_parameters():
    wrong = _breaches(_widths(), MAX_PARAMS, WIDE_FUNCTIONS)
    assert not wrong, "functions over the parameter limit:\n" + "\n".join(wrong)


def test_every_listed_exception_says_why():
    for allowed in (LONG_MODULES, WIDE_FUNCTIONS):
        assert all(len(why.split()) >= 3 for _most, why in allowed.values())
    assert all(len(why.split()) >= 3 for why in (*SIDEWAYS.values(), *UPWARD.values()))


def test_the_size_checks_see_a_breach_growth_and_a_stale_entry():
    allowed = {"b.py": (700, "why it stands"), "c.py": (700, "why it stands")}
    sizes = {"a.py": 601, "b.py": 701, "c.py": 600, "d.py": 600}
    assert _breaches(sizes, 600, allowed) == [
        "a.py: 601 > 600",
        "b.py: grew to 701 (listed at 700): shrink it, do not raise it",
        "c.py: no longer over 600: delete it from the list",
    ]


def test_parameters_are_counted_as_a_reader_counts_them():
    tree = ast.parse(
        "def f(a, /, b, *args, c, **kw): pass\n"
        "class C:\n"
        "    def m(self, a, *, b): pass\n"
        "    @classmethod\n"
        "    def k(cls, a): pass\n"
        "    def outer(self):\n"
        "        def inner(self, x): pass\n"
    )
    assert _functions(tree) == {"f": 5, "C.m": 2, "C.k": 1, "C.outer": 0, "C.outer.inner": 2}


# -- families inside detectors/ ---------------------------------------------------------


def _family(module: str) -> str | None:
    """``detectors.steps`` for anything in ``detectors/steps/``; None for a top-level module."""
    parts = module.split(".")
    if parts[0] != "detectors" or len(parts) < 2:
        return None
    package = ROOT / "detectors" / parts[1]
    return f"detectors.{parts[1]}" if (package / "__init__.py").is_file() else None


def _leads_to_a_family(module: str) -> bool:
    seen, todo = set(), [module]
    while todo:
        here = todo.pop()
        for nxt in _graph()[here] - _ancestors(here):
            if _family(nxt) is not None:
                return True
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return False


def _arrows() -> tuple[set[tuple[str, str]], set[tuple[str, str]]]:
    """(sideways, upward) arrows out of the families: sideways into another family,
    upward into a top-level module that leads to a family. A package counts only when
    none of its modules is imported too (``from detectors.steps import peer``)."""
    sideways, upward = set(), set()
    for name, deps in _graph().items():
        home = _family(name)
        if home is None:
            continue
        below = deps - _ancestors(name)
        for dep in below:
            if any(d.startswith(dep + ".") for d in below):
                continue  # the package of a module it imports
            there = _family(dep)
            if there is not None and there != home:
                sideways.add((name, dep))
            elif there is None and dep.startswith("detectors.") and _leads_to_a_family(dep):
                upward.add((name, dep))
    return sideways, upward


def test_no_family_imports_another_family_sideways():
    sideways, _ = _arrows()
    new = sorted(f"{a} -> {b}" for a, b in sideways - set(SIDEWAYS))
    gone = sorted(f"{a} -> {b}" for a, b in set(SIDEWAYS) - sideways)
    assert not new, "families importing each other (share through a module below them):\n" + (
        "\n".join(new)
    )
    assert not gone, "arrows no longer there: delete them from SIDEWAYS:\n" + "\n".join(gone)


def test_no_family_imports_a_module_above_the_families():
    _, upward = _arrows()
    new = sorted(f"{a} -> {b}" for a, b in upward - set(UPWARD))
    gone = sorted(f"{a} -> {b}" for a, b in set(UPWARD) - upward)
    assert not new, "families importing a module above them:\n" + "\n".join(new)
    assert not gone, "arrows no longer there: delete them from UPWARD:\n" + "\n".join(gone)


def test_the_family_check_sees_a_new_arrow(monkeypatch):
    graph = dict(_graph())
    graph["detectors.grading.grader"] = graph["detectors.grading.grader"] | {
        "detectors.series.scorer",  # sideways
        "detectors.engine",  # up: the suite leads to every family
        "detectors.frame",  # vocabulary: allowed
    }
    monkeypatch.setattr(sys.modules[__name__], "_graph", lambda: graph)
    sideways, upward = _arrows()
    assert ("detectors.grading.grader", "detectors.series.scorer") in sideways
    assert ("detectors.grading.grader", "detectors.engine") in upward
    assert not any(b == "detectors.frame" for _a, b in sideways | upward)


def test_vocabulary_and_hubs_are_told_apart():
    assert _family("detectors.steps.peer") == "detectors.steps"
    assert _family("detectors.frame") is None and _family("schemas.telemetry") is None
    assert not _leads_to_a_family("detectors.base")
    assert not _leads_to_a_family("detectors.frame")
    assert _leads_to_a_family("detectors.engine")
