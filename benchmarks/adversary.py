"""The adversary's full run (issue 39): every scenario of ``tests.adversary.SCENARIOS``
x every injection of its catalogue x a few steps, played through the detection core as
the worker drives it; counts the runs whose honest outcome changed (must be 0) and
writes the table into BENCHMARKS.md.

    python benchmarks/adversary.py [--steps 30,90,140] [--no-md]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import BENCHMARKS_MD, environment
from pipeline.tools.simulator import Scenario
from tests.adversary import CATALOGUE, SCENARIOS, changed, play

HOSTILE = {"login-01", "node-0099"}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", default="30,90,140", help="steps at which to inject")
    ap.add_argument("--no-md", action="store_true", help="do not touch BENCHMARKS.md")
    args = ap.parse_args()
    steps = [int(s) for s in args.steps.split(",")]
    env = environment(f"python benchmarks/adversary.py --steps {args.steps}", ("numpy",))
    rows, total, bad = [], 0, 0
    for name, spec in SCENARIOS.items():
        honest = play(Scenario.model_validate(spec))
        for inj, (_, defence, make) in CATALOGUE.items():
            why: list[str] = []
            for at in steps:
                why += changed(honest, play(Scenario.model_validate(spec), make(at)), HOSTILE)
                total += 1
            bad += bool(why)
            rows.append((name, inj, defence, len(steps), "; ".join(why) or "0"))
            print(f"{name} x {inj}: {why or 'unchanged'}", flush=True)
    md = [
        f"`{env['command']}` — {env['date']}; {env['machine']}; Python "
        f"{env['versions']['python']}, numpy {env['versions']['numpy']}.",
        "",
        f"{len(SCENARIOS)} scenarios x {len(CATALOGUE)} injections x {len(steps)} steps = "
        f"{total} runs; **outcomes changed: {bad}** (must be 0).",
        "",
        "| scenario | injection | defence | runs | outcomes changed |",
        "|---|---|---|---|---|",
        *(f"| {a} | {b} | {c} | {d} | {e} |" for a, b, c, d, e in rows),
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
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
