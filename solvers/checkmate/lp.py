"""``checkmate-lp``: Checkmate's LP relaxation with two-phase rounding.

Source: Jain et al., *Checkmate: Breaking the Memory Wall with Optimal Tensor
Rematerialization*, MLSys 2020, section 5 (solve the LP relaxation of the
section-4 MILP; round ``S`` by a threshold; derive the cheapest ``R`` for the
rounded ``S`` with ``solve_r_opt``; sweep thresholds and keep the cheapest
plan within budget).  Reference implementation read:
``parasj/checkmate``, ``strategy_approx_lp.py``
(``solve_approx_lp_deterministic_sweep``); our own code.

The LP is the model of :mod:`libra_opt.solvers.checkmate_model` with
``R``, ``S``, ``FREE`` in ``[0, 1]``, solved with
``scipy.optimize.linprog(method="highs")`` (default) or PuLP's CBC.  Its value
is a lower bound on the compute time (= step time of a recompute-only plan)
of every plan the model admits or dominates and is reported as a
``"recompute"`` bound (:func:`~libra_opt.solvers.checkmate.bounds.checkmate_bounds`,
:func:`~libra_opt.solvers.checkmate.bounds.checkmate_covers`).  When no
rounding fits, the LP is solved again at a smaller budget
(``budget_factors``, as the reference solves at 0.9 of the budget) so the
rounded plans have slack; the bound always comes from the full budget.
libra's recompute-only plan at the same budget is the fallback (option
``libra_fallback``): when the LP stops at its time limit, no rounding fits,
or the rounding costs more, the cheapest plan within the budget among the
rounding, libra's and the heuristic plans is returned, so the LP never ends
in an error where libra plans.
Problems larger than ``max_nodes`` are coarsened first
(:mod:`libra_opt.solvers.coarsen`); the LP value is then a bound for the
coarse model only and goes to ``extras["coarse_bounds_s"]`` instead.
"""
from __future__ import annotations

import logging
import tempfile
import time
from dataclasses import dataclass, field

import numpy as np

from libra_opt.errors import SolverError, SolverOptionError

from ..base import Solver
from .model import CheckmateModel
from .bounds import checkmate_bounds
from .plan import Candidate, CheckmateSetup, no_remat_solution, rs_from_s
from ..registry import register_solver
from ..result import FEASIBLE, OPTIMAL, TIME_LIMIT, RawSolution

log = logging.getLogger(__name__)

LP_BACKENDS = ("scipy", "pulp")


@dataclass(frozen=True)
class CheckmateLPOptions:
    """Options of ``checkmate-lp``.

    Attributes
    ----------
    backend : {"scipy", "pulp"}
        ``"scipy"``: ``scipy.optimize.linprog(method="highs")``; ``"pulp"``:
        PuLP's CBC.
    thresholds : tuple of float
        Rounding thresholds in (0, 1]: ``S[t, i] = 1`` where the LP's
        ``S[t, i] >= threshold``.
    budget_factors : tuple of float
        LP budgets to try, as fractions of the budget, until a rounding fits
        (the first should be 1.0; it gives the lower bound).  A reduced LP
        budget is raised to the model's necessary minimum (the largest
        single-stage requirement) when it falls below it.
    time_limit_s : float
        Time limit of all LP solves together (each gets what is left), seconds.
    coarsen : "auto", "none" or int
        As for ``checkmate-milp``.
    max_nodes : int
        Size used by ``coarsen="auto"``.
    values : {"auto", "tensor", "node"}
        ``S`` per value = outputs of a node with the same users (``"tensor"``,
        exact) or per node (``"node"``, Checkmate's; fewer variables).
        ``"auto"``: ``"tensor"`` unless the problem was coarsened.
    libra_fallback : bool
        Also run libra (recompute-only) at the budget; its plan is returned
        when it is cheaper than every rounding, or when the LP stops at its
        time limit or no rounding fits.
    """

    backend: str = "scipy"
    thresholds: tuple = (0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.0)
    budget_factors: tuple = (1.0, 0.9, 0.8, 0.7)
    time_limit_s: float = 120.0
    coarsen: str | int = "auto"
    max_nodes: int = 100
    values: str = "auto"
    libra_fallback: bool = True


@register_solver("checkmate-lp")
class CheckmateLPSolver(Solver):
    """Checkmate's LP relaxation + threshold rounding of ``S``.

    Statuses: ``"optimal"`` when the cheapest rounded plan's cost equals the
    LP bound (so no plan under the model is cheaper), else ``"feasible"``.
    If no rounding fits at any budget factor, the cheaper heuristic plan
    (no remat / recompute-forward) that the simulator accepts is returned
    (the message says so); if none does,
    :class:`~libra_opt.errors.InfeasibleBudgetError` is raised with the
    smallest heuristic peak as ``min_feasible_bytes``.
    """

    name = "checkmate-lp"
    requires = ("numpy", "scipy")
    citation = ("Jain et al., Checkmate: Breaking the Memory Wall with Optimal Tensor Rematerialization, "
                "MLSys 2020, sec. 5")
    Options = CheckmateLPOptions

    def _check_options(self) -> None:
        o = self.options
        if o.backend not in LP_BACKENDS:
            raise SolverOptionError(f"checkmate-lp: unknown backend {o.backend!r}; use one of {LP_BACKENDS}")
        if not o.thresholds or not all(0 < float(th) <= 1 for th in o.thresholds):
            raise SolverOptionError(f"checkmate-lp: thresholds must be numbers in (0, 1], got {o.thresholds!r}")
        if not o.budget_factors or not all(0 < float(f) <= 1 for f in o.budget_factors):
            raise SolverOptionError(f"checkmate-lp: budget_factors must be numbers in (0, 1], got {o.budget_factors!r}")
        if not o.time_limit_s > 0:
            raise SolverOptionError(f"checkmate-lp: time_limit_s must be positive, got {o.time_limit_s}")
        if o.max_nodes < 2:
            raise SolverOptionError(f"checkmate-lp: max_nodes must be at least 2, got {o.max_nodes}")
        if o.backend == "pulp":
            import importlib.util

            if importlib.util.find_spec("pulp") is None:
                from libra_opt.errors import SolverUnavailableError

                raise SolverUnavailableError("checkmate-lp backend 'pulp' needs pulp, which is not installed: "
                                             "pip install pulp")

    def _solve(self, problem, budget_bytes: int) -> RawSolution:
        self._check_options()
        o = self.options
        trivial = no_remat_solution(problem, budget_bytes, self.name, extras={"coarsened": False})
        if trivial is not None:
            return trivial
        setup = CheckmateSetup(problem, o.coarsen, o.max_nodes, self.name, o.values, budget_bytes=budget_bytes)
        rr = round_lp(setup, budget_bytes, backend=o.backend, thresholds=o.thresholds,
                      budget_factors=o.budget_factors, time_limit_s=o.time_limit_s,
                      deadline=time.perf_counter() + o.time_limit_s)
        extras = dict(setup.describe(), backend=o.backend, **rr.extras)
        lp_value_s = rr.lp_value_s
        if lp_value_s is None:
            bound = "no LP bound"
        elif setup.coarsened:
            bound = f"LP bound {lp_value_s:.6g} s holds for the coarsened graph only"
        else:
            bound = f"LP lower bound {lp_value_s:.6g} s"
        bounds = checkmate_bounds(setup, budget_bytes, self.name, [("LP value", lp_value_s)], extras)
        libra = setup.libra_plans(budget_bytes)[:1] if o.libra_fallback else []
        if libra:
            extras["libra_time_s"] = libra[0].time_s
        if rr.best is None:
            heur = setup.heuristics()
            fitting = sorted((c for c in heur + libra if c.peak_bytes <= budget_bytes), key=lambda c: c.time_s)
            if fitting:
                c = fitting[0]
                c.schedule.meta.update({"solver": self.name})
                why = ("the LP is infeasible at this budget" if rr.lp_infeasible else
                       "the LP stopped at its time limit" if rr.timed_out else
                       f"the LP stopped ({rr.lp_error})" if rr.lp_error else "no rounding of the LP fits")
                status = TIME_LIMIT if rr.timed_out else FEASIBLE
                return RawSolution(c.schedule, status, None,
                                   f"{why}; fell back to the {c.name} plan, which the simulator "
                                   f"accepts ({bound}){setup.note()}", dict(extras, heuristic=c.name, returned=c.name),
                                   bounds=bounds)
            detail = ("the Checkmate LP relaxation is infeasible at this budget" if rr.lp_infeasible else
                      f"the LP stopped ({rr.lp_error})" if rr.lp_error else
                      "no rounding of the Checkmate LP fits this budget; checkmate-milp may find a plan")
            raise setup.infeasible(budget_bytes, heur + ([rr.lowest] if rr.lowest is not None else []), detail)
        cand = rr.best
        status = FEASIBLE
        if bounds and cand.time_s <= lp_value_s * (1 + 1e-6) + 1e-12:
            status = OPTIMAL
        msg = f"LP ({o.backend}) rounded at threshold {rr.threshold:g}" + (
            f", LP solved at {rr.factor:g} of the budget" if rr.factor != 1.0 else "")
        if libra and libra[0].peak_bytes <= budget_bytes and libra[0].time_s < cand.time_s:
            cand = libra[0]
            msg += "; libra's plan is cheaper than the rounding and is returned"
            extras["returned"] = "libra"
            status = FEASIBLE  # cheaper than the LP optimum's rounding: outside the model or not its optimum
        cand.schedule.meta.update({"solver": self.name, "status": status})
        return RawSolution(cand.schedule, status, None, msg + setup.note(), extras, bounds=bounds)


@dataclass
class LPRounding:
    """What :func:`round_lp` found.

    Attributes
    ----------
    best : Candidate or None
        The cheapest rounded plan whose simulated peak fits the budget.
    threshold, factor : float or None
        Its rounding threshold and the LP budget factor it came from.
    lp_value_s : float or None
        The LP optimum at the full budget, seconds (None if infeasible or not reached).
    lp_infeasible : bool
        The LP at the full budget is infeasible (so is the MILP).
    lp_error : str or None
        Why an LP solve stopped without a solution (time limit, numerics).
    timed_out : bool
        An LP solve hit the time limit, or the deadline passed before the
        budget factors were all tried.
    lowest : Candidate or None
        The rounded plan with the smallest simulated peak, within budget or
        not: its peak is a budget shown feasible.
    extras : dict
        ``lp_value_s``, ``num_vars``, ``num_rows``, ``roundings_tried``,
        ``threshold``, ``budget_factor``.
    """

    best: Candidate | None = None
    lowest: Candidate | None = None
    threshold: float | None = None
    factor: float | None = None
    lp_value_s: float | None = None
    lp_infeasible: bool = False
    lp_error: str | None = None
    timed_out: bool = False
    extras: dict = field(default_factory=dict)


def round_lp(setup: CheckmateSetup, budget_bytes: int, *, backend: str = "scipy",
             thresholds=CheckmateLPOptions.thresholds, budget_factors=CheckmateLPOptions.budget_factors,
             time_limit_s: float = 120.0, deadline: float | None = None) -> LPRounding:
    """Solve Checkmate's LP relaxation and round it (section 5.2).

    For each LP budget (``budget_factors`` of ``budget_bytes``, raised to the
    model's necessary minimum), solve the LP, then for each threshold round
    ``S``, complete it and derive ``R`` (:func:`rs_from_s`), build and
    simulate the plan; stop at the first LP budget that gives a plan within
    ``budget_bytes`` and keep the cheapest such plan.

    Parameters
    ----------
    setup : CheckmateSetup
    budget_bytes : int
    backend : {"scipy", "pulp"}
    thresholds, budget_factors : sequence of float
    time_limit_s : float
        Limit of each LP solve, seconds.
    deadline : float, optional
        ``time.perf_counter()`` value after which no further LP is solved;
        each LP gets at most the time left until it.

    Returns
    -------
    LPRounding
        An LP solve that stops without a solution (time limit, numerics)
        ends the search; ``lp_error`` says why, and ``timed_out`` is set on
        a time limit.
    """
    g = setup.graph
    out = LPRounding()
    tried: set[bytes] = set()
    rounds = 0
    floor = g.min_stage_bytes()  # no plan of the model needs less: never solve the LP below it
    seen_budgets: set[int] = set()
    for factor in budget_factors:
        factor = float(factor)
        if deadline is not None and deadline <= time.perf_counter():
            out.timed_out = out.best is None
            break
        lp_budget = int(budget_bytes * factor)
        if factor != 1.0:
            lp_budget = max(lp_budget, min(floor, budget_bytes))
        if lp_budget in seen_budgets:
            continue
        seen_budgets.add(lp_budget)
        model = CheckmateModel(g, lp_budget, integral=False)
        if model.infeasible_reason is not None:
            if factor == 1.0:
                out.lp_infeasible = True
                out.extras["infeasible_reason"] = model.infeasible_reason
            break
        t0 = time.perf_counter()
        limit = time_limit_s if deadline is None else max(min(time_limit_s, deadline - t0), 0.1)
        try:
            x, value = _solve_lp(model, backend, limit)
        except SolverError as e:
            out.lp_error = str(e)
            out.timed_out = isinstance(e, _LPTimeLimit)
            log.info("checkmate LP at %.2f of the budget stopped: %s", factor, e)
            break
        log.info("checkmate LP at %.2f of the budget: %s in %.2f s (%d vars, %d rows)", factor,
                 "infeasible" if x is None else f"{value:.6g}", time.perf_counter() - t0, model.num_vars,
                 model.num_rows)
        if x is None:
            if factor == 1.0:
                out.lp_infeasible = True
            break
        if factor == 1.0:
            out.lp_value_s = model.objective_seconds(value)
            out.extras.update(lp_value_s=out.lp_value_s, num_vars=model.num_vars, num_rows=model.num_rows)
        _, S_frac = model.fractional_rs(x)
        for th in sorted(float(v) for v in thresholds):
            S0 = S_frac >= th - 1e-9
            key = np.packbits(S0).tobytes()
            if key in tried:
                continue
            tried.add(key)
            rounds += 1
            R, S = rs_from_s(g, S0)
            cand = setup.candidate(f"LP rounding (threshold {th:g})", R, S,
                                   {"solver": setup.solver, "threshold": th, "budget_factor": factor})
            if out.lowest is None or cand.peak_bytes < out.lowest.peak_bytes:
                out.lowest = cand
            if cand.peak_bytes <= budget_bytes and (out.best is None or cand.time_s < out.best.time_s):
                out.best, out.threshold, out.factor = cand, th, factor
        if out.best is not None:
            break
    out.extras["roundings_tried"] = rounds
    if out.best is not None:
        out.extras.update(threshold=out.threshold, budget_factor=out.factor)
    return out


def _solve_lp(model: CheckmateModel, backend: str, time_limit_s: float) -> tuple[np.ndarray | None, float | None]:
    """Solve the LP relaxation; returns ``(x, objective)`` or ``(None, None)``
    if infeasible.

    Raises
    ------
    SolverError
        The LP solver failed for another reason (time limit, numerics).
    """
    if backend == "scipy":
        return _solve_scipy(model, time_limit_s)
    return _solve_pulp_lp(model, time_limit_s)


class _LPTimeLimit(SolverError):
    """An LP solve stopped at its time (or iteration) limit without a solution."""


def _solve_scipy(model: CheckmateModel, time_limit_s: float):
    import scipy.sparse as sp
    from scipy.optimize import linprog

    A, lo, hi = model.A, model.row_lb, model.row_ub
    eq = lo == hi
    up = ~eq & np.isfinite(hi)
    down = ~eq & np.isfinite(lo)
    A_ub = sp.vstack([A[up], -A[down]]).tocsr()
    b_ub = np.concatenate([hi[up], -lo[down]])
    res = linprog(model.obj, A_ub=A_ub if A_ub.shape[0] else None, b_ub=b_ub if A_ub.shape[0] else None,
                  A_eq=A[eq] if eq.any() else None, b_eq=lo[eq] if eq.any() else None,
                  bounds=np.column_stack([model.lb, model.ub]), method="highs",
                  options={"time_limit": float(time_limit_s), "presolve": True})
    if res.status == 0:
        return np.asarray(res.x), float(res.fun)
    if res.status == 2:
        return None, None
    error = _LPTimeLimit if res.status == 1 else SolverError   # 1: iteration or time limit reached
    raise error(f"checkmate-lp: scipy linprog (HiGHS) failed: {res.message}; raise time_limit_s or "
                f"coarsen further (coarsen=<nodes>)")


def _solve_pulp_lp(model: CheckmateModel, time_limit_s: float):
    import pulp

    from .backends import cbc_command, pulp_model, run_pulp

    prob, xs = pulp_model(model, integral=False)
    with tempfile.TemporaryDirectory(prefix="libra_cbc_") as tmp:
        run_pulp(prob, cbc_command(msg=False, timeLimit=float(time_limit_s)), tmp)
    if prob.status == pulp.LpStatusOptimal:
        x = np.array([v.value() if v.value() is not None else 0.0 for v in xs])
        return x, float(pulp.value(prob.objective) or 0.0)
    if prob.status == pulp.LpStatusInfeasible:
        return None, None
    error = _LPTimeLimit if prob.status == pulp.LpStatusNotSolved else SolverError  # CBC stopped by timeLimit
    raise error(f"checkmate-lp: PuLP/CBC returned status {pulp.LpStatus[prob.status]!r} (time limit "
                f"{time_limit_s:g} s); raise time_limit_s or coarsen further")


__all__ = ["CheckmateLPSolver", "CheckmateLPOptions", "LPRounding", "round_lp"]
