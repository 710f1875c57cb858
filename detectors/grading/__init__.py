"""Grading: scores into alerts, with hysteresis.

Member: :mod:`~detectors.grading.grader` (``Grader.observe`` a subject's score,
``close`` its episodes when the job ends): each subject's episode opens, escalates and
resolves by its signal's :class:`~detectors.episodes.GradePolicy`. The suite holds it as
its ``Grading`` (:mod:`detectors.protocol`). The episode
vocabulary itself (policies, states, transitions) sits below the families in
:mod:`detectors.episodes`, where the config reads it.

Imports only the vocabulary below the families, never another family.
"""
