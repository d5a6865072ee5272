"""Static tables of the ``libra`` estimate: what never changes while a
``Timeline`` plans.

- :class:`~libra_opt.ir.tables.ProblemTables` (``problem.tables``, the
  project's per-problem tables, built once per problem and shared with the
  simulator, the lowering and the bounds): per-problem lists and arrays over
  tensors and nodes (storage, producer, consumers, bytes, times), the
  device's copy bandwidths, and the no-remat plan's memory at each eager
  position; the estimate reads :data:`PROBLEM_FIELDS`.
- :class:`WindowTables` (built by :func:`window_tables`): per-timeline data
  over the candidate eviction windows ``(storage, after, before)``: their
  storages, starts, original ends, bytes, producers, and each window's
  original *reach* (:func:`window_hi`), plus the timeline's overlap margin.

Both are shared (never copied) by every copy of a timeline, and never
written after they are built.

Sources: the storage model of :class:`~libra_opt.ir.problem.RematProblem`
(memory is per storage, views alias their base); the no-remat plan and the
windows of :mod:`libra_opt.passes.lowering`; Libra (Wang, NTHU 2024) for the
per-window eviction decision.
"""
from __future__ import annotations

import numpy as np

from libra_opt.ir.problem import RematProblem
from libra_opt.ir.tables import ProblemTables


#: the per-problem tables the estimate reads (readable as ``Timeline.<name>`` too)
PROBLEM_FIELDS = ("problem", "N", "t_act", "t_storage", "t_prod", "t_cons", "t_nbytes", "t_out", "t_last",
                  "n_inputs", "n_outputs", "n_time", "n_rtime", "n_ws", "n_recomp", "views", "node_time", "cum",
                  "overlap", "h2d", "d2h", "C0", "newws")


def problem_tables(problem: RematProblem) -> ProblemTables:
    """The per-problem tables of ``problem``: ``problem.tables``
    (:class:`~libra_opt.ir.tables.ProblemTables`, built once per problem and
    shared with the simulator, the lowering and the bounds; the estimate
    reads the fields :data:`PROBLEM_FIELDS`)."""
    return problem.tables


def window_hi(pt: ProblemTables, s: int, a: int, b: int, first) -> dict[int, int]:
    """Tensor -> the position up to which it is off the device for window
    ``(a, b)`` of storage ``s``: its next use after ``a``, or ``b`` for the
    tensors ``first`` regenerated at ``b``, those of the same storage their
    regeneration needs (a view's base) and the other outputs on ``s`` of
    the nodes that regenerate them (a split's other views: the node runs
    whole, and the lowering keeps what it makes on a storage that is on):
    they stay resident from ``b`` on.  Positions are eager positions;
    tensors not live across ``a`` are absent.  (Without the other outputs,
    ``random_problem(15)`` recompute-only at 0.8 of its peak was estimated
    7 % over its simulated time, and its plan was 11.9 % costlier.)"""
    hi = {}
    t_prod, t_last, t_out, t_cons = pt.t_prod, pt.t_last, pt.t_out, pt.t_cons
    for t in pt.views[s]:
        if t_prod[t] <= a < t_last[t] or (t_out[t] and t_prod[t] <= a):
            nxt = [c for c in t_cons[t] if c > a]
            if nxt:
                hi[t] = nxt[0]
    stack = [t for t in first if t in hi]
    seen = set(stack)
    while stack:
        t = stack.pop()
        hi[t] = min(hi[t], b)
        n = t_prod[t]
        for u in (*pt.n_inputs[n], *pt.n_outputs[n]):
            if pt.t_storage[u] == s and u in hi and u not in seen:
                seen.add(u)
                stack.append(u)
    return hi


def tensors_read_at(pt: ProblemTables, s: int, q: int) -> list[int]:
    """Tensors of storage ``s`` that node ``q`` reads (those a window of ``s``
    ending at its use ``q`` regenerates there)."""
    return [t for t in pt.views[s] if q in pt.t_cons[t]]


class WindowTables:
    """Per-timeline static data over the ``W`` candidate windows (see the
    module docstring); build with :func:`window_tables`.  A window's *current*
    end and reach are state (``TimelineState.w_b``, ``w_hi``, ...): these are
    the originals they start from.

    Attributes
    ----------
    nw : int
        Number of windows ``W``.
    margin : float
        Transfers take ``1 + margin`` times bytes / bandwidth when judging
        whether they hide behind compute (dimensionless, >= 0).
    w_s : ndarray of int64, shape (W,)
        Storage of each window.
    w_a : ndarray of int64, shape (W,)
        Position after which the storage is evicted.
    w_a_l : list of int, length W
        ``w_a`` as a list (scalar reads in the hot loops).
    orig_b : ndarray of int64, shape (W,)
        Each window's own end: a use of its storage (position).
    w_bytes : ndarray of int64, shape (W,)
        Storage bytes of each window.
    w_prod : ndarray of int64, shape (W,)
        Producer node of each window's storage.
    w_rec_ok : ndarray of bool, shape (W,)
        The producer may be recomputed.
    orig_hi : list of dict, length W
        :func:`window_hi` at the original end: tensor -> last position
        (regeneration point) it is off for.
    orig_pts : list of tuple of int, length W
        Regeneration points of each window at its original end, ascending.
    orig_maxhi : ndarray of int64, shape (W,)
        Last regeneration point at the original end (``orig_b`` if none).
    s_windows : dict
        Storage -> its window ids (ascending).
    unique_storages : bool
        Every storage has at most one window.
    w_sabp : ndarray of int64, shape (W, 4)
        ``w_s``, ``w_a``, ``w_bytes``, ``w_prod`` side by side: the swap
        layer gathers its windows' rows with one index.
    w_copy_s : ndarray of float64, shape (W, 2)
        Seconds each window's storage takes to copy to the device and to the
        host (bytes / bandwidth, times ``1 + margin``).
    """

    __slots__ = ("nw", "margin", "w_s", "w_a", "w_a_l", "orig_b", "w_bytes", "w_prod", "w_rec_ok", "orig_hi",
                 "orig_pts", "orig_maxhi", "s_windows", "unique_storages", "w_sabp", "w_copy_s")


def window_tables(pt: ProblemTables, windows, overlap_margin: float = 0.0) -> WindowTables:
    """Build the :class:`WindowTables` of ``windows`` (a list of ``(storage,
    after, before)``, as :func:`~libra_opt.passes.lowering.default_windows` or
    :func:`~libra_opt.passes.lowering.all_windows` give; windows of one
    storage must not overlap) on the tables ``pt`` of their problem."""
    T = pt.problem.tensors
    wt = WindowTables()
    wt.nw = len(windows)
    wt.margin = float(overlap_margin)
    wt.w_s = np.array([w[0] for w in windows], dtype=np.int64)
    wt.w_a = np.array([w[1] for w in windows], dtype=np.int64)
    wt.w_a_l = [int(w[1]) for w in windows]   # list mirror for scalar reads in the hot loops
    wt.orig_b = np.array([w[2] for w in windows], dtype=np.int64)
    wt.w_bytes = np.array([T[w[0]].nbytes for w in windows], dtype=np.int64)
    wt.w_prod = np.array([T[w[0]].producer for w in windows], dtype=np.int64)
    wt.orig_hi = []
    wt.orig_pts = []
    for s, a, b in windows:
        hi = window_hi(pt, s, a, b, tensors_read_at(pt, s, b))
        wt.orig_hi.append(hi)
        wt.orig_pts.append(tuple(sorted(set(hi.values()))))
    wt.orig_maxhi = np.array([max(h.values()) if h else b for h, (_, _, b) in zip(wt.orig_hi, windows)],
                             dtype=np.int64)
    wt.w_rec_ok = np.array([pt.n_recomp[pr] for pr in wt.w_prod], dtype=bool)
    wt.s_windows = {}
    for j, (s, _, _) in enumerate(windows):
        wt.s_windows.setdefault(s, []).append(j)
    wt.unique_storages = len(wt.s_windows) == len(windows)
    wt.w_sabp = np.stack([wt.w_s, wt.w_a, wt.w_bytes, wt.w_prod], axis=1).reshape(len(windows), 4)
    f = 1.0 + wt.margin
    with np.errstate(divide="ignore", invalid="ignore"):   # (a device without copies: read only where it swaps)
        wt.w_copy_s = np.stack([wt.w_bytes / pt.h2d * f, wt.w_bytes / pt.d2h * f], axis=1).reshape(len(windows), 2)
    return wt
