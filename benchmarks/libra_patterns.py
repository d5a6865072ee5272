"""libra recompute-only against the recompute optimum on the patterns of issue 16.

For each instance and budget (fractions of the no-remat peak): added compute of
``libra`` (``policy="recompute"``), of ``checkmate-milp`` (with its status:
only ``optimal`` rows are proven optima), the ratio, the cheapest built-in
recompute baseline that meets the budget (``checkpoint-all``, ``chen-sqrt``,
``chen-greedy``), and libra's solve time (process CPU seconds, first solve of
the problem: the baselines' plans are built then).  Instances:

- :func:`libra_opt.generators.large_beside_small_graph` (one large, costly
  activation beside several small, cheap ones) and
  :func:`libra_opt.generators.early_regeneration_graph` (a storage regenerated
  early and kept for another's regeneration), seeds 0-3;
- :func:`libra_opt.generators.vgg_segmentation_graph` (a SegNet-like VGG16
  segmentation CNN, ~980 MiB first-level convolution outputs) and
  :func:`libra_opt.generators.unet_graph` (U-Net with skip connections), with
  the tightest budget libra plans added;
- ``random_layered_n100`` from ``--graphs DIR`` (the Moccasin export, see
  ``checkmate_graphs.py``), when given.

Usage::

    python benchmarks/libra_patterns.py                       # generated graphs, MILP 60 s per solve
    python benchmarks/libra_patterns.py --graphs GRAPHS --time-limit 120
    python benchmarks/libra_patterns.py --quick               # the small pattern graphs only
    python benchmarks/libra_patterns.py --only vgg_segmentation unet --out benchmarks/results/libra_patterns_cnn.csv

Prints a markdown table and the count of rows over 1.05x a proven optimum or
above a baseline; writes ``benchmarks/results/libra_patterns.csv``.
"""
from __future__ import annotations

import argparse
import csv
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
BASELINES = ("checkpoint-all", "chen-sqrt", "chen-greedy")


def instances(args):
    """``(problem, fractions)`` pairs."""
    from libra_opt.frontend import generators as G
    from libra_opt.frontend.importers import load_problem_any

    out = []
    for n in ((16, 24) if args.quick else (16, 24, 30, 60)):
        for seed in range(4):
            out.append((G.large_beside_small_graph(n, seed=seed), (0.9, 0.8, 0.7)))
    for n in ((14, 20) if args.quick else (14, 20, 30, 60)):
        for seed in range(4):
            out.append((G.early_regeneration_graph(n, seed=seed), (0.9, 0.8, 0.7)))
    if not args.quick:
        out += [(G.vgg_segmentation_graph(), (0.9, 0.8, 0.7, "min")), (G.unet_graph(), (0.9, 0.8, 0.7, "min"))]
    if args.graphs:
        path = Path(args.graphs) / "random_layered_n100.json"
        if path.exists():
            out.append((load_problem_any(path), (0.9,)))
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--graphs", help="folder of Moccasin's node-link graphs (for random_layered_n100)")
    p.add_argument("--time-limit", type=float, default=60.0, help="seconds per MILP solve (default 60)")
    p.add_argument("--quick", action="store_true", help="the small pattern graphs only")
    p.add_argument("--only", nargs="*", default=None, metavar="NAME",
                   help="only instances whose name contains one of these (e.g. vgg_segmentation unet)")
    p.add_argument("--out", default=str(RESULTS / "libra_patterns.csv"))
    args = p.parse_args(argv)
    from libra_opt.passes.simulator import no_remat_peak
    from libra_opt.solvers import solve

    rows = []
    print("| instance | budget | MILP status | optimum | libra | ratio | best baseline | libra CPU s |")
    print("|---|---|---|---|---|---|---|---|")
    for prob, fracs in instances(args):
        if args.only and not any(name in prob.name for name in args.only):
            continue
        first = True
        for frac in fracs:
            budget = frac
            if frac == "min":
                r = solve(prob, 0.05, "libra", policy="recompute", raise_on_infeasible=False)
                if r.success or r.min_feasible_bytes is None:
                    continue
                budget = r.min_feasible_bytes / no_remat_peak(prob)
            t = time.process_time()
            lib = solve(prob, budget, "libra", policy="recompute", raise_on_infeasible=False)
            cpu = time.process_time() - t if first else None
            first = False
            m = solve(prob, budget, "checkmate-milp", raise_on_infeasible=False, time_limit_s=args.time_limit,
                      threads=1)
            base = [b for b in (solve(prob, budget, name, raise_on_infeasible=False) for name in BASELINES)
                    if b.success]
            best = min(base, key=lambda b: b.added_s) if base else None
            ratio = (lib.added_s / m.added_s if m.added_s > 0 else (1.0 if lib.added_s == 0 else float("inf"))
                     ) if lib.success and m.success else None
            row = dict(instance=prob.name, nodes=prob.num_nodes, budget=round(float(budget), 4),
                       milp_status=m.status, milp_added=m.added_s if m.success else None,
                       libra_added=lib.added_s if lib.success else None, ratio=ratio,
                       baseline=best.solver if best else None, baseline_added=best.added_s if best else None,
                       libra_cpu_s=cpu)
            rows.append(row)
            f = lambda v: "-" if v is None else f"{v:.4g}"  # noqa: E731
            print(f"| {prob.name} ({prob.num_nodes}) | {row['budget']} | {m.status} | {f(row['milp_added'])} | "
                  f"{f(row['libra_added']) if lib.success else lib.status} | {f(ratio)} | "
                  f"{(best.solver + ' ' + f(best.added_s)) if best else '-'} | {f(cpu)} |")
            sys.stdout.flush()
    over = [r for r in rows if r["milp_status"] == "optimal" and (r["ratio"] is None or r["ratio"] > 1.05)]
    above = [r for r in rows if r["baseline_added"] is not None
             and (r["libra_added"] is None or r["libra_added"] > r["baseline_added"] + 1e-9)]
    proven = sum(r["milp_status"] == "optimal" for r in rows)
    print(f"\n{len(over)} of {proven} proven rows over 1.05x the optimum; {len(above)} rows above a baseline")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    from libra_opt.atomic import atomic_write

    with atomic_write(out, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
