"""Can this process reach the broker at all? A probe with a short deadline, before any
client library is built.

kafka-python and aiokafka retry an absent bootstrap for a minute or more, logging a
WARNING or ERROR line for every try; a person running ``stepguard status`` with no
broker would read 65 s of that before one line of ours. :func:`require_broker` opens a
TCP connection to each ``host:port`` of the bootstrap until one accepts or the deadline
passes, and raises :class:`~pipeline.io.errors.BrokerError` with one line that names
what is missing and how to get it. :func:`pipeline.io.kafka.client_config` calls it, so
every client stepguard builds is preceded by it.
"""

from __future__ import annotations

import socket
import time
from pathlib import Path

from pipeline.io.errors import BrokerError

__all__ = ["BROKER_DEADLINE_S", "reachable", "require_broker", "unset_bootstrap_message"]

#: how long a command waits for a bootstrap server to accept a connection
BROKER_DEADLINE_S = 5.0

_STACK_HINT = "run `stepguard up` (it prints the variables; another shell: set -a; . {env})"


def unset_bootstrap_message(state_dir: Path | None = None) -> str:
    """The one line for a command that needs the broker when none is configured.

    >>> unset_bootstrap_message(Path(".stepguard")).split(":")[0]
    'STEPGUARD_KAFKA_BOOTSTRAP is not set'
    """
    env = (state_dir or Path(".stepguard")) / "up.env"
    return (
        "STEPGUARD_KAFKA_BOOTSTRAP is not set: it names the broker (host:port) the "
        "services share, and `stepguard demo` stops its own when it ends; "
        + _STACK_HINT.format(env=env)
    )


def _hostports(bootstrap: str) -> list[tuple[str, int]]:
    out = []
    for part in bootstrap.split(","):
        host, _, port = part.strip().rpartition(":")
        if host and port.isdigit():
            out.append((host.strip("[]"), int(port)))
    return out


def reachable(bootstrap: str, timeout_s: float = 1.0) -> bool:
    """True when one ``host:port`` of ``bootstrap`` accepts a TCP connection now."""
    for host, port in _hostports(bootstrap):
        try:
            with socket.create_connection((host, port), timeout=timeout_s):
                return True
        except OSError:
            continue
    return False


def require_broker(
    bootstrap: str, *, deadline_s: float = BROKER_DEADLINE_S, state_dir: Path | None = None
) -> None:
    """Return once a bootstrap server accepts a TCP connection; :class:`BrokerError`
    (one line: what is missing, how to get it) when none does within ``deadline_s``.

    A broker that is still starting gets the whole deadline: the probe retries every
    0.2 s.
    """
    if not bootstrap.strip():
        raise BrokerError(unset_bootstrap_message(state_dir))
    end = time.monotonic() + deadline_s
    while True:
        left = end - time.monotonic()
        if reachable(bootstrap, timeout_s=max(0.1, min(1.0, left))):
            return
        if time.monotonic() >= end:
            break
        time.sleep(min(0.2, max(0.0, end - time.monotonic())))
    raise BrokerError(_unreachable_message(bootstrap, deadline_s, state_dir))


def _unreachable_message(bootstrap: str, deadline_s: float, state_dir: Path | None) -> str:
    env = (state_dir or Path(".stepguard")) / "up.env"
    stale = ""
    try:
        if env.is_file() and bootstrap in env.read_text():
            stale = f"the stack `stepguard up` started ({env}) is gone: "
    except OSError:
        pass
    return (
        f"no broker answers at {bootstrap} (STEPGUARD_KAFKA_BOOTSTRAP) within "
        f"{deadline_s:.0f} s: {stale}" + _STACK_HINT.format(env=env)
    )
