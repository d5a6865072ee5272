"""Ordered cut bounds: lower bounds on the step time of the plans that
compute every node for the first time in the problem's node order.

Every built-in solver makes such plans (libra follows the eager positions,
Checkmate's stages advance the frontier one node at a time, the baselines
keep the order), but the simulator accepts others, so these bounds hold only
for the plans :func:`first_computes_in_order` accepts (the certificates'
``covers`` test, :mod:`libra_opt.solvers.certificates`).  Within that class
the order tells more than the graph alone (:mod:`libra_opt.passes.cut_bounds`,
whose cut at ``v`` holds only ``v``'s ancestors' storages, to hold for every
order):

1. When node ``v`` first runs, every node before it has run (those an output
   needs) and none after it.  Every storage made before ``v`` that ``v`` or a
   needed node after it reads, or that holds a step output, is resident then
   or comes back later, as in the cut bound; this is the no-remat plan's live
   set at ``v``.
2. **Chains.** A producer recomputed after ``v`` needs its inputs resident
   when it runs.  An input storage that no node from ``v`` on reads (dead at
   ``v`` in the no-remat plan) is then either resident at ``v`` too (its
   bytes count against the budget there), or comes back after ``v`` by a
   recomputation of its own producer (whose inputs the same rule covers) or
   by a swap-in.

At one node ``v`` this is a linear program over, per storage, the shares
kept resident at ``v`` (``k``) and swapped (``w``; copied out before ``v``,
in after), and per producer the share recomputed after ``v`` (``r``):
minimise the step time ``T`` subject to the budget at ``v`` on the kept
bytes, ``k_s + w_s + r_p(s) >= 1`` for the storages needed from ``v`` on,
``k_u + w_u + r_p(u) >= r_q`` for each dead input ``u`` of a producer ``q``,
and the cut bound's time terms with ``S = sum bytes * w`` and ``R = sum
recompute seconds * r``: ``T >= F + R``; with copies that overlap compute
``T >= S / d2h + c_D + R``, ``T >= c_A + S / h2d`` and ``T >= S / d2h + S /
h2d`` (``c_A`` / ``c_D``: the compute seconds of the needed nodes before /
from ``v``), else ``T >= F + R + S / d2h + S / h2d``.  Every plan of the
class gives a point of it (its recomputations after ``v`` at least once
each, at their recompute time), so its least ``T`` is a bound; the bound is
the largest over the :data:`MAX_CANDIDATES` nodes of the largest no-remat
memory, and never under the compute floor ``F``.  Recompute-only
(``swaps=False``): ``w = 0``; ``inf`` where no recompute-only plan of the class
fits (the program is infeasible at some node).

What it costs: one LP per candidate node (``scipy.optimize.linprog``,
HiGHS), over the live set at that node and the closure of the dead storages
its producers read; problems of more than :data:`MAX_NODES` nodes get the
compute floor.

Source: Checkmate's frontier-advancing stages (Jain et al., MLSys 2020,
sec. 4: a stage computes one node for the first time, in the topological
order, and a recomputation needs its inputs resident in that stage), as a
relaxation at one stage; the offload terms of Beaumont et al. (NeurIPS 2021,
sec. 3) as in :mod:`libra_opt.passes.cut_bounds`; LP solved with HiGHS
(``scipy.optimize.linprog``).
"""
from __future__ import annotations

import math

import numpy as np

from ..ir.problem import RematProblem
from .cut_bounds import CutBound, _tables, cut_sets, memoized_bound

__all__ = ["ordered_cut_bound", "first_computes_in_order", "MAX_NODES", "MAX_CANDIDATES"]

#: problems of more than this many nodes get the compute floor (one LP per candidate node)
MAX_NODES = 1000
#: cut nodes tried, those of the largest no-remat memory first (any subset gives a valid bound)
MAX_CANDIDATES = 32


def first_computes_in_order(problem: RematProblem, schedule) -> bool:
    """Whether ``schedule`` computes every node for the first time in the
    problem's node order (each node's first ``Compute`` after those of all
    lower-numbered nodes): the plans :func:`ordered_cut_bound` holds for.

    Parameters
    ----------
    problem : RematProblem
    schedule : Schedule
        Any plan of ``problem`` (:class:`~libra_opt.ir.schedule.Schedule`).

    Returns
    -------
    bool
    """
    from ..ir.schedule import Op

    seen: set[int] = set()
    last = -1
    for ins in schedule.instructions:
        if ins.op == Op.COMPUTE and ins.arg not in seen:
            seen.add(ins.arg)
            if ins.arg < last:
                return False
            last = ins.arg
    return True


def ordered_cut_bound(problem: RematProblem, budget_bytes: int, swaps: bool = True,
                      max_candidates: int = MAX_CANDIDATES) -> CutBound:
    """The ordered cut bound (module docstring) of ``problem`` at
    ``budget_bytes``: a lower bound on the step time of every plan within the
    budget whose first computes follow the node order
    (:func:`first_computes_in_order`).

    Parameters
    ----------
    problem : RematProblem
    budget_bytes : int
        Graph-memory budget (bytes).
    swaps : bool
        ``True``: every keep / recompute / swap plan of the class;
        ``False``: those without swap instructions only.
    max_candidates : int
        Cut nodes tried, largest no-remat memory first.

    Returns
    -------
    CutBound
        ``time_s`` in seconds, at least the compute floor (``inf`` for a
        recompute-only bound where no such plan fits), the node that gives
        it and its excess bytes over the budget in the no-remat plan;
        computed once per problem, budget, ``swaps`` and ``max_candidates``
        (kept with ``problem.tables``).  On problems of more than
        :data:`MAX_NODES` nodes, the floor.

    Raises
    ------
    ValueError
        ``budget_bytes`` is negative, or ``max_candidates`` under 1.
    """
    return memoized_bound(problem, "bounds.ordered_cut_bound", _ordered, budget_bytes, swaps, max_candidates)


def _ordered(problem: RematProblem, B: int, swaps: bool, max_candidates: int) -> CutBound:
    N = problem.num_nodes
    if N == 0:
        return CutBound(0.0, 0.0, None, 0)
    tb = problem.tables.memo("bounds.cut_tables", lambda: _tables(problem))
    F = tb.floor_s
    if N > MAX_NODES:
        return CutBound(F, F, None, 0)
    best = CutBound(F, F, None, 0)
    c0 = np.asarray(problem.tables.C0)
    cands = np.flatnonzero(tb.need & (c0 > B))
    cands = cands[np.argsort(-c0[cands], kind="stable")[:max_candidates]]
    for v in cands.tolist():
        lb, excess = _at(tb, problem, v, B, swaps)
        if lb > best.time_s:
            best = CutBound(lb, F, v, excess)
        if lb == math.inf:
            break   # no recompute-only plan of the class fits
    return best


def _at(tb, problem: RematProblem, v: int, B: int, swaps: bool) -> tuple[float, int]:
    """The bound at node ``v`` (s; ``-inf`` where nothing is forced off,
    ``inf`` where the recompute-only program is infeasible) and the no-remat
    plan's excess bytes there."""
    from scipy.optimize import linprog
    from scipy.sparse import coo_matrix

    N, T = problem.num_nodes, len(tb.t_sto)
    before = np.zeros(N, dtype=bool)
    before[:v] = True
    after = np.zeros(N, dtype=bool)
    after[v + 1:] = True
    after &= tb.need
    made, live, held = cut_sets(tb, v, before, after)   # live: the no-remat plan's live set at v
    base = np.arange(T) == tb.t_sto
    cap = B - int(tb.s_bytes[held].sum()) - int(tb.new_out[v]) - int(tb.ws[v])
    off = np.flatnonzero(live & ~held & (tb.s_bytes > 0))
    excess = int(tb.s_bytes[off].sum()) - cap
    if excess <= 0:
        return -math.inf, excess
    if cap < 0:
        return -math.inf, excess   # no plan of the class fits at all: nothing to bound here
    dead = made & base & ~live & ~held & (tb.s_bytes > 0)
    # the storages of the program: the live ones off the inputs, then the dead ones a recomputed producer reads
    sto = off.tolist()
    index = {s: i for i, s in enumerate(sto)}
    prods: dict[int, int] = {}   # recomputable producer -> its index (the order they were met in)

    def meet(s: int) -> None:
        p = int(tb.s_prod[s])
        if tb.recomp[p] and p not in prods:
            prods[p] = len(prods)

    for s in sto:
        meet(s)
    order = list(prods)
    k = 0
    while k < len(order):   # the closure: dead storages the producers met so far read, and their producers
        q = order[k]
        k += 1
        for u in tb.in_idx[tb.in_ptr[q]:tb.in_ptr[q + 1]].tolist():
            su = int(tb.t_sto[u])
            if dead[su] and su not in index:
                index[su] = len(sto)
                sto.append(su)
                meet(su)
                if len(prods) > len(order):
                    order.append(int(tb.s_prod[su]))
    ns, npr = len(sto), len(prods)
    kv, wv, rv, tv = 0, ns, 2 * ns, 2 * ns + npr      # variable offsets: k, w, r, T
    rows, cols, vals, rhs = [], [], [], []

    def row(coeffs: list[tuple[int, float]], b: float) -> None:
        r = len(rhs)
        for c, x in coeffs:
            rows.append(r)
            cols.append(c)
            vals.append(x)
        rhs.append(b)

    def back(s: int, i: int) -> list[tuple[int, float]]:
        """-(k + w + r of its producer) of storage ``s`` (index ``i``)."""
        out = [(kv + i, -1.0), (wv + i, -1.0)]
        p = int(tb.s_prod[s])
        if tb.recomp[p]:
            out.append((rv + prods[p], -1.0))
        return out

    for i in range(len(off)):   # needed from v on: kept, swapped or recomputed after v
        row(back(sto[i], i), -1.0)
    for q, j in prods.items():  # a producer recomputed after v needs its dead inputs back
        for su in sorted({int(tb.t_sto[u]) for u in tb.in_idx[tb.in_ptr[q]:tb.in_ptr[q + 1]].tolist()}):
            if dead[su]:
                row([(rv + j, 1.0)] + back(su, index[su]), 0.0)
    nbytes = tb.s_bytes[np.asarray(sto, dtype=np.int64)].astype(np.float64)
    row([(kv + i, float(nbytes[i])) for i in range(ns)], float(cap))   # the budget at v
    dev = problem.device
    d2h, h2d = float(dev.d2h_bytes_per_s), float(dev.h2d_bytes_per_s)
    rec = [(rv + j, float(tb.rtime[q])) for q, j in prods.items()]
    out_s = [(wv + i, float(nbytes[i]) / d2h) for i in range(ns)] if swaps and d2h > 0 else []
    in_s = [(wv + i, float(nbytes[i]) / h2d) for i in range(ns)] if swaps and h2d > 0 else []
    F = tb.floor_s
    c_a = float(tb.time[before & tb.need].sum())
    c_d = float(tb.time[v] + tb.time[after].sum())

    def at_most_t(terms: list[tuple[int, float]], const: float) -> None:   # const + terms <= T
        row(terms + [(tv, -1.0)], -const)

    if dev.copies_overlap_compute:
        at_most_t(rec, F)
        at_most_t(out_s + rec, c_d)
        at_most_t(in_s, c_a)
        at_most_t(out_s + in_s, 0.0)
    else:
        at_most_t(rec + out_s + in_s, F)
    A = coo_matrix((vals, (rows, cols)), shape=(len(rhs), tv + 1)).tocsr()
    cost = np.zeros(tv + 1)
    cost[tv] = 1.0
    swap_hi = 1.0 if swaps and d2h > 0 and h2d > 0 else 0.0
    bounds = [(0.0, 1.0)] * ns + [(0.0, swap_hi)] * ns + [(0.0, 1.0)] * npr + [(0.0, None)]
    res = linprog(cost, A_ub=A, b_ub=np.asarray(rhs), bounds=bounds, method="highs")
    if res.status == 2:   # infeasible: no plan of the class fits at v (recompute-only), or none at all
        return (math.inf if not swaps else -math.inf), excess
    if res.status != 0:
        return -math.inf, excess   # not solved: no claim
    # HiGHS's optimum is within its tolerances: step back by them so the bound never exceeds the true least
    return float(res.fun) * (1.0 - 1e-7), excess
