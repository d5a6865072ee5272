"""Quality of the ``libra`` solver: three tables.

1. **Recompute mode vs Checkmate** on the external Checkmate graphs (VGG16,
   MobileNet, ResNet50) and random layered graphs (n100, n250) at 0.9 / 0.8 /
   0.7 of the no-remat peak (``--graphs DIR``: the node-link files published
   with Moccasin, Bartan et al. ICML 2023, GPL-3.0 and so not in this
   repository; see ``checkmate_graphs.py``; without it this table is skipped): added compute of ``libra`` (``policy="recompute"``)
   against ``checkmate-milp`` and ``checkmate-lp`` (when importable), the
   ratios, and every case where libra is over 1.05x the MILP or over the LP.
   MILP/LP rows are cached in ``benchmarks/results/libra_quality_checkmate.csv``
   (delete it or pass ``--refresh`` to recompute; ``--time-limit`` per solve).
2. **Hybrid vs single policies** on profiled problems (``problems/*.json*``)
   and a synthetic GPT-like problem with H100 numbers (55 GB/s, copies
   overlapping compute; :func:`libra_speed.transformer_problem`): added step
   time of hybrid (with and without the ``portfolio`` safety net), recompute
   only and swap only, per budget.
3. **Reach**: the smallest budget libra plans (hybrid and recompute) against
   the smallest any baseline reaches (``none``, ``checkpoint-all``,
   ``chen-sqrt``, ``chen-greedy``, ``swap-all``).

Times on the Checkmate graphs are relative cost units (see the importer).

Usage::

    python benchmarks/libra_quality.py --graphs GRAPHS    # everything (MILP: 60 s per solve, cached)
    python benchmarks/libra_quality.py --graphs GRAPHS --time-limit 20 --only vgg16 mobilenet
    python benchmarks/libra_quality.py --skip-checkmate   # tables 2 and 3 only
"""
from __future__ import annotations

import argparse
import csv
import glob
import importlib.util
import logging
import os
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GRAPHS = None  # the folder given as --graphs
CACHE = ROOT / "benchmarks" / "results" / "libra_quality_checkmate.csv"
BUDGETS = (0.9, 0.8, 0.7)
BASELINES = ("none", "checkpoint-all", "chen-sqrt", "chen-greedy", "swap-all")


def _solve(name, problem, budget, **opts):
    from libra_opt.solvers import get_solver

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t = time.perf_counter()
        try:
            r = get_solver(name, **opts).solve(problem, budget, raise_on_infeasible=False)
        except Exception as e:  # a solver failing is a row, not a crash
            return dict(status="error", added=None, peak=None, need=None, solve_s=time.perf_counter() - t,
                        message=str(e)[:120])
    return dict(status=r.status, added=r.added_s, peak=r.peak_bytes, need=r.min_feasible_bytes,
                solve_s=time.perf_counter() - t, message=r.message[:120])


def _load_cache(refresh: bool) -> dict:
    if refresh or not CACHE.exists():
        return {}
    with open(CACHE) as f:
        return {(r["graph"], r["budget"], r["solver"], r["time_limit_s"]): r for r in csv.DictReader(f)}


def _save_cache(cache: dict) -> None:
    CACHE.parent.mkdir(parents=True, exist_ok=True)
    keys = ["graph", "budget", "solver", "time_limit_s", "status", "added", "peak", "need", "solve_s", "message"]
    from libra_opt.atomic import atomic_write

    with atomic_write(CACHE, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        for r in cache.values():
            w.writerow({k: r.get(k) for k in keys})


def _num(x):
    return None if x in (None, "", "None") else float(x)


def checkmate_table(only, time_limit, refresh) -> None:
    from libra_opt.frontend.importers import load_remat_graph

    have = {n: importlib.util.find_spec(f"libra_opt.solvers.{m}") is not None
            for n, m in (("checkmate-milp", "checkmate_milp"), ("checkmate-lp", "checkmate_lp"))}
    cache = _load_cache(refresh)
    files = sorted(glob.glob(os.path.join(GRAPHS, "*.json")))
    files = [f for f in files if not only or any(o in os.path.basename(f) for o in only)]
    print("\n## 1. libra (recompute) vs Checkmate: added compute (relative cost units)\n")
    print("| graph | budget | libra | MILP | MILP status | LP | libra/MILP | libra/LP | libra s |")
    print("|---|---|---|---|---|---|---|---|---|")
    ratios, notes = [], []
    for path in files:
        g = Path(path).stem
        p = load_remat_graph(path)
        for b in BUDGETS:
            lib = _solve("libra", p, b, policy="recompute")
            row = {}
            for name, ok in have.items():
                key = (g, str(b), name, str(time_limit))
                if not ok:
                    row[name] = dict(status="absent", added=None)
                    continue
                if key not in cache:
                    log.info("%s %s at %s ...", name, g, b)
                    r = _solve(name, p, b, time_limit_s=time_limit)
                    cache[key] = dict(graph=g, budget=str(b), solver=name, time_limit_s=str(time_limit), **r)
                    _save_cache(cache)
                row[name] = cache[key]
            milp, lp = _num(row["checkmate-milp"].get("added")), _num(row["checkmate-lp"].get("added"))
            la = lib["added"]
            r_m = la / milp if la is not None and milp else (1.0 if la == 0 and milp == 0 else None)
            r_l = la / lp if la is not None and lp else (1.0 if la == 0 and lp == 0 else None)
            if r_m is not None:
                ratios.append(r_m)
            fmt = lambda x: "-" if x is None else f"{x:.6g}"  # noqa: E731
            print(f"| {g} | {b} | {fmt(la) if la is not None else lib['status']} | {fmt(milp)} | "
                  f"{row['checkmate-milp'].get('status')} | {fmt(lp)} | {fmt(r_m)} | {fmt(r_l)} | "
                  f"{lib['solve_s']:.3f} |")
            if la is None and (milp is not None or lp is not None):
                notes.append(f"{g} @ {b}: libra finds no plan (needs {lib['need']} B), Checkmate does")
            if r_m is not None and r_m > 1.05:
                notes.append(f"{g} @ {b}: libra {r_m:.3f}x the MILP ({row['checkmate-milp'].get('status')})")
            if r_l is not None and r_l > 1.0 + 1e-9:
                notes.append(f"{g} @ {b}: libra {r_l:.3f}x the LP rounding")
    if ratios:
        print(f"\nmean libra/MILP over {len(ratios)} cases where both have a plan: "
              f"{sum(ratios) / len(ratios):.3f}")
    for n in notes:
        print(f"- {n}")


def _problems():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from libra_speed import transformer_problem

    from libra_opt.ir.problem_io import load_problem

    out = [load_problem(f) for f in sorted(glob.glob(str(ROOT / "problems" / "*.json*")))]
    out.append(transformer_problem(layers=12))
    return out


def hybrid_table(problems) -> None:
    from libra_opt.solvers import get_solver

    budgets = [0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3]
    print("\n## 2. hybrid vs single policies: added step time (% of the no-remat step)\n")
    print("| problem | budget | hybrid | hybrid, no portfolio | recompute | swap | best single | hybrid <= best |")
    print("|---|---|---|---|---|---|---|---|")
    for p in problems:
        runs = {}
        for label, opts in (("hybrid", {}), ("nopf", dict(portfolio=False)), ("recompute", dict(policy="recompute")),
                            ("swap", dict(policy="swap"))):
            runs[label] = get_solver("libra", **opts).solve_many(p, budgets)
        base = p.total_compute_s
        for k, b in enumerate(budgets):
            cell = {lab: (rs[k].added_s / base if rs[k].success else None) for lab, rs in runs.items()}
            singles = [v for v in (cell["recompute"], cell["swap"]) if v is not None]
            best = min(singles) if singles else None
            fmt = lambda x: "-" if x is None else f"{100 * x:.2f}%"  # noqa: E731
            verdict = ("n/a" if best is None and cell["hybrid"] is None else
                       "yes (only hybrid)" if best is None else
                       "yes, better" if cell["hybrid"] is not None and cell["hybrid"] < best - 1e-12 else
                       "yes" if cell["hybrid"] is not None and cell["hybrid"] <= best + 1e-12 else "NO")
            print(f"| {p.name} | {b} | {fmt(cell['hybrid'])} | {fmt(cell['nopf'])} | {fmt(cell['recompute'])} | "
                  f"{fmt(cell['swap'])} | {fmt(best)} | {verdict} |")


def reach_table(problems) -> None:
    from libra_opt.frontend.importers import load_remat_graph
    from libra_opt.passes.simulator import no_remat_peak

    files = sorted(glob.glob(os.path.join(GRAPHS, "*.json"))) if GRAPHS else []
    probs = list(problems) + [load_remat_graph(f) for f in files]
    print("\n## 3. reach: smallest plannable budget (fraction of the no-remat peak)\n")
    print("| problem | libra hybrid | libra recompute | best baseline | which |")
    print("|---|---|---|---|---|")
    for p in probs:
        peak = no_remat_peak(p)

        def need(name, **opts):
            r = _solve(name, p, 1, **opts)
            return r["need"] if r["status"] == "infeasible" else r["peak"]

        hyb, rec = need("libra"), need("libra", policy="recompute")
        base = {n: need(n) for n in BASELINES}
        base = {n: v for n, v in base.items() if v is not None}
        bn = min(base, key=base.get) if base else None
        fmt = lambda x: "-" if x is None else f"{x / peak:.3f}"  # noqa: E731
        print(f"| {p.name} | {fmt(hyb)} | {fmt(rec)} | {fmt(base.get(bn))} | {bn} |")


log = logging.getLogger("libra_quality")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--graphs", metavar="DIR", help="folder of Moccasin's node-link graphs (table 1 and part of 3)")
    ap.add_argument("--only", nargs="*", default=None, metavar="NAME", help="only graphs whose name contains these")
    ap.add_argument("--time-limit", type=float, default=60.0, metavar="S", help="MILP / LP seconds per solve")
    ap.add_argument("--refresh", action="store_true", help="recompute cached MILP / LP rows")
    ap.add_argument("--skip-checkmate", action="store_true", help="tables 2 and 3 only")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    global GRAPHS
    GRAPHS = args.graphs
    if not GRAPHS:
        print("no --graphs folder: skipping table 1 (libra vs Checkmate on the external graphs)", file=sys.stderr)
    elif not args.skip_checkmate:
        checkmate_table(args.only, args.time_limit, args.refresh)
    problems = _problems()
    hybrid_table(problems)
    reach_table(problems)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
