"""Nothing read from a topic, a changelog or a scratch file can run code.

Every module of ``pipeline/``, ``detectors/`` and ``schemas/`` is read with ``ast``:
none imports a serialiser that executes what it reads (pickle and its relatives), and
none calls ``eval``/``exec``/``compile`` or numpy's pickle-enabled loaders. State that
crosses a broker goes through :mod:`pipeline.io.statecodec` instead.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("pipeline", "detectors", "schemas")
#: modules that turn bytes into objects by running code chosen by the bytes
UNSAFE_MODULES = {"pickle", "cPickle", "_pickle", "dill", "cloudpickle", "jsonpickle",
                  "marshal", "shelve", "joblib"}  # fmt: skip
UNSAFE_CALLS = {"eval", "exec", "compile", "__import__"}


def modules() -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py"))


def offences(path: Path, root: Path = ROOT) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name.split(".")[0] for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [(node.module or "").split(".")[0]]
        else:
            names = []
        found += [f"imports {n}" for n in names if n in UNSAFE_MODULES]
        if isinstance(node, ast.Call):
            fn = node.func  # the builtins, not re.compile or a method called exec
            if isinstance(fn, ast.Name) and fn.id in UNSAFE_CALLS:
                found.append(f"calls {fn.id}()")
            for kw in node.keywords:  # np.load(..., allow_pickle=True)
                if kw.arg == "allow_pickle" and not (
                    isinstance(kw.value, ast.Constant) and kw.value.value is False
                ):
                    found.append("allow_pickle")
    return [f"{path.relative_to(root)}:{o}" for o in found]


@pytest.mark.parametrize("path", modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_module_can_run_code_chosen_by_data(path: Path) -> None:
    assert offences(path) == []


def test_the_scan_finds_what_it_looks_for(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text(
        "import pickle\nfrom marshal import loads\nimport numpy as np\n"
        "eval('1')\nnp.load('x', allow_pickle=True)\n"
    )
    assert offences(bad, tmp_path) == [
        "bad.py:imports pickle", "bad.py:imports marshal", "bad.py:calls eval()",
        "bad.py:allow_pickle",
    ]  # fmt: skip
