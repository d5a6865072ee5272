"""Gap certificates: lower bounds tagged with the plans they bound, and the
one definition of a plan's gap.

A solver that proves a lower bound on the step time reports it as a
:class:`Bound`: a value (seconds), the *class* of plans it bounds
(:data:`RECOMPUTE`: plans without swap instructions; :data:`HYBRID`: every
keep / recompute / swap plan), the budget it was proven at, and optionally a
test ``covers(schedule)`` for a model that does not relax the simulator on
every plan of its class.  :func:`best_bound` picks, for one plan, the largest
bound that is valid for it, and :func:`gap` turns it into the gap.  A bound
is valid for a plan when

- the plan belongs to the bound's class (a recompute-only bound is never
  applied to a plan that swaps: swapping can beat it),
- the plan's simulated peak is within the bound's budget (a bound at budget
  ``B`` holds for every budget below ``B`` too: fewer plans fit), and
- the bound's ``covers`` test, if any, accepts the plan (Checkmate's MILP
  excludes some plans the simulator accepts, so its optimum bounds only the
  plans its model can represent or dominate; see
  :func:`~libra_opt.solvers.checkmate.bounds.checkmate_covers`).

A valid bound above the plan's simulated time is a bug in whoever proved it:
:func:`best_bound` warns (:class:`InvalidBoundWarning`) and does not use it,
so no gap is ever negative.  Bounds of a coarsened model are never made into
:class:`Bound` objects (:mod:`libra_opt.solvers.coarsen`: the coarse model
has fewer plans than the original, so its optimum is no bound on it).

Source: the optimality-gap certificate of branch and bound (primal value
against a proven dual bound, as SCIP and CBC report it); Checkmate's LP
relaxation as a bound (Jain et al., MLSys 2020, sec. 5).
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Iterable

if TYPE_CHECKING:  # pragma: no cover
    from libra_opt.ir.problem import RematProblem
    from libra_opt.ir.schedule import Schedule
    from libra_opt.passes.simulator import SimulationResult


RECOMPUTE = "recompute"  #: bounds plans without SwapOut / SwapIn / Wait instructions only
HYBRID = "hybrid"        #: bounds every keep / recompute / swap plan
BOUND_KINDS = (RECOMPUTE, HYBRID)

#: relative slack within which a bound above a plan's time counts as equal
#: (solver tolerances, sums of floats in another order): the gap is then 0.
REL_TOL = 1e-6

__all__ = ["Bound", "Certificate", "InvalidBoundWarning", "RECOMPUTE", "HYBRID", "BOUND_KINDS", "REL_TOL",
           "plan_class", "gap", "best_bound", "compute_floor_s", "floor_bound", "cut_bounds", "with_cut_bounds",
           "model_covers"]


class InvalidBoundWarning(UserWarning):
    """A reported lower bound is above the simulated time of a plan it claims
    to bound: a bug in the solver that proved it.  The bound is not used."""


@dataclass(frozen=True)
class Bound:
    """A proven lower bound on the simulated step time of a class of plans.

    Attributes
    ----------
    value_s : float
        Seconds (the problem's time unit).  Every plan of the class within
        ``budget_bytes`` that ``covers`` accepts takes at least this long in
        the simulator.
    kind : {"recompute", "hybrid"}
        The class: plans without swap instructions, or every plan.
    source : str
        Who proved it, e.g. ``"checkmate-milp (MILP bound)"``, ``"checkmate-lp (LP value)"``.
    budget_bytes : int
        The graph-memory budget it was proven at (bytes).
    covers : callable or None
        ``covers(schedule) -> bool``: for a model that excludes some plans of
        its class, whether the plan is one the bound holds for.  None: every
        plan of the class.

    Raises
    ------
    ValueError
        ``kind`` is not one of :data:`BOUND_KINDS`, or ``value_s`` is not a
        finite number.
    """

    value_s: float
    kind: str
    source: str
    budget_bytes: int
    covers: Callable[["Schedule"], bool] | None = field(default=None, compare=False, repr=False)

    def __post_init__(self):
        if self.kind not in BOUND_KINDS:
            raise ValueError(f"Bound kind must be one of {BOUND_KINDS}, got {self.kind!r}")
        if not isinstance(self.value_s, (int, float)) or not math.isfinite(self.value_s):
            raise ValueError(f"Bound value_s must be a finite number of seconds, got {self.value_s!r}")


@dataclass(frozen=True)
class Certificate:
    """What :func:`best_bound` found for one plan.

    Attributes
    ----------
    time_s : float
        The plan's simulated step time (s).
    bound : Bound or None
        The largest valid bound for the plan; None: "bound unknown".
    gap : float or None
        :func:`gap` of ``time_s`` to ``bound``; None when there is no bound.
    invalid : tuple of (Bound, str)
        Bounds that claimed the plan but lie above its time, and why.
    """

    time_s: float
    bound: Bound | None
    gap: float | None
    invalid: tuple = ()

    @property
    def lower_bound_s(self) -> float | None:
        """The bound's value (s), or None."""
        return None if self.bound is None else self.bound.value_s

    @property
    def kind(self) -> str | None:
        """The bound's class (``"recompute"`` / ``"hybrid"``), or None."""
        return None if self.bound is None else self.bound.kind


def plan_class(schedule: "Schedule") -> str:
    """:data:`RECOMPUTE` if the plan has no SwapOut / SwapIn / Wait
    instruction, else :data:`HYBRID`."""
    from libra_opt.ir.schedule import Op

    return RECOMPUTE if all(i.op in (Op.COMPUTE, Op.FREE) for i in schedule) else HYBRID


def gap(time_s: float, bound_s: float | None) -> float | None:
    """The gap of a plan to a lower bound: ``(time_s - bound_s) / bound_s``.

    The one definition every result uses (:class:`~libra_opt.solvers.SolveResult`,
    :class:`libra_opt.compare.Row`, the benchmarks): how much slower the plan
    is than the bound, as a fraction; the plan is then at most ``gap`` slower
    than the best plan of the bound's class.  0 means proven optimal.

    Returns
    -------
    float or None
        None without a bound or with a bound <= 0 (no relative gap).  A
        bound within :data:`REL_TOL` above ``time_s`` gives 0.

    Raises
    ------
    ValueError
        ``bound_s`` is above ``time_s`` by more than :data:`REL_TOL`: a
        negative gap, which a valid bound cannot give.
    """
    if bound_s is None or not bound_s > 0:
        return None
    if time_s < bound_s * (1 - REL_TOL):
        raise ValueError(f"lower bound {bound_s!r} s is above the plan's time {time_s!r} s: it is no bound on "
                         f"this plan (a negative gap is a bug in whoever proved the bound)")
    return max(0.0, (time_s - bound_s) / bound_s)


def best_bound(problem: "RematProblem", budget_bytes: int, plan: "Schedule", bounds: Iterable[Bound], *,
               simulation: "SimulationResult | None" = None) -> Certificate:
    """The largest bound that is valid for ``plan``, and its gap.

    Parameters
    ----------
    problem : RematProblem
    budget_bytes : int
        The budget the plan was made for (bytes); the plan's simulated peak
        must be within it.
    plan : Schedule
    bounds : iterable of Bound
        Bounds from any solvers, at any budgets.
    simulation : SimulationResult, optional
        The plan's simulation, if already run (else it is simulated).

    Returns
    -------
    Certificate
        ``bound`` None ("bound unknown") when no bound is valid for the plan
        (module docstring).

    Raises
    ------
    ValueError
        The plan's simulated peak is over ``budget_bytes``.

    Warns
    -----
    InvalidBoundWarning
        A bound valid for the plan by its class, budget and ``covers`` lies
        above the plan's simulated time by more than :data:`REL_TOL`; it is
        left out (listed in ``Certificate.invalid``).
    """
    from libra_opt.passes.simulator import simulate

    sim = simulation if simulation is not None else simulate(problem, plan)
    time_s, peak = float(sim.time_s), int(sim.peak_bytes)
    if peak > budget_bytes:
        raise ValueError(f"the plan's simulated peak {peak} bytes is over its budget {budget_bytes} bytes: "
                         f"only plans within their budget have a gap")
    cls = plan_class(plan)
    best: Bound | None = None
    invalid = []
    for b in bounds:
        if b.kind == RECOMPUTE and cls != RECOMPUTE:
            continue
        if peak > b.budget_bytes:  # the bound holds within its budget only
            continue
        if b.covers is not None and not b.covers(plan):
            continue
        if time_s < b.value_s * (1 - REL_TOL):
            why = (f"{b.source}: {b.kind} bound {b.value_s:.9g} s at {b.budget_bytes} bytes is above the "
                   f"simulated time {time_s:.9g} s of a {cls} plan with peak {peak} bytes")
            warnings.warn(f"{why}; it is not used (a bug in {b.source.split()[0]})", InvalidBoundWarning,
                          stacklevel=2)
            invalid.append((b, why))
            continue
        if best is None or b.value_s > best.value_s:
            best = b
    return Certificate(time_s, best, gap(time_s, None if best is None else best.value_s), tuple(invalid))


def compute_floor_s(problem: "RematProblem") -> float:
    """The time every plan spends at least: the sum of ``time_s`` of the
    nodes an output depends on (s).

    The simulator rejects a plan that does not produce every output, and a
    node runs only with its inputs resident, so every ancestor of an output
    runs at least once, its first run costing ``time_s``; nodes nothing
    depends on may be skipped.  Equal to ``problem.total_compute_s`` when
    every node leads to an output.
    """
    from libra_opt.ir.problem import INPUT

    need = [False] * problem.num_nodes
    stack = [problem.tensors[o].producer for o in problem.outputs if problem.tensors[o].kind != INPUT]
    while stack:
        k = stack.pop()
        if k is None or need[k]:
            continue
        need[k] = True
        stack.extend(problem.tensors[x].producer for x in problem.nodes[k].inputs)
    return float(sum(n.time_s for n, used in zip(problem.nodes, need) if used))


def floor_bound(problem: "RematProblem", budget_bytes: int, source: str) -> Bound:
    """:func:`compute_floor_s` as a :data:`HYBRID` bound at ``budget_bytes``
    (it holds for every plan at every budget), credited to ``source``."""
    return Bound(compute_floor_s(problem), HYBRID, f"{source} (compute floor)", int(budget_bytes))


def cut_bounds(problem: "RematProblem", budget_bytes: int) -> tuple[Bound, ...]:
    """The cut bounds of ``problem`` at ``budget_bytes``
    (:func:`~libra_opt.passes.cut_bounds.cut_lower_bound`) as bounds: a
    :data:`HYBRID` one (every plan; the compute floor where no cut raises
    it), and a :data:`RECOMPUTE` one where it is higher (plans without swaps:
    the off bytes are all recomputed) and some recompute-only plan may fit;
    then the ordered cut bounds
    (:func:`~libra_opt.passes.order_bounds.ordered_cut_bound`) of each class
    where they are higher, with a ``covers`` test: they hold for the plans
    that compute every node for the first time in the node order (every
    built-in solver's), and add what a chain of recomputations needs.
    No solver needs to run: any plan within the budget gets a gap.

    Returns
    -------
    tuple of Bound
        One to four bounds (s), proven at ``budget_bytes``; their ``source``
        names the cut node (or says "compute floor").

    Raises
    ------
    ValueError
        ``budget_bytes`` is negative.

    Source: :mod:`libra_opt.passes.cut_bounds` (Checkmate's frontier
    argument, Jain et al., MLSys 2020, sec. 4, with Beaumont et al.'s
    offload model, NeurIPS 2021, sec. 3).
    """
    from libra_opt.passes.cut_bounds import cut_lower_bound

    out = []
    for swaps, kind in ((True, HYBRID), (False, RECOMPUTE)):
        cb = cut_lower_bound(problem, budget_bytes, swaps)
        if not math.isfinite(cb.time_s) or (out and cb.time_s <= out[0].value_s):
            continue
        source = ("compute floor" if cb.node is None else
                  f"cut bound at {problem.nodes[cb.node].name!r}, {cb.excess_bytes} bytes off the device")
        out.append(Bound(float(cb.time_s), kind, source, int(budget_bytes)))
    from libra_opt.passes.order_bounds import first_computes_in_order, ordered_cut_bound

    def in_order(schedule) -> bool:
        return first_computes_in_order(problem, schedule)

    for swaps, kind in ((True, HYBRID), (False, RECOMPUTE)):
        ob = ordered_cut_bound(problem, budget_bytes, swaps)
        # only where it is higher than every bound already there that holds for its plans too
        below = max((b.value_s for b in out if b.kind == HYBRID or b.kind == kind), default=-math.inf)
        if not math.isfinite(ob.time_s) or ob.time_s <= below * (1 + REL_TOL):
            continue
        source = (f"ordered cut bound at {problem.nodes[ob.node].name!r}, {ob.excess_bytes} bytes over the budget "
                  f"there; its class: the plans that compute each node first in node order")
        out.append(Bound(float(ob.time_s), kind, source, int(budget_bytes), in_order))
    return tuple(out)


def with_cut_bounds(problem: "RematProblem", result):
    """``result`` (a :class:`~libra_opt.solvers.SolveResult` with a plan)
    with :func:`cut_bounds` at its budget added to its ``bounds`` and its
    ``lower_bound_s``, ``gap``, ``bound_kind`` and ``bound_source`` taken
    from the best bound valid for its plan (:func:`best_bound`).  A result
    without a plan is returned as it is.  Costs about 0.1-0.4 s per budget
    on problems of a few thousand nodes (2-core CPU), once per problem and
    budget."""
    import dataclasses

    if result.schedule is None:
        return result
    bounds = tuple(result.bounds) + cut_bounds(problem, result.budget_bytes)
    cert = best_bound(problem, result.budget_bytes, result.schedule, bounds, simulation=result.simulation)
    return dataclasses.replace(result, bounds=bounds, lower_bound_s=cert.lower_bound_s, gap=cert.gap,
                               bound_kind=cert.kind, bound_source=None if cert.bound is None else cert.bound.source)


def model_covers(problem: "RematProblem", budget_bytes: int, image: Callable[["Schedule"], tuple | None]
                 ) -> Callable[["Schedule"], bool]:
    """A ``covers`` test for the bound of an optimization model that is no
    relaxation of the simulator: the plan is covered when the model has a
    point within ``budget_bytes`` that costs no more than the plan's
    simulated time, so the model's optimum (and any bound on it) is at most
    that time.  Used by
    :func:`~libra_opt.solvers.checkmate.bounds.checkmate_covers`; a model of swaps (e.g.
    ``hybrid-milp``) passes its own ``image``.

    Parameters
    ----------
    problem : RematProblem
        The problem the plans are simulated on (never a coarsened one).
    budget_bytes : int
        The model's budget (bytes).
    image : callable
        ``image(schedule) -> (model_time_s, model_peak_bytes)`` of the
        model's point for the plan (one that computes no more than it), or
        None when the plan has none; a
        :class:`~libra_opt.errors.LibraOptError` counts as None.

    Returns
    -------
    callable
        ``covers(schedule) -> bool``, memoized per schedule object (the
        bounds of one solve share it).
    """
    from libra_opt.errors import LibraOptError
    from libra_opt.passes.simulator import simulate

    seen: dict[int, tuple] = {}  # id(schedule) -> (schedule, answer)

    def covers(schedule: "Schedule") -> bool:
        hit = seen.get(id(schedule))
        if hit is not None and hit[0] is schedule:
            return hit[1]
        try:
            point = image(schedule)
        except LibraOptError:
            point = None
        answer = (point is not None and point[1] <= budget_bytes
                  and point[0] <= simulate(problem, schedule).time_s * (1 + REL_TOL))
        seen[id(schedule)] = (schedule, answer)
        return answer

    return covers
