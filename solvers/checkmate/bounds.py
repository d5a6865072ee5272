"""Certificates of Checkmate's recompute-only model: the bounds a Checkmate
LP or MILP solve proves, and the plans they hold for.

Checkmate's model is not a relaxation of the simulator (it fixes the order of
first computations and restricts recomputation within stages), so its bound
is stated only for the plans the model dominates: :func:`checkmate_covers`
is that test, :func:`checkmate_bounds` turns a solve's values into
:class:`~libra_opt.solvers.certificates.Bound` objects (none for a coarsened
model).  The generic rules (bound classes, best bound, gaps) live in
:mod:`libra_opt.solvers.certificates`, which imports nothing of Checkmate.

Source: Jain et al., "Checkmate", MLSys 2020, sec. 4 (the model) and 5 (the
LP relaxation and its rounding).
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Callable

from ..certificates import RECOMPUTE, Bound, cut_bounds, model_covers, plan_class
from .model import model_peak_bytes
from .plan import rs_from_s, s_from_schedule

if TYPE_CHECKING:  # pragma: no cover
    from libra_opt.ir.schedule import Schedule

    from .model import CheckmateGraph
    from .plan import CheckmateSetup

__all__ = ["checkmate_covers", "checkmate_bounds"]


def checkmate_covers(graph: "CheckmateGraph", budget_bytes: int) -> Callable[["Schedule"], bool]:
    """The ``covers`` test of a Checkmate MILP / LP bound on ``graph`` at
    ``budget_bytes``.

    Checkmate's model (:mod:`libra_opt.solvers.checkmate_model`) is not a
    relaxation of the simulator: it fixes the order of first computations to
    the node order and restricts the recomputations within a stage, so a
    recompute-only plan the simulator accepts may lie outside it and be
    cheaper than the model's optimum.  Its bound holds for a plan that the
    model *dominates*: the plan's checkpoints ``S``
    (:func:`~libra_opt.solvers.checkmate_plan.s_from_schedule`, which needs
    first computations in node order) completed with the least
    recomputation (:func:`~libra_opt.solvers.checkmate_plan.rs_from_s`) give
    a point of the model within the budget
    (:func:`~libra_opt.solvers.checkmate_model.model_peak_bytes`) that
    computes no more than the plan.  Then the model's optimum, and so its
    bound, is at most the plan's time.

    Parameters
    ----------
    graph : CheckmateGraph
        The model's graph, built on the problem itself (never a coarsened one).
    budget_bytes : int
        The model's budget (bytes).

    Returns
    -------
    callable
        ``covers(schedule) -> bool``; False for a plan that swaps, reorders
        first computations, or whose image in the model is over the budget
        or costlier.
    """
    def image(schedule: "Schedule"):
        if plan_class(schedule) != RECOMPUTE:
            return None
        R, S = rs_from_s(graph, s_from_schedule(graph, schedule))
        off = R.copy()
        off[range(graph.n), range(graph.n)] = False
        model_s = float(graph.cost_s.sum()) + float((off.sum(axis=0) * graph.recompute_cost_s).sum())
        return model_s, model_peak_bytes(graph, R, S)

    return model_covers(graph.problem, budget_bytes, image)


def checkmate_bounds(setup: "CheckmateSetup", budget_bytes: int, solver: str, values, extras: dict) -> tuple:
    """The ``"recompute"`` bounds of a Checkmate solve, as
    :class:`~libra_opt.solvers.certificates.Bound` objects.

    Parameters
    ----------
    setup : CheckmateSetup
        The solve's setup (its graph, whether it was coarsened).
    budget_bytes : int
    solver : str
        The solver's name, for ``Bound.source``.
    values : iterable of (str, float or None)
        ``(label, seconds)`` pairs, e.g. ``("LP value", 12.5)``.
    extras : dict
        The result's extras, updated for a coarsened model.

    Each ``(label, seconds)`` of ``values`` (None skipped) bounds the
    model's optimum at ``budget_bytes``, so it holds for the plans the model
    dominates (:func:`~libra_opt.solvers.checkmate.bounds.checkmate_covers`).
    On a coarsened model it bounds the coarse model only, which has fewer
    plans than the original: no bound is returned, and the values go to
    ``extras["coarse_bounds_s"]`` with ``extras["bound_note"]`` saying why.
    The cut bounds of the original problem
    (:func:`~libra_opt.solvers.certificates.cut_bounds`: valid for every plan
    of their class, no model involved) are added either way.

    Returns
    -------
    tuple of Bound
    """
    values = [(label, float(v)) for label, v in values if v is not None and math.isfinite(v)]
    cuts = cut_bounds(setup.original, budget_bytes)   # of the original problem: they hold on it, coarsened or not
    if setup.coarsened:
        if values:
            extras["coarse_bounds_s"] = dict(values)
            extras["bound_note"] = ("the bounds are of the coarsened model, whose plans are fewer than the "
                                    "original problem's: no bound on the original")
        return cuts
    covers = checkmate_covers(setup.graph, budget_bytes)
    return tuple(Bound(v, RECOMPUTE, f"{solver} ({label})", int(budget_bytes), covers) for label, v in values) + cuts
