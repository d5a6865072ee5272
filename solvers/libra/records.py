"""Records the parts of the ``libra`` solver pass to each other: a descent's
move (:class:`Move`), its snapshot for a budget (:class:`Snapshot`), a
finished plan (:class:`FinishedPlan`), and the pristine timeline every
descent starts from (:func:`fresh_timeline`).

This module imports none of the modules that use it (the descent in
``refine.py``, the finish step in ``finish.py``, the exchange moves in
``exchange.py``, the policy switches in ``switch.py``, the solver in
``solver.py``), so they can all share these records without import cycles.

Source: Libra (Wang, NTHU 2024), greedy refinement from the profiled peak:
the records of its decisions, snapshots and plans.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass

from libra_opt.ir.problem import RematProblem
from libra_opt.passes.lowering import all_windows, default_windows

from .estimate import Timeline


@dataclass
class Move:
    """One candidate move of the descent: window ``j`` to ``policy``.

    Attributes
    ----------
    j : int
        Window id (index into the timeline's window arrays).
    policy : int
        The policy code it moves to (``Policy.code``: recompute or swap).
    eff : object
        The timeline's effect of the move (``Timeline.evaluate``'s result).
    score : float
        Bytes removed at the peak per added second (bytes/s).
    removed : int
        Bytes the move takes off the peak position (bytes).
    rec_s, swap_s : float or None
        Estimated added time of recomputing / swapping the window (s;
        ``None``: not possible or not evaluated).
    reason : str
        Why this policy (a ``REASON_*`` of ``explain.py``).
    raised_pos, raised_bytes : int or None
        Where recomputing would have raised a new peak, and to how many
        bytes (the reason for a swap), else ``None``.
    shrink : tuple or None
        ``(position, tensors[, "early"])``: the window ends where a chain
        regenerates the storage (``"early"``: an early regeneration).
    also : tuple or None
        ``("merge", window, position, tensors)``: another evicted window ends
        at this move's chain; ``("retain", ((tensor, position), ...))``: chain
        inputs kept resident.
    """
    j: int
    policy: int
    eff: object
    score: float
    removed: int
    rec_s: float | None
    swap_s: float | None
    reason: str
    raised_pos: int | None = None
    raised_bytes: int | None = None
    shrink: tuple | None = None
    also: tuple | None = None


@dataclass
class Snapshot:
    """A descent's state when its estimated peak first got under a budget.

    Attributes
    ----------
    step : int
        Refinement steps taken by then.
    peak_bytes : int
        Estimated peak of ``timeline`` (bytes).
    elapsed_s : float
        The descent's own clock by then (s of ``time.perf_counter``).
    timeline : Timeline
        A copy of the descent's timeline (never changed afterwards).
    records : dict
        Window id -> :class:`~libra_opt.solvers.libra.explain.Decision`.
    cut_short : bool
        The descent stopped on ``max_steps`` or its time limit.
    caches : tuple
        The descent's option-cost caches at this step (read by repairs and
        exchange moves, so a plan does not depend on how far the descent went
        on for lower budgets); ``()``: the descent's live caches.
    evals : int
        Candidate evaluations the descent made up to this step (bounds
        exchange moves).
    """
    step: int
    peak_bytes: int
    elapsed_s: float
    timeline: Timeline
    records: dict
    cut_short: bool = False
    caches: tuple = ()
    evals: int = 0


@dataclass
class FinishedPlan:
    """A snapshot finished for one budget: lowered and simulated.

    Attributes
    ----------
    schedule : Schedule
        The lowered plan.
    simulation : SimulationResult
        Its simulation (peak bytes, step time, added seconds).
    timeline : Timeline
        The timeline it was lowered from.
    records : dict
        Window id -> :class:`~libra_opt.solvers.libra.explain.Decision`.
    undone : int
        Decisions the undo pass gave back.
    repairs : int
        Moves added against the simulated timeline.
    snapshot : Snapshot
        The snapshot it was finished from.
    """
    schedule: object
    simulation: object
    timeline: Timeline
    records: dict
    undone: int
    repairs: int
    snapshot: Snapshot


# pristine timelines per problem, window mode and margin: the descents of one solve (and of later
# solves of the same problem) start from copies, sharing the static arrays
_TIMELINES: "weakref.WeakKeyDictionary[RematProblem, dict]" = weakref.WeakKeyDictionary()


def fresh_timeline(problem: RematProblem, mode: str, margin: float) -> Timeline:
    """A no-remat :class:`Timeline` over the ``mode`` windows: ``"default"``
    (one per storage, :func:`~libra_opt.passes.lowering.default_windows`) or
    ``"all"`` (every gap between uses, :func:`~libra_opt.passes.lowering.all_windows`);
    ``margin`` is the swap overlap margin (dimensionless).  A copy of one
    built once per problem, mode and margin (the copies share its static
    arrays)."""
    per = _TIMELINES.setdefault(problem, {})
    key = (mode, float(margin))
    if key not in per:
        if mode == "default":
            wins = sorted((s, a, b) for s, (a, b) in default_windows(problem).items())
        else:
            wins = sorted(all_windows(problem))
        per[key] = Timeline(problem, wins, margin)
    return per[key].copy()


__all__ = ["Move", "Snapshot", "FinishedPlan", "fresh_timeline"]
