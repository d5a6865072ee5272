"""Estimate-only passes of the ``libra`` solver over a prepared plan (a
timeline and its decision records, both changed in place), shared by the
finish step (``finish.py``), the exchange moves (``exchange.py``) and the
policy switches (``switch.py``):

- :func:`undo_pass`: decisions the budget does not need are undone, most
  expensive first;
- :func:`fix_shrunk`: a window ended at a chain that no longer regenerates its
  storage gets its own end back (:func:`broken_ends` finds them);
- :func:`keep_regenerated`: segment-wise regeneration (Chen et al., "Training
  Deep Nets with Sublinear Memory Cost", 2016, sec. 4.1): where a chain
  regenerates an evicted storage before its own use, keep it from there;
- :func:`retain_inputs`: where a chain regenerates a tensor freed after its
  last use, keep that tensor resident until the chain instead (Checkmate's
  S, Jain et al., MLSys 2020);
- :func:`early_shift`: regenerate early and keep the chain's inputs only
  until then (Checkmate's R at an earlier stage).

Each reads and changes only the timeline and records it is given (and the
problem and window ends it is told), never a descent's state.

Source: Libra (Wang, NTHU 2024), the final pass of the greedy refinement that
undoes decisions the budget no longer needs; the others as cited above.
"""
from __future__ import annotations

import numpy as np

from libra_opt.ir.problem import RematProblem

from .estimate import KEEP, REC, SWAP, Timeline
from .swaps import fits_back, try_changes

#: the early shift (:func:`early_shift`) runs on problems of at most this many nodes
EARLY_SHIFT_MAX_NODES = 64
#: most chain positions the early shift tries per plan
EARLY_SHIFT_MAX_TRIES = 32


def undo_pass(tl: Timeline, records: dict, budget: int) -> int:
    """Undo, most expensive first, every decision in ``records`` the budget
    does not need (the estimated memory stays within ``budget`` bytes
    without it); ``tl`` and ``records`` are changed in place.  Returns how
    many were undone.  The decisions estimated to add no time come last
    (latest first); their swaps are undone in batches first where the plan
    is within the budget (:func:`_undo_free_swaps`: a hybrid descent takes
    many that later decisions make unneeded, 49-60 at each budget of a
    ``h100_gpt2-medium_b8`` sweep), then the rest one at a time.  An undo
    whose replayed chains no longer regenerate the storage of a window ended
    at them (:func:`broken_ends`) gives that window its own end back at once
    (:func:`fix_shrunk`: it only lowers memory), so the passes after it
    compare the plan's cost (``large_beside_small_graph(120, seed=13)``
    recompute-only at 0.45 of its peak: 548.75 -> 545.65 s added)."""
    order = sorted(records, key=lambda k: (-records[k].added_s, -records[k].step))
    n = len(order)
    while n and records[order[n - 1]].added_s == 0.0:
        n -= 1
    undone = _undo_each(tl, records, order[:n], budget)
    free = order[n:]
    if free and tl.peak()[0] <= budget:
        undone += _undo_free_swaps(tl, records, [j for j in free if tl.state.pol[j] == SWAP], budget)
    return undone + _undo_each(tl, records, [j for j in free if j in records], budget)


def _undo_each(tl: Timeline, records: dict, order: list[int], budget: int) -> int:
    """:func:`undo_pass` one decision at a time, in ``order``."""
    undone = 0
    mem = tl.memory()
    for j in order:
        # quick test first: the storage back over its whole off range must fit
        if tl.state.pol[j] == REC:
            lo, hi = int(tl.windows.w_a[j]) + 1, int(tl.state.w_b[j]) - 1
        else:
            lo, hi = int(tl.state.sw_r0[j]), int(tl.state.sw_pos[j])
        if lo <= hi and int(mem[lo:hi + 1].max()) + int(tl.windows.w_bytes[j]) > budget:
            continue
        eff = tl.evaluate(j, KEEP, stop_above=budget)   # over the budget: refused before its chains are replayed
        if eff.feasible and eff.raised_max <= budget:
            with tl.recording() as journal:
                tl.apply(j, KEEP, eff)
            del records[j]
            if broken_ends(tl, journal):
                fix_shrunk(tl, records)
            undone += 1
            mem = tl.memory()
    return undone


def _undo_free_swaps(tl: Timeline, records: dict, order: list[int], budget: int) -> int:
    """Undo the swaps of ``order`` (each estimated to add no time) that the
    budget does not need, on a plan within ``budget`` (bytes): proposed in
    ``order`` from the memory timeline, updated as each is proposed (the
    storage back over its off range fits), and set to keep in batches (one
    swap layer and one chain replay each, :func:`~libra_opt.solvers.libra.swaps.try_changes`),
    a batch whose estimated peak goes over the budget or with an infeasible
    chain taken back and split in halves down to single swaps, which stay
    (the one-at-a-time pass that follows tries them again).  Returns how many were undone
    (their records deleted)."""
    st, wt = tl.state, tl.windows
    mem = tl.memory().copy()
    props = []
    for j in order:
        if fits_back(mem, int(st.sw_r0[j]), int(st.sw_pos[j]), int(wt.w_bytes[j]), budget):
            props.append(j)
    done = try_changes(tl, [(j, KEEP, 0, -1) for j in props], budget, accept=_chains_feasible)
    for j, *_ in done:
        del records[j]
    return len(done)


def _chains_feasible(tl: Timeline, before_s: float) -> bool:
    """Every chain of the timeline ``tl`` is feasible (the one-at-a-time
    undo requires it of each change; the added time may move either way)."""
    return all(ch.feasible for ch in tl.state.chains.values())


def broken_ends(tl: Timeline, at=None) -> list[int]:
    """Recomputed windows whose end was moved to a chain (``w_b`` not the
    window's own end ``tl.windows.orig_b``) where that chain no longer
    regenerates their storage: the timeline then counts the storage as
    regenerated where nothing makes it, and its added time is too low
    (:func:`fix_shrunk` gives such a window its own end back).  ``at``:
    only windows ending at these positions (a container of ints: the chains
    a change replayed, ``Timeline.recording``'s journal); ``None``: all.

    Returns
    -------
    list of int
        Window ids, ascending; empty where none is broken.  Raises nothing;
        reads ``tl`` only.

    Source: the lowering's rule that a window ended before its own use is
    regenerated by the chain there (Chen et al. 2016, sec. 4.1,
    segment-wise regeneration; :func:`keep_regenerated`)."""
    st, wt = tl.state, tl.windows
    if at is not None and not at:
        return []
    out = []
    t_storage, w_b = tl.tables.t_storage, st.w_b
    for j in np.flatnonzero((w_b != wt.orig_b) & (st.pol == REC)).tolist():
        q = int(w_b[j])
        if at is not None and q not in at:
            continue
        s = int(wt.w_s[j])
        ch = st.chains.get(q)
        if ch is None or not any(t_storage[t] == s for t in ch.made):
            out.append(j)
    return out


def fix_shrunk(tl: Timeline, records: dict) -> None:
    """A window that ends where a chain regenerates its storage keeps that
    end only while the chain still does (:func:`broken_ends`); otherwise it
    gets its own window back, its own end ``tl.windows.orig_b`` (the
    storage is then recomputed at its own use).  ``tl`` and ``records``
    are changed in place; raises nothing."""
    for _ in range(4):
        broken = broken_ends(tl)
        if not broken:
            return
        for j in broken:
            s, b = int(tl.windows.w_s[j]), int(tl.windows.orig_b[j])
            tl.apply(j, KEEP)
            tl.set_before(j, b, tl.tensors_read_at(s, b))
            tl.apply(j, REC)
            if j in records:
                records[j] = records[j].ending_before(b)


def keep_regenerated(tl: Timeline, records: dict, budget: int) -> int:
    """Where a recomputation chain regenerates an evicted storage before its
    own use, keep it from there instead of recomputing it again later
    (Chen et al.'s segment-wise regeneration), when the budget allows and
    it saves time: the window ends at that chain, the earliest such chain
    after which the storage fits under the budget.  A plan within the budget
    stays within it once the swap layer is refreshed (:func:`_guarded`).  A
    move that changes the chain another moved window ends at so that it no
    longer regenerates that storage (:func:`broken_ends`) is refused: its
    estimate would count that storage as regenerated for free
    (``large_beside_small_graph(100)`` recompute-only at 0.3 of its peak:
    the exchange moves then compared plans 18 % cheaper than they were).
    Returns how many."""
    return _guarded(tl, records, budget, lambda careful: _keep_regenerated(tl, records, budget, careful))


def _keep_regenerated(tl: Timeline, records: dict, budget: int, careful: bool) -> int:
    """:func:`keep_regenerated`'s pass (``careful``: :func:`_guarded`'s
    second run, the swap layer refreshed after each move and checked)."""
    done = 0
    # within the budget everywhere (then kept so: a move is taken only where the plan stays within it), a
    # move's check reads only the positions it changes: the window's new part [q, b) and the chains replayed
    within = int(tl.memory().max()) <= budget
    for j in sorted((k for k in records if tl.state.pol[k] == REC), key=lambda k: -int(tl.windows.w_a[k])):
        s, a, b = int(tl.windows.w_s[j]), int(tl.windows.w_a[j]), int(tl.state.w_b[j])
        qs = [q for q in tl.state.touch.get(s, ()) if a < q < b and q in tl.state.chains
              and any(tl.tables.t_storage[t] == s for t in tl.state.chains[q].made)]
        for q in sorted(qs):   # the earliest chain first (most saved); a later one where that does not fit
            if int(tl.memory(q, b).max()) + int(tl.windows.w_bytes[j]) > budget:
                continue
            made = [t for t in tl.state.chains[q].made if tl.tables.t_storage[t] == s]
            cost = tl.added_s()
            if careful:
                if _careful_try(tl, budget, cost, lambda: tl.move_end(j, q, made)):
                    records[j] = records[j].ending_before(q)
                    done += 1
                    break
                continue
            old = tl.window_state(j)
            with tl.recording() as journal:
                tl.move_end(j, q, made)
            if (_moved_within(tl, budget, q, b, journal, within) and tl.added_s() < cost * (1 - 1e-12)
                    and not broken_ends(tl, journal)):
                records[j] = records[j].ending_before(q)
                done += 1
                break
            tl.move_end(j, state=old, replay=False)   # no gain or over budget: back to the window it had
            tl.restore_chains(journal)
    return done


def _guarded(tl: Timeline, records: dict | None, budget: int, run) -> int:
    """Run a pass that changes decisions one at a time and checks each on
    the estimated memory, then refresh the swap layer once
    (:meth:`~libra_opt.solvers.libra.estimate.Timeline.refresh_swaps`: a
    change of chain times moves prefetches and releases).  ``run(careful)``
    runs the pass, returning how many changes it kept.  Where the refresh
    takes a plan that was within ``budget`` (bytes) over it, the timeline
    and ``records`` go back to what they were and the pass runs again
    with ``careful=True``: each change is then checked with the swap layer
    refreshed (:func:`_careful_try`), slower and within the budget.
    ``h100_resnet50_b128`` hybrid at 0.3 of its peak: the retained inputs of
    an exchange's plan took its estimated peak 8 % over the budget once the
    layer was refreshed, and lowering that plan took 26 repair moves.
    Returns how many changes were kept."""
    swapped = bool(tl.state.swap.ids.size)
    within = swapped and int(tl.memory().max()) <= budget
    before = (tl.copy(), None if records is None else dict(records)) if within else None
    done = run(False)
    if done and swapped:
        tl.refresh_swaps()
        if within and int(tl.memory().max()) > budget:
            tl.state = before[0].state
            if records is not None:
                records.clear()
                records.update(before[1])
            done = run(True)
    return done


def _careful_try(tl: Timeline, budget: int, cost: float, change) -> bool:
    """Make ``change()`` (a change of ``tl`` that replays its chains), refresh
    the swap layer and keep it where the estimated memory is within
    ``budget`` (bytes), the added time is under ``cost`` (s) and no chain
    it replayed left a moved window's end broken (:func:`broken_ends`);
    otherwise put the timeline back as it was.  Whether it was kept."""
    keep = tl.copy()
    with tl.recording() as journal:
        change()
        tl.refresh_swaps()
    if int(tl.memory().max()) <= budget and tl.added_s() < cost * (1 - 1e-12) and not broken_ends(tl, journal):
        return True
    tl.state = keep.state
    return False


def _moved_within(tl: Timeline, budget: int, q: int, b: int, journal: dict, within: bool) -> bool:
    """Whether the estimated memory is within ``budget`` (bytes) everywhere
    after :func:`keep_regenerated` moved a window's end from ``b`` to ``q``
    (its storage now resident over ``[q, b)``) and replayed the chains of
    ``journal`` (positions -> chains before the move).  ``within``: it was
    within the budget everywhere before the move; then only those
    positions changed (the swap layer is refreshed after the pass), and only
    they are read, not the ``N`` positions of ``Timeline.memory``."""
    if not within:
        return int(tl.memory().max()) <= budget
    return int(tl.memory(q, b).max()) <= budget and all(
        int(tl.memory(x, x + 1)[0]) <= budget for x in journal if not q <= x < b)


def retain_inputs(tl: Timeline, budget: int) -> int:
    """Where a recomputation chain regenerates a tensor that was freed after
    its last use (not evicted: on a single-phase graph, the inputs of an
    evicted tensor's producer), keep that tensor resident until the chain
    instead, when the budget allows and it saves time: Checkmate's S
    matrix holding a value across stages, which cuts the chain short.
    Most saving first (the producer's time); each is checked on the
    timeline and taken back if it goes over budget, saves nothing or cuts
    short a chain a moved window ends at (:func:`broken_ends`); a plan
    within the budget stays within it once the swap layer is refreshed
    (:func:`_guarded`).  Returns how many were kept."""
    return _guarded(tl, None, budget, lambda careful: _retain_inputs(tl, budget, careful))


def _retain_inputs(tl: Timeline, budget: int, careful: bool) -> int:
    """:func:`retain_inputs`'s pass (``careful``: :func:`_guarded`'s second
    run, the swap layer refreshed after each retention and checked).  Each
    retention tried is followed by :func:`trim_retentions`: one that cuts
    a chain short can free the tensors retained for that chain before it."""
    cands = []
    for q, ch in tl.state.chains.items():
        if ch is None:
            continue
        for t in ch.made:
            if tl.state.t_last_eff[t] < q and tl.retainable(t):
                cands.append((-tl.tables.n_time[tl.tables.t_prod[t]], q, t))
    if not cands:
        return 0
    cands.sort()
    done = 0
    mem = tl.memory()
    for _, q, t in cands:
        ch = tl.state.chains.get(q)
        if ch is None or t not in ch.made or tl.state.t_last_eff[t] >= q:
            continue   # an earlier retention changed this chain
        s = tl.tables.t_storage[t]
        end = tl.storage_end(s)
        held = int(tl.tables.t_nbytes[s]) if tl.tables.t_act[s] else 0   # a view of an input: its storage stays resident
        if end + 1 < q and int(mem[end + 1:q].max()) + held > budget and q not in tl.state.t_until.values():
            continue   # (where other tensors are retained for this chain, t may replace them: tried)
        cost, old = tl.added_s(), tl.state.t_until.get(t)
        if careful:
            done += _careful_try(tl, budget, cost, lambda: (tl.retain(t, q), trim_retentions(tl)))
            mem = tl.memory()
            continue
        with tl.recording() as journal:
            tl.retain(t, q)
            trimmed = trim_retentions(tl)
        mem = tl.memory()
        if int(mem.max()) <= budget and tl.added_s() < cost * (1 - 1e-12) and not broken_ends(tl, journal):
            done += 1
            continue
        for u, was in reversed(trimmed):   # over budget or no gain: as it was
            tl.retain(u, was, replay=False)
        tl.retain(t, old, replay=False)
        tl.restore_chains(journal)
        mem = tl.memory()
    return done


def trim_retentions(tl: Timeline) -> list[tuple[int, int]]:
    """Shorten every retention to the last chain that reads its storage
    (drop it where none does): a tensor retained until ``q`` for a chain
    that no longer regenerates through it (a later retention cut that chain
    short: ``random_layered_graph(30, seed=2)`` with copies 4x slower than
    compute at 0.7 of its peak, n11, regenerated for n21, kept for the chain
    before n22, which then no longer reads the n2, n6, n7 retained for it)
    holds its bytes for nothing.  Each change goes through
    :meth:`~libra_opt.solvers.libra.estimate.Timeline.retain`, which replays
    the chains concerned.

    Returns
    -------
    list of (int, int)
        The ``(tensor id, until position)`` pairs changed, as they were
        (for an undo, in reverse order); empty where none was.  Raises
        nothing: a retention only shrinks.

    Source: Checkmate's S (Jain et al., MLSys 2020, sec. 4): a value is kept
    across stages only while a later stage reads it."""
    st, pt = tl.state, tl.tables
    changed = []
    for u, until in list(st.t_until.items()):
        s, last = pt.t_storage[u], pt.t_last[u]
        reads = [x for x in st.touch.get(s, ()) if last < x <= until]
        new = max(reads) if reads else None
        if new != until:
            changed.append((u, until))
            tl.retain(u, new)
    return changed


def early_shift(problem: RematProblem, orig_b: np.ndarray, tl: Timeline, records: dict, budget: int
                ) -> tuple[Timeline, dict]:
    """Regenerate early and keep the inputs together: for a recomputed
    window whose chain keeps inputs of the storage's producer resident
    until it (retentions), try the chain at each earlier position ``q``
    inside the window, with those inputs kept only until ``q``, then the
    undo pass; the cheapest such plan within ``budget`` (estimate) is
    kept (Checkmate's R regenerating a value at any stage before its use
    while S frees its inputs sooner).  Problems of at most
    :data:`EARLY_SHIFT_MAX_NODES` nodes; at most
    :data:`EARLY_SHIFT_MAX_TRIES` positions per plan.  ``orig_b``:
    ``(windows,)`` int64, each window's own end; ``budget`` in bytes.
    Returns the timeline and records (new objects where a shift was taken;
    ``tl`` and ``records`` themselves otherwise, unchanged)."""
    if problem.num_nodes > EARLY_SHIFT_MAX_NODES or not tl.state.t_until or len(records) < 2:
        return tl, records   # a shift gains through the undo pass: another decision to give back
    tries = 0
    for j in sorted(k for k in records if tl.state.pol[k] == REC):
        s, a, b = int(tl.windows.w_s[j]), int(tl.windows.w_a[j]), int(tl.state.w_b[j])
        if b != int(orig_b[j]) or j not in records:
            continue
        rets = [t for t in problem.nodes[tl.tables.t_prod[s]].inputs if tl.state.t_until.get(t) == b]
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
                t2.retain(t, q if q > t2.tables.t_last[t] else None)
            if int(t2.memory().max()) > budget:
                continue
            undo_pass(t2, r2, budget)
            if j in r2 and t2.added_s() < (best[0] if best else tl).added_s() * (1 - 1e-12):
                r2[j] = r2[j].ending_before(q)
                best = (t2, r2)
        if best is not None:
            t2, r2 = best
            if t2.state.swap.ids.size:
                t2.refresh_swaps()
                if int(t2.memory().max()) > budget >= int(tl.memory().max()):
                    continue   # over the budget once the swap layer is refreshed: this window not shifted
            tl, records = t2, r2
    return tl, records


__all__ = ["undo_pass", "broken_ends", "fix_shrunk", "keep_regenerated", "retain_inputs", "early_shift",
           "EARLY_SHIFT_MAX_NODES", "EARLY_SHIFT_MAX_TRIES"]
