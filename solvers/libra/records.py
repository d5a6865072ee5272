"""Records the parts of the ``libra`` solver pass to each other: a descent's
move (:class:`Move`), its option-cost caches (:class:`OptionCosts`), its
snapshot for a budget (:class:`Snapshot`), a finished plan
(:class:`FinishedPlan`), the pristine timeline every descent starts from
(:func:`fresh_timeline`), and the interface the finish step, the exchange
moves and the policy switches use of a descent (:class:`Evaluator`,
:class:`HasProblem`).

This module imports none of the modules that use it (the descent in
``refine.py``, the finish step in ``finish.py``, the exchange moves in
``exchange.py``, the policy switches in ``switch.py``, the solver in
``solver.py``), so they can all share these records without import cycles.

Source: Libra (Wang, NTHU 2024), greedy refinement from the profiled peak:
the records of its decisions, snapshots and plans.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Protocol, Sequence

import numpy as np

from libra_opt.ir.problem import RematProblem
from libra_opt.passes.lowering import all_windows, default_windows

from .chains import ChainMemo
from .estimate import Timeline


class Shrink(NamedTuple):
    """A recomputed window ended early, where a chain regenerates its storage
    (segment-wise regeneration), or regenerated early (``early``).

    Attributes
    ----------
    position : int
        The new end of the window (eager position of the chain).
    tensors : list of int
        The storage's tensors regenerated there.
    early : bool
        An early regeneration (before the node between the peak and the use
        where memory is lowest), not a chain that regenerates it anyway:
        recorded as ``Decision.early_from``.
    """
    position: int
    tensors: list
    early: bool = False


class Merge(NamedTuple):
    """Another recomputed window ``window`` ends at this move's chain, at
    ``position``, where ``tensors`` of its storage are regenerated (one
    regeneration pays for both)."""
    window: int
    position: int
    tensors: list


class RetainInputs(NamedTuple):
    """Inputs of the storage's producer kept resident until the chain that
    would regenerate them: ``pairs`` of ``(tensor id, position)``."""
    pairs: tuple


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
    shrink : Shrink or None
        The window ends where a chain regenerates the storage (or is
        regenerated early).
    also : Merge or RetainInputs or None
        What the move changes besides the window: another evicted window
        ended at this move's chain, or chain inputs kept resident.
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
    shrink: Shrink | None = None
    also: Merge | RetainInputs | None = None


@dataclass(slots=True)
class OptionCosts:
    """A descent's cached cost of moving each window to each option, refreshed
    whenever the window is evaluated; they bound scores for the lazy
    selection and order the options an evaluation tries.

    Attributes
    ----------
    cost : numpy.ndarray
        ``(windows, 4)`` float64, seconds: recompute; swap with the swap-in
        hidden behind compute; swap with the swap-in delayed past the peak;
        swap that waits for its copy out before the peak (``inf``: not
        allowed; the column order is ``refine.py``'s ``_O_REC``,
        ``_O_HID``, ``_O_LATE``, ``_O_WAIT``).
    hid_lo, hid_hi : numpy.ndarray
        ``(windows,)`` int64: the positions a hidden swap of each window
        covers (its release and its prefetch), as last evaluated.
    """
    cost: np.ndarray
    hid_lo: np.ndarray
    hid_hi: np.ndarray

    def copy(self) -> "OptionCosts":
        """A copy with its own arrays."""
        return OptionCosts(self.cost.copy(), self.hid_lo.copy(), self.hid_hi.copy())


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
    caches : OptionCosts or None
        The descent's option-cost caches at this step (read by repairs and
        exchange moves, so a plan does not depend on how far the descent went
        on for lower budgets: ``solve_many`` equals ``solve``); ``None``: the
        descent's live caches.
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
    caches: OptionCosts | None = None
    evals: int = 0


class Prepared(NamedTuple):
    """A snapshot prepared for one budget (``Finisher.prepare``): estimate
    only, not yet lowered.

    Attributes
    ----------
    timeline : Timeline
        Its own copy of the snapshot's timeline, after the undo pass (and the
        exchange moves and the passes that save time, where asked).
    records : dict
        Window id -> :class:`~libra_opt.solvers.libra.explain.Decision`.
    undone : int
        Decisions the undo pass gave back.
    """
    timeline: Timeline
    records: dict
    undone: int


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
    swap_retained : tuple of Retain
        Swapped retentions the last pass added to the timeline's plan
        (``solvers/libra/swap_inputs.py``; ``schedule`` and ``simulation``
        include them, ``timeline`` does not); empty where none.
    """
    schedule: object
    simulation: object
    timeline: Timeline
    records: dict
    undone: int
    repairs: int
    snapshot: Snapshot
    swap_retained: tuple = ()


class HasProblem(Protocol):
    """What the policy switches (``switch.py``) read of the descent a plan
    comes from: its problem."""
    problem: RematProblem


class Evaluator(Protocol):
    """What the finish step (``finish.py``) and the exchange moves
    (``exchange.py``) use of a descent (``refine.Refiner``): its fields and
    its move evaluation, on timelines other than the descent's own.

    Attributes
    ----------
    problem : RematProblem
    opts : LibraOptions
        The descent's options (``undo``, ``exchange``, ``retain``,
        ``early``, ``max_repair_steps``, ``swap_overlap_margin``, ...).
    mode : str
        Its windows: ``"default"`` or ``"all"``.
    orig_b : numpy.ndarray
        ``(windows,)`` int64: each window's own end (a use of its storage),
        before any was moved to a chain.
    allow_rec : bool
        Recomputation is allowed (policy is not ``"swap"``).
    eps : float
        Smallest added time a score divides by (s).
    evals : int
        Candidate evaluations made so far (the descent's and the
        evaluations made through :meth:`evaluate`).
    costs : OptionCosts
        The descent's live option-cost caches.
    undo_memo : dict
        The finish step's memo of undo passes (``finish.Finisher._undone``):
        ``(id(snapshot), budget) -> (snapshot, timeline, records, undone)``.
    """
    problem: RematProblem
    opts: object
    mode: str
    orig_b: np.ndarray
    allow_rec: bool
    eps: float
    evals: int
    costs: OptionCosts
    undo_memo: dict

    def candidates(self, tl: Timeline, p: int) -> np.ndarray:
        """Window ids a move may change at peak position ``p`` of ``tl``."""

    def evaluate(self, tl: Timeline, j: int, p: int, peak: int, limit: int | None,
                 costs: OptionCosts) -> Move | None:
        """The best admissible move of window ``j`` at position ``p`` of
        ``tl`` (not the descent's own timeline), options ordered by
        ``costs``; ``None`` if none lowers ``p`` under ``limit``."""

    def commit(self, mv: Move, p: int, peak: int, tl: Timeline, records: dict,
               reason: str | None = None) -> None:
        """Apply ``mv`` (found at position ``p`` of peak ``peak`` bytes) to
        ``tl`` and record it in ``records`` (step ``-1``)."""


def fresh_timeline(problem: RematProblem, mode: str, margin: float) -> Timeline:
    """A no-remat :class:`Timeline` over the ``mode`` windows: ``"default"``
    (one per storage, :func:`~libra_opt.passes.lowering.default_windows`) or
    ``"all"`` (every gap between uses, :func:`~libra_opt.passes.lowering.all_windows`);
    ``margin`` is the swap overlap margin (dimensionless).  A copy of one
    built once per problem, mode and margin (the copies share its static
    arrays)."""
    # pristine timelines per window mode and margin, kept with the problem's tables: the descents of
    # one solve (and of later solves of the same problem) start from copies, sharing the static arrays
    per = problem.tables.memo("libra.timelines", dict)
    key = (mode, float(margin))
    if key not in per:
        if mode == "default":
            wins = sorted((s, a, b) for s, (a, b) in default_windows(problem).items())
        else:
            wins = sorted(all_windows(problem))
        per[key] = Timeline(problem, wins, margin)
    return own_copy(per[key])


def own_copy(tl: Timeline) -> Timeline:
    """A copy of the timeline ``tl`` (``Timeline.copy``) with a chain memo of
    its own (:class:`~libra_opt.solvers.libra.chains.ChainMemo`, empty): a
    cache of the descent that starts from it, not of every solve of the
    problem that kept ``tl`` (:func:`fresh_timeline`, the exchange's
    covering-program starts).  Raises nothing."""
    tl = tl.copy()
    tl.state.memo = ChainMemo()
    return tl


__all__ = ["Shrink", "Merge", "RetainInputs", "Move", "OptionCosts", "Snapshot", "Prepared", "FinishedPlan", "fresh_timeline", "own_copy", "Evaluator", "HasProblem"]
