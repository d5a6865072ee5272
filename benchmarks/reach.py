"""Reach and cost of each policy: the smallest budget each solver plans (as a
fraction of the no-remat peak) and its added time at 0.5 and 0.3.

Usage::

    python benchmarks/reach.py                       # the four h100 problems -> results/reach.md
    python benchmarks/reach.py --layered 500         # + a random layered graph, copies as slow as compute
    python benchmarks/reach.py --problems problems/h100_resnet50_b128.json.gz
    python benchmarks/reach.py --policies libra[swap] libra[recompute] swap-all   # some rows only

Reach is the stated ``min_feasible_bytes`` of a solve at the memory floor
(:func:`libra_opt.bounds.memory_lower_bound`), or the floor itself where the
solver meets it.  Added time is the simulated added seconds as a fraction of
the no-remat step ("-" where the budget is infeasible).
"""
from __future__ import annotations

import argparse
import glob
import time

from libra_opt import load_problem
from libra_opt.passes.bounds import memory_lower_bound
from libra_opt.frontend.generators import random_layered_graph
from libra_opt.passes.simulator import no_remat_peak, simulate
from libra_opt.ir.schedule import no_remat_schedule
from libra_opt.solvers import get_solver

POLICIES = [("libra", dict(policy="hybrid")), ("libra", dict(policy="recompute")), ("libra", dict(policy="swap")),
            ("swap-all", {}), ("checkpoint-all", {}), ("chen-greedy", {})]


def layered(n: int, seed: int = 0):
    """A random layered graph of ``n`` nodes whose copy of the no-remat peak takes one no-remat step."""
    p = random_layered_graph(n, seed=seed)
    step = simulate(p, no_remat_schedule(p)).time_s
    return random_layered_graph(n, seed=seed, bandwidth_bytes_per_s=no_remat_peak(p) / step)


def label(name: str, opts: dict) -> str:
    """A row's solver label: ``libra[swap]``, ``swap-all``."""
    return name + (f"[{opts['policy']}]" if opts else "")


def reach(problem, name, opts):
    """Smallest planned budget, bytes (the floor where met)."""
    floor = memory_lower_bound(problem)
    r = get_solver(name, **opts).solve(problem, floor, raise_on_infeasible=False)
    return floor if r.status != "infeasible" else r.min_feasible_bytes


def row(problem, name, opts) -> str:
    peak = no_remat_peak(problem)
    step = simulate(problem, no_remat_schedule(problem)).time_s
    t0 = time.perf_counter()
    rb = reach(problem, name, opts)
    cells = []
    for f in (0.5, 0.3):
        r = get_solver(name, **opts).solve(problem, f, raise_on_infeasible=False)
        cells.append("-" if r.status == "infeasible" else f"{r.added_s / step:.4f}")
    line = f"| {problem.name[:40]} | {label(name, opts)} | {rb / peak:.4f} | {cells[0]} | {cells[1]} | {time.perf_counter() - t0:.1f} |"
    print(line, flush=True)
    return line


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--problems", nargs="*", default=sorted(glob.glob("problems/h100_*.json.gz")))
    ap.add_argument("--layered", type=int, nargs="*", default=[])
    ap.add_argument("--policies", nargs="*", default=None,
                    help="rows to run, by label: libra[hybrid], libra[recompute], libra[swap], swap-all, "
                         "checkpoint-all, chen-greedy (default: all)")
    ap.add_argument("-o", "--out", default="benchmarks/results/reach.md", help="markdown table written here")
    a = ap.parse_args(argv)
    probs = [load_problem(p) for p in a.problems] + [layered(n) for n in a.layered]
    lines = ["| problem | solver | reach (x peak) | added @0.5 | added @0.3 | s |", "|---|---|---|---|---|---|"]
    print("\n".join(lines))
    pols = [(name, opts) for name, opts in POLICIES if a.policies is None or label(name, opts) in a.policies]
    if a.policies is not None and len(pols) < len(set(a.policies)):
        known = ", ".join(label(n, o) for n, o in POLICIES)
        ap.error(f"--policies: unknown label among {a.policies}; use some of: {known}")
    lines += [row(p, name, opts) for p in probs for name, opts in pols]
    with open(a.out, "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
