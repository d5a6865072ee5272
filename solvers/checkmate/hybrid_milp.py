"""``hybrid-milp``: an exact keep / recompute / swap planner (MILP).

Sources: Jain et al., *Checkmate*, MLSys 2020, section 4 (stages, ``R``,
``S``, ``FREE``, ``U``); Beaumont et al., *Efficient Combination of
Rematerialization and Offloading for Training DNNs*, NeurIPS 2021, section 3
(offload / prefetch decisions beside recomputation, a stage lasting as long
as the longest of its compute and its transfers).  The formulation, and
exactly which plans it covers, is in :mod:`~libra_opt.solvers.hybrid_model`;
the plan is read off ``(R, S, IN, OFF)`` by
:func:`~libra_opt.solvers.checkmate_plan.schedule_from_rs` and judged by the
simulator like every other solver's.

What the result proves (:mod:`~libra_opt.solvers.certificates`): three
``"hybrid"`` bounds, the compute floor and the cut bound
(:mod:`~libra_opt.passes.cut_bounds`; both hold for every plan the simulator
accepts, and a plan within ``mip_gap`` of them is returned as optimal before
any MILP is built), and the MILP's bound,
which lower-bounds the simulated step time of **every plan in the model's
space** (:mod:`~libra_opt.solvers.hybrid_model`: Checkmate stage plans plus
one swap-out per value right after its first computation and swap-ins
waited for at the end of the stage that issues them), not of every plan the
simulator accepts (a swap-in waited for inside a stage lies outside it).  The
MILP bound therefore carries a ``covers`` test: it is applied to a plan
(``SolveResult.lower_bound_s``, ``gap``) only when the plan maps onto a point
of the model that costs no more than the plan, else the compute floor is; it
is reported only when the model was built at the budget asked for (not one
tightened for the solver's tolerance), and stays in
``extras["best_bound_s"]`` in any case.  The status is ``"optimal"`` only
when the MILP proved its optimum and the returned plan's simulated time is
within ``mip_gap`` of the bound (the simulator may charge waits the model
does not: a host copy not yet complete, the device-to-host queue's tail), or
the plan runs within ``mip_gap`` of the compute floor or the cut bound.

Starting solution and fallback (as ``checkmate-milp``'s ``libra_hint``):
libra's hybrid plans at the same budget (its default exchange moves and its
thorough ones, ``exchange_effort="thorough"`` with ``added_gap_tol=0``:
cheaper on some cells, for a second or two), mapped onto the model's variables
(:func:`~libra_opt.solvers.hybrid_model.hybrid_from_schedule`, then
:meth:`~libra_opt.solvers.hybrid_model.HybridModel.fitted_assignment`), the
swap-on-demand plan (:func:`~libra_opt.solvers.hybrid_model.swap_on_demand`)
and the recompute-only plans (libra's, no remat, recompute-forward,
Checkmate's LP rounding given a quarter of ``time_limit_s``, at most 60 s)
are hints; the
cheapest the simulator accepts within the budget is returned whenever the
MILP ends worse or without a plan, so the result is never slower than
libra's hybrid plans (status then ``"feasible"`` or ``"time_limit"``).

The solve (:func:`~libra_opt.solvers.checkmate.neighbourhoods.solve_with_windows`):
the whole model from the starting solution for a tenth of the time (at most
60 s); where that proves no optimum, sub-MILPs over windows of stages and of
nodes around the incumbent for ``lns_share`` of it (large-neighbourhood
search: each fixes the integer variables outside its window; their plans are
simulated and join the candidates, their bounds are never used), then the
whole model again from the best of them.  The bound reported is the larger
of the two whole-model solves'.

Backends: OR-Tools (SCIP through the model builder, or CBC), HiGHS
(``backend="highs"``, through ``highspy``: ``pip install 'libra-opt[highs]'``)
or PuLP's CBC, with the helpers of
:mod:`~libra_opt.solvers.checkmate.backends`; Ctrl-C raises
``KeyboardInterrupt`` and never returns a plan from an interrupted solve.
The model has O(n^2) variables and is never coarsened (a coarse model's
bound would not bound the problem): problems above ``max_nodes`` nodes are
refused.
"""
from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass

import numpy as np

from libra_opt.errors import InfeasibleBudgetError, LibraOptError, SolverError, SolverOptionError

from ..base import Solver
from ..certificates import HYBRID, Bound, cut_bounds, floor_bound, model_covers
from .backends import MIPOptions, MipResult, check_mip_options
from .neighbourhoods import solve_with_windows
from .plan import Candidate, CheckmateSetup, no_remat_solution, schedule_from_rs, solve_r_opt
from .hybrid_model import HybridModel, hybrid_from_schedule, swap_on_demand
from ..registry import register_solver
from ..result import FEASIBLE, OPTIMAL, TIME_LIMIT, RawSolution

log = logging.getLogger(__name__)

__all__ = ["HybridMILPSolver", "HybridMILPOptions"]


@dataclass(frozen=True)
class HybridMILPOptions(MIPOptions):
    """Options of ``hybrid-milp``: those of
    :class:`~libra_opt.solvers.checkmate.backends.MIPOptions` (backend,
    ortools_solver, time_limit_s, mip_gap, threads, verbose), with

    Attributes
    ----------
    warm_start : bool
        Give the MILP the cheapest starting plan that fits the model.
    libra_hint : bool
        Run libra (hybrid, with its default and its thorough exchange moves,
        ``LibraOptions.exchange_effort``, and recompute-only) at the budget
        first: starting solutions, and the plan returned when the MILP ends
        worse or without a plan.
    max_nodes : int
        Largest problem accepted (nodes); the model is never coarsened.
    values : {"tensor", "node"}
        Value granularity (:meth:`~libra_opt.solvers.checkmate_model.CheckmateGraph.from_problem`).
    lns_share : float
        Share of the MILP's time (in ``[0, 1)``) for sub-MILPs over windows
        of stages and nodes around the incumbent, where a first short solve
        of the whole model proves no optimum
        (:func:`~libra_opt.solvers.checkmate.neighbourhoods.solve_with_windows`):
        better plans sooner, the bound from the whole model only.  ``0``:
        one solve of the whole model from the starting solution.
    """

    max_nodes: int = 250
    values: str = "tensor"
    lns_share: float = 0.3


@register_solver("hybrid-milp")
class HybridMILPSolver(Solver):
    """Exact keep / recompute / swap plans (see the module docstring for
    what the bound covers).

    Statuses: ``"optimal"`` (proven within ``mip_gap`` for the model's space,
    and the plan simulates within it; or the plan is within ``mip_gap`` of
    the cut bound, which holds for every plan), ``"time_limit"`` (stopped at
    ``time_limit_s`` with a plan), ``"feasible"`` (a plan without that
    proof).  An infeasible budget raises
    :class:`~libra_opt.errors.InfeasibleBudgetError` whose
    ``min_feasible_bytes`` is the smallest simulated peak among the plans
    tried (libra hybrid and recompute-only, the heuristic plans, no remat):
    a budget shown feasible.  Without OR-Tools (or highspy for
    ``backend="highs"``, PuLP for ``backend="pulp"``) it raises
    :class:`~libra_opt.errors.SolverUnavailableError`.
    """

    name = "hybrid-milp"
    requires = ("numpy", "scipy")
    citation = ("Beaumont et al., Efficient Combination of Rematerialization and Offloading for Training DNNs, "
                "NeurIPS 2021, sec. 3; Jain et al., Checkmate, MLSys 2020, sec. 4")
    Options = HybridMILPOptions

    def _check_options(self) -> None:
        o = self.options
        check_mip_options(o, self.name)
        if o.values not in ("tensor", "node"):
            raise SolverOptionError(f"hybrid-milp: values must be 'tensor' or 'node', got {o.values!r}")
        if not 0 <= o.lns_share < 1:
            raise SolverOptionError(f"hybrid-milp: lns_share must be in [0, 1) (a share of the MILP's time), "
                                    f"got {o.lns_share}")

    # ------------------------------------------------------------------ solve
    def _solve(self, problem, budget_bytes: int) -> RawSolution:
        self._check_options()
        o = self.options
        if problem.num_nodes > o.max_nodes:
            raise SolverOptionError(f"hybrid-milp: the problem has {problem.num_nodes} nodes, more than max_nodes="
                                    f"{o.max_nodes}; the model (O(n^2) variables) is never coarsened, since a "
                                    f"coarse model's bound would not bound the problem: raise max_nodes or use "
                                    f"checkmate-milp / libra")
        trivial = no_remat_solution(problem, budget_bytes, self.name,
                                    message="the no-remat plan fits the budget (nothing to evict)")
        if trivial is not None:
            return trivial
        deadline = time.perf_counter() + o.time_limit_s
        setup = CheckmateSetup(problem, "none", problem.num_nodes, self.name, o.values, budget_bytes=budget_bytes)
        g = setup.graph
        extras: dict = dict(backend=o.backend, model_values=g.nv,
                            bound_scope="the plans of the hybrid model (libra_opt.solvers.hybrid_model)")
        pool = list(setup.heuristics())
        hybrid_hints: list = []
        libra_min = []
        if o.libra_hint:
            pool += setup.libra_plans(budget_bytes)
            if setup.libra_min_feasible_bytes is not None:
                libra_min.append(setup.libra_min_feasible_bytes)
            libras, hybrid_hints, hyb_min = self._libra_hybrid(setup, budget_bytes)
            if hyb_min is not None:
                libra_min.append(hyb_min)
            if libras:
                pool += libras
                extras["libra_time_s"] = min(c.time_s for c in libras)
        # bounds of every plan, no model involved: the compute floor and the cut bounds
        plain = (floor_bound(problem, budget_bytes, self.name),) + cut_bounds(problem, budget_bytes)
        proven_s = max(b.value_s for b in plain if b.kind == HYBRID and b.covers is None)   # every plan's
        extras["cut_bound_s"] = proven_s
        fitting = sorted((c for c in pool if c.peak_bytes <= budget_bytes), key=lambda c: c.time_s)
        if fitting and fitting[0].time_s <= proven_s * (1 + o.mip_gap):
            c = fitting[0]   # within mip_gap of a bound on every plan: nothing for the LP or the MILP to find
            c.schedule.meta.update({"solver": self.name, "status": OPTIMAL})
            return RawSolution(c.schedule, OPTIMAL, None,
                               f"the {c.name} plan is within mip_gap={o.mip_gap} of a lower bound on every plan "
                               f"({proven_s:.9g} s): optimal without the MILP",
                               dict(extras, returned=c.name), bounds=plain)
        if o.warm_start and g.min_stage_bytes() <= budget_bytes:
            # Checkmate's LP rounding (recompute only, sec. 5.2): a plan of the model, cheap next to the MILP
            from .lp import round_lp

            t_lp = time.perf_counter()
            share = min(o.time_limit_s / 4, 60.0)
            try:
                rr = round_lp(setup, budget_bytes, time_limit_s=max(share, 1.0), deadline=t_lp + share)
            except SolverError as e:  # only a starting plan
                log.info("hybrid-milp: no LP rounding to start from: %s", e)
            else:
                if rr.best is not None:
                    pool.append(rr.best)
            extras["warm_start_lp_s"] = time.perf_counter() - t_lp

        model_budget = budget_bytes
        res = model = cand = None
        for _attempt in range(3):
            model = HybridModel(g, model_budget)
            if model.infeasible_reason is not None:
                res = MipResult(None, "infeasible", None, None, False, "bounds")
                break
            extras.update(num_vars=model.num_vars, num_rows=model.num_rows,
                          swap_vars=int((model.in_idx >= 0).sum() + (model.b_idx >= 0).sum()
                                        + (model.off_idx >= 0).sum()))
            hint = self._hint(model, pool, hybrid_hints, extras) if o.warm_start else None
            left = max(deadline - time.perf_counter(), 1.0)
            # the windows' plans join the pool (simulated: the model's objective may charge less)
            res, found = solve_with_windows(model, hint, left, o, o.lns_share if _attempt == 0 else 0.0,
                                            lambda x, m=model: pool.append(self._window_candidate(setup, m, x)))
            if found is not None:
                extras["lns"] = found.summary(model.time_scale)
            extras["engine"] = res.engine
            if res.x is None:
                break
            cand = self._candidate(setup, model, res.x)
            if cand.peak_bytes <= budget_bytes:
                break
            over = cand.peak_bytes - budget_bytes  # the solver's feasibility tolerance: tighten and retry
            log.info("hybrid-milp: plan is %d bytes over the budget (solver tolerance); tightening", over)
            model_budget = model_budget - 2 * over - 1
            res, cand = MipResult(None, "no_solution", None, None, False, res.engine), None

        # the plans that fit: the pool with the LP rounding's and the windows' plans
        fitting = sorted((c for c in pool if c.peak_bytes <= budget_bytes), key=lambda c: c.time_s)
        scale = model.time_scale if model is not None else 1.0
        bound_s = None
        if res is not None and res.bound is not None and np.isfinite(res.bound) and abs(res.bound) < 1e20:
            bound_s = extras["best_bound_s"] = res.bound * scale
        if res is not None and res.objective is not None:
            extras["objective_s"] = res.objective * scale

        bounds = list(plain)
        if bound_s is not None and model is not None and model_budget == budget_bytes:
            # a model tightened for the solver's tolerance has fewer plans: its bound is none at the budget
            bounds.append(Bound(bound_s, HYBRID, f"{self.name} (MILP bound)", int(budget_bytes),
                                _covers(setup, model, budget_bytes,
                                        own=None if cand is None else (cand.schedule, extras.get("objective_s")))))
        bounds = tuple(bounds)

        if cand is None:
            if fitting:
                c = fitting[0]
                why = ("no plan of the hybrid model fits this budget" if res is not None and res.status == "infeasible"
                       else "the MILP found no plan within the time limit")
                c.schedule.meta.update({"solver": self.name})
                status = TIME_LIMIT if res is not None and res.hit_time_limit else FEASIBLE
                if c.time_s <= proven_s * (1 + o.mip_gap):
                    status = OPTIMAL  # no plan runs faster than the floor or the cut bound
                return RawSolution(c.schedule, status, None,
                                   f"{why}; returning the {c.name} plan, which the simulator accepts",
                                   dict(extras, returned=c.name), bounds=bounds)
            if res is not None and res.status == "infeasible":
                detail = "no plan of the hybrid MILP fits this budget" + (
                    f": {model.infeasible_reason}" if model is not None and model.infeasible_reason else "")
                raise self._infeasible_error(setup, budget_bytes, pool, libra_min, detail)
            if libra_min:
                raise self._infeasible_error(setup, budget_bytes, pool, libra_min, "the MILP found no plan within "
                                             "the time limit and libra finds none at this budget")
            raise SolverError(f"hybrid-milp found no plan within {o.time_limit_s} s and no starting plan fits the "
                              f"budget; raise time_limit_s or the budget")
        proven = res.status == "optimal" and bound_s is not None
        status = OPTIMAL if proven else (TIME_LIMIT if res.hit_time_limit else FEASIBLE)
        msg = f"{res.engine}: {res.status}" + (" (time limit)" if res.hit_time_limit else "")
        extras["returned"] = "milp"
        if fitting and fitting[0].time_s < cand.time_s:
            cand = fitting[0]
            msg += f"; the {cand.name} plan is faster than the MILP's and is returned"
            extras["returned"] = cand.name
        if status == OPTIMAL and cand.time_s > max(bound_s, proven_s) * (1 + o.mip_gap) + 1e-12:
            status = FEASIBLE  # the simulator charges waits the model does not (module docstring)
            msg += "; the plan simulates slower than the model's optimum (waits the model does not charge)"
        if bound_s is not None and cand.time_s < bound_s * (1 - 1e-9):
            status = FEASIBLE if status == OPTIMAL else status  # a plan outside the model: nothing proven of it
            msg += "; it lies outside the model (faster than the model's bound, which does not cover it)"
        if cand.time_s <= proven_s * (1 + o.mip_gap):
            status = OPTIMAL  # no plan runs faster than the floor or the cut bound
        cand.schedule.meta.update({"solver": self.name, "status": status})
        return RawSolution(cand.schedule, status, None, msg, extras, bounds=bounds)

    # ---------------------------------------------------------------- helpers
    #: libra's hybrid plans that start the MILP: its default exchanges, and thorough ones (``LibraOptions.
    #: exchange_effort``, with ``added_gap_tol=0``: exchanges even where the plan is near the cut bound; a
    #: plan cheaper on some cells, where a second or two next to the MILP's minutes is cheap)
    LIBRA_EFFORTS = (("default", "libra hybrid"), ("thorough", "libra hybrid thorough"))

    def _libra_hybrid(self, setup: CheckmateSetup, budget_bytes: int):
        """libra's hybrid plans (:attr:`LIBRA_EFFORTS`): ``(candidates,
        [(name, (S, IN, A, B, OFF))] of those that map to the model, libra's
        smallest feasible budget where it finds none, else None)``.  The
        thorough plan is left out where it is the default one (the same
        step time and peak)."""
        from ..registry import get_solver

        cands, hints = [], []
        for effort, name in self.LIBRA_EFFORTS:
            try:
                extra = dict(added_gap_tol=0.0) if effort == "thorough" else {}
                r = get_solver("libra", policy="hybrid", exchange_effort=effort, **extra).solve(setup.original,
                                                                                                int(budget_bytes))
            except InfeasibleBudgetError as e:
                # exchange moves change what a plan that meets the budget costs, never which budgets are met
                return cands, hints, e.min_feasible_bytes
            except SolverError as e:  # a reference plan only
                internal = e.__cause__ is not None and not isinstance(e.__cause__, LibraOptError)
                (log.warning if internal else log.info)("hybrid-milp: no %s plan: %s", name, e)
                continue
            if any(c.time_s == float(r.time_s) and c.peak_bytes == int(r.peak_bytes) for c in cands):
                continue
            cands.append(Candidate(name, None, None, r.schedule, int(r.peak_bytes), float(r.time_s)))
            try:
                hints.append((f"{name} (model)", hybrid_from_schedule(setup.graph, r.schedule)))
            except SolverError as e:
                log.info("hybrid-milp: the %s plan does not map to the model: %s", name, e)
        return cands, hints, None

    @staticmethod
    def _hint(model: HybridModel, pool: list, hybrid_hints: list, extras: dict):
        """The cheapest plan that is a solution of ``model``, as a full vector
        (``hybrid_hints``: libra's hybrid plans on the model's variables,
        :meth:`_libra_hybrid`)."""
        g = model.graph
        tries = []
        for name, (S, IN, A, B, OFF) in hybrid_hints:
            R = solve_r_opt(g, S, arrived=A, present=B)
            if not (R & ~g.recomputable[None, :] & ~np.eye(g.n, dtype=bool)).any():
                tries.append((name, R, S, IN, A, B, OFF))
        S, IN, A, B, OFF = swap_on_demand(g)
        tries.append(("swap on demand", solve_r_opt(g, S, arrived=A, present=B), S, IN, A, B, OFF))
        no_swap = np.zeros((g.n, g.nv), dtype=bool)
        for c in sorted((c for c in pool if c.R is not None), key=lambda c: c.time_s):
            tries.append((c.name, c.R, c.S, no_swap, no_swap, no_swap, np.zeros(g.nv, dtype=bool)))
        best = None
        for name, R, S, IN, A, B, OFF in tries:
            fitted = model.fitted_assignment(R, S, IN, A, B, OFF)
            xv = None if fitted is None else fitted[0]
            if xv is None or not model.satisfies(xv):
                log.debug("hybrid-milp: the %s plan is not a solution of the model", name)
                continue
            value = float(model.obj @ xv)
            if best is None or value < best[0]:
                best = (value, name, xv)
        if best is None:
            return None
        extras["warm_start"] = best[1]
        return best[2]

    def _candidate(self, setup: CheckmateSetup, model: HybridModel, x: np.ndarray) -> Candidate:
        g = setup.graph
        _, S, IN, A, B, OFF = model.decode_hybrid(x)
        R = solve_r_opt(g, S, arrived=A, present=B)
        if (R & ~g.recomputable[None, :] & ~np.eye(g.n, dtype=bool)).any():
            raise SolverError("hybrid-milp: the MILP's checkpoints recompute a non-recomputable node; this is a bug")
        sched = schedule_from_rs(g, R, S, swap_in=IN, arrive=A, swap_out=OFF, swap_now=B,
                                 meta={"solver": self.name, "swap_ins": int(IN.sum() + B.sum()),
                                       "swap_outs": int(OFF.sum())})
        from libra_opt.passes.simulator import simulate

        sim = simulate(setup.original, sched)
        return Candidate("milp", R, S, sched, sim.peak_bytes, sim.time_s)

    def _window_candidate(self, setup: CheckmateSetup, model: HybridModel, x: np.ndarray) -> Candidate:
        """The plan of a window's solution (:meth:`_candidate`), named
        ``"milp (windows)"``, without ``R`` / ``S`` (it swaps: not a
        recompute-only start for :meth:`_hint`)."""
        c = self._candidate(setup, model, x)
        return dataclasses.replace(c, name="milp (windows)", R=None, S=None)

    def _infeasible_error(self, setup: CheckmateSetup, budget_bytes: int, pool: list, libra_min: list,
                          detail: str) -> InfeasibleBudgetError:
        err = setup.infeasible(budget_bytes, pool, detail)
        best = [b for b in [err.min_feasible_bytes, *libra_min] if b is not None and b > budget_bytes]
        return InfeasibleBudgetError(budget_bytes, min(best) if best else None, self.name, detail)


def _covers(setup: CheckmateSetup, model: HybridModel, budget_bytes: int, own=None):
    """The ``covers`` test of the MILP bound
    (:func:`~libra_opt.solvers.certificates.model_covers`): a plan is covered
    when it maps onto a solution of ``model``
    (:func:`~libra_opt.solvers.hybrid_model.hybrid_from_schedule`, then
    :meth:`HybridModel.fitted_assignment`: the copies in share the queue
    earliest-deadline-first, and one the model would charge over the budget
    is issued later) whose objective is at most the plan's simulated
    time; the model's optimum, and so its bound, is then at most that time.
    Plans the model cannot express (a swap-in waited for inside a stage, a
    second swap-out, ...) are not covered: the bound says nothing of them.
    ``own``: ``(schedule, objective_s)`` of the MILP's own solution, a point of
    the model by construction."""
    g = setup.graph

    def image(schedule):
        if own is not None and schedule is own[0] and own[1] is not None:
            return float(own[1]), int(budget_bytes)
        try:
            S, IN, A, B, OFF = hybrid_from_schedule(g, schedule)
        except SolverError:
            return None
        R = solve_r_opt(g, S, arrived=A, present=B)
        fitted = model.fitted_assignment(R, S, IN, A, B, OFF)
        if fitted is None or not model.satisfies(fitted[0]):
            return None
        xv = fitted[0]
        return model.objective_seconds(float(model.obj @ xv)), int(budget_bytes)   # within the model's budget

    return model_covers(setup.original, budget_bytes, image)
