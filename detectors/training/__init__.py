"""Training health: what the loss and gradient norm say of the job.

Members: :mod:`~detectors.training.divergence` (``DivergenceDetector``: ``score_one``
then ``learn_one`` a step's loss and gradient norm, a spike scored against the job's
own window) and :mod:`~detectors.training.drift` (``LossDrift``: a loss creeping
up slowly; ``drift_findings``).

Imports only the vocabulary below the families, never another family.
"""
