"""Solve time per 1,000 ops of every non-exact solver, at tight budgets.

Target (issue 16, on the project's 2-core CPU): the solve time of the
non-exact solvers -- every built-in solver but ``checkmate-lp``,
``checkmate-milp`` and ``hybrid-milp``: ``libra`` (its three policies,
``hybrid`` (the default), ``recompute`` and ``swap``, as separate rows),
``none``, ``checkpoint-all``, ``chen-sqrt``, ``chen-greedy`` and
``swap-all`` -- is at most **1 s per 1,000 ops** (nodes of the problem).

Every solver is run on every instance at every budget (``--budgets``,
fractions of the no-remat peak; default 0.9 / 0.8 / 0.7 / 0.5 / 0.3):

- the node-link remat graphs (Checkmate / Moccasin format) in the folder
  given as argument, read with :func:`libra_opt.importers.load_problem_any`
  (the shared graphs are GPL: they are read from their folder, never copied
  into this repository);
- every ``problems/*.json.gz`` (``--no-problems`` leaves them out);
- the generated graphs of issue 16's patterns (:mod:`libra_opt.generators`):
  ``large_beside_small_graph`` (100 and 201 nodes, its largest),
  ``early_regeneration_graph`` (100 nodes, its largest),
  ``vgg_segmentation_graph`` and ``unet_graph`` (their defaults), and
  ``random_layered_graph`` at ``--sizes`` nodes (default 100 / 250 / 500 /
  1,000; seed 0); ``--patterns`` picks among them.

How each row is measured: one ``libra_opt.solvers.solve(problem, budget,
solver, raise_on_infeasible=False, **options)`` call on a **fresh copy** of
the problem (``problem.replace()``: the per-problem caches -- tables,
lowering and simulator tables, the solvers' memos, the no-remat peak -- are
empty, as on a user's first call), timed with ``time.process_time()`` (CPU
seconds of this process: the fairer number on a shared machine) and
``time.perf_counter()`` (wall).  As ``timeit`` does, Python's cyclic
garbage collector is off while a row runs, and the earlier rows' garbage is
collected before it (``gc.collect()``, not timed): otherwise a full
collection of the benchmark's heap, 0.08-0.11 CPU s with the problems it
holds, landed in whichever row triggered it (2.4 CPU s over libra's 414
timed rows, the warm-up's included, in a run of issue 16's stop 46;
``libra`` pauses the collector during its solve, so its garbage was
collected inside the next rows' time).  The row's rate is CPU seconds per
1,000 ops.  An infeasible budget is timed all the same: there ``libra``
runs the tightening of the minimum budget it states (several sets of
descents), so those rows are counted apart in the summary.

One-time costs are not charged to a row: before the first row the script
imports what the solvers import lazily (``scipy.optimize``, which libra's
exchange step imports on first use: about 0.6 s once), timing each import,
then every solver row solves the warm-up problems (a 60-node random layered
graph and ``problems/resnet-tiny-b8-s32-cpu``, at 0.7 and 0.3 of their peak,
fresh copies) twice; it reports the imports' CPU seconds and the first
pass's CPU seconds minus the second's (first calls), with the packages the
warm-up imported.

Usage::

    python benchmarks/solve_rate.py GRAPHS                 # GRAPHS: the shared remat graphs' folder
    python benchmarks/solve_rate.py --quick                # a small subset (~1 min)
    python benchmarks/solve_rate.py GRAPHS --solvers chen-greedy,checkpoint-all --only random_layered
    python benchmarks/solve_rate.py GRAPHS --solvers libra --breakdown   # where libra's seconds go

With ``--breakdown``, each ``libra`` row also says where its CPU seconds
went (:class:`PhaseClock`): the descents (every ``Refiner.descend``: the
portfolio's descents, the fallbacks, the continued descents and the
tightening's rounds), the exchange moves, the rest of the finish step of
libra's own plans (undo pass, policy switches, lowering and simulation,
and measuring each descent's end), the baselines' plans (built, lowered and
simulated for the portfolio), and what is left (``other``); and, counted
over those, the seconds spent in the tightening of an infeasible budget's
stated minimum.  A diagnostic: the timers wrap libra's internal entry
points for the run, and add a little to each row's time.

Prints one line per row as it goes; writes ``results/solve_rate.csv`` (one
row per solver x instance x budget) and ``results/solve_rate.md`` (per
solver: the worst rate, the rows over the target, planned and infeasible
budgets apart; then the worst rate per instance and solver over the
budgets), or into ``--out``.
"""
from __future__ import annotations

import argparse
import contextlib
import csv
import gc
import platform
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: the target: CPU seconds per 1,000 ops
TARGET_S_PER_1K = 1.0
#: the exact solvers, left out (their time is bounded by their time limit, not by this target)
EXACT_SOLVERS = ("checkmate-lp", "checkmate-milp", "hybrid-milp")
LIBRA_POLICIES = ("hybrid", "recompute", "swap")
BUDGETS = (0.9, 0.8, 0.7, 0.5, 0.3)
SIZES = (100, 250, 500, 1000)
PATTERNS = ("large_beside_small", "early_regeneration", "vgg_segmentation", "unet", "random_layered")
#: --quick: the patterns at their smallest sizes, the smallest problem files, two budgets
QUICK = dict(sizes=(100,), budgets=(0.8, 0.5), problems=("resnet-tiny-b8-s32-cpu", "gpt2-tiny-b2-s32-cpu"))
#: warm-up problem size (nodes) and budgets
WARMUP_NODES = 60
WARMUP_BUDGETS = (0.7, 0.3)
#: modules the solvers import lazily, on first use (libra's exchange step: HiGHS through scipy)
LAZY_IMPORTS = ("scipy.optimize",)


@dataclass(frozen=True)
class SolverRow:
    """One solver configuration measured: a label, the registered name and its options."""

    label: str
    name: str
    options: dict = field(default_factory=dict)


def solver_rows(only: list[str] | None = None, exchange_effort: str = "default",
                added_gap_tol: float | None = None) -> list[SolverRow]:
    """The non-exact solvers of :func:`libra_opt.solvers.available_solvers`
    (``libra`` once per policy, with ``exchange_effort`` and, where not
    ``None``, ``added_gap_tol``), in registry order; ``only`` (labels or
    names) picks some.

    Raises
    ------
    SystemExit
        ``only`` names no such solver.
    """
    from libra_opt.solvers import available_solvers

    rows = []
    for name in available_solvers():
        if name in EXACT_SOLVERS:
            continue
        if name == "libra":
            extra = {} if added_gap_tol is None else {"added_gap_tol": added_gap_tol}
            rows += [SolverRow(f"libra-{p}", "libra", {"policy": p, "exchange_effort": exchange_effort, **extra})
                     for p in LIBRA_POLICIES]
        else:
            rows.append(SolverRow(name, name))
    if only:
        unknown = [o for o in only if not any(o in (r.label, r.name) for r in rows)]
        if unknown:
            raise SystemExit(f"--solvers: unknown {unknown}; use some of {[r.label for r in rows]}")
        rows = [r for r in rows if r.label in only or r.name in only]
    return rows


def generated_instances(patterns, sizes) -> list[tuple[str, object]]:
    """``(name, thunk)`` for each generated instance (see the module docstring);
    a thunk builds the problem."""
    from libra_opt import generators as g

    out = []
    if "large_beside_small" in patterns:
        for n in sorted({min(s, 201) for s in sizes} | ({201} if max(sizes) > 100 else set())):
            out.append((f"large_beside_small_n{n}", lambda n=n: g.large_beside_small_graph(n, seed=0)))
    if "early_regeneration" in patterns:
        for n in sorted({min(s, 100) for s in sizes}):
            out.append((f"early_regeneration_n{n}", lambda n=n: g.early_regeneration_graph(n, seed=0)))
    if "vgg_segmentation" in patterns:
        out.append(("vgg_segmentation_b80_s224", g.vgg_segmentation_graph))
    if "unet" in patterns:
        out.append(("unet_b8_s256", g.unet_graph))
    if "random_layered" in patterns:
        for n in sizes:
            out.append((f"random_layered_gen_n{n}", lambda n=n: g.random_layered_graph(n, seed=0)))
    return out


def file_instances(graphs_dir: str | None, problem_names=None) -> list[tuple[str, object]]:
    """``(name, thunk)`` for the node-link graphs in ``graphs_dir`` (``*.json``)
    and the problem files in ``problems/`` (``problem_names``: stems to keep;
    ``()``: none)."""
    from libra_opt.importers import load_problem_any

    paths = []
    if graphs_dir:
        d = Path(graphs_dir)
        if not d.is_dir():
            raise SystemExit(f"{graphs_dir}: not a folder; pass the folder of the remat graphs (*.json)")
        paths += sorted(d.glob("*.json"))
    if problem_names != ():
        for p in sorted((ROOT / "problems").glob("*.json.gz")):
            stem = p.name[:-len(".json.gz")]
            if problem_names is None or stem in problem_names:
                paths.append(p)
    return [(p.name.split(".json")[0], lambda p=p: load_problem_any(p)) for p in paths]


#: the phases of a libra solve :class:`PhaseClock` times, each with the entry points charged to it
#: (``module:attribute``; time inside an inner entry point is charged to the inner one's phase)
PHASE_POINTS = {
    "descents": ("libra_opt.solvers.libra.refine:Refiner.descend",),
    "exchange": ("libra_opt.solvers.libra.finish:exchange_moves",),
    "finish": ("libra_opt.solvers.libra.solver:LibraSolver._libra_plan",
               "libra_opt.solvers.libra.solver:LibraSolver._finished",
               "libra_opt.solvers.libra.solver:LibraSolver._free_plans",
               "libra_opt.solvers.libra.refine:Refiner.min_feasible_bytes"),
    "baselines": ("libra_opt.solvers.libra.solver:_BaselinePool.plans",
                  "libra_opt.solvers.libra.solver:_BaselinePool.best",
                  "libra_opt.solvers.libra.solver:_BaselinePool.min_peak"),
}
#: counted over the phases (inclusive): the search for an infeasible budget's stated minimum
TIGHTENING_POINT = "libra_opt.solvers.libra.solver:LibraSolver._tightened"
BREAKDOWN_FIELDS = ("descents_s", "exchange_s", "finish_s", "baselines_s", "other_s", "tightening_s")


class PhaseClock:
    """Where the CPU seconds of a ``libra`` solve go: while the clock is
    entered (``with PhaseClock() as clock:``), the entry points of
    :data:`PHASE_POINTS` are wrapped so that the CPU time
    (``time.process_time``) spent inside each is charged to its phase, time
    inside a nested entry point to the nested one's phase only (a stack),
    and the time inside :data:`TIGHTENING_POINT` is counted apart, over the
    phases.  ``clock.spent``: phase -> seconds; :meth:`fields` gives them
    with ``other`` (the solve's seconds less the phases').  A diagnostic of
    this benchmark, not an API: it patches the attributes for the run and
    restores them on exit.

    Raises
    ------
    AttributeError
        An entry point no longer exists (the solver was refactored: update
        :data:`PHASE_POINTS`).
    """

    def __init__(self):
        self.spent = {phase: 0.0 for phase in PHASE_POINTS}
        self.tightening_s = 0.0
        self._stack: list[list] = []     # [phase, start] of the entry points being run, innermost last
        self._patched: list[tuple] = []  # (owner, name, original)

    @staticmethod
    def _resolve(point: str) -> tuple[object, str]:
        import importlib

        module, _, path = point.partition(":")
        owner = importlib.import_module(module)
        *outer, name = path.split(".")
        for part in outer:
            owner = getattr(owner, part)
        getattr(owner, name)   # AttributeError where it is gone
        return owner, name

    def _timed(self, original, phase: str):
        stack, spent = self._stack, self.spent

        def timed(*args, **kwargs):
            now = time.process_time()
            if stack:   # the enclosing phase stops here
                top = stack[-1]
                spent[top[0]] += now - top[1]
            stack.append([phase, now])
            try:
                return original(*args, **kwargs)
            finally:
                end = time.process_time()
                spent[phase] += end - stack.pop()[1]
                if stack:
                    stack[-1][1] = end   # ... and resumes
        return timed

    def _inclusive(self, original):
        def timed(*args, **kwargs):
            start = time.process_time()
            try:
                return original(*args, **kwargs)
            finally:
                self.tightening_s += time.process_time() - start
        return timed

    def __enter__(self) -> "PhaseClock":
        points = [(p, ph) for ph, ps in PHASE_POINTS.items() for p in ps] + [(TIGHTENING_POINT, None)]
        resolved = [(self._resolve(point), phase) for point, phase in points]   # all found before any is patched
        for (owner, name), phase in resolved:
            original = owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)
            kind = type(original) if isinstance(original, (staticmethod, classmethod)) else None
            func = original.__func__ if kind is not None else original
            wrapped = self._inclusive(func) if phase is None else self._timed(func, phase)
            self._patched.append((owner, name, original))
            setattr(owner, name, kind(wrapped) if kind is not None else wrapped)
        return self

    def __exit__(self, *exc) -> None:
        for owner, name, original in reversed(self._patched):
            setattr(owner, name, original)
        self._patched.clear()

    def fields(self, total_s: float) -> dict:
        """The CSV fields of :data:`BREAKDOWN_FIELDS` for a solve of ``total_s`` CPU seconds."""
        out = {f"{phase}_s": s for phase, s in self.spent.items()}
        out["other_s"] = max(total_s - sum(self.spent.values()), 0.0)
        out["tightening_s"] = self.tightening_s
        return out


def timed_solve(problem, budget: float, row: SolverRow, breakdown: bool = False) -> dict:
    """Solve a fresh copy of ``problem`` at ``budget`` (fraction of the
    no-remat peak) with ``row``: ``{"cpu_s", "wall_s", "outcome", ...}``.
    An exception is recorded as the outcome ``error`` with its message."""
    from libra_opt.solvers import solve

    fresh = problem.replace()   # a new problem object: every per-problem cache is cold
    clock = PhaseClock() if breakdown and row.name == "libra" else None
    gc.collect()   # the earlier rows' garbage, not this row's time; the collector is off while it runs (timeit's rule)
    was = gc.isenabled()
    gc.disable()
    try:
        with clock if clock is not None else contextlib.nullcontext():
            c0, w0 = time.process_time(), time.perf_counter()
            try:
                res = solve(fresh, budget, row.name, raise_on_infeasible=False, **row.options)
                err = None
            except Exception as e:  # a solver's failure is part of what is reported
                res, err = None, f"{type(e).__name__}: {str(e)[:200]}"
            cpu, wall = time.process_time() - c0, time.perf_counter() - w0
    finally:
        if was:
            gc.enable()
    out = {"cpu_s": cpu, "wall_s": wall, "outcome": "error", "peak_frac": "", "min_feasible_frac": "",
           "added_s": "", "message": err or ""}
    if clock is not None:
        out.update(clock.fields(cpu))
    if res is not None:
        from libra_opt.passes.simulator import no_remat_peak

        peak = no_remat_peak(fresh)
        if res.success:
            out.update(outcome="planned", peak_frac=f"{res.peak_bytes / peak:.4f}", added_s=f"{res.added_s:.6g}")
        else:
            mf = res.min_feasible_bytes
            out.update(outcome="infeasible", min_feasible_frac="" if mf is None else f"{mf / peak:.4f}")
    return out


def warm_up(rows: list[SolverRow]) -> dict:
    """Pay the one-time costs before the first row: import the modules the
    solvers import lazily (:data:`LAZY_IMPORTS`, each timed), then solve the
    warm-up problems (:func:`warmup_problems`) with every row, twice.
    ``{"imports": {module: CPU s}, "first_cpu_s", "second_cpu_s",
    "one_time_s", "modules", "n_modules"}``: the first pass minus the second
    (first calls, and lazy imports not in the list), the third-party
    top-level packages first imported during the whole warm-up and the
    number of modules."""
    import importlib

    before = set(sys.modules)
    imports = {}
    for m in LAZY_IMPORTS:
        c0 = time.process_time()
        importlib.import_module(m)
        imports[m] = time.process_time() - c0
    probs = warmup_problems()
    passes = []
    for _ in range(2):
        c0 = time.process_time()
        for p in probs:
            for row in rows:
                for b in WARMUP_BUDGETS:
                    timed_solve(p, b, row)
        passes.append(time.process_time() - c0)
    new = sorted(set(sys.modules) - before)
    notable = sorted({m.split(".")[0] for m in new if not m.startswith("_")}
                     - set(sys.stdlib_module_names) - {"libra_opt", "cython_runtime"})
    return {"imports": imports, "first_cpu_s": passes[0], "second_cpu_s": passes[1],
            "one_time_s": passes[0] - passes[1], "modules": notable, "n_modules": len(new)}


def warmup_problems() -> list:
    """A 60-node random layered graph (seed 1) and ``problems/`` smallest
    profiled problem, whose hybrid solve reaches libra's exchange step (the
    one that imports ``scipy.optimize``)."""
    from libra_opt.generators import random_layered_graph
    from libra_opt.importers import load_problem_any

    out = [random_layered_graph(WARMUP_NODES, seed=1)]
    small = ROOT / "problems" / "resnet-tiny-b8-s32-cpu.json.gz"
    if small.exists():
        out.append(load_problem_any(small))
    return out


CSV_FIELDS = ("solver", "instance", "nodes", "budget", "outcome", "cpu_s", "wall_s", "s_per_1k_ops",
              "peak_frac", "min_feasible_frac", "added_s", "message") + BREAKDOWN_FIELDS


def run(instances, rows: list[SolverRow], budgets, progress=print, breakdown: bool = False) -> list[dict]:
    """Every row x instance x budget (instances built once each, solved on
    fresh copies); ``breakdown``: libra's rows with :class:`PhaseClock`'s
    fields."""
    out = []
    for inst_name, thunk in instances:
        problem = thunk()
        n = problem.num_nodes
        for row in rows:
            for b in budgets:
                r = timed_solve(problem, b, row, breakdown)
                rate = r["cpu_s"] / n * 1000.0
                rec = {"solver": row.label, "instance": inst_name, "nodes": n, "budget": b, **r,
                       "s_per_1k_ops": rate}
                out.append(rec)
                flag = "  OVER" if rate > TARGET_S_PER_1K else ""
                progress(f"{row.label:16s} {inst_name:34s} n={n:5d} b={b:<4} {r['outcome']:10s} "
                         f"cpu {r['cpu_s']:7.3f} s  wall {r['wall_s']:7.3f} s  {rate:6.3f} s/1k ops{flag}")
    return out


def summarize(records: list[dict], rows: list[SolverRow]) -> list[dict]:
    """Per solver row: the worst rate and where, and the rows over the target,
    planned (or errors) and infeasible budgets apart."""
    out = []
    for row in rows:
        mine = [r for r in records if r["solver"] == row.label]
        if not mine:
            continue
        plan = [r for r in mine if r["outcome"] != "infeasible"]
        inf = [r for r in mine if r["outcome"] == "infeasible"]

        def worst(rs):
            return max(rs, key=lambda r: r["s_per_1k_ops"]) if rs else None
        out.append({"solver": row.label, "rows": len(mine), "planned": sum(r["outcome"] == "planned" for r in mine),
                    "infeasible": len(inf), "errors": sum(r["outcome"] == "error" for r in mine),
                    "worst": worst(mine), "worst_planned": worst(plan), "worst_infeasible": worst(inf),
                    "over_planned": [r for r in plan if r["s_per_1k_ops"] > TARGET_S_PER_1K],
                    "over_infeasible": [r for r in inf if r["s_per_1k_ops"] > TARGET_S_PER_1K],
                    "cpu_s": sum(r["cpu_s"] for r in mine)})
    return out


def _imports(warm) -> str:
    return ", ".join(f"`{m}` {s:.2f} CPU s" for m, s in warm["imports"].items()) or "none"


def _where(r) -> str:
    return "" if r is None else f"{r['s_per_1k_ops']:.3f} ({r['instance']} @ {r['budget']})"


def render(records, summary, warm, meta) -> str:
    """The markdown report (see the module docstring)."""
    lines = ["# Solve time per 1,000 ops of the non-exact solvers (issue 16)", "",
             f"`{meta['command']}`", "",
             f"Target: at most {TARGET_S_PER_1K:g} CPU s per 1,000 ops (nodes). Each row: one `solve` on a fresh "
             f"copy of the problem (cold per-problem caches), CPU seconds (`time.process_time`); budgets "
             f"{', '.join(f'{b:g}' for b in meta['budgets'])} of the no-remat peak. Machine: {meta['machine']}; "
             f"{meta['when']}. Infeasible budgets are counted apart: there libra runs the tightening of the "
             f"minimum it states.", "",
             f"One-time costs (not charged to any row), paid by a warm-up before the first row: the lazy imports "
             f"{_imports(warm)}; then a pass of every solver over the warm-up problems took "
             f"{warm['first_cpu_s']:.2f} CPU s the first time and {warm['second_cpu_s']:.2f} s the second "
             f"(first calls: {warm['one_time_s']:.2f} s). {warm['n_modules']} modules were first imported by the "
             f"warm-up, of the packages {', '.join(warm['modules']) or 'none'} and the standard library.",
             "", "## Per solver", "",
             "| solver | rows | planned | infeasible | errors | worst s/1k ops (planned) | over target (planned) "
             "| worst s/1k ops (infeasible) | over target (infeasible) | total CPU s |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for s in summary:
        lines.append(f"| {s['solver']} | {s['rows']} | {s['planned']} | {s['infeasible']} | {s['errors']} | "
                     f"{_where(s['worst_planned'])} | {len(s['over_planned'])} | {_where(s['worst_infeasible'])} | "
                     f"{len(s['over_infeasible'])} | {s['cpu_s']:.1f} |")
    over = [r for s in summary for r in s["over_planned"] + s["over_infeasible"]]
    lines += ["", f"## Rows over the target ({len(over)})", ""]
    if over:
        split = any("descents_s" in r for r in over)   # --breakdown: where each row's seconds went
        lines += ["| solver | instance | nodes | budget | outcome | CPU s | wall s | s/1k ops |"
                  + (" descents | exchange | finish | baselines | other | (tightening) |" if split else ""),
                  "|---|---|---|---|---|---|---|---|" + ("---|" * 6 if split else "")]
        for r in sorted(over, key=lambda r: -r["s_per_1k_ops"]):
            lines.append(f"| {r['solver']} | {r['instance']} | {r['nodes']} | {r['budget']:g} | {r['outcome']} | "
                         f"{r['cpu_s']:.3f} | {r['wall_s']:.3f} | {r['s_per_1k_ops']:.3f} |"
                         + ("".join(f" {r[f]:.3f} |" if f in r else " |" for f in BREAKDOWN_FIELDS) if split else ""))
        if split:
            lines += ["", "Breakdown (`--breakdown`, CPU s; see `PhaseClock`): the descents (the portfolio's, the "
                      "fallbacks', the tightening's rounds), the exchange moves, the rest of the finish of libra's "
                      "plans, the baselines' plans, the rest; in parentheses the tightening's share of the row, "
                      "counted over the others."]
    else:
        lines.append("none")
    labels = [s["solver"] for s in summary]
    insts = list(dict.fromkeys((r["instance"], r["nodes"]) for r in records))
    lines += ["", "## Worst s/1k ops per instance over the budgets", "",
              "`*`: over the target; `(i)`: that worst row is an infeasible budget.", "",
              "| instance | nodes | " + " | ".join(labels) + " |", "|---|---|" + "---|" * len(labels)]
    for inst, n in insts:
        cells = []
        for lab in labels:
            rs = [r for r in records if r["instance"] == inst and r["solver"] == lab]
            if not rs:
                cells.append("")
                continue
            w = max(rs, key=lambda r: r["s_per_1k_ops"])
            cells.append(f"{w['s_per_1k_ops']:.3f}{'*' if w['s_per_1k_ops'] > TARGET_S_PER_1K else ''}"
                         f"{' (i)' if w['outcome'] == 'infeasible' else ''}")
        lines.append(f"| {inst} | {n} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def write_csv(path: Path, records) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_FIELDS, extrasaction="ignore")
        w.writeheader()
        for r in records:
            w.writerow({**r, "cpu_s": f"{r['cpu_s']:.6f}", "wall_s": f"{r['wall_s']:.6f}",
                        "s_per_1k_ops": f"{r['s_per_1k_ops']:.4f}",
                        **{f: f"{r[f]:.6f}" for f in BREAKDOWN_FIELDS if f in r}})


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("graphs", nargs="?", default=None,
                    help="folder of node-link remat graphs (*.json), e.g. the shared Checkmate / Moccasin graphs")
    ap.add_argument("--budgets", default=",".join(f"{b:g}" for b in BUDGETS),
                    help="fractions of the no-remat peak, comma-separated (default %(default)s)")
    ap.add_argument("--sizes", default=",".join(map(str, SIZES)),
                    help="random layered graph sizes, nodes (default %(default)s)")
    ap.add_argument("--patterns", default=",".join(PATTERNS),
                    help=f"generated patterns, comma-separated, or 'none' (default: all of {', '.join(PATTERNS)})")
    ap.add_argument("--no-problems", action="store_true", help="leave out problems/*.json.gz")
    ap.add_argument("--solvers", default=None, help="solver rows (labels such as libra-hybrid, or names)")
    ap.add_argument("--only", default=None, help="instances whose name contains this")
    ap.add_argument("--exchange-effort", default="default", choices=("default", "thorough"),
                    help="libra's exchange_effort option (default %(default)s; the target is the default's)")
    ap.add_argument("--added-gap-tol", type=float, default=None, metavar="TOL",
                    help="libra's added_gap_tol option (default: libra's, 0.025; 0: exchange moves always run)")
    ap.add_argument("--quick", action="store_true",
                    help=f"a small subset: patterns at {QUICK['sizes']} nodes, problems {QUICK['problems']}, "
                         f"budgets {QUICK['budgets']}")
    ap.add_argument("--no-warmup", action="store_true", help="skip the warm-up (the first rows then pay the imports)")
    ap.add_argument("--breakdown", action="store_true",
                    help="libra rows: CPU seconds per phase (descents, exchange, finish, baselines, other, tightening)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"), help="output folder (default %(default)s)")
    args = ap.parse_args(argv)

    budgets = tuple(float(b) for b in args.budgets.split(",")) if not args.quick else QUICK["budgets"]
    sizes = tuple(int(s) for s in args.sizes.split(",")) if not args.quick else QUICK["sizes"]
    patterns = () if args.patterns == "none" else tuple(args.patterns.split(","))
    bad = sorted(set(patterns) - set(PATTERNS))
    if bad:
        raise SystemExit(f"--patterns: unknown {bad}; use some of {PATTERNS} or 'none'")
    problems = () if args.no_problems else (QUICK["problems"] if args.quick else None)
    if args.added_gap_tol is not None and not args.added_gap_tol >= 0:
        raise SystemExit(f"--added-gap-tol: must be >= 0, got {args.added_gap_tol}")
    rows = solver_rows(args.solvers.split(",") if args.solvers else None, args.exchange_effort, args.added_gap_tol)
    instances = file_instances(args.graphs, problems) + generated_instances(patterns, sizes)
    if args.only:
        instances = [i for i in instances if args.only in i[0]]
    if not instances:
        raise SystemExit("no instance selected; pass a graphs folder, keep problems/ or some --patterns")

    warm = {"imports": {}, "first_cpu_s": 0.0, "second_cpu_s": 0.0, "one_time_s": 0.0, "modules": [],
            "n_modules": 0}
    if not args.no_warmup:
        warm = warm_up(rows)
        print(f"warm-up: imports {_imports(warm)}; first pass {warm['first_cpu_s']:.2f} CPU s, second "
              f"{warm['second_cpu_s']:.2f} s: first calls {warm['one_time_s']:.2f} s", flush=True)
    c0 = time.process_time()
    records = run(instances, rows, budgets, progress=lambda s: print(s, flush=True), breakdown=args.breakdown)
    summary = summarize(records, rows)
    shown = [a for a in (argv if argv is not None else sys.argv[1:])]
    meta = {"command": "python benchmarks/solve_rate.py " + " ".join(
                "GRAPHS" if a == args.graphs else a for a in shown),
            "budgets": budgets, "machine": f"{platform.machine()}, {platform.python_version()}",
            "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_csv(out / "solve_rate.csv", records)
    (out / "solve_rate.md").write_text(render(records, summary, warm, meta))
    print(f"\n{len(records)} rows in {time.process_time() - c0:.1f} CPU s; wrote {out / 'solve_rate.md'} and .csv")
    for s in summary:
        print(f"{s['solver']:16s} worst planned {_where(s['worst_planned']):50s} over target: "
              f"{len(s['over_planned'])} planned, {len(s['over_infeasible'])} infeasible")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
