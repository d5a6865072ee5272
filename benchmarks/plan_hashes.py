"""Hash the instruction lists of plans on the instances in ``problems/`` (or
the problem files given: libra problem files or external graphs).

A regression check for changes that must leave plans alone: run it before and
after a change and compare the two JSON files (``--compare OLD NEW`` lists the
(problem, policy, budget) cells whose plan changed, appeared or vanished).

    python benchmarks/plan_hashes.py -o before.json
    python benchmarks/plan_hashes.py -o after.json
    python benchmarks/plan_hashes.py --compare before.json after.json

    python benchmarks/plan_hashes.py --all-solvers problems/*.json.gz REMAT_GRAPHS/*.json

(``REMAT_GRAPHS``: the folder of the external Checkmate / Moccasin graphs, see
``benchmarks/README.md``.)

Each cell is ``solve_many(problem, budgets, solver="libra", policy=...)``'s
result for one budget (with ``--all-solvers``, also every deterministic
built-in solver's: the baselines, and ``checkmate-lp`` on problems of at
most ``LP_MAX_NODES`` nodes; the time-limited MILPs are left out, as their
plans depend on the machine's speed): the SHA-256 of the schedule's ``(op,
arg)`` list with the simulated peak (bytes) and step time (s), or
``"infeasible"``, or the error's type and message.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import logging
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
POLICIES = ("hybrid", "recompute", "swap")
#: deterministic built-in solvers hashed with --all-solvers (besides libra's three policies)
OTHER_SOLVERS = ("none", "checkpoint-all", "chen-sqrt", "chen-greedy", "swap-all", "checkmate-lp")
#: checkmate-lp is hashed on problems of at most this many nodes (its LP grows with the square)
LP_MAX_NODES = 120
BUDGETS = (0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3)


def schedule_hash(schedule) -> str:
    """SHA-256 (hex, first 16 digits) of a schedule's instruction list."""
    h = hashlib.sha256()
    for ins in schedule.instructions:
        h.update(f"{int(ins.op)},{ins.arg};".encode())
    return h.hexdigest()[:16]


def hash_all(paths, policies=POLICIES, budgets=BUDGETS, solvers=()) -> dict:
    """``{problem file: {policy or solver: {budget: hash or outcome}}}``: libra
    under each of ``policies``, then each of ``solvers``."""
    from libra_opt.frontend.importers import load_problem_any
    from libra_opt.solvers import solve_many

    out: dict = {}
    for path in paths:
        p = load_problem_any(path)
        cells = out.setdefault(Path(path).name, {})
        runs = [(pol, dict(solver="libra", policy=pol)) for pol in policies]
        runs += [(name, dict(solver=name)) for name in solvers
                 if name != "checkmate-lp" or p.num_nodes <= LP_MAX_NODES]
        for key, kw in runs:
            t0 = time.perf_counter()
            try:
                res = solve_many(p, list(budgets), **kw)
                cells[key] = {str(b): [schedule_hash(r.schedule), r.peak_bytes, r.time_s] if r.success
                              else "infeasible" for b, r in zip(budgets, res)}
            except Exception as e:  # record the failure: it is part of what is compared
                cells[key] = {str(b): f"error {type(e).__name__}: {str(e)[:160]}" for b in budgets}
            print(f"{Path(path).name:40s} {key:14s} {time.perf_counter() - t0:7.1f} s", file=sys.stderr, flush=True)
    return out


def compare(old: dict, new: dict) -> list[str]:
    """Lines naming every cell that differs between two hash files."""
    lines = []
    for prob in sorted(set(old) | set(new)):
        for pol in sorted(set(old.get(prob, {})) | set(new.get(prob, {}))):
            a, b = old.get(prob, {}).get(pol, {}), new.get(prob, {}).get(pol, {})
            for bud in sorted(set(a) | set(b), key=float, reverse=True):
                x, y = a.get(bud), b.get(bud)
                if x == y:
                    continue
                if isinstance(x, list) and isinstance(y, list):
                    what = ("same peak and step time" if x[1:] == y[1:] else
                            f"peak {x[1]} -> {y[1]} bytes, step {x[2] * 1e3:.4f} -> {y[2] * 1e3:.4f} ms")
                    lines.append(f"{prob} {pol} {bud}: plan {x[0]} -> {y[0]}: {what}")
                else:
                    lines.append(f"{prob} {pol} {bud}: {x} -> {y}")
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("problems", nargs="*", help="problem files (default: every file in problems/)")
    ap.add_argument("-o", "--output", help="write the hashes here (JSON)")
    ap.add_argument("--all-solvers", action="store_true",
                    help=f"also hash {', '.join(OTHER_SOLVERS)} (deterministic built-in solvers)")
    ap.add_argument("--compare", nargs=2, metavar=("OLD", "NEW"), help="compare two hash files")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    if args.compare:
        diff = compare(*(json.loads(Path(f).read_text()) for f in args.compare))
        print("\n".join(diff) if diff else "no plan changed")
        return 0
    paths = args.problems or sorted(str(p) for p in (ROOT / "problems").glob("*.json*"))
    res = hash_all(paths, solvers=OTHER_SOLVERS if args.all_solvers else ())
    text = json.dumps(res, indent=1, sort_keys=True)
    if args.output:
        Path(args.output).write_text(text)
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
