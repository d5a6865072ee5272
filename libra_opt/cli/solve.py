"""``libra-opt solve FILE --budget B [--solver NAME] [--policy P] [--exchange-effort E] [--added-gap-tol TOL]
[--explain [N]] [-o PLAN.json] [--plot OUT.png]``

Plans a problem within a memory budget with a solver (``libra`` by default)
and prints the plan's simulated peak, step time and what it costs.  ``FILE`` is
a libra-opt problem JSON (``.json`` / ``.json.gz``) or a networkx node-link
remat graph.  ``--budget`` takes a size with a unit (``12GiB``, ``1000000B``),
``60%`` or a fraction of the no-remat peak (``0.6``).  ``--explain`` prints the solver's top N decisions
with why they were made (``libra``); ``-o`` writes the plan as JSON;
``--plot`` draws its memory timeline next to the no-remat plan's.  Exit
status 1 when no plan fits the budget (the message says the smallest budget
that does).
"""
from __future__ import annotations

import argparse

from .common import (BUDGET_HELP, add_libra_arguments, add_problem_arguments, budget_arg, check_outputs, description,
                     positive_float, read_problem, solver_names_help)


#: the one-line help of the command in ``libra-opt --help``
HELP = "plan a problem within a memory budget (default solver: libra)"


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Register the ``solve`` subcommand; returns its parser."""
    p = subparsers.add_parser("solve", help=HELP,
                              description=description(__doc__))
    add_problem_arguments(p)
    p.add_argument("--budget", required=True, metavar="B", type=budget_arg, help=BUDGET_HELP)
    p.add_argument("--solver", default="libra", metavar="NAME",
                   help=f"solver name (default libra): {solver_names_help()}")
    add_libra_arguments(p)
    p.add_argument("--time-limit", type=positive_float, metavar="S",
                   help="solver time limit, seconds > 0 (solvers that have one)")
    p.add_argument("--explain", nargs="?", type=int, const=10, default=None, metavar="N",
                   help="print the top N decisions and why (default N 10)")
    p.add_argument("-o", "--output", metavar="PLAN.json", help="write the plan (Schedule JSON)")
    p.add_argument("--plot", metavar="OUT.png", help="memory timeline of the plan and the no-remat plan")
    return p


def solver_options(args: argparse.Namespace, solver_name: str) -> dict:
    """Options from the command line that the chosen solver knows."""
    import dataclasses

    from libra_opt.errors import SolverError
    from libra_opt.solvers import solver_class

    known = {f.name for f in dataclasses.fields(solver_class(solver_name).Options)}
    opts = {}
    for name in ("policy", "exchange_effort", "added_gap_tol"):   # libra's
        if getattr(args, name, None) is not None:
            flag = "--" + name.replace("_", "-")
            if name not in known:
                raise SolverError(f"{flag} applies to the libra solver only, not {solver_name!r}: drop {flag} "
                                  f"or use --solver libra")
            opts[name] = getattr(args, name)
    if getattr(args, "time_limit", None) is not None and "time_limit_s" in known:
        opts["time_limit_s"] = args.time_limit
    return opts


def bound_text(result) -> str:
    """What the result says about a lower bound on the step time: the bound,
    its plan class and source, and the gap to it, or why there is none
    ("bound unknown")."""
    from libra_opt.ir.units import format_seconds

    coarse = result.extras.get("coarse_bounds_s")
    values = ", ".join(f"{k} {format_seconds(v)}" for k, v in (coarse or {}).items())
    if result.lower_bound_s is not None:
        gap = "" if result.gap is None else f", gap {result.gap:.2%}"
        also = f"; the {values} bounds the coarsened graph only" if coarse else ""
        # a bound with a covers test (a model's, the ordered cut bounds) holds for the plans it covers only
        held = next((b for b in result.bounds if b.source == result.bound_source), None)
        scope = " of its class" if held is not None and held.covers is not None else ""
        return (f"step time >= {format_seconds(result.lower_bound_s)} for every {result.bound_kind} plan{scope} "
                f"({result.bound_source}){gap}{also}")
    if coarse:
        return f"bound unknown (the {values} bounds the coarsened graph only, not this graph)"
    if result.bounds:
        kinds = sorted({b.kind for b in result.bounds})
        return (f"bound unknown ({result.solver}'s {'/'.join(kinds)} bound does not hold for this plan: "
                f"it swaps, or lies outside the bound's model)")
    return f"bound unknown ({result.solver} reports no lower bound)"


def run(args: argparse.Namespace) -> int:
    """Run ``libra-opt solve``; returns the exit status (0 plan found, 1 infeasible)."""
    from libra_opt.solvers import get_solver
    from libra_opt.ir.units import format_bytes, format_seconds

    check_outputs(args.output, args.plot)
    problem = read_problem(args, "solve")
    if problem is None:
        return 2
    solver = get_solver(args.solver, **solver_options(args, args.solver))
    result = solver.solve(problem, args.budget, raise_on_infeasible=False)
    if result.success:   # the cut bounds: a gap for every plan, whichever solver made it
        from libra_opt.solvers.certificates import with_cut_bounds

        result = with_cut_bounds(problem, result)
    print(f"problem:  {problem.name} ({len(problem.nodes)} nodes) from {args.file}")
    print(f"solver:   {result.solver} {solver.options}")
    print(f"budget:   {format_bytes(result.budget_bytes)} ({result.budget_bytes} bytes)")
    if not result.success:
        print(f"result:   {result.status}: {result.message}")
        return 1
    sim = result.simulation
    base = problem.total_compute_s
    print(f"result:   {result.status} in {format_seconds(result.solve_s)}: {result.message}")
    print(f"peak:     {format_bytes(result.peak_bytes)} ({result.peak_bytes} bytes), "
          f"{format_bytes(sim.total_peak_bytes)} with fixed memory")
    print(f"time:     step {format_seconds(result.time_s)}, added {format_seconds(result.added_s)} "
          f"({result.added_s / max(base, 1e-30):.2%}): recompute {format_seconds(sim.recompute_s)}, "
          f"stalls {format_seconds(sim.stall_s)}")
    print(f"swaps:    {format_bytes(sim.d2h_bytes)} out, {format_bytes(sim.h2d_bytes)} in; "
          f"recomputed nodes {len(result.schedule.recomputed_nodes())}")
    print(f"bound:    {bound_text(result)}")
    if result.extras.get("heuristic"):
        print(f"fallback: the plan is the {result.extras['heuristic']} heuristic, not a rounding of the LP")
    if args.explain is not None:
        decisions = result.extras.get("decisions")
        if decisions is None:
            print(f"explain:  solver {result.solver!r} records no decisions")
        elif "baseline" in result.extras:
            print(f"explain:  the plan is the {result.extras['descent']} baseline's (hybrid's portfolio): "
                  f"{result.message}")
        else:
            from libra_opt.solvers.libra.explain import format_decisions

            print(format_decisions(decisions, args.explain))
            for r in result.extras.get("retained", ()):
                print(f"  retained {r['name']} ({format_bytes(r['nbytes'])}) past its last use through node "
                      f"{problem.nodes[r['until']].name}, for the recomputation chain there")
            for r in result.extras.get("swap_retained", ()):
                print(f"  swapped {r['name']} ({format_bytes(r['nbytes'])}) out after its last use and back in "
                      f"before node {problem.nodes[r['until']].name}, for the recomputation chain there")
    if args.output:
        result.schedule.save(args.output)
        print(f"plan:     {args.output}")
    if args.plot:
        from libra_opt.apps.plots import plot_memory_timeline
        from libra_opt.ir.schedule import no_remat_schedule
        from libra_opt.passes.simulator import simulate

        base_plan = no_remat_schedule(problem)
        plot_memory_timeline(problem, {result.solver: (result.schedule, sim),
                                       "no remat": (base_plan, simulate(problem, base_plan))},
                             args.plot, budget_bytes=result.budget_bytes)
        print(f"plot:     {args.plot}")
    return 0
