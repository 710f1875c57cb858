"""Alert episodes: the pure state machine from scores to graded episodes, with hysteresis.

:func:`advance` is a pure function from (episode state, score, policy) to the next
state and the transition it caused, if any; :class:`GradePolicy` holds one signal's
thresholds. :class:`~detectors.grading.grader.Grader` runs one state per subject and turns
the transitions into alerts.

Rules, per subject, counted in observations of that subject:

- a grade *enters* once its score has stayed ``>= enter`` for ``min_obs``
  consecutive observations (a single-step blip never fires);
- within an episode grades only escalate; the episode *resolves* once the score has
  stayed ``< exit`` (the exit threshold of the lowest enabled grade) for
  ``hold_obs`` consecutive observations;
- flap suppression: a subject that fires again within ``cooloff_obs`` observations of
  resolving re-opens the same episode (same start, so the same alert fingerprint;
  next ``seq``) instead of starting a new one.

Examples
--------
>>> from schemas import AlertKind
>>> policy = GradePolicy(AlertKind.STRAGGLER, enter=(None, 0.05, 0.2),
...                      exit=0.025, min_obs=(1, 2, 2), hold_obs=2)
>>> state, seen = EpisodeState(), []
>>> for i, score in enumerate([0.1, 0.1, 0.3, 0.3, 0.0, 0.0]):
...     state, t = advance(state, score, policy, step=i, ts=float(i))
...     seen.append(t and t.value)
>>> seen, state.firing, state.seq
([None, 'new', None, 'escalate', None, 'resolve'], False, 2)
>>> for score in (0.1, 0.1):    # fires again soon after: the same episode re-opens
...     state, t = advance(state, score, policy, step=8, ts=8.0)
>>> t, state.seq, GRADES[state.grade].value
(<Transition.REOPEN: 'reopen'>, 3, 'warning')
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from enum import Enum

from schemas.alerts import AlertKind, Grade, RecommendedAction

__all__ = ["GRADES", "EpisodeState", "GradePolicy", "Transition", "advance"]

#: The grade of each ``EpisodeState.grade`` index.
GRADES: tuple[Grade, Grade, Grade] = (Grade.INFO, Grade.WARNING, Grade.CRITICAL)

_DEFAULT_ACTIONS = (
    RecommendedAction.INVESTIGATE,
    RecommendedAction.INVESTIGATE,
    RecommendedAction.INVESTIGATE,
)


@dataclass(frozen=True, slots=True)
class GradePolicy:
    """Thresholds of one signal.

    Parameters
    ----------
    kind
        Alert kind the signal reports as.
    enter
        Enter thresholds for (info, warning, critical); ``None`` disables a grade.
    exit
        The episode resolves once the score stays below this for ``hold_obs``
        observations. Must not exceed the lowest enter threshold.
    min_obs
        Consecutive observations at or above a grade's enter threshold before it fires.
    hold_obs
        Consecutive observations below ``exit`` before the episode resolves.
    cooloff_obs
        A re-fire within this many observations of resolving re-opens the episode.
    actions
        Recommended action per grade (info, warning, critical).
    """

    kind: AlertKind
    enter: tuple[float | None, float | None, float | None]
    exit: float
    min_obs: tuple[int, int, int] = (3, 3, 3)
    hold_obs: int = 5
    cooloff_obs: int = 30
    actions: tuple[RecommendedAction, RecommendedAction, RecommendedAction] = _DEFAULT_ACTIONS

    def __post_init__(self) -> None:
        enabled = [e for e in self.enter if e is not None]
        if not enabled:
            raise ValueError("enter must enable at least one grade")
        if any(not math.isfinite(e) for e in enabled) or enabled != sorted(enabled):
            raise ValueError(f"enter thresholds must be finite and increasing, got {self.enter}")
        if not (math.isfinite(self.exit) and self.exit <= min(enabled)):
            raise ValueError(f"exit must be <= the lowest enter threshold, got {self.exit!r}")
        if any(m < 1 for m in self.min_obs):
            raise ValueError(f"min_obs must be >= 1, got {self.min_obs}")
        if self.hold_obs < 1:
            raise ValueError(f"hold_obs must be >= 1, got {self.hold_obs!r}")
        if self.cooloff_obs < 0:
            raise ValueError(f"cooloff_obs must be >= 0, got {self.cooloff_obs!r}")

    @property
    def lowest_threshold(self) -> float:
        """Scores below this can neither fire nor keep an episode open."""
        return self.exit


class Transition(Enum):
    NEW = "new"
    ESCALATE = "escalate"
    REOPEN = "reopen"
    RESOLVE = "resolve"


@dataclass(frozen=True, slots=True)
class EpisodeState:
    """Grading state of one subject. ``grade`` is -1 while not firing."""

    above: tuple[int, int, int] = (0, 0, 0)
    below: int = 0
    grade: int = -1
    n_obs: int = 0
    seq: int = -1
    first_step: int | None = None
    started_ts: float = 0.0
    resolved_at: int | None = None

    @property
    def firing(self) -> bool:
        return self.grade >= 0

    def idle(self, policy: GradePolicy) -> bool:
        """True when forgetting this state changes nothing."""
        return (
            not self.firing
            and self.above == (0, 0, 0)
            and (self.resolved_at is None or self.n_obs - self.resolved_at > policy.cooloff_obs)
        )


def advance(
    state: EpisodeState, score: float, policy: GradePolicy, *, step: int, ts: float
) -> tuple[EpisodeState, Transition | None]:
    """Next state of one subject after one observation, and the transition, if any.

    Pure: returns a new state. A non-finite score counts as "above every threshold".
    """
    s = score if not math.isnan(score) else math.inf
    above = tuple(
        (a + 1) if (e is not None and s >= e) else 0
        for a, e in zip(state.above, policy.enter, strict=True)
    )
    above3: tuple[int, int, int] = (above[0], above[1], above[2])
    target = -1
    for g in (2, 1, 0):
        if policy.enter[g] is not None and above3[g] >= policy.min_obs[g]:
            target = g
            break
    below = state.below + 1 if s < policy.exit else 0
    n_obs = state.n_obs + 1
    nxt = replace(state, above=above3, below=below, n_obs=n_obs)
    if not state.firing:
        if target < 0:
            return nxt, None
        recent = state.resolved_at is not None and n_obs - state.resolved_at <= policy.cooloff_obs
        if recent and state.first_step is not None:
            return replace(nxt, grade=target, seq=state.seq + 1, below=0), Transition.REOPEN
        return (
            replace(nxt, grade=target, seq=0, first_step=step, started_ts=ts, below=0),
            Transition.NEW,
        )
    if target > state.grade:
        return replace(nxt, grade=target, seq=state.seq + 1), Transition.ESCALATE
    if below >= policy.hold_obs:
        return (
            replace(nxt, grade=-1, seq=state.seq + 1, resolved_at=n_obs, above=(0, 0, 0)),
            Transition.RESOLVE,
        )
    return nxt, None
