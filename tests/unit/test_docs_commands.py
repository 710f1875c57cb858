"""Every ``stepguard ...`` line in a code block of the README and docs/ parses against the
real command line (issue 41 item 7): a renamed command or option, a wrong value type or
an old spelling in the docs fails here, not in a reader's shell."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import typer.main

from pipeline.cli.app import app

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
#: a command line in a fenced block: optional prompt, venv path, env assignments
LINE = re.compile(r"^\s*(?:\$ )?(?:[A-Z_]+=\S+ )*(?:\S*/)?(?:\.venv/bin/)?stepguard( .*)?$")


def command_lines(page: Path) -> list[tuple[int, str]]:
    """(line number, the stepguard command) of each command in the page's code blocks,
    continuation lines joined, comments and what follows a shell operator cut."""
    out: list[tuple[int, str]] = []
    in_code = False
    lines = page.read_text().splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.lstrip().startswith("```"):
            in_code = not in_code
        elif in_code and LINE.match(line):
            start = i
            loop = next((m for k in range(max(0, i - 3), i)
                         if (m := re.match(r"\s*for (\w+) in (\S+)", lines[k]))), None)  # fmt: skip
            while line.rstrip().endswith("\\") and i + 1 < len(lines):
                i += 1
                line = line.rstrip()[:-1] + " " + lines[i].strip()
            if loop is not None:  # `for role in a b c; do stepguard ... $role`: the first
                line = line.replace("$" + loop.group(1), loop.group(2))
            out.append((start + 1, line))
        i += 1
    return out


def argv_of(line: str) -> list[str]:
    words = shlex.split(line, comments=True)
    for op in ("&&", "||", "|", ";", "&", ">", "2>", ">>", "<"):
        if op in words:
            words = words[: words.index(op)]
    words = [w.rstrip("&;") for w in words]
    at = next(i for i, w in enumerate(words) if w == "stepguard" or w.endswith("/stepguard"))
    return [w for w in words[at + 1 :] if w]


CASES = [
    pytest.param(argv_of(line), id=f"{page.relative_to(ROOT)}:{n}")
    for page in PAGES
    for n, line in command_lines(page)
]


def test_the_docs_have_commands_to_check():
    assert len(CASES) >= 30


@pytest.mark.parametrize("argv", CASES)
def test_a_documented_command_line_parses(argv):
    cmd = typer.main.get_command(app)
    args = list(argv)
    path = ["stepguard"]
    while hasattr(cmd, "commands"):  # a group: its own options, then a subcommand
        own = {o for p in cmd.params for o in (*p.opts, *p.secondary_opts)} | {"--help"}
        while args and args[0].startswith("-"):
            assert args[0] in own, f"{' '.join(path)} has no option {args[0]}"
            args.pop(0)
        if not args:
            return  # `stepguard --version`, `stepguard archive --help`
        name = args.pop(0)
        assert name in cmd.commands, f"{' '.join(path)} has no command {name!r}"
        cmd, path = cmd.commands[name], [*path, name]
    if "--help" in args:
        return
    # parses and converts every value (a documented `--speed fast` fails here)
    cmd.make_context(" ".join(path), args)
