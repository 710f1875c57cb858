"""The adversary's full run (issue 39): every scenario of ``tests.adversary.SCENARIOS``
x every injection of its catalogue x a few steps, played through the detection core as
the worker drives it; counts the runs whose honest outcome changed (must be 0) and
writes the table into BENCHMARKS.md.

    python benchmarks/adversary.py [--steps 30,90,149] [--no-md]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import BENCHMARKS_MD, environment
from pipeline.tools.simulator import Scenario
from tests.adversary import CATALOGUE, JOB_LEVEL, SCENARIOS, changed, play

#: no node is hostile: a name a record borrows (a login node) is an honest bystander
HOSTILE: set[str] = set()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", default="30,90,149", help="steps at which to inject")
    ap.add_argument("--no-md", action="store_true", help="do not touch BENCHMARKS.md")
    args = ap.parse_args()
    steps = [int(s) for s in args.steps.split(",")]
    env = environment(f"python benchmarks/adversary.py --steps {args.steps}", ("numpy",))
    cells: dict[str, dict[str, str]] = {inj: {} for inj in CATALOGUE}
    details: list[str] = []
    total, bad, job_level, condemned = 0, 0, 0, 0
    for name, spec in SCENARIOS.items():
        honest = play(Scenario.model_validate(spec))
        for inj, (_, _, make) in CATALOGUE.items():
            n_changed = 0
            for at in steps:
                why = changed(honest, play(Scenario.model_validate(spec), make(at)), HOSTILE)
                total += 1
                n_changed += bool(why)
                details += [f"{name} x {inj} at step {at}: {w}" for w in why]
                if inj in JOB_LEVEL:
                    condemned += any(w.startswith("honest nodes condemned") for w in why)
            if inj in JOB_LEVEL:
                job_level += n_changed
            else:
                bad += n_changed
            cells[inj][name] = f"{n_changed}/{len(steps)}"
            print(f"{name} x {inj}: {n_changed} changed", flush=True)
    md = [
        f"`{env['command']}` — {env['date']}; {env['machine']}; Python "
        f"{env['versions']['python']}, numpy {env['versions']['numpy']}.",
        "",
        f"{len(SCENARIOS)} scenarios x {len(CATALOGUE)} injections x {len(steps)} steps "
        f"(injected at steps {args.steps}) = {total} runs, each against the same scenario "
        f"played honestly. **Node-writer injections: outcomes changed {bad}** (must be 0). "
        f"Job-level lifecycle injections (unsigned END/PHASE/WAIT, whose defence is the "
        f"job controller's key at the worker's intake): outcomes changed {job_level}, an "
        f"honest node condemned in {condemned} (must be 0).",
        "",
        "| injection | writer | defence | " + " | ".join(SCENARIOS) + " |",
        "|---|---|---|" + "---|" * len(SCENARIOS),
        *(
            f"| `{inj}` | {'job-level lifecycle' if inj in JOB_LEVEL else 'node'} | "
            f"{CATALOGUE[inj][1]} | " + " | ".join(cells[inj][n] for n in SCENARIOS) + " |"
            for inj in CATALOGUE
        ),
        "",
        "Changed outcomes (changed/runs per cell above):",
        "",
        *(f"- {d}" for d in details or ["none"]),
    ]
    print("\n".join(md))
    if not args.no_md:
        text = BENCHMARKS_MD.read_text()
        start, end = "<!-- adversary:start -->", "<!-- adversary:end -->"
        block = f"{start}\n## Adversary (issue 39)\n\n" + "\n".join(md) + f"\n{end}"
        if start in text:
            text = text[: text.index(start)] + block + text[text.index(end) + len(end) :]
        else:
            text = text.rstrip() + "\n\n" + block + "\n"
        BENCHMARKS_MD.write_text(text)
    return 1 if bad or condemned else 0


if __name__ == "__main__":
    raise SystemExit(main())
