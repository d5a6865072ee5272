"""The finish step of the ``libra`` solver: from a descent's snapshot for a
budget to a simulated plan.

1. **Undo pass**: decisions the budget no longer needs are undone, most
   expensive first (estimate only).
2. **Segment-wise regeneration** (Chen et al., "Training Deep Nets with
   Sublinear Memory Cost", 2016, sec. 4.1): where a chain regenerates an
   evicted storage before its own use, keep it from there.
3. **Retention**: where a chain regenerates a tensor freed after its last use,
   keep that tensor resident until the chain instead (Checkmate's S).
4. **Realize**: lower (:func:`~libra_opt.passes.lowering.lower`) and simulate;
   while the simulated peak is over budget, repair against the simulated
   timeline.

:class:`Finisher` is composed around a descent's evaluator (the
:class:`~libra_opt.solvers.libra.records.Evaluator` interface, which
``refine.Refiner`` implements): it reads the descent's problem, options and
window ends, and evaluates and commits repair moves through it, with the
option-cost caches of the snapshot it finishes passed explicitly.  The
descent itself is ``solvers/libra/refine.py``; the estimate-only passes (undo,
segment-wise regeneration, retention, early shift) are
``solvers/libra/tidy.py``; the window-end and retention operations on the
model are ``solvers/libra/reshape.py``.

Source: Libra (Wang, NTHU 2024), the final pass of the greedy refinement
(undo, lower, simulate, refine again against the simulated timeline).
"""
from __future__ import annotations

import logging

from libra_opt.ir.problem import RematProblem
from libra_opt.ir.schedule import Op
from libra_opt.passes.lowering import lower
from libra_opt.passes.simulator import simulate

from .estimate import Timeline
from .exchange import exchange as exchange_moves
from .explain import REASON_REPAIR
from .records import Evaluator, FinishedPlan, Move, OptionCosts, Prepared, Snapshot
from .tidy import early_shift, fix_shrunk, keep_regenerated, retain_inputs, undo_pass

log = logging.getLogger(__name__)


class Finisher:
    """The finish step (module docstring) of one descent.

    Parameters
    ----------
    evaluator : Evaluator
        The descent (``refine.Refiner``): its ``problem``, ``opts``,
        ``orig_b``, ``allow_rec``, ``costs``, and ``candidates`` /
        ``evaluate`` / ``commit`` for repairs and exchange moves.  Not
        changed, but for its evaluation count (``evals``).
    """

    def __init__(self, evaluator: Evaluator):
        self.ev = evaluator

    def _costs(self, snap: Snapshot) -> OptionCosts:
        """The option-cost caches as they were at ``snap`` (repairs and
        exchange moves order and skip options by them), so that a plan does
        not depend on how far the descent went on for lower budgets:
        ``solve_many`` equals ``solve``.  The descent's live caches where the
        snapshot has none."""
        return snap.caches if snap.caches is not None else self.ev.costs

    def prepare(self, snap: Snapshot, budget: int, undo: bool = True, exchange: bool | None = None,
                polish: bool = True) -> Prepared:
        """The snapshot's timeline after the undo pass: decisions the budget
        (bytes) does not need are undone, most expensive first (estimate
        only); then, with ``exchange`` (``None``: the ``exchange`` option),
        exchange moves (``solvers/libra/exchange.py``).  ``polish=False``
        leaves out the passes that only save time within the budget
        (regenerated storages kept, retained inputs, the early shift): for a
        caller that only asks whether the budget is met, as each of them
        keeps the estimated peak within it.  The snapshot is not changed."""
        ev, opts = self.ev, self.ev.opts
        exchange = opts.exchange if exchange is None else exchange
        undone = 0
        if opts.undo and undo:
            tl, records, undone = self._undone(snap, budget, keep=bool(opts.exchange) and not exchange)
            if exchange:
                # as at the snapshot: solve_many equals solve
                tl, records, _ = exchange_moves(ev, self._costs(snap), tl, records, budget, snap.evals)
            if polish:
                keep_regenerated(tl, records, budget)
        else:
            tl, records = snap.timeline.copy(), dict(snap.records)
        if opts.retain and ev.allow_rec and polish:
            retain_inputs(tl, budget)
            if opts.undo and undo and opts.early:
                tl, records = early_shift(ev.problem, ev.orig_b, tl, records, budget)
        fix_shrunk(tl, records)
        return Prepared(tl, records, undone)

    def _undone(self, snap: Snapshot, budget: int, keep: bool) -> tuple[Timeline, dict, int]:
        """The snapshot's timeline and records after the undo pass for
        ``budget`` (bytes), and how many decisions it undid: copies the
        caller may change.  The solver prepares a snapshot without, then
        with exchange moves (``LibraSolver._libra_plan``): with ``keep``, the
        result is kept (the descent's ``undo_memo``, one budget at a time) for
        that second call, which then starts from it instead of undoing again
        (the pass is deterministic: the plans are the same)."""
        memo = self.ev.undo_memo
        hit = memo.pop((id(snap), budget), None)
        if hit is not None and hit[0] is snap:
            tl, records, undone = hit[1].copy(), dict(hit[2]), hit[3]
        else:
            tl, records = snap.timeline.copy(), dict(snap.records)
            undone = undo_pass(tl, records, budget)
        if keep:
            if any(b != budget for _, b in memo):
                memo.clear()   # one budget at a time: a sweep finishes its budgets one after another
            memo[(id(snap), budget)] = (snap, tl.copy(), dict(records), undone)
        return tl, records, undone

    def realize(self, prepared: Prepared, snap: Snapshot, budget: int,
                repair: bool = True) -> FinishedPlan | None:
        """Lower, simulate and, while the simulated peak is over ``budget``
        (bytes), repair against the simulated timeline (at most the
        ``max_repair_steps`` option's moves); ``None`` if that fails.
        ``prepared`` (:meth:`prepare`'s result) is not changed."""
        problem, opts = self.ev.problem, self.ev.opts
        tl, records, undone = prepared.timeline, dict(prepared.records), prepared.undone
        copied = False   # the prepared timeline is copied only if a repair changes it
        for repairs in range(opts.max_repair_steps + 1 if repair else 1):
            sched = lower(problem, tl.plan())
            sim = simulate(problem, sched)
            if sim.peak_bytes <= budget:
                return FinishedPlan(sched, sim, tl, records, undone, repairs, snap)
            if not repair or repairs == opts.max_repair_steps:
                break
            q = _position(problem, sched, sim.peak_index)
            mv = self._repair_move(tl, q, budget, self._costs(snap))
            if mv is None:
                break
            log.debug("libra: simulated peak %d over budget %d at position %d: repairing", sim.peak_bytes,
                      budget, q)
            if not copied:
                tl, copied = tl.copy(), True
            self.ev.commit(mv, q, int(sim.peak_bytes), tl, records, REASON_REPAIR)
        return None

    def _repair_move(self, tl: Timeline, q: int, budget: int, costs: OptionCosts) -> Move | None:
        """The repair move at position ``q``: among the candidates there, one
        whose raised points stay within ``budget`` first, then the best
        score; ``None`` where no candidate lowers ``q``."""
        best = None
        for j in self.ev.candidates(tl, q).tolist():
            mv = self.ev.evaluate(tl, j, q, 0, None, costs)
            if mv is None:
                continue
            key = (mv.eff.raised_max <= budget, mv.score)
            if best is None or key > best[0]:
                best = (key, mv)
        return best[1] if best else None

    def as_lowered(self, snap: Snapshot) -> FinishedPlan:
        """The snapshot's timeline lowered and simulated as it is (no undo,
        retention or repair): the plan ``Refiner.min_feasible_bytes``
        measures."""
        problem = self.ev.problem
        sched = lower(problem, snap.timeline.plan())
        return FinishedPlan(sched, simulate(problem, sched), snap.timeline, dict(snap.records), 0, 0, snap)


def _position(problem: RematProblem, sched, index: int) -> int:
    """Eager position an instruction belongs to: the next first-time compute
    at or after it (chains and swap-ins run for the node that follows)."""
    seen = set()
    nxt = problem.num_nodes - 1
    first = []
    for k, ins in enumerate(sched.instructions):
        if ins.op == Op.COMPUTE and ins.arg not in seen:
            seen.add(ins.arg)
            first.append((k, ins.arg))
    for k, node in first:
        if k >= index:
            return node
    return nxt


__all__ = ["Finisher"]
