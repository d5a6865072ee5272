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
raised point kept under that peak, as in the descent; at a dead end, under
the peak the local descent started from: a step may then raise another point
over the current peak, which a later step takes down), then runs the undo
pass;
it is kept where the estimated added time goes down.  Each local descent
is run twice: taking the best ratio at each step, and *finish first*: where
candidates alone bring the plan within the budget (every position over it,
not only the peak's; the budget is a
knapsack-cover constraint, which the best ratio can overshoot), the cheapest
few are each taken and followed by the undo pass, and the cheapest result is
kept (the two take the same steps until the first that meets such candidates:
the finish-first one resumes from the plain one's state there, with the
evaluation count those steps would have added, and reaches the same plan);
and a third time with every other recomputed window given its own end
back first (a window ended at a chain that regenerated the storage given back
would lose it; where no end had moved, this descent starts where the plain one
did and takes its steps: its plan is taken from it, with the evaluation count
its steps would add), then, after the undo pass, regenerated storages kept from the
first chain after which they fit (``tidy.keep_regenerated``), compared
with the plan as that pass would leave it: where the descent evicted the root
of a chain, keeping the root through the peak lets the chain start there.
After the exchanges, on problems of at most :data:`COVER_MAX_NODES` nodes, a
*covering program* proposes a plan of its own (``_cover_windows``): the
cheapest set of recomputed windows that removes, at every position over the
budget, the excess bytes, under an additive model (each window frees its
bytes over its range at its producer's recompute time), solved with HiGHS
(``scipy.optimize.milp``) once per problem and budget; it is applied to a
keep-everything timeline, completed by the local descent (at most
:data:`MIN_EVALS` candidate evaluations) and the undo pass, and kept where it
is cheaper; on two-phase problems only (default windows: on a single-phase
graph chains are long and the additive model far off).  It finds the several cheap recomputes a
best-ratio cover overshoots where one exchange is not enough.
Exchanges are tried on the most expensive decisions first, a bounded
number of times (:data:`MAX_TRIES` per round, :data:`MAX_ROUNDS`,
:data:`MAX_STEPS` local steps, :data:`EVALS_PER_STEP` candidates evaluated per
step, best cached ratio first), and only on problems of at most
:data:`MAX_NODES` nodes, so the finish step stays within a small multiple of
its cost without them.

Source: a 1-opt / tabu exchange neighbourhood over the greedy's decision set
(Glover, "Tabu Search - Part I", ORSA J. Computing 1989: a move made tabu
after it is undone), applied to Libra's greedy refinement (Wang, NTHU 2024);
the covering program is a set-multicover integer program (Checkmate's
memory constraint, Jain et al., MLSys 2020, sec. 4, with one variable per
eviction window and its cost made additive).
"""
from __future__ import annotations

import warnings
from typing import NamedTuple

import numpy as np

from libra_opt.passes.lowering import Policy

from .estimate import KEEP, REC, Timeline
from .explain import REASON_EXCHANGE, explain
from .records import Evaluator, Move, OptionCosts, fresh_timeline, own_copy
from .tidy import fix_shrunk, keep_regenerated, undo_pass

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
#: ... and, for a swap-only descent's plan, at most this many per node (at least :data:`MIN_EVALS`): such a
#: descent's evaluations grow with its moves of swapped windows' swap-ins and waits, not with the decisions an
#: exchange gives back (``h100_gpt2-medium_b8`` at 0.3 of its peak: 4,129 of its 4,616 steps).  Swap-only
#: exchanges rarely keep one: over ``solve_rate.py``'s 390 libra rows, 2 of their 18 calls at one evaluation
#: per node and 1 at half, and the solves return the same plans at both (over 2,400 fuzz and pattern solves,
#: 1 of 8 calls at either)
SWAP_EVALS_PER_NODE = 0.5
#: :data:`EVAL_RATIO` on problems of more than :data:`LARGE_NODES` nodes.  Exchanges rarely keep one on
#: large problems (7 of the 63 calls on problems of over 300 nodes over ``solve_rate.py``'s 390 libra
#: rows), and each evaluation there replays longer chains; at one, the same plans
#: over those rows, over 72 solves of random layered graphs of 520-1,000 nodes (three widths, hybrid and
#: recompute-only at 0.8 / 0.5 / 0.3) and over 45 solves of three transformers models profiled on CPU
#: (ConvNeXt, a 6-layer GPT-2 and a 6-layer ViT, 735-979 nodes); ``h100_resnet50_b128`` hybrid at 0.3 of
#: its peak: 0.68 -> 0.57 CPU s.  (At one on every problem, 13 of 2,400 fuzz and pattern solves of up to
#: 150 nodes got costlier, by up to 33 %, and one of the 390 rows, ``mobilenet_b512_train`` of 185 nodes,
#: by 0.5 %.)
LARGE_EVAL_RATIO = 1
LARGE_NODES = 500
#: ``LibraOptions.exchange_effort="thorough"``: decisions tried per round (for :data:`MAX_TRIES`), candidate
#: evaluations per descent evaluation on every problem (for :data:`EVAL_RATIO` and :data:`LARGE_EVAL_RATIO`), and
#: at least this many (for :data:`MIN_EVALS`, also the covering plans' completion).  Over the 180 cells of
#: ``hybrid_optimality.py --libra-only`` (its graphs at copy ratios 0.25 / 1 / 4 and 0.9-0.3 of their peaks,
#: hybrid and swap-only): 12 plans cheaper, none costlier, 10 -> 14 CPU s in all (``random_layered_n100`` with
#: copies as slow as compute, hybrid at 0.5: 76,484.4 -> 70,660.0 in 0.9 -> 2.0 CPU s); ``hybrid-milp`` starts
#: from such a plan too.  Neither more tries nor more evaluations alone changed that cell's plan
THOROUGH_TRIES = 10
THOROUGH_EVAL_RATIO = 20
THOROUGH_MIN_EVALS = 500
#: the covering program (``_cover_plan``) runs on problems of at most this many nodes
COVER_MAX_NODES = 128
#: relative gap at which the covering program stops (its model is approximate anyway)
COVER_GAP = 0.02
#: branch-and-bound nodes of the covering program (a node limit, not a time limit: plans do not
#: depend on the machine's speed)
COVER_NODES = 200
#: time limit of the covering program, a safety net only (s)
COVER_TIME_S = 5.0

#: relative saving an exchange must bring to be kept
MIN_GAIN = 1e-9


class _Closer(NamedTuple):
    """A move that alone brings the plan within the budget (finish first, :func:`_meets`)."""
    cost_s: float   # its added time (s): bytes removed over its score
    window: int
    move: Move


class _Result(NamedTuple):
    """A plan a local descent or an exchange reached."""
    timeline: Timeline
    records: dict
    window: int     # the window taken (finish first) or given back (exchange)


def _effort(ref: Evaluator) -> tuple[int, int, int]:
    """``(tries per round, evaluations per descent evaluation, least
    evaluations)`` of the exchanges of descent ``ref``: by its options'
    ``exchange_effort`` and its problem's size (module constants)."""
    if ref.opts.exchange_effort == "thorough":
        return THOROUGH_TRIES, THOROUGH_EVAL_RATIO, THOROUGH_MIN_EVALS
    return MAX_TRIES, LARGE_EVAL_RATIO if ref.problem.num_nodes > LARGE_NODES else EVAL_RATIO, MIN_EVALS


def _ranked(ref: Evaluator, costs: OptionCosts, tl: Timeline, p: int, banned: set) -> list[int]:
    """The candidates at position ``p`` not in ``banned``, best first by bytes
    over the cached cost bound in ``costs`` (the cheapest option), at most
    :data:`EVALS_PER_STEP` of them."""
    idx = np.array([j for j in ref.candidates(tl, p).tolist() if j not in banned], dtype=np.int64)
    if not len(idx):
        return []
    bound = np.maximum(np.take(costs.cost, idx, axis=0).min(axis=1), ref.eps)
    key = np.where(np.isfinite(bound), tl.windows.w_bytes[idx] / bound, 0.0)
    order = np.lexsort((idx, -key))[:EVALS_PER_STEP]
    return idx[order].tolist()


def _undo(ref: Evaluator, tl: Timeline, records: dict, budget: int) -> None:
    """:func:`~libra_opt.solvers.libra.tidy.undo_pass`, then windows whose end
    was moved to a chain that no longer regenerates their storage get their
    own end back (:func:`~libra_opt.solvers.libra.tidy.fix_shrunk`), so that
    ``tl.added_s()`` is the plan's cost."""
    undo_pass(tl, records, budget)
    fix_shrunk(tl, records)


class _Fork(NamedTuple):
    """Where a plain local descent first met candidates that alone bring the
    plan within the budget (:func:`_meets`): the state before that step's move (a copy),
    the peak there, the finishers' windows (cheapest first) and the limit
    their raised points were evaluated under (``peak``, or the descent's
    ceiling where no candidate was admissible under it).  A finish-first
    descent from the same start takes the same steps up to there, and
    departs from it only there."""
    timeline: Timeline
    records: dict
    p: int
    peak: int
    finishers: list
    limit: int


class _Trace:
    """What a plain local descent (:func:`_descend_local` with ``trace``) did
    that its twins would do again: the candidate evaluations of each step
    it took (``evals``), the :class:`_Fork` and the number of steps up to and
    including it (``fork_at``; ``fork`` is ``None`` where no step met a
    finisher: the finish-first twin then takes every step the plain descent
    took, and reaches its plan), how the descent ended (``end``:
    ``"start"``, at the start of a step: within the budget, or the
    evaluation count reached; ``"none"``: no move left; ``"steps"``: its
    steps spent) and its plan before the undo pass (``result``, a copy, set
    by :func:`exchange`: the twin whose window ends stay as they were
    starts where the plain one did and reaches it, :func:`_replayed`) and
    ``ceiling``, the limit of its moves' raised points at a dead end (its
    first peak), which the finish-first twin resumed from the fork keeps."""

    __slots__ = ("evals", "fork", "fork_at", "end", "result", "ceiling")

    def __init__(self):
        self.ceiling: int | None = None   # the peak the plain descent started from (its raised points' limit)
        self.evals: list[int] = []
        self.fork: _Fork | None = None
        self.fork_at = 0
        self.end = "steps"
        self.result: tuple[Timeline, dict] | None = None


def _descend_local(ref: Evaluator, costs: OptionCosts, tl: Timeline, records: dict, budget: int, banned: set,
                   finish_first: bool = False, max_evals: int | None = None, steps: int = MAX_STEPS,
                   trace: _Trace | None = None, ceiling: int | None = None) -> tuple[Timeline, dict] | None:
    """Greedy steps from ``tl`` (changed in place) until its estimated peak is
    within ``budget``: at the peak, the candidate (not in ``banned``) with the
    best bytes removed per added second whose raised points stay under the
    peak (options ordered by ``costs``); at a dead end (no such candidate),
    the candidates again with their raised points under ``ceiling`` (bytes;
    ``None``: the peak at the first step), which may be over the current
    peak: a later step can take that point down.  ``random_layered_graph(100,
    seed=0)`` recompute-only at 0.7 of its peak: an exchange gives back
    window 12, and the local descent, at a dead end, retains input 8 for the
    chain before node 17 (raising it to 27,100 bytes over a peak of 26,450,
    under the 27,260 it started from), then recomputes windows 18 and 3:
    3,884 s added, where without the ceiling no exchange saved time (4,856,
    the plan without exchanges).  The steps are bounded (``steps``,
    ``max_evals``).  With ``finish_first``, where candidates alone bring the
    plan within the budget (:func:`_meets`; the budget is a knapsack-cover
    constraint: the best ratio can overshoot it), the :data:`MAX_FINISHERS` cheapest of them are each
    taken on a copy followed by the undo pass, and the cheapest result kept
    (:func:`_finish_step`).  ``trace`` (plain descents only): filled with
    each step's evaluation count and the first step that met finishers
    (:class:`_Trace`), so that :func:`_finish_first_from` resumes the
    finish-first descent from there instead of taking the same steps again.
    The final timeline and records, or ``None`` if no move is left,
    ``steps`` (:data:`MAX_STEPS`) are spent, or the refiner's evaluation count reaches
    ``max_evals``."""
    for _ in range(steps):
        if max_evals is not None and ref.evals >= max_evals:
            if trace is not None:
                trace.end = "start"
            return None
        m = tl.memory()
        p = int(np.argmax(m))
        peak = int(m[p])
        if ceiling is None:
            ceiling = peak
            if trace is not None:
                trace.ceiling = ceiling
        if peak <= budget:
            if trace is not None:
                trace.end = "start"
            return tl, records
        e0 = ref.evals
        ranked = _ranked(ref, costs, tl, p, banned)
        over = None   # the positions over the budget (where a candidate may finish: _meets)
        for limit in (peak, ceiling) if ceiling > peak else (peak,):   # the ceiling only at a dead end
            best, fins = None, []
            for j in ranked:
                mv = ref.evaluate(tl, j, p, peak, limit, costs)
                if mv is None:
                    continue
                if best is None or mv.score > best.score:
                    best = mv
                if (finish_first or trace is not None) and peak - mv.removed <= budget and mv.eff.raised_max <= budget:
                    over = np.flatnonzero(m > budget).tolist() if over is None else over
                    if _meets(tl, mv, over, budget):
                        fins.append(_Closer(mv.removed / mv.score, j, mv))
            if best is not None:
                break
        if trace is not None:
            trace.evals.append(ref.evals - e0)
            if fins and trace.fork is None:
                trace.fork_at = len(trace.evals)
                trace.fork = _Fork(tl.copy(), dict(records), p, peak,
                                   [c.window for c in sorted(fins, key=lambda f: (f.cost_s, f.window))[:MAX_FINISHERS]],
                                   limit)
        if finish_first and fins:
            tl, records = _finish_step(ref, tl, records, budget, p, peak, fins)
            continue
        if best is None:
            if trace is not None:
                trace.end = "none"
            return None
        ref.commit(best, p, peak, tl, records, REASON_EXCHANGE)
    return (tl, records) if int(tl.memory().max()) <= budget else None


def _meets(tl: Timeline, mv: Move, over: list[int], budget: int) -> bool:
    """Whether move ``mv`` alone brings every position of ``over`` (those
    over ``budget``, bytes, on ``tl`` before it) within the budget
    (``Timeline.new_value_at``): a finisher of the finish-first descent.
    Not only the peak position: where several positions are over the
    budget, a move that takes the peak's down alone is not the last one,
    and taking the cheapest such move with an undo pass at every step
    (:func:`_finish_step`) costs four copies, moves and undo passes per
    step (``h100_resnet50_b128`` swap-only at 0.3 of its peak: 81 finish
    steps in one solve's exchanges, none of them kept: 1.82 -> 0.99 CPU
    s; the same plans over ``solve_rate.py``'s 390 rows, and over 2,396
    solves of fuzz problems and generated graphs 4 cheaper plans, none
    costlier)."""
    return all(tl.new_value_at(mv.j, mv.policy, mv.eff, i) <= budget for i in over)


def _finish_step(ref: Evaluator, tl: Timeline, records: dict, budget: int, p: int, peak: int,
                 fins: list[_Closer]) -> tuple[Timeline, dict]:
    """A finish-first step (:func:`_descend_local`): each of the
    :data:`MAX_FINISHERS` cheapest finishers ``fins`` taken on a copy of
    ``tl`` (at peak position ``p``, ``peak`` bytes), followed by the undo
    pass; the cheapest result (ties: the lower window id)."""
    tries = []
    for _, j, mv in sorted(fins, key=lambda f: (f.cost_s, f.window))[:MAX_FINISHERS]:
        t2, r2 = tl.copy(), dict(records)
        ref.commit(mv, p, peak, t2, r2, REASON_EXCHANGE)
        _undo(ref, t2, r2, budget)
        tries.append(_Result(t2, r2, j))
    best = min(tries, key=lambda t: (t.timeline.added_s(), t.window))
    return best.timeline, best.records


def _finish_first_from(ref: Evaluator, costs: OptionCosts, trace: _Trace, budget: int, banned: set,
                       max_evals: int) -> tuple[Timeline, dict] | None:
    """The finish-first local descent (:func:`_descend_local` with
    ``finish_first``) from the start of the plain one that filled ``trace``,
    without taking its shared steps again: the evaluation count moves as
    those steps would have moved it (stopping where it reaches
    ``max_evals``, as the descent would), the fork's finishers are evaluated
    again on the fork's copy (not counted: that step's evaluations are
    counted already) and the descent goes on from the step they take.
    ``None`` where there was no fork (the twin takes the plain descent's
    steps and reaches its plan: nothing new) or the count reaches
    ``max_evals`` first."""
    fork = trace.fork
    shared = trace.evals if fork is None else trace.evals[:trace.fork_at]   # the steps the twin takes again
    if not _counted(ref, shared, max_evals) or fork is None:
        return None
    counted = ref.evals
    fins = []
    for j in fork.finishers:
        mv = ref.evaluate(fork.timeline, j, fork.p, fork.peak, fork.limit, costs)
        fins.append(_Closer(mv.removed / mv.score, j, mv))
    ref.evals = counted
    tl, records = _finish_step(ref, fork.timeline, fork.records, budget, fork.p, fork.peak, fins)
    return _descend_local(ref, costs, tl, records, budget, banned, True, max_evals,
                          steps=MAX_STEPS - trace.fork_at, ceiling=trace.ceiling)


def _counted(ref: Evaluator, evals: list[int], max_evals: int) -> bool:
    """Move the evaluation count as steps of ``evals`` evaluations each
    would, each step starting only while the count is under ``max_evals``
    (as :func:`_descend_local` checks it); whether every step started."""
    for n in evals:
        if ref.evals >= max_evals:
            return False
        ref.evals += n
    return True


def _replayed(ref: Evaluator, trace: _Trace, max_evals: int) -> tuple[Timeline, dict] | None:
    """The plain local descent that filled ``trace``, run again from the same
    start (:func:`exchange`'s twin whose window ends were all its own
    already): its plan (a copy of ``trace.result``), the evaluation count
    moved as its steps would move it, or ``None`` where the count reaches
    ``max_evals`` at the start of one of them, as it would."""
    if not _counted(ref, trace.evals, max_evals):
        return None
    if trace.end == "start" and ref.evals >= max_evals:
        return None
    if trace.result is None:
        return None
    tl, records = trace.result
    return tl.copy(), dict(records)


def _reset_ends(ref: Evaluator, tl: Timeline, records: dict) -> bool:
    """Every recomputed window in ``records`` whose end was moved to a chain
    gets its own end back (a use of its storage), all at once
    (``Timeline.move_ends``: the chains they change replayed once, not once
    per window).  Whether any did."""
    ends = []
    for j in list(records):
        if tl.state.pol[j] != REC:
            continue
        b = int(ref.orig_b[j])
        if int(tl.state.w_b[j]) != b:
            ends.append((j, b))
            records[j] = records[j].ending_before(b)
    tl.move_ends(ends)   # (their chains replayed once)
    return bool(ends)


def _cover_windows(ref: Evaluator, budget: int, chained: bool = True) -> list[int] | None:
    """The cheapest set of recomputed windows that covers ``budget`` under an
    additive model (window ids, largest first): a covering integer program
    (minimise the producers' recompute time subject to, at every position
    over the budget on the keep-everything timeline, the windows off there
    removing the excess bytes; overlapping windows of one storage exclusive),
    solved with HiGHS (``scipy.optimize.milp``, stopped within
    :data:`COVER_GAP` of its optimum or after :data:`COVER_NODES`
    branch-and-bound nodes; HiGHS's feasibility-jump heuristic off, passed
    through ``milp``'s options: it costs about 5 ms per solve whatever the
    size, most of a small program's time, and no plan of ``problems/``, the
    external graphs or the generated ones changed without it).  ``None``
    where it has no solution.  The model
    is the knapsack-cover structure a best-ratio greedy overshoots: several
    cheap recomputes instead of the best-ratio ones.  ``chained``: price
    chained recomputes (:func:`_chained_pairs`); neither model is exact, and
    each finds the better plan on some graphs (``_cover_plan`` tries both)."""
    from scipy.optimize import Bounds, LinearConstraint, milp

    tl = fresh_timeline(ref.problem, ref.mode, ref.opts.swap_overlap_margin)
    mem = tl.memory()
    over = np.flatnonzero(mem > budget)
    if not len(over):
        return None
    lo, hi = tl.windows.w_a + 1, tl.state.w_b - 1
    cols = np.flatnonzero(tl.windows.w_rec_ok & (tl.windows.w_bytes > 0) & (lo <= over[-1]) & (hi >= over[0]))
    if not len(cols):
        return None
    cover = (lo[cols][None, :] <= over[:, None]) & (over[:, None] <= hi[cols][None, :])
    rows = [cover * tl.windows.w_bytes[cols][None, :].astype(np.float64)]
    need, ub = [(mem[over] - budget).astype(np.float64)], [np.full(len(over), np.inf)]
    by_storage: dict[int, list[int]] = {}
    for k, j in enumerate(cols.tolist()):
        by_storage.setdefault(int(tl.windows.w_s[j]), []).append(k)
    for ks in by_storage.values():
        for x in ks:
            for y in ks:
                if x < y and lo[cols[x]] <= hi[cols[y]] and lo[cols[y]] <= hi[cols[x]]:
                    row = np.zeros((1, len(cols)))
                    row[0, [x, y]] = 1.0
                    rows.append(row)
                    need.append(np.zeros(1))
                    ub.append(np.ones(1))
    rtime = ref.problem.recompute_time
    cost = rtime[tl.windows.w_prod[cols]] + ref.eps
    # chained recomputes: where window j's producer reads a storage whose window k is off when j is
    # regenerated (and k is not regenerated there too), j's chain recomputes k's producer as well; a
    # variable y >= x_j + x_k - 1 per such pair carries that cost (several cheap recomputes that read each
    # other are not cheap together)
    pairs = _chained_pairs(tl, cols) if chained else []
    n, m = len(cols), len(pairs)
    A = np.vstack(rows)
    if m:
        A = np.hstack([A, np.zeros((A.shape[0], m))])
        link = np.zeros((m, n + m))
        for r, (x, y) in enumerate(pairs):
            link[r, [x, y]] = 1.0
            link[r, n + r] = -1.0
        A = np.vstack([A, link])
        need.append(np.full(m, -np.inf))
        ub.append(np.ones(m))
        cost = np.concatenate([cost, [rtime[tl.windows.w_prod[cols[y]]] for _, y in pairs]])
    with warnings.catch_warnings():   # scipy passes options it does not name to HiGHS, with this warning
        warnings.filterwarnings("ignore", message="Unrecognized options", category=RuntimeWarning)
        res = milp(cost, constraints=LinearConstraint(A, np.concatenate(need), np.concatenate(ub)),
                   integrality=np.concatenate([np.ones(n), np.zeros(m)]), bounds=Bounds(0, 1),
                   options=dict(mip_rel_gap=COVER_GAP, node_limit=COVER_NODES, time_limit=COVER_TIME_S,
                                mip_heuristic_run_feasibility_jump=False))
    if res.x is None:
        return None
    return sorted(cols[res.x[:n] > 0.5].tolist(), key=lambda j: (-int(tl.windows.w_bytes[j]), j))


def _chained_pairs(tl: Timeline, cols: np.ndarray) -> list[tuple[int, int]]:
    """Pairs ``(x, y)`` of indices into ``cols`` where recomputing window
    ``cols[x]`` at its regeneration point ``q`` (its end) needs the storage of
    window ``cols[y]`` while that one is off (``a_y < q < b_y``): the chain
    recomputes ``y``'s producer too."""
    where: dict[int, list[int]] = {}
    for k, j in enumerate(cols.tolist()):
        where.setdefault(int(tl.windows.w_s[j]), []).append(k)
    pairs = []
    for x, j in enumerate(cols.tolist()):
        q = int(tl.state.w_b[j])
        stos = {int(tl.tables.t_storage[u]) for u in tl.tables.n_inputs[int(tl.windows.w_prod[j])]}
        for s in sorted(stos):
            for y in where.get(s, ()):
                k = int(cols[y])
                if y != x and int(tl.windows.w_a[k]) < q < int(tl.state.w_b[k]):
                    pairs.append((x, y))
    return pairs


def _cover_plan(ref: Evaluator, costs: OptionCosts, budget: int) -> tuple[Timeline, dict] | None:
    """:func:`_cover_windows` (solved once per problem, window mode, margin
    and budget: the descents of a solve share it) applied to a
    keep-everything timeline, then the local descent where its model missed
    (chains that need evicted inputs, points a chain raises) and the undo
    pass; ``None`` where the program has no solution or the plan does not
    get within ``budget``.  Both covering programs (additive, and with
    chained recomputes priced) are tried; the cheaper plan once regenerated
    storages are kept (:func:`~libra_opt.solvers.libra.tidy.keep_regenerated`,
    done here) is returned."""
    if not ref.allow_rec or ref.mode != "default":
        return None   # single-phase graphs ("all" windows): long chains, far from the additive model
    best = None
    for chained in (False, True):
        plan = _covered(ref, costs, budget, chained)
        if plan is not None:
            keep_regenerated(plan[0], plan[1], budget)   # compared as the finish will make them
            if best is None or plan[0].added_s() < best[0].added_s() * (1 - MIN_GAIN):
                best = plan
    return best


def _covered(ref: Evaluator, costs: OptionCosts, budget: int, chained: bool) -> tuple[Timeline, dict] | None:
    """One covering program's plan (:func:`_cover_plan`), or ``None``."""
    start = _cover_start(ref, budget, chained)
    if start is None:
        return None
    tl, records = start
    done = _descend_local(ref, costs, tl, records, budget, set(), max_evals=ref.evals + _effort(ref)[2])
    if done is None:
        return None
    tl, records = done
    _undo(ref, tl, records, budget)
    return tl, records


def _cover_start(ref: Evaluator, budget: int, chained: bool) -> tuple[Timeline, dict] | None:
    """The windows of one covering program (:func:`_cover_windows`) applied,
    largest first, to a keep-everything timeline, with their decision
    records: copies, to complete (:func:`_covered`); ``None`` where the
    program has no solution.  Both are built once per problem, window mode,
    margin, budget and program (the ``"libra.covers"`` and
    ``"libra.cover_starts"`` memos of the problem's tables): they read no
    descent (the timeline's own evaluations), and the solve's descents
    finish their plans from the same ones (the VGG segmentation graph
    recompute-only at 0.5 of its peak: three descents' plans, two
    programs)."""
    key = (ref.mode, float(ref.opts.swap_overlap_margin), int(budget), chained)
    per = ref.problem.tables.memo("libra.covers", dict)   # per (window mode, margin, budget, chained)
    if key not in per:
        per[key] = _cover_windows(ref, budget, chained)
    if not per[key]:
        return None
    starts = ref.problem.tables.memo("libra.cover_starts", dict)   # the same keys
    if key not in starts:
        starts[key] = _applied(ref, per[key])
    tl, records = starts[key]
    return own_copy(tl), dict(records)


def _applied(ref: Evaluator, windows: list[int]) -> tuple[Timeline, dict]:
    """``windows`` recomputed, in that order (each where it is feasible), on a
    keep-everything timeline of ``ref``'s window mode and margin, with a
    decision record each (reason ``REASON_EXCHANGE``)."""
    tl = fresh_timeline(ref.problem, ref.mode, ref.opts.swap_overlap_margin)
    records: dict = {}
    for j in windows:
        eff = tl.evaluate(j, REC)
        if not eff.feasible:
            continue
        m = tl.memory()
        p = int(np.argmax(m))
        tl.apply(j, REC, eff)
        records[j] = explain(ref.problem, step=-1, storage=int(tl.windows.w_s[j]), after=int(tl.windows.w_a[j]),
                             before=int(tl.state.w_b[j]), policy=Policy.RECOMPUTE.value, nbytes=int(tl.windows.w_bytes[j]),
                             peak_bytes=int(m[p]), peak_pos=p, removed_bytes=int(m[p] - tl.memory(p, p + 1)[0]),
                             added_s=max(eff.cost_s, 0.0), recompute_s=max(eff.cost_s, 0.0), swap_s=None,
                             reason=REASON_EXCHANGE)
    return tl, records


def exchange(ref: Evaluator, costs: OptionCosts, tl: Timeline, records: dict, budget: int, descent_evals: int = 0
             ) -> tuple[Timeline, dict, int]:
    """Exchange moves (module docstring) from the prepared timeline ``tl`` and
    its decision ``records`` for ``budget`` bytes; neither is changed.
    ``ref``: the descent (its evaluation of moves, window ends and options);
    ``costs``: the option-cost caches of the snapshot ``tl`` comes from
    (they order and skip options; read only).  At
    most ``max(MIN_EVALS, EVAL_RATIO * descent_evals)`` candidate evaluations
    (:data:`LARGE_EVAL_RATIO` on problems of more than :data:`LARGE_NODES` nodes)
    (``descent_evals``: those the descent made to get there), so exchanges
    cost a bounded multiple of the descent; on a swap-only descent's plan
    (``ref.allow_rec`` false) at most ``max(MIN_EVALS, SWAP_EVALS_PER_NODE *
    nodes)`` of those (``h100_resnet50_b128`` swap-only at 0.3 of its peak:
    2,076 evaluations without that cap, none of which kept an exchange; at
    most 315 with it).  With ``ref.opts.exchange_effort == "thorough"``, the
    :data:`THOROUGH_TRIES`, :data:`THOROUGH_EVAL_RATIO` and
    :data:`THOROUGH_MIN_EVALS` in their place, on every problem size.

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
    tries, ratio, least = _effort(ref)
    allowed = max(least, ratio * int(descent_evals))
    if not ref.allow_rec:
        allowed = min(allowed, max(least, SWAP_EVALS_PER_NODE * ref.problem.num_nodes))
    stop = ref.evals + allowed
    for _ in range(MAX_ROUNDS):
        cost = tl.added_s()
        kept_cost = None   # the cost of ``tl`` once the finish keeps regenerated storages (computed when needed)
        found = None
        for j in sorted(records, key=lambda k: (-records[k].added_s, k))[:tries]:
            if records[j].added_s <= 0:
                break
            trace = _Trace()
            for finish_first, reset in ((False, False), (True, False), (False, True)):
                if finish_first:   # the plain descent's twin, resumed where it departs from it
                    done = _finish_first_from(ref, costs, trace, budget, banned | {j}, stop)
                else:
                    t2, r2 = tl.copy(), dict(records)
                    eff = t2.evaluate(j, KEEP)
                    if not eff.feasible:
                        break
                    t2.apply(j, KEEP, eff)
                    del r2[j]
                    if reset and not _reset_ends(ref, t2, r2):
                        # no end moved: it starts where the plain descent did, and takes its steps
                        done = _replayed(ref, trace, stop)
                    else:
                        done = _descend_local(ref, costs, t2, r2, budget, banned | {j}, False, stop,
                                              trace=None if reset else trace)
                        if not reset and done is not None:
                            trace.result = (done[0].copy(), dict(done[1]))
                if done is None:
                    continue
                t2, r2 = done
                _undo(ref, t2, r2, budget)
                limit = cost
                if reset:   # compared with ``tl`` as the finish will make it: regenerated storages kept too
                    keep_regenerated(t2, r2, budget)
                    if kept_cost is None:
                        t3 = tl.copy()
                        keep_regenerated(t3, dict(records), budget)
                        kept_cost = min(cost, t3.added_s())
                    limit = kept_cost
                if t2.added_s() < limit * (1 - MIN_GAIN) and (
                        found is None or t2.added_s() < found.timeline.added_s()):
                    found = _Result(t2, r2, j)
        if found is None:
            break
        tl, records = found.timeline, found.records
        banned.add(found.window)
        kept += 1
    if ref.problem.num_nodes <= COVER_MAX_NODES and records:
        cov = _cover_plan(ref, costs, budget)
        if cov is not None:
            t2, r2 = cov
            t3 = tl.copy()
            keep_regenerated(t3, dict(records), budget)
            if t2.added_s() < min(tl.added_s(), t3.added_s()) * (1 - MIN_GAIN):
                tl, records = t2, r2
                kept += 1
    return tl, records, kept


__all__ = ["exchange", "undo_pass", "MAX_TRIES", "MAX_ROUNDS", "MAX_STEPS"]
