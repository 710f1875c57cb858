"""Finding a scenario by name and resizing it: what ``stepguard demo``, ``compare`` and
``simulate`` accept as ``--scenario``.

A name is looked up among the demo scenarios (``pipeline/tools/simulator/demo_scenarios/``),
then in the suite (:func:`~pipeline.tools.simulator.load_suite`); a ``.yaml`` path is read
as it is.

Examples
--------
>>> big = find_scenario("default")
>>> big.name, big.nodes, big.steps
('demo_default', 64, 700)
>>> small = resize_scenario(big, nodes=16, steps=350)
>>> small.nodes, small.steps, len(small.faults) == len(big.faults)
(16, 350, True)
"""

from __future__ import annotations

from pathlib import Path

from pydantic import ValidationError

from pipeline.tools.simulator.scenario import Scenario, ScenarioError, load_suite

__all__ = ["DEMO_DIR", "find_scenario", "resize_scenario"]

#: Where the demo scenarios (``stepguard demo --scenario NAME``) live.
DEMO_DIR = Path(__file__).parent / "demo_scenarios"


def find_scenario(name: str) -> Scenario:
    """A demo scenario by name, a suite scenario by name, or a YAML path."""
    path = Path(name)
    if path.suffix in (".yaml", ".yml") and path.exists():
        return Scenario.from_yaml(path)
    candidate = DEMO_DIR / f"{name}.yaml"
    if candidate.is_file():
        return Scenario.from_yaml(candidate)
    suite = {s.name: s for s in load_suite()}
    if name in suite:
        return suite[name]
    demos = sorted(p.stem for p in DEMO_DIR.glob("*.yaml"))
    raise ScenarioError(
        f"--scenario: unknown scenario {name!r}; demos: {demos}; suite: {sorted(suite)[:6]}..."
    )


def resize_scenario(scenario: Scenario, nodes: int | None, steps: int | None) -> Scenario:
    """The same story on another job size: fault nodes and steps are scaled
    proportionally (node 77 of 256 becomes node 19 of 64; onset 420 of 900 steps
    becomes 140 of 300), so ``--nodes``/``--steps`` keep every fault and trap."""
    data = scenario.model_dump()
    fn = (nodes / scenario.nodes) if nodes else 1.0
    fs = (steps / scenario.steps) if steps else 1.0
    faults = []
    for spec in data["faults"]:
        f = dict(spec)
        if f.get("node") is not None:
            size = f.get("group_size") or 1  # a group keeps its nodes inside the job
            f["node"] = min(int(f["node"] * fn), (nodes or scenario.nodes) - size)
        f["onset_step"] = int(f["onset_step"] * fs)
        for key in ("duration_steps", "ramp_steps"):
            if f.get(key) is not None:
                f[key] = max(1, int(f[key] * fs))
        faults.append(f)
    data["faults"] = faults
    for key in ("eval_every", "checkpoint_every"):
        if data.get(key):
            data[key] = max(1, int(data[key] * fs))
    data["warmup_steps"] = min(data["warmup_steps"], max(1, int(data["warmup_steps"] * fs)))
    if nodes:
        data["nodes"] = nodes
    if steps:
        data["steps"] = steps
    try:
        return Scenario.model_validate(data)
    except ValidationError as exc:
        raise ScenarioError(f"--nodes/--steps: cannot resize {scenario.name}: {exc}") from exc
