"""The reverse greedy of the ``libra`` solver: from the store-nothing plan up.

Where the descents (top-down: evict one storage per step from the no-remat
plan) stop above a budget, the budget may still be met by recomputing more:
``checkpoint-all``'s plan, every recomputable activation evicted after its
last forward use and recomputed, with its chain back to the inputs, before
its first backward use, holds the least memory recomputation can.  The
portfolio used to return that baseline's plan as it is: on a VGG16-style
segmentation CNN at the tightest budget libra plans (0.328 of its peak),
65,067 cost units added, where a time-limited MILP found 27,118.

:class:`ReverseRefiner` is a portfolio member built like a descent but
taking one move: every recomputable window recomputed at once
(:meth:`ReverseRefiner._build`), each decision recorded with the time its
producer's recomputations take over every chain of that plan (which orders
the undo pass, costliest first).  The usual finish
step (:class:`~libra_opt.solvers.libra.finish.Finisher`) then works from
the bottom: the undo pass gives back, most expensive first, every decision
the budget does not need, and the exchange moves trade a costly decision for
cheaper ones; the plan is lowered and simulated like any other.  On the
segmentation CNN it plans 13,834 units at that budget.

Source: the reverse (store-nothing first) order of Chen et al., "Training
Deep Nets with Sublinear Memory Cost" (2016), sec. 4 (memory-frugal plans
first, then what the budget affords kept), with the undo pass and exchange
moves of Libra's finish step (Wang, NTHU 2024).
"""
from __future__ import annotations

import numpy as np

from libra_opt.passes.lowering import Policy, default_windows

from ..baselines import safe_recompute_decisions
from .codes import KEEP, NEG, REC
from .timeline_records import Effect
from .explain import REASON_REVERSE, explain
from .refine import OneMoveRefiner

__all__ = ["ReverseRefiner"]


class ReverseRefiner(OneMoveRefiner):
    """The reverse greedy (module docstring): a portfolio member of
    ``LibraSolver`` in recompute-only and hybrid mode, run as a fallback
    where no descent meets a budget, on problems of at most
    ``LibraSolver.REVERSE_MAX_NODES`` nodes (each undo of the store-nothing
    plan replays chains that reach back to the inputs: quadratic in depth).

    Parameters
    ----------
    problem : RematProblem
    opts : LibraOptions
        The solver's options with ``policy="recompute"``.

    Its snapshots (:meth:`Refiner.descend`) are the store-nothing plan, for
    every budget at or above its estimated peak; :meth:`Refiner.prepare`
    finishes them as it does a descent's.
    """

    label = "reverse"   #: ``extras["descent"]`` of its plans

    def prepare(self, snap, budget: int, undo: bool = True, exchange: bool | None = None, polish: bool = True):
        """:meth:`Refiner.prepare`; with ``polish=False`` (only whether
        ``budget`` is met: the tightening) the store-nothing plan as it is,
        without the undo pass (seconds: every undo replays chains back to the
        inputs).  The answer is the same: the undo pass only gives back what
        keeps the plan within the budget, and where a solve's finished plan
        does not lower within it, the store-nothing plan, lowered as it is, is
        its fallback (``LibraSolver._libra_plan``)."""
        return super().prepare(snap, budget, undo and polish, exchange, polish)

    def _build(self) -> None:
        """Every window ``checkpoint-all`` recomputes
        (:func:`~libra_opt.solvers.baselines.safe_recompute_decisions`: not
        those whose chain would re-run a non-recomputable op) set to
        recompute at once, with one chain replay (an ``apply`` per window
        replays chains that grow back to the inputs each time: cubic in
        depth); where a chain still re-runs a non-recomputable op, the
        recomputed storages it reads are kept, until none does.  Then one decision record per window, its cost the time its
        producer's recomputations take over every chain (s), which orders the
        undo pass (the costliest given back first)."""
        tl, problem = self.tl, self.problem
        wanted = default_windows(problem)
        dec = safe_recompute_decisions(problem, wanted, wanted)
        w_s, w_a, orig_b = tl.windows.w_s, tl.windows.w_a, tl.windows.orig_b
        pts: set[int] = set()
        for j in np.flatnonzero(self.enabled & tl.windows.w_rec_ok).tolist():
            s = int(w_s[j])
            if dec.get(s) == Policy.RECOMPUTE and wanted[s] == (int(w_a[j]), int(orig_b[j])):
                pts |= tl.affected(j)
                tl.apply(j, REC, Effect(0.0, {}, None, NEG, -1, True, 0, -1), refresh=False)
        tl.replay(pts)
        while True:   # a chain that re-runs a non-recomputable op: keep the recomputed storages it reads
            bad = next((ch for ch in tl.state.chains.values() if not ch.feasible), None)
            if bad is None:
                break
            back = [j for j in np.flatnonzero(tl.state.pol == REC).tolist() if int(w_s[j]) in bad.touched]
            if not back:   # (not from a decision of this move: left to the finish step's checks)
                break
            for j in back:
                tl.apply(j, KEEP)
        rtime = tl.tables.n_rtime
        spent = np.zeros(problem.num_nodes)
        for ch in tl.state.chains.values():
            for x in ch.nodes:
                spent[x] += rtime[x]
        peak, pos = tl.peak()
        prod = tl.windows.w_prod
        for k, j in enumerate(np.flatnonzero(tl.state.pol == REC).tolist()):
            cost = float(spent[int(prod[j])])
            self.records[j] = explain(problem, step=k, storage=int(w_s[j]), after=int(w_a[j]),
                                      before=int(tl.state.w_b[j]), policy="recompute",
                                      nbytes=int(tl.windows.w_bytes[j]), peak_bytes=peak, peak_pos=pos,
                                      removed_bytes=int(tl.windows.w_bytes[j]), added_s=cost, recompute_s=cost,
                                      swap_s=None, reason=REASON_REVERSE)
        self.step = len(self.records)
