"""Exchange moves of the ``libra`` solver: give back one expensive decision and
cover the budget again with others.

The greedy descent takes, at each step, the eviction that removes the most
bytes at the peak per added second.  Where one large, costly storage has the
best ratio but the budget needs only part of its bytes, the descent takes it
and stops; several smaller, cheaper evictions that together free what the
budget needs would have cost less, and the undo pass cannot find them (it only
removes decisions).  An *exchange* undoes one decision (the budget is then
exceeded), forbids it, and descends again from there, on a copy of the
timeline, to the budget (each step the best ratio at the current peak, every
raised point kept under that peak, as in the descent), then runs the undo pass;
it is kept where the estimated added time goes down.  Each local descent
is run twice: taking the best ratio at each step, and *finish first*: where
candidates alone take the peak down to the budget (the budget is a
knapsack-cover constraint, which the best ratio can overshoot), the cheapest
few are each taken and followed by the undo pass, and the cheapest result is
kept.  Exchanges are tried on the most expensive decisions first, a bounded
number of times (:data:`MAX_TRIES` per round, :data:`MAX_ROUNDS`,
:data:`MAX_STEPS` local steps, :data:`EVALS_PER_STEP` candidates evaluated per
step, best cached ratio first), and only on problems of at most
:data:`MAX_NODES` nodes, so the finish step stays within a small multiple of
its cost without them.

Source: a 1-opt / tabu exchange neighbourhood over the greedy's decision set
(Glover, "Tabu Search - Part I", ORSA J. Computing 1989: a move made tabu
after it is undone), applied to Libra's greedy refinement (Wang, NTHU 2024).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from .estimate import KEEP, REC, Timeline
from .explain import REASON_EXCHANGE

if TYPE_CHECKING:  # pragma: no cover
    from .refine import _Refiner

#: decisions (most expensive first) tried for an exchange per round
MAX_TRIES = 3
#: rounds of exchanges (each round keeps the first exchange that saves time)
MAX_ROUNDS = 2
#: most decisions the local descent of one exchange may add
MAX_STEPS = 64
#: candidates that alone meet the budget tried per step of a finish-first local descent
MAX_FINISHERS = 4
#: candidates evaluated per step of a local descent (best cached ratio first)
EVALS_PER_STEP = 12
#: exchanges are tried on problems of at most this many nodes (their local
#: descents evaluate candidates exactly, which large problems cannot afford per budget)
MAX_NODES = 1000
#: candidate evaluations exchanges may make per prepared plan: this many times the descent's own
EVAL_RATIO = 2
#: ... and at least this many
MIN_EVALS = 48
#: relative saving an exchange must bring to be kept
MIN_GAIN = 1e-9


def undo_pass(tl: Timeline, records: dict, budget: int) -> int:
    """Undo, most expensive first, every decision in ``records`` the budget
    does not need (the estimated memory stays within ``budget`` bytes
    without it); ``tl`` and ``records`` are changed in place.  Returns how
    many were undone."""
    undone = 0
    mem = tl.memory()
    for j in sorted(records, key=lambda k: (-records[k].added_s, -records[k].step)):
        # quick test first: the storage back over its whole off range must fit
        if tl.pol[j] == REC:
            lo, hi = int(tl.w_a[j]) + 1, int(tl.w_b[j]) - 1
        else:
            lo, hi = int(tl.sw_r0[j]), int(tl.sw_pos[j])
        if lo <= hi and int(mem[lo:hi + 1].max()) + int(tl.w_bytes[j]) > budget:
            continue
        eff = tl.evaluate(j, KEEP)
        if eff.feasible and eff.raised_max <= budget:
            tl.apply(j, KEEP, eff)
            del records[j]
            undone += 1
            mem = tl.memory()
    return undone


def _ranked(ref: "_Refiner", tl: Timeline, p: int, banned: set) -> list[int]:
    """The candidates at position ``p`` not in ``banned``, best first by bytes
    over the refiner's cached cost bound (its cheapest option), at most
    :data:`EVALS_PER_STEP` of them."""
    idx = np.array([j for j in ref.candidates(tl, p).tolist() if j not in banned], dtype=np.int64)
    if not len(idx):
        return []
    bound = np.maximum(ref.cost[idx].min(axis=1), ref.eps)
    key = np.where(np.isfinite(bound), tl.w_bytes[idx] / bound, 0.0)
    order = np.lexsort((idx, -key))[:EVALS_PER_STEP]
    return idx[order].tolist()


def _undo(ref: "_Refiner", tl: Timeline, records: dict, budget: int) -> None:
    """:func:`undo_pass`, then windows whose end was moved to a chain that no
    longer regenerates their storage get their own end back (the refiner's
    ``_fix_shrunk``), so that ``tl.added_s()`` is the plan's cost."""
    undo_pass(tl, records, budget)
    ref._fix_shrunk(tl, records)


def _descend_local(ref: "_Refiner", tl: Timeline, records: dict, budget: int, banned: set,
                   finish_first: bool = False, max_evals: int | None = None) -> tuple[Timeline, dict] | None:
    """Greedy steps from ``tl`` (changed in place) until its estimated peak is
    within ``budget``: at the peak, the candidate (not in ``banned``) with the
    best bytes removed per added second whose raised points stay under the
    peak.  With ``finish_first``, where candidates alone take the peak down
    to the budget (the budget is a knapsack-cover constraint: the best ratio
    can overshoot it), the :data:`MAX_FINISHERS` cheapest of them are each
    taken on a copy followed by the undo pass, and the cheapest result kept.
    The final timeline and records, or ``None`` if no move is left,
    :data:`MAX_STEPS` are spent, or the refiner's evaluation count reaches
    ``max_evals``."""
    for _ in range(MAX_STEPS):
        if max_evals is not None and ref.evals >= max_evals:
            return None
        m = tl.memory()
        p = int(np.argmax(m))
        peak = int(m[p])
        if peak <= budget:
            return tl, records
        best, fins = None, []
        for j in _ranked(ref, tl, p, banned):
            mv = ref._evaluate(tl, j, p, peak, limit=peak)
            if mv is None:
                continue
            if best is None or mv.score > best.score:
                best = mv
            if finish_first and peak - mv.removed <= budget and mv.eff.raised_max <= budget:
                fins.append((mv.removed / mv.score, j, mv))
        if fins:
            tries = []
            for _, j, mv in sorted(fins, key=lambda f: f[:2])[:MAX_FINISHERS]:
                t2, r2 = tl.copy(), dict(records)
                ref._commit(mv, p, peak, t2, r2, REASON_EXCHANGE)
                _undo(ref, t2, r2, budget)
                tries.append((t2.added_s(), j, t2, r2))
            _, _, tl, records = min(tries, key=lambda t: t[:2])
            continue
        if best is None:
            return None
        ref._commit(best, p, peak, tl, records, REASON_EXCHANGE)
    return (tl, records) if int(tl.memory().max()) <= budget else None


def exchange(ref: "_Refiner", tl: Timeline, records: dict, budget: int, descent_evals: int = 0
             ) -> tuple[Timeline, dict, int]:
    """Exchange moves (module docstring) from the prepared timeline ``tl`` and
    its decision ``records`` for ``budget`` bytes; neither is changed.  At
    most ``max(MIN_EVALS, EVAL_RATIO * descent_evals)`` candidate evaluations
    (``descent_evals``: those the descent made to get there), so exchanges
    cost a bounded multiple of the descent.

    Returns
    -------
    (Timeline, dict, int)
        The cheapest timeline found (``tl`` itself if no exchange saves
        time), its records, and how many exchanges were kept.
    """
    if not records or int(tl.memory().max()) > budget or ref.problem.num_nodes > MAX_NODES:
        return tl, records, 0
    banned: set[int] = set()
    kept = 0
    stop = ref.evals + max(MIN_EVALS, EVAL_RATIO * int(descent_evals))
    for _ in range(MAX_ROUNDS):
        cost = tl.added_s()
        found = None
        for j in sorted(records, key=lambda k: (-records[k].added_s, k))[:MAX_TRIES]:
            if records[j].added_s <= 0:
                break
            for finish_first in (False, True):
                t2, r2 = tl.copy(), dict(records)
                eff = t2.evaluate(j, KEEP)
                if not eff.feasible:
                    break
                t2.apply(j, KEEP, eff)
                del r2[j]
                done = _descend_local(ref, t2, r2, budget, banned | {j}, finish_first, stop)
                if done is None:
                    continue
                t2, r2 = done
                _undo(ref, t2, r2, budget)
                if t2.added_s() < cost * (1 - MIN_GAIN) and (found is None or t2.added_s() < found[0].added_s()):
                    found = (t2, r2, j)
        if found is None:
            break
        tl, records = found[0], found[1]
        banned.add(found[2])
        kept += 1
    return tl, records, kept


__all__ = ["exchange", "undo_pass", "MAX_TRIES", "MAX_ROUNDS", "MAX_STEPS"]
