"""Shared by the benchmark scripts: the machine/versions block and BENCHMARKS.md sections."""

from __future__ import annotations

import os
import platform
import sys
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

BENCHMARKS_MD = Path(__file__).resolve().parents[1] / "BENCHMARKS.md"


def environment(command: str, packages: tuple[str, ...] = ()) -> dict[str, Any]:
    """Machine, versions, date and the command, for the record beside every figure."""
    versions = {"python": platform.python_version()}
    for name in packages:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "absent"
    return {
        "command": command,
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{platform.platform()}, {os.cpu_count()} CPUs",
        "versions": versions,
    }


def command_line() -> str:
    return "python " + " ".join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]])


def write_section(name: str, body: str, path: Path = BENCHMARKS_MD) -> None:
    """Replace the text between ``<!-- name:start -->`` and ``<!-- name:end -->``."""
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    block = f"{start}\n{body.rstrip()}\n{end}"
    if start in text and end in text:
        head, rest = text.split(start, 1)
        _, tail = rest.split(end, 1)
        text = head + block + tail
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    path.write_text(text)


def cores_busy() -> tuple[float, float] | None:
    """(busy, total) CPU seconds of the whole machine so far, from /proc/stat (Linux),
    summed over cores; None elsewhere. Two readings give the cores kept busy between
    them: (busy1 - busy0) / (total1 - total0) * os.cpu_count()."""
    try:
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
    except OSError:
        return None
    ticks = os.sysconf("SC_CLK_TCK")
    idle = fields[3] + fields[4]  # idle + iowait
    return (sum(fields) - idle) / ticks, sum(fields) / ticks
