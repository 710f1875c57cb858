"""Hang and presence: the job's and its nodes' clocks, judged when nothing arrives.

Members: :mod:`~detectors.hang.detector` (``HangDetector``: ``learn_step`` from each
step's times, ``score`` at a tick: the job's silence against its own step times, its
relaunching state), :mod:`~detectors.hang.long_steps` (long steps the job explains:
periodic saves and evals, announced phases, a save's own trend), and
:mod:`~detectors.hang.presence` (``MissingRanks``: ranks a step lacks;
``HealthPresence``: nodes whose health reports stopped). The suite drives them as
``ClockMember``\\s (hang, silent nodes), a ``StepMember`` (missing ranks) and a
``HealthMember`` (a report's arrival): :mod:`detectors.protocol`,
:mod:`detectors.suite_members`.

Imports only the vocabulary below the families, never another family.
"""
