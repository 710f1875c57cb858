"""The executor kinds: the one list that the command line, ``stepguard up`` and the
docs read.

``stepguard executor KIND`` runs one of these, ``stepguard resume-node --executor
KIND`` accepts those that ``resumes``, ``stepguard up --executor KIND`` starts one,
:data:`~pipeline.services.actuator.executors.EXECUTORS` builds each (a kind without a
builder fails at import), and the table in docs/actuator.md lists them
(``tests/unit/pipeline/services/actuator/test_kinds.py`` holds the table to this
list). Adding an executor is a row here, its builder, and its row in the docs.

Standard library only: the command line reads it to draw its help without importing
any executor.

>>> list(EXECUTOR_KINDS)
['dry-run', 'slurm', 'kubernetes', 'webhook']
>>> [k.name for k in EXECUTOR_KINDS.values() if k.resumes]
['slurm', 'kubernetes']
>>> executor_kind("slurm").extra is None
True
>>> executor_kind("k8s")
Traceback (most recent call last):
ValueError: unknown executor 'k8s'; expected dry-run | slurm | kubernetes | webhook
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

__all__ = ["EXECUTOR_KINDS", "ExecutorKind", "executor_kind", "kind_names"]


@dataclass(frozen=True, kw_only=True)
class ExecutorKind:
    """One executor kind, as the command line and the docs show it.

    Parameters
    ----------
    name
        ``stepguard executor NAME``; also the ``executor`` of its results.
    summary
        What it does, in one line (help text, docs table).
    extra
        The extra it needs beyond ``[services]`` (``pip install 'stepguard[EXTRA]'``),
        or None.
    resumes
        ``stepguard resume-node --executor NAME`` puts back a node it isolated.
    dry_run
        It changes nothing: its results say what would have been done.
    """

    name: str
    summary: str
    extra: str | None = None
    resumes: bool = False
    dry_run: bool = False


_KINDS = (
    ExecutorKind(name="dry-run", summary="logs what it would do; every command kind",
                 dry_run=True),
    ExecutorKind(name="slurm", summary="drains its nodes (scontrol), requeues Slurm jobs",
                 resumes=True),
    ExecutorKind(name="kubernetes", summary="cordons and taints its nodes, evicts the job's pods",
                 extra="kubernetes", resumes=True),
    ExecutorKind(name="webhook", summary="POSTs an Alertmanager webhook payload per command"),
)  # fmt: skip

#: every executor kind by name, in the order the help and the docs list them
EXECUTOR_KINDS: Mapping[str, ExecutorKind] = MappingProxyType({k.name: k for k in _KINDS})


def kind_names(*, resumes: bool = False) -> str:
    """The kinds as the help writes them (``dry-run | slurm | ...``); ``resumes``: only
    those ``resume-node`` accepts."""
    return " | ".join(k.name for k in EXECUTOR_KINDS.values() if k.resumes or not resumes)


def executor_kind(name: str) -> ExecutorKind:
    """The kind called ``name``; a ValueError naming the kinds otherwise."""
    kind = EXECUTOR_KINDS.get(name)
    if kind is None:
        raise ValueError(f"unknown executor {name!r}; expected {kind_names()}")
    return kind
