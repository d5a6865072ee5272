"""libra's gap to the cut bounds, on every instance of issue 16's tables, in seconds.

The cut bounds (:mod:`libra_opt.passes.cut_bounds`) hold for every plan the
simulator accepts within a budget (hybrid), or every plan without swaps
(recompute), and need no solver; the ordered cut bounds
(:mod:`libra_opt.passes.order_bounds`) for those that compute nodes first in
their order, as libra's do (each plan gets the best bound valid for it).  For each instance, copy ratio and budget
this script runs ``libra`` (hybrid, and ``policy="recompute"``), computes the
bounds, and reports libra's step time, the bound, the gap and the seconds
each took.  Instances: the graphs ``GRAPH_NAMES`` found in ``GRAPHS`` (the
shared Checkmate / Moccasin exports, GPL-3.0, read from their folder), the
``problems/`` under ``--max-nodes`` nodes and the generated graphs of
:mod:`libra_opt.generators` (issue 16's two patterns at 100 nodes, the VGG
segmentation CNN, the U-Net, a random layered graph of 100 nodes).
Bandwidths as in ``hybrid_optimality.py``: copying the no-remat peak takes
``f`` no-remat steps, copies overlapping compute.

``--milp-csv FILE`` (``results/hybrid_optimality.csv``) re-counts issue 16's
``hybrid-milp`` target over the rows recorded there: each row's plan keeps its
recorded bound, and the hybrid cut bound at its budget is added (it bounds that
plan too), so its gap is to the larger of the two.

Usage::

    python benchmarks/cut_bound_gaps.py GRAPHS                      # the table (a few minutes)
    python benchmarks/cut_bound_gaps.py --only unet --budgets 0.8 --ratios 1
    python benchmarks/cut_bound_gaps.py GRAPHS --milp-csv benchmarks/results/hybrid_optimality.csv \\
        --milp-csv benchmarks/results/hybrid_optimality_highs.csv --only-milp

Writes ``results/cut_bound_gaps.csv`` (``--out``) and prints a markdown table.
"""
from __future__ import annotations

import argparse
import csv
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
GRAPH_NAMES = ("vgg16_b256_train", "random_layered_n100", "mobilenet_b512_train", "resnet50_b256_train")
TARGET_GAP = 0.05


def instances(graphs: str | None, max_nodes: int) -> list[tuple[str, object]]:
    """``(name, problem)`` of the instances (module docstring)."""
    from libra_opt.frontend import generators as g
    from libra_opt.frontend.importers import load_problem_any

    out = []
    if graphs:
        for name in GRAPH_NAMES:
            path = Path(graphs) / f"{name}.json"
            if path.exists():
                out.append((name, load_problem_any(path)))
    for path in sorted((ROOT / "problems").glob("*.json.gz")):
        p = load_problem_any(path)
        if p.num_nodes <= max_nodes:
            out.append((path.name.split(".")[0], p))
    out += [("large_beside_small_n100", g.large_beside_small_graph(100, seed=0)),
            ("early_regeneration_n100", g.early_regeneration_graph(100, seed=0)),
            ("vgg_segmentation", g.vgg_segmentation_graph()), ("unet", g.unet_graph()),
            ("random_layered_gen_n100", g.random_layered_graph(100, seed=0))]
    return out


def with_ratio(problem, ratio: float):
    """``problem`` with copies of the no-remat peak taking ``ratio`` no-remat steps (overlapping)."""
    from libra_opt.passes.simulator import no_remat_peak

    rate = no_remat_peak(problem) / (ratio * problem.total_compute_s)
    return problem.with_device(h2d_bytes_per_s=rate, d2h_bytes_per_s=rate, copies_overlap_compute=True)


def measure(name: str, problem, ratio: float, frac: float) -> list[dict]:
    """One row per libra policy (hybrid, recompute) at ``frac`` of the peak."""
    from libra_opt.passes.simulator import no_remat_peak
    from libra_opt.solvers import solve
    from libra_opt.solvers.certificates import best_bound, compute_floor_s, cut_bounds

    p = with_ratio(problem, ratio)
    budget = int(frac * no_remat_peak(p))
    rows = []
    for policy in ("hybrid", "recompute"):
        t0 = time.process_time()
        r = solve(p, budget, "libra", policy=policy, raise_on_infeasible=False)
        solve_s = time.process_time() - t0
        t0 = time.process_time()
        bounds = cut_bounds(p, budget)
        bound_s = time.process_time() - t0   # (the second policy's call is the memo's)
        row = dict(instance=name, nodes=p.num_nodes, copy_ratio=ratio, budget_fraction=frac, policy=policy,
                   status=r.status, solve_cpu_s=round(solve_s, 3), bound_cpu_s=round(bound_s, 3),
                   floor_s=None, time_s=None, bound=None, bound_kind=None, gap=None, floor_gap=None)
        if r.success:
            cert = best_bound(p, budget, r.schedule, bounds, simulation=r.simulation)
            floor = compute_floor_s(p)
            row.update(time_s=r.time_s, bound=cert.lower_bound_s, bound_kind=cert.kind, gap=cert.gap,
                       floor_s=floor, floor_gap=(r.time_s - floor) / floor if floor > 0 else None)
        rows.append(row)
    return rows


def recount(paths: list[str], graphs: str | None = None) -> list[dict]:
    """The rows of ``hybrid_optimality.py`` CSVs with the hybrid cut bound added to each row's bound
    (``graphs``: the folder of the shared graphs the rows name)."""
    from libra_opt.solvers.certificates import cut_bounds

    cache: dict = {}
    out = []
    for path in paths:
        with open(path) as f:
            for row in csv.DictReader(f):
                if row["status"] in ("infeasible", "error", "") or not row.get("time_s"):
                    continue
                name = row["instance"]
                if name not in cache:
                    cache[name] = _load(name, graphs)
                p = cache[name]
                if p is None:
                    continue
                q = with_ratio(p, float(row["bandwidth_x_step"]))
                budget = int(row["budget_bytes"])
                # (the bounds of every plan: a row has no schedule for the ordered bounds' covers test)
                cut = max(b.value_s for b in cut_bounds(q, budget) if b.kind == "hybrid" and b.covers is None)
                time_s = float(row["time_s"])
                old = float(row["lower_bound_s"]) if row.get("lower_bound_s") else None
                best = max(cut, old or 0.0)
                out.append(dict(file=Path(path).name, instance=name, copy_ratio=row["bandwidth_x_step"],
                                budget_fraction=row["budget_fraction"], status=row["status"], time_s=time_s,
                                recorded_bound=old, recorded_gap=float(row["gap"]) if row.get("gap") else None,
                                cut_bound=cut, gap=max(0.0, (time_s - best) / best),
                                met=row["status"] == "optimal" or (time_s - best) / best <= TARGET_GAP))
    return out


def _load(name: str, graphs: str | None):
    """The problem a ``hybrid_optimality.py`` row names (``None``, with a note, where it is not found)."""
    from libra_opt.frontend import generators as g
    from libra_opt.frontend.importers import load_problem_any

    if name.startswith("random_layered_gen_n"):
        return g.random_layered_graph(int(name.rsplit("n", 1)[1]), seed=0)
    if name.startswith("large_beside_small_n"):
        return g.large_beside_small_graph(int(name.rsplit("n", 1)[1]), seed=0)
    if name.startswith("early_regeneration_n"):
        return g.early_regeneration_graph(int(name.rsplit("n", 1)[1]), seed=0)
    for path in [*([Path(graphs) / f"{name}.json"] if graphs else []),
                 *sorted((ROOT / "problems").glob(f"{name}*.json.gz"))]:
        if path.is_file():
            return load_problem_any(path)
    print(f"skipped {name}: not found (pass GRAPHS)", file=sys.stderr)
    return None


def _fmt(v, spec=".4g") -> str:
    return "-" if v is None or v == "" else format(v, spec)


def main(argv=None) -> int:
    """Run the table (and the re-count of ``--milp-csv``); returns the exit status."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("graphs", nargs="?", help="folder of the shared node-link graphs")
    ap.add_argument("--max-nodes", type=int, default=400, help="problems/ of at most this many nodes")
    ap.add_argument("--budgets", default="0.9,0.8,0.7,0.5")
    ap.add_argument("--ratios", default="0.25,1,4", help="copy ratios (no-remat peak copy over no-remat step)")
    ap.add_argument("--only", nargs="*", default=None, metavar="NAME", help="instances whose name contains one of these")
    ap.add_argument("--milp-csv", action="append", default=[], help="hybrid_optimality.py results to re-count")
    ap.add_argument("--only-milp", action="store_true", help="only re-count --milp-csv")
    ap.add_argument("--out", default=str(RESULTS / "cut_bound_gaps.csv"))
    args = ap.parse_args(argv)
    if args.milp_csv:
        rows = recount(args.milp_csv, args.graphs)
        print("| file | instance | copy / step | budget | status | time | recorded bound | recorded gap "
              "| cut bound | gap | met |")
        print("|---|---|---|---|---|---|---|---|---|---|---|")
        for r in rows:
            print(f"| {r['file']} | {r['instance']} | {r['copy_ratio']} | {r['budget_fraction']} | {r['status']} | "
                  f"{_fmt(r['time_s'], '.6g')} | {_fmt(r['recorded_bound'], '.6g')} | "
                  f"{_fmt(r['recorded_gap'], '.2%')} | {_fmt(r['cut_bound'], '.6g')} | {_fmt(r['gap'], '.2%')} | "
                  f"{'yes' if r['met'] else 'NO'} |")
        for f in sorted({r["file"] for r in rows}):
            sub = [r for r in rows if r["file"] == f]
            print(f"{f}: target met in {sum(r['met'] for r in sub)} of {len(sub)} rows with a plan")
        if args.only_milp:
            return 0
    budgets = [float(b) for b in args.budgets.split(",")]
    ratios = [float(r) for r in args.ratios.split(",")]
    rows = []
    for name, p in instances(args.graphs, args.max_nodes):
        if args.only and not any(o in name for o in args.only):
            continue
        for ratio in ratios:
            for frac in budgets:
                rows += measure(name, p, ratio, frac)
                print(f"  {name} copy {ratio} @ {frac}: " + "; ".join(
                    f"{r['policy']} {r['status']} gap {_fmt(r['gap'], '.2%')}" for r in rows[-2:]),
                      file=sys.stderr, flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    print("| instance | nodes | copy / step | budget | policy | libra time | bound (kind) | gap | floor gap "
          "| libra CPU s | bound CPU s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        if r["status"] == "infeasible":
            cell = "infeasible | - | - | -"
        else:
            cell = (f"{_fmt(r['time_s'], '.6g')} | {_fmt(r['bound'], '.6g')} ({r['bound_kind']}) | "
                    f"{_fmt(r['gap'], '.2%')} | {_fmt(r['floor_gap'], '.2%')}")
        print(f"| {r['instance']} | {r['nodes']} | {r['copy_ratio']} | {r['budget_fraction']} | {r['policy']} | "
              f"{cell} | {r['solve_cpu_s']} | {r['bound_cpu_s']} |")
    planned = [r for r in rows if r["gap"] is not None]
    within = sum(r["gap"] <= TARGET_GAP for r in planned)
    print(f"\nlibra within {TARGET_GAP:.0%} of the cut bound in {within} of {len(planned)} planned rows; "
          f"worst gap {max((r['gap'] for r in planned), default=0):.2%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
