"""What every module of the ``stepguard`` command line shares.

:mod:`pipeline.cli` assembles the command line from its own commands and those of
the service modules (:mod:`pipeline.worker.cli`, :mod:`pipeline.actuator.cli`); each of
those imports its helpers from here, never :mod:`pipeline.cli` itself, so the imports
only go one way.
"""

from __future__ import annotations

import signal
import threading

from rich.console import Console

__all__ = ["console", "err", "stop_event"]

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
