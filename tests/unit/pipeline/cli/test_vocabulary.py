"""One vocabulary (issue 41 item 3): every command spells each shared option the one way
docs/cli.md gives, old spellings are hidden aliases, help renders as text.

The checks read the real typer app, so a command added later cannot drift.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import typer.main
from typer.testing import CliRunner

from pipeline.cli.app import app
from pipeline.cli.options import ALIASES, SHARED, old_spellings

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[4]

#: Python parameter names that mean a shared concept, whatever they were called
CONCEPT_OF_NAME = {
    "job": "--job", "job_id": "--job",
    "scenario": "--scenario",
    "as_json": "--json",
    "json_path": "--out", "out": "--out",
    "speed": "--speed",
    "workers": "--workers",
    "incident": "--incident",
}  # fmt: skip


def _leaves(cmd, path: tuple[str, ...] = ()):
    if hasattr(cmd, "commands"):  # a group (typer's own click classes)
        for name, sub in cmd.commands.items():
            yield from _leaves(sub, (*path, name))
    else:
        yield path, cmd


LEAVES = list(_leaves(typer.main.get_command(app)))
IDS = [" ".join(p) for p, _ in LEAVES]


def _visible(cmd):
    return [p for p in cmd.params if not getattr(p, "hidden", False)]


@pytest.mark.parametrize(("path", "cmd"), LEAVES, ids=IDS)
def test_every_command_spells_the_shared_options_one_way(path, cmd):
    old = {a for a in ALIASES if a.startswith("--") and " " not in a}
    for p in _visible(cmd):
        assert not old & set(p.opts), f"{path}: {p.opts} shows an old spelling"
        concept = CONCEPT_OF_NAME.get(p.name or "") or next(
            (o for o in p.opts if o in SHARED), None
        )
        if concept is None:
            continue
        if concept == "--incident" and p.param_type_name == "argument":
            continue  # `label INCIDENT`: the id itself is the command's subject
        assert p.param_type_name == "option", f"{path}: {p.name} is positional, not {concept}"
        assert [o for o in p.opts if o.startswith("--")] == [concept], (path, p.opts)
        if concept == "--json":
            assert p.is_flag, f"{path}: --json prints to stdout; a file is --out FILE"
        if concept == "--out":
            assert not p.is_flag, f"{path}: --out takes a FILE"


def test_the_docs_list_every_command():
    table = (ROOT / "docs" / "cli.md").read_text().split("## Commands", 1)[1]
    listed = set(re.findall(r"`([a-z][a-z-]*)`", table.split("\n## ", 1)[0]))
    assert set(typer.main.get_command(app).commands) <= listed


def test_the_docs_table_names_every_shared_option():
    table = (ROOT / "docs" / "cli.md").read_text()
    for option, (_, meaning) in SHARED.items():
        assert f"`{option}" in table, option
    for old in ALIASES:
        assert old.split()[0] in table, old


@pytest.mark.parametrize(("path", "cmd"), LEAVES, ids=IDS)
def test_help_renders_as_text(path, cmd):
    result = runner.invoke(app, [*path, "--help"], terminal_width=100)
    assert result.exit_code == 0, result.output
    assert "<bool>" not in result.output
    assert "``" not in result.output and not re.search(r":(mod|class|func|data):`", result.output)


def test_old_spellings_still_work_and_are_hidden():
    assert "--job-id" not in runner.invoke(app, ["simulate", "--help"]).output
    # --job and --job-id given different values: a usage error naming --job
    both = runner.invoke(app, ["simulate", "--scenario", "ci_smoke", "--job", "a", "--job-id", "b"])
    assert both.exit_code == 2 and "--job" in both.output
    assert old_spellings(["simulate", "ci_smoke", "--job-id", "j"])[:3] == [
        "simulate", "--scenario", "ci_smoke",
    ]  # fmt: skip
    assert old_spellings(["plan", "--json", "plan.json"]) == ["plan", "--out", "plan.json"]


def test_version():
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0 and re.fullmatch(r"stepguard \S+\n", result.output)


def test_scenarios_lists_every_name_the_commands_accept(monkeypatch):
    from pipeline.cli import app as app_module
    from pipeline.tools.simulator import DEMO_DIR, find_scenario, load_suite

    monkeypatch.setattr(app_module.console, "width", 250)
    result = runner.invoke(app, ["scenarios"], terminal_width=200)
    assert result.exit_code == 0
    names = {line.split("│")[1].strip() for line in result.output.splitlines() if "│" in line}
    expected = {p.stem for p in DEMO_DIR.glob("*.yaml")} | {s.name for s in load_suite()}
    assert {"default", "ci_smoke"} <= names and expected <= names
    for name in names - {""}:
        find_scenario(name)  # raises for a name the commands would refuse
