"""The finish step of the ``libra`` solver: from a descent's snapshot for a
budget to a simulated plan.

1. **Undo pass**: decisions the budget no longer needs are undone, most
   expensive first (estimate only).
2. **Segment-wise regeneration** (Chen et al., "Training Deep Nets with
   Sublinear Memory Cost", 2016, sec. 4.1): where a chain regenerates an
   evicted storage before its own use, keep it from there.
3. **Retention**: where a chain regenerates a tensor freed after its last use,
   keep that tensor resident until the chain instead (Checkmate's S).
4. **Realize**: lower (:func:`~libra_opt.lowering.lower`) and simulate; while
   the simulated peak is over budget, repair against the simulated timeline.

The descent itself is :mod:`libra_opt.solvers.libra_refine`; the window-end and
retention operations on the model are :mod:`libra_opt.solvers.libra_reshape`.
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging

import numpy as np

from libra_opt.passes.lowering import lower
from libra_opt.ir.problem import RematProblem
from libra_opt.ir.schedule import Op
from libra_opt.passes.simulator import simulate

from .estimate import KEEP, REC, Timeline
from .exchange import exchange as exchange_moves, undo_pass
from .explain import REASON_REPAIR

from .records import FinishedPlan, Move, Snapshot

log = logging.getLogger(__name__)


#: the early shift (``Finisher._early_shift``) runs on problems of at most this many nodes
EARLY_SHIFT_MAX_NODES = 64
#: most chain positions the early shift tries per plan
EARLY_SHIFT_MAX_TRIES = 32


class Finisher:
    """Mixin of :class:`~libra_opt.solvers.libra_refine.Refiner`: the finish
    step (reads the refiner's ``problem``, ``opts``, ``orig_b``, option-cost
    caches, ``_evaluate``, ``_commit``, ``candidates`` and ``final``)."""

    @contextlib.contextmanager
    def _caches_of(self, snap: Snapshot):
        """Read the option-cost caches as they were at ``snap`` (repairs order
        and skip options by them), so that a plan does not depend on how far
        the descent went on for lower budgets: ``solve_many`` equals ``solve``."""
        if not snap.caches:
            yield
            return
        now = (self.cost, self.hid_lo, self.hid_hi)
        self.cost, self.hid_lo, self.hid_hi = snap.caches
        try:
            yield
        finally:
            self.cost, self.hid_lo, self.hid_hi = now

    # ------------------------------------------------------------- finish
    def prepare(self, snap: Snapshot, budget: int, undo: bool = True, exchange: bool | None = None,
                polish: bool = True) -> tuple[Timeline, dict, int]:
        """The snapshot's timeline after the undo pass: decisions the budget
        does not need are undone, most expensive first (estimate only); then,
        with ``exchange`` (``None``: the ``exchange`` option), exchange moves
        (:mod:`~libra_opt.solvers.libra_exchange`).  ``polish=False`` leaves
        out the passes that only save time within the budget (regenerated
        storages kept, retained inputs, the early shift): for a caller that
        only asks whether the budget is met, as each of them keeps the
        estimated peak within it."""
        tl = snap.timeline.copy()
        records = dict(snap.records)
        undone = 0
        if self.opts.undo and undo:
            undone = undo_pass(tl, records, budget)
            if self.opts.exchange if exchange is None else exchange:
                with self._caches_of(snap):   # as at the snapshot: solve_many equals solve
                    tl, records, _ = exchange_moves(self, tl, records, budget, snap.evals)
            if polish:
                self._keep_regenerated(tl, records, budget)
        if self.opts.retain and self.allow_rec and polish:
            self._retain_inputs(tl, budget)
            if self.opts.undo and undo and self.opts.early:
                tl, records = self._early_shift(tl, records, budget)
        self._fix_shrunk(tl, records)
        return tl, records, undone

    def _early_shift(self, tl: Timeline, records: dict, budget: int) -> tuple[Timeline, dict]:
        """Regenerate early and keep the inputs together: for a recomputed
        window whose chain keeps inputs of the storage's producer resident
        until it (retentions), try the chain at each earlier position ``q``
        inside the window, with those inputs kept only until ``q``, then the
        undo pass; the cheapest such plan within ``budget`` (estimate) is
        kept (Checkmate's R regenerating a value at any stage before its use
        while S frees its inputs sooner).  Problems of at most
        :data:`EARLY_SHIFT_MAX_NODES` nodes; at most
        :data:`EARLY_SHIFT_MAX_TRIES` positions per plan.  Returns the
        timeline and records (new objects where a shift was taken)."""
        if self.problem.num_nodes > EARLY_SHIFT_MAX_NODES or not tl.t_until or len(records) < 2:
            return tl, records   # a shift gains through the undo pass: another decision to give back
        tries = 0
        for j in sorted(k for k in records if tl.pol[k] == REC):
            s, a, b = int(tl.w_s[j]), int(tl.w_a[j]), int(tl.w_b[j])
            if b != int(self.orig_b[j]) or j not in records:
                continue
            rets = [t for t in self.problem.nodes[tl.t_prod[s]].inputs if tl.t_until.get(t) == b]
            if not rets:
                continue
            first = tl.tensors_read_at(s, b)
            best = None
            for q in range(b - 1, a + 1, -1):
                if tries >= EARLY_SHIFT_MAX_TRIES:
                    break
                tries += 1
                t2, r2 = tl.copy(), dict(records)
                t2.move_end(j, q, first)
                for t in rets:
                    t2.retain(t, q if q > t2.t_last[t] else None)
                if int(t2.memory().max()) > budget:
                    continue
                undo_pass(t2, r2, budget)
                if j in r2 and t2.added_s() < (best[0] if best else tl).added_s() * (1 - 1e-12):
                    r2[j] = dataclasses.replace(r2[j], before=q)
                    best = (t2, r2)
            if best is not None:
                tl, records = best
                if tl.swap.ids.size:
                    tl.refresh_swaps()
        return tl, records

    def _retain_inputs(self, tl: Timeline, budget: int) -> int:
        """Where a recomputation chain regenerates a tensor that was freed after
        its last use (not evicted: on a single-phase graph, the inputs of an
        evicted tensor's producer), keep that tensor resident until the chain
        instead, when the budget allows and it saves time: Checkmate's S
        matrix holding a value across stages, which cuts the chain short.
        Most saving first (the producer's time); each is checked on the
        timeline and taken back if it goes over budget or saves nothing.
        Returns how many were kept."""
        cands = []
        for q, ch in tl.chains.items():
            if ch is None:
                continue
            for t in ch.made:
                if tl.t_last_eff[t] < q and tl.retainable(t):
                    cands.append((-tl.n_time[tl.t_prod[t]], q, t))
        if not cands:
            return 0
        cands.sort()
        done = 0
        mem = tl.memory()
        for _, q, t in cands:
            ch = tl.chains.get(q)
            if ch is None or t not in ch.made or tl.t_last_eff[t] >= q:
                continue   # an earlier retention changed this chain
            s = tl.t_storage[t]
            end = tl._storage_end(s)
            held = int(tl.t_nbytes[s]) if tl.t_act[s] else 0   # a view of an input: its storage stays resident
            if end + 1 < q and int(mem[end + 1:q].max()) + held > budget:
                continue
            cost, old = tl.added_s(), tl.t_until.get(t)
            with tl.recording() as journal:
                tl.retain(t, q)
            mem = tl.memory()
            if int(mem.max()) <= budget and tl.added_s() < cost * (1 - 1e-12):
                done += 1
                continue
            tl.retain(t, old, replay=False)   # over budget or no gain: as it was
            tl.restore_chains(journal)
            mem = tl.memory()
        if done and tl.swap.ids.size:
            tl.refresh_swaps()
        return done

    def _fix_shrunk(self, tl: Timeline, records: dict) -> None:
        """A window that ends where a chain regenerates its storage keeps that
        end only while the chain still does; otherwise it gets its own window
        back (the storage is then recomputed at its own use)."""
        for _ in range(4):
            broken = []
            for j in np.flatnonzero((tl.w_b != self.orig_b) & (tl.pol == REC)).tolist():
                s, q = int(tl.w_s[j]), int(tl.w_b[j])
                ch = tl.chains.get(q)
                if ch is None or not any(tl.t_storage[t] == s for t in ch.made):
                    broken.append(j)
            if not broken:
                return
            for j in broken:
                s, b = int(tl.w_s[j]), int(self.orig_b[j])
                tl.apply(j, KEEP)
                tl.set_before(j, b, tl.tensors_read_at(s, b))
                tl.apply(j, REC)
                if j in records:
                    records[j] = dataclasses.replace(records[j], before=b)

    def _keep_regenerated(self, tl: Timeline, records: dict, budget: int) -> int:
        """Where a recomputation chain regenerates an evicted storage before its
        own use, keep it from there instead of recomputing it again later
        (Chen et al.'s segment-wise regeneration), when the budget allows and
        it saves time: the window ends at that chain, the earliest such chain
        after which the storage fits under the budget.  Returns how many."""
        done = 0
        for j in sorted((k for k in records if tl.pol[k] == REC), key=lambda k: -int(tl.w_a[k])):
            s, a, b = int(tl.w_s[j]), int(tl.w_a[j]), int(tl.w_b[j])
            qs = [q for q in tl.touch.get(s, ()) if a < q < b and q in tl.chains
                  and any(tl.t_storage[t] == s for t in tl.chains[q].made)]
            for q in sorted(qs):   # the earliest chain first (most saved); a later one where that does not fit
                if int(tl.memory()[q:b].max()) + int(tl.w_bytes[j]) > budget:
                    continue
                made = [t for t in tl.chains[q].made if tl.t_storage[t] == s]
                cost = tl.added_s()
                old = tl.window_state(j)
                with tl.recording() as journal:
                    tl.move_end(j, q, made)
                if int(tl.memory().max()) <= budget and tl.added_s() < cost * (1 - 1e-12):
                    records[j] = dataclasses.replace(records[j], before=q)
                    done += 1
                    break
                tl.move_end(j, state=old, replay=False)   # no gain or over budget: back to the window it had
                tl.restore_chains(journal)
        if done and tl.swap.ids.size:
            tl.refresh_swaps()
        return done

    def realize(self, prepared: tuple[Timeline, dict, int], snap: Snapshot, budget: int,
                repair: bool = True) -> FinishedPlan | None:
        """Lower, simulate and, while the simulated peak is over ``budget``,
        repair against the simulated timeline; ``None`` if that fails."""
        tl, records, undone = prepared[0], dict(prepared[1]), prepared[2]
        copied = False   # the prepared timeline is copied only if a repair changes it
        for repairs in range(self.opts.max_repair_steps + 1 if repair else 1):
            sched = lower(self.problem, tl.plan())
            sim = simulate(self.problem, sched)
            if sim.peak_bytes <= budget:
                return FinishedPlan(sched, sim, tl, records, undone, repairs, snap)
            if not repair or repairs == self.opts.max_repair_steps:
                break
            q = _position(self.problem, sched, sim.peak_index)
            with self._caches_of(snap):
                mv = self._repair_move(tl, q, budget)
            if mv is None:
                break
            log.debug("libra: simulated peak %d over budget %d at position %d: repairing", sim.peak_bytes,
                      budget, q)
            if not copied:
                tl, copied = tl.copy(), True
            self._commit(mv, q, int(sim.peak_bytes), tl, records, REASON_REPAIR)
        return None

    def finish(self, snap: Snapshot, budget: int, undo: bool = True, repair: bool = True,
               polish: bool = True) -> FinishedPlan | None:
        """:meth:`prepare` then :meth:`realize`."""
        return self.realize(self.prepare(snap, budget, undo, polish=polish), snap, budget, repair)

    def _repair_move(self, tl: Timeline, q: int, budget: int) -> Move | None:
        idx = self.candidates(tl, q)
        best = None
        for j in idx.tolist():
            mv = self._evaluate(tl, j, q, 0, limit=None)
            if mv is None:
                continue
            key = (mv.eff.raised_max <= budget, mv.score)
            if best is None or key > best[0]:
                best = (key, mv)
        return best[1] if best else None

    def as_lowered(self, snap: Snapshot) -> FinishedPlan:
        """The snapshot's timeline lowered and simulated as it is (no undo,
        retention or repair): the plan :meth:`min_feasible_bytes` measures."""
        sched = lower(self.problem, snap.timeline.plan())
        return FinishedPlan(sched, simulate(self.problem, sched), snap.timeline, dict(snap.records), 0, 0, snap)

    def min_feasible_bytes(self) -> int:
        """Simulated peak of the lowered end-of-descent plan (bytes)."""
        if self._final_peak is None:
            snap = self.final()
            self._final_peak = simulate(self.problem, lower(self.problem, snap.timeline.plan())).peak_bytes
        return self._final_peak


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
