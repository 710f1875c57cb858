"""``stepguard-torchrun``: relaunch a torchrun job from its checkpoint, node swapped.

Runs the command it is given (``torchrun ... train.py``, no shell) with the job's node
names in ``STEPGUARD_NODES``. When the integration obeys a RESTART (or ROLLBACK) it
saves a checkpoint, writes a relaunch request to ``STEPGUARD_RELAUNCH_FILE`` (rank 0)
and every rank exits at the same step boundary; this helper then swaps each excluded
node for its named replacement from ``STEPGUARD_SPARES`` and starts the command again
(``STEPGUARD_ATTEMPT`` counts the relaunches; the training script resumes from its own
checkpoint). A run that ends without a request ends the helper with its exit code.

::

    set -a; . .stepguard/up.env; . .stepguard/job-controller.env; set +a
    .venv/bin/stepguard-torchrun -- torchrun --nproc-per-node 4 train.py

A bare ``torchrun`` is looked up beside this interpreter first (the venv's own), then on
``PATH``, so the venv need not be activated.

One host drives the job here (emulated nodes, or a single node). On a multi-node
cluster each node's launcher is the scheduler's: the Slurm executor drains the
isolated node, and the job's next allocation brings the spare; the request file
names what to exclude for whoever relaunches.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from pipeline.client.pytorch.topology import node_names

__all__ = ["RELAUNCH_EXIT", "RelaunchRequest", "find_program", "main", "run", "swap_nodes"]

#: Exit code of every rank that stops for a relaunch (EX_TEMPFAIL).
RELAUNCH_EXIT = 75


@dataclass(frozen=True)
class RelaunchRequest:
    """What rank 0 writes when the job stops to be relaunched."""

    job_id: str
    run: str
    step: int
    exclude: tuple[str, ...]
    replacements: tuple[str, ...]
    rollback_to: int | None
    command_ids: tuple[str, ...]

    def to_json(self) -> str:
        return json.dumps({
            "job_id": self.job_id, "run": self.run, "step": self.step,
            "exclude": list(self.exclude), "replacements": list(self.replacements),
            "rollback_to": self.rollback_to, "command_ids": list(self.command_ids),
        })  # fmt: skip

    @classmethod
    def from_json(cls, text: str) -> RelaunchRequest:
        d = json.loads(text)
        if not isinstance(d, dict):
            raise ValueError("a relaunch request is a JSON object")
        rollback = d.get("rollback_to")
        return cls(
            job_id=str(d["job_id"]), run=str(d["run"]), step=int(d["step"]),
            exclude=tuple(str(n) for n in d["exclude"]),
            replacements=tuple(str(n) for n in d["replacements"]),
            rollback_to=None if rollback is None else int(rollback),
            command_ids=tuple(str(c) for c in d["command_ids"]),
        )  # fmt: skip


def swap_nodes(
    nodes: Sequence[str], spares: Sequence[str], exclude: Sequence[str], replacements: Sequence[str]
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The job's nodes and spares after excluding ``exclude``: each excluded node's
    place goes to its replacement (same position) if that is a spare, else to the
    first free spare. ValueError when no spare is left (the world would shrink).

    >>> swap_nodes(["a", "b"], ["s0", "s1"], ["b"], ["s1"])
    (('a', 's1'), ('s0',))
    >>> swap_nodes(["a", "b"], ["s0"], ["a"], [])
    (('s0', 'b'), ())
    >>> swap_nodes(["a", "b"], [], ["x"], [])
    (('a', 'b'), ())
    """
    out, free = list(nodes), list(spares)
    for i, node in enumerate(exclude):
        if node not in out:
            continue  # already out
        wanted = replacements[i] if i < len(replacements) else None
        spare = wanted if wanted in free else (free[0] if free else None)
        if spare is None:
            raise ValueError(f"no spare left to replace {node} (spares: none)")
        free.remove(spare)
        out[out.index(node)] = spare
    return tuple(out), tuple(free)


def find_program(name: str, env: Mapping[str, str], bin_dir: Path | None = None) -> str:
    """``name`` as a path to run: a path as given; a bare name from the directory of
    this interpreter first (``.venv/bin/stepguard-torchrun -- torchrun ...`` finds the
    venv's ``torchrun`` without the venv activated), then ``PATH``. ``FileNotFoundError``
    naming both places and how to get torch otherwise."""
    if os.sep in name:
        return name
    bin_dir = bin_dir or Path(sys.executable).parent
    beside = bin_dir / name
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which(name, path=env.get("PATH", os.defpath))
    if found:
        return found
    raise FileNotFoundError(
        f"stepguard-torchrun: no {name!r} in {bin_dir} or on PATH; torch is not installed "
        f"here: {bin_dir / 'pip'} install 'stepguard[torch]' (several GB; 10-15 min)"
    )


def run(
    argv: Sequence[str], env: Mapping[str, str], *, max_relaunches: int = 3,
    summary: Path | None = None, bin_dir: Path | None = None,
) -> int:  # fmt: skip
    """Run ``argv`` until it ends without a relaunch request; its exit code."""
    if not argv:
        raise ValueError("no command to run (stepguard-torchrun -- torchrun ... train.py)")
    argv = [find_program(argv[0], env, bin_dir), *argv[1:]]
    nodes = node_names(env.get("STEPGUARD_NODES", ""))
    spares = node_names(env.get("STEPGUARD_SPARES", ""))
    history: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory(prefix="stepguard-torchrun-") as tmp:
        request_file = Path(tmp) / "relaunch.json"
        attempt = 0
        while True:
            child = dict(env) | {
                "STEPGUARD_NODES": ",".join(nodes), "STEPGUARD_SPARES": ",".join(spares),
                "STEPGUARD_ATTEMPT": str(attempt), "STEPGUARD_RELAUNCH_FILE": str(request_file),
            }  # fmt: skip
            if history and history[-1].get("rollback_to") is not None:
                child["STEPGUARD_ROLLBACK_TO"] = str(history[-1]["rollback_to"])
            code = subprocess.run(list(argv), env=child, check=False).returncode
            if not request_file.exists():
                _write_summary(summary, history, nodes, code)
                return code
            req = RelaunchRequest.from_json(request_file.read_text())
            request_file.unlink()
            if attempt >= max_relaunches:
                print(f"stepguard-torchrun: {attempt} relaunches already; not again "
                      f"(--max-relaunches)", file=sys.stderr)  # fmt: skip
                _write_summary(summary, history, nodes, code)
                return code or 1
            try:
                nodes, spares = swap_nodes(nodes, spares, req.exclude, req.replacements)
            except ValueError as exc:
                print(f"stepguard-torchrun: cannot relaunch: {exc}", file=sys.stderr)
                _write_summary(summary, history, nodes, code)
                return code or 1
            attempt += 1
            history.append({
                "attempt": attempt, "step": req.step, "exclude": list(req.exclude),
                "nodes": list(nodes), "rollback_to": req.rollback_to,
                "command_ids": list(req.command_ids),
            })  # fmt: skip
            excluded = ",".join(req.exclude) or "nothing"
            now = ",".join(nodes) or "(torchrun decides)"
            print(f"stepguard-torchrun: relaunch {attempt}: every rank stopped after step "
                  f"{req.step} with exit code {RELAUNCH_EXIT} on purpose (stepguard restarts the "
                  f"job: torchrun's ChildFailedError above is that); excluding {excluded}, "
                  f"nodes now {now}", file=sys.stderr, flush=True)  # fmt: skip


def _write_summary(
    path: Path | None, history: list[dict[str, object]], nodes: Sequence[str], code: int
) -> None:
    if path is not None:
        doc = {"relaunches": history, "nodes": list(nodes), "exit_code": code}
        path.write_text(json.dumps(doc, indent=2))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="stepguard-torchrun",
        description="Run a torchrun job; relaunch it from its checkpoint when stepguard "
        "restarts it (the isolated node out, a spare in).",
    )
    parser.add_argument("--max-relaunches", type=int, default=3)
    parser.add_argument("--summary", type=Path, help="write the relaunches here (JSON)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- torchrun ... train.py")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    try:
        return run(command, os.environ, max_relaunches=args.max_relaunches, summary=args.summary)
    except FileNotFoundError as exc:  # one line, not a traceback
        print(exc, file=sys.stderr)
        return 127


if __name__ == "__main__":
    raise SystemExit(main())
