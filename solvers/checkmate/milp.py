"""``checkmate-milp``: Checkmate's optimal rematerialization MILP.

Source: Jain et al., *Checkmate: Breaking the Memory Wall with Optimal Tensor
Rematerialization*, MLSys 2020, section 4 (MILP over ``R``, ``S``, ``FREE``,
``U`` with frontier-advancing stages).  The formulation is in
:mod:`libra_opt.solvers.checkmate_model`, the plan read off ``(R, S)`` in
:mod:`libra_opt.solvers.checkmate_plan`.  As in the reference implementation
(``parasj/checkmate``, ``strategy_optimal_ilp.py``), ``R`` is re-derived from
the solution's ``S`` with ``solve_r_opt``, which removes spurious
recomputations.

Backends (:mod:`.backends`, shared with ``hybrid-milp``): OR-Tools with SCIP
through its vectorised model builder, OR-Tools' CBC, or PuLP with CBC;
Ctrl-C during a solve raises ``KeyboardInterrupt`` and never returns a plan
from an interrupted solve.  The options every MILP solver takes
(:class:`MIPOptions`, :func:`check_mip_options`) are defined there and
importable from here.

Starting solution and fallback: libra's recompute-only plan at the same
budget (:meth:`~libra_opt.solvers.checkmate_plan.CheckmateSetup.libra_plans`)
joins the heuristic plans and the LP rounding; the cheapest of them that
fits the model is the MILP's hint, and the cheapest that the simulator
accepts within the budget is returned whenever the MILP ends worse or with
no solution (time limit): the result is never costlier than libra's.

Recompute only (no swapping).  The model has O(n^2)
variables: problems with more than ``max_nodes`` nodes are coarsened first
(:mod:`libra_opt.solvers.coarsen`) and the plan expanded back; the result's
message and ``extras["coarsened"]`` say so, and the MILP bound then holds for
the coarse model only, so it is reported in ``extras["coarse_bounds_s"]``
and not as a bound.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import numpy as np

from libra_opt.errors import SolverError, SolverOptionError

from ..base import Solver
from .backends import BACKENDS, ORTOOLS_SOLVERS, MIPOptions, MipResult, check_mip_options, solve_mip  # noqa: F401
from .backends import cbc_command, run_interruptibly, run_pulp  # noqa: F401  (their old home: importable here too)
from .model import CheckmateModel, model_peak_bytes
from .bounds import checkmate_bounds
from .plan import CheckmateSetup, no_remat_solution, rs_from_s
from ..registry import register_solver
from ..result import FEASIBLE, OPTIMAL, TIME_LIMIT, RawSolution

log = logging.getLogger(__name__)

@dataclass(frozen=True)
class CheckmateMILPOptions(MIPOptions):
    """Options of ``checkmate-milp``: those of :class:`MIPOptions`, with

    Attributes
    ----------
    time_limit_s : float
        Wall-clock limit of the whole solve (warm start included; the MILP
        itself gets what is left, at least 1 s), seconds.
    mip_gap : float
        Relative optimality gap at which the solve stops (0.0001 = 0.01 %).
    warm_start : bool
        Give the solver a starting solution (``SetHint`` / PuLP initial
        values with ``warmStart``): the cheapest of the heuristic plans (no
        remat, recompute-forward) and Checkmate's LP rounding
        (:func:`~libra_opt.solvers.checkmate_lp.round_lp`, given at most half
        of ``time_limit_s``) that fits the model's budget, and libra's plan
        when ``libra_hint``.  If the MILP stops at its time limit without a
        better plan, that plan is returned (status ``"time_limit"``); the LP
        value also serves as a lower bound.
    libra_hint : bool
        Run libra (recompute-only) at the budget first: its plan is a
        starting solution (mapped to ``R``/``S``) and the plan returned when
        the MILP ends worse or without a solution.
    coarsen : "auto", "none" or int
        ``"auto"``: coarsen problems with more than ``max_nodes`` nodes to
        ``max_nodes``; an int: coarsen to that many nodes; ``"none"``: never.
    max_nodes : int
        Size used by ``coarsen="auto"``.
    values : {"auto", "tensor", "node"}
        ``S`` per value = outputs of a node with the same users (``"tensor"``,
        exact) or per node (``"node"``, Checkmate's; fewer variables).
        ``"auto"``: ``"tensor"`` unless the problem was coarsened.
    """

    coarsen: str | int = "auto"
    max_nodes: int = 100
    values: str = "auto"


@register_solver("checkmate-milp")
class CheckmateMILPSolver(Solver):
    """Checkmate's MILP (optimal recomputation plan under the model).

    Statuses: ``"optimal"`` (proven within ``mip_gap``), ``"time_limit"``
    (stopped at ``time_limit_s`` with a plan), ``"feasible"`` (a plan without
    proof: a warm-start plan the simulator accepts although it lies outside
    the model, see the restrictions in
    :mod:`~libra_opt.solvers.checkmate_model`).  An infeasible budget raises
    :class:`~libra_opt.errors.InfeasibleBudgetError` whose
    ``min_feasible_bytes`` is the smallest simulated peak among the plans
    tried (no remat, recompute-forward, LP rounding): a budget shown feasible.

    ``bounds``: the MILP's best bound and the LP value at the budget, in
    seconds of compute (= step time of a recompute-only plan), as
    ``"recompute"`` bounds that hold for the plans the model dominates
    (:func:`~libra_opt.solvers.checkmate.bounds.checkmate_covers`: the model fixes
    the order of first computations, so it is no relaxation of the
    simulator), when the model was built on the problem itself; none on a
    coarsened model.  ``lower_bound_s`` is the larger of them when the
    returned plan is dominated by the model, else None (bound unknown).
    """

    name = "checkmate-milp"
    requires = ("numpy", "scipy")
    citation = ("Jain et al., Checkmate: Breaking the Memory Wall with Optimal Tensor Rematerialization, "
                "MLSys 2020, sec. 4")
    Options = CheckmateMILPOptions

    def _check_options(self) -> None:
        o = self.options
        check_mip_options(o, self.name)
        if o.max_nodes < 2:
            raise SolverOptionError(f"checkmate-milp: max_nodes must be at least 2, got {o.max_nodes}")

    # ------------------------------------------------------------------ solve
    def _solve(self, problem, budget_bytes: int) -> RawSolution:
        self._check_options()
        o = self.options
        trivial = no_remat_solution(problem, budget_bytes, self.name, extras={"coarsened": False})
        if trivial is not None:
            return trivial
        deadline = time.perf_counter() + o.time_limit_s
        setup = CheckmateSetup(problem, o.coarsen, o.max_nodes, self.name, o.values, budget_bytes=budget_bytes)
        g = setup.graph
        extras = dict(setup.describe(), backend=o.backend)
        heur = setup.heuristics()
        pool = list(heur)
        if o.libra_hint:
            pool += setup.libra_plans(budget_bytes)
            libra = [c for c in pool if c.name == "libra"]
            if libra:
                extras["libra_time_s"] = libra[0].time_s
        lp_value_s = None
        if o.warm_start and g.min_stage_bytes() <= budget_bytes:
            # Checkmate's LP rounding (sec. 5) is cheap next to the MILP: a starting plan and a bound
            from .lp import round_lp

            t_lp = time.perf_counter()
            try:
                rr = round_lp(setup, budget_bytes, time_limit_s=max(o.time_limit_s / 2, 1.0),
                              deadline=t_lp + o.time_limit_s / 2)
            except SolverError as e:  # the LP is only a warm start
                log.info("checkmate-milp: no LP warm start: %s", e)
            else:
                lp_value_s = rr.lp_value_s
                if rr.best is not None:
                    pool.append(rr.best)
            extras["warm_start_lp_s"] = time.perf_counter() - t_lp
        fitting = sorted((c for c in pool if c.peak_bytes <= budget_bytes), key=lambda c: c.time_s)

        model_budget = budget_bytes
        res = None
        model = None
        bound_s = None
        for attempt in range(3):
            model = CheckmateModel(g, model_budget, integral=True)
            if model.infeasible_reason is not None:
                res = MipResult(None, "infeasible", None, None, False, "bounds")
                break
            extras.update(num_vars=model.num_vars, num_rows=model.num_rows)
            hint = None
            if o.warm_start:
                ok = [(c.time_s, c) for c in pool
                      if c.R is not None and model_peak_bytes(g, c.R, c.S) <= model_budget]
                if ok:
                    best = min(ok, key=lambda z: z[0])[1]
                    hint = model.assignment(best.R, best.S)
                    extras["warm_start"] = best.name
            left = max(deadline - time.perf_counter(), 1.0)
            res = solve_mip(model, hint, left, o)
            if attempt == 0 and res.bound is not None and np.isfinite(res.bound) and abs(res.bound) < 1e20:
                # only the model at the budget itself bounds plans within it (a tightened one has fewer plans)
                bound_s = extras["best_bound_s"] = res.bound * model.time_scale
            extras["engine"] = res.engine
            if res.x is None:
                break
            R, S = rs_from_s(g, model.decode(res.x)[1])
            cand = setup.candidate("milp", R, S, {"solver": self.name})
            if cand.peak_bytes <= budget_bytes:
                break
            # the solver's feasibility tolerance let the model go a little over: tighten and retry
            over = cand.peak_bytes - budget_bytes
            log.info("checkmate-milp: plan is %d bytes over the budget (solver tolerance); tightening", over)
            model_budget = model_budget - 2 * over - 1
            res = MipResult(None, "no_solution", None, None, False, res.engine)

        lb_scale = model.time_scale if model is not None else 1.0
        bounds = checkmate_bounds(setup, budget_bytes, self.name, (("MILP bound", bound_s), ("LP value", lp_value_s)),
                                  extras)

        if res is None or res.x is None:
            if fitting:
                c = fitting[0]
                why = ("the MILP model is infeasible at this budget (it excludes some plans the simulator accepts)"
                       if res is not None and res.status == "infeasible" else
                       "the MILP found no solution within the time limit")
                c.schedule.meta.update({"solver": self.name})
                status = TIME_LIMIT if res is not None and res.hit_time_limit else FEASIBLE
                return RawSolution(c.schedule, status, None,
                                   f"{why}; returning the {c.name} plan, which the simulator accepts"
                                   f"{setup.note()}", dict(extras, heuristic=c.name, returned=c.name),
                                   bounds=bounds)
            if res is not None and res.status == "infeasible":
                raise setup.infeasible(budget_bytes, pool, "the Checkmate MILP is infeasible at this budget"
                                       + (f": {model.infeasible_reason}" if model.infeasible_reason else ""))
            if setup.libra_min_feasible_bytes is not None:  # libra, too, calls the budget infeasible
                raise setup.infeasible(budget_bytes, pool, "the MILP found no plan within the time limit and "
                                       "libra finds none at this budget")
            raise SolverError(f"checkmate-milp found no plan within {o.time_limit_s} s, and neither the "
                              f"heuristic plans, libra's nor the LP rounding fit the budget; raise time_limit_s "
                              f"or the budget, or coarsen further (coarsen=<nodes>)")
        status = OPTIMAL if res.status == "optimal" else (TIME_LIMIT if res.hit_time_limit else FEASIBLE)
        objective_s = res.objective * lb_scale if res.objective is not None else None
        extras.update(objective_s=objective_s)
        msg = f"{res.engine}: {res.status}" + (" (time limit)" if res.hit_time_limit else "")
        if fitting and fitting[0].time_s < cand.time_s:  # stopped early with a plan worse than its start
            cand = fitting[0]
            msg += f"; the {cand.name} plan is cheaper than the MILP's incumbent and is returned"
            extras["returned"] = cand.name
            if status == OPTIMAL:  # cheaper than the model's optimum: a plan outside the model
                status = FEASIBLE
        if setup.coarsened and status == OPTIMAL:
            # optimal for the coarse model only: plans outside it (finer recompute) may be cheaper
            status = FEASIBLE
            msg += " on the coarsened graph"
        cand.schedule.meta.update({"solver": self.name, "status": status})
        return RawSolution(cand.schedule, status, None, msg + setup.note(), extras, bounds=bounds)


__all__ = ["CheckmateMILPSolver", "CheckmateMILPOptions", "MIPOptions"]
