"""``libra-opt simulate FILE [--plan PLAN.json] [--budget B] [--plot OUT.png]``

Simulates a plan (the no-remat plan by default) on a problem and prints its
peak memory (graph memory and with fixed memory), step time, recompute and
stall seconds and swapped bytes.  ``FILE`` is a libra-opt problem JSON
(``.json`` / ``.json.gz``) or a networkx node-link remat graph (such as
Checkmate's; see benchmarks/README.md).  With ``--budget``, the exit status is
1 when the plan goes over it (the message names the instruction).
"""
from __future__ import annotations

import argparse
import sys

from .common import (BUDGET_HELP, add_problem_arguments, budget_arg, check_outputs, description, read_problem,
                     report_unreadable)


#: the one-line help of the command in ``libra-opt --help``
HELP = "simulate a plan on a problem: peak memory, step time, recompute, stalls, swaps"


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Register the ``simulate`` subcommand; returns its parser."""
    p = subparsers.add_parser(
        "simulate", help=HELP,
        description=description(__doc__))
    add_problem_arguments(p)
    p.add_argument("--plan", metavar="PLAN.json",
                   help="schedule JSON (Schedule.save); default: the no-remat plan (free after last use)")
    p.add_argument("--budget", metavar="B", type=budget_arg, help="check the plan against this " + BUDGET_HELP)
    p.add_argument("--plot", metavar="OUT.png", help="write a memory timeline plot (with the no-remat plan "
                                                      "for comparison when --plan is given)")
    return p


def run(args: argparse.Namespace) -> int:
    """Run ``libra-opt simulate``; returns the exit status (0 ok, 1 over budget)."""
    from libra_opt.passes.bounds import memory_lower_bound
    from libra_opt.errors import BudgetExceededError
    from libra_opt.ir.schedule import Schedule, no_remat_schedule
    from libra_opt.passes.simulator import simulate
    from libra_opt.ir.units import format_bytes, format_seconds, parse_budget

    check_outputs(args.plot)
    problem = read_problem(args, "simulate")
    if problem is None:
        return 2
    try:
        plan = Schedule.load(args.plan) if args.plan else no_remat_schedule(problem)
    except OSError as e:
        report_unreadable("simulate", e)
        return 2
    reference = simulate(problem)
    result = reference if not args.plan else simulate(problem, plan)
    budget = None if args.budget is None else parse_budget(args.budget, reference.peak_bytes)

    label = f"{args.plan} ({plan!r})" if args.plan else "no rematerialization (free after last use)"
    peak_ins = plan.instructions[result.peak_index].describe(problem) if len(plan) else "-"
    print(f"problem:  {problem.name} ({len(problem.nodes)} nodes, {len(problem.tensors)} tensors, "
          f"{len(problem.outputs)} outputs) from {args.file}")
    if problem.provenance.source == "import":
        print(f"          imported graph: times in {problem.provenance.extra.get('time_unit', 'seconds')}")
    print(f"plan:     {label}")
    print(f"peak:     {format_bytes(result.peak_bytes)} ({result.peak_bytes} bytes) graph memory, "
          f"{format_bytes(result.total_peak_bytes)} ({result.total_peak_bytes} bytes) with fixed memory; "
          f"first reached at instruction {result.peak_index} ({peak_ins})")
    if args.plan:
        print(f"          no-remat peak {format_bytes(reference.peak_bytes)}: "
              f"{result.peak_bytes / max(reference.peak_bytes, 1):.1%} of it")
    print(f"          memory lower bound of any plan: {format_bytes(memory_lower_bound(problem))}")
    print(f"time:     step {format_seconds(result.time_s)} (compute {format_seconds(result.compute_s)}, "
          f"added {format_seconds(result.added_s)} = "
          f"{result.added_s / max(problem.total_compute_s, 1e-30):.1%} of the no-remat step)")
    print(f"          recompute {format_seconds(result.recompute_s)}, stalls {format_seconds(result.stall_s)}")
    print(f"swaps:    {format_bytes(result.d2h_bytes)} out, {format_bytes(result.h2d_bytes)} in; "
          f"host peak {format_bytes(result.host_peak_bytes)}")
    status = 0
    if budget is not None:
        try:
            simulate(problem, plan, budget)
            print(f"budget:   {format_bytes(budget)} ({budget} bytes): within "
                  f"({format_bytes(budget - result.peak_bytes)} to spare)")
        except BudgetExceededError as e:
            print(f"budget:   {format_bytes(budget)} ({budget} bytes): OVER by "
                  f"{format_bytes(result.peak_bytes - budget)}")
            print(f"libra-opt simulate: {e}", file=sys.stderr)
            status = 1
    if args.plot:
        from libra_opt.apps.plots import plot_memory_timeline

        plans = {"plan": (plan, result), "no remat": (no_remat_schedule(problem), reference)} if args.plan \
            else {"no remat": (plan, result)}
        plot_memory_timeline(problem, plans, args.plot, budget_bytes=budget)
        print(f"plot:     {args.plot}")
    return status
