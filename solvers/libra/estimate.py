"""Memory-reduction and time estimation for the ``libra`` solver: an incremental
model of the lowered plan's memory timeline over eager positions.

The model mirrors the rules of :mod:`libra_opt.passes.lowering` and
:mod:`libra_opt.passes.simulator` so that the greedy refinement can score a
candidate eviction (a storage window and a policy) without lowering and
re-simulating the whole plan:

- ``C[i]`` is graph memory while node ``i`` runs (its new outputs and its
  workspace included), an ``int64`` array over the ``N`` eager positions.  It
  starts as the no-remat plan's and every decision subtracts its storage's
  bytes over the positions where it is off the device: ``[after + 1, before
  - 1]`` for a recomputation; ``[r0, prefetch]`` for a swap, where ``r0`` is
  the first position that starts after the device-to-host copy ends (the
  simulator releases a swapped storage only then, or at the swap's wait for
  its copy out, ``Timeline.wait``, a stall) and ``prefetch`` the position
  after which the swap-in is issued (it allocates at issue).
- A *regeneration point* ``q`` (a position that reads an evicted tensor)
  runs a recomputation chain before node ``q``: the lowering's on-demand
  regeneration, replayed here with the same post-order, the same freeing of
  chain temporaries and the same choice between recomputing and swapping
  in.  It adds the chain's time and a memory point ``P[q] = C[q] + off[q]``
  (the chain's own peak above the memory resident before it).
  Chains are replayed by :func:`~libra_opt.solvers.libra.chains.chain_at`
  (solvers/libra/chains.py).
- Swaps live in one *swap layer* recomputed as a whole when swaps change
  (:func:`~libra_opt.solvers.libra.swaps.swap_layer`, solvers/libra/swaps.py): copies out serialized on the
  device-to-host queue, prefetches planned backwards from each use on the
  host-to-device queue, stalls from replaying that queue forwards.
- A candidate is scored with :meth:`Timeline.evaluate` (the chains it changes
  and the new swap layer, nothing committed) and taken with
  :meth:`Timeline.apply`, which updates ``C``, the chains and the swaps in
  place: only the affected ranges and points are recomputed.
- Window ends (segment-wise and early regeneration) and retentions live in
  solvers/libra/reshape.py (:mod:`libra_opt.solvers.libra.reshape`).

The parts, each readable on its own:

- :mod:`.codes`: the shared integer codes (policies, tensor states, ``NEG``);
- :mod:`.tables`: what never changes while planning: per-problem tables
  (:class:`~.tables.ProblemTables`) and per-window data
  (:class:`~.tables.WindowTables`);
- :mod:`.state`: the mutable state (:class:`~.state.TimelineState`), every
  field declared once with how it starts and how a copy gets it;
- :mod:`.chains`, :mod:`.swaps`, :mod:`.reshape`: the rules, as functions
  over tables and state;
- this module: :class:`Timeline`, which holds the three and offers
  evaluate / apply / copy and the reads the refinement needs.

Times shift with recomputation: ``T[i]`` (start of node ``i``) is the no-remat
start plus every chain's time at or before ``i``.

Sources: Libra (Wang, NTHU 2024), "memory reduction estimation" and the
incremental re-simulation of the greedy refinement; the lowering rules of
:mod:`libra_opt.passes.lowering`.
"""
from __future__ import annotations

from contextlib import contextmanager
import math

import numpy as np

from libra_opt.ir.problem import RematProblem
from libra_opt.passes.lowering import Eviction, Policy, Retain

from . import reshape, swaps
from .chains import Chain, affected, chain_at, early_targets, kept_by_retention
from .codes import ARRIVING, KEEP, LIVE, MISSING, NEG, REC, SWAP
from .timeline_records import EarlyEnd, Effect, Hypothesis, WindowEnd
from .reshape import chain_held_bytes, held_rise, storage_end
from .state import TimelineState
from .swaps import SwapLayer, is_zeros, layer_current, removal_change, start_times, swap_layer
from .tables import ProblemTables, WindowTables, problem_tables, tensors_read_at, window_tables

__all__ = ["Timeline", "Effect", "Chain", "SwapLayer", "EarlyEnd", "WindowEnd",
           "KEEP", "REC", "SWAP", "NEG", "LIVE", "MISSING", "ARRIVING"]


class Timeline:
    """Incremental model of the lowered plan (see the module docstring).

    Parameters
    ----------
    problem : RematProblem
    windows : list of (int, int, int)
        Candidate windows ``(storage, after, before)`` (from
        :func:`~libra_opt.passes.lowering.default_windows` or
        :func:`~libra_opt.passes.lowering.all_windows`); windows of one storage must
        not overlap.
    overlap_margin : float
        Transfers are assumed to take ``1 + overlap_margin`` times their
        measured duration (bytes / bandwidth) when judging whether they hide
        behind compute (dimensionless, >= 0).

    Attributes
    ----------
    tables : ProblemTables
        Per-problem static tables (shared by copies).
    windows : WindowTables
        Per-window static data (shared by copies).
    state : TimelineState
        The mutable state (copied by :meth:`copy`).

    The public surface is the methods (``memory``, ``peak``, ``added_s``,
    ``evaluate``, ``apply``, ``copy``, the window-end and retention moves)
    and ``problem``; the fields are read where they live (``tl.state.pol``,
    ``tl.windows.w_s``, ``tl.tables.t_storage``), each declared once in
    :mod:`~libra_opt.solvers.libra.state` or :mod:`~libra_opt.solvers.libra.tables`.
    """

    __slots__ = ("tables", "windows", "state")

    #: see :data:`~libra_opt.solvers.libra.swaps.RELAX_BATCH`
    RELAX_BATCH = swaps.RELAX_BATCH

    def __init__(self, problem: RematProblem, windows, overlap_margin: float = 0.0):
        self.tables = problem_tables(problem)
        self.windows = window_tables(self.tables, windows, overlap_margin)
        self.state = TimelineState(self.tables, self.windows)

    @property
    def problem(self) -> RematProblem:
        """The problem this timeline models (``tables.problem``)."""
        return self.tables.problem

    # ------------------------------------------------------------------ state
    def reset(self) -> None:
        """Back to the no-remat plan (every state field to its declared start,
        window ends included)."""
        self.state.reset(self.tables, self.windows)

    def copy(self) -> "Timeline":
        """An independent copy of the state (the static tables are shared)."""
        new = object.__new__(Timeline)
        new.tables = self.tables
        new.windows = self.windows
        new.state = self.state.copy()
        return new

    def memory(self, lo: int = 0, hi: int | None = None) -> np.ndarray:
        """Per-position peak of the model, ``max(C, P)``, shape ``(N,)``
        (bytes); with ``lo`` / ``hi``, only positions ``lo`` up to ``hi``
        (exclusive), shape ``(hi - lo,)``."""
        st = self.state
        C = st.C[lo:hi]
        m = C + st.regen_off[lo:hi]
        held = st.swap.held
        if not is_zeros(held):   # (a layer holding nothing shares one array of zeros: nothing to add)
            m += held[lo:hi]
        return np.maximum(m, C, out=m)   # (in place: this runs at every descent step, over N positions)

    def peak(self) -> tuple[int, int]:
        """``(peak_bytes, position)`` of the model (first position at the peak)."""
        m = self.memory()
        i = int(np.argmax(m))
        return int(m[i]), i

    def added_s(self) -> float:
        """Estimated added step time (s): every chain's time plus every stall."""
        st = self.state
        return float(st.regen_time.sum()) + st.swap.total_stall_s

    def decisions(self) -> dict[int, int]:
        """Window id -> policy of every active decision."""
        pol = self.state.pol
        return {int(j): int(pol[j]) for j in np.flatnonzero(pol)}

    def evictions(self) -> list[Eviction]:
        """The active decisions as :class:`~libra_opt.passes.lowering.Eviction`, sorted
        by (storage, after); swaps carry the model's prefetch position."""
        st, wt = self.state, self.windows
        out = []
        sw = st.swap
        waits = dict(zip(sw.ids.tolist(), sw.wait.tolist()))
        for j in np.flatnonzero(st.pol):
            pol = int(st.pol[j])
            b = int(st.w_b[j])
            early = st.w_early.get(j) if pol == REC and b != wt.orig_b[j] else None
            w = waits.get(int(j), -1) if pol == SWAP else -1
            out.append(Eviction(int(wt.w_s[j]), int(wt.w_a[j]), b, Policy.of_code(pol),
                                prefetch_after=int(st.pos[j]) if pol == SWAP else None,
                                out_wait=w if w >= 0 else None,
                                regenerate=early.tensors if early is not None and early.at == b else ()))
        out.sort(key=lambda e: (e.storage, e.after))
        return out

    def retentions(self) -> list[Retain]:
        """The active retentions as :class:`~libra_opt.passes.lowering.Retain`, by tensor."""
        return reshape.retentions(self.state)

    def plan(self) -> list:
        """Everything :func:`~libra_opt.passes.lowering.lower` needs: :meth:`evictions`
        then :meth:`retentions`."""
        return [*self.evictions(), *self.retentions()]

    def start_times(self, regen_time: np.ndarray | None = None) -> np.ndarray:
        """Start time of each node, shape ``(N,)`` (s), chains included
        (:func:`~libra_opt.solvers.libra.swaps.start_times`)."""
        return start_times(self.tables, self.state, regen_time)

    # ------------------------------------------------------------ chains
    def chain_at(self, q: int) -> Chain | None:
        """The recomputation chain before node ``q`` under the current (or
        hypothetical) decisions (:func:`~libra_opt.solvers.libra.chains.chain_at`)."""
        return chain_at(self.tables, self.windows, self.state, q)

    def early_targets(self, q: int) -> list[int]:
        """Tensors regenerated before node ``q`` although it does not read them
        (:func:`~libra_opt.solvers.libra.chains.early_targets`)."""
        return early_targets(self.state, q)

    def affected(self, j: int, host_copy: bool = False) -> set[int]:
        """Regeneration points whose chain may change when window ``j`` changes
        (:func:`~libra_opt.solvers.libra.chains.affected`)."""
        return affected(self.windows, self.state, j, host_copy)

    def replay(self, points) -> None:
        """Replay the chains before the positions ``points`` (ascending order)
        on the current decisions and install them."""
        for q in sorted(points):
            self._set_chain(q, chain_at(self.tables, self.windows, self.state, q))

    # ------------------------------------------------------------- evaluation
    def evaluate(self, j: int, policy: int, floor: int = 0, wait: int | None = None,
                 stop_above: int | None = None, stop_cost: float | None = None) -> Effect:
        """Effect of setting window ``j`` to ``policy`` (``KEEP`` undoes it),
        without changing the model.  ``floor``: for a swap, issue its swap-in no
        earlier than after this position (0: where it hides behind compute).
        ``wait``: for a swap, wait for its copy out before this position (-1:
        no wait; ``None``: as it is now).  ``stop_above`` (bytes): where a
        point off the changed chains already rises above it, the effect is
        returned before the chains are replayed, with that point as
        ``raised_max`` (above ``stop_above``: at most the true one's), no
        chains and ``cost_s`` infinite: for a caller that refuses such a
        change whatever it costs (the policy switches, the undo pass).
        ``stop_cost`` (s): where the change surely adds at least this much
        time, the same early return, before the chains are replayed: a
        replayed chain takes no less than 0 s, so the change adds at least
        its change of stalls less the time of the chains it replays as they
        are (for a caller that refuses such a change: the policy switches).
        The model is not changed either way."""
        pt, wt, st = self.tables, self.windows, self.state
        old = int(st.pol[j])
        if policy != SWAP:
            wait = -1
        elif wait is None:
            wait = int(st.wait[j]) if old == SWAP else -1
        s = int(wt.w_s[j])
        a, b = int(wt.w_a[j]), int(st.w_b[j])
        nbytes = int(wt.w_bytes[j])
        pts = affected(wt, st, j, host_copy=(old == SWAP) != (policy == SWAP))
        new_swap = None
        hyp_pos = None
        swap = st.swap
        if SWAP in (old, policy):
            ids = swap.ids
            ids = ids[ids != j] if old == SWAP else ids
            if policy == SWAP:
                ids = np.append(ids, j)
            new_swap = swap_layer(pt, wt, st, ids, st.regen_time, (j, floor if policy == SWAP else 0), (j, wait))
            old_pos = st.sw_pos[new_swap.ids]
            moved = (old_pos != new_swap.prefetch) & (new_swap.ids != j)
            # the hypothesis's prefetch positions where they differ from the state's (``st.pos``, which
            # chains.prefetch_pos falls back to): the moved swaps and window j itself
            hyp_pos = {}
            for k, was, now in zip(new_swap.ids[moved].tolist(), old_pos[moved].tolist(),
                                   new_swap.prefetch[moved].tolist()):
                hyp_pos[k] = now
                self._add_crossed(pts, k, was, now)   # chains reading swaps whose prefetch moved past them
            if policy == SWAP:
                hyp_pos[j] = int(new_swap.prefetch[new_swap.ids.searchsorted(j)])
        # change of the compute points, positive where memory rises
        rec_delta = 0
        if old == REC and policy != REC:
            rec_delta = nbytes
        elif policy == REC and old != REC:
            rec_delta = -nbytes
        C, regen_off = st.C, st.regen_off
        H_old = swap.held
        H = H_old
        if new_swap is not None:
            H = new_swap.held
            if rec_delta:
                dC = swap.removal - new_swap.removal
                dC[a + 1:b] += rec_delta
                up = ((dC > 0) | (H > H_old)).nonzero()[0]
            else:
                # the swap layer's change alone: read only where its removal moved (``removal_change``; a
                # 20k-op descent's evaluations change a few spans) and gather the change at the points read
                lo, hi, dloc = removal_change(swap, new_swap)
                up = (dloc > 0).nonzero()[0] + lo
                if H is not H_old:   # (no held bytes in either layer, the shared zeros: the common case)
                    up = np.union1d(up, (H > H_old).nonzero()[0])
                dC = None
        else:
            up = np.arange(a + 1, b) if rec_delta > 0 else np.zeros(0, dtype=np.int64)
            dC = None
        # the points off the changed chains (priced with their chains below): the chain points are dropped
        # from ``up`` (ascending) by binary search, where np.isin sorted all of ``up``
        raised_max, raised_at = NEG, -1
        if len(up) and pts:
            qs = np.fromiter(pts, dtype=np.int64, count=len(pts))
            k = up.searchsorted(qs)
            inside = k < len(up)
            k = k[inside]
            k = k[up[k] == qs[inside]]
            if len(k):
                up = np.delete(up, k)
        if len(up):
            if dC is not None:
                vals = C[up] + dC[up]
            elif new_swap is not None:
                vals = C[up] + (swap.removal[up] - new_swap.removal[up])
            else:
                vals = C[up] + rec_delta
            mm = np.maximum(vals, vals + regen_off[up] + H[up])
            k = int(mm.argmax())
            raised_max, raised_at = int(mm[k]), int(up[k])
        old_chains = st.chains
        stop = stop_above is not None and raised_max > stop_above
        if not stop and stop_cost is not None:
            least = new_swap.total_stall_s - swap.total_stall_s if new_swap is not None else 0.0
            scale = abs(least) + abs(stop_cost)
            for q in pts:
                ch = old_chains.get(q)
                if ch is not None:
                    least -= ch.time_s
                    scale += ch.time_s
            # (a margin over the rounding of the sums, relative to their terms: a change that may add
            # less is replayed)
            stop = least - stop_cost > 1e-9 * scale + 1e-15
        if stop:
            return Effect(math.inf, {}, new_swap, raised_max, raised_at, True, floor if policy == SWAP else 0, wait)
        st.hyp = Hypothesis(j, policy, s, hyp_pos)
        try:
            chains = {q: chain_at(pt, wt, st, q) for q in sorted(pts)}
        finally:
            st.hyp = None
        cost = 0.0
        feasible = True
        for q, ch in chains.items():
            old_ch = old_chains.get(q)
            cost += (ch.time_s if ch else 0.0) - (old_ch.time_s if old_ch else 0.0)
            if ch is not None and not ch.feasible:
                feasible = False
        if new_swap is not None:
            cost += new_swap.total_stall_s - swap.total_stall_s
            if dC is not None:
                dCq = {q: int(dC[q]) for q in chains}
            else:
                old_r, new_r = swap.removal, new_swap.removal
                dCq = {q: int(old_r[q] - new_r[q]) for q in chains}
        else:
            dCq = {q: (rec_delta if a < q < b else 0) for q in chains}
        newws = pt.newws
        for q, ch in chains.items():
            cq = int(C[q]) + dCq[q]
            rise = held_rise(pt, st, q, ch) if ch is not None else 0   # as _set_chain counts it
            new_m = max(cq, cq - int(newws[q]) + rise + int(H[q]))
            old_m = max(int(C[q]), int(C[q] + regen_off[q] + H_old[q]))
            if new_m > old_m and new_m > raised_max:
                raised_max, raised_at = new_m, q
        return Effect(cost, chains, new_swap, raised_max, raised_at, feasible, floor if policy == SWAP else 0,
                      wait)

    def new_value_at(self, j: int, policy: int, eff: Effect, i: int) -> int:
        """Memory of the model at position ``i`` after applying ``eff`` (bytes)."""
        st, wt = self.state, self.windows
        c = int(st.C[i])
        old = int(st.pol[j])
        if eff.swap is not None:
            c += int(st.swap.removal[i] - eff.swap.removal[i])
        if REC in (old, policy) and wt.w_a[j] < i < st.w_b[j]:
            c += -int(wt.w_bytes[j]) if policy == REC else int(wt.w_bytes[j])
        if i in eff.chains:
            ch = eff.chains[i]
            off = (held_rise(self.tables, st, i, ch) if ch else 0) - int(self.tables.newws[i])
        else:
            off = int(st.regen_off[i])
        held = eff.swap.held if eff.swap is not None else st.swap.held
        return max(c, c + off + int(held[i]))

    # ----------------------------------------------------------------- commit
    def apply(self, j: int, policy: int, eff: Effect | None = None, refresh: bool = True) -> Effect:
        """Set window ``j`` to ``policy`` and update the timeline; returns the
        effect.  ``refresh=False`` leaves the swap layer as it is (call
        :meth:`refresh_swaps` after a batch of changes)."""
        if eff is None:
            eff = self.evaluate(j, policy)
        st, wt = self.state, self.windows
        old = int(st.pol[j])
        s = int(wt.w_s[j])
        nbytes = int(wt.w_bytes[j])
        a, b = int(wt.w_a[j]), int(st.w_b[j])
        if old == REC:
            st.R_rec[a + 1:b] -= nbytes
            st.C[a + 1:b] += nbytes
        if policy == REC:
            st.R_rec[a + 1:b] += nbytes
            st.C[a + 1:b] -= nbytes
        st.pol[j] = policy
        st.pol_l[j] = policy
        st.n_swap += (policy == SWAP) - (old == SWAP)
        st.floor[j] = eff.floor
        st.wait[j] = eff.wait
        ws = st.s_win.setdefault(s, [])
        if policy == KEEP:
            if j in ws:
                ws.remove(j)
        elif j not in ws:
            ws.append(j)
        for q, ch in eff.chains.items():
            self._set_chain(q, ch)
        if eff.swap is not None:
            self.install_swaps(eff.swap)
        if refresh and st.swap.ids.size and eff.chains:   # compute times or waits moved: replan swaps
            self.refresh_swaps()
        st.version += 1
        return eff

    @contextmanager
    def recording(self):
        """Record the chains replaced inside the block (position -> chain
        before the block), for :meth:`restore_chains`: a trial change taken
        back (``move_end(..., replay=False)``, ``retain(..., replay=False)``)
        then puts its chains back without replaying them.  Yields the
        journal (a dict)."""
        st = self.state
        journal: dict = {}
        outer, st.journal = st.journal, journal
        try:
            yield journal
        finally:
            st.journal = outer
            if outer is not None:   # nested: what the inner block replaced, the outer one did too
                for q, ch in journal.items():
                    outer.setdefault(q, ch)

    def restore_chains(self, journal: dict) -> None:
        """Put back the chains recorded by :meth:`recording`, once the
        decisions, windows and retentions are back as they were before it: the
        chains a replay would give, as the estimate's chains are a function
        of that state (:meth:`chain_at`)."""
        for q, ch in journal.items():
            self._set_chain(q, ch)

    def _set_chain(self, q: int, ch: Chain | None) -> None:
        """Install chain ``ch`` (``None``: none) before position ``q``: memory
        point, chain time, and the marks of the storages it reads / waits for."""
        st = self.state
        jr = st.journal
        if jr is not None and q not in jr:
            jr[q] = st.chains.get(q)
        old = st.chains.pop(q, None)
        touch, waits, dirty = st.touch, st.waits, st.dirty
        if old is not None:
            dirty.update(old.touched)
            for s in old.touched:
                touch.get(s, set()).discard(q)
            for s, _ in old.waits:
                waits.get(s, {}).pop(q, None)
        if ch is None:   # the gap before the node: its memory before it allocates (held bytes read there)
            st.regen_off[q] = -int(self.tables.newws[q])
            if st.regen_time[q] != 0.0:
                st.regen_time[q] = 0.0
                st.T_cache = None
            return
        st.chains[q] = ch
        dirty.update(ch.touched)
        st.regen_off[q] = held_rise(self.tables, st, q, ch) - int(self.tables.newws[q])
        if st.regen_time[q] != ch.time_s:
            st.regen_time[q] = ch.time_s
            st.T_cache = None
        for s in ch.touched:
            touch.setdefault(s, set()).add(q)
        for s, off in ch.waits:
            waits.setdefault(s, {})[q] = off

    def _add_crossed(self, pts: set[int], k: int, was: int | None, now: int) -> None:
        """Add to ``pts`` the chains of swap window ``k`` whose replay may
        change when its swap-in moves from position ``was`` (``None``: not
        swapped before) to ``now``.  A chain before position ``q`` reads the
        swap-in position only through which side of ``q`` it is on (arriving
        where ``q`` is after it; off where ``q`` is before it: ``chains.state_reader``,
        ``chains.storage_off``), so chains on the same side of both are unchanged."""
        st = self.state
        lo, hi = self.windows.w_a[k], st.w_maxhi[k]
        if was is None:
            pts.update(q for q in st.touch.get(int(self.windows.w_s[k]), ()) if lo < q <= hi)
            return
        a, b = (was, now) if was < now else (now, was)
        pts.update(q for q in st.touch.get(int(self.windows.w_s[k]), ()) if lo < q <= hi and a <= q <= b)

    def install_swaps(self, layer: SwapLayer) -> bool:
        """Install swap layer ``layer``; re-replay the chains whose reads of a
        swapped storage moved relative to its prefetch.  Returns whether any was."""
        st = self.state
        lo, hi, dC = removal_change(st.swap, layer)   # (only where the removal moved, where that is known)
        st.C[lo:hi] += dC
        ids, prefetch = layer.ids, layer.prefetch
        was = st.sw_pos[ids]   # -1: not swapped before (st.pos has no entry)
        moved = (was != prefetch).nonzero()[0]
        old_ids = st.swap.ids   # the only windows with entries in sw_r0 / sw_pos
        st.swap = layer
        st.sw_r0[old_ids] = self.tables.N + 1
        st.sw_pos[old_ids] = -1
        st.sw_r0[ids] = layer.r0
        st.sw_pos[ids] = prefetch
        # st.pos (this state's own dict): the swaps gone leave it, the moved and the new ones are set
        pos = st.pos
        if len(old_ids):
            for k in old_ids[st.sw_pos[old_ids] < 0].tolist():
                del pos[k]
        mk, mv = ids[moved].tolist(), prefetch[moved].tolist()
        pts: set[int] = set()
        for k, w, v in zip(mk, was[moved].tolist(), mv):
            pos[k] = v
            self._add_crossed(pts, k, None if w < 0 else w, v)
        self.replay(pts)
        return bool(pts)

    def refresh_swaps(self, rounds: int = 3) -> None:
        """Recompute the swap layer after compute times or chain waits moved,
        until its prefetch positions are stable (at most ``rounds`` times);
        nothing where none of its inputs changed since it was computed
        (:func:`~libra_opt.solvers.libra.swaps.layer_current`: the first
        round would install an equal layer and stop)."""
        st = self.state
        if layer_current(self.tables, self.windows, st, st.swap):
            return
        for _ in range(rounds):
            old = st.swap
            rechained = self.install_swaps(swap_layer(self.tables, self.windows, st, st.swap.ids, st.regen_time))
            if np.array_equal(old.prefetch, st.swap.prefetch) and np.array_equal(old.stall_s, st.swap.stall_s):
                break
            if not rechained:   # no chain time, wait or mark changed: the next round would give this layer
                break

    # ------------------------------------------------------------- swaps in bulk
    def swap_bulk(self, ids) -> int:
        """Swap every window of ``ids`` at once (:func:`~libra_opt.solvers.libra.swaps.swap_bulk`);
        returns how many were swapped."""
        return swaps.swap_bulk(self, ids)

    def relax_swaps(self, budget: int) -> list[int]:
        """Give back what a ``budget`` (bytes) does not need of the swaps
        (:func:`~libra_opt.solvers.libra.swaps.relax_swaps`); returns the windows set to keep."""
        return swaps.relax_swaps(self, budget)

    # ------------------------------------------------------ window ends, retentions
    def tensors_read_at(self, s: int, q: int) -> list[int]:
        """Tensors of storage ``s`` that node ``q`` reads (:func:`~libra_opt.solvers.libra.tables.tensors_read_at`)."""
        return tensors_read_at(self.tables, s, q)

    def set_before(self, j: int, q: int, regenerated) -> None:
        """Move the end of kept window ``j`` to position ``q``
        (:func:`~libra_opt.solvers.libra.reshape.set_before`).

        Raises
        ------
        ValueError
            Window ``j`` has a decision."""
        reshape.set_before(self.tables, self.windows, self.state, j, q, regenerated)

    def window_state(self, j: int) -> WindowEnd:
        """The end of window ``j`` (for :meth:`move_end` back to it)."""
        return reshape.window_state(self.state, j)

    def move_window_back(self, j: int, state: WindowEnd) -> None:
        """Put back the end of a *kept* window saved by :meth:`window_state`."""
        reshape.move_window_back(self.windows, self.state, j, state)

    def move_end(self, j: int, q: int | None = None, regenerated=(), state: WindowEnd | None = None,
                 replay: bool = True) -> None:
        """Move the end of recomputed window ``j`` to position ``q`` (as
        :meth:`set_before`), or back to a ``state`` from :meth:`window_state`,
        and update the timeline (:func:`~libra_opt.solvers.libra.reshape.move_end`).
        ``replay=False`` leaves the chains to the caller (a trial taken back:
        :meth:`restore_chains`).

        Raises
        ------
        ValueError
            Window ``j`` is not recomputed."""
        pts = reshape.move_end(self.tables, self.windows, self.state, j, q, regenerated, state)
        if replay:
            self.replay(pts)
        self.state.version += 1

    def move_ends(self, ends) -> None:
        """Move the ends of several recomputed windows, ``(j, q)`` each, to
        their positions ``q`` (each where node ``q`` reads the storage's
        tensors: :meth:`tensors_read_at`), then replay the chains of every
        point one of them may change once (:meth:`move_end` one after
        another replays some of them once per window; a chain is a function
        of the decisions at its point, and a point a later move changes is
        among those replayed: the same timeline).  ``h100_resnet50_b128``,
        the VGG segmentation graph: the exchange moves give every moved
        end back this way (``exchange._reset_ends``).

        Raises
        ------
        ValueError
            A window is not recomputed."""
        pts: set[int] = set()
        for j, q in ends:
            s = int(self.windows.w_s[j])
            pts |= reshape.move_end(self.tables, self.windows, self.state, j, q, self.tensors_read_at(s, q))
        if ends:
            self.replay(pts)
            self.state.version += len(ends)   # (one change per window, as move_end counts them)

    def storage_end(self, s: int) -> int:
        """Last position storage ``s`` is resident without evictions
        (:func:`~libra_opt.solvers.libra.reshape.storage_end`)."""
        return storage_end(self.tables, self.state, s)


    def chain_held_bytes(self, q: int) -> int:
        """Bytes retained only for the chain before node ``q``
        (:func:`~libra_opt.solvers.libra.reshape.chain_held_bytes`)."""
        return chain_held_bytes(self.tables, self.state, q)

    def retainable(self, t: int) -> bool:
        """Tensor ``t`` may be kept past its last use
        (:func:`~libra_opt.solvers.libra.reshape.retainable`)."""
        return reshape.retainable(self.tables, self.state, t)

    def retain(self, t: int, until: int | None, replay: bool = True) -> None:
        """Keep tensor ``t`` resident after its last use through position
        ``until`` (``None``: back to its last use) and update the timeline
        (:func:`~libra_opt.solvers.libra.reshape.retain`).  ``replay=False``
        leaves the chains to the caller (a trial taken back: :meth:`restore_chains`).

        Raises
        ------
        ValueError
            ``until`` is not after the tensor's last use, or a window of its
            storage ends after that last use."""
        was = self.state.t_until.get(t)
        was_last = self.state.t_last_eff[t]
        pts = reshape.retain(self.tables, self.state, t, until)
        if replay:
            # the chains at the retention's old and new end too, read or not: the bytes held only for a
            # chain (reshape.chain_held_bytes) are counted in its memory (``regen_off``); a chain the
            # moved last use does not change is installed again, not replayed (most of them: a retention
            # tried for a recomputation keeps inputs the kept storage's chains never ask for)
            pt, wt, st = self.tables, self.windows, self.state
            chains = st.chains
            ends = {x for x in (was, until) if x is not None and chains.get(x) is not None}
            for q in sorted(ends.union(pts)):
                ch = chains.get(q)
                if ch is None or not kept_by_retention(pt, wt, st, ch, q, t, was_last):
                    ch = chain_at(pt, wt, st, q)
                self._set_chain(q, ch)
        self.state.version += 1
