"""The MILP engines of the Checkmate-family solvers, and the options they share.

:class:`MIPOptions` (checked by :func:`check_mip_options`) is what every MILP
solver here takes (``checkmate-milp``: :mod:`.milp`; ``hybrid-milp``:
:mod:`.hybrid_milp`); :func:`solve_mip` solves a model with the backend the
options name and returns a :class:`MipResult`.  The model is a
:class:`~libra_opt.solvers.checkmate.model.CheckmateModel` (or a
:class:`~libra_opt.solvers.checkmate.hybrid_model.HybridModel`): bounds,
objective, integrality and a sparse constraint matrix with row bounds.

Backends: OR-Tools with SCIP, fed the model's CSR matrix in one call
(``model_builder_helper.ModelBuilderHelper.fill_model_from_sparse_data``,
OR-Tools' vectorised model builder) with the starting solution as hints
(``add_hint``); OR-Tools' CBC through ``pywraplp`` (one coefficient per
call); HiGHS through ``highspy`` (:func:`solve_highs`: the CSR matrix in
one ``Highs.passModel`` call, the starting solution through
``Highs.setSolution``); or PuLP with CBC (:func:`pulp_model`, also used by
``checkmate-lp``'s PuLP backend).  Ctrl-C during a solve raises ``KeyboardInterrupt`` (never a
plan from an interrupted solve): OR-Tools runs in a worker thread and is
stopped with ``interrupt_solve`` / ``InterruptSolve``, HiGHS with
``Highs.cancelSolve`` (:func:`run_interruptibly`); PuLP's CBC child process is killed and its
temporary files removed (:func:`run_pulp`).

Sources: OR-Tools' ``model_builder_helper`` and ``pywraplp`` APIs; HiGHS's
Python interface ``highspy`` (``Highs.passModel``, ``setSolution``,
``getInfo().mip_dual_bound``); PuLP's ``LpProblem`` and ``PULP_CBC_CMD``.
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

from libra_opt.errors import SolverOptionError

from .model import CheckmateModel

log = logging.getLogger(__name__)

__all__ = ["BACKENDS", "ORTOOLS_SOLVERS", "MIPOptions", "check_mip_options", "MipResult", "solve_mip",
           "solve_ortools", "solve_highs", "solve_pulp", "pulp_model", "run_pulp", "run_interruptibly", "cbc_command"]

BACKENDS = ("ortools", "highs", "pulp")
ORTOOLS_SOLVERS = ("auto", "SCIP", "CBC")


@dataclass(frozen=True)
class MIPOptions:
    """Options every MILP solver here takes (``checkmate-milp``,
    ``hybrid-milp``), checked by :func:`check_mip_options`; each solver's
    options subclass this and say what ``warm_start`` and ``libra_hint``
    give it.

    Attributes
    ----------
    backend : {"ortools", "highs", "pulp"}
        ``"ortools"``: OR-Tools (SCIP or CBC, ``ortools_solver``);
        ``"highs"``: HiGHS through ``highspy`` (``pip install
        libra-opt[highs]``); ``"pulp"``: PuLP with its CBC.
    ortools_solver : {"auto", "SCIP", "CBC"}
        The MIP engine behind OR-Tools; ``"auto"`` takes SCIP if built in,
        else CBC.  (OR-Tools 9.15's HiGHS interface crashes when given a
        starting solution, so it is offered as ``backend="highs"``
        through ``highspy`` instead.)
    time_limit_s : float
        Wall-clock limit of the whole solve (starting plans included; the
        MILP itself gets what is left, at least 1 s), seconds.  HiGHS may
        overrun it: some of its phases check neither its time limit nor
        the cancellation sent 5 s after it (ERGO-Code/HiGHS#885, #2226; a
        100-node hybrid model ran 1,002 s at 600).
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


#: the package each backend imports
BACKEND_MODULES = {"ortools": "ortools", "highs": "highspy", "pulp": "pulp"}


def _missing_backend(solver: str, backend: str):
    """The ``SolverUnavailableError`` for a backend whose package is not
    installed, saying how to install it (and, for the others, that
    ``backend="ortools"`` is the default one)."""
    from libra_opt.errors import SolverUnavailableError

    mod = BACKEND_MODULES[backend]
    hint = "pip install 'libra-opt[highs]' (or pip install highspy)" if mod == "highspy" else f"pip install {mod}"
    other = "" if backend == "ortools" else ", or use backend='ortools'"
    return SolverUnavailableError(f"{solver} backend {backend!r} needs {mod}, which is not installed: {hint}{other}")


def check_mip_options(o, solver: str) -> None:
    """Check the options a MILP solver shares with ``checkmate-milp``
    (``backend``, ``ortools_solver``, ``time_limit_s``, ``mip_gap``,
    ``threads``) and that the backend's package is installed.

    Raises
    ------
    SolverOptionError
        An option out of range; the message names it and the valid values.
    SolverUnavailableError
        The backend's package (``ortools``, ``highspy`` or ``pulp``) is not
        installed.
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
    import importlib.util

    if importlib.util.find_spec(BACKEND_MODULES[o.backend]) is None:
        raise _missing_backend(solver, o.backend)


@dataclass
class MipResult:
    """What one MILP solve ended with.

    Attributes
    ----------
    x : ndarray of shape (num_vars,) or None
        The incumbent's variable values (the model's column order), None without a solution.
    status : {"optimal", "feasible", "infeasible", "no_solution"}
        ``"optimal"``: proven within ``mip_gap``; ``"feasible"``: a solution without that proof.
    objective : float or None
        The incumbent's objective, in the model's scaled units (the caller multiplies by
        ``model.time_scale`` for seconds).
    bound : float or None
        The solver's best bound (same units), where it reports one.
    hit_time_limit : bool
        The solve stopped at its time limit.
    engine : str
        ``"ortools-SCIP"``, ``"ortools-CBC"``, ``"highs"``, ``"pulp-CBC"`` (or ``"bounds"`` when the caller
        found the model infeasible before any solve).
    """

    x: np.ndarray | None
    status: str          # "optimal", "feasible", "infeasible", "no_solution"
    objective: float | None
    bound: float | None
    hit_time_limit: bool
    engine: str


def solve_mip(model: CheckmateModel, hint, time_limit_s: float, o: MIPOptions) -> MipResult:
    """Solve ``model`` with the backend ``o.backend`` names: :func:`solve_ortools`
    (``"ortools"``), :func:`solve_highs` (``"highs"``) or :func:`solve_pulp`
    (``"pulp"``).

    Parameters
    ----------
    model : CheckmateModel or HybridModel
        Bounds ``lb``/``ub``, objective ``obj``, ``integer`` mask, CSR matrix ``A`` with
        ``row_lb``/``row_ub`` (shapes ``(num_vars,)`` and ``(num_rows, num_vars)``).
    hint : ndarray of shape (num_vars,) or None
        A starting solution.
    time_limit_s : float
        Seconds the solve may take.
    o : MIPOptions
        ``backend``, ``ortools_solver``, ``mip_gap``, ``threads``, ``verbose``.

    Raises
    ------
    SolverUnavailableError
        OR-Tools was built without the engine asked for, or ``highspy`` is
        missing for ``backend="highs"``.
    KeyboardInterrupt
        Ctrl-C during the solve (the native solve is stopped first).
    """
    if o.backend == "ortools":
        return solve_ortools(model, hint, time_limit_s, o)
    if o.backend == "highs":
        return solve_highs(model, hint, time_limit_s, o)
    return solve_pulp(model, hint, time_limit_s, o)


def solve_ortools(model: CheckmateModel, hint, time_limit_s: float, o: MIPOptions) -> MipResult:
    """Solve ``model`` with OR-Tools: SCIP through the vectorised model
    builder (:func:`_solve_model_builder`), else CBC through ``pywraplp``
    (``o.ortools_solver``: ``"auto"`` takes SCIP when it is built in).
    Parameters and errors as :func:`solve_mip`."""
    from ortools.linear_solver.python import model_builder_helper as mbh

    if o.ortools_solver != "CBC" and mbh.ModelSolverHelper("scip").solver_is_supported():
        return _solve_model_builder(model, hint, time_limit_s, o)
    if o.ortools_solver == "SCIP":
        from libra_opt.errors import SolverUnavailableError

        raise SolverUnavailableError("OR-Tools was built without SCIP; use ortools_solver='CBC' or backend='pulp'")
    return _solve_pywraplp(model, hint, time_limit_s, o)


def _solve_model_builder(model: CheckmateModel, hint, time_limit_s: float, o: MIPOptions) -> MipResult:
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
    o : MIPOptions
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
        return MipResult(x, status, float(solver.objective_value()), bound, hit and status != "optimal", name)
    if st == mbh.SolveStatus.INFEASIBLE:
        return MipResult(None, "infeasible", None, None, False, name)
    return MipResult(None, "no_solution", None, bound, hit, name)


def solve_highs(model: CheckmateModel, hint, time_limit_s: float, o: MIPOptions) -> MipResult:
    """Solve ``model`` with HiGHS (``highspy``): bounds, objective,
    integrality and the CSR matrix in one ``Highs.passModel`` call, the
    starting solution through ``Highs.setSolution`` (HiGHS checks it and
    keeps it as its incumbent when it is feasible), ``time_limit``,
    ``mip_rel_gap`` and ``threads`` as options.  The bound is
    ``getInfo().mip_dual_bound``, also when the solve stops without a
    solution.  Parameters and errors as :func:`solve_mip`.

    Raises
    ------
    SolverUnavailableError
        ``highspy`` is not installed (``pip install 'libra-opt[highs]'``).
    """
    try:
        import highspy
    except ImportError as e:
        raise _missing_backend("the MILP", "highs") from e
    t_build = time.perf_counter()
    h = highspy.Highs()
    h.setOptionValue("output_flag", bool(o.verbose))
    A = model.A.tocsr().astype(np.float64)
    A.sort_indices()
    inf = h.getInfinity()

    def big(v):        # infinite bounds as HiGHS's infinity
        v = np.array(v, dtype=np.float64)
        v[np.isposinf(v)] = inf
        v[np.isneginf(v)] = -inf
        return v

    integrality = model.integer.astype(np.int32)      # HighsVarType: 0 continuous, 1 integer
    h.passModel(int(model.num_vars), int(model.num_rows), int(A.nnz), 2, 1, 0.0,   # row-wise matrix, minimise
                np.asarray(model.obj, dtype=np.float64), big(model.lb), big(model.ub),
                big(model.row_lb), big(model.row_ub), A.indptr.astype(np.int32), A.indices.astype(np.int32),
                A.data, integrality)
    if hint is not None:
        sol = highspy.HighsSolution()
        sol.col_value = np.asarray(hint, dtype=np.float64).tolist()
        sol.value_valid = True
        h.setSolution(sol)
    time_limit_s = max(time_limit_s - (time.perf_counter() - t_build), 1.0)  # filling the model counts too
    h.setOptionValue("time_limit", float(time_limit_s))
    h.setOptionValue("mip_rel_gap", float(o.mip_gap))
    if o.threads is not None:
        h.setOptionValue("threads", int(o.threads))
    t0 = time.perf_counter()
    # HiGHS checks its time limit between phases only (a root cut loop of a 60k-column model overran a
    # 240 s limit by minutes): a timer asks it to stop 5 s after the limit.  Some phases check neither
    # (ERGO-Code/HiGHS#885, #2226): random_layered_n100, copy ratio 4, 0.7 of the peak ran 1,002 s at 600
    watchdog = threading.Timer(time_limit_s + 5.0, h.cancelSolve)
    watchdog.daemon = True
    watchdog.start()
    try:
        run_interruptibly(h.run, h.cancelSolve, "HiGHS")
    finally:
        watchdog.cancel()
    took = time.perf_counter() - t0
    ms = h.getModelStatus()
    info = h.getInfo()
    S = highspy.HighsModelStatus
    hit = ms in (S.kTimeLimit, S.kInterrupt) or took >= 0.98 * time_limit_s
    bound = float(info.mip_dual_bound)
    bound = bound if np.isfinite(bound) and abs(bound) < 1e20 else None
    if ms == S.kInfeasible:
        return MipResult(None, "infeasible", None, None, False, "highs")
    if info.primal_solution_status == 2:     # kSolutionStatusFeasible
        x = np.asarray(h.getSolution().col_value, dtype=np.float64)
        optimal = ms == S.kOptimal
        return MipResult(x, "optimal" if optimal else "feasible", float(info.objective_function_value), bound,
                         hit and not optimal, "highs")
    return MipResult(None, "no_solution", None, bound, hit, "highs")


def _solve_pywraplp(model: CheckmateModel, hint, time_limit_s: float, o: MIPOptions) -> MipResult:
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
        return MipResult(x, status, objective.Value(), bound if np.isfinite(bound) else None,
                          hit and status != "optimal", f"ortools-{engine}")
    if st == pywraplp.Solver.INFEASIBLE:
        return MipResult(None, "infeasible", None, None, False, f"ortools-{engine}")
    return MipResult(None, "no_solution", None, None, hit, f"ortools-{engine}")


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


def pulp_model(model: CheckmateModel, integral: bool):
    """The model as a ``pulp.LpProblem`` (source: PuLP's ``LpProblem``,
    ``LpAffineExpression``, ``LpConstraint``).

    Parameters
    ----------
    model : CheckmateModel or HybridModel
        As for :func:`solve_mip`.
    integral : bool
        Keep the model's integer variables integer (the MILP); False relaxes
        every variable to continuous (``checkmate-lp``'s LP).

    Returns
    -------
    (pulp.LpProblem, list of pulp.LpVariable)
        The problem (minimise the objective) and its variables, one per
        column of ``model.A`` (named ``x<j>``).
    """
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


def solve_pulp(model: CheckmateModel, hint, time_limit_s: float, o: MIPOptions) -> MipResult:
    """Solve ``model`` with PuLP's CBC (:func:`pulp_model`, :func:`run_pulp`); the
    bound is read off CBC's log.  Parameters and errors as :func:`solve_mip`."""
    import pulp

    prob, xs = pulp_model(model, integral=True)
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
        return MipResult(x, "optimal" if optimal else "feasible", obj, bound, hit and not optimal, "pulp-CBC")
    if prob.status == pulp.LpStatusInfeasible or sol == pulp.LpSolutionInfeasible:
        return MipResult(None, "infeasible", None, None, False, "pulp-CBC")
    return MipResult(None, "no_solution", None, None, hit, "pulp-CBC")
