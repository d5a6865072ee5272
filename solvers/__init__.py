"""Solvers: one interface, selected by name (``libra_opt.solve(..., solver=NAME)``).

See :mod:`libra_opt.solvers.registry` for the registry and
:mod:`libra_opt.solvers.base` for the :class:`Solver` base class.
"""
from .base import NoOptions, Solver, UnknownOptionWarning
from .certificates import Bound, InvalidBoundWarning, best_bound
from .registry import BUILTIN_SOLVERS, available_solvers, get_solver, register_solver, solver_class
from .result import FEASIBLE, INFEASIBLE, OPTIMAL, STATUSES, TIME_LIMIT, RawSolution, SolveResult


def solve(problem, budget, solver="libra", *, raise_on_infeasible: bool = True, **options) -> SolveResult:
    """Plan ``problem`` within ``budget`` with ``solver``.

    Parameters
    ----------
    problem : RematProblem
    budget : int or float or str
        Bytes, ``"12GiB"``, ``"60%"``, or a float fraction of the no-remat peak.
    solver : str or Solver or type
        A registered name (see :func:`available_solvers`), a Solver class or instance.
    raise_on_infeasible : bool
    **options
        The solver's options (its ``Options`` dataclass); unknown ones warn.

    Returns
    -------
    SolveResult

    Raises
    ------
    SolverNotFoundError, InfeasibleBudgetError, SolverUnavailableError
    """
    return get_solver(solver, **options).solve(problem, budget, raise_on_infeasible=raise_on_infeasible)


def solve_many(problem, budgets, solver="libra", *, raise_on_infeasible: bool = False, **options):
    """One :class:`SolveResult` per budget (``libra`` plans them in one descent)."""
    return get_solver(solver, **options).solve_many(problem, budgets, raise_on_infeasible=raise_on_infeasible)


__all__ = ["Solver", "NoOptions", "UnknownOptionWarning", "SolveResult", "RawSolution", "solve", "solve_many",
           "register_solver", "get_solver", "solver_class", "available_solvers", "BUILTIN_SOLVERS",
           "OPTIMAL", "FEASIBLE", "INFEASIBLE", "TIME_LIMIT", "STATUSES", "Bound", "InvalidBoundWarning", "best_bound"]
