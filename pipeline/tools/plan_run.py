"""``stepguard plan``'s edge: run the model of :mod:`pipeline.tools.plan`, print its tables
and draw its plot."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.tools.plan import (
    POLICIES,
    PlanResult,
    SweepCell,
    load_rates,
    plan_one,
    sweep,
)

__all__ = ["plot", "result_table", "run_plan", "sweep_table"]


def plot(result: PlanResult | None, cells: Sequence[SweepCell], path: Path) -> Path:
    """One job: lost GPU-hours per policy with 95 % CIs; a sweep: lost share of the
    GPU-hours per policy against scale, one line style per job length."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2 if cells else 1, figsize=(11 if cells else 6, 4))
    ax_list = list(np.atleast_1d(axes))
    colors = {"passive": "tab:red", "active": "tab:green", "hybrid": "tab:blue"}
    if result is not None:
        ax = ax_list[0]
        for i, p in enumerate(POLICIES):
            e = result.policies[p].lost_gpu_hours
            ax.bar(i, e.mean, yerr=[[e.mean - e.ci_low], [e.ci_high - e.mean]], capsize=4,
                   color=colors[p])  # fmt: skip
        ax.set_xticks(range(len(POLICIES)), POLICIES)
        ax.set_title(f"lost GPU-h, {result.gpus} GPUs x {result.days:g} days")
    if cells:
        ax = ax_list[-1]
        styles = ["-", "--", ":", "-."]
        for j, d in enumerate(sorted({c.days for c in cells})):
            row = sorted((c for c in cells if c.days == d), key=lambda c: c.gpus)
            xs = [c.gpus for c in row]
            for p in POLICIES:
                ys = [100 * (1 - c.result.policies[p].goodput.mean) for c in row]
                ax.plot(xs, ys, styles[j % 4], color=colors[p], label=f"{p}, {d:g} d")
        ax.set_xscale("log")
        ax.set_xlabel("GPUs")
        ax.set_ylabel("lost share of GPU-hours (%)")
        ax.set_title("which policy wins at which scale")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def _h(seconds: float) -> str:
    if math.isinf(seconds):
        return "-"
    return f"{seconds / 3600:.2f} h" if seconds >= 3600 else f"{seconds:.0f} s"


def result_table(r: PlanResult) -> Any:
    from rich.table import Table

    table = Table(
        "policy", "lost GPU-h (95% CI)", "one job p5-p95", "goodput (95% CI)",
        "best interval", "lost GPU-h at best", "spares p95", "stragglers replaced",
        title=(
            f"{r.gpus} GPUs x {r.days:g} days, a checkpoint every {_h(r.checkpoint_s)}, "
            f"{r.replicates} replicates; job MTBF {r.mtbf_h:.1f} h; "
            f"Young {_h(r.young_s)}, Daly {_h(r.daly_s)}"
        ),
        title_justify="left",
    )  # fmt: skip
    win = r.winner()
    for p, v in r.policies.items():
        e, g = v.lost_gpu_hours, v.goodput
        table.add_row(
            p + (" (wins)" if p == win else ""),
            f"{e.mean:,.0f} ({e.ci_low:,.0f}-{e.ci_high:,.0f})",
            f"{e.p05:,.0f}-{e.p95:,.0f}",
            f"{g.mean:.4f} ({g.ci_low:.4f}-{g.ci_high:.4f})",
            _h(v.best_interval_s),
            f"{v.best_lost_gpu_hours:,.0f}",
            str(v.spare_nodes_p95),
            f"{v.remedied_stragglers:.1f}",
        )
    return table


def sweep_table(cells: Sequence[SweepCell]) -> Any:
    from rich.table import Table

    table = Table(
        "GPUs", "days", "MTBF h", *(f"{p} lost %" for p in POLICIES), "wins",
        "wins at best interval", "active saves GPU-h", "active spares p95",
        title="Which policy wins at which scale and job length (lost share of GPU-hours)",
        title_justify="left",
    )  # fmt: skip
    for c in cells:
        r = c.result
        pol = r.policies
        table.add_row(
            str(c.gpus), f"{c.days:g}", f"{r.mtbf_h:.1f}",
            *(f"{100 * (1 - pol[p].goodput.mean):.2f}" for p in POLICIES),
            r.winner() + "".join(f" ~{p}" for p in r.tied_with_winner()),
            r.winner(at_best=True),
            f"{pol['passive'].lost_gpu_hours.mean - pol['active'].lost_gpu_hours.mean:,.0f}",
            str(pol["active"].spare_nodes_p95),
        )  # fmt: skip
    return table


def run_plan(
    console: Any,
    err: Any,
    *,
    gpus: int,
    days: float,
    checkpoint_s: float,
    rates_path: Path | None = None,
    sweep_gpus: Sequence[int] = (),
    sweep_days: Sequence[float] = (),
    replicates: int = 1000,
    seed: int = 0,
    json_path: Path | None = None,
    plot_path: Path | None = None,
) -> tuple[PlanResult, list[SweepCell]]:
    """The body of ``stepguard plan``: one job's plan, the sweep if asked, JSON, plot."""
    import json

    rates = load_rates(rates_path)
    result = plan_one(gpus, days, checkpoint_s, rates=rates, replicates=replicates, seed=seed)
    console.print(result_table(result))
    cells: list[SweepCell] = []
    if sweep_gpus:

        def progress(done: int, total: int, what: str) -> None:
            err.print(f"sweep {done}/{total}: {what}")

        cells = sweep(sweep_gpus, sweep_days or (days,), checkpoint_s, rates=rates,
                      replicates=max(2, min(replicates, 400)), seed=seed,
                      progress=progress)  # fmt: skip
        console.print(sweep_table(cells))
    if json_path is not None:
        payload = result.to_json()
        payload["sweep"] = [c.result.to_json() for c in cells]
        json_path.write_text(json.dumps(payload, indent=2) + "\n")
        err.print(f"written {json_path}")
    if plot_path is not None:
        plot(result, cells, plot_path)
        err.print(f"plot saved to {plot_path}")
    return result, cells
