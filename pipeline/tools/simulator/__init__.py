"""Scenario-driven simulator of synchronous training jobs with injected faults.

Pure (no Kafka): :func:`simulate` yields :class:`SimEvent` objects (a StepFrame per
completed step, NodeHealth reports, time ticks while nothing completes) and
:meth:`Scenario.truth` gives the FaultTruth labels used for scoring.

Examples
--------
>>> suite = load_suite()
>>> len(suite) >= 30
True
"""

from pipeline.tools.simulator.catalog import DEMO_DIR, find_scenario, resize_scenario
from pipeline.tools.simulator.job import Goodput, SimEvent, SimulatedJob, SimulationError, simulate
from pipeline.tools.simulator.scenario import (
    JOB_STOPPING_KINDS,
    SCENARIO_DIR,
    TRAP_KINDS,
    FaultSpec,
    Scenario,
    ScenarioError,
    Shape,
    load_suite,
    node_name,
)
from pipeline.tools.simulator.timing import (
    LEAD_SHARE,
    RUN_MARGIN,
    back_dating_s,
    lead_budget_s,
    lead_s,
    start_from_now,
)

__all__ = [
    "DEMO_DIR",
    "JOB_STOPPING_KINDS",
    "LEAD_SHARE",
    "RUN_MARGIN",
    "SCENARIO_DIR",
    "TRAP_KINDS",
    "FaultSpec",
    "Goodput",
    "Scenario",
    "ScenarioError",
    "Shape",
    "SimEvent",
    "SimulatedJob",
    "SimulationError",
    "back_dating_s",
    "lead_budget_s",
    "lead_s",
    "find_scenario",
    "load_suite",
    "node_name",
    "resize_scenario",
    "simulate",
    "start_from_now",
]
