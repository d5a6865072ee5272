"""The greedy refinement behind the ``libra`` solver: one resumable descent
per problem and policy (:class:`Refiner`), and its snapshots.  The finish
step (undo pass, segment-wise regeneration, retention, lowering, simulation,
repair) is :mod:`libra_opt.solvers.libra.finish`, composed around a descent
(:class:`~libra_opt.solvers.libra.finish.Finisher` takes it as its
evaluator); the records they share are :mod:`libra_opt.solvers.libra.records`.

See :mod:`libra_opt.solvers.libra.solver` for the algorithm; the incremental
model it scores moves with is :mod:`libra_opt.solvers.libra.estimate`.

Source: Libra (Wang, NTHU 2024), greedy refinement from the profiled peak;
Chen et al., "Training Deep Nets with Sublinear Memory Cost" (2016), sec. 4.1,
for keeping a segment's recomputed activations until their backward use.
"""
from __future__ import annotations

import time
from typing import NamedTuple, Sequence

import numpy as np

from libra_opt.passes.lowering import Policy
from libra_opt.ir.problem import RematProblem

from .codes import NEG
from .estimate import KEEP, REC, SWAP, Timeline
from .explain import (REASON_CHEAPEST, REASON_NEW_PEAK, REASON_NOT_RECOMPUTABLE, REASON_ONLY_POLICY,
                      REASON_SWAP_NO_GAIN, REASON_SWITCH, Decision, explain)
from .finish import Finisher
from .swaps import released_by
from .tables import window_hi
from .tidy import broken_ends, fix_shrunk
from .records import FinishedPlan, Merge, Move, OptionCosts, Prepared, RetainInputs, Shrink, Snapshot, fresh_timeline


#: most other windows a merged-regeneration variant tries per evaluation (``Refiner._try_merge``)
MAX_MERGES = 2
#: most candidates evaluated exactly per refinement step before the best evaluated one is taken
MAX_EVALS_PER_STEP = 48
#: at a dead end (no candidate at the peak keeps every raised point under it), a step may raise points up to
#: this much over the peak (relative), where the dead end's peak is under that of the last such step
UPHILL_REL = 0.03
#: such steps per descent at most
UPHILL_STEPS = 4
#: option columns: recompute, swap hidden behind compute, delayed swap, swap that waits for its copy out
_O_REC, _O_HID, _O_LATE, _O_WAIT = 0, 1, 2, 3


def _over_limit(held: int, limit: int) -> bool:
    """Whether memory a recomputation variant holds whatever its chains
    cost (bytes: ``held``, known before its evaluation) refuses it under
    ``limit`` (bytes): the merged-regeneration and retained-input variants
    (``Refiner._try_merge``, ``Refiner._try_retain``) are then not
    evaluated.  On a random layered graph of 1,000 nodes, recompute-only
    at 0.8 of its peak, this refuses nearly every merge (648 of 657 tried,
    3 of which were admissible) and 319 of the retain evaluations, and the
    solve takes 1.6 CPU s instead of 2.4."""
    return held >= limit


class _Todo(NamedTuple):
    """An option :meth:`Refiner._evaluate` is still to try on one window."""
    cached: float   # its cached (lower-bound) cost, s
    col: int        # its option column (_O_REC, _O_HID, _O_LATE, _O_WAIT)
    policy: int     # REC or SWAP
    floor: int      # earliest position of the swap-in (0: none)


class _Tried(NamedTuple):
    """An option :meth:`Refiner._evaluate` evaluated on the timeline."""
    policy: int
    floor: int
    eff: object     # Timeline.evaluate's effect


class _Option(NamedTuple):
    """An admissible option of one window (it lowers the peak position and
    keeps every raised point under the limit); the cheapest is the move, ties
    broken by recompute first, then the lower floor."""
    cost: float     # added time, s (>= 0)
    swap: bool      # not a recomputation (the tie-break)
    floor: int
    policy: int
    eff: object
    removed: int    # bytes taken off the peak position
    shrink: Shrink | None = None
    also: Merge | RetainInputs | None = None


class _Checkpoint(NamedTuple):
    """What :meth:`Refiner.rewind` restores a descent from: its snapshot at
    a step (timeline, records, option-cost caches, counters) and the caches
    of refused options' raised points (``bat``, ``bat_p``, ``bmem``), which
    order its later selections (``Refiner.bat_any``, the rows of ``bat`` the
    selection reads, is rebuilt from ``bat``); the other caches of a
    selection are rewritten at each step before they are read."""
    snap: Snapshot
    bat: np.ndarray
    bat_p: np.ndarray
    bmem: np.ndarray
    used_early: bool
    uphill: tuple   # Refiner._up: the uphill steps' state (steps left, last dead end's peak, lowest dead end)


class Refiner:
    """One greedy descent over one problem and policy; resumable, with
    snapshots (Libra, Wang NTHU 2024: greedy refinement from the profiled
    peak).  Implements the :class:`~libra_opt.solvers.libra.records.Evaluator`
    interface the finish step (:class:`~libra_opt.solvers.libra.finish.Finisher`,
    built per call by :meth:`prepare`, :meth:`realize` and
    :meth:`as_lowered`) and the exchange moves use.

    Parameters
    ----------
    problem : RematProblem
    opts : LibraOptions
        The solver's options (``policy``, ``windows``, ``swap_waits``,
        ``swap_overlap_margin``, ``max_steps``, ``time_limit_s``, ...).
    """

    def __init__(self, problem: RematProblem, opts):
        self.problem = problem
        self.opts = opts
        mode = opts.windows
        if mode == "auto":
            mode = "default" if problem.boundary < problem.num_nodes else "all"
        self.mode = mode   # the windows it descends over: "default" or "all"
        self.tl = tl = fresh_timeline(problem, mode, opts.swap_overlap_margin)
        self.allow_rec = opts.policy != "swap"
        self.allow_swap = opts.policy != "recompute"
        self.lo = tl.windows.w_a + 1
        self.hi = tl.state.w_b - 1
        self.orig_b = tl.state.w_b.copy()
        self.eps = 1e-9 * max(problem.total_compute_s, 1e-30) / max(problem.num_nodes, 1)
        self.enabled = (tl.windows.w_bytes > 0) & ((tl.windows.w_rec_ok & self.allow_rec) | self.allow_swap)
        # cached cost of moving each window to each option (s), refreshed whenever it is evaluated:
        # recompute, swap with the swap-in hidden behind compute (and the positions it covers), swap
        # with the swap-in delayed past the peak, swap that waits for its copy out before the peak (a
        # stall, where the copy cannot end before it).  They bound scores for the lazy selection.
        # Columns: _O_REC, _O_HID, _O_LATE, _O_WAIT.  An option refused because it would raise position
        # ``bat`` by ``bmem`` bytes to the peak is left out while that would still reach the peak.
        self.costs = OptionCosts(np.zeros((tl.windows.nw, 4)), self.lo.copy(), self.hi.copy())
        cost = self.costs.cost
        cost[:, _O_REC] = np.where(tl.windows.w_rec_ok & self.allow_rec, problem.recompute_time[tl.windows.w_prod], np.inf)
        if not self.allow_swap:
            cost[:, _O_HID] = cost[:, _O_LATE] = np.inf
        # waiting for a copy out only helps where copies overlap compute (elsewhere a copy blocks it anyway)
        waits = opts.swap_waits if opts.swap_waits is not None else opts.policy == "swap"
        self.allow_wait = self.allow_swap and tl.tables.overlap and waits
        if not self.allow_wait:
            cost[:, _O_WAIT] = np.inf
        # per candidate: whether a swap could release it by this step's peak position (release_bound <= p)
        self.rel_ok = np.zeros(tl.windows.nw, dtype=bool)
        self.bat = np.full((tl.windows.nw, 4), -1, dtype=np.int64)
        self.bmem = np.zeros((tl.windows.nw, 4), dtype=np.int64)
        # the peak position each was found at: a delayed or waiting swap's effect depends on it, so its
        # raised point is only known for that position
        self.bat_p = np.full((tl.windows.nw, 4), -1, dtype=np.int64)
        # windows with a raised point in ``bat`` (or that had one since their last move): a few percent of
        # the candidates, the only rows the selection reads
        self.bat_any = np.zeros(tl.windows.nw, dtype=bool)
        self.eval_step = np.full(tl.windows.nw, -1, dtype=np.int64)
        self.cache: dict[int, Move] = {}
        self.records: dict[int, Decision] = {}
        self.step = 0
        self.evals = 0   # candidate evaluations (_evaluate calls) so far, the descent's and exchanges'
        self.used_early = False   # an early regeneration was taken (see LibraSolver's fallback)
        # the first step whose selection an early regeneration changed (None: none so far): up to it, a
        # descent of the same options without ``early`` takes the same steps (LibraSolver._own_plain_twin)
        self.early_step: int | None = None
        self.done = False
        self.cut_short = False
        self.busy_s = 0.0           # seconds spent inside descend() so far (this descent's own clock)
        self._since: float | None = None
        self.time_limit_s = opts.time_limit_s   # on busy_s; LibraSolver shares its option among descents
        self.asked: set[int] | None = None      # budgets this descent is run for (None: every budget)
        # budgets it was not run for because a lower bound on what its plan adds (s) rules it out there,
        # with that bound (LibraSolver._bounded)
        self.skipped: dict[int, float] = {}
        # the cached recompute cost of a window (its selection bound) is the cheapest admissible recompute
        # option found, variants included (True; LibraSolver's portfolio) or the plain recomputation's
        self.variant_bounds = False
        # run only for cheaper plans where other descents meet a budget (LibraSolver._waiting_hybrid): its plans
        # are finished apart from the others' (LibraSolver._libra_plan)
        self.apart = False
        self.missed_by: "Refiner | None" = None   # run only for the budgets this descent misses (LibraSolver)
        self._final: Snapshot | None = None
        self.undo_memo: dict = {}   # (id(snapshot), budget) -> the undo pass's result (finish.Finisher._undone)
        self._final_peak: int | None = None
        # checkpoints for rewind(): one every ``checkpoint_every`` steps (None: none are kept), at most
        # MAX_CHECKPOINTS (thinned by half, the interval doubled, when full); the estimated peak before
        # each step taken (index: step)
        self.checkpoint_every: int | None = None
        self._checkpoints: list[_Checkpoint] = []
        self._peaks: list[int] = []
        # uphill steps (_uphill): steps left, the peak of the last dead end one was taken at (None: none yet),
        # and the lowest dead end met, (peak, timeline, records, option costs) copies, or None
        self._up: tuple = (UPHILL_STEPS, None, None)

    #: checkpoints a descent keeps at most (their memory: a timeline copy each)
    MAX_CHECKPOINTS = 32

    # ------------------------------------------------------------ descent
    def descend(self, budgets: Sequence[int], to_end: bool = False) -> dict[int, Snapshot]:
        """Refine until the peak is under every budget (or, ``to_end``, until
        no move is left); snapshot the state when it first gets under each."""
        self._since = time.perf_counter()
        try:
            return self._descend(budgets, to_end)
        finally:
            self.busy_s += time.perf_counter() - self._since
            self._since = None

    @property
    def label(self) -> str:
        """The name a plan of this descent gets in ``extras["descent"]``: its
        policy, ``"-waits"`` added for a descent run apart that waits for
        copies out (:attr:`apart`, ``LibraSolver._waiting_hybrid``)."""
        return f"{self.opts.policy}-waits" if self.apart else self.opts.policy

    def clock_s(self) -> float:
        """Seconds this descent has spent refining (inside :meth:`descend`),
        not wall time since it was built: the descents of a portfolio run one
        after another."""
        return self.busy_s + (time.perf_counter() - self._since if self._since is not None else 0.0)

    def _descend(self, budgets: Sequence[int], to_end: bool) -> dict[int, Snapshot]:
        """:meth:`descend` without its clock: one move per step at the current
        peak (:meth:`_select`, :meth:`_commit`) until every budget is met, no
        move is left or a step or time limit is reached."""
        tl = self.tl
        pending = sorted(set(int(b) for b in budgets), reverse=True)
        out: dict[int, Snapshot] = {}
        while True:
            m = tl.memory()
            p = int(m.argmax())
            peak = int(m[p])
            if self.checkpoint_every is not None and self.step == len(self._peaks):   # a step not seen before
                self._peaks.append(peak)
                if self.step % self.checkpoint_every == 0:
                    self._checkpoint(peak)
            while pending and peak <= pending[0]:
                out[pending.pop(0)] = self._snapshot(peak)
            if (not pending and not to_end) or self.done:
                break
            o = self.opts
            if (o.max_steps is not None and self.step >= o.max_steps) or (
                    self.time_limit_s is not None and self.clock_s() > self.time_limit_s):
                self.done = self.cut_short = True
                break
            move = self._select(p, peak, m)
            if move is None:
                move = self._uphill(p, peak)
            if move is None:
                self._settle()
                self.done = True
                break
            self._commit(move, p, peak)
        return out

    def start_from(self, source: "Refiner") -> None:
        """Start this descent where ``source`` (a descent of the same problem
        and window mode, run to its end) ended: its timeline (a copy),
        decision records, step and evaluation counts.  This descent's option
        caches stay its own (fresh lower bounds: its first selection
        evaluates each option anew; taking ``source``'s recompute caches,
        which saved 4-9 recompute evaluations per continued descent, changed
        1 of the 285 plans of ``benchmarks/continued_gain.py``, 0.16 %
        costlier).  Used by
        :class:`~libra_opt.solvers.libra.continued.ContinuedRefiner`."""
        end = source.final()
        self.tl = end.timeline.copy()
        self.records = dict(end.records)
        self.step, self.evals, self.used_early = end.step, end.evals, source.used_early

    def _checkpoint(self, peak: int) -> None:
        """Keep the state now (estimated peak ``peak``, bytes) for :meth:`rewind`;
        where :attr:`MAX_CHECKPOINTS` are kept, every other one is dropped
        and the interval doubles."""
        cps = self._checkpoints
        if len(cps) >= self.MAX_CHECKPOINTS:
            self.checkpoint_every *= 2
            cps[:] = [c for c in cps if c.snap.step % self.checkpoint_every == 0]
        if self.step % self.checkpoint_every == 0:
            cps.append(_Checkpoint(self._snapshot(peak), self.bat.copy(), self.bat_p.copy(), self.bmem.copy(),
                                   self.used_early, self._up))

    def rewind(self, budget: int) -> bool:
        """Put the descent back at its last checkpoint before the step at
        which its estimated peak first got to ``budget`` (bytes) or under it
        (its last checkpoint where it never did), so that :meth:`descend`
        for budgets up to ``budget`` takes exactly the snapshots a fresh
        descent takes: a descent's moves do not depend on the budgets it is
        asked for (they only say where it snapshots and stops), and a
        checkpoint holds every part of its state that later steps read.
        The stated minimum of an infeasible budget is searched for this way
        on the descents the solve ran (``LibraSolver._first_planned``),
        rather than on new ones.  Its end (:meth:`final`, a state every
        rewound descent reaches again) is kept.

        Returns ``False`` (nothing changed) where the descent has taken
        steps without keeping checkpoints (:attr:`checkpoint_every` was
        ``None``); ``True`` otherwise, a descent that has taken no step
        included."""
        if self.step == 0:
            return True
        if not self._checkpoints:
            return False
        first = next((k for k, pk in enumerate(self._peaks) if pk <= budget), len(self._peaks) - 1)
        cp = max((c for c in self._checkpoints if c.snap.step <= first), key=lambda c: c.snap.step, default=None)
        if cp is None:
            return False
        snap = cp.snap
        self.tl = snap.timeline.copy()
        self.records = dict(snap.records)
        self.costs = snap.caches.copy()
        self.step, self.evals, self.cut_short, self.done = snap.step, snap.evals, snap.cut_short, False
        self.bat, self.bat_p, self.bmem, self.used_early = cp.bat.copy(), cp.bat_p.copy(), cp.bmem.copy(), cp.used_early
        self._up = cp.uphill
        self.bat_any = (self.bat >= 0).any(axis=1)
        self.eval_step[:] = -1   # (all before the checkpoint's step there: a selection's cache is its step's only)
        return True

    def final(self) -> Snapshot:
        """The state at the end of the descent (the lowest peak it reaches)."""
        if self._final is None:
            self.descend([], to_end=True)
            self._final = self._snapshot(self.tl.peak()[0])
        return self._final

    def _snapshot(self, peak: int) -> Snapshot:
        """The descent's state now, its estimated peak ``peak`` (bytes), as a
        :class:`~libra_opt.solvers.libra.records.Snapshot` (copies)."""
        return Snapshot(self.step, peak, self.clock_s(), self.tl.copy(), dict(self.records),
                         self.cut_short, self.costs.copy(), self.evals)

    def candidates(self, tl: Timeline, p: int) -> np.ndarray:
        """Window ids a move may change at peak position ``p``: kept windows
        around ``p``; swapped ones whose swap-in comes back before ``p`` (to
        switch to recomputation or delay the swap-in); in hybrid mode,
        recomputed ones whose chain runs at ``p`` (to switch to a swap); none
        of a storage with retained tensors (``tl.state.s_retained``: a storage
        is either evicted or retained)."""
        rng = (self.lo <= p) & (tl.state.w_b > p) & self.enabled   # (lo <= p <= w_b - 1)
        mask = rng & (tl.state.pol == KEEP)
        if self.allow_swap:
            mask |= rng & (tl.state.pol == SWAP) & ~((tl.state.sw_r0 <= p) & (p <= tl.state.sw_pos))
        ch = tl.state.chains.get(p)
        if ch is not None and self.allow_rec and self.allow_swap:
            extra = [j for s in ch.touched for j in tl.windows.s_windows.get(s, ())
                     if tl.state.pol[j] == REC and tl.windows.w_a[j] < p <= tl.state.w_maxhi[j]]
            if extra:   # into the mask (np.union1d sorted every candidate again: O(W log W) a step)
                mask[extra] = True
        if tl.state.s_retained:   # _evaluate refuses them: not evaluated, nor counted in MAX_EVALS_PER_STEP
            sw = tl.windows.s_windows
            out = [j for s in tl.state.s_retained for j in sw.get(s, ())]
            if out:
                mask[out] = False
        return mask.nonzero()[0]

    def _select(self, p: int, peak: int, mem: np.ndarray) -> Move | None:
        """Lazy best-first selection: candidates in order of their cached score
        bound; the first whose fresh evaluation is still the best is taken."""
        tl = self.tl
        idx = self.candidates(tl, p)
        if not len(idx):
            return None
        costs = self.costs
        # options whose raised point is known: out while it still reaches the peak
        r, col, at = self._raised_points(idx, p)
        hit = mem[at] + self.bmem.ravel()[idx[r] * 4 + col] >= peak if len(r) else None
        # (rows by np.take, columns through 1-D views: a 2-D array's fancy row index cost 8x the take on a
        # 20k-op problem's 4,600 candidates, and a (mask, column) index twice a column view's)
        if not self.allow_swap:   # recompute only: the swap columns are inf (never evaluated)
            best = costs.cost[:, _O_REC][idx]
            if hit is not None:
                best[r[hit & (col == _O_REC)]] = np.inf
        else:
            c = np.take(costs.cost, idx, axis=0)
            if hit is not None:
                c[r[hit], col[hit]] = np.inf
            # lo <= p, lo the later of the cached hidden swap's first position and the release bound
            rel, hi = (costs.hid_lo[idx] <= p) & self._released_by(tl, idx, p), costs.hid_hi[idx]
            self.rel_ok[idx] = rel   # read by _evaluate during this selection
            hid = np.where(rel & (p <= hi), c[:, _O_HID], np.inf)
            # a swapped window's swap-in may be delayed past p where it is issued before p
            swapped = tl.state.pol[idx] == SWAP
            late_hi = np.where(swapped, tl.state.sw_pos[idx], hi)
            late = np.where((p > late_hi) & rel, c[:, _O_LATE], np.inf)
            best = np.minimum(np.minimum(c[:, _O_REC], hid), late)   # the row minimum, faster
            if self.allow_wait:   # (else the column is inf: no waiting option is ever evaluated)
                # p < max(lo, the swap's release where it is swapped already)
                wait = np.where(rel & ~(swapped & (p < tl.state.sw_r0[idx])), np.inf, c[:, _O_WAIT])
                best = np.minimum(best, wait)
        local = np.where(np.isfinite(best), tl.windows.w_bytes[idx] / np.maximum(best, self.eps), -np.inf)
        fresh_best = None
        evals = 0
        while True:
            k = int(local.argmax())
            if local[k] == -np.inf:
                return fresh_best
            j = int(idx[k])
            if self.eval_step[j] == self.step:
                return self.cache[j]
            if evals >= MAX_EVALS_PER_STEP and fresh_best is not None:
                return fresh_best
            self.eval_step[j] = self.step
            evals += 1
            mv = self._evaluate(tl, j, p, peak, peak, costs, True, mem)
            if mv is None:
                local[k] = -np.inf
            else:
                self.cache[j] = mv
                local[k] = mv.score
                if fresh_best is None or mv.score > fresh_best.score:
                    fresh_best = mv

    def _uphill(self, p: int, peak: int) -> Move | None:
        """At a dead end (:meth:`_select` found no candidate at peak position
        ``p`` whose raised points stay under ``peak``, bytes), a move whose
        raised points stay under ``peak * (1 +`` :data:`UPHILL_REL` ``)``: it
        lowers ``p`` and may raise another point over the peak, which later
        steps take down.  Taken only while the dead end's peak is under that
        of the last dead end one was taken at, at most :data:`UPHILL_STEPS`
        times (so the descent ends); the lowest dead end is kept, and
        :meth:`_settle` returns to it where the descent ends above it.
        Candidates in order of their cached score bound, at most
        :data:`MAX_EVALS_PER_STEP` evaluated (without the descent's caches:
        :meth:`evaluate`), the best score taken.  Only with the ``uphill``
        option (recompute-only mode; off by default: it finds lower budgets
        at twice the time and more, ``LibraOptions``).

        Why: a retained-inputs recomputation holds its inputs until its
        chain, raising that chain's point; the descent stops where every
        candidate does so over the peak (``random_layered_graph(1000, seed=0)``
        recompute-only: its least plannable budget 0.7062 -> 0.6782 of the
        peak; ``random_layered_graph(250, seed=0)`` 0.5655 -> 0.5341; the
        same with 2 such steps at most: 0.6804 and 0.5352).
        Source: a bounded uphill step out of a local minimum, as in tabu
        search (Glover, ORSA J. Computing 1989); the exchange moves' local
        descents take the same step at their dead ends
        (``exchange._descend_local``)."""
        left, mark, low = self._up
        if not self.opts.uphill or left <= 0 or (mark is not None and peak >= mark):
            return None
        tl = self.tl
        if low is None or peak < low[0]:
            low = (peak, tl.copy(), dict(self.records), self.costs.copy())
        idx = self.candidates(tl, p)
        found = None
        if len(idx):
            bound = np.maximum(np.take(self.costs.cost, idx, axis=0).min(axis=1), self.eps)
            key = np.where(np.isfinite(bound), tl.windows.w_bytes[idx] / bound, -np.inf)
            limit = int(peak * (1 + UPHILL_REL))
            for k in np.lexsort((idx, -key))[:MAX_EVALS_PER_STEP].tolist():
                if key[k] == -np.inf:
                    break
                mv = self.evaluate(tl, int(idx[k]), p, peak, limit, self.costs)
                if mv is not None and (found is None or mv.score > found.score):
                    found = mv
        self._up = (left - (found is not None), peak, low)
        return found

    def _settle(self) -> None:
        """At the end of the descent, back to the lowest dead end
        (:meth:`_uphill`) where the uphill steps after it ended higher."""
        low = self._up[2]
        if low is not None and self.tl.peak()[0] > low[0]:
            self.tl, self.records, self.costs = low[1].copy(), dict(low[2]), low[3].copy()

    def _raised_points(self, idx: np.ndarray, p: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The cached raised points (``bat``) of windows ``idx`` that still
        apply at peak position ``p``: all but those of the delayed and the
        waiting swaps found at another position.  ``(rows, cols, points)``:
        the row in ``idx`` (ascending), the option column and the position,
        one per known point (the known ones are few: only the rows of
        :attr:`bat_any` are read)."""
        rows = self.bat_any[idx].nonzero()[0]
        # (flat indices into the C-ordered (windows, 4) tables: a 2-D fancy index or nonzero costs several
        # times the 1-D one)
        sub = np.take(self.bat, idx[rows], axis=0).ravel()
        flat = (sub >= 0).nonzero()[0]
        r, col, at = flat >> 2, flat & 3, sub[flat]
        r = rows[r]
        if len(r):
            ok = (col < _O_LATE) | (self.bat_p.ravel()[idx[r] * 4 + col] == p)
            if not ok.all():
                r, col, at = r[ok], col[ok], at[ok]
        return r, col, at

    def _released_by(self, tl: Timeline, idx: np.ndarray, p: int) -> np.ndarray:
        """Whether a swap of each window in ``idx`` could release its storage
        by position ``p`` (bool, shape ``(n,)``): after its copy out, queued
        behind the copies already issued before it (a lower bound on the
        release: later copies are not delayed here; see
        :func:`~libra_opt.solvers.libra.swaps.released_by`).  Where copies
        block compute, from the window's first position on."""
        if not tl.tables.overlap:
            return self.lo[idx] <= p
        return released_by(tl, idx, p)

    def evaluate(self, tl: Timeline, j: int, p: int, peak: int, limit: int | None,
                 costs: OptionCosts) -> Move | None:
        """:meth:`_evaluate` on a timeline other than the descent's own (a
        prepared plan's, in exchange moves and repairs), its options ordered
        and skipped by ``costs`` (a snapshot's caches, read only): no cache
        of the descent is changed (but its evaluation count), and no early
        regeneration is tried.  ``peak``: the memory at ``p`` (bytes), read
        only where ``limit`` is not ``None``."""
        return self._evaluate(tl, j, p, peak, limit, costs, False)

    def _evaluate(self, tl: Timeline, j: int, p: int, peak: int, limit: int | None, costs: OptionCosts,
                  descent: bool, mem: np.ndarray | None = None) -> Move | None:
        """Best admissible option for window ``j`` at peak position ``p``: every
        raised point stays under ``limit`` (``None``: no such condition) and
        position ``p`` goes down.  Options: recompute; swap with the swap-in
        where it hides behind compute; swap with the swap-in delayed to right
        after ``p`` (it then covers ``p``, at the price of a stall); swap that
        waits for its copy out right before ``p`` (where the copy cannot end
        before ``p``; a stall), its swap-in after ``p``.  An evicted window
        may switch policy, delay its swap-in or wait for its copy out.
        ``costs``: the option-cost caches that order and skip the options.
        ``descent``: ``tl`` is the descent's own timeline, in its selection
        step: the caches (``costs`` must then be the descent's own) learn the
        evaluated costs and the points they raise, and an early regeneration
        is tried; otherwise nothing of the descent changes.  ``mem``: ``tl.memory()``
        where the caller has it (the selection step's: each evaluation computed
        it again, O(N)); computed where needed otherwise."""
        self.evals += 1
        ocost = costs.cost   # (windows, 4) s
        s = int(tl.windows.w_s[j])
        if s in tl.state.s_retained:   # a storage is either evicted or retained
            return None
        cur = int(tl.state.pol[j])
        others = [int(tl.state.pol[k]) for k in tl.state.s_win.get(s, ()) if k != j]
        m_p = int(tl.memory(p, p + 1)[0]) if limit is None else peak
        b = int(tl.state.w_b[j])
        # options, tried cheapest cached cost first (recompute first on ties); an option is skipped
        # once an admissible one is known to cost no more than its cached (lower-bound) cost
        todo: list[_Todo] = []
        if self.allow_rec and tl.windows.w_rec_ok[j] and SWAP not in others and cur != REC:
            todo.append(_Todo(ocost[j, _O_REC], _O_REC, REC, 0))
        if self.allow_swap and REC not in others:
            natural = not descent or bool(self.rel_ok[j])   # the copy out may end before p
            if cur != SWAP and p <= costs.hid_hi[j]:
                # a swap whose copy out cannot end before p does not lower p (and more copies only
                # delay the others): evaluate it only where it may release the storage by p
                if natural:
                    todo.append(_Todo(ocost[j, _O_HID], _O_HID, SWAP, 0))
            elif (tl.state.pos.get(j, -1) if cur == SWAP else costs.hid_hi[j]) < p < b:
                todo.append(_Todo(ocost[j, _O_LATE], _O_LATE, SWAP, p))
            if self.allow_wait and p < b and (not natural if cur != SWAP else (
                    tl.state.wait[j] != p and p < int(tl.state.sw_r0[j]))):
                # the copy out cannot end before p: wait for it right before p (its swap-in after p)
                todo.append(_Todo(ocost[j, _O_WAIT], _O_WAIT, SWAP, max(p, int(tl.state.floor[j]) if cur == SWAP else 0)))
        if descent and limit is not None and todo:
            # as in _select: an option known to raise a point to the peak stays out while it still would
            mem = tl.memory() if mem is None else mem
            bat, bat_p = self.bat[j].tolist(), self.bat_p[j].tolist()
            for col in (_O_LATE, _O_WAIT):   # _raised_points of one window
                if bat_p[col] != p:
                    bat[col] = -1
            todo = [x for x in todo if bat[x.col] < 0 or int(mem[bat[x.col]]) + int(self.bmem[j, x.col]) < peak]
        opts: list[_Tried] = []
        ok: list[_Option] = []
        while todo:
            todo.sort(key=lambda x: (x.cached, x.col))
            cached, col, pol, fl = todo.pop(0)
            if ok:
                best = min(ok, key=lambda x: (x.cost, x.swap))
                if cached > best.cost or (cached == best.cost and col != _O_REC):
                    break
            if pol == SWAP:
                e = tl.evaluate(j, pol, floor=fl, wait=p if col == _O_WAIT else None)
            else:
                e = tl.evaluate(j, REC)
            opts.append(_Tried(pol, fl, e))
            if descent:
                self._remember(j, pol, fl, e, col)
                self.bat[j, col] = -1
            if not e.feasible:
                continue
            newp = tl.new_value_at(j, pol, e, p)
            if newp < m_p and (limit is None or e.raised_max < limit):
                ok.append(_Option(max(e.cost_s, 0.0), pol != REC, fl, pol, e, m_p - newp))
                if pol == REC and cur == KEEP:
                    self._try_shrink(tl, j, e, p, m_p, limit, ok)
            if pol == REC and cur == KEEP and e.feasible and self.opts.merge:
                self._try_merge(tl, j, e, p, m_p, limit, ok)
            if pol == REC and cur == KEEP and e.feasible and self.opts.retain and self.opts.retain_inputs:
                self._try_retain(tl, j, e, p, m_p, limit, ok)
            if limit is not None and e.raised_max >= limit and e.raised_at >= 0 and descent:
                # the variants tried above put the timeline back as it was: ``mem`` holds
                mem = tl.memory() if mem is None else mem
                if pol == REC and cur == KEEP and self.opts.early:
                    self._try_early(tl, j, p, m_p, limit, ok, mem)
                self.bat[j, col] = e.raised_at
                self.bat_any[j] = True
                self.bat_p[j, col] = p
                self.bmem[j, col] = max(int(e.raised_max - mem[e.raised_at]), 0)
            if col == _O_HID and newp >= m_p and p < b:
                k = np.flatnonzero(e.swap.ids == j)
                if len(k) and int(e.swap.prefetch[k[0]]) < p:   # back too early: delay it past p
                    todo.append(_Todo(ocost[j, _O_LATE], _O_LATE, SWAP, p))
                if len(k) and int(e.swap.r0[k[0]]) > p and self.allow_wait and not any(x.col == _O_WAIT for x in todo):
                    todo.append(_Todo(ocost[j, _O_WAIT], _O_WAIT, SWAP, p))   # gone too late: wait for the copy
        feasible = [t for t in opts if t.eff.feasible]
        if not ok:
            return None
        chosen = min(ok, key=lambda x: (x.cost, x.swap, x.floor))
        if descent and self.early_step is None and self.opts.early and self._early_counts(j, ok, chosen, costs):
            self.early_step = self.step
        pol, removed = chosen.policy, chosen.removed
        if descent and self.variant_bounds:
            # the cached recompute cost orders later selections (a bound of the window's score): a variant
            # (segment-wise or early regeneration, merged regeneration, retained chain inputs) can cost far
            # less than the plain recomputation _remember cached, and must keep the window in view, as must
            # the point the plain recomputation raised where a variant raises none to the peak
            # (random_layered_n100 at 0.8: n39 costs 11615 plainly, its chain raising n63 over the peak,
            # and 593 with an input retained; the descent never looked at it again)
            rec_best = min((x.cost for x in ok if x.policy == REC), default=np.inf)
            if np.isfinite(rec_best):
                costs.cost[j, _O_REC] = min(costs.cost[j, _O_REC], rec_best)
                self.bat[j, _O_REC] = -1
        rec = [max(t.eff.cost_s, 0.0) for t in feasible if t.policy == REC]
        swp = [max(t.eff.cost_s, 0.0) for t in feasible if t.policy == SWAP]
        rec_s = rec[0] if rec else (float(ocost[j, _O_REC]) if np.isfinite(ocost[j, _O_REC]) else None)
        swap_s = min(swp) if swp else (float(ocost[j, _O_HID]) if np.isfinite(ocost[j, _O_HID]) else None)
        rec_ok = any(x.policy == REC for x in ok)
        raised = None
        if pol == REC:
            if cur == SWAP:
                reason = REASON_SWITCH
            elif not self.allow_swap:
                reason = REASON_ONLY_POLICY
            elif swp and not any(x.policy == SWAP for x in ok):
                reason = REASON_SWAP_NO_GAIN
            else:
                reason = REASON_CHEAPEST
        else:
            if cur == REC:
                reason = REASON_SWITCH
            elif not self.allow_rec:
                reason = REASON_ONLY_POLICY
            elif not tl.windows.w_rec_ok[j]:
                reason = REASON_NOT_RECOMPUTABLE
            elif rec and not rec_ok:
                reason = REASON_NEW_PEAK
                raised = next(t.eff for t in feasible if t.policy == REC)
            else:
                reason = REASON_CHEAPEST
        score = removed / max(chosen.cost, self.eps)
        return Move(j, pol, chosen.eff, score, removed, rec_s, swap_s, reason,
                    raised.raised_at if raised else None, raised.raised_max if raised else None, chosen.shrink,
                    chosen.also)

    def _early_counts(self, j: int, ok: list, chosen: _Option, costs: OptionCosts) -> bool:
        """Whether the early regeneration options in ``ok`` (the admissible
        options :meth:`_evaluate` found for window ``j`` in a selection step)
        change anything the descent keeps or reads: the option chosen (an
        early one: the move, and its score orders the selection), the reason
        a swap is chosen (whether a recomputation was admissible), or, with
        :attr:`variant_bounds`, the window's cached recompute cost and
        raised point.  Where they change nothing, a descent without early
        regeneration evaluates the same options to the same move
        (``LibraSolver._own_plain_twin``)."""
        plain = [x for x in ok if x.shrink is None or not x.shrink.early]
        if len(plain) == len(ok):
            return False
        if chosen.shrink is not None and chosen.shrink.early:
            return True
        if chosen.policy != REC and not any(x.policy == REC for x in plain):
            return True
        if self.variant_bounds:
            c = float(costs.cost[j, _O_REC])
            r_all = min((x.cost for x in ok if x.policy == REC), default=np.inf)
            r_plain = min((x.cost for x in plain if x.policy == REC), default=np.inf)
            if np.isfinite(r_all) != np.isfinite(r_plain) or min(c, r_all) != min(c, r_plain):
                return True
        return False

    def _try_shrink(self, tl: Timeline, j: int, e, p: int, m_p: int, limit: int | None, ok: list) -> None:
        """Recomputation variant of window ``j`` that ends at the first chain
        regenerating the storage before its own use (``e``'s chains): kept from
        there, it is not recomputed again (segment-wise regeneration)."""
        s, a, b = int(tl.windows.w_s[j]), int(tl.windows.w_a[j]), int(tl.state.w_b[j])
        qs = [q for q, ch in e.chains.items() if ch is not None and a < q < b
              and any(tl.tables.t_storage[t] == s for t in ch.made)]
        if not qs:
            return
        q = min(qs)
        made = [t for t in e.chains[q].made if tl.tables.t_storage[t] == s]
        e2, newp = self._ending_at(tl, j, q, made, p)
        if newp is None or e2.cost_s >= e.cost_s:
            return
        if newp < m_p and (limit is None or e2.raised_max < limit):
            ok.append(_Option(max(e2.cost_s, 0.0), False, 0, REC, e2, m_p - newp, Shrink(q, made)))

    def _try_merge(self, tl: Timeline, j: int, e, p: int, m_p: int, limit: int | None, ok: list) -> None:
        """Recomputation variant of kept window ``j`` for when its chain (``e``)
        regenerates a storage that another window ``k`` recomputes later, at
        its own use: ``k`` then ends at that chain and the storage is kept from
        there (segment-wise regeneration, as the finish step's
        ``_keep_regenerated`` does), so the two evictions pay for one
        regeneration.  Its cost is the change of the whole plan's added time;
        the positions the kept storage covers again must stay under
        ``limit``.  At most :data:`MAX_MERGES` windows are tried.  A merge
        at a chain point the plain recomputation already raises to ``limit``
        (the same chain, a storage kept longer), or whose kept storage holds
        the memory at ``limit``, is refused without an evaluation
        (:func:`_over_limit`)."""
        tries = 0
        for q, ch in sorted(e.chains.items()):
            if ch is None:
                continue
            # the memory at q after the plain recomputation: a merge there runs the same chain and frees
            # less (the storage it keeps from q on), so at or over ``limit`` it refuses every merge at q
            at_q = tl.new_value_at(j, REC, e, q) if limit is not None else None
            for s2 in sorted({int(tl.tables.t_storage[t]) for t in ch.made}):
                for k in tl.state.s_win.get(s2, ()):
                    if k == j or tl.state.pol[k] != REC or not int(tl.windows.w_a[k]) < q < int(tl.state.w_b[k]):
                        continue
                    if tries >= MAX_MERGES:
                        return
                    tries += 1
                    if at_q is not None and _over_limit(at_q, limit):
                        continue   # (a try all the same: the same merges are tried at the later points)
                    made = [t for t in ch.made if tl.tables.t_storage[t] == s2]
                    before, old, b_k = tl.added_s(), tl.window_state(k), int(tl.state.w_b[k])
                    with tl.recording() as journal:
                        tl.move_end(k, q, made)
                    try:
                        mem = tl.memory()
                        hold = int(mem[q:b_k].max()) if b_k > q else 0
                        if limit is not None and _over_limit(hold, limit):
                            continue   # refused whatever j's recomputation costs: not evaluated
                        e2 = tl.evaluate(j, REC)
                        if not e2.feasible:
                            continue
                        newp = tl.new_value_at(j, REC, e2, p)
                        cost = tl.added_s() - before + max(e2.cost_s, 0.0)
                        if cost < max(e.cost_s, 0.0) and newp < m_p and (
                                limit is None or max(e2.raised_max, hold) < limit):
                            ok.append(_Option(max(cost, 0.0), False, 0, REC, e2, m_p - newp, None, Merge(k, q, made)))
                    finally:
                        tl.move_end(k, state=old, replay=False)
                        tl.restore_chains(journal)

    def _try_retain(self, tl: Timeline, j: int, e, p: int, m_p: int, limit: int | None, ok: list) -> None:
        """Recomputation variant of kept window ``j`` for when its chain (``e``)
        regenerates inputs of the storage's producer that were freed after
        their last use (not evicted): keep those inputs resident until the
        chain instead (:class:`~libra_opt.passes.lowering.Retain`, Checkmate's S
        holding a value across stages), which cuts the chain short.  Taken
        where it costs less than the plain recomputation and the memory the
        inputs hold, less the storage's bytes, stays under ``limit``; where
        it does not already off the recomputation's chain points, refused
        without an evaluation (:func:`_over_limit`)."""
        s = int(tl.windows.w_s[j])
        prod = tl.problem.nodes[tl.problem.tensors[s].producer]
        rets: dict[int, int] = {}
        for q in sorted(e.chains):
            ch = e.chains[q]
            if ch is None:
                continue
            for t in prod.inputs:
                if t in ch.made and t not in rets and t not in tl.state.t_until and tl.state.t_last_eff[t] < q and tl.retainable(t):
                    rets[t] = q
        if not rets:
            return
        before = tl.added_s()
        a, b, nbytes = int(tl.windows.w_a[j]), int(tl.state.w_b[j]), int(tl.windows.w_bytes[j])
        lo = min(int(tl.tables.t_last[t]) for t in rets) + 1
        hi = max(rets.values())
        done = []
        try:
            with tl.recording() as journal:
                for t, q in rets.items():
                    tl.retain(t, q)
                    done.append(t)
            # the memory the retained inputs hold, from their last use to their chain, j's storage evicted:
            # off j's chain points (the recomputation's chains before positions tl.affected(j): the
            # evaluation's own, j being kept) it is known before the evaluation, and at or over ``limit``
            # there refuses the variant whatever the chains cost
            pos = np.arange(lo, hi + 1)
            vals = tl.memory(lo, hi + 1) - np.where((a < pos) & (pos < b), nbytes, 0)
            if limit is not None and len(vals):
                off = vals.copy()
                for q in tl.affected(j):
                    if lo <= q <= hi:
                        off[q - lo] = NEG
                if _over_limit(int(off.max()), limit):
                    return
            e2 = tl.evaluate(j, REC)
            if not e2.feasible:
                return
            cost = tl.added_s() - before + max(e2.cost_s, 0.0)
            newp = tl.new_value_at(j, REC, e2, p)
            if not (cost < max(e.cost_s, 0.0) and newp < m_p):
                return
            for q in e2.chains:   # the positions whose chain changes (a few, of thousands in the range)
                if lo <= q <= hi:
                    vals[q - lo] = tl.new_value_at(j, REC, e2, q)
            hold = int(vals.max()) if len(vals) else 0
            if limit is None or max(e2.raised_max, hold) < limit:
                ok.append(_Option(max(cost, 0.0), False, 0, REC, e2, m_p - newp, None,
                                  RetainInputs(tuple(rets.items()))))
        finally:
            for t in reversed(done):
                tl.retain(t, None, replay=False)
            tl.restore_chains(journal)

    def _try_early(self, tl: Timeline, j: int, p: int, m_p: int, limit: int, ok: list, mem: np.ndarray) -> None:
        """Recomputation variant of window ``j`` for when recomputing at the use
        raises a new peak: regenerate the storage earlier, before the node
        between the peak ``p`` and the use where memory is lowest, and keep it
        from there (early regeneration, like a prefetch; Checkmate's R may
        recompute a value at any stage before it is needed).  ``mem``:
        ``tl.memory()``."""
        s, b = int(tl.windows.w_s[j]), int(tl.state.w_b[j])
        if b - p < 2:
            return
        q = p + 1 + int(np.argmin(mem[p + 1:b]))
        first = tl.tensors_read_at(s, b)
        rec_best = min((x.cost for x in ok if x.policy == REC), default=None)
        if rec_best is not None and rec_best <= self._early_least_s(tl, j, q, first):
            return   # it can neither be chosen nor lower the window's cached recompute cost
        e2, newp = self._ending_at(tl, j, q, first, p)
        if newp is not None and newp < m_p and e2.raised_max < limit:
            ok.append(_Option(max(e2.cost_s, 0.0), False, 0, REC, e2, m_p - newp, Shrink(q, first, True)))

    @staticmethod
    def _early_least_s(tl: Timeline, j: int, q: int, tensors: list[int]) -> float:
        """A lower bound (s) of what regenerating ``tensors`` of kept window
        ``j`` early, before node ``q`` (:meth:`_try_early`), adds: the
        recompute times of the producers of those regenerated at ``q`` that
        the chain before ``q`` does not run already.  Evicting the window only
        makes tensors missing, so every chain it changes runs the nodes it ran
        and more (the walk of
        :func:`~libra_opt.passes.regeneration.regeneration_steps` enters every
        tensor it entered), and the new chain before ``q`` those producers.
        Where a recompute option already found costs no more, the early one
        is not evaluated: it can neither be chosen (the cheapest option is,
        the first found on ties) nor lower the window's cached recompute cost
        (``variant_bounds``), so the descent is the same with fewer chain
        replays (random layered graph of 1,000 nodes, recompute-only at 0.8
        of its peak: 129 of its 429 early regenerations skipped)."""
        pt = tl.tables
        hi = window_hi(pt, int(tl.windows.w_s[j]), int(tl.windows.w_a[j]), q, tensors)
        old = tl.state.chains.get(q)
        ran = set(old.nodes) if old is not None else ()
        prods = {pt.t_prod[t] for t in tensors if hi.get(t) == q}
        return float(sum(pt.n_rtime[n] for n in prods if n not in ran))

    @staticmethod
    def _ending_at(tl: Timeline, j: int, q: int, tensors: list[int], p: int):
        """Evaluate recomputing kept window ``j`` with its end moved to ``q``,
        where ``tensors`` of its storage are regenerated, then put the window
        back.  ``(effect, memory at p after it)``; the memory is ``None`` if
        the effect is infeasible."""
        old = tl.window_state(j)
        tl.set_before(j, q, tensors)
        try:
            e2 = tl.evaluate(j, REC)
            return e2, (tl.new_value_at(j, REC, e2, p) if e2.feasible else None)
        finally:
            tl.move_window_back(j, old)

    def _remember(self, j: int, pol: int, fl: int, e, col: int) -> None:
        """Cache the evaluated cost of option ``col`` (policy ``pol``, floor
        ``fl``, effect ``e``) of window ``j`` in the descent's caches (see
        ``__init__``)."""
        costs = self.costs
        c = max(e.cost_s, 0.0) if e.feasible else np.inf
        if col == _O_WAIT:
            costs.cost[j, _O_WAIT] = c
        elif pol == REC:
            costs.cost[j, _O_REC] = c
        elif fl == 0:
            costs.cost[j, _O_HID] = c
            k = np.flatnonzero(e.swap.ids == j) if e.swap is not None else ()
            if len(k):
                costs.hid_lo[j], costs.hid_hi[j] = int(e.swap.r0[k[0]]), int(e.swap.prefetch[k[0]])
        else:
            costs.cost[j, _O_LATE] = c

    def commit(self, mv: Move, p: int, peak: int, tl: Timeline, records: dict, reason: str | None = None) -> None:
        """Apply ``mv`` (found at position ``p``, peak ``peak`` bytes) to
        ``tl``, a timeline other than the descent's own (exchange moves,
        repairs), and record it in ``records`` (window id ->
        :class:`~libra_opt.solvers.libra.explain.Decision`, step ``-1``,
        ``reason``: the move's own where ``None``); nothing of the descent
        changes."""
        self._apply(mv, p, peak, tl, records, -1, reason)

    def _commit(self, mv: Move, p: int, peak: int) -> None:
        """Take ``mv`` in the descent: applied to its timeline and records as
        step :attr:`step` (a swapped window's wait moved to ``p`` at no added
        time slides further, :meth:`_slide_wait`); the caches of the moved
        window keep its switch costs."""
        j = mv.j
        tl = self.tl
        moved_wait = (self.opts.policy == "swap" and tl.state.pol[j] == SWAP and mv.policy == SWAP
                      and mv.eff.wait == p and int(tl.state.wait[j]) != p and mv.eff.cost_s <= 0)
        self._apply(mv, p, peak, tl, self.records, self.step, None)
        if moved_wait:
            self._slide_wait(j, p)
        if mv.shrink is not None and mv.shrink.early:
            self.used_early = True
        self.step += 1
        # what is left are switch costs: roughly the other options' costs less what was paid
        cost = self.costs.cost
        cost[j] = np.maximum(cost[j] - max(mv.eff.cost_s, 0.0), 0.0)
        cost[j, _O_REC if mv.policy == REC else _O_HID] = np.inf
        self.bat[j] = -1
        self.bat_any[j] = False

    def _slide_wait(self, j: int, p: int) -> None:
        """After a step that moved swapped window ``j``'s wait for its copy out
        to the peak position ``p`` at no added time, move it further back, to
        ``p - 1``, ``p - 2``, ``p - 4``, ... while that too adds no time and
        raises no point to the estimated peak (each an evaluation): the
        farthest such position is taken.  Where the copies out bound the step
        time, a wait moved earlier only moves a stall earlier, and the
        descent would otherwise move it back one peak at a time
        (``h100_gpt2-medium_b8`` swap-only at 0.3 of its peak: 2,684 of its
        4,616 steps, one window's wait moved 192 times).  The storage is off
        the device from the wait on: the positions passed lose its bytes.
        Only swap-only descents that wait for copies out (``swap_waits``),
        and only in their own steps: slides in exchange moves and repairs too
        gave the same plans over 12 fuzz seeds of every policy, and no speed;
        in the hybrid descent that waits (a fallback of hybrid mode) a slid
        wait changed its later choices between recomputing and swapping, and
        ``random_layered_n100`` with copies 4x slower than compute at 0.5 of
        its peak cost 225,539 instead of 189,729 (without them in that
        descent: the 390 libra rows of ``solve_rate.py`` and 2,400 fuzz and
        pattern solves keep their plans).  A
        step's slide is part of the step: a descent's steps stay independent
        of the budgets it is asked for (checkpoints, sweeps).  Raises
        nothing; source: the estimate's copy-out queue
        (:func:`~libra_opt.solvers.libra.swaps.out_waits`)."""
        tl = self.tl
        st = tl.state
        lo, fl = int(tl.windows.w_a[j]) + 1, int(st.floor[j])
        top = int(tl.memory().max())
        best, d = None, 1
        while p - d >= lo:
            self.evals += 1
            e = tl.evaluate(j, SWAP, floor=fl, wait=p - d)
            if not e.feasible or e.cost_s > 0 or e.raised_max >= top:
                break
            best, d = e, 2 * d
        if best is not None:
            tl.apply(j, SWAP, best)

    def _apply(self, mv: Move, p: int, peak: int, tl: Timeline, records: dict, step: int,
               reason: str | None) -> None:
        """``mv`` applied to ``tl`` (its merged or retained companions first)
        and recorded in ``records`` at ``step``.  Where a chain the move
        replayed no longer regenerates the storage of a window ended at it
        (:func:`~libra_opt.solvers.libra.tidy.broken_ends`: a merge or shrink
        of an earlier step), that window gets its own end back
        (:func:`~libra_opt.solvers.libra.tidy.fix_shrunk`) there and then,
        so that the estimate the later steps compare is the plan's cost, not
        one with a storage regenerated for free.  Over ``solve_rate.py``'s
        390 libra rows 3 plans got cheaper (``large_beside_small_n201``
        recompute-only at 0.3 of its peak: 1,004.84 -> 989.96), over 2,400
        fuzz and pattern solves 20 (by up to 4.6 %), over the 180 copy-bound
        cells of ``hybrid_optimality.py --libra-only`` 3; none costlier."""
        with tl.recording() as journal:
            self._apply_move(mv, tl, records)
        if broken_ends(tl, journal):
            fix_shrunk(tl, records)
        j = mv.j
        records[j] = explain(self.problem, step=step, storage=int(tl.windows.w_s[j]),
                             after=int(tl.windows.w_a[j]), before=int(tl.state.w_b[j]), policy=Policy.of_code(mv.policy).value,
                             nbytes=int(tl.windows.w_bytes[j]), peak_bytes=peak, peak_pos=p, removed_bytes=mv.removed,
                             added_s=max(mv.eff.cost_s, 0.0), recompute_s=mv.rec_s, swap_s=mv.swap_s,
                             reason=reason or mv.reason, raised_pos=mv.raised_pos, raised_bytes=mv.raised_bytes,
                             early_from=int(tl.windows.orig_b[j]) if mv.shrink is not None and mv.shrink.early else None)

    @staticmethod
    def _apply_move(mv: Move, tl: Timeline, records: dict) -> None:
        """:meth:`_apply`'s change of ``tl``: a merged window's end moved to its
        chain (its record too) or the retained inputs kept, the shrunk end set,
        then the move's policy."""
        j = mv.j
        also = mv.also
        if isinstance(also, Merge):
            k, q = also.window, also.position
            tl.move_end(k, q, also.tensors)
            if records.get(k) is not None:
                records[k] = records[k].ending_before(q)
        elif isinstance(also, RetainInputs):
            for t, q in also.pairs:
                tl.retain(t, q)
        if mv.shrink is not None:
            tl.set_before(j, mv.shrink.position, mv.shrink.tensors)
        tl.apply(j, mv.policy, mv.eff)

    # ------------------------------------------------------------ finish (composed: finish.Finisher)
    def prepare(self, snap: Snapshot, budget: int, undo: bool = True, exchange: bool | None = None,
                polish: bool = True) -> Prepared:
        """:meth:`Finisher.prepare <libra_opt.solvers.libra.finish.Finisher.prepare>`
        of this descent's snapshot ``snap`` for ``budget`` (bytes)."""
        return Finisher(self).prepare(snap, budget, undo, exchange, polish)

    def realize(self, prepared: Prepared, snap: Snapshot, budget: int,
                repair: bool = True) -> FinishedPlan | None:
        """:meth:`Finisher.realize <libra_opt.solvers.libra.finish.Finisher.realize>`:
        lower, simulate, repair; ``None`` where the plan stays over ``budget``."""
        return Finisher(self).realize(prepared, snap, budget, repair)

    def finish(self, snap: Snapshot, budget: int, undo: bool = True, repair: bool = True,
               polish: bool = True) -> FinishedPlan | None:
        """:meth:`prepare` then :meth:`realize` (a subclass's ``prepare`` included)."""
        return self.realize(self.prepare(snap, budget, undo, polish=polish), snap, budget, repair)

    def as_lowered(self, snap: Snapshot) -> FinishedPlan:
        """The snapshot's timeline lowered and simulated as it is
        (:meth:`Finisher.as_lowered <libra_opt.solvers.libra.finish.Finisher.as_lowered>`)."""
        return Finisher(self).as_lowered(snap)

    def measured_min_feasible_bytes(self) -> int | None:
        """:meth:`min_feasible_bytes` where it has been measured already, else
        ``None`` (nothing is run)."""
        return self._final_peak

    def min_feasible_bytes(self) -> int:
        """Simulated peak of the lowered end-of-descent plan (bytes); runs the
        descent to its end if it has not got there."""
        if self._final_peak is None:
            self._final_peak = self.as_lowered(self.final()).simulation.peak_bytes
        return self._final_peak


class OneMoveRefiner(Refiner):
    """A portfolio member that is not a descent but one move, taken on the
    first call of :meth:`descend` (:meth:`_build`, for subclasses), after
    which it records snapshots as a descent does and is done: the bulk swap
    (``solver._BulkSwapRefiner``) and the reverse greedy
    (:class:`~libra_opt.solvers.libra.reverse.ReverseRefiner`).  The move is
    not taken where ``time_limit_s`` is already spent (as a descent checks
    before each step) or ``max_steps`` is under the decisions it makes (at
    most one per enabled window): the member then stops cut short."""

    def __init__(self, problem: RematProblem, opts):
        super().__init__(problem, opts)
        self._built = False

    def _descend(self, budgets, to_end):
        if not self._built:
            steps = self.opts.max_steps
            if (self.time_limit_s is not None and self.clock_s() > self.time_limit_s) or (
                    steps is not None and steps < int(self.enabled.sum())):
                self.cut_short = True
            else:
                self._build()
            self._built = self.done = True
        return super()._descend(budgets, to_end)

    def _build(self) -> None:
        """The move, on ``self.tl``, with one decision record per window in
        ``self.records`` and ``self.step`` set."""
        raise NotImplementedError
