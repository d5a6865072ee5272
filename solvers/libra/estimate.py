"""Memory-reduction and time estimation for the ``libra`` solver: an incremental
model of the lowered plan's memory timeline over eager positions.

The model mirrors the rules of :mod:`libra_opt.lowering` and
:mod:`libra_opt.simulator` so that the greedy refinement can score a
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
  Chains are replayed by :mod:`libra_opt.solvers.libra_chains`.
- Swaps live in one *swap layer* recomputed as a whole when swaps change
  (:mod:`libra_opt.solvers.libra_swaps`): copies out serialized on the
  device-to-host queue, prefetches planned backwards from each use on the
  host-to-device queue, stalls from replaying that queue forwards.
- A candidate is scored with :meth:`Timeline.evaluate` (the chains it changes
  and the new swap layer, nothing committed) and taken with
  :meth:`Timeline.apply`, which updates ``C``, the chains and the swaps in
  place: only the affected ranges and points are recomputed.
- Window ends (segment-wise and early regeneration) and retentions live in
  :mod:`libra_opt.solvers.libra_reshape`.

Times shift with recomputation: ``T[i]`` (start of node ``i``) is the no-remat
start plus every chain's time at or before ``i``.

Sources: Libra (Wang, NTHU 2024), "memory reduction estimation" and the
incremental re-simulation of the greedy refinement; the lowering rules of
:mod:`libra_opt.lowering`.
"""
from __future__ import annotations

from contextlib import contextmanager

import numpy as np

from libra_opt.passes.lowering import Eviction, Policy
from libra_opt.ir.problem import ACTIVATION, RematProblem

from .chains import Chain, ChainReplay
from .codes import ARRIVING, KEEP, LIVE, MISSING, NEG, REC, SWAP
from .records import Effect
from .reshape import Reshaper
from .swaps import SwapLayer, SwapPlanner


class Timeline(ChainReplay, SwapPlanner, Reshaper):
    """Incremental model of the lowered plan (see the module docstring).

    Parameters
    ----------
    problem : RematProblem
    windows : list of (int, int, int)
        Candidate windows ``(storage, after, before)`` (from
        :func:`~libra_opt.lowering.default_windows` or
        :func:`~libra_opt.lowering.all_windows`); windows of one storage must
        not overlap.
    overlap_margin : float
        Transfers are assumed to take ``1 + overlap_margin`` times their
        measured duration (bytes / bandwidth) when judging whether they hide
        behind compute (dimensionless, >= 0).

    Attributes
    ----------
    C : ndarray of int64, shape (N,)
        Memory at each compute point under the current decisions (bytes).
    pol : ndarray of int8, shape (num_windows,)
        Current policy per window (``KEEP``, ``REC``, ``SWAP``).
    wait : ndarray of int64, shape (num_windows,)
        Per swapped window, the position before which the compute stream waits
        for its copy out (the lowering's ``Eviction.out_wait``); -1: none.
    """

    def __init__(self, problem: RematProblem, windows, overlap_margin: float = 0.0):
        p = self.problem = problem
        N = self.N = p.num_nodes
        self.margin = float(overlap_margin)
        T = p.tensors
        self.t_act = [t.kind == ACTIVATION for t in T]
        self.t_storage = [t.storage for t in T]
        self.t_prod = [t.producer for t in T]
        self.t_cons = [t.consumers for t in T]
        self.t_nbytes = [t.nbytes for t in T]
        self.t_out = [False] * len(T)
        for o in p.outputs:
            self.t_out[o] = True
        self.t_last = [max(t.consumers) if t.consumers else (t.producer if t.producer is not None else -1)
                       for t in T]
        self.n_inputs = [n.inputs for n in p.nodes]
        self.n_outputs = [n.outputs for n in p.nodes]
        self.n_time = [n.time_s for n in p.nodes]
        self.n_rtime = p.recompute_time.tolist()  # a recompute's cost under the executor's model (libra_opt.costs)
        self.n_ws = [n.workspace_bytes for n in p.nodes]
        self.n_recomp = [n.recomputable for n in p.nodes]
        self.views = p.storage_views
        self.node_time = p.node_time
        self.cum = np.concatenate([[0.0], np.cumsum(self.node_time)])
        self.overlap = p.device.copies_overlap_compute
        self.h2d = float(p.device.h2d_bytes_per_s)
        self.d2h = float(p.device.d2h_bytes_per_s)
        # --- no-remat compute points: storages live from their producer to the last use of any tensor on them
        diff = np.zeros(N + 1, dtype=np.int64)
        newws = np.array(self.n_ws, dtype=np.int64)
        for s, ts in self.views.items():
            base = T[s]
            if base.kind != ACTIVATION or base.nbytes == 0:
                continue
            end = N - 1 if any(self.t_out[t] for t in ts) else max(self.t_last[t] for t in ts)
            diff[base.producer] += base.nbytes
            diff[end + 1] -= base.nbytes
            newws[base.producer] += base.nbytes
        self.C0 = np.cumsum(diff[:N]) + np.array(self.n_ws, dtype=np.int64)
        self.newws = newws
        # --- windows
        self.w_s = np.array([w[0] for w in windows], dtype=np.int64)
        self.w_a = np.array([w[1] for w in windows], dtype=np.int64)
        self.w_a_l = [int(w[1]) for w in windows]   # list mirror for scalar reads in the hot loops
        self.w_b = np.array([w[2] for w in windows], dtype=np.int64)
        self.orig_b = self.w_b.copy()   # each window's own end (a use of its storage)
        self.w_bytes = np.array([T[w[0]].nbytes for w in windows], dtype=np.int64)
        self.w_prod = np.array([T[w[0]].producer for w in windows], dtype=np.int64)
        self.w_hi: list[dict] = []      # tensor -> last position (regeneration point) it is off for
        self.w_pts: list[tuple] = []    # regeneration points of the window
        for s, a, b in windows:
            hi = self._window_hi(s, a, b, self.tensors_read_at(s, b))
            self.w_hi.append(hi)
            self.w_pts.append(tuple(sorted(set(hi.values()))))
        self.w_maxhi = np.array([max(h.values()) if h else b for h, (_, _, b) in zip(self.w_hi, windows)],
                                dtype=np.int64)
        self.w_rec_ok = np.array([self.n_recomp[pr] for pr in self.w_prod], dtype=bool)
        self.s_windows: dict[int, list[int]] = {}
        for j, (s, _, _) in enumerate(windows):
            self.s_windows.setdefault(s, []).append(j)
        self.unique_storages = len(self.s_windows) == len(windows)
        self.nw = len(windows)
        self.reset()

    # ------------------------------------------------------------------ state
    def reset(self) -> None:
        """Back to the no-remat plan."""
        self.pol = np.zeros(self.nw, dtype=np.int8)
        self.pol_l = [KEEP] * self.nw      # list mirror of pol for scalar reads in the hot loops
        self.floor = np.zeros(self.nw, dtype=np.int64)
        self.wait = np.full(self.nw, -1, dtype=np.int64)
        self.s_win: dict[int, list[int]] = {}
        self.w_early: dict[int, tuple] = {}     # window -> (q, tensors) regenerated before node q
        self.early_at: dict[int, set] = {}      # q -> windows that may regenerate before node q
        self.t_last_eff = list(self.t_last)   # last use, or the end of a retention
        self.t_until: dict[int, int] = {}      # retained tensor -> position it stays resident through
        self.s_retained: dict[int, int] = {}   # storage -> how many of its tensors are retained
        self.R_rec = np.zeros(self.N, dtype=np.int64)
        self.C = self.C0.copy()
        self.chains: dict[int, Chain] = {}
        self.regen_off = np.full(self.N, NEG, dtype=np.int64)
        self.regen_time = np.zeros(self.N)
        self._T = None
        self.touch: dict[int, set] = {}
        self.waits: dict[int, dict] = {}
        self.touch_first = np.full(self.nw, self.N + 1, dtype=np.int64)
        self.wait_q = np.full(self.nw, -1, dtype=np.int64)
        self.wait_off = np.zeros(self.nw)
        self._dirty: set[int] = set()
        self.sw_r0 = np.full(self.nw, self.N + 1, dtype=np.int64)
        self.sw_pos = np.full(self.nw, -1, dtype=np.int64)
        self.swap = self._swap_layer(np.zeros(0, dtype=np.int64), self.regen_time)
        self.pos = {}
        self._hyp = None
        self._journal: dict | None = None   # see recording()
        self.version = 0

    def copy(self) -> "Timeline":
        """An independent copy of the state (the static arrays are shared)."""
        new = object.__new__(Timeline)
        new.__dict__.update(self.__dict__)
        new.pol = self.pol.copy()
        new.pol_l = list(self.pol_l)
        new.w_b = self.w_b.copy()
        new.w_hi = list(self.w_hi)
        new.w_pts = list(self.w_pts)
        new.w_maxhi = self.w_maxhi.copy()
        new.floor = self.floor.copy()
        new.wait = self.wait.copy()
        new.s_win = {s: list(v) for s, v in self.s_win.items()}
        new.w_early = dict(self.w_early)
        new.early_at = {q: set(v) for q, v in self.early_at.items()}
        new.t_last_eff = list(self.t_last_eff) if self.t_until else self.t_last_eff
        new.t_until = dict(self.t_until)
        new.s_retained = dict(self.s_retained)
        new.R_rec = self.R_rec.copy()
        new.C = self.C.copy()
        new.chains = dict(self.chains)
        new.regen_off = self.regen_off.copy()
        new.regen_time = self.regen_time.copy()
        new.touch = {s: set(v) for s, v in self.touch.items()}
        new.waits = {s: dict(v) for s, v in self.waits.items()}
        new._journal = None   # a copy records nothing of its original's trial
        new.pos = dict(self.pos)
        new.touch_first = self.touch_first.copy()
        new.wait_q = self.wait_q.copy()
        new.wait_off = self.wait_off.copy()
        new._dirty = set(self._dirty)
        new.sw_r0 = self.sw_r0.copy()
        new.sw_pos = self.sw_pos.copy()
        return new

    def memory(self) -> np.ndarray:
        """Per-position peak of the model, ``max(C, P)``, shape ``(N,)`` (bytes)."""
        return np.maximum(self.C, self.C + self.regen_off + self.swap.held)

    def peak(self) -> tuple[int, int]:
        """``(peak_bytes, position)`` of the model (first position at the peak)."""
        m = self.memory()
        i = int(np.argmax(m))
        return int(m[i]), i

    def added_s(self) -> float:
        """Estimated added step time (s): every chain's time plus every stall."""
        return float(self.regen_time.sum()) + self.swap.total_stall_s

    def decisions(self) -> dict[int, int]:
        """Window id -> policy of every active decision."""
        return {int(j): int(self.pol[j]) for j in np.flatnonzero(self.pol)}

    def evictions(self) -> list[Eviction]:
        """The active decisions as :class:`~libra_opt.lowering.Eviction`, sorted
        by (storage, after); swaps carry the model's prefetch position."""
        out = []
        sw = self.swap
        waits = dict(zip(sw.ids.tolist(), sw.wait.tolist()))
        for j in np.flatnonzero(self.pol):
            pol = int(self.pol[j])
            b = int(self.w_b[j])
            early = self.w_early.get(j) if pol == REC and b != self.orig_b[j] else None
            w = waits.get(int(j), -1) if pol == SWAP else -1
            out.append(Eviction(int(self.w_s[j]), int(self.w_a[j]), b, Policy.of_code(pol),
                                prefetch_after=int(self.pos[j]) if pol == SWAP else None,
                                out_wait=w if w >= 0 else None,
                                regenerate=early[1] if early is not None and early[0] == b else ()))
        out.sort(key=lambda e: (e.storage, e.after))
        return out

    def start_times(self, regen_time: np.ndarray | None = None) -> np.ndarray:
        """Start time of each node, shape ``(N,)`` (s), chains included."""
        if regen_time is None or regen_time is self.regen_time:
            if self._T is None:
                self._T = self.cum[:-1] + np.cumsum(self.regen_time)
            return self._T
        return self.cum[:-1] + np.cumsum(regen_time)

    # --------------------------------------------------------- tensor states
    def _pol(self, j: int) -> int:
        h = self._hyp
        if h is not None and h[0] == j:
            return h[1]
        return self.pol_l[j]

    def _wins(self, s: int):
        ws = self.s_win.get(s, ())
        h = self._hyp
        if h is not None and h[2] == s and h[0] not in ws:
            return (*ws, h[0])
        return ws

    def _prefetch_pos(self, j: int) -> int:
        h = self._hyp
        if h is not None and h[3] is not None and j in h[3]:
            return h[3][j]
        return self.pos[j]

    def _st(self, t: int, q: int) -> int:
        """State of tensor ``t`` just before position ``q``'s chain."""
        if not self.t_act[t]:
            return LIVE
        if not self.t_out[t] and self.t_last_eff[t] < q:
            return MISSING
        s = self.t_storage[t]
        ws = self.s_win.get(s, ())
        h = self._hyp
        if h is not None and h[2] == s and h[0] not in ws:
            ws = (*ws, h[0])
        pol_l, w_a, w_hi = self.pol_l, self.w_a_l, self.w_hi
        for j in ws:
            pol = h[1] if h is not None and h[0] == j else pol_l[j]
            if pol == KEEP:
                continue
            if w_a[j] < q <= w_hi[j].get(t, -1):
                if pol == SWAP and t == s and q > self._prefetch_pos(j):
                    return ARRIVING
                return MISSING
        return LIVE

    def _storage_off(self, s: int, q: int) -> bool:
        """The lowering's ``_is_off``: storage ``s`` meant to be off at the end of ``q``."""
        for j in self._wins(s):
            pol = self._pol(j)
            if pol == REC and self.w_a_l[j] <= q <= self.w_b[j] - 1:
                return True
            if pol == SWAP and self.w_a_l[j] <= q <= self._prefetch_pos(j) - 1:
                return True
        return False

    def _has_swap(self, s: int) -> bool:
        """Some window of storage ``s`` is swapped (under the hypothesis, if any)."""
        ws = self.s_win.get(s)
        h = self._hyp
        pol_l = self.pol_l
        if h is not None and h[2] == s:
            return h[1] == SWAP or any(pol_l[j] == SWAP for j in ws or () if j != h[0])
        if ws:
            for j in ws:
                if pol_l[j] == SWAP:
                    return True
        return False

    # ------------------------------------------------------------- evaluation
    def _affected(self, j: int) -> set[int]:
        """Regeneration points whose chain may change when window ``j`` changes."""
        a, hi = int(self.w_a[j]), int(self.w_maxhi[j])
        pts = set(self.w_pts[j])
        for q in self.touch.get(int(self.w_s[j]), ()):
            if a < q <= hi:
                pts.add(q)
        return pts

    def evaluate(self, j: int, policy: int, floor: int = 0, wait: int | None = None) -> Effect:
        """Effect of setting window ``j`` to ``policy`` (``KEEP`` undoes it),
        without changing the model.  ``floor``: for a swap, issue its swap-in no
        earlier than after this position (0: where it hides behind compute).
        ``wait``: for a swap, wait for its copy out before this position (-1:
        no wait; ``None``: as it is now)."""
        old = int(self.pol[j])
        if policy != SWAP:
            wait = -1
        elif wait is None:
            wait = int(self.wait[j]) if old == SWAP else -1
        s = int(self.w_s[j])
        a, b = int(self.w_a[j]), int(self.w_b[j])
        nbytes = int(self.w_bytes[j])
        pts = self._affected(j)
        new_swap = None
        hyp_pos = None
        if SWAP in (old, policy):
            ids = self.swap.ids
            ids = ids[ids != j] if old == SWAP else ids
            if policy == SWAP:
                ids = np.append(ids, j)
            new_swap = self._swap_layer(ids, self.regen_time, (j, floor if policy == SWAP else 0), (j, wait))
            hyp_pos = dict(zip(new_swap.ids.tolist(), new_swap.prefetch.tolist()))
            old_pos = self.sw_pos[new_swap.ids]
            moved = (old_pos != new_swap.prefetch) & (new_swap.ids != j)
            for k, was, now in zip(new_swap.ids[moved].tolist(), old_pos[moved].tolist(),
                                   new_swap.prefetch[moved].tolist()):
                self._add_crossed(pts, k, was, now)   # chains reading swaps whose prefetch moved past them
        self._hyp = (j, policy, s, hyp_pos)
        try:
            chains = {q: self.chain_at(q) for q in sorted(pts)}
        finally:
            self._hyp = None
        cost = 0.0
        feasible = True
        for q, ch in chains.items():
            old_ch = self.chains.get(q)
            cost += (ch.time_s if ch else 0.0) - (old_ch.time_s if old_ch else 0.0)
            if ch is not None and not ch.feasible:
                feasible = False
        # change of the compute points, positive where memory rises
        rec_delta = 0
        if old == REC and policy != REC:
            rec_delta = nbytes
        elif policy == REC and old != REC:
            rec_delta = -nbytes
        H_old = self.swap.held
        H = H_old
        if new_swap is not None:
            cost += new_swap.total_stall_s - self.swap.total_stall_s
            dC = self.swap.removal - new_swap.removal
            if rec_delta:
                dC[a + 1:b] += rec_delta
            H = new_swap.held
            up = np.flatnonzero((dC > 0) | (H > H_old))
            dCq = {q: int(dC[q]) for q in chains}
        else:
            up = np.arange(a + 1, b) if rec_delta > 0 else np.zeros(0, dtype=np.int64)
            dC = None
            dCq = {q: (rec_delta if a < q < b else 0) for q in chains}
        raised_max, raised_at = NEG, -1
        if len(up) and chains:
            up = up[~np.isin(up, np.fromiter(chains, dtype=np.int64))]
        if len(up):
            vals = self.C[up] + (dC[up] if dC is not None else rec_delta)
            mm = np.maximum(vals, vals + self.regen_off[up] + H[up])
            k = int(np.argmax(mm))
            raised_max, raised_at = int(mm[k]), int(up[k])
        for q, ch in chains.items():
            cq = int(self.C[q]) + dCq[q]
            new_m = cq if ch is None else max(cq, cq - int(self.newws[q]) - ch.kept_bytes + ch.peak_bytes + int(H[q]))
            old_m = max(int(self.C[q]), int(self.C[q] + self.regen_off[q] + H_old[q]))
            if new_m > old_m and new_m > raised_max:
                raised_max, raised_at = new_m, q
        return Effect(cost, chains, new_swap, raised_max, raised_at, feasible, floor if policy == SWAP else 0,
                      wait)

    def new_value_at(self, j: int, policy: int, eff: Effect, i: int) -> int:
        """Memory of the model at position ``i`` after applying ``eff`` (bytes)."""
        c = int(self.C[i])
        old = int(self.pol[j])
        if eff.swap is not None:
            c += int(self.swap.removal[i] - eff.swap.removal[i])
        if REC in (old, policy) and self.w_a[j] < i < self.w_b[j]:
            c += -int(self.w_bytes[j]) if policy == REC else int(self.w_bytes[j])
        if i in eff.chains:
            ch = eff.chains[i]
            off = NEG if ch is None else ch.peak_bytes - ch.kept_bytes - int(self.newws[i])
        else:
            off = int(self.regen_off[i])
        held = eff.swap.held if eff.swap is not None else self.swap.held
        return max(c, c + off + int(held[i]))

    # ----------------------------------------------------------------- commit
    def apply(self, j: int, policy: int, eff: Effect | None = None, refresh: bool = True) -> Effect:
        """Set window ``j`` to ``policy`` and update the timeline; returns the
        effect.  ``refresh=False`` leaves the swap layer as it is (call
        :meth:`refresh_swaps` after a batch of changes)."""
        if eff is None:
            eff = self.evaluate(j, policy)
        old = int(self.pol[j])
        s = int(self.w_s[j])
        nbytes = int(self.w_bytes[j])
        a, b = int(self.w_a[j]), int(self.w_b[j])
        if old == REC:
            self.R_rec[a + 1:b] -= nbytes
            self.C[a + 1:b] += nbytes
        if policy == REC:
            self.R_rec[a + 1:b] += nbytes
            self.C[a + 1:b] -= nbytes
        self.pol[j] = policy
        self.pol_l[j] = policy
        self.floor[j] = eff.floor
        self.wait[j] = eff.wait
        ws = self.s_win.setdefault(s, [])
        if policy == KEEP:
            if j in ws:
                ws.remove(j)
        elif j not in ws:
            ws.append(j)
        for q, ch in eff.chains.items():
            self._set_chain(q, ch)
        if eff.swap is not None:
            self._set_swap(eff.swap)
        if refresh and self.swap.ids.size and eff.chains:   # compute times or waits moved: replan swaps
            self.refresh_swaps()
        self.version += 1
        return eff

    @contextmanager
    def recording(self):
        """Record the chains replaced inside the block (position -> chain
        before the block), for :meth:`restore_chains`: a trial change taken
        back (``move_end(..., replay=False)``, ``retain(..., replay=False)``)
        then puts its chains back without replaying them.  Yields the
        journal (a dict)."""
        journal: dict = {}
        outer, self._journal = self._journal, journal
        try:
            yield journal
        finally:
            self._journal = outer
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
        jr = self._journal
        if jr is not None and q not in jr:
            jr[q] = self.chains.get(q)
        old = self.chains.pop(q, None)
        if old is not None:
            self._dirty.update(old.touched)
            for s in old.touched:
                self.touch.get(s, set()).discard(q)
            for s, _ in old.waits:
                self.waits.get(s, {}).pop(q, None)
        if ch is None:
            self.regen_off[q] = NEG
            if self.regen_time[q] != 0.0:
                self.regen_time[q] = 0.0
                self._T = None
            return
        self.chains[q] = ch
        self._dirty.update(ch.touched)
        self.regen_off[q] = ch.peak_bytes - ch.kept_bytes - int(self.newws[q]) + self.chain_held_bytes(q)
        if self.regen_time[q] != ch.time_s:
            self.regen_time[q] = ch.time_s
            self._T = None
        for s in ch.touched:
            self.touch.setdefault(s, set()).add(q)
        for s, off in ch.waits:
            self.waits.setdefault(s, {})[q] = off

    def _add_crossed(self, pts: set[int], k: int, was: int | None, now: int) -> None:
        """Add to ``pts`` the chains of swap window ``k`` whose replay may
        change when its swap-in moves from position ``was`` (``None``: not
        swapped before) to ``now``.  A chain before position ``q`` reads the
        swap-in position only through which side of ``q`` it is on (``_st``:
        arriving where ``q`` is after it; ``_storage_off``: off where ``q`` is
        before it), so chains on the same side of both are unchanged."""
        lo, hi = self.w_a[k], self.w_maxhi[k]
        if was is None:
            pts.update(q for q in self.touch.get(int(self.w_s[k]), ()) if lo < q <= hi)
            return
        a, b = (was, now) if was < now else (now, was)
        pts.update(q for q in self.touch.get(int(self.w_s[k]), ()) if lo < q <= hi and a <= q <= b)

    def _set_swap(self, layer: SwapLayer) -> bool:
        """Install ``layer``; re-replay the chains whose reads of a swapped
        storage moved relative to its prefetch.  Returns whether any was."""
        self.C += self.swap.removal - layer.removal
        old_pos = self.pos
        self.swap = layer
        self.pos = dict(zip(layer.ids.tolist(), layer.prefetch.tolist()))
        self.sw_r0[:] = self.N + 1
        self.sw_pos[:] = -1
        self.sw_r0[layer.ids] = layer.r0
        self.sw_pos[layer.ids] = layer.prefetch
        pts: set[int] = set()
        for k, v in self.pos.items():
            was = old_pos.get(k)
            if was != v:
                self._add_crossed(pts, k, was, v)
        for q in sorted(pts):
            self._set_chain(q, self.chain_at(q))
        return bool(pts)

    def refresh_swaps(self, rounds: int = 3) -> None:
        """Recompute the swap layer after compute times or chain waits moved,
        until its prefetch positions are stable (at most ``rounds`` times)."""
        for _ in range(rounds):
            old = self.swap
            rechained = self._set_swap(self._swap_layer(self.swap.ids, self.regen_time))
            if np.array_equal(old.prefetch, self.swap.prefetch) and np.array_equal(old.stall_s, self.swap.stall_s):
                break
            if not rechained:   # no chain time, wait or mark changed: the next round would give this layer
                break
