"""Every solver on the external Checkmate / random-layered graphs at 0.9, 0.8, 0.7
of the no-remat peak.

For each graph in ``GRAPHS/*.json`` (Checkmate's VGG16, ResNet50, MobileNet
training graphs and two random layered DAGs, as exported by Moccasin), runs :func:`libra_opt.compare.compare` and prints, per graph, a
markdown table of status, cost (added compute: simulated step time minus the
no-remat step, in the graphs' relative cost units), simulated peak and solve
time.  Then the LP-rounding / MILP ratio of total cost (step time) per
instance, which Checkmate reports within 1.06x (Jain et al., MLSys 2020,
sec. 6.3), and of added cost.

Writes ``benchmarks/results/checkmate_graphs.csv`` (every row) and
``benchmarks/results/checkmate_lp_milp_ratio.csv``.

Where the graphs come from: the networkx node-link JSON files published with
Moccasin (Bartan et al., "Moccasin: Efficient Tensor Rematerialization for
Neural Networks", ICML 2023), which export the Checkmate graphs (Jain et al.,
MLSys 2020, batch 256 / 512) and random layered graphs (Gagrani et al.,
NeurIPS 2022, appendix A).  They are GPL-3.0, so they are not in this
repository: download them and pass their folder as ``GRAPHS``.  Random layered
graphs of the same kind can be made with :mod:`libra_opt.generators`
(``--generate 100,250`` writes and runs seeded ones, no download needed).

Usage::

    python benchmarks/checkmate_graphs.py GRAPHS                 # all graphs, all solvers, MILP 60 s
    python benchmarks/checkmate_graphs.py GRAPHS --time-limit 20 --only vgg16 mobilenet
    python benchmarks/checkmate_graphs.py GRAPHS --solvers none,chen-sqrt,checkmate-lp --budgets 0.9,0.8
    python benchmarks/checkmate_graphs.py --generate 100,250     # generated random layered graphs only

Notes: times in these graphs are relative cost units (profiled on a V100 in
the original work), treated as seconds; swap costs use the default 55 GB/s
per cost unit, so swapping is nearly free here and only recompute costs are
comparable with Checkmate's numbers.  The MILP and LP coarsen graphs above
their ``max_nodes`` option (see their messages in the CSV).
"""
from __future__ import annotations

import argparse
import csv
import logging
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"

log = logging.getLogger("checkmate_graphs")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("graphs", nargs="?", metavar="GRAPHS",
                   help="folder of the node-link graphs (Moccasin's export of the Checkmate graphs; see above)")
    p.add_argument("--generate", metavar="N1,N2,...",
                   help="also run random layered graphs of these sizes from libra_opt.frontend.generators (seed 0)")
    p.add_argument("--only", nargs="*", default=None, metavar="NAME",
                   help="only graphs whose file name contains one of these")
    p.add_argument("--budgets", default="0.9,0.8,0.7", help="fractions of the no-remat peak (default 0.9,0.8,0.7)")
    p.add_argument("--solvers", default=None, help="comma-separated solver names (default: every registered one)")
    p.add_argument("--time-limit", type=float, default=60.0, metavar="S",
                   help="seconds per solve for solvers with a time limit (MILP, LP; default 60)")
    p.add_argument("--out", default=str(RESULTS / "checkmate_graphs.csv"), help="CSV of every row")
    p.add_argument("--no-progress", action="store_true")
    return p.parse_args(argv)


def graph_table(rows) -> str:
    """Markdown table of one graph's rows (cost in relative units)."""
    head = ["budget", "solver", "status", "cost (added)", "added %", "peak / no-remat", "bound (added)", "solve s",
            "note"]
    out = ["| " + " | ".join(head) + " |", "|" + "|".join(["---"] * len(head)) + "|"]
    peak = rows[0].budget_bytes / rows[0].budget_fraction if rows and rows[0].budget_fraction else None
    for r in rows:
        if r.success:
            cost, pct = f"{r.added_s:.6g}", f"{r.added_pct:.2f}%"
            pk = f"{r.peak_bytes / peak:.3f}" if peak else str(r.peak_bytes)
            # Checkmate solvers: what was returned (the MILP's plan, or libra's / a heuristic's)
            note = ""
            if r.solver.startswith("checkmate"):
                parts = r.message.split("; ")
                note = parts[0][:60] + "".join("; " + q.split(", which")[0] for q in parts[1:]
                                               if q.startswith(("returning the", "fell back to", "the libra")))
        else:
            cost = pct = "-"
            pk = (f"needs {r.min_feasible_bytes / peak:.3f}" if peak and r.min_feasible_bytes is not None else "-")
            note = r.message.split(";")[0][:60] if r.status in ("unavailable", "error") else ""
        bound = "-" if not r.success or r.lower_bound_s is None else f"{r.lower_bound_s - r.base_s:.6g}"
        out.append("| " + " | ".join([f"{r.budget_fraction:.2f}", r.solver, r.status, cost, pct, pk, bound,
                                      f"{r.solve_s:.3f}", note]) + " |")
    return "\n".join(out)


def lp_milp_ratios(rows) -> list[dict]:
    """Per (graph, budget) where both checkmate-lp and checkmate-milp have a plan: cost ratios."""
    by = {(r.problem, r.budget_bytes, r.solver): r for r in rows}
    out = []
    for (g, b, s), milp in by.items():
        if s != "checkmate-milp":
            continue
        lp = by.get((g, b, "checkmate-lp"))
        if lp is None:
            continue
        d = dict(graph=g, budget_fraction=round(milp.budget_fraction, 4), milp_status=milp.status,
                 lp_status=lp.status, milp_added=milp.added_s, lp_added=lp.added_s, total_ratio=None,
                 added_ratio=None)
        if milp.success and lp.success:
            d["total_ratio"] = lp.time_s / milp.time_s
            d["added_ratio"] = lp.added_s / milp.added_s if milp.added_s > 0 else (1.0 if lp.added_s == 0 else None)
        out.append(d)
    return out


def main(argv=None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    from libra_opt.cli.common import budget_list_arg
    from libra_opt.apps.compare import compare, rows_to_csv, time_limit_options
    from libra_opt.frontend.importers import load_problem_any
    from libra_opt.solvers import available_solvers

    graphs = sorted(Path(args.graphs).glob("*.json")) if args.graphs else []
    if args.only:
        graphs = [g for g in graphs if any(k in g.name for k in args.only)]
    if args.generate:
        import json
        import tempfile

        from libra_opt.frontend.generators import random_layered_graph_dict

        tmp = Path(tempfile.mkdtemp(prefix="random_layered_"))
        for n in (int(x) for x in args.generate.split(",")):
            path = tmp / f"random_layered_n{n}_seed0.json"
            path.write_text(json.dumps(random_layered_graph_dict(n, seed=0)))
            graphs.append(path)
    if not graphs:
        where = f"in {args.graphs}" if args.graphs else "(no GRAPHS folder given)"
        print(f"no graphs found {where}: pass the folder of Moccasin's node-link graphs (see --help), "
              f"or --generate 100,250", file=sys.stderr)
        return 2
    budgets = budget_list_arg(args.budgets)
    solvers = [s.strip() for s in args.solvers.split(",")] if args.solvers else available_solvers()
    options = time_limit_options(solvers, args.time_limit)

    t0 = time.perf_counter()
    all_rows = []
    for g in graphs:
        problem = load_problem_any(g)
        rows = compare(problem, budgets, solvers, solver_options=options, progress=not args.no_progress)
        all_rows += rows
        print(f"\n### {problem.name} ({len(problem.nodes)} nodes, no-remat step {problem.total_compute_s:.6g} "
              f"cost units)\n")
        print(graph_table(rows))
        sys.stdout.flush()

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    rows_to_csv(all_rows, out)
    ratios = lp_milp_ratios(all_rows)
    print("\n### LP rounding vs MILP (Checkmate reports LP rounding within 1.06x of the MILP)\n")
    if ratios:
        print("| graph | budget | MILP status | LP status | MILP added | LP added | total-cost ratio | "
              "added-cost ratio |")
        print("|---|---|---|---|---|---|---|---|")
        for d in ratios:
            f = lambda v: "-" if v is None else f"{v:.6g}"  # noqa: E731
            print(f"| {d['graph']} | {d['budget_fraction']:.2f} | {d['milp_status']} | {d['lp_status']} | "
                  f"{f(d['milp_added'])} | {f(d['lp_added'])} | {f(d['total_ratio'])} | {f(d['added_ratio'])} |")
        from libra_opt.atomic import atomic_write

        with atomic_write(out.parent / "checkmate_lp_milp_ratio.csv", "w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=list(ratios[0]))
            w.writeheader()
            w.writerows(ratios)
    else:
        print("(checkmate-lp and checkmate-milp were not both run)")
    print(f"\nrows: {out}; total {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
