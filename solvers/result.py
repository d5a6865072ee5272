"""One frozen result type for every solver (like ``scipy.optimize.OptimizeResult``)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from libra_opt.ir.schedule import Schedule
    from libra_opt.passes.simulator import SimulationResult

#: proven optimal (within the solver's gap) among the plans of the solver's model; for Checkmate's
#: MILP that is not every plan the simulator accepts (``gap`` / ``bound_kind`` say what is proven)
OPTIMAL = "optimal"
FEASIBLE = "feasible"      #: a plan within budget, optimality not proven
INFEASIBLE = "infeasible"  #: no plan within budget (only with ``raise_on_infeasible=False``)
TIME_LIMIT = "time_limit"  #: stopped at the time limit with a plan
STATUSES = (OPTIMAL, FEASIBLE, INFEASIBLE, TIME_LIMIT)


@dataclass(frozen=True)
class SolveResult:
    """What :func:`libra_opt.solve` returns.

    Attributes
    ----------
    status : {"optimal", "feasible", "infeasible", "time_limit"}
    schedule : Schedule or None
        ``None`` only when ``status == "infeasible"``.
    solver : str
    budget_bytes : int
        The budget asked for (graph memory, bytes).
    peak_bytes : int or None
        Simulated peak graph memory of ``schedule`` (bytes), always <= budget.
    time_s : float or None
        Simulated step time (s).
    added_s : float or None
        Simulated step time minus the no-remat step time (s): the cost of the plan.
    lower_bound_s : float or None
        The largest of the solver's ``bounds`` that is valid for this plan
        (:func:`~libra_opt.solvers.certificates.best_bound`: the plan is in
        the bound's class, within its budget, and covered by its model), s.
        None: "bound unknown" (no bound, or none valid for this plan, e.g. a
        recompute-only bound and a plan that swaps, or a coarsened model's).
    gap : float or None
        ``(time_s - lower_bound_s) / lower_bound_s``
        (:func:`~libra_opt.solvers.certificates.gap`), never negative: the
        plan is at most this much slower than the best plan of the class
        ``bound_kind``.  0: proven optimal in that class.  None with no bound.
    bound_kind : {"recompute", "hybrid"} or None
        The class of plans ``lower_bound_s`` bounds: plans without swap
        instructions, or every keep / recompute / swap plan.
    bound_source : str or None
        Who proved ``lower_bound_s`` (e.g. ``"checkmate-milp (MILP bound)"``).
    solve_s : float
        Wall-clock seconds spent solving (not simulating).
    message : str
    min_feasible_bytes : int or None
        For an infeasible result: the smallest budget the solver found a plan for.
    simulation : SimulationResult or None
    extras : dict
        Solver-specific details (e.g. ``lp_value``, ``threshold``, ``decisions``).
    bounds : tuple of Bound
        Every lower bound the solver proved at this budget, tagged with its
        plan class (:class:`~libra_opt.solvers.certificates.Bound`), also
        those not valid for this plan: :func:`libra_opt.compare.compare`
        applies them to the other solvers' plans.
    """

    status: str
    schedule: "Schedule | None"
    solver: str
    budget_bytes: int
    peak_bytes: int | None = None
    time_s: float | None = None
    added_s: float | None = None
    lower_bound_s: float | None = None
    gap: float | None = None
    bound_kind: str | None = None
    bound_source: str | None = None
    solve_s: float = 0.0
    message: str = ""
    min_feasible_bytes: int | None = None
    simulation: "SimulationResult | None" = field(default=None, repr=False)
    bounds: tuple = field(default=(), repr=False)
    extras: dict = field(default_factory=dict, repr=False)

    @property
    def success(self) -> bool:
        """True when a plan within budget was found."""
        return self.schedule is not None


@dataclass(frozen=True)
class RawSolution:
    """What a solver's ``_solve`` hands back to :meth:`Solver.solve` before
    validation: a schedule, a status, and optional bounds and extras.

    ``bounds`` are :class:`~libra_opt.solvers.certificates.Bound` objects
    (value, plan class, budget, source).  ``lower_bound_s`` is an untagged
    bound: it is used only if the solver class sets ``bound_kind`` (the plan
    class it bounds), else dropped with a warning.

    ``simulation`` may carry a simulation of exactly ``schedule`` that the
    solver already ran; the base class then checks its peak against the
    budget instead of simulating the plan a second time."""

    schedule: "Schedule"
    status: str = FEASIBLE
    lower_bound_s: float | None = None
    message: str = ""
    extras: dict = field(default_factory=dict)
    simulation: "SimulationResult | None" = field(default=None, repr=False)
    bounds: tuple = ()
