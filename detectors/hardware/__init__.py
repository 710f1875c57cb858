"""Hardware: what a node's health reports say of its GPUs and links.

Members: :mod:`~detectors.hardware.health` (``HardwareDetector``: ``score_one`` a
node's report into findings, then ``learn_one`` it), the rules it applies
(:mod:`~detectors.hardware.rules`: fatal XIDs, uncorrectable ECC, failed row remaps;
:mod:`~detectors.hardware.links`: PCIe downtraining, NVLink down, row remaps pending)
and their per-node and fleet state (:mod:`~detectors.hardware.state`). The suite drives
it as a ``HealthMember`` (:mod:`detectors.suite_members`): a report read once
(``prepare``), ``score_prepared``, then ``learn_prepared``. Communication
spikes seen in step times are a step detector (:mod:`detectors.steps.nic_flap`).

Imports only the vocabulary below the families, never another family.
"""
