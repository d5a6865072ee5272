"""The :class:`Solver` base class every solver derives from.

Shape taken from cvxpy's solver plug-ins: a name, the modules it ``requires``
(checked with :func:`importlib.util.find_spec` before anything is imported),
a ``citation``, and an ``Options`` dataclass whose fields carry their units
(``_bytes``, ``_s``).  :meth:`Solver.solve` does the shared work: budget
parsing, availability, timing, and simulating every plan against the budget
before it is returned.
"""
from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import logging
import math
import time
import warnings
from dataclasses import dataclass
from typing import ClassVar, Sequence

from libra_opt.errors import InfeasibleBudgetError, ScheduleError, SolverError, SolverUnavailableError
from libra_opt.ir.problem import RematProblem
from libra_opt.passes.simulator import simulate
from libra_opt.ir.units import parse_budget

from .certificates import Bound, best_bound
from .result import FEASIBLE, INFEASIBLE, RawSolution, SolveResult

log = logging.getLogger("libra_opt.solvers")


class UnknownOptionWarning(UserWarning):
    """An option the solver does not know was passed; it is ignored."""


@dataclass(frozen=True)
class NoOptions:
    """A solver without options."""


class Solver:
    """Base class of every solver.

    Subclasses set :attr:`name`, :attr:`citation`, optionally :attr:`requires`
    and :attr:`Options`, and implement :meth:`_solve`.  Construct with keyword
    options; unknown ones warn (:class:`UnknownOptionWarning`) and are dropped.

    Raises
    ------
    TypeError
        An option of the wrong type (from the ``Options`` dataclass).
    """

    name: ClassVar[str] = ""
    #: the plan class (``"recompute"`` / ``"hybrid"``) an untagged
    #: ``RawSolution.lower_bound_s`` bounds; None: untagged bounds are dropped
    #: (report :class:`~libra_opt.solvers.certificates.Bound` objects instead)
    bound_kind: ClassVar[str | None] = None
    requires: ClassVar[tuple[str, ...]] = ()
    citation: ClassVar[str] = ""
    Options: ClassVar[type] = NoOptions

    def __init__(self, **options):
        known = {f.name for f in dataclasses.fields(self.Options)}
        unknown = sorted(set(options) - known)
        if unknown:
            warnings.warn(f"solver {self.name!r} ignores unknown option(s) {unknown}; it knows {sorted(known)}",
                          UnknownOptionWarning, stacklevel=3)
        self.options = self.Options(**{k: v for k, v in options.items() if k in known})

    # ------------------------------------------------------------ plumbing
    @classmethod
    def missing_modules(cls) -> list[str]:
        """Required modules that are not installed."""
        return [m for m in cls.requires if importlib.util.find_spec(m) is None]

    @classmethod
    def is_available(cls) -> bool:
        """True when every required module is installed."""
        return not cls.missing_modules()

    def _check_available(self) -> None:
        missing = self.missing_modules()
        if missing:
            raise SolverUnavailableError(f"solver {self.name!r} needs {', '.join(missing)}, which is not "
                                         f"installed: pip install {' '.join(missing)}")

    def _solve(self, problem: RematProblem, budget_bytes: int) -> RawSolution:
        """Find a plan within ``budget_bytes``; raise
        :class:`~libra_opt.errors.InfeasibleBudgetError` if there is none."""
        raise NotImplementedError

    def _finish(self, problem: RematProblem, budget_bytes: int, raw: RawSolution, solve_s: float) -> SolveResult:
        sim = raw.simulation
        try:
            if sim is None or sim.peak_bytes > budget_bytes:
                sim = simulate(problem, raw.schedule, budget=budget_bytes)
        except ScheduleError as e:
            raise SolverError(f"solver {self.name!r} produced a plan the simulator rejects: {e}. "
                              f"This is a bug in the solver; please report it") from e
        meta = dict(raw.schedule.meta)
        meta.setdefault("solver", self.name)
        meta["budget_bytes"] = int(budget_bytes)
        raw.schedule.meta = meta
        bounds = self._bounds(raw, budget_bytes)
        cert = best_bound(problem, budget_bytes, raw.schedule, bounds, simulation=sim)
        extras = dict(raw.extras)
        if cert.invalid:
            extras["invalid_bounds"] = [why for _, why in cert.invalid]
        return SolveResult(status=raw.status, schedule=raw.schedule, solver=self.name, budget_bytes=budget_bytes,
                           peak_bytes=sim.peak_bytes, time_s=sim.time_s, added_s=sim.added_s,
                           lower_bound_s=cert.lower_bound_s, gap=cert.gap, bound_kind=cert.kind,
                           bound_source=None if cert.bound is None else cert.bound.source, solve_s=solve_s,
                           message=raw.message, simulation=sim, extras=extras, bounds=bounds)

    def _bounds(self, raw: RawSolution, budget_bytes: int) -> tuple:
        """The solver's bounds: ``raw.bounds`` plus an untagged
        ``raw.lower_bound_s`` tagged with :attr:`bound_kind` (dropped with a
        warning when the class sets none)."""
        bounds = tuple(raw.bounds)
        lb = raw.lower_bound_s
        if lb is not None and math.isfinite(lb):
            if self.bound_kind is None:
                log.warning("solver %s reports lower_bound_s=%r without a plan class: it is not used; set "
                            "%s.bound_kind or return certificates.Bound objects", self.name, lb, type(self).__name__)
            else:
                bounds += (Bound(float(lb), self.bound_kind, self.name, int(budget_bytes)),)
        return bounds

    def _infeasible(self, budget_bytes: int, err: InfeasibleBudgetError, solve_s: float) -> SolveResult:
        return SolveResult(status=INFEASIBLE, schedule=None, solver=self.name, budget_bytes=budget_bytes,
                           solve_s=solve_s, message=str(err), min_feasible_bytes=err.min_feasible_bytes)

    # -------------------------------------------------------------- public
    def solve(self, problem: RematProblem, budget, *, raise_on_infeasible: bool = True) -> SolveResult:
        """Plan ``problem`` within ``budget``.

        Parameters
        ----------
        problem : RematProblem
        budget : int or float or str
            Bytes, ``"12GiB"``, ``"60%"`` or a float fraction of the no-remat peak.
        raise_on_infeasible : bool
            If False, an infeasible budget gives a result with status
            ``"infeasible"`` instead of raising.

        Returns
        -------
        SolveResult
            Its schedule was accepted by the simulator within the budget.

        Raises
        ------
        InfeasibleBudgetError
            No plan found within the budget; states the smallest feasible one found.
        SolverUnavailableError
            A required backend is not installed.
        SolverError
            The solver failed; an internal error (a bug) is wrapped in one
            that names the solver, chained to the original.
        """
        from libra_opt.passes.simulator import no_remat_peak

        self._check_available()
        budget_bytes = parse_budget(budget, no_remat_peak(problem))
        t0 = time.perf_counter()
        with self.internal_errors(problem, budget_bytes):
            try:
                raw = self._solve(problem, budget_bytes)
            except InfeasibleBudgetError as e:
                if raise_on_infeasible:
                    raise
                return self._infeasible(budget_bytes, e, time.perf_counter() - t0)
            solve_s = time.perf_counter() - t0
            log.info("solver %s: %s in %.3f s", self.name, raw.status, solve_s)
            return self._finish(problem, budget_bytes, raw, solve_s)

    @contextlib.contextmanager
    def internal_errors(self, problem: RematProblem, budget_bytes: int | None = None):
        """Turn a stray internal error of the solver inside the ``with`` block
        into a :class:`~libra_opt.errors.SolverError` naming the solver, the
        problem and the budget, chained to the original (``raise ... from``).
        :class:`~libra_opt.errors.InfeasibleBudgetError`,
        :class:`~libra_opt.errors.SolverError` (and its subclasses),
        ``MemoryError`` and non-``Exception`` signals (``KeyboardInterrupt``)
        pass through unchanged."""
        try:
            yield
        except (InfeasibleBudgetError, SolverError, MemoryError):
            raise
        except Exception as e:
            at = "" if budget_bytes is None else f" at a budget of {budget_bytes} bytes"
            raise SolverError(f"solver {self.name!r} failed on problem {problem.name!r}{at} with an internal "
                              f"error ({type(e).__name__}: {e}). This is a bug in the solver; please report it "
                              f"with the problem file and the budget") from e

    def solve_many(self, problem: RematProblem, budgets: Sequence, *, raise_on_infeasible: bool = False
                   ) -> list[SolveResult]:
        """One result per budget, in the order given.  The default solves each
        budget on its own; solvers that can plan many budgets at once (``libra``)
        override it.  Infeasible budgets give ``"infeasible"`` results unless
        ``raise_on_infeasible``."""
        return [self.solve(problem, b, raise_on_infeasible=raise_on_infeasible) for b in budgets]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.options})"


__all__ = ["Solver", "NoOptions", "UnknownOptionWarning", "RawSolution", "SolveResult", "FEASIBLE"]
