"""Side-by-side comparison of solvers over memory budgets.

:func:`compare` runs every solver at every budget on one problem and returns
one :class:`Row` per (budget, solver): status, added step time, simulated
peak, solve time, and the gap to the best lower bound valid for the row's
plan among the bounds every solver proved at that budget and the cut bounds
(:func:`~libra_opt.solvers.certificates.cut_bounds`: every plan, no solver
needed) (:func:`~libra_opt.solvers.certificates.best_bound`).  :func:`rows_to_csv`, :func:`format_table` and :func:`plot_rows`
write the rows out.  This is the trade-off sweep of Checkmate (Jain et al.,
MLSys 2020, sec. 6, fig. 5): cost of rematerialization against the budget,
per method.

Every plan in a row was accepted by the simulator within its budget (the
solver base class checks it), so rows of different solvers are comparable.
"""
from __future__ import annotations

import csv
import dataclasses
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping, Sequence

from ..atomic import atomic_write
from ..errors import SolverError
from ..ir.problem import RematProblem
from ..passes.simulator import no_remat_peak
from ..solvers import certificates
from ..solvers.certificates import best_bound
from ..ir.units import format_bytes, format_seconds, parse_budget

log = logging.getLogger(__name__)

__all__ = ["Row", "compare", "rows_to_csv", "format_table", "plot_rows", "time_limit_options",
           "UNAVAILABLE", "ERROR"]

UNAVAILABLE = "unavailable"  #: the solver's module or backend is not installed
ERROR = "error"              #: the solver failed (SolverError); the message says why


@dataclass(frozen=True)
class Row:
    """One solver at one budget.

    Attributes
    ----------
    problem : str
        The problem's name.
    budget_bytes : int
        Graph-memory budget (bytes).
    budget_fraction : float
        ``budget_bytes`` over the no-remat peak.
    solver : str
    status : str
        A solver status (``"optimal"``, ``"feasible"``, ``"time_limit"``,
        ``"infeasible"``) or ``"unavailable"`` / ``"error"``.
    added_s : float or None
        Simulated step time minus the no-remat step time (s): the plan's cost.
    time_s : float or None
        Simulated step time (s).
    base_s : float
        The no-remat step time (s), the sum of node times.
    peak_bytes : int or None
        Simulated peak graph memory of the plan (bytes).
    solve_s : float
        Wall-clock seconds the solver took.
    lower_bound_s : float or None
        The step-time lower bound this solver proved that is valid for its
        own plan (s), if any (:attr:`SolveResult.lower_bound_s`).
    best_lower_bound_s : float or None
        The largest bound any solver proved at this budget that is valid for
        this row's plan (s): :func:`~libra_opt.solvers.certificates.best_bound`
        (a ``"recompute"`` bound only for a plan without swaps, Checkmate's
        only for a plan its model dominates, never a coarsened model's).
    gap : float or None
        ``(time_s - best_lower_bound_s) / best_lower_bound_s``
        (:func:`~libra_opt.solvers.certificates.gap`), never negative: the
        plan is at most this much slower than the best plan of class
        ``bound_kind``.  None: "bound unknown" (no valid bound for this plan).
    bound_kind : {"recompute", "hybrid"} or None
        The plan class ``best_lower_bound_s`` bounds.
    bound_source : str or None
        Who proved ``best_lower_bound_s``.
    min_feasible_bytes : int or None
        For an infeasible row: the smallest budget the solver could meet.
    message : str
    """

    problem: str
    budget_bytes: int
    budget_fraction: float
    solver: str
    status: str
    added_s: float | None
    time_s: float | None
    base_s: float
    peak_bytes: int | None
    solve_s: float
    lower_bound_s: float | None
    best_lower_bound_s: float | None
    gap: float | None
    min_feasible_bytes: int | None
    message: str
    bound_kind: str | None = None
    bound_source: str | None = None

    @property
    def success(self) -> bool:
        """True when the row has a plan within budget."""
        return self.added_s is not None

    @property
    def added_pct(self) -> float | None:
        """Added time as % of the no-remat step."""
        if self.added_s is None or self.base_s <= 0:
            return None
        return 100.0 * self.added_s / self.base_s


def _solver_name(solver) -> str:
    return solver if isinstance(solver, str) else getattr(solver, "name", "") or type(solver).__name__


def time_limit_options(solvers: Iterable, time_limit_s: float | None) -> dict[str, dict]:
    """Per-solver options that set a time limit, for the solvers that have one.

    A solver takes the limit if its ``Options`` dataclass has a field
    ``time_limit_s`` (or ``time_limit``); the others are left out, so no
    :class:`~libra_opt.solvers.UnknownOptionWarning` is raised.

    Parameters
    ----------
    solvers : iterable of str
        Solver names; names whose module cannot be imported are skipped.
    time_limit_s : float or None
        Seconds per solve; ``None`` gives ``{}``.

    Returns
    -------
    dict of str to dict
        ``{name: {field: time_limit_s}}``, usable as ``solver_options``.
    """
    from ..solvers.registry import solver_class

    if time_limit_s is None:
        return {}
    out: dict[str, dict] = {}
    for name in solvers:
        if not isinstance(name, str):
            continue
        try:
            cls = solver_class(name)
        except ImportError:
            continue
        fields = {f.name for f in dataclasses.fields(cls.Options)}
        for key in ("time_limit_s", "time_limit"):
            if key in fields:
                out[name] = {key: float(time_limit_s)}
                break
    return out


def _make_solver(solver, options: dict):
    """(Solver instance or None, reason) for a name / class / instance."""
    from ..solvers.registry import get_solver

    try:
        return get_solver(solver, **options), ""
    except ImportError as e:  # a built-in whose module or backend is not installed
        return None, f"cannot import solver {_solver_name(solver)!r}: {e}"


def compare(problem: RematProblem, budgets: Sequence, solvers: Sequence, *,
            solver_options: Mapping[str, Mapping] | None = None, progress: bool = True,
            cut_bounds: bool = True) -> list[Row]:
    """Run every solver at every budget.

    Parameters
    ----------
    problem : RematProblem
    budgets : sequence of int, float or str
        Anything :func:`~libra_opt.units.parse_budget` reads: bytes,
        ``"12GiB"``, ``"60%"``, or a float fraction of the no-remat peak.
    solvers : sequence of str, Solver class or Solver instance
        Registered names (:func:`~libra_opt.solvers.available_solvers`) or
        solvers.
    solver_options : mapping of str to mapping, optional
        Options per solver name, e.g. ``{"checkmate-milp": {"time_limit_s":
        60}}`` (see :func:`time_limit_options`).  Only for solvers given by
        name or class.
    progress : bool
        Show a tqdm progress bar (on stderr).
    cut_bounds : bool
        Add the cut bounds at each budget
        (:func:`~libra_opt.solvers.certificates.cut_bounds`) to the bounds the
        solvers proved: every plan then has a gap, whichever solver made it.
        ``False``: only the solvers' own bounds (a plan no solver bounds says
        "bound unknown").

    Returns
    -------
    list of Row
        Budget-major: for each budget (in the order given), one row per solver.
        Infeasible budgets give ``"infeasible"`` rows; a solver whose backend
        is missing gives ``"unavailable"`` rows and one that fails with a
        :class:`~libra_opt.errors.SolverError` gives ``"error"`` rows (logged).

    Raises
    ------
    SolverNotFoundError
        An unknown solver name (before anything runs).
    ValueError
        An unparseable budget (before anything runs).
    """
    from tqdm.auto import tqdm

    from ..solvers.base import Solver
    from ..solvers.registry import solver_class

    solver_options = dict(solver_options or {})
    peak = no_remat_peak(problem)
    base_s = problem.total_compute_s
    budget_bytes = [parse_budget(b, peak) for b in budgets]
    for s in solvers:  # unknown names fail now, not halfway through
        if isinstance(s, str):
            try:
                solver_class(s)
            except ImportError:
                pass
    made = []
    for s in solvers:
        name = _solver_name(s)
        opts = {} if isinstance(s, Solver) else dict(solver_options.get(name, {}))
        inst, reason = _make_solver(s, opts)
        made.append((name, inst, reason))

    results: dict[tuple[int, int], tuple] = {}   # (budget, solver) -> (Row, SolveResult or None)
    # disable=None: tqdm draws no bar when stderr is not a terminal (logs, CI)
    bar = tqdm(total=len(budget_bytes) * len(made), disable=None if progress else True, desc=problem.name,
               unit="solve", leave=False)
    try:
        for j, (name, inst, reason) in enumerate(made):
            for i, b in enumerate(budget_bytes):
                bar.set_postfix_str(f"{name} @ {b / peak:.0%}" if peak else name)
                results[i, j] = _run_one(problem, inst, name, reason, b, peak, base_s)
                bar.update(1)
    finally:
        bar.close()

    rows: list[Row] = []
    for i, b in enumerate(budget_bytes):
        at = [results[i, j] for j in range(len(made))]
        bounds = [bd for _, res in at if res is not None for bd in res.bounds]
        if cut_bounds and any(res is not None and res.schedule is not None for _, res in at):
            bounds += certificates.cut_bounds(problem, b)
        for r, res in at:
            if res is None or res.schedule is None:
                rows.append(r)
                continue
            # each plan gets the best bound valid for it: its class, budget, and the bound's model
            cert = best_bound(problem, b, res.schedule, bounds, simulation=res.simulation)
            rows.append(dataclasses.replace(r, best_lower_bound_s=cert.lower_bound_s, gap=cert.gap,
                                            bound_kind=cert.kind,
                                            bound_source=None if cert.bound is None else cert.bound.source))
    return rows


def _run_one(problem, inst, name, reason, budget_bytes, peak, base_s) -> tuple:
    """``(Row, SolveResult)`` of one solver at one budget; the result is None
    when the solver did not run or failed."""
    from ..solvers.result import INFEASIBLE

    common = dict(problem=problem.name, budget_bytes=int(budget_bytes),
                  budget_fraction=budget_bytes / peak if peak else float("nan"), solver=name, base_s=base_s,
                  best_lower_bound_s=None, gap=None)
    empty = dict(added_s=None, time_s=None, peak_bytes=None, lower_bound_s=None, min_feasible_bytes=None)
    if inst is None:
        return Row(status=UNAVAILABLE, solve_s=0.0, message=reason, **empty, **common), None
    t0 = time.perf_counter()
    try:
        res = inst.solve(problem, int(budget_bytes), raise_on_infeasible=False)
    except ImportError as e:  # SolverUnavailableError: a backend is missing
        return Row(status=UNAVAILABLE, solve_s=0.0, message=str(e), **empty, **common), None
    except SolverError as e:
        log.warning("solver %s failed on %s at %s: %s", name, problem.name, format_bytes(budget_bytes), e)
        return Row(status=ERROR, solve_s=time.perf_counter() - t0, message=str(e), **empty, **common), None
    if res.status == INFEASIBLE or res.schedule is None:
        return Row(status=res.status, solve_s=res.solve_s, message=res.message,
                   **{**empty, "min_feasible_bytes": res.min_feasible_bytes}, **common), res
    return Row(status=res.status, added_s=res.added_s, time_s=res.time_s, peak_bytes=res.peak_bytes,
               solve_s=res.solve_s, lower_bound_s=res.lower_bound_s, min_feasible_bytes=None,
               message=res.message, **common), res


def rows_to_csv(rows: Iterable[Row], path: str | os.PathLike) -> Path:
    """Write rows as CSV, one column per :class:`Row` field plus ``added_pct``.

    Parameters
    ----------
    rows : iterable of Row
    path : str or PathLike

    Returns
    -------
    Path
        ``path``.

    Raises
    ------
    OutputPathError
        ``path`` cannot be written (a missing or read-only directory, a full
        disk); written with :func:`~libra_opt.atomic.atomic_write`, so the old
        file is unchanged and no temporary file is left.
    """
    rows = list(rows)
    names = [f.name for f in dataclasses.fields(Row)] + ["added_pct"]
    path = Path(path)
    with atomic_write(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=names)
        w.writeheader()
        for r in rows:
            d = dataclasses.asdict(r)
            d["added_pct"] = r.added_pct
            w.writerow({k: ("" if v is None else v) for k, v in d.items()})
    log.info("wrote %d rows to %s", len(rows), path)
    return path


def _fmt_budget(r: Row) -> str:
    return f"{r.budget_fraction:.0%} ({format_bytes(r.budget_bytes)})"


def format_table(rows: Iterable[Row]) -> str:
    """A markdown table of the rows (one line per row), for people.

    Columns: budget (fraction of the no-remat peak and bytes), solver, status,
    added time (s and % of the no-remat step), peak, solve time, gap to the
    best lower bound valid for the plan with its class (``recompute`` /
    ``hybrid``), or "bound unknown" with a footnote.  Infeasible rows show the smallest
    budget the solver could meet in the peak column.
    """
    head = ["budget", "solver", "status", "added", "added %", "peak", "solve time", "gap to bound"]
    unbounded = False
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(["---"] * len(head)) + "|"]
    for r in rows:
        if r.success:
            added, pct = format_seconds(r.added_s), f"{r.added_pct:.2f}%" if r.added_pct is not None else "-"
            peak = format_bytes(r.peak_bytes)
        else:
            added = pct = "-"
            peak = (f"needs >= {format_bytes(r.min_feasible_bytes)}" if r.min_feasible_bytes is not None else "-")
        gap = f"{r.gap:.2%} ({r.bound_kind})" if r.gap is not None else "-"
        if r.success and r.gap is None:
            gap, unbounded = "bound unknown *", True
        solve = format_seconds(r.solve_s) if r.status != UNAVAILABLE else "-"
        lines.append("| " + " | ".join([_fmt_budget(r), r.solver, r.status, added, pct, peak, solve, gap]) + " |")
    if unbounded:
        lines.append("")
        lines.append(UNBOUNDED_NOTE)
    return "\n".join(lines)


#: the footnote of a "bound unknown *" gap in :func:`format_table`
UNBOUNDED_NOTE = ("* bound unknown: no lower bound proven at this budget holds for this plan. A recompute bound "
                  "(Checkmate's LP/MILP) holds only for plans without swaps that its model dominates (first "
                  "computations in node order), a coarsened model's bound for no plan of the original; a hybrid "
                  "bound (hybrid-milp) holds for every plan.")


def plot_rows(rows: Iterable[Row], path: str | os.PathLike, *, title: str | None = None) -> Path:
    """Plot added step time (% of the no-remat step) against the budget
    (fraction of the no-remat peak), one curve per solver, with
    :func:`libra_opt.plots.plot_budget_curve`.  Rows without a plan are
    skipped.

    Raises
    ------
    PlotError
        No row has a plan.
    """
    from .plots import plot_budget_curve

    return plot_budget_curve(list(rows), path, title=title)
