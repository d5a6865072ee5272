"""Hybrid against the single policies on the profiled H100 problems (issue 12).

For each of the four ``problems/h100_*`` instances and each budget (fractions
of the simulated no-remat peak, default 0.5 / 0.4 / 0.3), solves with
``libra`` three times: ``policy="recompute"``, ``policy="swap"`` and the
default hybrid, and prints the simulated added step time of each (seconds,
``SolveResult.added_s``), the ratio of hybrid's to the better single
policy's (issue 12's target: at most 0.9 on at least 2 of the 4 problems at
0.3), the descent hybrid's plan came from (``extras["descent"]``) and the
hybrid solve's process-CPU seconds (``time.process_time``: the fairer clock
on a shared machine).

Usage::

    python benchmarks/hybrid_gain.py
    python benchmarks/hybrid_gain.py --budgets 0.3 --problems gpt2-medium_b8,resnet50_b128

Prints a markdown table; "inf" is an infeasible budget.  CPU, about 1 min.
"""
from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

from libra_opt import load_problem
from libra_opt.solvers import solve

ROOT = Path(__file__).resolve().parent.parent
PROBLEMS = ("resnet50_b128", "vit-base_b128", "gpt2-medium_b8", "llama_b8")


def _added(problem, budget: float, **options) -> tuple[float, float, str]:
    """(simulated added seconds or inf, process-CPU seconds, descent) of one ``libra`` solve."""
    t0 = time.process_time()
    r = solve(problem, budget, "libra", raise_on_infeasible=False, **options)
    cpu = time.process_time() - t0
    if r.schedule is None:
        return math.inf, cpu, "-"
    return float(r.added_s), cpu, str(r.extras.get("descent", "?"))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--budgets", default="0.5,0.4,0.3", help="fractions of the no-remat peak, comma-separated")
    ap.add_argument("--problems", default=",".join(PROBLEMS), help="names after problems/h100_, comma-separated")
    args = ap.parse_args(argv)
    budgets = [float(b) for b in args.budgets.split(",")]
    print("| problem | budget | recompute-only s | swap-only s | hybrid s | ratio | descent | solve s (CPU) |")
    print("|---|---|---|---|---|---|---|---|")
    for name in args.problems.split(","):
        p = load_problem(ROOT / "problems" / f"h100_{name}.json.gz")
        for b in budgets:
            rec, _, _ = _added(p, b, policy="recompute")
            swp, _, _ = _added(p, b, policy="swap")
            hyb, cpu, descent = _added(p, b)
            best = min(rec, swp)
            ratio = hyb / best if best > 0 and math.isfinite(best) else math.nan
            print(f"| {name} | {b:.2f} | {rec:.4f} | {swp:.4f} | {hyb:.4f} | {ratio:.3f} | {descent} | {cpu:.2f} |",
                  flush=True)


if __name__ == "__main__":
    main()
