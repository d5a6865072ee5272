"""``libra-opt sweep FILE --budgets 0.9,0.8,... [--policy ...] [--exchange-effort E] [--added-gap-tol TOL]
[--solver NAME] [--csv OUT.csv]``

Plans a problem for many memory budgets at once and prints one row per
budget: status, simulated peak, added step time and solve seconds.  With the
default ``libra`` solver every plan comes from **one** greedy descent (the
plan for a budget equals what ``libra-opt solve`` returns for it).  Budgets are
comma-separated: fractions of the no-remat peak (``0.8``), ``60%``, bytes or
``12GiB``.  ``--csv OUT.csv`` also writes the rows to a CSV file, as in
``compare``.
"""
from __future__ import annotations

import argparse
import csv
import sys

from .common import (BUDGET_HELP, add_libra_arguments, add_problem_arguments, budget_list_arg, check_outputs,
                     description, positive_float, read_problem, solver_names_help)


#: the one-line help of the command in ``libra-opt --help``
HELP = "plan a problem for many budgets (libra: one descent)"


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Register the ``sweep`` subcommand; returns its parser."""
    p = subparsers.add_parser("sweep", help=HELP,
                              description=description(__doc__))
    add_problem_arguments(p)
    p.add_argument("--budgets", required=True, metavar="B1,B2,...", type=budget_list_arg,
                   help="comma-separated budgets, each a " + BUDGET_HELP)
    p.add_argument("--solver", default="libra", metavar="NAME",
                   help=f"solver name (default libra): {solver_names_help()}")
    add_libra_arguments(p)
    p.add_argument("--time-limit", type=positive_float, metavar="S",
                   help="solver time limit per solve, seconds > 0")
    p.add_argument("--csv", metavar="OUT.csv", help="also write the rows as CSV")
    return p


def run(args: argparse.Namespace) -> int:
    """Run ``libra-opt sweep``; returns the exit status (0, or 2 on a bad argument)."""
    from libra_opt.passes.simulator import no_remat_peak
    from libra_opt.solvers import get_solver
    from libra_opt.ir.units import format_bytes, format_seconds

    from .solve import solver_options

    check_outputs(args.csv)
    budgets = args.budgets
    problem = read_problem(args, "sweep")
    if problem is None:
        return 2
    solver = get_solver(args.solver, **solver_options(args, args.solver))
    results = solver.solve_many(problem, budgets)
    ref = no_remat_peak(problem)
    base = max(problem.total_compute_s, 1e-30)
    head = ["budget", "budget_bytes", "status", "peak_bytes", "peak_fraction", "added_s", "added_fraction",
            "recompute_s", "stall_s", "swapped_bytes", "solve_s", "min_feasible_bytes"]
    rows = []
    for b, r in zip(budgets, results):
        sim = r.simulation
        rows.append([str(b), r.budget_bytes, r.status, r.peak_bytes, None if r.peak_bytes is None else r.peak_bytes / ref,
                     r.added_s, None if r.added_s is None else r.added_s / base,
                     sim.recompute_s if sim else None, sim.stall_s if sim else None,
                     sim.d2h_bytes if sim else None, r.solve_s, r.min_feasible_bytes])
    print(f"problem: {problem.name} ({len(problem.nodes)} nodes), no-remat peak {format_bytes(ref)}, "
          f"solver {solver.name} {solver.options}")
    print(f"{'budget':>10} {'status':>10} {'peak':>12} {'of peak':>8} {'added':>12} {'added %':>8} {'solve':>10}")
    for row, r in zip(rows, results):
        if r.success:
            print(f"{row[0]:>10} {r.status:>10} {format_bytes(r.peak_bytes):>12} {row[4]:>8.3f} "
                  f"{format_seconds(r.added_s):>12} {row[6]:>8.2%} {format_seconds(r.solve_s):>10}")
        else:
            need = f"needs {format_bytes(r.min_feasible_bytes)}" if r.min_feasible_bytes is not None else ""
            print(f"{row[0]:>10} {r.status:>10} {need:>34} {format_seconds(r.solve_s):>21}")
    if args.csv:
        from libra_opt.atomic import atomic_write

        with atomic_write(args.csv, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(head)
            w.writerows(["" if v is None else v for v in row] for row in rows)
        print(f"csv:  {args.csv}")
    return 0
