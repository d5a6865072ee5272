"""A keep / recompute / swap MILP: Checkmate's stages extended by offload and prefetch.

Sources: Jain et al., *Checkmate*, MLSys 2020, section 4 (``R``, ``S``,
``FREE``, ``U``, frontier-advancing stages; :mod:`.checkmate_model` builds
that part unchanged); Beaumont et al., *Efficient Combination of
Rematerialization and Offloading for Training DNNs*, NeurIPS 2021, section 3
(a stage's duration is the longest of its compute and its transfers; offload
and prefetch decisions beside the recompute ones).  Our own formulation,
written for our IR and simulator (:mod:`libra_opt.simulator`).

The plans it describes (the model's space)
------------------------------------------
Every Checkmate plan of :mod:`.checkmate_model` (same restrictions: stage
``t`` runs its recomputations in node order and then node ``t``; values are
freed right after a user), plus, for a *swappable* value (all its tensors
are base storages holding bytes, none a step output):

- ``OFF[v]``: its storages are copied to the host (``SwapOut``) once, right
  after the first run of its producer, in producer order, on the
  device-to-host queue;
- ``IN[t, v]`` (``p(v) < t``, needs ``OFF[v]``): they are copied back
  (``SwapIn``, in order of arrival) at the start of stage ``t``; the copy is
  in flight (``F[s, v]``: allocated, not usable) until it is waited for
  (``Wait``) at the end of a stage ``u >= t`` (``A[u, v]``), after which
  ``v`` is a checkpoint of stage ``u + 1`` like a value its producer
  recomputed in stage ``u`` (and it must be one: ``A[u, v] <= S[u+1, v]``).
  One copy of a value in flight at a time; nothing reads or recomputes ``v``
  while it is in flight; every copy lands before ``v``'s last possible use.
- ``B[t, v]``: they are copied back and waited for at the start of stage
  ``t`` (``SwapIn`` + ``Wait`` before its first computation): ``v`` is
  usable in stage ``t`` like a checkpoint, at the price of a stall of the
  whole copy (libra's swap-in right before a use).  Nothing forces a use:
  a ``B`` copy that no computation of stage ``t`` reads and that is no
  checkpoint of stage ``t + 1`` is a stall only (which may let a copy out
  end); the lowering frees it right after its ``Wait``
  (:func:`~libra_opt.solvers.checkmate.plan.schedule_from_rs`), so a ``B``
  or ``IN`` of the next stage finds it on the host, never still resident.

Memory (per storage, as the simulator counts it): a value in flight in stage
``s`` is charged in every position of stage ``s`` (allocated when the
``SwapIn`` is issued).  An offloaded storage that is freed stays allocated
until its copy ends: while the copy may still run in stage ``s``
(``P[s, v] = 1``) the model frees nothing of it in the stage (no ``FREE``),
and charges it through the stage (``Z[s, v] >= P[s, v] - S[s, v]``) when it
is not resident at the stage's start.  ``P[s, v]`` may be 0 only if the
copy has surely ended when stage ``s`` starts: ``L[v] <= c(s) + D[s]``,
where ``c(s)`` is the compute time of nodes ``< s`` (their first runs),
``D[s]`` the delay every such plan surely has before stage ``s`` on top of
it (its recomputations and its ``B`` swap-ins' own copy times), and ``L[v]``
the device-to-host queue's end after ``v`` in those coordinates (``L[v] >=
c(p(v) + 1) + D[p(v) + 1] + d_v``, ``L[v] >= L[v'] + d_v`` for the previous
offloaded value ``v'``).  In the simulator the time between a copy's issue
(right after node ``p(u)``) and stage ``s``'s start is at least the first
runs, recomputations and ``B`` copies in between, so the storage has been
released there: memory is never under-counted, and a plan of the model fits
the budget in the simulator.

Valid inequalities (they cut fractional points only: every integral point
of the model with ``Q`` at what is left of the copy satisfies them, so the
optimum is unchanged and the LP bound tighter): ``Q[t, v] <= F[t, v] -
A[t, v]`` (nothing of a copy is left once it lands, and nothing when no copy
is in flight; it replaces ``Q + A <= 1``); ``P[s, v] >= OFF[v] - (D[s] -
D[p(v) + 1]) / g`` where ``g = c(p(v) + 1) + d_v - c(s) > 0`` (the copy out
alone outlasts the first runs before ``s`` by ``g``: only that much extra
delay lets it end before stage ``s``).

Time (the objective): ``sum_t (C_t + X_t) + sum d_v B[t, v]`` with ``C_t`` stage ``t``'s
compute (first runs at ``time_s``, recomputations at the executor's recompute
cost) and ``X_t >= sum_v d_v x[t, v] - C_t`` the host-to-device transfer
time beyond it, where ``x[t, v] <= F[t, v]`` is the share of ``v``'s copy
(``d_v`` = bytes / ``h2d_bytes_per_s``) done during stage ``t`` and the
shares of one copy sum to 1 by its arrival (``Q``: what is left).  In the
simulator each copy runs between its ``SwapIn`` and its ``Wait`` on one
serial queue, so the shares it actually does in each stage satisfy these
rows with stage ``t`` lasting (compute plus stalls) at least ``C_t + X_t``:
a fluid relaxation of the queue; a ``B`` copy stalls the compute stream for
at least its own duration.  Stalls for a host copy not yet complete,
the order of the queue and the device-to-host queue's tail after the last
compute are not charged.  **So the objective never exceeds the simulated
step time of the plan it describes, and the MILP's bound is a lower bound
of the simulated step time of every plan in the model's space**; a returned
plan may simulate slower than its objective by those uncharged waits.  On a
device whose copies do not overlap compute (``copies_overlap_compute=False``)
every copy is charged in full where it is issued, which is exact.

Plans outside the space (the bound says nothing of them): a swap-in waited
for inside a stage after some of its computations (rather than at a stage's
start or end), copies out after a recomputation, a second swap-out, swapping a storage with
a view in the same value, recomputing a value inside the stage it is swapped
in, and everything :mod:`.checkmate_model` lists.
"""
from __future__ import annotations

import logging
from functools import cached_property

import numpy as np

from libra_opt.ir.problem import INPUT
from libra_opt.ir.schedule import Op, Schedule

from .model import CheckmateGraph, CheckmateModel, RowBuilder

log = logging.getLogger(__name__)

__all__ = ["HybridModel", "swappable_values", "hybrid_from_schedule", "swap_on_demand"]


def swappable_values(graph: CheckmateGraph) -> np.ndarray:
    """Values the model may swap: every tensor a base storage that owns bytes
    (views are never swapped on their own; step outputs are not values).

    Returns
    -------
    ndarray of bool, shape (nv,)
    """
    tensors = graph.problem.tensors
    return np.array([graph.mem_bytes[v] > 0 and all(tensors[x].storage == x and tensors[x].nbytes > 0
                                                    for x in graph.value_tensors[v])
                     for v in range(graph.nv)], dtype=bool)


class HybridModel(CheckmateModel):
    """Checkmate's MILP plus ``OFF``, ``IN``, ``F``, ``A``, ``B``, ``x``,
    ``Q``, ``L``, ``P``, ``Z`` and the per-stage transfer excess ``X`` (see
    the module docstring).

    Parameters
    ----------
    graph : CheckmateGraph
    budget_bytes : int
        Graph-memory budget, bytes.
    swap : bool
        False: no swap variables (Checkmate's model; for comparisons).

    Attributes
    ----------
    off_idx : ndarray of int64, shape (nv,)
        Variable index of ``OFF[v]``, -1 if ``v`` is never swapped.
    in_idx, f_idx, a_idx : ndarray of int64, shape (n, nv)
        Variable index of ``IN[t, v]``, ``F[t, v]``, ``A[t, v]``, -1 where
        it is identically 0.
    d_in_s, d_out_s : ndarray of float64, shape (nv,)
        Host-to-device / device-to-host copy time of each value, seconds.
    (and every attribute of :class:`CheckmateModel`)
    """

    def __init__(self, graph: CheckmateGraph, budget_bytes: int, *, swap: bool = True):
        super().__init__(graph, budget_bytes, integral=True)
        g = graph
        dev = g.problem.device
        self.overlap = bool(dev.copies_overlap_compute)
        self.d_in_s = g.mem_bytes.astype(np.float64) / float(dev.h2d_bytes_per_s)
        self.d_out_s = g.mem_bytes.astype(np.float64) / float(dev.d2h_bytes_per_s)
        self.off_idx = np.full(g.nv, -1, dtype=np.int64)
        self.in_idx = np.full((g.n, g.nv), -1, dtype=np.int64)
        self.f_idx = np.full((g.n, g.nv), -1, dtype=np.int64)
        self.a_idx = np.full((g.n, g.nv), -1, dtype=np.int64)
        self.b_idx = np.full((g.n, g.nv), -1, dtype=np.int64)
        self.flights: list[tuple[int, int, int, int, int]] = []
        self.l_vars: dict[int, tuple[int, float]] = {}           # v -> (index of L[v], its upper bound, scaled)
        self.z_vars: list[tuple[int, int, int, int]] = []        # (s, v, index of Z[s, v], of P[s, v])
        self.x_vars: dict[int, int] = {}                          # t -> index of X[t]
        self.d_vars: list[int] = []                               # s -> index of D[s]
        if self.infeasible_reason is None and swap:
            self._extend()

    def recompute_units(self, i: int) -> float:
        """Cost of recomputing node ``i``, in the model's time units."""
        g = self.graph
        cost = g.cost_s[i] if g.recompute_cost_s is None else g.recompute_cost_s[i]
        return float(cost) / self.time_scale

    @cached_property
    def static_start_s(self) -> np.ndarray:
        """``c(s)``: compute time of nodes ``< s`` at their first runs,
        seconds, shape (n + 1,)."""
        return np.concatenate([[0.0], np.cumsum(self.graph.cost_s)])

    def _extend(self) -> None:
        g = self.graph
        n, nv = g.n, g.nv
        ts = self.time_scale
        m = g.mem_bytes.astype(np.float64) / self.mem_scale
        swappable = swappable_values(g)
        num_old_rows = self.num_rows
        lp = RowBuilder(self.lb, self.ub, self.obj, self.integer, first_row=num_old_rows)
        lb, row_lb = lp.lb, lp.row_lb
        new_var, add_row, add_to_row = lp.new_var, lp.add_row, lp.add_to_row
        base_vars = len(lb)
        inf = np.inf

        r_idx, s_idx, in_idx = self.r_idx, self.s_idx, self.in_idx
        vnode = g.value_node
        d_in = self.d_in_s / ts
        d_out = self.d_out_s / ts
        flights: list[tuple[int, int, int, int, int]] = []   # (t, v, F, x, Q) of in-flight copies
        for v in np.flatnonzero(swappable):
            p = int(vnode[v])
            stages = [t for t in range(p + 1, n - 1) if s_idx[t + 1, v] >= 0 and (t, v) in self.persist_rows]
            now = [t for t in range(p + 1, n) if s_idx[t, v] >= 0]
            if not now:
                continue
            off = self.off_idx[v] = new_var(0.0, 1.0, 0.0 if self.overlap else d_out[v], True)
            for t in now:
                # B: swapped in and waited for at the start of stage t (a stall of d_v), usable in t
                b = self.b_idx[t, v] = new_var(0.0, 1.0, d_in[v], True)
                add_row([(b, 1.0), (off, -1.0)], -inf, 0.0)
                add_row([(b, 1.0), (s_idx[t, v], 1.0)], -inf, 1.0)
                if r_idx[t, p] >= 0:
                    add_row([(b, 1.0), (r_idx[t, p], 1.0)], -inf, 1.0)
                for row in self.dep_rows.get((t, int(v)), ()):
                    add_to_row(row, b, -1.0)
                for table in (self.persist_rows, self.free_sum_rows):
                    if (t, int(v)) in table:
                        add_to_row(table[(t, int(v))], b, -1.0)
                add_to_row(self.stage_rows[t], b, -m[v])
            if not stages:
                continue
            prev = None  # (F, A, Q) of the previous stage
            for t in stages:
                # IN: issued at the start of t; F: in flight (allocated) in t; A: waited for at the end of t
                i = in_idx[t, v] = new_var(0.0, 1.0, 0.0 if self.overlap else d_in[v], True)
                f = self.f_idx[t, v] = new_var(0.0, 1.0, 0.0, False)
                a = self.a_idx[t, v] = new_var(0.0, 1.0, 0.0, True)
                add_row([(i, 1.0), (off, -1.0)], -inf, 0.0)
                cont = [] if prev is None else [(prev[0], 1.0), (prev[1], -1.0)]
                add_row([(f, 1.0), (i, -1.0)] + [(c, -w) for c, w in cont], 0.0, 0.0)   # F = F' - A' + IN
                add_row([(i, 1.0)] + cont, -inf, 1.0)              # one copy in flight at a time
                add_row([(a, 1.0), (f, -1.0)], -inf, 0.0)           # arrives only from flight
                add_row([(a, 1.0), (s_idx[t + 1, v], -1.0)], -inf, 0.0)  # and only for a checkpoint
                if s_idx[t, v] >= 0:
                    add_row([(f, 1.0), (s_idx[t, v], 1.0), (self.b_idx[t, v], 1.0)], -inf, 1.0)
                if r_idx[t, p] >= 0:
                    add_row([(f, 1.0), (r_idx[t, p], 1.0)], -inf, 1.0)
                add_to_row(self.persist_rows[(t, v)], a, -1.0)
                add_to_row(self.stage_rows[t], f, -m[v])
                q = -1
                if self.overlap:
                    # the copy's share done in stage t (x <= F); Q: what is left after t, 0 on arrival
                    x = new_var(0.0, 1.0, 0.0, False)
                    q = new_var(0.0, 1.0, 0.0, False)
                    add_row([(x, 1.0), (f, -1.0)], -inf, 0.0)
                    add_row([(q, 1.0), (i, -1.0), (x, 1.0)] + ([(prev[2], -1.0)] if prev else []), 0.0, inf)
                    add_row([(q, 1.0), (a, 1.0), (f, -1.0)], -inf, 0.0)   # Q <= F - A: nothing left once landed
                    flights.append((t, int(v), f, x, q))
                prev = (f, a, q)
            add_row([(prev[0], 1.0), (prev[1], -1.0)], 0.0, 0.0)   # every copy in lands in the window
        if self.overlap:
            # transfer time beyond the stage's compute: X[t] >= sum_v d_v x[t, v] - C_t
            by_stage: dict[int, list] = {}
            for t, v, _f, x, _q in flights:
                by_stage.setdefault(t, []).append((x, d_in[v]))
            for t, ins in sorted(by_stage.items()):
                xt = self.x_vars[t] = new_var(0.0, inf, 1.0, False)
                comp = []
                for i in range(t + 1):
                    if r_idx[t, i] >= 0:
                        cost = g.cost_s[i] if i == t or g.recompute_cost_s is None else g.recompute_cost_s[i]
                        comp.append((int(r_idx[t, i]), cost / ts))
                add_row([(xt, 1.0)] + [(c, -d) for c, d in ins] + comp, 0.0, inf)
            self.flights = flights
            self._pending_out(m, d_out, new_var, add_row, add_to_row)
        # merge: extra columns, then the extra entries (old rows and new ones)
        self.num_vars = len(lb)
        self.num_rows = num_old_rows + len(row_lb)
        A_old = self.A.tocsr()
        A_old.resize((self.num_rows, self.num_vars))
        self.A = (A_old + lp.matrix(self.num_rows, self.num_vars)).tocsr()
        self.lb = np.asarray(lb, dtype=np.float64)
        self.ub = np.asarray(lp.ub, dtype=np.float64)
        self.obj = np.asarray(lp.obj, dtype=np.float64)
        self.integer = np.asarray(lp.integer, dtype=bool)
        self.row_lb = np.concatenate([self.row_lb, np.asarray(row_lb, dtype=np.float64)])
        self.row_ub = np.concatenate([self.row_ub, np.asarray(lp.row_ub, dtype=np.float64)])
        log.debug("hybrid model: %d swappable values, %d swap variables, %d variables, %d rows",
                  int((self.off_idx >= 0).sum()), self.num_vars - base_vars, self.num_vars, self.num_rows)

    def _pending_out(self, m, d_out, new_var, add_row, add_to_row) -> None:
        """``L``, ``P``, ``Z``: an offloaded storage whose copy has not surely
        ended is never freed in the stage (``P``) and, if not resident at the
        stage's start, charged through it (``Z``) (module docstring)."""
        g = self.graph
        n = g.n
        s_idx = self.s_idx
        c = self.static_start_s / self.time_scale
        tiny = 1e-3        # model time units (the mean node cost): the least gap worth a cut
        frees: dict[tuple[int, int], list[int]] = {}
        for t, v, _k, f in self.free_vars:
            frees.setdefault((t, v), []).append(f)
        # D[s]: compute-stream delay before stage s that every plan of these variables surely has
        # beyond the first runs (recomputations, swap-ins waited for at a stage's start)
        d_in = self.d_in_s / self.time_scale
        delay = self.d_vars = [new_var(0.0, 0.0, 0.0, False)]
        for t in range(n - 1):
            d = new_var(0.0, np.inf, 0.0, False)
            terms = [(d, 1.0), (delay[-1], -1.0)]
            terms += [(int(self.r_idx[t, i]), -self.recompute_units(i)) for i in range(t) if self.r_idx[t, i] >= 0]
            terms += [(int(self.b_idx[t, v]), -d_in[v]) for v in np.flatnonzero(self.b_idx[t] >= 0)]
            add_row(terms, 0.0, 0.0)
            delay.append(d)
        prev = None             # (L index, its static upper bound less the delay)
        for v in sorted(np.flatnonzero(self.off_idx >= 0), key=lambda v: (int(g.value_node[v]), int(v))):
            p = int(g.value_node[v])
            off = int(self.off_idx[v])
            hi = max(c[p + 1], prev[1] if prev else 0.0) + d_out[v]   # L[v] - D[p + 1] <= hi
            lv = new_var(0.0, np.inf, 0.0, False)
            self.l_vars[int(v)] = (lv, hi)
            add_row([(lv, 1.0), (off, -d_out[v]), (delay[p + 1], -1.0)], c[p + 1], np.inf)
            if prev is not None:
                add_row([(lv, 1.0), (prev[0], -1.0), (off, -d_out[v])], 0.0, np.inf)
            prev = (lv, hi)
            for s in range(p + 1, n):
                if c[s] >= hi:
                    break
                big = hi - c[s]     # L[v] - D[s] - c(s) <= hi - c(s)
                pend = new_var(0.0, 1.0, 0.0, True)       # P = 1 if L > c(s) + D[s] and OFF
                add_row([(lv, 1.0), (delay[s], -1.0), (pend, -big), (off, big)], -np.inf, c[s] + big)
                gap = c[p + 1] + d_out[v] - c[s]    # the copy alone outlasts the first runs before s by gap:
                if gap > tiny:                      # P >= OFF - (D[s] - D[p + 1]) / gap (valid cut, see _extend)
                    add_row([(pend, 1.0), (off, -1.0), (delay[s], 1.0 / gap), (delay[p + 1], -1.0 / gap)],
                            0.0, np.inf)
                z = new_var(0.0, 1.0, 0.0, False)         # Z >= P - S[s, v]
                add_row([(z, 1.0), (pend, -1.0)] + ([(s_idx[s, v], 1.0)] if s_idx[s, v] >= 0 else []), 0.0, np.inf)
                add_to_row(self.stage_rows[s], z, -m[v])
                if frees.get((s, int(v))):                # sum_k FREE[s, v, k] + P <= 1
                    add_row([(f, 1.0) for f in frees[(s, int(v))]] + [(pend, 1.0)], -np.inf, 1.0)
                self.z_vars.append((s, int(v), z, pend))

    def _queue_shares(self, xv: np.ndarray, F: np.ndarray, A: np.ndarray, comp: np.ndarray) -> np.ndarray:
        """Set the shares ``x`` and what is left ``Q`` of an integral plan's
        copies in (flights ``F``, arrivals ``A``, shape (n, nv)) to the
        cheapest split of the host-to-device queue over the stages: each stage
        ``t`` hides up to ``comp[t]`` (its compute, model units) of transfer,
        given to the copies in flight in order of arrival (earliest deadline
        first, which hides the most: Glover's greedy for convex bipartite
        matching); what a copy still lacks at its last stage is done there,
        beyond the compute.  Returns the excess per stage (``X``), shape (n,)."""
        n = self.graph.n
        d = self.d_in_s / self.time_scale
        excess = np.zeros(n)
        by_stage: dict[int, list] = {}
        for t, v, _f, x, q in self.flights:
            by_stage.setdefault(t, []).append((v, x, q))
        left: dict[int, float] = {}          # value -> transfer time its copy in flight still needs
        deadline: dict[int, int] = {}
        for t in range(n):
            cells = by_stage.get(t, [])
            for v, x, q in cells:
                xv[x] = xv[q] = 0.0
                if F[t, v] and v not in left:  # issued here: lands at the end of the first stage u >= t with A
                    left[v] = float(d[v])
                    u = t
                    while not A[u, v]:
                        u += 1
                    deadline[v] = u
            room = float(comp[t])
            slots = {v: (x, q) for v, x, q in cells}
            for v in sorted((v for v in left if v in slots), key=lambda v: (deadline[v], v)):
                x, q = slots[v]
                take = min(left[v], room) if deadline[v] > t else left[v]   # its last stage: all it lacks
                room = max(room - take, 0.0)
                left[v] -= take
                xv[x] = take / d[v]          # d[v] > 0: a swappable value holds bytes
                xv[q] = left[v] / d[v]
                if deadline[v] == t:
                    del left[v], deadline[v]
            load = sum(xv[x] * d[v] for v, x, _q in cells)
            excess[t] = max(0.0, load - float(comp[t]))
        return excess

    # -------------------------------------------------------------- results
    def satisfies(self, xv: np.ndarray, tol: float = 1e-6) -> bool:
        """True if ``xv`` (shape (num_vars,)) is within every bound and row
        of the model, to ``tol`` (integrality is not checked)."""
        r = self.A @ xv
        return bool((xv >= self.lb - tol).all() and (xv <= self.ub + tol).all()
                    and (r >= self.row_lb - tol).all() and (r <= self.row_ub + tol).all())

    def decode_hybrid(self, xv: np.ndarray) -> tuple[np.ndarray, ...]:
        """``(R, S, IN, A, B, OFF)`` as bool arrays, shapes (n, n), then
        (n, nv) four times, then (nv,), from an integral solution vector."""
        R, S = self.decode(xv)
        out = []
        for idx in (self.in_idx, self.a_idx, self.b_idx):
            M = np.zeros((self.graph.n, self.graph.nv), dtype=bool)
            mask = idx >= 0
            M[mask] = xv[idx[mask]] > 0.5
            out.append(M)
        IN, A, B = out
        OFF = np.zeros(self.graph.nv, dtype=bool)
        mask = self.off_idx >= 0
        OFF[mask] = xv[self.off_idx[mask]] > 0.5
        return R, S, IN, A, B, OFF & (IN | B).any(axis=0)

    def hybrid_assignment(self, R: np.ndarray, S: np.ndarray, IN: np.ndarray, A: np.ndarray, B: np.ndarray,
                          OFF: np.ndarray, over: list | None = None) -> np.ndarray | None:
        """A full solution vector for an integral plan of the model (e.g. a
        warm start), or None if it is not one: a swap the model has no
        variable for, a copy that does not land in its window, or memory over
        the model's budget.  The copies in share the host-to-device queue as
        cheaply as the model allows (:meth:`_queue_shares`).

        Parameters
        ----------
        R : ndarray of bool, shape (n, n)
        S, IN, A, B : ndarray of bool, shape (n, nv)
            Checkpoints; swap-ins issued at the start of stage ``t``; waited
            for at its end; swapped in and waited for at its start.
        OFF : ndarray of bool, shape (nv,)
        over : list, optional
            Receives the stages whose memory is over the model's budget
            (when that is why None is returned).
        """
        g = self.graph
        if (((IN | A) & (self.in_idx < 0)).any() or (B & (self.b_idx < 0)).any() or (B & S).any()
                or (OFF & (self.off_idx < 0)).any() or ((IN | B) & ~OFF[None, :]).any()):
            return None
        xv = self.assignment(R, S)
        m = g.mem_bytes.astype(np.float64) / self.mem_scale
        F = np.zeros_like(IN)
        for v in np.flatnonzero(self.off_idx >= 0):
            flying = False
            for t in np.flatnonzero(self.in_idx[:, v] >= 0):
                if IN[t, v]:
                    if flying or S[t, v]:
                        return None
                    flying = True
                F[t, v] = flying
                if A[t, v]:
                    if not flying or not S[t + 1, v]:
                        return None
                    flying = False
            if flying:
                return None
        if (F & B).any():
            return None
        for idx, M in ((self.in_idx, IN), (self.a_idx, A), (self.f_idx, F), (self.b_idx, B)):
            mask = idx >= 0
            xv[idx[mask]] = M[mask]
        mask = self.off_idx >= 0
        xv[self.off_idx[mask]] = OFF[mask]
        shift = ((F | B) * m[None, :]).sum(axis=1)
        ts = self.time_scale
        if self.overlap:
            c = self.static_start_s / ts
            d_out = self.d_out_s / ts
            D = [0.0]
            for t in range(g.n - 1):
                D.append(D[-1] + sum(self.recompute_units(int(i)) for i in np.flatnonzero(R[t, :t]))
                         + float(B[t] @ (self.d_in_s / ts)))
            for d, val in zip(self.d_vars, D):
                xv[d] = val
            last = 0.0
            L = {}
            for v in sorted(self.l_vars, key=lambda v: (int(g.value_node[v]), v)):
                p = int(g.value_node[v])
                last = max(c[p + 1] + D[p + 1], last) + (d_out[v] if OFF[v] else 0.0)
                L[v] = last
                xv[self.l_vars[v][0]] = last
            held: set[tuple[int, int]] = set()
            for s, v, z, pend in self.z_vars:
                pending = bool(OFF[v]) and L[v] > c[s] + D[s] + 1e-9 * max(float(c[-1]), 1.0)
                xv[pend] = 1.0 if pending else 0.0
                xv[z] = 1.0 if pending and not S[s, v] else 0.0
                shift[s] += m[v] * xv[z]
                if pending:
                    held.add((s, v))
            later: dict[tuple[int, int], float] = {}   # (stage, position) -> bytes no longer freed before it
            for t, v, k, f in self.free_vars:
                if (t, v) in held and xv[f] > 0.5:
                    xv[f] = 0.0
                    for t2, k2, _u in self.u_vars:
                        if t2 == t and k2 > k:
                            later[(t, k2)] = later.get((t, k2), 0.0) + m[v]
            for t, k, u in self.u_vars:
                xv[u] += later.get((t, k), 0.0)
            comp = np.zeros(g.n)
            for t in self.x_vars:
                comp[t] = sum((g.cost_s[i] if i == t or g.recompute_cost_s is None else g.recompute_cost_s[i])
                              for i in np.flatnonzero(R[t, :t + 1])) / ts
            excess = self._queue_shares(xv, F, A, comp)
            for t, xt in self.x_vars.items():
                xv[xt] = excess[t]
        fits = True
        for t, k, u in self.u_vars:
            xv[u] += shift[t]
            if xv[u] > self.ub[u] + 1e-7:
                fits = False
                if over is None:
                    break
                over.append(t)
        return xv if fits else None

    def fitted_assignment(self, R: np.ndarray, S: np.ndarray, IN: np.ndarray, A: np.ndarray, B: np.ndarray,
                          OFF: np.ndarray):
        """:meth:`hybrid_assignment` of the plan, or, where the model counts
        more memory than the budget in some stage (the model allocates a copy
        in from the start of the stage that issues it, a plan may issue it
        later in that stage), of the plan with its copies in issued later:
        at the first stage over the budget, the largest copy in flight there
        is issued at the next stage instead, or, if it lands there, swapped
        in at the start of the next stage (``B``), until the plan fits or no copy can move (at most ``n``
        moves).  ``R`` is re-derived (:func:`~libra_opt.solvers.checkmate.plan.solve_r_opt`)
        after each move.

        Returns
        -------
        (xv, (R, S, IN, A, B)) or None
            The solution vector (shape (num_vars,)) and the plan it is of.
        """
        from .plan import solve_r_opt

        g = self.graph
        m = g.mem_bytes
        S, IN, A, B = S.copy(), IN.copy(), A.copy(), B.copy()
        for _move in range(g.n + 1):
            over: list = []
            xv = self.hybrid_assignment(R, S, IN, A, B, OFF, over=over)
            if xv is not None:
                return xv, (R, S, IN, A, B)
            if not over:
                return None
            t = min(over)
            best = None          # (bytes, value, issue stage, landing stage)
            for v in np.flatnonzero(IN[:t + 1].any(axis=0)):
                for t0 in np.flatnonzero(IN[:t + 1, v]):
                    u = t0 + int(np.argmax(A[t0:, v]))
                    if u >= t and (best is None or m[v] > best[0]):
                        best = (m[v], int(v), int(t0), u)
            if best is None:
                return None
            _, v, t0, u = best
            IN[t0, v] = False
            if u > t and self.in_idx[t + 1, v] >= 0:       # issue it at the start of t + 1
                IN[t + 1, v] = True
            elif u == t and t + 1 < g.n and self.b_idx[t + 1, v] >= 0:   # swapped in when t + 1 starts
                A[t, v] = False
                S[t + 1, v] = False
                B[t + 1, v] = True
            else:
                return None
            R = solve_r_opt(g, S, arrived=A, present=B)
            if (R & ~g.recomputable[None, :] & ~np.eye(g.n, dtype=bool)).any():
                return None
        return None


def hybrid_from_schedule(graph: CheckmateGraph, schedule: Schedule) -> tuple[np.ndarray, ...]:
    """``(S, IN, A, B, OFF)`` of a plan with swaps (e.g. libra's hybrid plan), on
    the model's graph, for a starting solution (derive ``R`` with
    :func:`~libra_opt.solvers.checkmate_plan.solve_r_opt` and check it with
    :meth:`HybridModel.hybrid_assignment`, which rejects what the model
    cannot express).

    Stage ``t`` of the plan ends with node ``t``'s first run and the ``Free``
    instructions right after it.  ``S[t, v]``: some tensor of ``v`` resident
    when stage ``t - 1`` ends.  A ``SwapIn`` issued in stage ``t`` and waited
    for in stage ``u > t`` becomes ``IN[t, v]`` and ``A[u - 1, v]`` with
    ``S[u, v]`` (the model waits at the end of stage ``u - 1``); one issued
    and waited for in the same stage ``u`` becomes ``B[u, v]`` (the model
    waits at the stage's start).  ``OFF[v]``: the plan swaps ``v`` out.

    Returns
    -------
    S, IN, A, B : ndarray of bool, shape (n, nv)
    OFF : ndarray of bool, shape (nv,)

    Raises
    ------
    SolverError
        First computations not in node order.
    """
    from libra_opt.errors import SolverError

    n, nv = graph.n, graph.nv
    problem = graph.problem
    tv = graph.tensor_value
    S = np.zeros((n, nv), dtype=bool)
    OFF = np.zeros(nv, dtype=bool)
    resident: set[int] = set()
    issued: dict[int, int] = {}                   # tensor -> stage its swap-in was issued in
    flights: list[tuple[int, int, int]] = []      # (value, issue stage, wait stage)
    seen: set[int] = set()
    instrs = list(schedule)
    stage = 0
    i = 0
    while i < len(instrs) and stage < n:
        ins = instrs[i]
        i += 1
        x = ins.arg
        if ins.op == Op.FREE:
            resident.discard(x)
        elif ins.op == Op.SWAP_OUT:
            if x in tv:
                OFF[tv[x]] = True
        elif ins.op == Op.SWAP_IN:
            issued[x] = stage
        elif ins.op == Op.WAIT:
            if x not in issued:       # waits for a copy out: the storage's residency does not change
                continue
            resident.add(x)
            t_issue = issued.pop(x)
            if x in tv:
                flights.append((tv[x], t_issue, stage))
        elif ins.op == Op.COMPUTE:
            resident.update(problem.nodes[x].outputs)
            if x in seen:
                continue
            seen.add(x)
            if x != stage:
                raise SolverError(f"hybrid_from_schedule: node {x} first runs in stage {stage}; first computations "
                                  f"must be in node order")
            while i < len(instrs) and instrs[i].op == Op.FREE:
                resident.discard(instrs[i].arg)
                i += 1
            stage += 1
            if stage < n:
                for y in resident:
                    if y in tv:
                        S[stage, tv[y]] = True
    for view, base in sorted(graph.ties, reverse=True):  # a resident view holds its base's storage
        S[:, base] |= S[:, view]
    IN = np.zeros((n, nv), dtype=bool)
    A = np.zeros((n, nv), dtype=bool)
    B = np.zeros((n, nv), dtype=bool)
    for v, t, u in flights:
        if t == u or u - 1 <= graph.value_node[v]:
            B[u, v] = True
        else:
            IN[t, v] = True
            A[u - 1, v] = True
            S[u, v] = True
    return S, IN, A, B, OFF


def swap_on_demand(graph: CheckmateGraph) -> tuple[np.ndarray, ...]:
    """``(S, IN, A, B, OFF)`` of the plan that keeps every value from its
    computation to its first use (no remat there) and brings a swappable
    value back for each later use by a swap-in at the start of that stage
    (``B``); other values, and bases while a view of them is kept, are kept
    to their last use.  The least memory
    among simple plans of the model: a starting solution at tight budgets.

    Returns
    -------
    S, IN, A, B : ndarray of bool, shape (n, nv)
    OFF : ndarray of bool, shape (nv,)
    """
    from .plan import keep_all_s

    n, nv = graph.n, graph.nv
    swappable = swappable_values(graph)
    S = keep_all_s(graph)
    B = np.zeros((n, nv), dtype=bool)
    for v in np.flatnonzero(swappable):
        users = graph.users[v]
        if not users:
            continue
        first = users[0]
        S[first + 1:, v] = False
        for j in users[1:]:
            if j > first:
                B[j, v] = True
    for view, base in sorted(graph.ties, reverse=True):  # a resident view holds its base's storage
        S[:, base] |= S[:, view]
    B &= ~S
    OFF = B.any(axis=0)
    none = np.zeros((n, nv), dtype=bool)
    return S, none, none.copy(), B, OFF
