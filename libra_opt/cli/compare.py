"""``libra-opt compare FILE [--budgets 0.9,0.8,0.7] [--solvers none,chen-sqrt,...] [--csv OUT] [--plot OUT.png]``

Runs every solver at every memory budget on one problem and prints a table:
status, added step time (seconds and % of the no-remat step), simulated peak,
solve time, and the gap to the best lower bound valid for that plan among
those any solver proved at that budget and the cut bounds (which hold for
every plan: ``libra_opt.passes.cut_bounds``), with the bound's plan class
(``recompute``: bounds plans without swaps, e.g. Checkmate's LP/MILP, and
only plans its model dominates; ``hybrid``: every plan), or "bound unknown"
where none holds (a plan that swaps against a recompute bound, a coarsened
model's bound; with ``--no-cut-bounds``).  Gaps are never negative.  Every plan in the table was
accepted by the simulator within its budget.  ``FILE`` is a libra-opt problem JSON or a networkx node-link remat
graph such as Checkmate's (times there are relative cost units; see
benchmarks/README.md for where to get them).

Budgets: fractions of the no-remat peak (``0.8``), percentages (``80%``) or
sizes (``12GiB``, ``1500000000``), comma-separated.  Solvers: registered names,
comma-separated (default: all); a solver whose backend is not installed is
reported as ``unavailable``.  ``--time-limit`` is passed to the solvers that
have a time limit (the MILP).
"""
from __future__ import annotations

import argparse
import sys

from .common import (BUDGET_HELP, add_problem_arguments, budget_list_arg, check_outputs, description,
                     positive_float, read_problem, solver_names_help)


#: the one-line help of the command in ``libra-opt --help``
HELP = "compare solvers over memory budgets: added time, peak, solve time, gap to a valid bound"


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Register the ``compare`` subcommand; returns its parser."""
    p = subparsers.add_parser(
        "compare", help=HELP,
        description=description(__doc__),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    add_problem_arguments(p)
    p.add_argument("--budgets", default=[0.9, 0.8, 0.7], metavar="B1,B2,...", type=budget_list_arg,
                   help="comma-separated budgets (default 0.9,0.8,0.7), each a " + BUDGET_HELP)
    p.add_argument("--solvers", default=None, metavar="S1,S2,...",
                   help=f"solver names, comma-separated (default: all): {solver_names_help()}")
    p.add_argument("--csv", metavar="OUT.csv", help="also write the rows as CSV")
    p.add_argument("--plot", metavar="OUT.png", help="plot added time against budget, one curve per solver")
    p.add_argument("--time-limit", type=positive_float, metavar="S",
                   help="seconds > 0 per solve, for solvers with a time limit (checkmate-milp)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--no-cut-bounds", action="store_true",
                   help="gaps to the solvers' own bounds only (default: the cut bounds too, which bound every plan)")
    return p


def run(args: argparse.Namespace) -> int:
    """Run ``libra-opt compare``; returns the exit status (0; 2 on bad input)."""
    from libra_opt.apps.compare import compare, format_table, plot_rows, rows_to_csv, time_limit_options
    from libra_opt.passes.simulator import no_remat_peak
    from libra_opt.solvers import available_solvers
    from libra_opt.ir.units import format_bytes, format_seconds

    check_outputs(args.csv, args.plot)
    budgets = args.budgets
    solvers = [s.strip() for s in args.solvers.split(",") if s.strip()] if args.solvers else available_solvers()
    if not solvers:
        print("libra-opt compare: error: --solvers is empty", file=sys.stderr)
        return 2
    problem = read_problem(args, "compare")
    if problem is None:
        return 2
    peak = no_remat_peak(problem)

    rows = compare(problem, budgets, solvers, solver_options=time_limit_options(solvers, args.time_limit),
                   progress=not args.no_progress, cut_bounds=not args.no_cut_bounds)
    unit = problem.provenance.extra.get("time_unit") if problem.provenance.source == "import" else None
    print(f"problem: {problem.name} ({len(problem.nodes)} nodes) from {args.file}")
    print(f"no-remat peak {format_bytes(peak)} ({peak} bytes), step {format_seconds(problem.total_compute_s)}"
          + (f" (times in {unit})" if unit else ""))
    print()
    print(format_table(rows))
    notes = dict.fromkeys((r.solver, r.status, r.message) for r in rows if r.status in ("unavailable", "error"))
    for solver, status, message in notes:
        print(f"note: {solver}: {status}: {message}")
    if args.csv:
        rows_to_csv(rows, args.csv)
        print(f"csv:  {args.csv}")
    if args.plot:
        if any(r.success for r in rows):
            plot_rows(rows, args.plot, title=f"{problem.name}: added time vs memory budget")
            print(f"plot: {args.plot}")
        else:
            print("libra-opt compare: no solver found a plan at any budget: no plot written", file=sys.stderr)
    return 0
