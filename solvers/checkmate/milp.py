"""``checkmate-milp``: Checkmate's optimal rematerialization MILP.

Source: Jain et al., *Checkmate: Breaking the Memory Wall with Optimal Tensor
Rematerialization*, MLSys 2020, section 4 (MILP over ``R``, ``S``, ``FREE``,
``U`` with frontier-advancing stages).  The formulation is in
:mod:`libra_opt.solvers.checkmate_model`, the plan read off ``(R, S)`` in
:mod:`libra_opt.solvers.checkmate_plan`.  As in the reference implementation
(``parasj/checkmate``, ``strategy_optimal_ilp.py``), ``R`` is re-derived from
the solution's ``S`` with ``solve_r_opt``, which removes spurious
recomputations.

Backends: OR-Tools with SCIP, fed the model's CSR matrix in one
call (``model_builder_helper.ModelBuilderHelper.fill_model_from_sparse_data``,
OR-Tools' vectorised model builder) with the starting solution as hints
(``add_hint``); OR-Tools' CBC through ``pywraplp`` (one coefficient per
call); or PuLP with CBC.  Ctrl-C during a solve raises ``KeyboardInterrupt``
(never a plan from an interrupted solve): OR-Tools runs in a worker thread
and is stopped with ``interrupt_solve`` / ``InterruptSolve``
(:func:`run_interruptibly`); PuLP's CBC child process is killed and its
temporary files removed (:func:`run_pulp`).

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
import os
import re
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from libra_opt.errors import SolverError, SolverOptionError

from ..base import Solver
from .model import CheckmateModel, model_peak_bytes
from ..certificates import checkmate_bounds
from .plan import CheckmateSetup, no_remat_solution, rs_from_s
from ..registry import register_solver
from ..result import FEASIBLE, OPTIMAL, TIME_LIMIT, RawSolution

log = logging.getLogger(__name__)

BACKENDS = ("ortools", "pulp")
ORTOOLS_SOLVERS = ("auto", "SCIP", "CBC")


@dataclass(frozen=True)
class MIPOptions:
    """Options every MILP solver here takes (``checkmate-milp``,
    ``hybrid-milp``), checked by :func:`check_mip_options`; each solver's
    options subclass this and say what ``warm_start`` and ``libra_hint``
    give it.

    Attributes
    ----------
    backend : {"ortools", "pulp"}
        ``"ortools"``: OR-Tools ``pywraplp``; ``"pulp"``: PuLP with its CBC.
    ortools_solver : {"auto", "SCIP", "CBC"}
        The MIP engine behind OR-Tools; ``"auto"`` takes SCIP if built in,
        else CBC.  (OR-Tools 9.15's HiGHS interface crashes when given a
        starting solution, so it is not offered.)
    time_limit_s : float
        Wall-clock limit of the whole solve (starting plans included; the
        MILP itself gets what is left, at least 1 s), seconds.
    mip_gap : float
        Relative optimality gap at which the solve stops (0.0001 = 0.01 %).
    warm_start : bool
        Give the MILP a starting solution.
    libra_hint : bool
        Run libra at the budget first for a starting solution and a fallback plan.
    threads : int or None
        Solver threads; None for the backend's default.
    verbose : bool
        Let the backend print its log.
    """

    backend: str = "ortools"
    ortools_solver: str = "auto"
    time_limit_s: float = 60.0
    mip_gap: float = 1e-4
    warm_start: bool = True
    libra_hint: bool = True
    threads: int | None = None
    verbose: bool = False


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


def check_mip_options(o, solver: str) -> None:
    """Check the options a MILP solver shares with ``checkmate-milp``
    (``backend``, ``ortools_solver``, ``time_limit_s``, ``mip_gap``,
    ``threads``) and that the backend's package is installed.

    Raises
    ------
    SolverOptionError
        An option out of range; the message names it and the valid values.
    SolverUnavailableError
        The backend's package (``ortools`` or ``pulp``) is not installed.
    """
    if o.backend not in BACKENDS:
        raise SolverOptionError(f"{solver}: unknown backend {o.backend!r}; use one of {BACKENDS}")
    if o.ortools_solver not in ORTOOLS_SOLVERS:
        raise SolverOptionError(f"{solver}: unknown ortools_solver {o.ortools_solver!r}; use one of "
                                f"{ORTOOLS_SOLVERS}")
    if not o.time_limit_s > 0:
        raise SolverOptionError(f"{solver}: time_limit_s must be positive, got {o.time_limit_s}")
    if not 0 <= o.mip_gap < 1:
        raise SolverOptionError(f"{solver}: mip_gap must be in [0, 1), got {o.mip_gap}")
    if o.threads is not None and o.threads < 1:
        raise SolverOptionError(f"{solver}: threads must be a positive integer or None, got {o.threads}")
    mod = "ortools" if o.backend == "ortools" else "pulp"
    import importlib.util

    if importlib.util.find_spec(mod) is None:
        from libra_opt.errors import SolverUnavailableError

        raise SolverUnavailableError(f"{solver} backend {o.backend!r} needs {mod}, which is not "
                                     f"installed: pip install {mod}")


@dataclass
class _MipResult:
    x: np.ndarray | None
    status: str          # "optimal", "feasible", "infeasible", "no_solution"
    objective: float | None
    bound: float | None
    hit_time_limit: bool
    engine: str


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
    (:func:`~libra_opt.solvers.certificates.checkmate_covers`: the model fixes
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
                res = _MipResult(None, "infeasible", None, None, False, "bounds")
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
            if o.backend == "ortools":
                res = _solve_ortools(model, hint, left, o)
            else:
                res = _solve_pulp(model, hint, left, o)
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
            res = _MipResult(None, "no_solution", None, None, False, res.engine)

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


# ---------------------------------------------------------------------------
# backends
# ---------------------------------------------------------------------------
def _solve_ortools(model: CheckmateModel, hint, time_limit_s: float, o: CheckmateMILPOptions) -> _MipResult:
    """Solve ``model`` with OR-Tools: SCIP through the vectorised model
    builder (:func:`_solve_model_builder`), else CBC through ``pywraplp``."""
    from ortools.linear_solver.python import model_builder_helper as mbh

    if o.ortools_solver != "CBC" and mbh.ModelSolverHelper("scip").solver_is_supported():
        return _solve_model_builder(model, hint, time_limit_s, o)
    if o.ortools_solver == "SCIP":
        from libra_opt.errors import SolverUnavailableError

        raise SolverUnavailableError("OR-Tools was built without SCIP; use ortools_solver='CBC' or backend='pulp'")
    return _solve_pywraplp(model, hint, time_limit_s, o)


def _solve_model_builder(model: CheckmateModel, hint, time_limit_s: float, o: CheckmateMILPOptions) -> _MipResult:
    """Solve ``model`` with OR-Tools' model builder: bounds, objective and the
    CSR constraint matrix in one call
    (``ModelBuilderHelper.fill_model_from_sparse_data``), the starting
    solution as hints (``add_hint``), then ``ModelSolverHelper`` with SCIP.
    The result carries the solver's best bound
    (``best_objective_bound``) also when it stops without a solution.

    Parameters
    ----------
    model : CheckmateModel
    hint : ndarray of shape (num_vars,) or None
    time_limit_s : float
        Seconds, from the call (filling the model counts; SCIP gets at least 1 s).
    o : CheckmateMILPOptions
    """
    from ortools.linear_solver.python import model_builder_helper as mbh

    t_build = time.perf_counter()
    helper = mbh.ModelBuilderHelper()
    A = model.A.tocsr().astype(np.float64)
    A.sort_indices()
    helper.fill_model_from_sparse_data(model.lb, model.ub, model.obj, model.row_lb, model.row_ub, A)
    for j in np.flatnonzero(model.integer):
        helper.set_var_integrality(int(j), True)
    if hint is not None:
        for j, v in enumerate(np.asarray(hint, dtype=np.float64).tolist()):
            helper.add_hint(j, v)
    engine = "SCIP"
    solver = mbh.ModelSolverHelper("scip")
    time_limit_s = max(time_limit_s - (time.perf_counter() - t_build), 1.0)  # filling the model counts too
    solver.set_time_limit_in_seconds(float(time_limit_s))
    # SCIP's own SIGINT handler would end the solve quietly with its incumbent: leave Ctrl-C to Python
    params = ["misc/catchctrlc = FALSE", f"limits/gap = {float(o.mip_gap)}"]
    if o.threads is not None:
        params.append(f"parallel/maxnthreads = {int(o.threads)}")
    solver.set_solver_specific_parameters("\n".join(params) + "\n")
    solver.enable_output(bool(o.verbose))
    t0 = time.perf_counter()
    run_interruptibly(lambda: solver.solve(helper), solver.interrupt_solve, f"OR-Tools {engine}")
    took = time.perf_counter() - t0
    hit = took >= 0.98 * time_limit_s
    st = solver.status()
    name = f"ortools-{engine}"
    bound = solver.best_objective_bound() if solver.has_response() else None
    bound = float(bound) if bound is not None and np.isfinite(bound) and abs(bound) < 1e20 else None
    if st in (mbh.SolveStatus.OPTIMAL, mbh.SolveStatus.FEASIBLE) and solver.has_solution():
        x = np.asarray(solver.variable_values(), dtype=np.float64)
        status = "optimal" if st == mbh.SolveStatus.OPTIMAL else "feasible"
        return _MipResult(x, status, float(solver.objective_value()), bound, hit and status != "optimal", name)
    if st == mbh.SolveStatus.INFEASIBLE:
        return _MipResult(None, "infeasible", None, None, False, name)
    return _MipResult(None, "no_solution", None, bound, hit, name)


def _solve_pywraplp(model: CheckmateModel, hint, time_limit_s: float, o: CheckmateMILPOptions) -> _MipResult:
    """Solve ``model`` with OR-Tools ``pywraplp`` (CBC; one coefficient per call)."""
    from ortools.linear_solver import pywraplp

    engine = "CBC"
    solver = pywraplp.Solver.CreateSolver(engine)
    if solver is None:
        from libra_opt.errors import SolverUnavailableError

        raise SolverUnavailableError("OR-Tools was built without SCIP or CBC; use backend='pulp'")
    inf = solver.infinity()
    xs = []
    for j in range(model.num_vars):
        lo, hi = float(model.lb[j]), float(model.ub[j])
        if model.integer[j]:
            xs.append(solver.IntVar(lo, hi, ""))
        else:
            xs.append(solver.NumVar(lo, hi, ""))
    A = model.A
    for r in range(model.num_rows):
        lo = model.row_lb[r]
        hi = model.row_ub[r]
        c = solver.Constraint(-inf if np.isinf(lo) else float(lo), inf if np.isinf(hi) else float(hi))
        for k in range(A.indptr[r], A.indptr[r + 1]):
            c.SetCoefficient(xs[A.indices[k]], float(A.data[k]))
    objective = solver.Objective()
    for j in np.flatnonzero(model.obj):
        objective.SetCoefficient(xs[j], float(model.obj[j]))
    objective.SetMinimization()
    if hint is not None:
        solver.SetHint(xs, [float(v) for v in hint])
    if o.threads is not None:
        solver.SetNumThreads(int(o.threads))
    if o.verbose:
        solver.EnableOutput()
    solver.SetTimeLimit(int(time_limit_s * 1000))
    params = pywraplp.MPSolverParameters()
    params.SetDoubleParam(pywraplp.MPSolverParameters.RELATIVE_MIP_GAP, float(o.mip_gap))
    t0 = time.perf_counter()
    st = run_interruptibly(lambda: solver.Solve(params), solver.InterruptSolve, f"OR-Tools {engine}")
    took = time.perf_counter() - t0
    hit = took >= 0.98 * time_limit_s
    if st in (pywraplp.Solver.OPTIMAL, pywraplp.Solver.FEASIBLE):
        x = np.array([v.solution_value() for v in xs])
        status = "optimal" if st == pywraplp.Solver.OPTIMAL else "feasible"
        bound = objective.BestBound()
        return _MipResult(x, status, objective.Value(), bound if np.isfinite(bound) else None,
                          hit and status != "optimal", f"ortools-{engine}")
    if st == pywraplp.Solver.INFEASIBLE:
        return _MipResult(None, "infeasible", None, None, False, f"ortools-{engine}")
    return _MipResult(None, "no_solution", None, None, hit, f"ortools-{engine}")


def run_interruptibly(solve: Callable[[], Any], interrupt: Callable[[], Any], what: str) -> Any:
    """``solve()`` in a worker thread while the main thread waits, so that
    Ctrl-C (``KeyboardInterrupt``) reaches Python during a long native solve:
    it calls ``interrupt()`` (e.g. ``MPSolver.InterruptSolve``), waits for the
    worker to stop and re-raises; a plan is never made from an interrupted
    solve.  Off the main thread (where no signal arrives) ``solve()`` runs
    directly.  The native solve must release the GIL (OR-Tools'
    ``pywraplp.Solver.Solve`` does).

    Raises
    ------
    KeyboardInterrupt
        Ctrl-C during the solve.
    Any exception of ``solve``
    """
    if threading.current_thread() is not threading.main_thread():
        return solve()
    box: dict[str, Any] = {}

    def work():
        try:
            box["result"] = solve()
        except BaseException as e:  # noqa: BLE001 - handed to the main thread
            box["error"] = e

    worker = threading.Thread(target=work, name=f"libra-opt {what}", daemon=True)
    worker.start()
    try:
        while worker.is_alive():
            worker.join(0.05)
    except KeyboardInterrupt:
        log.warning("interrupted: stopping %s", what)
        interrupt()
        worker.join()
        raise
    if "error" in box:
        raise box["error"]
    return box["result"]


def run_pulp(prob, cmd, tmp_dir: str):
    """``prob.solve(cmd)`` with PuLP's temporary files (``.mps``, ``.mst``,
    ``.sol``) in ``tmp_dir`` (``LpSolver_CMD.tmpDir``), which the caller
    removes; on any exception, Ctrl-C included, the CBC child process that
    PuLP started (a ``subprocess.Popen`` in the failing frames) is killed and
    reaped before the exception propagates, so it never outlives Python.

    Returns
    -------
    int
        PuLP's status.
    """
    cmd.tmpDir = tmp_dir
    try:
        return prob.solve(cmd)
    except BaseException as e:
        tb = e.__traceback__
        while tb is not None:
            for v in list(tb.tb_frame.f_locals.values()):
                if isinstance(v, subprocess.Popen) and v.poll() is None:
                    log.warning("stopping the CBC process %d", v.pid)
                    v.kill()
                    v.wait()
            tb = tb.tb_next
        raise


def _pulp_model(model: CheckmateModel, integral: bool):
    """The model as a ``pulp.LpProblem``; returns ``(problem, variables)``."""
    import pulp

    prob = pulp.LpProblem("checkmate", pulp.LpMinimize)
    xs = []
    add = getattr(prob, "add_variable", None)  # PuLP >= 3.3; LpVariable(...) before
    for j in range(model.num_vars):
        cat = pulp.LpInteger if (integral and model.integer[j]) else pulp.LpContinuous
        lo, hi = float(model.lb[j]), float(model.ub[j])
        xs.append(add(f"x{j}", lo, hi, cat) if add is not None else
                  pulp.LpVariable(f"x{j}", lowBound=lo, upBound=hi, cat=cat))
    nz = np.flatnonzero(model.obj)
    prob += pulp.LpAffineExpression([(xs[j], float(model.obj[j])) for j in nz]), "compute"
    A = model.A
    for r in range(model.num_rows):
        expr = pulp.LpAffineExpression([(xs[A.indices[k]], float(A.data[k]))
                                        for k in range(A.indptr[r], A.indptr[r + 1])])
        lo, hi = model.row_lb[r], model.row_ub[r]
        if lo == hi:
            prob += pulp.LpConstraint(expr, pulp.LpConstraintEQ, f"r{r}", float(lo))
        else:
            if np.isfinite(hi):
                prob += pulp.LpConstraint(expr, pulp.LpConstraintLE, f"r{r}", float(hi))
            if np.isfinite(lo):
                prob += pulp.LpConstraint(expr, pulp.LpConstraintGE, f"r{r}g", float(lo))
    return prob, xs


def cbc_command(**kw):
    """PuLP's bundled CBC (``PULP_CBC_CMD``), without its PuLP-4 deprecation
    warning (the bundled binary is what ``pip install pulp`` provides)."""
    import warnings

    import pulp

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return pulp.PULP_CBC_CMD(**kw)


_CBC_BOUND = re.compile(r"(?:Lower bound|Best possible)\s*:?\s*(-?[0-9.eE+-]+)")


def _solve_pulp(model: CheckmateModel, hint, time_limit_s: float, o: CheckmateMILPOptions) -> _MipResult:
    """Solve ``model`` with PuLP's CBC."""
    import pulp

    prob, xs = _pulp_model(model, integral=True)
    if hint is not None:
        for v, val in zip(xs, hint):
            v.setInitialValue(float(val))
    with tempfile.TemporaryDirectory(prefix="libra_cbc_") as tmp:
        log_path = os.path.join(tmp, "cbc.log")
        kw = dict(msg=bool(o.verbose), timeLimit=float(time_limit_s), gapRel=float(o.mip_gap),
                  warmStart=hint is not None, logPath=log_path)
        if o.threads is not None:
            kw["threads"] = int(o.threads)
        cmd = cbc_command(**kw)
        t0 = time.perf_counter()
        run_pulp(prob, cmd, tmp)
        took = time.perf_counter() - t0
        try:
            with open(log_path) as f:
                text = f.read()
        except OSError:
            text = ""
    hit = took >= 0.98 * time_limit_s or "Stopped on time" in text
    sol = prob.sol_status
    if sol in (pulp.LpSolutionOptimal, pulp.LpSolutionIntegerFeasible):
        x = np.array([v.value() if v.value() is not None else 0.0 for v in xs])
        obj = float(pulp.value(prob.objective) or 0.0)
        m = _CBC_BOUND.findall(text)
        optimal = sol == pulp.LpSolutionOptimal and not hit
        if m:
            bound = float(m[-1])
        elif optimal:  # CBC stops when (obj - bound) <= gap * |obj|
            bound = obj - o.mip_gap * abs(obj)
        else:
            bound = None
        return _MipResult(x, "optimal" if optimal else "feasible", obj, bound, hit and not optimal, "pulp-CBC")
    if prob.status == pulp.LpStatusInfeasible or sol == pulp.LpSolutionInfeasible:
        return _MipResult(None, "infeasible", None, None, False, "pulp-CBC")
    return _MipResult(None, "no_solution", None, None, hit, "pulp-CBC")


__all__ = ["CheckmateMILPSolver", "CheckmateMILPOptions", "MIPOptions"]
