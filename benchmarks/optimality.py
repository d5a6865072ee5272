"""How far libra's greedy plans are from optimal: libra against an exact solver
at 0.9 / 0.8 / 0.7 / 0.5 of the no-remat peak, recompute-only and hybrid.

For every instance (the node-link graphs in ``GRAPHS``, e.g. the shared
Checkmate / random-layered graphs, and the profiled ``problems/*.json.gz``)
and every budget:

- **recompute**: ``libra`` with ``policy="recompute"`` against
  ``checkmate-milp`` (Jain et al., MLSys 2020, sec. 4);
- **hybrid**: ``libra`` (``policy="hybrid"``) against ``hybrid-milp`` when a
  solver of that name is registered (:mod:`libra_opt.solvers.registry`),
  else the cells say "n/a".

Each cell gives libra's added cost (step time minus the no-remat step), the
exact solver's (``*``: proven optimal), their ratio, libra's gap to the best
lower bound valid for libra's plan
(:func:`libra_opt.solvers.certificates.best_bound`, among the exact solver's
bounds and the cut bounds of :func:`libra_opt.solvers.certificates.cut_bounds`,
which hold for every plan: a coarsened model's bound, or a Checkmate bound
on a plan its model does not dominate, is never used), and the solve seconds
of both.  "infeasible" where
neither finds a plan: "proven" when the budget is below the memory floor
(:func:`libra_opt.bounds.memory_lower_bound`), else "no plan found" (the
exact solver stopped at its time limit, or its model excludes the plans that
would fit).

Writes ``benchmarks/results/optimality.csv`` (one row per instance, budget
and mode, rewritten after each instance) and the markdown table to stdout
and ``--markdown``.

Usage::

    python benchmarks/optimality.py /work/shared/remat-graphs --problems problems --max-nodes 300 \\
        --modes recompute --time-limit 60
    python benchmarks/optimality.py GRAPHS --only vgg16 random_layered_n100 --budgets 0.9,0.8
    python benchmarks/optimality.py GRAPHS --modes recompute,hybrid --copy-ratio 1   # after hybrid-milp lands
    python benchmarks/optimality.py --table-from benchmarks/results/optimality.csv  # re-print a table

Times in the node-link graphs are relative cost units (see
benchmarks/checkmate_graphs.py).  ``--copy-ratio R`` sets both copy
bandwidths so that copying the no-remat peak once takes ``R`` times the
no-remat step (the hybrid targets of issue 16 use 0.25, 1 and 4).
"""
from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"

log = logging.getLogger("optimality")

#: mode -> (greedy solver and options, exact solver name)
MODES = {"recompute": (("libra", {"policy": "recompute"}), "checkmate-milp"),
         "hybrid": (("libra", {"policy": "hybrid"}), "hybrid-milp")}

FIELDS = ["instance", "nodes", "budget_fraction", "budget_bytes", "below_floor", "mode", "greedy_status", "greedy_added",
          "greedy_time", "greedy_solve_s", "exact", "exact_status", "exact_added", "exact_time", "exact_solve_s",
          "exact_proven", "exact_returned", "ratio_added", "ratio_time", "greedy_gap", "bound_s", "bound_kind", "bound_source",
          "note"]


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("graphs", nargs="?", metavar="GRAPHS", help="folder of node-link remat graphs (*.json)")
    p.add_argument("--problems", metavar="DIR", help="also every *.json.gz problem file in DIR")
    p.add_argument("--only", nargs="*", default=None, metavar="NAME",
                   help="only instances whose file name contains one of these")
    p.add_argument("--max-nodes", type=int, default=None, metavar="N", help="skip instances with more nodes")
    p.add_argument("--budgets", default="0.9,0.8,0.7,0.5", help="fractions of the no-remat peak")
    p.add_argument("--modes", default="recompute,hybrid", help="comma-separated: recompute, hybrid")
    p.add_argument("--solvers", default=None, metavar="S1,S2",
                   help="override the exact solvers, e.g. 'checkmate-milp' (recompute) and/or 'hybrid-milp'")
    p.add_argument("--time-limit", type=float, default=60.0, metavar="S", help="seconds per exact solve (60)")
    p.add_argument("--copy-ratio", type=float, default=None, metavar="R",
                   help="set copy bandwidths so copying the no-remat peak takes R no-remat steps")
    p.add_argument("--out", default=str(RESULTS / "optimality.csv"), help="CSV of every row")
    p.add_argument("--markdown", default=None, metavar="OUT.md", help="also write the table here")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--table-from", metavar="CSV", help="only print the table of a CSV this script wrote")
    args = p.parse_args(argv)
    args.modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    bad = [m for m in args.modes if m not in MODES]
    if bad:
        p.error(f"unknown mode(s) {bad}; use {sorted(MODES)}")
    return args


def exact_for(mode: str, override: list[str] | None) -> str:
    """The exact solver of ``mode`` (``--solvers`` may name another)."""
    default = MODES[mode][1]
    if override:
        kind = [s for s in override if ("hybrid" in s) == (mode == "hybrid")]
        if kind:
            return kind[0]
    return default


def registered(name: str) -> bool:
    """True when ``name`` is a registered solver (a registry lookup)."""
    from libra_opt.errors import SolverNotFoundError
    from libra_opt.solvers.registry import solver_class

    try:
        solver_class(name)
    except (SolverNotFoundError, ImportError):
        return False
    return True


def instances(args) -> list[Path]:
    paths = sorted(Path(args.graphs).glob("*.json")) if args.graphs else []
    if args.problems:
        paths += sorted(Path(args.problems).glob("*.json.gz"))
    if args.only:
        paths = [q for q in paths if any(k in q.name for k in args.only)]
    return paths


def solve_one(problem, budget, solver, options):
    """A SolveResult (status "infeasible" rather than raising), or the error text."""
    from libra_opt.errors import SolverError
    from libra_opt.solvers import get_solver

    try:
        return get_solver(solver, **options).solve(problem, budget, raise_on_infeasible=False)
    except SolverError as e:
        log.warning("%s failed on %s: %s", solver, problem.name, e)
        return str(e)


def compare_pair(problem, budget_bytes: int, mode: str, exact: str, time_limit: float) -> dict:
    """One row: the greedy and the exact solver of ``mode`` at one budget."""
    from libra_opt.apps.compare import time_limit_options
    from libra_opt.solvers.certificates import best_bound, gap

    (greedy, gopts) = MODES[mode][0]
    row = dict(mode=mode, budget_bytes=budget_bytes, exact=exact)
    from libra_opt.passes.bounds import memory_lower_bound
    from libra_opt.solvers.certificates import cut_bounds

    base = problem.total_compute_s
    notes = []
    row["below_floor"] = budget_bytes < memory_lower_bound(problem)   # no plan can fit: proven infeasible

    def run(prefix, name, options):
        res = solve_one(problem, budget_bytes, name, options)
        if isinstance(res, str):
            row[f"{prefix}_status"] = "error"
            notes.append(f"{name}: {res[:80]}")
            return None
        row.update({f"{prefix}_status": res.status, f"{prefix}_solve_s": res.solve_s})
        if res.success:
            row.update({f"{prefix}_added": res.time_s - base, f"{prefix}_time": res.time_s})
        return res

    g = run("greedy", greedy, gopts)
    if not registered(exact):
        row.update(exact_status="n/a", note="; ".join(notes + [f"{exact} is not registered"]))
        return row
    e = run("exact", exact, time_limit_options([exact], time_limit).get(exact, {}))
    if e is not None:
        row["exact_proven"] = e.success and e.gap is not None and e.gap <= 1e-4
        row["exact_returned"] = e.extras.get("returned")   # e.g. "libra": its own search found nothing better
        if e.extras.get("bound_note"):
            notes.append(e.extras["bound_note"])
    if g is not None and g.success:
        # the exact solver's and the cut bounds (every plan: no solver needed, so rows whose exact solver
        # failed or coarsened get a gap too)
        bounds = list(g.bounds) + (list(e.bounds) if e is not None else []) + list(cut_bounds(problem, budget_bytes))
        cert = best_bound(problem, budget_bytes, g.schedule, bounds, simulation=g.simulation)
        row.update(greedy_gap=cert.gap, bound_s=cert.lower_bound_s, bound_kind=cert.kind,
                   bound_source=None if cert.bound is None else cert.bound.source)
        if e is not None and e.success:
            row["ratio_time"] = g.time_s / e.time_s if e.time_s > 0 else None
            ea = e.time_s - base
            row["ratio_added"] = ((g.time_s - base) / ea if ea > 1e-12 * max(base, 1e-30) else
                                  (1.0 if g.time_s - base <= 1e-12 * max(base, 1e-30) else float("inf")))
        assert cert.gap is None or cert.gap >= 0 and gap(g.time_s, cert.lower_bound_s) == cert.gap
    row["note"] = "; ".join(notes)
    return row


def _num(v, fmt="{:.4g}") -> str:
    return "-" if v is None or v == "" else fmt.format(v)


def cell(row: dict) -> str:
    """``greedy / exact (ratio), gap, seconds`` for one mode at one budget."""
    if row.get("exact_status") == "n/a":
        g = row.get("greedy_added")
        return f"{_num(g)} / n/a" if g is not None else f"{row.get('greedy_status')} / n/a"
    g_ok, e_ok = row.get("greedy_added") is not None, row.get("exact_added") is not None
    if not g_ok and not e_ok:
        if row.get("below_floor") is True or row.get("below_floor") == "True":
            return "infeasible (proven: below the memory floor)"
        return ("infeasible (no plan found)" if row.get("greedy_status") == "infeasible" and
                row.get("exact_status") == "infeasible" else f"{row.get('greedy_status')} / {row.get('exact_status')}")
    star = "*" if row.get("exact_proven") else ""
    g = _num(row.get("greedy_added")) if g_ok else row.get("greedy_status")
    e = (_num(row.get("exact_added")) + star) if e_ok else row.get("exact_status")
    if e_ok and row.get("exact_returned"):
        e += f" ({row['exact_returned']}'s plan, {row.get('exact_status')})"
    ratio = f" ({row['ratio_added']:.2f}x)" if row.get("ratio_added") is not None else ""
    gp = row.get("greedy_gap")
    gaptxt = "" if not g_ok else (f", gap {gp:.1%}" if gp is not None else ", bound unknown")
    bound_added = None if gp is None else row["bound_s"] - (row["greedy_time"] - row["greedy_added"])
    base_s = None if gp is None else row["greedy_time"] - row["greedy_added"]
    if bound_added is not None and bound_added > 1e-9 * max(abs(base_s), 1e-30):   # else the bound says nothing of it
        gaptxt += f" (added <= {row['greedy_added'] / bound_added:.2f}x opt)"
    secs = f", {_num(row.get('greedy_solve_s'), '{:.2f}')} / {_num(row.get('exact_solve_s'), '{:.1f}')} s"
    return f"{g} / {e}{ratio}{gaptxt}{secs}"


def markdown(rows: list[dict], modes: list[str], exacts: dict) -> str:
    head = ["instance", "nodes", "budget"] + [f"{m}: libra / {exacts[m]}" for m in modes]
    out = ["| " + " | ".join(head) + " |", "|" + "|".join(["---"] * len(head)) + "|"]
    keyed = {}
    for r in rows:
        keyed.setdefault((r["instance"], r["nodes"], r["budget_fraction"]), {})[r["mode"]] = r
    for (inst, n, frac), by in keyed.items():
        out.append("| " + " | ".join([inst, str(n), f"{frac:.2f}"] + [cell(by[m]) if m in by else "-"
                                                                         for m in modes]) + " |")
    return "\n".join(out)


def write_csv(rows: list[dict], path: Path) -> None:
    import csv

    from libra_opt.atomic import atomic_write

    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_write(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: ("" if r.get(k) is None else r.get(k)) for k in FIELDS})


def read_csv(path: Path) -> list[dict]:
    """Rows of a CSV written by :func:`write_csv`, numbers parsed."""
    import csv

    rows = []
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            row = {}
            for k, v in r.items():
                if v == "":
                    row[k] = None
                elif k in ("exact_proven", "below_floor"):
                    row[k] = v == "True"
                else:
                    try:
                        row[k] = int(v) if k in ("nodes", "budget_bytes") else float(v)
                    except ValueError:
                        row[k] = v
            rows.append(row)
    return rows


def load(path: Path, copy_ratio: float | None):
    from libra_opt.frontend.importers import load_problem_any
    from libra_opt.passes.simulator import no_remat_peak

    problem = load_problem_any(path)
    if copy_ratio is not None:
        bw = no_remat_peak(problem) / (copy_ratio * problem.total_compute_s)
        problem = problem.with_device(h2d_bytes_per_s=bw, d2h_bytes_per_s=bw)
    return problem


def main(argv=None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    from tqdm.auto import tqdm

    from libra_opt.passes.simulator import no_remat_peak

    if args.table_from:
        rows = read_csv(Path(args.table_from))
        modes = list(dict.fromkeys(r["mode"] for r in rows))
        print(markdown(rows, modes, {m: next(r["exact"] for r in rows if r["mode"] == m) for m in modes}))
        return 0
    paths = instances(args)
    if not paths:
        print("no instances: pass a GRAPHS folder and/or --problems DIR (see --help)", file=sys.stderr)
        return 2
    budgets = [float(b) for b in args.budgets.split(",")]
    override = [s.strip() for s in args.solvers.split(",")] if args.solvers else None
    exacts = {m: exact_for(m, override) for m in args.modes}
    for m, name in exacts.items():
        if not registered(name):
            print(f"note: {name} is not registered: the {m} column says n/a", file=sys.stderr)
    rows: list[dict] = []
    t0 = time.perf_counter()
    problems = []
    for path in paths:
        problem = load(path, args.copy_ratio)
        if args.max_nodes is not None and problem.num_nodes > args.max_nodes:
            print(f"skipping {path.name}: {problem.num_nodes} nodes > --max-nodes {args.max_nodes}", file=sys.stderr)
            continue
        problems.append(problem)
    bar = tqdm(total=len(problems) * len(budgets) * len(args.modes), disable=True if args.no_progress else None,
               unit="pair")
    for problem in problems:
        peak = no_remat_peak(problem)
        for frac in budgets:
            for mode in args.modes:
                bar.set_description(f"{problem.name} {frac:.2f} {mode}")
                row = compare_pair(problem, int(frac * peak), mode, exacts[mode], args.time_limit)
                row.update(instance=problem.name, nodes=problem.num_nodes, budget_fraction=frac)
                rows.append(row)
                bar.update(1)
                log.info("%s", row)
        write_csv(rows, Path(args.out))
    bar.close()
    table = markdown(rows, args.modes, exacts)
    print(table)
    print(f"\nCells: libra's added cost / the exact solver's (* proven optimal) (ratio of added cost), libra's gap "
          f"to the best valid lower bound on step time (and what it bounds the ratio of added costs by), solve s "
          f"(libra / exact). Total {time.perf_counter() - t0:.0f} s; "
          f"rows: {args.out}")
    if args.markdown:
        from libra_opt.atomic import atomic_write

        with atomic_write(Path(args.markdown), "w") as f:
            f.write(table + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
