"""The swap layer of the ``libra`` estimate: where every swap decision's
swap-in is issued, when its copies end, what it stalls and what it takes off
the memory timeline, as a whole, vectorized over the swaps.

- copies out are serialized on the device-to-host queue in issue order (right
  after each producer, as :func:`~libra_opt.lowering.lower` emits them);
- prefetches are planned backwards from each use on the host-to-device queue
  (queue-aware, the lowering's ``prefetch="auto"``), earlier where a chain in
  the window reads the storage, later where a decision delays them on purpose;
- the host-to-device queue is then replayed forwards (running maxima; a
  sequential replay only when something stalls, a stall delaying what follows);
- a swapped storage leaves the timeline from the first node that starts after
  its copy out ends until its swap-in is issued;
- a swap may wait for its copy out (``Timeline.wait``, the lowering's
  ``Eviction.out_wait``): the compute stream stalls before that position until
  the copy has ended, so the storage is gone from there; the device-to-host
  queue is then replayed forwards with those stalls delaying every later node
  and copy, and the rest of the layer runs on the delayed start times;
- a *bulk* swap (``SwapPlanner.swap_bulk``) swaps every window at once, each
  waiting for its copy out right after the storage's last use before the
  window and swapped in right before its use: the least memory swapping
  can hold (each storage resident only where it is read), paying stalls;
  ``SwapPlanner.relax_swaps`` then gives back, swap by swap, what a budget
  does not need (the swap itself, the delay of its swap-in, its wait).

Source: the simulator's copy-queue rules (:mod:`libra_opt.simulator`) and the
lowering's prefetch rule; Libra (Wang, NTHU 2024) for hiding transfers behind
compute.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .codes import KEEP, NEG, SWAP
from .records import Effect


@dataclass(frozen=True)
class SwapLayer:
    """Positions and costs of every swap decision, as arrays over the swap
    windows ``ids`` (ascending window ids).  ``removal`` (shape ``(N,)``,
    bytes) is what the swaps take off the timeline; ``held`` (shape ``(N,)``,
    bytes) what is still held during the recomputation chain before a
    position although released by the time the node starts; ``stall_s`` per
    swap (waits for its swap-in, and for its copy out where it waits for
    it).  ``pessimistic``: some swap-in is issued before its copy out ends (a
    slow link), where the model over-counts memory and stalls.  ``wait``
    (shape ``(len(ids),)``): the position before which each swap waits for its copy
    out, where that wait takes effect (-1: none)."""

    ids: np.ndarray
    prefetch: np.ndarray
    r0: np.ndarray
    stall_s: np.ndarray
    d2h_end_s: np.ndarray
    removal: np.ndarray
    held: np.ndarray
    pessimistic: bool = False
    wait: np.ndarray | None = None

    @property
    def total_stall_s(self) -> float:
        return float(self.stall_s.sum()) if len(self.stall_s) else 0.0


class SwapPlanner:
    """Mixin of :class:`~libra_opt.solvers.libra_estimate.Timeline`: the swap layer."""

    def _update_marks(self) -> None:
        """Refresh, for the windows of storages whose chains changed, the first
        chain inside the window that reads the storage (``touch_first``) and the
        first that waits for its swap-in (``wait_q``, ``wait_off``)."""
        BIG = self.N + 1
        for s in self._dirty:
            touch = self.touch.get(s, ())
            waits = self.waits.get(s, {})
            for j in self.s_windows.get(s, ()):
                a, b = int(self.w_a[j]), int(self.w_b[j])
                self.touch_first[j] = min((q for q in touch if a < q < b), default=BIG)
                w = min(((q, off) for q, off in waits.items() if a < q <= b), default=None)
                self.wait_q[j], self.wait_off[j] = (w if w is not None else (-1, 0.0))
        self._dirty = set()

    def _out_waits(self, T: np.ndarray, Tend: np.ndarray, regen_time: np.ndarray, n: int, first: np.ndarray,
                   o: np.ndarray, d_o: np.ndarray, prod_o: np.ndarray, wt: np.ndarray):
        """The device-to-host queue with the waits for copies out (``wt``: wait
        position per swap, -1 none; only a storage's first swap window has
        one): a wait before node ``w`` stalls until its copy ends, delaying
        every later node and copy issue.

        With ``D`` the delay so far, a copy issued after node ``p`` ends at
        ``max(previous end, Tend[p] + D(p)) + duration`` and a wait before node
        ``w`` raises ``D`` to ``end - chain start(w)``: two running maxima,
        solved by iterating both vectorized from ``D = 0`` until ``D`` is stable
        (monotone; the least fixed point is the sequential replay's).
        Returns (copy end per unique storage in queue order, shape ``(U,)``;
        stall per swap, shape ``(n,)``; stall per position, shape ``(N,)``)."""
        N = self.N
        wq = wt[first][o]                  # wait position per copy, in queue order
        ks = np.flatnonzero(wq >= 0)
        ks = ks[np.lexsort((ks, wq[ks]))]  # waits in the order the compute stream meets them
        wpos = wq[ks]
        start_w = (T - regen_time)[wpos]
        S = np.cumsum(d_o)
        base = Tend[prod_o] - (S - d_o)
        m_at = np.searchsorted(wpos, prod_o, side="right") - 1   # last wait before each copy's issue
        D = np.zeros(len(ks))
        while True:
            Dk = np.where(m_at >= 0, D[np.maximum(m_at, 0)], 0.0) if len(ks) else 0.0
            ends = S + np.maximum.accumulate(base + Dk)
            D_new = np.maximum.accumulate(np.maximum(ends[ks] - start_w, 0.0))
            if np.array_equal(D_new, D):
                break
            D = D_new
        st = np.diff(D, prepend=0.0)
        stall_pos = np.zeros(N)
        np.add.at(stall_pos, wpos, st)
        stall = np.zeros(n)
        stall[first[o[ks]]] = st
        return ends, stall, stall_pos

    def _swap_layer(self, ids: np.ndarray, regen_time: np.ndarray, floor: tuple | None = None,
                    wait: tuple | None = None) -> SwapLayer:
        N = self.N
        removal = np.zeros(N + 2, dtype=np.int64)
        if len(ids) == 0:
            z = np.zeros(0)
            return SwapLayer(ids, z.astype(np.int64), z.astype(np.int64), z, z, removal[:N], removal[:N].copy(),
                             wait=z.astype(np.int64))
        ids = np.sort(ids)
        s, a, b, nbytes, prod = self.w_s[ids], self.w_a[ids], self.w_b[ids], self.w_bytes[ids], self.w_prod[ids]
        f = 1.0 + self.margin
        d_in = nbytes / self.h2d * f
        d_out = nbytes / self.d2h * f
        T = self.start_times(regen_time)
        c = getattr(self, "_tend", None)
        if c is not None and c[0] is T:   # end times of the cached start times
            Tend = c[1]
        else:
            Tend = T + self.node_time
            self._tend = (T, Tend)
        # copies out: one per storage, issued after its producer, serialized in issue order
        if self.unique_storages:
            uniq, first, inv = s, np.arange(len(s)), np.arange(len(s))
        else:
            uniq, first, inv = np.unique(s, return_index=True, return_inverse=True)
        o = np.lexsort((uniq, prod[first]))
        d_o = d_out[first][o]
        wt = self.wait[ids]
        if wait is not None:
            wt = np.where(ids == wait[0], wait[1], wt)
        if not self.unique_storages:   # only a storage's first swap window has its copy out in flight
            mask = np.zeros(len(ids), dtype=bool)
            mask[first] = True
            wt = np.where(mask, wt, -1)
        self._update_marks()
        # a chain inside the window that reads the storage swaps it in: a wait after that chain has no copy
        # out left to wait for (the lowering emits none)
        wt = np.where(wt > self.touch_first[ids], -1, wt)
        out_stall = None
        if self.overlap and (wt >= 0).any():   # waits for copies out: replay the queue with their stalls
            ends_sorted, out_stall, stall_pos = self._out_waits(T, Tend, regen_time, len(ids), first, o, d_o,
                                                                prod[first][o], wt)
            T = T + np.cumsum(stall_pos)
            Tend = T + self.node_time
        else:
            issue = Tend[prod[first][o]]
            if self.overlap:
                S = np.cumsum(d_o)
                ends_sorted = S + np.maximum.accumulate(issue - (S - d_o))
            else:
                ends_sorted = issue + d_o
        ends_u = np.empty_like(ends_sorted)
        ends_u[o] = ends_sorted
        d2h_end = ends_u[inv]
        # prefetches: walk the host-to-device queue backwards from each use (lowering's "auto")
        o = np.lexsort((s, -b))
        use = T[b[o]] - regen_time[b[o]]
        D = np.cumsum(d_in[o])
        start = np.minimum.accumulate(use + (D - d_in[o])) - D
        pos_o = np.searchsorted(Tend, start, side="right") - 1
        pos = np.empty_like(pos_o)
        pos[o] = pos_o
        # a chain inside the window that reads the storage gets it from an early prefetch, not a
        # synchronous swap-in
        pos = np.minimum(pos, self.touch_first[ids] - 1)
        if not self.overlap:   # a copy blocks compute anyway: bring it back right before use
            pos = b - 1
        fl = self.floor[ids]
        if floor is not None:
            fl = np.where(ids == floor[0], floor[1], fl)
        pos = np.maximum(pos, fl)   # a prefetch delayed on purpose to cover a later peak
        pos = np.maximum(pos, wt - 1)   # a swap-in is issued after the wait for the copy out
        pos = np.clip(pos, a + 1, b - 1)
        # replay the host-to-device queue forwards in issue order; a stall delays everything after it
        stall = np.zeros(len(ids))
        wq = self.wait_q[ids]
        wpos = np.where(wq >= 0, wq, b)
        woff = np.where(wq >= 0, self.wait_off[ids], 0.0)
        # a swap-in is issued after node pos, after the waits for copies out before node pos + 1
        issue_in = Tend[pos] if out_stall is None else T[pos + 1] - regen_time[pos + 1]
        if self.overlap:
            wait_at = T[wpos] - regen_time[wpos] + woff
            o_in = np.lexsort((s, b, pos))   # at one position: in order of use (lowering)
            ready = np.maximum(issue_in, d2h_end)[o_in]
            S = np.cumsum(d_in[o_in])
            arrive = np.empty(len(ids))
            arrive[o_in] = S + np.maximum.accumulate(ready - (S - d_in[o_in]))
            if (arrive > wait_at).any():
                stall = self._replay(o_in.tolist(), np.lexsort((s, woff, wpos)).tolist(), wpos.tolist(),
                                     pos.tolist(), wait_at.tolist(), issue_in.tolist(), d_in.tolist(),
                                     d2h_end.tolist())
        else:
            stall = d_in + d_out
        # releases: a swapped storage leaves when its copy out has ended
        stalled = self.overlap and bool(stall.any())
        if stalled:
            stall_at = np.zeros(N)
            np.add.at(stall_at, wpos, stall)
            delay = np.cumsum(stall_at)
            r0 = np.maximum(a + 1, np.searchsorted(T + delay, d2h_end, side="left"))
            # a swap-in issued before its copy out has ended holds a second buffer until then
            late = d2h_end > issue_in + delay[pos]
            r0_late = np.maximum(pos + 2, np.searchsorted(T, d2h_end, side="left"))
        elif self.overlap:   # no stall: no delay
            r0 = np.maximum(a + 1, np.searchsorted(T, d2h_end, side="left"))
            late = d2h_end > issue_in
            r0_late = np.maximum(pos + 2, np.searchsorted(T, d2h_end, side="left"))
        else:
            r0 = a + 1
            late = np.zeros(len(ids), dtype=bool)
            r0_late = r0
        ok = (r0 <= pos) & ~late
        np.add.at(removal, r0[ok], nbytes[ok])
        np.add.at(removal, pos[ok] + 1, -nbytes[ok])
        np.add.at(removal, pos[late] + 1, -nbytes[late])
        np.add.at(removal, np.minimum(r0_late[late], N), nbytes[late])
        removal = np.cumsum(removal)[:N]
        held = np.zeros(N, dtype=np.int64)
        if self.overlap:   # released during the chain that runs before r0: held while the chain runs
            r0c = np.minimum(r0, N - 1)
            chain_start = (T[r0c] + delay[r0c] if stalled else T[r0c]) - regen_time[r0c]
            h = ok & (regen_time[r0c] > 0) & (d2h_end > chain_start)
            np.add.at(held, r0c[h], nbytes[h])
        if out_stall is not None:
            stall = stall + out_stall
        return SwapLayer(ids, pos, r0, stall, d2h_end, removal, held, bool(late.any()), wt)

    def swap_bulk(self, ids) -> int:
        """Swap every window of ``ids`` (shape ``(n,)``; kept windows of at
        least one node between their ends) at once: each waits for its copy
        out before the node after its window opens (``wait = after + 1``) and
        is swapped in right before its use (``floor = before - 1``), so a
        storage is resident only where it is read, at the price of every
        copy's stall.  One swap layer and one chain replay for all of them
        (an :meth:`apply` per window replans the layer each time: seconds on
        thousands of windows).  Only on devices whose copies overlap compute
        (``overlap``; elsewhere a copy blocks compute and there is no copy out
        to wait for).  Returns how many windows were swapped.

        Source: the minimum-memory end of swapping, as ``swap-all``
        (``torch.autograd.graph.save_on_cpu``) would be with synchronous
        copies both ways (vDNN, Rhu et al., MICRO 2016, sec. III, without
        its prefetch)."""
        ids = [int(j) for j in ids if self.pol_l[int(j)] == 0 and int(self.w_b[j]) - int(self.w_a[j]) >= 2]
        if not ids or not self.overlap:
            return 0
        self._set_many([(j, SWAP, int(self.w_b[j]) - 1, int(self.w_a[j]) + 1) for j in ids])
        return len(ids)

    def _set_many(self, changes) -> None:
        """Set several windows at once, ``(window, policy, floor, wait)`` each
        (swap or keep), then replan the swap layer and the chains they touch
        once (what :meth:`apply` per window would give, in one replay)."""
        pts: set[int] = set()
        for j, pol, fl, wt in changes:
            pts |= self._affected(j)
            self.apply(j, pol, Effect(0.0, {}, None, NEG, -1, True, fl if pol == SWAP else 0,
                                      wt if pol == SWAP else -1), refresh=False)
        self._set_swap(self._swap_layer(np.flatnonzero(self.pol == SWAP), self.regen_time))
        for q in sorted(pts):   # chains that read the changed storages (their swap-ins)
            self._set_chain(q, self.chain_at(q))
        self.refresh_swaps()
        self.version += 1

    #: windows whose relaxations :meth:`relax_swaps` tries together before splitting the batch
    RELAX_BATCH = 64

    def relax_swaps(self, budget: int) -> list[int]:
        """Give back, swap by swap (in order of use), what keeps the model's
        memory within ``budget`` bytes without it: the swap itself (kept),
        else the delay of its swap-in (issued at the earliest position from
        where the storage fits under the budget until its use) and the wait
        for its copy out (none, or moved to the first position where the
        storage would not fit).  The changes are proposed from the memory
        timeline, updated as each is proposed, and checked in batches of
        :attr:`RELAX_BATCH` (one replan each: the estimated peak stays within
        ``budget`` and the added time does not rise), a failing batch split
        in halves down to single changes, which are dropped.  A pass after
        :meth:`swap_bulk`, where every swap holds the least memory it can.
        Nothing is given back where the model is over ``budget`` already.
        Returns the windows given back (set to keep)."""
        if self.peak()[0] > budget:   # no batch could be kept (each is checked against the budget)
            return []
        order = self.swap.ids[np.argsort(self.w_b[self.swap.ids], kind="stable")].tolist()
        kept: list[int] = []
        for k in range(0, len(order), self.RELAX_BATCH):
            mem = self.memory().copy()
            changes = []
            for j in order[k:k + self.RELAX_BATCH]:
                nbytes = int(self.w_bytes[j])
                a = int(self.w_a[j])
                lo, hi = int(self.sw_r0[j]), int(self.sw_pos[j])
                fl, wt = int(self.floor[j]), int(self.wait[j])
                if lo > hi or int(mem[lo:hi + 1].max()) + nbytes <= budget:   # the storage back fits: keep it
                    changes.append((j, KEEP, 0, -1))
                    if lo <= hi:
                        mem[lo:hi + 1] += nbytes
                    continue
                nfl, nwt = fl, wt
                if fl > a + 1:   # the swap-in earlier: from the first position whose suffix fits the storage
                    bad = np.flatnonzero(mem[lo:hi + 1] + nbytes > budget)
                    q = lo + int(bad[-1]) + 1 if len(bad) else lo
                    nfl = max(q, a + 1) - 1
                    if nfl < hi:
                        mem[nfl + 1:hi + 1] += nbytes
                if wt >= 0:      # the wait for the copy out later, up to the first position it would not fit
                    top = min(nfl, hi) if nfl < fl else hi
                    bad = np.flatnonzero(mem[wt:top + 1] + nbytes > budget)
                    nwt = wt + int(bad[0]) if len(bad) else -1
                    if nwt != wt:
                        mem[wt:(nwt if nwt >= 0 else top + 1)] += nbytes
                if (nfl, nwt) != (fl, wt):
                    changes.append((j, SWAP, nfl, nwt))
            kept += [j for j, pol, _, _ in self._try_changes(changes, budget) if pol == KEEP]
        return kept

    def _try_changes(self, changes: list, budget: int) -> list:
        """Apply ``changes`` (see :meth:`_set_many`) where the estimated peak
        stays within ``budget`` and the added time does not rise; a failing
        batch is undone and split in halves.  Returns the changes kept."""
        if not changes:
            return []
        old = [(j, int(self.pol[j]), int(self.floor[j]), int(self.wait[j])) for j, *_ in changes]
        before = self.added_s()
        self._set_many(changes)
        if self.peak()[0] <= budget and self.added_s() <= before + 1e-12:
            return changes
        self._set_many(old)
        if len(changes) == 1:
            return []
        h = len(changes) // 2
        return self._try_changes(changes[:h], budget) + self._try_changes(changes[h:], budget)

    @staticmethod
    def _replay(o_in, o_wait, wpos, pos, wait_at, issue_at, d_in, host) -> np.ndarray:
        """Sequential replay of the host-to-device queue with stalls delaying
        everything after them; returns the stall per swap (s)."""
        n = len(o_in)
        stall = np.zeros(n)
        arrive = [0.0] * n
        delay = free_at = 0.0
        k_in = 0
        for x in o_wait:
            while k_in < n and pos[o_in[k_in]] < wpos[x]:   # issued after compute pos < wait position
                y = o_in[k_in]
                start = max(issue_at[y] + delay, free_at, host[y])
                free_at = arrive[y] = start + d_in[y]
                k_in += 1
            st = arrive[x] - (wait_at[x] + delay)
            if st > 0:
                stall[x] = st
                delay += st
        return stall
