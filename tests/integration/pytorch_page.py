"""The job command of docs/pytorch.md ("4. Run the job"), read from the page itself, so
that ``test_torch_ddp`` runs the steps exactly as written (no torch imported here)."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

PAGE = Path(__file__).resolve().parents[2] / "docs" / "pytorch.md"


@dataclass(frozen=True)
class JobStep:
    sourced: tuple[str, ...]  # the env files the step sources, as written
    env: dict[str, str]  # VAR=value given on the command line
    argv: tuple[str, ...]  # the command, as written


def job_step(page: Path = PAGE) -> JobStep:
    """The bash block under "**4. Run the job**": its `set -a; . F; ...` line and its
    command line."""
    text = page.read_text()
    at = text.index("**4. Run the job**")
    block = re.search(r"```bash\n(.*?)```", text[at:], re.S)
    assert block is not None, "no bash block under step 4"
    lines = [line for line in block.group(1).splitlines() if line.strip()]
    assert len(lines) == 2, lines
    sourced = tuple(w for w in re.findall(r"\. (\S+?);", lines[0]))
    words = shlex.split(lines[1])
    env = {}
    while "=" in words[0] and not words[0].startswith(("-", "/", ".")):
        name, _, value = words.pop(0).partition("=")
        env[name] = value
    return JobStep(sourced, env, tuple(words))
