"""The executor kinds are one list (``pipeline.services.actuator.kinds``): the builders,
``resume-node``, ``up``, the command line's help and the docs' table all follow it."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pipeline.cli import actuator as actuator_cli
from pipeline.cli.app import app
from pipeline.services.actuator import executors
from pipeline.services.actuator.kinds import EXECUTOR_KINDS, ExecutorKind, executor_kind
from pipeline.tools.demo_summary import DRY_RUN_EXECUTORS

ROOT = Path(__file__).resolve().parents[5]
DOCS = ROOT / "docs" / "actuator.md"
#: a row of the kinds table in docs/actuator.md: | `kind` | what | `extra` | yes/no |
ROW = re.compile(r"^\| `([a-z-]+)` \| ([^|]+) \| (?:`([a-z-]+)`)? *\| (yes|no) \|$")


def docs_table() -> list[ExecutorKind]:
    """The kinds as docs/actuator.md's table lists them, in its order."""
    text = DOCS.read_text()
    section = text[text.index("## Executors") :]
    rows = [ROW.match(line) for line in section.splitlines()[:20]]
    return [
        ExecutorKind(name=m[1], summary=m[2].strip(), extra=m[3], resumes=m[4] == "yes")
        for m in rows
        if m is not None
    ]


def test_the_docs_table_is_the_registry():
    expected = [(k.name, k.summary, k.extra, k.resumes) for k in EXECUTOR_KINDS.values()]
    assert [(k.name, k.summary, k.extra, k.resumes) for k in docs_table()] == expected


def test_the_docs_check_sees_a_kind_missing_from_the_table(monkeypatch, tmp_path):
    page = tmp_path / "actuator.md"
    page.write_text(re.sub(r"(?m)^\| `webhook` .*\n", "", DOCS.read_text()))
    monkeypatch.setattr(sys.modules[__name__], "DOCS", page)
    assert [k.name for k in docs_table()] == ["dry-run", "slurm", "kubernetes"]
    with pytest.raises(AssertionError):
        test_the_docs_table_is_the_registry()


def test_every_kind_has_a_builder_and_every_builder_a_kind():
    assert list(executors.EXECUTORS) == list(EXECUTOR_KINDS)
    assert set(executors._BUILDERS) == set(EXECUTOR_KINDS)


def test_resume_node_offers_exactly_the_kinds_that_resume():
    resuming = {k.name for k in EXECUTOR_KINDS.values() if k.resumes}
    assert set(actuator_cli.RESUMERS) == resuming
    assert {str(v) for v in actuator_cli.ResumeOn} == resuming


def test_an_unknown_kind_is_one_clear_error_naming_the_kinds():
    expected = re.escape("unknown executor 'k8s'; expected dry-run | slurm")
    with pytest.raises(ValueError, match=expected):
        executor_kind("k8s")
    with pytest.raises(ValueError, match="'k8s'"):
        executors.make_executor("k8s", None)  # type: ignore[arg-type]


@pytest.mark.parametrize("argv", [["executor", "nope"], ["up", "--executor", "nope"]])
def test_the_command_line_refuses_an_unknown_kind_and_names_them_all(argv):
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 2
    assert "expected " + " | ".join(EXECUTOR_KINDS) in " ".join(result.output.split())


@pytest.mark.parametrize("command", [["executor", "--help"], ["up", "--help"]])
def test_the_help_lists_every_kind(command):
    out = " ".join(CliRunner().invoke(app, command, terminal_width=200).output.split())
    assert " | ".join(EXECUTOR_KINDS) in out


def test_the_demo_counts_only_dry_run_kinds_as_would_be():
    assert {k.name for k in EXECUTOR_KINDS.values() if k.dry_run} == DRY_RUN_EXECUTORS
    assert "dry-run" in DRY_RUN_EXECUTORS and "slurm" not in DRY_RUN_EXECUTORS


def test_the_registrys_examples_run():
    import doctest

    from pipeline.services.actuator import kinds

    assert doctest.testmod(kinds).attempted >= 4
    assert doctest.testmod(kinds).failed == 0
