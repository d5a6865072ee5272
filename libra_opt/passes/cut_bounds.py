"""Cut bounds: lower bounds on the step time of every plan within a budget.

The compute floor (every node an output needs runs once) is the only time
bound that holds for every plan regardless of the budget.  A *cut bound* adds
what the budget forces, at one node ``v`` at a time, from the simulator's own
rules (:mod:`libra_opt.passes.simulator`):

1. When ``v`` first runs, every ancestor of ``v`` has run (its inputs must be
   resident) and no descendant has.  The activation storages an ancestor made
   that ``v`` or a needed descendant reads, or that hold a step output, form
   the *cut* ``X(v)``: each is resident at that moment, or off the device and
   brought back later.  ``v``'s inputs and the step outputs made so far are
   resident (an output is never freed); ``v``'s new outputs and workspace are
   allocated.  So at least ``E(v) = bytes(X(v) | inputs) + new outputs +
   workspace - budget`` bytes of the other cut storages are off the device.
2. An off storage comes back by a recomputation of its producer after ``v``
   starts (its recompute time, once per producer), or by a swap-in: its
   device-to-host copy ended before ``v`` started (a storage is released when
   its copy out ends, and it is off) and its host-to-device copy starts after
   (a swap-in allocates the storage when it is issued).  With ``S`` bytes
   swapped and the recomputed producers costing ``R`` seconds, one copy queue
   per direction and ``c_A`` / ``c_D`` the compute seconds of ``v``'s
   ancestors / of ``v`` and its needed descendants:

   - the compute stream runs the floor ``F`` and the recomputations:
     ``T >= F + R``;
   - ``v`` starts after the copies out: ``T >= S / d2h + c_D + R``;
   - the copies in start after the ancestors ran: ``T >= c_A + S / h2d``, and
     after the copies out: ``T >= S / d2h + S / h2d``;
   - on a device whose copies do not overlap compute (a CPU) they occupy the
     compute stream: ``T >= F + R + S / d2h + S / h2d``.

   ``R`` is at least the fractional-knapsack cost of recomputing ``E(v) - S``
   bytes (producers by bytes per recompute second, a producer's off storages
   together); the bound at ``v`` is the least over ``S`` of the largest of
   those terms, a convex piecewise-linear function of ``S`` minimised exactly
   (at a breakpoint of the knapsack or where two terms cross).

The bound is the largest over the nodes whose no-remat memory is over the
budget (elsewhere ``E(v) <= 0``), and never under the floor.  The
recompute-only bound (``swaps=False``: ``S = 0``) holds for plans without
swap instructions only, and is ``inf`` where no recompute-only plan fits.

What it costs: one pass per candidate node over the tensors and the
consumer pairs (numpy), ancestor and descendant sets as bitsets (``N^2 / 4``
bytes); problems of more than :data:`MAX_NODES` nodes get the floor.

Source: the frontier argument of Checkmate (Jain et al., MLSys 2020, sec. 4:
the values live across a stage are kept or recomputed), with the offload
model of Beaumont et al., "Efficient Combination of Rematerialization and
Offloading for Training DNNs" (NeurIPS 2021, sec. 3: a transfer takes bytes
over bandwidth on a queue that overlaps compute), applied to the accounting
of :mod:`libra_opt.passes.simulator`.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from ..ir.problem import INPUT, RematProblem

__all__ = ["CutBound", "cut_lower_bound", "cut_sets", "memoized_bound", "MAX_NODES", "MAX_CANDIDATES"]

#: problems of more than this many nodes get the compute floor (the bitsets take ``N^2 / 4`` bytes)
MAX_NODES = 8192
#: at most this many cut nodes are tried, those of the largest no-remat memory first (any subset of nodes
#: gives a valid bound; more only tightens it)
MAX_CANDIDATES = 1024


class CutBound(NamedTuple):
    """A lower bound on the step time of every plan within a budget.

    Attributes
    ----------
    time_s : float
        The bound (s); ``inf`` for a recompute-only bound where no
        recompute-only plan fits the budget.
    floor_s : float
        The compute floor it never goes under (s).
    node : int or None
        The cut node whose bound it is (``None``: the floor).
    excess_bytes : int
        Bytes of that cut off the device when the node first runs (0 at the floor).
    """

    time_s: float
    floor_s: float
    node: int | None
    excess_bytes: int


class _Tables(NamedTuple):
    """Per-problem arrays of the cut bounds."""
    need: np.ndarray        # bool (N,): node an output depends on
    floor_s: float
    time: np.ndarray        # float (N,): first-run seconds
    rtime: np.ndarray       # float (N,): recompute seconds
    recomp: np.ndarray      # bool (N,)
    ws: np.ndarray          # int64 (N,): workspace bytes
    new_out: np.ndarray     # int64 (N,): bytes of the graph storages a node allocates (its base outputs)
    t_prod: np.ndarray      # int64 (T,): producer, -1 for a graph input
    t_sto: np.ndarray       # int64 (T,)
    s_bytes: np.ndarray     # int64 (T,): a base tensor's storage bytes (0 where it is not graph memory)
    s_prod: np.ndarray      # int64 (T,): a base tensor's producer
    graph: np.ndarray       # bool (T,): the tensor's storage is graph memory
    is_out: np.ndarray      # bool (T,): a step output
    pair_t: np.ndarray      # int64: (tensor, consumer) pairs
    pair_c: np.ndarray
    in_ptr: np.ndarray      # int64 (N + 1,): node inputs, CSR
    in_idx: np.ndarray
    anc: list               # int bitsets: ancestors of each node
    desc: list              # int bitsets: descendants of each node


def _tables(problem: RematProblem) -> _Tables:
    tab = problem.tables
    N, T = problem.num_nodes, len(problem.tensors)
    nodes = problem.nodes
    t_prod = np.array([-1 if p is None else p for p in tab.t_prod], dtype=np.int64)
    t_sto = np.asarray(tab.t_storage, dtype=np.int64)
    graph = ~np.asarray(tab.t_input, dtype=bool)[t_sto]
    s_bytes = np.where(graph, np.asarray(tab.t_nbytes, dtype=np.int64), 0)
    is_out = np.zeros(T, dtype=bool)
    is_out[list(problem.outputs)] = True
    # nodes an output depends on
    need = np.zeros(N, dtype=bool)
    stack = [int(t_prod[o]) for o in problem.outputs if problem.tensors[o].kind != INPUT]
    while stack:
        k = stack.pop()
        if k < 0 or need[k]:
            continue
        need[k] = True
        stack.extend(int(t_prod[u]) for u in nodes[k].inputs)
    time = np.array([n.time_s for n in nodes], dtype=np.float64)
    new_out = np.array([sum(int(s_bytes[t]) for t in n.outputs if t_sto[t] == t) for n in nodes], dtype=np.int64)
    pairs = [(t, c) for t in range(T) for c in tab.t_cons[t]]
    pair_t = np.array([t for t, _ in pairs], dtype=np.int64)
    pair_c = np.array([c for _, c in pairs], dtype=np.int64)
    lens = np.array([len(n.inputs) for n in nodes], dtype=np.int64)
    in_ptr = np.zeros(N + 1, dtype=np.int64)
    np.cumsum(lens, out=in_ptr[1:])
    in_idx = np.array([u for n in nodes for u in n.inputs], dtype=np.int64)
    # ancestors and descendants as int bitsets (the node order is topological)
    preds = [sorted({int(t_prod[u]) for u in n.inputs if t_prod[u] >= 0}) for n in nodes]
    anc = [0] * N
    for k in range(N):
        a = 0
        for p in preds[k]:
            a |= anc[p] | (1 << p)
        anc[k] = a
    succ: list[list[int]] = [[] for _ in range(N)]
    for k in range(N):
        for p in preds[k]:
            succ[p].append(k)
    desc = [0] * N
    for k in range(N - 1, -1, -1):
        d = 0
        for c in succ[k]:
            d |= desc[c] | (1 << c)
        desc[k] = d
    return _Tables(need, float(time[need].sum()), time, np.asarray(problem.recompute_time, dtype=np.float64),
                   np.array([n.recomputable for n in nodes], dtype=bool),
                   np.array([n.workspace_bytes for n in nodes], dtype=np.int64), new_out, t_prod, t_sto, s_bytes,
                   np.where(t_prod >= 0, t_prod, 0)[t_sto], graph, is_out, pair_t, pair_c, in_ptr, in_idx, anc, desc)


def _mask(bits: int, n: int) -> np.ndarray:
    """Bitset ``bits`` over ``n`` nodes as a bool array."""
    raw = np.frombuffer(bits.to_bytes((n + 7) // 8, "little"), dtype=np.uint8)
    return np.unpackbits(raw, bitorder="little")[:n].astype(bool)


def _least(F: float, cA: float, cvD: float, E: float, xs: np.ndarray, cs: np.ndarray, s_hi: float,
           d2h: float, h2d: float, overlap: bool, swaps: bool) -> float:
    """The least over ``S`` (bytes swapped) of the bound at one node: ``xs``,
    ``cs`` the knapsack's breakpoints (bytes recomputed, seconds; convex),
    ``s_hi`` the most bytes that can be swapped."""
    r_max = float(xs[-1])

    def rc(x):
        x = np.asarray(x, dtype=np.float64)
        return np.interp(np.maximum(x, 0.0), xs, cs)

    if not swaps:
        return math.inf if E > r_max * (1 + 1e-12) else F + float(rc(E))
    lo, hi = max(0.0, E - r_max), min(E, s_hi)
    if lo > hi:
        return math.inf

    def phi(S):
        S = np.asarray(S, dtype=np.float64)
        r = rc(E - S)
        if not overlap:
            return F + r + S / d2h + S / h2d
        return np.maximum(np.maximum(F + r, S / d2h + cvD + r), np.maximum(cA + S / h2d, S / d2h + S / h2d))

    # phi is convex and piecewise linear: its least is at a breakpoint of the knapsack or where two of its
    # terms cross, in the segments beside the least breakpoint
    pts = np.unique(np.clip(np.concatenate([[lo, hi], E - xs]), lo, hi))
    vals = phi(pts)
    k = int(vals.argmin())
    best = float(vals[k])
    for a, b in ((k - 1, k), (k, k + 1)):
        if a < 0 or b >= len(pts) or pts[b] <= pts[a]:
            continue
        sa, sb = float(pts[a]), float(pts[b])
        ra, rb = float(rc(E - sa)), float(rc(E - sb))
        terms = ([(F + ra, F + rb)] if overlap else []) + (
            [(sa / d2h + cvD + ra, sb / d2h + cvD + rb), (cA + sa / h2d, cA + sb / h2d),
             (sa / d2h + sa / h2d, sb / d2h + sb / h2d)] if overlap else
            [(F + ra + sa / d2h + sa / h2d, F + rb + sb / d2h + sb / h2d)])
        for i in range(len(terms)):
            for j in range(i + 1, len(terms)):
                da, db = terms[i][0] - terms[j][0], terms[i][1] - terms[j][1]
                if da * db < 0:
                    best = min(best, float(phi(sa + (sb - sa) * da / (da - db))))
    return best


def cut_lower_bound(problem: RematProblem, budget_bytes: int, swaps: bool = True,
                    max_candidates: int = MAX_CANDIDATES) -> CutBound:
    """The cut bound (module docstring) of ``problem`` at ``budget_bytes``.

    Parameters
    ----------
    problem : RematProblem
    budget_bytes : int
        Graph-memory budget (bytes); the bound holds for every plan whose
        simulated peak is at most this.
    swaps : bool
        ``True``: a bound on every keep / recompute / swap plan; ``False``: on
        plans without swap instructions only (stronger: the off bytes are all
        recomputed).
    max_candidates : int
        Cut nodes tried, those of the largest no-remat memory first
        (:data:`MAX_CANDIDATES` by default): any subset gives a valid bound,
        fewer a weaker one sooner (the tables built once per problem aside,
        the work is linear in them).

    Returns
    -------
    CutBound
        ``time_s`` in seconds, at least the compute floor; computed once per
        problem, budget and ``swaps`` (kept with ``problem.tables``).  On
        problems of more than :data:`MAX_NODES` nodes, the floor.

    Raises
    ------
    ValueError
        ``budget_bytes`` is negative, or ``max_candidates`` under 1.
    """
    return memoized_bound(problem, "bounds.cut_lower_bound", _cut_bound, budget_bytes, swaps, max_candidates)


def memoized_bound(problem: RematProblem, key: str, compute, budget_bytes: int, swaps: bool,
                   max_candidates: int) -> CutBound:
    """``compute(problem, budget_bytes, swaps, max_candidates)`` after the
    arguments are checked, once per problem and arguments (kept with
    ``problem.tables`` under ``key``): the cut bounds' shared front
    (:func:`cut_lower_bound`, :func:`~libra_opt.passes.order_bounds.ordered_cut_bound`).

    Raises
    ------
    ValueError
        ``budget_bytes`` is negative, or ``max_candidates`` under 1.
    """
    budget_bytes = int(budget_bytes)
    if budget_bytes < 0:
        raise ValueError(f"budget_bytes={budget_bytes}: a budget is a non-negative number of bytes")
    if int(max_candidates) < 1:
        raise ValueError(f"max_candidates={max_candidates}: at least one cut node must be tried")
    memo = problem.tables.memo(key, dict)
    args = (budget_bytes, bool(swaps), int(max_candidates))
    if args not in memo:
        memo[args] = compute(problem, *args)
    return memo[args]


def cut_sets(tb: _Tables, v: int, run: np.ndarray, after: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """What is resident when node ``v`` first runs, given the nodes that
    have run (``run``, bool ``(N,)``) and the needed nodes still to run
    (``after``, bool ``(N,)``): ``made`` (bool ``(T,)``, graph tensors, views
    too, made by ``run``), ``cut`` (bool ``(T,)`` over storages: those of
    ``made`` that ``v``, a node of ``after`` or the step outputs read) and
    ``held`` (bool ``(T,)`` over storages: ``v``'s inputs and the step
    outputs made so far, resident in every plan).  The cut bound passes the
    ancestors and descendants of ``v``; the ordered cut bound
    (:mod:`libra_opt.passes.order_bounds`) the nodes before and after it."""
    T = len(tb.t_sto)
    made = (tb.t_prod >= 0) & run[np.maximum(tb.t_prod, 0)] & tb.graph
    later = tb.is_out.copy()
    later[tb.pair_t[after[tb.pair_c] | (tb.pair_c == v)]] = True
    cut = np.zeros(T, dtype=bool)
    cut[tb.t_sto[made & later]] = True
    ins = tb.in_idx[tb.in_ptr[v]:tb.in_ptr[v + 1]]
    held = np.zeros(T, dtype=bool)
    held[tb.t_sto[ins[tb.graph[ins]]]] = True
    held[tb.t_sto[made & tb.is_out]] = True
    return made, cut, held


def _cut_bound(problem: RematProblem, B: int, swaps: bool, max_candidates: int) -> CutBound:
    N = problem.num_nodes
    if N == 0:
        return CutBound(0.0, 0.0, None, 0)
    if N > MAX_NODES:
        from ..solvers.certificates import compute_floor_s
        f = compute_floor_s(problem)
        return CutBound(f, f, None, 0)
    tb = problem.tables.memo("bounds.cut_tables", lambda: _tables(problem))
    F = tb.floor_s
    best = CutBound(F, F, None, 0)
    # where the no-remat plan is within the budget at v, so is the cut (it is live there): nothing to bound
    c0 = np.asarray(problem.tables.C0)
    cands = np.flatnonzero(tb.need & (c0 > B))
    if len(cands) > max_candidates:
        cands = cands[np.argsort(-c0[cands], kind="stable")[:max_candidates]]
    dev = problem.device
    d2h, h2d, overlap = float(dev.d2h_bytes_per_s), float(dev.h2d_bytes_per_s), bool(dev.copies_overlap_compute)
    for v in cands.tolist():
        A = _mask(tb.anc[v], N)
        D = _mask(tb.desc[v], N) & tb.need
        _, in_x, held = cut_sets(tb, v, A, D)
        total = int(tb.s_bytes[in_x | held].sum()) + int(tb.new_out[v]) + int(tb.ws[v])
        E = total - B
        if E <= 0:
            continue
        off = np.flatnonzero(in_x & ~held)
        if E > int(tb.s_bytes[off].sum()):
            continue   # no plan fits (the memory floor says so): nothing more to bound here
        rec = off[tb.recomp[tb.s_prod[off]]]
        by_prod = np.bincount(tb.s_prod[rec], weights=tb.s_bytes[rec].astype(np.float64), minlength=N)
        prods = np.flatnonzero(by_prod > 0)
        cost = tb.rtime[prods]
        ratio = np.full(len(prods), np.inf)   # bytes per recompute second (free recomputes first)
        np.divide(by_prod[prods], cost, out=ratio, where=cost > 0)
        order = np.lexsort((prods, -ratio))
        xs = np.concatenate([[0.0], np.cumsum(by_prod[prods][order])])
        cs = np.concatenate([[0.0], np.cumsum(cost[order])])
        cA = float(tb.time[A].sum())
        cvD = float(tb.time[v] + tb.time[D].sum())
        lb = _least(F, cA, cvD, float(E), xs, cs, float(tb.s_bytes[off].sum()), d2h, h2d, overlap, swaps)
        if lb > best.time_s:
            best = CutBound(lb, F, v, int(E))
    return best
