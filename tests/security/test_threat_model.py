"""SECURITY.md's threat model stays true to the tests: every row names at least one
test under ``tests/security/``, and every test it names exists."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CITED = re.compile(r"`(tests/[\w/]+\.py)::(\w+)`")


def _rows() -> list[str]:
    text = (ROOT / "SECURITY.md").read_text()
    section = text.split("## Threat model", 1)[1].split("\n## ", 1)[0]
    lines = [line for line in section.splitlines() if line.startswith("| ")]
    return lines[1:]  # without the header (the separator does not start with "| ")


def _functions(path: str) -> set[str]:
    tree = ast.parse((ROOT / path).read_text())
    return {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}


def test_every_threat_has_a_security_test_and_every_cited_test_exists():
    rows = _rows()
    assert len(rows) >= 14
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert len(cells) == 5, row  # writer | topic | could | control | test
        cited = CITED.findall(cells[4])
        assert any(path.startswith("tests/security/") for path, _ in cited), row
        for path, name in cited:
            assert (ROOT / path).exists(), path
            assert name in _functions(path), f"{path}::{name}"
