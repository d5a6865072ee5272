"""The swap layer of the ``libra`` estimate: where every swap decision's
swap-in is issued, when its copies end, what it stalls and what it takes off
the memory timeline, as a whole, vectorized over the swaps.

- copies out are serialized on the device-to-host queue in issue order (right
  after each producer, as :func:`~libra_opt.passes.lowering.lower` emits them);
- prefetches are planned backwards from each use on the host-to-device queue
  (queue-aware, the lowering's ``prefetch="auto"``), earlier where a chain in
  the window reads the storage, later where a decision delays them on purpose;
- the host-to-device queue is then replayed forwards (running maxima; where
  something stalls, a stall delaying what follows, the same iterated to their
  fixed point, or a sequential replay where that takes long);
- a swapped storage leaves the timeline from the first node that starts after
  its copy out ends until its swap-in is issued; where swap-ins stall, the
  nodes after a stall start later and so do the copies out they issue: the
  releases read each copy's end with the stalls before its producer
  (:func:`_delayed_copy_ends`), as the simulator's queue runs it; a storage
  whose copy out is still in flight when the gap before its release node
  starts (that node's chain, or its wait for a swap-in allocated at issue)
  is held there (``SwapLayer.held``);
- a swap may wait for its copy out (``Timeline.wait``, the lowering's
  ``Eviction.out_wait``): the compute stream stalls before that position until
  the copy has ended, so the storage is gone from there; the device-to-host
  queue is then replayed forwards with those stalls delaying every later node
  and copy, and the rest of the layer runs on the delayed start times;
- a *bulk* swap (:func:`swap_bulk`) swaps every window at once, each
  waiting for its copy out right after the storage's last use before the
  window and swapped in right before its use: the least memory swapping
  can hold (each storage resident only where it is read), paying stalls;
  :func:`relax_swaps` then gives back, swap by swap, what a budget
  does not need (the swap itself, the delay of its swap-in, its wait).

The layer is computed by :func:`swap_layer`, a function of the static tables
(:mod:`solvers/libra/tables.py <libra_opt.solvers.libra.tables>`: ``pt``
per problem, ``wt`` per window) and the timeline's state
(:class:`~libra_opt.solvers.libra.state.TimelineState` ``st``: policies,
floors, waits, chain marks); it refreshes the state's chain marks
(:func:`update_marks`) and nothing else.  The bulk moves (:func:`swap_bulk`,
:func:`relax_swaps`) change decisions, so they take the timeline ``tl``
itself (a :class:`~libra_opt.solvers.libra.estimate.Timeline`, passed in,
not imported: this module is below it) and use its public operations
(``apply``, ``affected``, ``install_swaps``, ``replay``, ``refresh_swaps``,
``peak``, ``memory``, ``added_s``).

Source: the simulator's copy-queue rules (:mod:`libra_opt.passes.simulator`) and the
lowering's prefetch rule; Libra (Wang, NTHU 2024) for hiding transfers behind
compute.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass

import numpy as np

from .codes import KEEP, NEG, SWAP
from .timeline_records import Effect


@dataclass(frozen=True)
class SwapLayer:
    """Positions and costs of every swap decision, as arrays over the swap
    windows ``ids`` (ascending window ids).  ``removal`` (shape ``(N,)``,
    bytes) is what the swaps take off the timeline; ``held`` (shape ``(N,)``,
    bytes) what is still held in the gap before a position (its
    recomputation chain, its waits for swap-ins) although released by the
    time the node starts; ``stall_s`` per
    swap (waits for its swap-in, and for its copy out where it waits for
    it).  ``pessimistic``: some swap-in is issued before its copy out ends (a
    slow link), where the model over-counts memory and stalls.  ``wait``
    (shape ``(len(ids),)``): the position before which each swap waits for its copy
    out, where that wait takes effect (-1: none).  ``basis``: what the layer
    was computed from (:func:`layer_current`): the state's start times
    ``st.T_cache`` (a weak reference, compared by identity: they are
    replaced, never mutated, when a chain time changes) and, over ``ids``, the window ends, waits and floors (with the
    overrides of the window under evaluation) and the chain marks
    (``st.w_b``, ``st.wait``, ``st.floor``, ``st.touch_first``,
    ``st.wait_q``, ``st.wait_off``); ``None`` for other chain times.
    ``spans``: ``(lo, hi, delta)``, each shape ``(len(ids),)`` int64, the
    span ``[lo, hi)`` over which each swap changes ``removal`` by ``delta``
    bytes (its storage off the device: ``+bytes``; the second buffer of a
    swap-in issued before its copy out ends: ``-bytes``; none: ``0``), which
    ``removal`` sums: a later layer over mostly the same spans is computed
    from this one's ``removal`` (:func:`_removal`).  Both arrays are never
    written (``held`` may be a shared read-only array of zeros).
    ``changed``: ``(base, lo, hi)`` where ``removal`` was computed from the
    layer ``base`` (a weak reference) and differs from its ``removal`` only
    at positions ``lo`` to ``hi`` (exclusive); ``None`` where not known.
    Installing the layer over ``base`` and evaluating against it read only
    those positions (``Timeline.install_swaps``, ``Timeline.evaluate``)."""

    ids: np.ndarray
    prefetch: np.ndarray
    r0: np.ndarray
    stall_s: np.ndarray
    d2h_end_s: np.ndarray
    removal: np.ndarray
    held: np.ndarray
    pessimistic: bool = False
    wait: np.ndarray | None = None
    basis: tuple | None = None
    spans: tuple | None = None
    changed: tuple | None = None

    @property
    def total_stall_s(self) -> float:
        """Sum of the stalls of every swap (s)."""
        return float(self.stall_s.sum()) if len(self.stall_s) else 0.0


def empty_swap_layer(N: int, ids: np.ndarray | None = None) -> SwapLayer:
    """The layer of no swaps over ``N`` positions (``ids``: an empty int64
    array to carry, default a new one): nothing removed, held or stalled."""
    removal = np.zeros(N + 2, dtype=np.int64)
    z = np.zeros(0)
    zi = z.astype(np.int64)
    if ids is None:
        ids = zi
    return SwapLayer(ids, zi, zi, z, z, removal[:N], _zeros(N), wait=zi, spans=(zi, zi, zi))


#: changed swap spans up to which a layer's ``removal`` is the previous layer's with those spans added
#: and taken off (a slice each), rather than a running sum over every position (:func:`_removal`)
MAX_SPAN_EDITS = 24


def _removal(N: int, base: SwapLayer, ids: np.ndarray, lo: np.ndarray, hi: np.ndarray, d: np.ndarray
             ) -> tuple[np.ndarray, tuple | None]:
    """``(removal, changed)``: ``removal`` (shape ``(N,)``, int64 bytes) of the swaps ``ids``
    (ascending window ids) with spans ``(lo, hi, d)`` (:class:`SwapLayer`'s
    ``spans``): where at most :data:`MAX_SPAN_EDITS` spans differ from the
    layer ``base``'s (matched by window id), ``base.removal`` with the spans
    it lacks added over their slices and the ones it has of its own taken
    off; otherwise the difference array's running sum.  Exact (integers)
    either way.  A descent's evaluations and refreshes change few of its
    swaps (20k-op synthetic transformer, hybrid sweep: 88 swaps a layer,
    1 span changed at the median, at most 16 in 78% of its layers), and the
    running sum over 20k positions was a fifth of a layer's time.
    ``changed``: :class:`SwapLayer`'s, for a ``removal`` edited from
    ``base``'s (the positions the edited spans cover); ``None`` for a
    running sum."""
    bs = base.spans
    if bs is not None and len(base.removal) == N:
        bids = base.ids
        blo, bhi, bd = bs
        if len(bids):
            k = np.minimum(bids.searchsorted(ids), len(bids) - 1)
            same = (bids[k] == ids) & (blo[k] == lo) & (bhi[k] == hi) & (bd[k] == d)
            keep = np.zeros(len(bids), dtype=bool)
            keep[k[same]] = True
            gone = (~keep & (bd != 0)).nonzero()[0]
        else:
            same = np.zeros(len(ids), dtype=bool)
            gone = same.nonzero()[0]
        new = (~same & (d != 0)).nonzero()[0]
        if len(gone) + len(new) <= MAX_SPAN_EDITS:
            removal = base.removal.copy()
            first, end = N, 0
            for a, b, v in zip(blo[gone].tolist(), bhi[gone].tolist(), bd[gone].tolist()):
                removal[a:b] -= v
                first, end = min(first, a), max(end, b)
            for a, b, v in zip(lo[new].tolist(), hi[new].tolist(), d[new].tolist()):
                removal[a:b] += v
                first, end = min(first, a), max(end, b)
            return removal, (weakref.ref(base), min(first, end), end)
    diff = np.zeros(N + 1, dtype=np.int64)
    np.add.at(diff, lo, d)
    np.add.at(diff, hi, -d)
    return diff.cumsum()[:N], None


def _zeros(N: int) -> np.ndarray:
    """A read-only int64 array of ``N`` zeros, shared (a layer's ``held``
    where no storage is held during a chain)."""
    z = _ZEROS.get(N)
    if z is None:
        z = _ZEROS[N] = np.zeros(N, dtype=np.int64)
        z.setflags(write=False)
    return z


_ZEROS: dict[int, np.ndarray] = {}


def is_zeros(a: np.ndarray) -> bool:
    """Whether ``a`` is the shared array of zeros of its length (:func:`_zeros`:
    a layer's ``held`` where nothing is held); ``False`` for any other array,
    zeros or not."""
    return _ZEROS.get(len(a)) is a


def start_times(pt, st, regen_time: np.ndarray | None = None) -> np.ndarray:
    """Start time of each node, shape ``(N,)`` (s): the no-remat start
    (``pt.cum``) plus every chain's time (``regen_time``, default the state's)
    at or before it.  For the state's own chain times the result is cached in
    ``st.T_cache`` (replaced, never mutated, when they change)."""
    if regen_time is None or regen_time is st.regen_time:
        if st.T_cache is None:
            st.T_cache = pt.cum[:-1] + st.regen_time.cumsum()
        return st.T_cache
    return pt.cum[:-1] + regen_time.cumsum()




def _end_times(pt, st, T: np.ndarray) -> np.ndarray:
    """End time of each node for the start times ``T`` (shape ``(N,)``, s):
    ``T + pt.node_time``, kept in ``st.tend_cache`` for the last ``T`` asked
    (by identity: start times are replaced, never mutated)."""
    c = st.tend_cache
    if c is not None and c[0] is T:
        return c[1]
    Tend = T + pt.node_time
    st.tend_cache = (T, Tend)
    return Tend


def _copy_out_order(w_prod: np.ndarray, layer: SwapLayer) -> tuple[np.ndarray, np.ndarray]:
    """The producers of ``layer``'s swaps in ascending order (``w_prod``:
    each window's producer position) and the running maximum of their copies'
    ends (s) in that order after a first ``-inf`` (none issued yet), so that
    ``ends[sp.searchsorted(q, side="right")]`` is the latest end of the
    copies issued at or before position ``q``: what :func:`release_bound`
    reads of the copies already issued.  Kept on the layer (it is frozen:
    its swaps never change), keyed by the producer table it was computed
    from."""
    got = layer.__dict__.get("_copy_out_order")
    if got is not None and got[0] is w_prod:
        return got[1], got[2]
    o = np.argsort(w_prod[layer.ids], kind="stable")
    sp = w_prod[layer.ids][o]
    ends = np.empty(len(o) + 1)
    ends[0] = -np.inf
    np.maximum.accumulate(layer.d2h_end_s[o], out=ends[1:])
    object.__setattr__(layer, "_copy_out_order", (w_prod, sp, ends))
    return sp, ends


def _copy_out_ends(tl, idx: np.ndarray) -> np.ndarray:
    """When a copy out of each window in ``idx`` (shape ``(n,)``) could end
    on the timeline ``tl`` (s): issued at its producer's end, queued behind
    the copies already issued before it, ``bytes / d2h`` long with the
    window tables' margin.  What :func:`release_bound` and
    :func:`released_by` compare with the start times."""
    T = tl.start_times()
    prod = tl.windows.w_prod[idx]
    issue = _end_times(tl.tables, tl.state, T)[prod]
    sw = tl.state.swap
    if len(sw.ids):
        sp, ends = _copy_out_order(tl.windows.w_prod, sw)
        issue = np.maximum(issue, ends[sp.searchsorted(prod, side="right")])
    return issue + tl.windows.w_copy_s[:, 1][idx]   # (its copy out, s)


def release_bound(tl, idx: np.ndarray) -> np.ndarray:
    """Earliest position a swap of each window in ``idx`` (shape ``(n,)``)
    could release its storage on the timeline ``tl``, on a device whose
    copies overlap compute: the first node that starts once its copy out
    (:func:`_copy_out_ends`) has ended.  Shape ``(n,)``, positions.  A
    bound that holds while no stall delays the nodes before it (later
    copies are not delayed here, and a stall moves nodes later, so the copy
    can end before an earlier one)."""
    return tl.start_times().searchsorted(_copy_out_ends(tl, idx), side="left")


def released_by(tl, idx: np.ndarray, p: int) -> np.ndarray:
    """``release_bound(tl, idx) <= p`` (bool, shape ``(n,)``) without the
    search: the start times are non-decreasing, so the first node to start
    once a copy has ended is at or before ``p`` exactly where node ``p``
    starts no earlier than that end.  The descent's selection asks only
    this, for every candidate at every step (a search of each end into the
    ``N`` start times was 57% of its release bounds' time on a 20k-op
    problem)."""
    return _copy_out_ends(tl, idx) <= tl.start_times()[p]


def update_marks(pt, wt, st, ids: np.ndarray | None = None) -> None:
    """Refresh, for the windows of the storages whose chains changed
    (``st.dirty``), the first chain inside the window that reads the storage
    (``st.touch_first``) and the first that waits for its swap-in
    (``st.wait_q``, ``st.wait_off``), and take those storages out of
    ``st.dirty``.  With ``ids`` (window ids), only the storages of those
    windows: the marks are read only over a swap layer's windows
    (:func:`swap_layer`, :func:`layer_current`), and the others stay dirty
    until a layer reads them (most dirty storages are never swapped:
    ``h100_gpt2-medium_b8``, a hybrid sweep spent 11% of its swap layers'
    time here refreshing all of them)."""
    dirty = st.dirty
    if not dirty:
        return
    if ids is None:
        todo, st.dirty = dirty, set()
    else:
        todo = dirty.intersection(wt.w_s[ids].tolist())
        if not todo:
            return
        dirty.difference_update(todo)
    BIG = pt.N + 1
    touch_first, wait_q, wait_off, w_a, w_b = st.touch_first, st.wait_q, st.wait_off, wt.w_a, st.w_b
    for s in todo:
        touch = st.touch.get(s, ())
        waits = st.waits.get(s, {})
        for j in wt.s_windows.get(s, ()):
            a, b = int(w_a[j]), int(w_b[j])
            touch_first[j] = min((q for q in touch if a < q < b), default=BIG)
            w = min(((q, off) for q, off in waits.items() if a < q <= b), default=None)
            wait_q[j], wait_off[j] = (w if w is not None else (-1, 0.0))


def out_waits(N: int, T: np.ndarray, Tend: np.ndarray, regen_time: np.ndarray, n: int, first: np.ndarray,
              o: np.ndarray, d_o: np.ndarray, prod_o: np.ndarray, wt: np.ndarray):
    """The device-to-host queue with the waits for copies out (``wt``: wait
    position per swap, -1 none; only a storage's first swap window has
    one): a wait before node ``w`` stalls until its copy ends, delaying
    every later node and copy issue.

    ``T``, ``Tend``: start / end time of each node, shape ``(N,)`` (s);
    ``regen_time``: chain time before each node, shape ``(N,)`` (s); ``n``
    swaps; ``first``: the first swap of each unique storage; ``o``: the
    unique storages in queue order; ``d_o``: their copy-out durations (s);
    ``prod_o``: their producers.

    With ``D`` the delay so far, a copy issued after node ``p`` ends at
    ``max(previous end, Tend[p] + D(p)) + duration`` and a wait before node
    ``w`` raises ``D`` to ``end - chain start(w)``: two running maxima,
    solved by iterating both vectorized from ``D = 0`` until the delays at
    the copies' issues are stable (then the next round would repeat this
    one; monotone: the least fixed point is the sequential replay's).
    Returns (copy end per unique storage in queue order, shape ``(U,)``;
    stall per swap, shape ``(n,)``; stall per position, shape ``(N,)``)."""
    wq = wt[first][o]                  # wait position per copy, in queue order
    ks = (wq >= 0).nonzero()[0]
    ks = ks[np.lexsort((ks, wq[ks]))]  # waits in the order the compute stream meets them
    wpos = wq[ks]
    start_w = (T - regen_time)[wpos]
    S = d_o.cumsum()
    base = Tend[prod_o] - (S - d_o)
    m_at = wpos.searchsorted(prod_o, side="right") - 1   # last wait before each copy's issue
    before = m_at >= 0
    m_idx = m_at[before]
    Dk = np.zeros(len(m_at))   # delay at each copy's issue: the last wait's before it
    while True:
        ends = S + np.maximum.accumulate(base + Dk)
        D = np.maximum.accumulate(np.maximum(ends[ks] - start_w, 0.0))
        Dk_new = np.zeros(len(m_at))
        Dk_new[before] = D[m_idx]
        if (Dk_new == Dk).all():   # the next round would give the same ends and D: the fixed point
            break
        Dk = Dk_new
    st = D.copy()   # the stall at each wait: the rise of D there (np.diff's values, without its wrapper)
    st[1:] -= D[:-1]
    stall_pos = np.zeros(N)
    np.add.at(stall_pos, wpos, st)
    stall = np.zeros(n)
    stall[first[o[ks]]] = st
    return ends, stall, stall_pos


def _sorted_copy_ends(issue: np.ndarray, d_o: np.ndarray, overlap: bool) -> np.ndarray:
    """The ends of copies on one queue (s), in issue order: issued at
    ``issue`` (s, ascending order of issue), each ``d_o`` long (s), one
    after another where copies overlap compute (running maxima), else each
    right after its issue (the compute stream waits for it)."""
    if not overlap:
        return issue + d_o
    S = d_o.cumsum()
    return S + np.maximum.accumulate(issue - (S - d_o))


def _delayed_copy_ends(Tend: np.ndarray, delay: np.ndarray, o: np.ndarray, d_o: np.ndarray, prod_o: np.ndarray,
                       inv: np.ndarray | None, overlap: bool) -> np.ndarray:
    """The ends of the copies out (s) of :func:`swap_layer`'s swaps, one per
    swap, where the stalls before their producers delay them: each is
    issued when its producer has run (``Tend``, shape ``(N,)``, plus
    ``delay``, shape ``(N,)``, the stalls' running sum, s) and queued behind
    the earlier ones in issue order (``o``: that order over the storages,
    ``d_o`` their copy times and ``prod_o`` their producers in it; ``inv``:
    each swap's storage, ``None`` where each swap has its own)."""
    return _per_swap(_sorted_copy_ends(Tend[prod_o] + delay[prod_o], d_o, overlap), o, inv)


def _per_swap(ends_sorted: np.ndarray, o: np.ndarray, inv: np.ndarray | None) -> np.ndarray:
    """Copy-out ends in issue order (``ends_sorted``, s; ``o``: that order
    over the storages) as one per swap (``inv``: each swap's storage,
    ``None`` where each swap has its own)."""
    ends_u = np.empty_like(ends_sorted)
    ends_u[o] = ends_sorted
    return ends_u if inv is None else ends_u[inv]


def swap_layer(pt, wt, st, ids: np.ndarray, regen_time: np.ndarray, floor: tuple | None = None,
               wait: tuple | None = None) -> SwapLayer:
    """The swap layer of the swap windows ``ids`` (int64, any order) on the
    chain times ``regen_time`` (shape ``(N,)``, s), with the state's floors
    and waits, except ``floor = (window, position)`` and ``wait = (window,
    position)`` for one window under evaluation.  ``pt``: problem tables,
    ``wt``: window tables, ``st``: the timeline state (its chain marks are
    refreshed, nothing else is written).  See the module docstring for the
    rules; the lowering (:mod:`libra_opt.passes.lowering`) and the simulator's
    queues (:mod:`libra_opt.passes.simulator`) are what it mirrors."""
    N = pt.N
    if len(ids) == 0:
        return empty_swap_layer(N, ids)
    ids = np.sort(ids)
    sabp, copy_s, b = np.take(wt.w_sabp, ids, axis=0), np.take(wt.w_copy_s, ids, axis=0), st.w_b[ids]   # (rows)
    s, a, nbytes, prod = sabp[:, 0], sabp[:, 1], sabp[:, 2], sabp[:, 3]
    d_in, d_out = copy_s[:, 0], copy_s[:, 1]
    T = start_times(pt, st, regen_time)
    T_basis = T if T is st.T_cache else None   # the state's own chain times (layer_current)
    Tend = _end_times(pt, st, T)
    overlap = pt.overlap
    unique_storages = wt.unique_storages
    # copies out: one per storage, issued after its producer, serialized in issue order
    if unique_storages:   # every swap its storage's first: no gather by first / inv below
        uniq, first, inv, prod_f, d_out_f = s, None, None, prod, d_out
    else:
        uniq, first, inv = np.unique(s, return_index=True, return_inverse=True)
        prod_f, d_out_f = prod[first], d_out[first]
    o = np.lexsort((uniq, prod_f))   # the copies out in issue order (their producers', then storage)
    d_o, prod_o = d_out_f[o], prod_f[o]
    wt_ = st.wait[ids]
    if wait is not None:
        wt_ = np.where(ids == wait[0], wait[1], wt_)
    wait_basis = wt_
    if not unique_storages:   # only a storage's first swap window has its copy out in flight
        mask = np.zeros(len(ids), dtype=bool)
        mask[first] = True
        wt_ = np.where(mask, wt_, -1)
    update_marks(pt, wt, st, ids)
    touch_first = st.touch_first[ids]
    # a chain inside the window that reads the storage swaps it in: a wait after that chain has no copy
    # out left to wait for (the lowering emits none)
    wt_ = np.where(wt_ > touch_first, -1, wt_)
    out_stall = None
    if overlap and (wt_ >= 0).any():   # waits for copies out: replay the queue with their stalls
        ends_sorted, out_stall, stall_pos = out_waits(N, T, Tend, regen_time, len(ids),
                                                      np.arange(len(ids)) if first is None else first, o, d_o,
                                                      prod_o, wt_)
        T = T + stall_pos.cumsum()
        Tend = T + pt.node_time
    else:
        ends_sorted = _sorted_copy_ends(Tend[prod_o], d_o, overlap)
    d2h_end = _per_swap(ends_sorted, o, inv)
    # prefetches: walk the host-to-device queue backwards from each use (lowering's "auto")
    o_in = np.lexsort((s, -b))
    bo, d_in_o = b[o_in], d_in[o_in]
    use = T[bo] - regen_time[bo]
    D = d_in_o.cumsum()
    start = np.minimum.accumulate(use + (D - d_in_o)) - D
    pos_o = Tend.searchsorted(start, side="right") - 1
    pos = np.empty_like(pos_o)
    pos[o_in] = pos_o
    # a chain inside the window that reads the storage gets it from an early prefetch, not a
    # synchronous swap-in
    pos = np.minimum(pos, touch_first - 1)
    if not overlap:   # a copy blocks compute anyway: bring it back right before use
        pos = b - 1
    fl = st.floor[ids]
    if floor is not None:
        fl = np.where(ids == floor[0], floor[1], fl)
    floor_basis = fl
    pos = np.maximum(pos, fl)   # a prefetch delayed on purpose to cover a later peak
    pos = np.maximum(pos, wt_ - 1)   # a swap-in is issued after the wait for the copy out
    pos = np.minimum(np.maximum(pos, a + 1), b - 1)   # np.clip, without its wrapper's overhead
    # replay the host-to-device queue forwards in issue order; a stall delays everything after it
    stall = np.zeros(len(ids))
    wq = st.wait_q[ids]
    wo = st.wait_off[ids]
    # a swap-in is issued after node pos, after the waits for copies out before node pos + 1
    issue_in = Tend[pos] if out_stall is None else T[pos + 1] - regen_time[pos + 1]
    if overlap:
        wpos, woff, wait_at = _first_waits(T, regen_time, b, wq, wo)
        o_in = np.lexsort((s, b, pos))   # at one position: in order of use (lowering)
        ready = np.maximum(issue_in, d2h_end)[o_in]
        d_in_q = d_in[o_in]
        S = d_in_q.cumsum()
        arrive = np.empty(len(ids))
        arrive[o_in] = S + np.maximum.accumulate(ready - (S - d_in_q))
        if (arrive > wait_at).any():
            stall = h2d_stalls(o_in, np.lexsort((s, woff, wpos)), wpos, pos, wait_at, issue_in, d_in, d2h_end,
                               S, arrive)
            unfelt = None   # some chain waits for a swap-in: the layer depends on where each one waits
        else:
            unfelt = arrive   # every swap-in arrives before its first wait: any waits no earlier give this layer
    else:
        stall = d_in + d_out
        unfelt = np.full(len(ids), -np.inf)   # a copy blocks compute: no wait is ever read
    # releases: a swapped storage leaves when its copy out has ended
    stalled = overlap and bool(stall.any())
    rel_end = d2h_end   # when each copy out ends, as the releases read it
    if stalled:
        stall_at = np.zeros(N)
        np.add.at(stall_at, wpos, stall)
        delay = stall_at.cumsum()
        # a stall delays the nodes after it, and the copies out they issue: the releases read the copies' ends
        # with their producers delayed (the simulator issues a copy out when its producer has run; ``Tend``
        # has the waits for copies out already)
        rel_end = _delayed_copy_ends(Tend, delay, o, d_o, prod_o, inv, overlap)
        r0 = np.maximum(a + 1, (T + delay).searchsorted(rel_end, side="left"))
        # a swap-in issued before its copy out has ended holds a second buffer until then
        late = rel_end > issue_in + delay[pos]
        r0_late = np.maximum(pos + 2, (T + delay).searchsorted(rel_end, side="left"))
    elif overlap:   # no stall: no delay
        after = T.searchsorted(d2h_end, side="left")   # the first node that starts after the copy out ends
        r0 = np.maximum(a + 1, after)
        late = d2h_end > issue_in
        r0_late = np.maximum(pos + 2, after)
    else:
        r0 = a + 1
        late = np.zeros(len(ids), dtype=bool)
        r0_late = r0
    ok = (r0 <= pos) & ~late
    any_late = bool(late.any())
    # spans: off the device from r0 through pos; a late swap-in's second buffer from pos + 1 until its
    # copy out has ended (r0_late >= pos + 2: never an empty span but at the end)
    if any_late:
        lo = np.where(ok, r0, np.where(late, pos + 1, 0))
        hi = np.where(ok, pos + 1, np.where(late, np.minimum(r0_late, N), 0))
        d = np.where(ok, nbytes, np.where(late, -nbytes, 0))
    else:
        lo, hi, d = np.where(ok, r0, 0), np.where(ok, pos + 1, 0), np.where(ok, nbytes, 0)
    removal, changed = _removal(N, st.swap, ids, lo, hi, d)
    held = None
    if overlap:   # released in the gap before node r0 (its chain, its waits for swap-ins): held there
        r0c = np.minimum(r0, N - 1)
        if stalled:   # the gap starts when node r0 - 1 has run: before the chain and the stalls at r0
            gap = regen_time[r0c] + stall_at[r0c]
            gap_start = T[r0c] + delay[r0c] - gap
        else:
            gap = regen_time[r0c]
            gap_start = T[r0c] - gap
        h = ok & (gap > 0) & (rel_end > gap_start)
        if h.any():
            held = np.zeros(N, dtype=np.int64)
            np.add.at(held, r0c[h], nbytes[h])
    if held is None:
        held = _zeros(N)
    if out_stall is not None:
        stall = stall + out_stall
    # (the start times by weak reference: a layer kept in a cached effect does not keep them alive)
    basis = None if T_basis is None else (weakref.ref(T_basis), b, wait_basis, floor_basis, touch_first, wq, wo,
                                          unfelt)
    return SwapLayer(ids, pos, r0, stall, d2h_end, removal, held, any_late, wt_, basis, (lo, hi, d), changed)


def removal_change(old: SwapLayer, new: SwapLayer) -> tuple[int, int, np.ndarray]:
    """``(lo, hi, dC)``: ``old.removal - new.removal`` (int64 bytes) over
    positions ``lo`` to ``hi`` (exclusive), zero at every other position
    (the range ``new.changed`` states, where ``new`` was computed from
    ``old``; all positions otherwise)."""
    ch = new.changed
    if ch is not None and ch[0]() is old:
        lo, hi = ch[1], ch[2]
        return lo, hi, old.removal[lo:hi] - new.removal[lo:hi]
    return 0, len(new.removal), old.removal - new.removal


def layer_current(pt, wt, st, layer: SwapLayer) -> bool:
    """Whether :func:`swap_layer` on the state ``st`` now, over
    ``layer.ids``, would give ``layer`` again: every input it was computed
    from (``layer.basis``) is unchanged, the start times by identity
    (``st.T_cache`` is replaced whenever a chain time changes), the chain
    marks once refreshed (:func:`update_marks`, which this calls).  The
    problem and window tables ``pt``, ``wt`` are static.  ``False`` where
    that is not known (``basis`` is ``None``).  A refresh of such a layer
    (``Timeline.refresh_swaps``) would install an equal one and stop: it is
    skipped (a ``h100_gpt2-medium_b8`` hybrid sweep of 20 budgets, 0.95..0.38
    of its peak: 102 of its 934 refreshes known here; of the 832 computed, 500
    gave the same prefetches and stalls back, after start times had moved
    between the swaps' producers and their uses).  Where only
    the chains' waits for swap-ins moved (``st.wait_q``, ``st.wait_off``),
    the layer is still the one it would give when none of its swap-ins
    waited for, nor now waits for, a chain: the waits are read only to find
    those stalls (:func:`_waits_unfelt`)."""
    bs = layer.basis
    if bs is None or st.T_cache is None or st.T_cache is not bs[0]():
        return False
    ids = layer.ids
    update_marks(pt, wt, st, ids)
    if not all(np.array_equal(cur[ids], was) for cur, was in
               zip((st.w_b, st.wait, st.floor, st.touch_first), bs[1:5])):
        return False
    wq, wo = st.wait_q[ids], st.wait_off[ids]
    if np.array_equal(wq, bs[5]) and np.array_equal(wo, bs[6]):
        return True
    return _waits_unfelt(st, layer, wq, wo)


def _first_waits(T: np.ndarray, regen_time: np.ndarray, b: np.ndarray, wq: np.ndarray, wo: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Where and when each swap's swap-in must have arrived: the first
    chain inside its window that waits for it (``wq``: position, -1 none;
    ``wo``: chain time before that wait, s), else its use ``b``.  Returns
    ``(position, offset s, time s)``, each shape ``(n,)``, the time on the
    start times ``T`` and chain times ``regen_time`` (shape ``(N,)``, s).
    One arithmetic for :func:`swap_layer` and :func:`_waits_unfelt`, which
    compares with it."""
    has_q = wq >= 0
    wpos = np.where(has_q, wq, b)
    woff = np.where(has_q, wo, 0.0)
    return wpos, woff, T[wpos] - regen_time[wpos] + woff


def _waits_unfelt(st, layer: SwapLayer, wq: np.ndarray, wo: np.ndarray) -> bool:
    """Whether the chains' first waits for each swap-in of ``layer`` (``wq``:
    position per swap, -1 none; ``wo``: chain time before the wait, s), which
    differ from those it was computed with, leave it as it is: its swap-ins
    all arrived before the waits it was computed with (no stall of the
    host-to-device queue, where the waits are read at all) and all arrive
    before these, by :func:`swap_layer`'s own arithmetic on the same start
    times (where copies out stalled, the layer's own start times are those
    plus the stalls, later: a swap-in arriving before a wait here arrives
    before it there).  ``h100_gpt2-medium_b8``, two hybrid descents to 0.5
    of its peak: 172 of their 586 refreshes of a layer that was not known
    current are skipped so."""
    arrive = layer.basis[7]
    if arrive is None:
        return False
    return not (arrive > _first_waits(st.T_cache, st.regen_time, layer.basis[1], wq, wo)[2]).any()


#: rounds of :func:`h2d_stalls`' fixed-point iteration before it replays the queue one copy at a time
H2D_ROUNDS = 6


def h2d_stalls(o_in: np.ndarray, o_wait: np.ndarray, wpos: np.ndarray, pos: np.ndarray, wait_at: np.ndarray,
               issue_at: np.ndarray, d_in: np.ndarray, host: np.ndarray, S: np.ndarray, arrive: np.ndarray
               ) -> np.ndarray:
    """The stall per swap (s, shape ``(n,)``) of the host-to-device queue
    where stalls delay everything after them: :func:`replay_h2d`'s answer,
    vectorized.  Arrays over the ``n`` swaps as :func:`replay_h2d`'s lists,
    plus ``S = d_in[o_in].cumsum()`` and ``arrive``, each copy's arrival
    without delays (the first round, which the caller has computed).

    With ``D`` the delay after each wait (in ``o_wait`` order) and a copy
    issued with the delay of the last wait at or before its issue position,
    a copy arrives at ``S + running max(max(issue + delay, host) - (S -
    d_in))`` (in issue order) and ``D`` is the running max of ``arrive -
    wait_at`` (clipped at 0): two running maxima, iterated from no delay
    until the issue delays are stable, as :func:`out_waits` does for the
    copies out (monotone; the least fixed point is the sequential replay's,
    to the rounding of the sums: within 1e-15 s on the H100 profiles).  Two
    rounds suffice nearly always (GPT-2 medium: 5,264 of 5,286 calls; one
    of 4,805 on ResNet-50 took 110); after :data:`H2D_ROUNDS`, or where a
    copy would be issued at or after its own wait, the queue is replayed
    one copy at a time (:func:`replay_h2d`)."""
    if (pos >= wpos).any():   # the replay's order of events does not hold: replay it
        return replay_h2d(o_in.tolist(), o_wait.tolist(), wpos.tolist(), pos.tolist(), wait_at.tolist(),
                          issue_at.tolist(), d_in.tolist(), host.tolist())
    n = len(o_in)
    wa = wait_at[o_wait]
    m = wpos[o_wait].searchsorted(pos[o_in], side="right") - 1   # the last wait met before each copy's issue
    before = m >= 0
    m_idx = m[before]
    d = d_in[o_in]
    h = host[o_in]
    ia = issue_at[o_in]
    Dk = np.zeros(n)   # the delay at each copy's issue, in issue order
    for _ in range(H2D_ROUNDS):
        D = np.maximum.accumulate(np.maximum(arrive[o_wait] - wa, 0.0))
        Dk_new = np.zeros(n)
        Dk_new[before] = D[m_idx]
        if (Dk_new == Dk).all():   # the next round would give the same arrivals: the fixed point
            rise = D.copy()
            rise[1:] -= D[:-1]
            stall = np.empty(n)
            stall[o_wait] = rise
            return stall
        Dk = Dk_new
        arrive = np.empty(n)
        arrive[o_in] = S + np.maximum.accumulate(np.maximum(ia + Dk, h) - (S - d))
    return replay_h2d(o_in.tolist(), o_wait.tolist(), wpos.tolist(), pos.tolist(), wait_at.tolist(),
                      issue_at.tolist(), d_in.tolist(), host.tolist())


def replay_h2d(o_in, o_wait, wpos, pos, wait_at, issue_at, d_in, host) -> np.ndarray:
    """Sequential replay of the host-to-device queue with stalls delaying
    everything after them; returns the stall per swap (s, shape ``(n,)``).
    Lists over the ``n`` swaps: ``o_in`` issue order, ``o_wait`` the order the
    compute stream meets their waits, ``wpos`` the position of that wait,
    ``pos`` the position after which each swap-in is issued, ``wait_at`` /
    ``issue_at`` the times (s) without delays, ``d_in`` the copy durations
    (s), ``host`` when each copy out ends (s)."""
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


def swap_bulk(tl, ids) -> int:
    """Swap every window of ``ids`` (shape ``(n,)``; kept windows of at
    least one node between their ends) at once on the timeline ``tl``: each
    waits for its copy out before the node after its window opens (``wait =
    after + 1``) and is swapped in right before its use (``floor = before -
    1``), so a storage is resident only where it is read, at the price of
    every copy's stall.  One swap layer and one chain replay for all of them
    (an ``apply`` per window replans the layer each time: seconds on
    thousands of windows).  Only on devices whose copies overlap compute
    (elsewhere a copy blocks compute and there is no copy out to wait
    for).  Returns how many windows were swapped.

    Source: the minimum-memory end of swapping, as ``swap-all``
    (``torch.autograd.graph.save_on_cpu``) would be with synchronous
    copies both ways (vDNN, Rhu et al., MICRO 2016, sec. III, without
    its prefetch)."""
    st, wt = tl.state, tl.windows
    pol_l, w_a, w_b = st.pol_l, wt.w_a, st.w_b
    ids = [int(j) for j in ids if pol_l[int(j)] == KEEP and int(w_b[j]) - int(w_a[j]) >= 2]
    if not ids or not tl.tables.overlap:
        return 0
    set_many(tl, [(j, SWAP, int(w_b[j]) - 1, int(w_a[j]) + 1) for j in ids])
    return len(ids)


def set_many(tl, changes) -> None:
    """Set several windows of the timeline ``tl`` at once, ``(window,
    policy, floor, wait)`` each (swap or keep), then replan the swap layer and
    the chains they touch once (what ``tl.apply`` per window would give, in
    one replay)."""
    st = tl.state
    pts: set[int] = set()
    for j, pol, fl, wt in changes:
        pts |= tl.affected(j, host_copy=(pol == SWAP) != (int(st.pol_l[j]) == SWAP))
        tl.apply(j, pol, Effect(0.0, {}, None, NEG, -1, True, fl if pol == SWAP else 0,
                                wt if pol == SWAP else -1), refresh=False)
    tl.install_swaps(swap_layer(tl.tables, tl.windows, st, np.flatnonzero(st.pol == SWAP), st.regen_time))
    tl.replay(pts)   # chains that read the changed storages (their swap-ins)
    tl.refresh_swaps()
    st.version += 1


def fits_back(mem: np.ndarray, lo: int, hi: int, nbytes: int, budget: int) -> bool:
    """Whether a swapped storage of ``nbytes`` bytes, set back to keep, fits
    under ``budget`` (bytes) over the positions ``lo..hi`` it is off the
    device (its release to its swap-in; none where ``lo > hi``) on the
    memory timeline ``mem`` (shape ``(N,)``, bytes); where it does, its
    bytes are added there (in place), so that the next proposal sees them.
    How :func:`relax_swaps` and the undo pass (``tidy``) propose a batch.
    Raises nothing; source: this module's release rule (a swapped storage
    is off from ``sw_r0`` through its swap-in position ``sw_pos``)."""
    if lo <= hi:
        if int(mem[lo:hi + 1].max()) + nbytes > budget:
            return False
        mem[lo:hi + 1] += nbytes
    return True


#: windows whose relaxations :func:`relax_swaps` tries together before splitting the batch
RELAX_BATCH = 64


def relax_swaps(tl, budget: int) -> list[int]:
    """Give back, swap by swap (in order of use), what keeps the memory of
    the timeline ``tl`` within ``budget`` bytes without it: the swap itself
    (kept), else the delay of its swap-in (issued at the earliest position
    from where the storage fits under the budget until its use) and the
    wait for its copy out (none, or moved to the first position where the
    storage would not fit).  The changes are proposed from the memory
    timeline, updated as each is proposed, and checked in batches of
    :data:`RELAX_BATCH` (one replan each: the estimated peak stays within
    ``budget`` and the added time does not rise), a failing batch split
    in halves down to single changes, which are dropped.  A pass after
    :func:`swap_bulk`, where every swap holds the least memory it can.
    Nothing is given back where the model is over ``budget`` already.
    Returns the windows given back (set to keep)."""
    if tl.peak()[0] > budget:   # no batch could be kept (each is checked against the budget)
        return []
    st, wt = tl.state, tl.windows
    w_b, w_bytes, w_a = st.w_b, wt.w_bytes, wt.w_a
    order = st.swap.ids[np.argsort(w_b[st.swap.ids], kind="stable")].tolist()
    kept: list[int] = []
    for k in range(0, len(order), RELAX_BATCH):
        mem = tl.memory().copy()
        changes = []
        for j in order[k:k + RELAX_BATCH]:
            nbytes = int(w_bytes[j])
            a = int(w_a[j])
            lo, hi = int(st.sw_r0[j]), int(st.sw_pos[j])
            fl, wt_ = int(st.floor[j]), int(st.wait[j])
            if fits_back(mem, lo, hi, nbytes, budget):   # the storage back fits: keep it
                changes.append((j, KEEP, 0, -1))
                continue
            nfl, nwt = fl, wt_
            if fl > a + 1:   # the swap-in earlier: from the first position whose suffix fits the storage
                bad = np.flatnonzero(mem[lo:hi + 1] + nbytes > budget)
                q = lo + int(bad[-1]) + 1 if len(bad) else lo
                nfl = max(q, a + 1) - 1
                if nfl < hi:
                    mem[nfl + 1:hi + 1] += nbytes
            if wt_ >= 0:      # the wait for the copy out later, up to the first position it would not fit
                top = min(nfl, hi) if nfl < fl else hi
                bad = np.flatnonzero(mem[wt_:top + 1] + nbytes > budget)
                nwt = wt_ + int(bad[0]) if len(bad) else -1
                if nwt != wt_:
                    mem[wt_:(nwt if nwt >= 0 else top + 1)] += nbytes
            if (nfl, nwt) != (fl, wt_):
                changes.append((j, SWAP, nfl, nwt))
        kept += [j for j, pol, _, _ in try_changes(tl, changes, budget) if pol == KEEP]
    return kept


def no_slower(tl, before_s: float) -> bool:
    """:func:`try_changes`' default test: the added time of the timeline
    ``tl`` (s) has not risen above ``before_s``, what it was before the batch."""
    return tl.added_s() <= before_s + 1e-12


def try_changes(tl, changes: list, budget: int, accept=no_slower) -> list:
    """Apply ``changes`` (see :func:`set_many`) to the timeline ``tl`` where
    the estimated peak stays within ``budget`` (bytes) and ``accept(tl,
    before_s)`` holds (``before_s``: the added seconds before the batch;
    default :func:`no_slower`); a failing batch is undone and split in
    halves.  Returns the changes kept."""
    if not changes:
        return []
    st = tl.state
    old = [(j, int(st.pol[j]), int(st.floor[j]), int(st.wait[j])) for j, *_ in changes]
    before = tl.added_s()
    set_many(tl, changes)
    if tl.peak()[0] <= budget and accept(tl, before):
        return changes
    set_many(tl, old)
    if len(changes) == 1:
        return []
    h = len(changes) // 2
    return try_changes(tl, changes[:h], budget, accept) + try_changes(tl, changes[h:], budget, accept)
