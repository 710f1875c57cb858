"""Steps: detectors that read the job's step times, one frame (every rank of one step) at
a time.

Members, by what they say of a rank, node or group:

- :mod:`~detectors.steps.peer` (``PeerDetector.score_frame``: how far each rank stands
  from its step's peers) and :mod:`~detectors.steps.temporal` (``RankBaselines.learn`` /
  ``score``: from its own past), :mod:`~detectors.steps.slowdown` (``slowdown_findings``:
  both together, replica-corrected) and :mod:`~detectors.steps.early` (``early_outliers``:
  a gross outlier before any baseline), :mod:`~detectors.steps.first_step` (a slow first
  step), :mod:`~detectors.steps.intermittent` (slow steps that recur),
  :mod:`~detectors.steps.waits` (``waited_on``: the rank its peers wait for),
  :mod:`~detectors.steps.nic_flap` (``nic_flap_findings``: communication spikes of one
  node), :mod:`~detectors.steps.group` (racks and switches slowing together),
  :mod:`~detectors.steps.replica` (a replica drifting), :mod:`~detectors.steps.imbalance`
  and :mod:`~detectors.steps.work` (job-level: a stage or ranks with more time or work),
  :mod:`~detectors.steps.ranks` (the rank index the others share).

Verbs: a stateful member scores a frame (``score``, ``score_frame``) and learns it
(``learn``, ``learn_one``); a rule is a function from scores to
:class:`~detectors.base.Finding`\\s. The suite drives the rules as
:class:`~detectors.protocol.StepDetector`\\s (:mod:`detectors.step_detectors`), and the
scoring they share (peer, baselines) and what follows them (replicas, groups) as
:class:`~detectors.protocol.StepMember`\\s (:mod:`detectors.suite_members`).
Imports only the vocabulary below the families (``base``, ``frame``, ``config``, ...),
never another family (``tests/unit/test_module_rules.py``).
"""
