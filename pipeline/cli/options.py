"""The shared options of the ``stepguard`` commands: one spelling, one meaning each.

A command that takes one of these concepts declares it with the constructor here, so
its name cannot drift; ``tests/unit/pipeline/cli/test_vocabulary.py`` reads the whole
command tree and fails when a command spells one otherwise. docs/cli.md is the table a
person reads; :data:`SHARED` is the one the test reads.

====================  =======================================================================
option                meaning
====================  =======================================================================
``--job J``           a job id: the one a command reads, filters on or gives a run
``--scenario S``      a scenario: a suite or demo name (``stepguard scenarios``) or a YAML path
``--json``            print JSON to standard output instead of a table (a flag)
``--out FILE``        write the command's result (JSON, HTML, config) to FILE
``--speed X``         play event time x X in real time (1 = real time)
``--workers N``       detection worker processes
``--incident ID``     an incident id: the 24-hex incident key (``alerts``, ``status``,
                      ``query incidents`` print it); an episode fingerprint is accepted
====================  =======================================================================

Old spellings stay for one release as hidden aliases (:data:`ALIASES`).
"""

from __future__ import annotations

from typing import Any

import typer

__all__ = [
    "ALIASES",
    "SHARED",
    "alias_of",
    "job_option",
    "json_flag",
    "old_spellings",
    "pick",
    "out_option",
    "scenario_option",
    "speed_option",
    "workers_option",
]

#: canonical spelling -> (the name its parameter has in Python, what it means)
SHARED: dict[str, tuple[str, str]] = {
    "--job": ("job", "a job id: the one the command reads, filters on or gives a run"),
    "--scenario": ("scenario", "a demo or suite scenario name (stepguard scenarios), or YAML"),
    "--json": ("as_json", "print JSON to standard output instead of a table (a flag)"),
    "--out": ("out", "write the command's result to this file"),
    "--speed": ("speed", "play event time x SPEED in real time (1 = real time)"),
    "--workers": ("workers", "detection worker processes"),
    "--incident": ("incident", "an incident id (24 hex), or an episode fingerprint"),
}  # fmt: skip

#: old spelling -> canonical; accepted (hidden from --help) until the next release
ALIASES: dict[str, str] = {
    "--job-id": "--job",
    "--json FILE": "--out",
    "SCENARIO (positional)": "--scenario",
}


def job_option(help: str) -> Any:
    return typer.Option("--job", help=help)


_SCENARIO_HELP = "Demo or suite scenario name (stepguard scenarios), or a YAML path."
_SPEED_HELP = "Play event time x SPEED in real time (1 = real time)."


def scenario_option(help: str = _SCENARIO_HELP) -> Any:
    return typer.Option("--scenario", help=help)


def json_flag(help: str = "Print JSON to standard output instead of a table.") -> Any:
    return typer.Option("--json", help=help)


def out_option(help: str) -> Any:
    return typer.Option("--out", help=help)


def speed_option(help: str = _SPEED_HELP, **kw: Any) -> Any:
    return typer.Option("--speed", min=0.001, help=help, **kw)


def workers_option(help: str = "Detection worker processes.") -> Any:
    return typer.Option("--workers", min=1, max=64, help=help)


def alias_of(old: str) -> Any:
    """A hidden option for an old spelling (its value goes to the canonical one)."""
    return typer.Option(old, hidden=True, help=f"Old spelling of {ALIASES[old]}.")


def pick(name: str, new: Any, old: Any) -> Any:
    """The value of a shared option given under its canonical name or its old one
    (both: a usage error naming them)."""
    if new is not None and old is not None and new != old:
        raise typer.BadParameter(f"give {name} once (its old spelling is an alias)")
    return new if new is not None else old


#: commands whose ``--json FILE`` (before the shared vocabulary) is now ``--out FILE``
_JSON_FILE_COMMANDS = frozenset({"demo", "compare", "plan", "calibrate"})


def old_spellings(argv: list[str]) -> list[str]:
    """``argv`` with the old spellings that an option cannot alias spelt the shared way
    (docs/cli.md; accepted until the next release): ``--json FILE`` of demo, compare,
    plan and calibrate is ``--out FILE``; ``simulate SCENARIO`` is ``simulate
    --scenario SCENARIO``.

    >>> old_spellings(["demo", "--json", "s.json", "--speed", "3"])
    ['demo', '--out', 's.json', '--speed', '3']
    >>> old_spellings(["alerts", "--json", "--job", "j"])
    ['alerts', '--json', '--job', 'j']
    >>> old_spellings(["-v", "simulate", "ci_smoke", "--max"])
    ['-v', 'simulate', '--scenario', 'ci_smoke', '--max']
    """
    at = next((i for i, a in enumerate(argv) if not a.startswith("-")), None)
    command = None if at is None else argv[at]
    positional = at is not None and at + 1 < len(argv) and not argv[at + 1].startswith("-")
    if command == "simulate" and positional and at is not None:
        return [*argv[: at + 1], "--scenario", *argv[at + 1 :]]
    if command not in _JSON_FILE_COMMANDS:
        return argv
    out = list(argv)
    for i, arg in enumerate(out[:-1]):
        if arg == "--json" and not out[i + 1].startswith("-"):
            out[i] = "--out"
    return out
