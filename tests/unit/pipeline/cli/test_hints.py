"""The commands stepguard tells a person to run exist, spelt the canonical way (issue 41
item 3): the demo's `next:` hints are parsed by the real CLI exactly as printed, and
every `stepguard ...` a message or docstring of pipeline/, or the prose of the README
and docs/ (their code blocks: tests/unit/test_docs_commands.py), quotes names a command
that exists and options it has (not a hidden old spelling).

A new user copies these lines; one that names `stepguard approvals` (which never
existed) or `--job-id` (an old spelling) sends them to a usage error.
"""

from __future__ import annotations

import re
import shlex
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
import typer
import typer.main
from rich.console import Console
from typer._click import exceptions as click_errors

from pipeline.cli.app import app

ROOT = Path(__file__).resolve().parents[4]
CLI = typer.main.get_command(app)
#: options of the entry point itself, accepted after a command too (`stepguard status -v`)
GLOBAL = {"-v", "--verbose", "--help", "--version"}


def resolve(argv: list[str]) -> tuple[Any, list[str], list[str]]:
    """The command ``argv`` names, its path, and the rest; AssertionError when a name
    on the way is not a command."""
    cmd, path, rest = CLI, [], list(argv)
    while hasattr(cmd, "commands") and rest and not rest[0].startswith("-"):
        name = rest.pop(0)
        assert name in cmd.commands, f"`stepguard {' '.join([*path, name])}`: no such command"
        cmd, path = cmd.commands[name], [*path, name]
    return cmd, path, rest


def options_problem(argv: list[str]) -> str | None:
    """Why the options of ``argv`` are not the command's own visible ones (or None)."""
    cmd, path, rest = resolve(argv)
    visible = {o for p in cmd.params if not getattr(p, "hidden", False) for o in p.opts}
    visible |= {o for p in cmd.params for o in getattr(p, "secondary_opts", ())}
    for token in rest:
        for either in token.strip("[]").split("|"):  # `[--true|--false]`: either
            opt = either.split("=")[0]
            if opt.startswith("-") and opt not in visible | GLOBAL:
                return f"`stepguard {' '.join(path)}` has no option {opt}"
    return None


def parses(argv: list[str]) -> None:
    """``argv`` parsed by the real command as typed: unknown options, a missing
    required option or a bad value fail."""
    assert (problem := options_problem(argv)) is None, problem
    cmd, path, rest = resolve(argv)
    assert not hasattr(cmd, "commands"), f"`stepguard {' '.join(path)}` needs a subcommand"
    try:
        cmd.make_context(" ".join(path), rest, resilient_parsing=False)
    except typer.Exit:
        pass
    except click_errors.ClickException as exc:
        pytest.fail(f"`stepguard {' '.join(argv)}`: {exc.format_message()}")


def test_the_demos_next_hints_run_as_printed():
    from pipeline.tools.demo_summary import DemoSummary, print_summary

    summary = DemoSummary(
        scenario="ci_smoke", job_id="ci_smoke-1a2b3c4d", nodes=8, ranks=64, steps_completed=160,
        faults_injected=1, faults_detected=1, traps=0, trap_alerts=0, false_alerts=0,
        false_isolations=0, goodput=0.9, wall_seconds=60.0, messages_published=10,
        archived_rows=10, dead_letters=0, alerts_by_grade={}, commands={"isolate": 1},
    )  # fmt: skip
    out = StringIO()
    print_summary(summary, Console(file=out, width=300))
    (line,) = [x for x in out.getvalue().splitlines() if x.startswith("next: ")]
    hints = [h.strip() for h in re.split(r"\s{2,}", line.removeprefix("next: ")) if h.strip()]
    assert len(hints) >= 2, line
    for hint in hints:
        argv = shlex.split(hint)
        assert argv[0] == "stepguard", hint
        parses(argv[1:])
        assert summary.job_id in argv, hint  # about the job the demo just played


def test_the_old_spellings_are_caught_by_this_check():
    """The check itself fails on what issue 41 found (so it can fail)."""
    assert options_problem(["simulate", "--scenario", "ci_smoke", "--job-id", "j"])
    with pytest.raises(AssertionError, match="no such command"):
        resolve(["approvals"])
    with pytest.raises(BaseException, match="--job"):
        parses(["report", "--out", "r.html"])  # report needs --job


_QUOTED = re.compile(r"`(stepguard [^`\"'{}]+)`")


def _quoted_commands() -> list[tuple[str, str]]:
    found = []
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    for path in [*sorted((ROOT / "pipeline").rglob("*.py")), *pages]:
        for m in _QUOTED.finditer(path.read_text()):
            text = " ".join(m.group(1).split())
            if not re.fullmatch(r"[a-z][a-z-]*", text.split()[1]):
                continue  # `stepguard sql/query/report`, `stepguard <service>`, `COMMAND`
            found.append((str(path.relative_to(ROOT)), text))
    return found


QUOTED = _quoted_commands()


@pytest.mark.parametrize(("where", "text"), QUOTED, ids=[f"{w}: {t}" for w, t in QUOTED])
def test_every_command_a_message_quotes_exists_with_its_options(where, text):
    argv = shlex.split(text)[1:]
    problem = options_problem(argv)
    assert problem is None, f"{where}: {problem}"


def test_the_messages_quote_commands():
    assert len(QUOTED) > 20  # the scan finds what it checks
