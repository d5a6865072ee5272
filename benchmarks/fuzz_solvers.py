"""Fuzz every built-in solver on seeded random problems (:mod:`libra_opt.fuzz`).

For each case ``seed`` in ``[start, start + cases)`` the problem is
``random_problem(seed)`` and the budget ``random_budget(problem, seed)``;
every solver plans it, and the plan is simulated again from scratch
(:func:`libra_opt.fuzz.check_case`).  The summary table counts, per solver,
valid plans, infeasible budgets, ``SolverError``s and internal errors
(anything else, or a plan the simulator rejects); the first few failures of
each kind are listed with their seeds so they can be replayed:

    python benchmarks/fuzz_solvers.py                       # 10,000 cases, fast solvers
    python benchmarks/fuzz_solvers.py --cases 500 --checkmate --checkmate-time-limit 5
    python benchmarks/fuzz_solvers.py --exact-only --checkmate-time-limit 2 -o results/fuzz_exact.md
    python -c "from libra_opt.apps.fuzz import *; p = random_problem(SEED); print(check_case(p, random_budget(p, SEED), 'swap-all'))"

Exit status 1 when any solver had an internal error or a ``SolverError``.
"""
from __future__ import annotations

import argparse
import collections
import logging
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", type=int, default=10_000, help="number of cases (default 10,000)")
    ap.add_argument("--start", type=int, default=0, help="first seed (default 0)")
    ap.add_argument("--checkmate", action="store_true",
                    help="also run the exact solvers: checkmate-lp, checkmate-milp and hybrid-milp")
    ap.add_argument("--exact-only", action="store_true", help="only the exact solvers (implies --checkmate)")
    ap.add_argument("--checkmate-time-limit", type=float, default=10.0,
                    help="time_limit_s of the exact solvers, seconds (default 10)")
    ap.add_argument("--show", type=int, default=3, help="failures listed per solver and kind (default 3)")
    ap.add_argument("-o", "--output", default=str(RESULTS / "fuzz_solvers.md"),
                    help="also write the summary here (default benchmarks/results/fuzz_solvers.md; '' for none)")
    args = ap.parse_args(argv)
    logging.disable(logging.WARNING)   # solvers log at INFO/WARNING per case

    from tqdm import tqdm

    from libra_opt.apps.fuzz import (FAST_SOLVERS, INFEASIBLE, INTERNAL_ERROR, PLAN, SOLVER_ERROR, check_case,
                                     random_budget, random_problem)

    solvers = [] if args.exact_only else list(FAST_SOLVERS)
    if args.checkmate or args.exact_only:
        solvers += [(name, {"time_limit_s": args.checkmate_time_limit})
                    for name in ("checkmate-lp", "checkmate-milp", "hybrid-milp")]
    labels = [name + (f" ({o['policy']})" if "policy" in o else "") for name, o in solvers]
    counts = {lab: collections.Counter() for lab in labels}
    seconds = collections.Counter()
    failures: dict[tuple[str, str], list[str]] = collections.defaultdict(list)
    for seed in tqdm(range(args.start, args.start + args.cases), desc="cases", unit="case", file=sys.stderr):
        p = random_problem(seed)
        budget = random_budget(p, seed)
        for lab, (name, opts) in zip(labels, solvers):
            t0 = time.perf_counter()
            outcome, msg = check_case(p, budget, name, **opts)
            seconds[lab] += time.perf_counter() - t0
            counts[lab][outcome] += 1
            if outcome in (SOLVER_ERROR, INTERNAL_ERROR):
                failures[lab, outcome].append(f"seed {seed}: {msg[:200]}")
    lines = [f"{args.cases} cases (seeds {args.start}..{args.start + args.cases - 1}), "
             f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}", "",
             "| solver | plans | infeasible | SolverError | internal errors | seconds |",
             "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for lab in labels:
        c = counts[lab]
        lines.append(f"| {lab} | {c[PLAN]} | {c[INFEASIBLE]} | {c[SOLVER_ERROR]} | {c[INTERNAL_ERROR]} | "
                     f"{seconds[lab]:.1f} |")
    for (lab, kind), msgs in sorted(failures.items()):
        lines += ["", f"{lab}: {len(msgs)} {kind.replace('_', ' ')}(s), first {min(len(msgs), args.show)}:"]
        lines += ["  " + m for m in msgs[:args.show]]
    text = "\n".join(lines) + "\n"
    print("\n" + text)
    if args.output:
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output).write_text(text)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
