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
  (``SwapIn``) at the start of stage ``t`` and waited for (``Wait``) at the
  end of stage ``t``; ``v`` is then a checkpoint of stage ``t + 1`` like a
  value its producer recomputed in stage ``t`` (and it must be one:
  ``IN[t, v] <= S[t+1, v]``).  Nothing in stage ``t`` reads or recomputes ``v``.  Prefetching further ahead is ``IN`` earlier
  and ``S`` keeping it resident, paid in memory from the ``SwapIn`` on, as
  the simulator charges it.

Memory (per storage, as the simulator counts it): a value swapped in during
stage ``t`` is charged in every position of stage ``t`` (allocated when the
``SwapIn`` is issued).  An offloaded storage that is freed stays allocated
until its copy ends; the model charges it in stage ``s`` (``Z[s, v]``) unless
it is kept through the stage (``KEEP[s, v]``: ``S[s, v] = S[s+1, v] = 1``) or
its copy has surely ended when stage ``s`` starts: ``L[v] <= c(s)``, where
``c(s)`` is the compute time of nodes ``< s`` (their first runs) and ``L[v]``
the device-to-host queue's end after ``v`` in those same static
coordinates (``L[v] >= c(p(v) + 1) + d_v``, ``L[v] >= L[v'] + d_v`` for the
previous offloaded value ``v'``).  Recomputations and stalls delay the
stage's start at least as much as the copy's issue, so the simulator has
released the storage there: memory is never under-counted, and a plan of
the model fits the budget in the simulator.

Time (the objective): ``sum_t max(C_t, D_t)``, with ``C_t`` stage ``t``'s
compute (first runs at ``time_s``, recomputations at the executor's recompute
cost) and ``D_t`` the duration of its swap-ins (bytes / ``h2d_bytes_per_s``).
In the simulator stage ``t`` starts with the host-to-device queue idle
(everything earlier was waited for), so it lasts at least ``max(C_t, D_t)``;
stalls for a host copy not yet complete and the device-to-host queue's tail
after the last compute are not charged.  **So the objective never exceeds the
simulated step time of the plan it describes, and the MILP's bound is a lower
bound of the simulated step time of every plan in the model's space**; a
returned plan may simulate slower than its objective by those uncharged
waits.  On a device whose copies do not overlap compute
(``copies_overlap_compute=False``) every copy is charged in full, which is
exact.

Plans outside the space (the bound says nothing of them): swap-ins waited
for in a later stage than they are issued in (longer prefetch overlap),
copies out after a recomputation, a second swap-out, swapping a storage with
a view in the same value, recomputing a value inside the stage it is swapped
in, and everything :mod:`.checkmate_model` lists.
"""
from __future__ import annotations

import logging
from functools import cached_property

import numpy as np
import scipy.sparse as sp

from libra_opt.problem import INPUT
from libra_opt.schedule import Op, Schedule

from .checkmate_model import CheckmateGraph, CheckmateModel

log = logging.getLogger(__name__)

__all__ = ["HybridModel", "swappable_values", "hybrid_from_schedule"]


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
    """Checkmate's MILP plus ``OFF``, ``IN``, ``L``, ``Z``, ``KEEP`` and
    per-stage transfer excess ``X`` (see the module docstring).

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
    in_idx : ndarray of int64, shape (n, nv)
        Variable index of ``IN[t, v]``, -1 where it is identically 0.
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
        self.l_vars: dict[int, tuple[int, float]] = {}           # v -> (index of L[v], its upper bound, scaled)
        self.z_vars: list[tuple[int, int, int]] = []             # (s, v, index of Z[s, v])
        self.keep_vars: list[tuple[int, int, int]] = []          # (s, v, index of KEEP[s, v])
        self.x_vars: dict[int, int] = {}                          # t -> index of X[t]
        if self.infeasible_reason is None and swap:
            self._extend()

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
        lb, ub, obj, integer = list(self.lb), list(self.ub), list(self.obj), list(self.integer)
        base_vars = len(lb)
        rows: list[int] = []
        cols: list[int] = []
        vals: list[float] = []
        row_lb: list[float] = []
        row_ub: list[float] = []
        num_old_rows = self.num_rows
        inf = np.inf

        def new_var(lo, hi, c, is_int) -> int:
            lb.append(lo)
            ub.append(hi)
            obj.append(c)
            integer.append(is_int)
            return len(lb) - 1

        def add_row(terms, lo, hi) -> None:
            r = num_old_rows + len(row_lb)
            for c, v in terms:
                rows.append(r)
                cols.append(c)
                vals.append(v)
            row_lb.append(lo)
            row_ub.append(hi)

        def add_to_row(r: int, c: int, v: float) -> None:
            rows.append(r)
            cols.append(c)
            vals.append(v)

        r_idx, s_idx, in_idx = self.r_idx, self.s_idx, self.in_idx
        vnode = g.value_node
        d_in = self.d_in_s / ts
        d_out = self.d_out_s / ts
        for v in np.flatnonzero(swappable):
            p = int(vnode[v])
            stages = [t for t in range(p + 1, n - 1) if s_idx[t + 1, v] >= 0 and (t, v) in self.persist_rows]
            if not stages:
                continue
            self.off_idx[v] = new_var(0.0, 1.0, 0.0 if self.overlap else d_out[v], True)
            for t in stages:
                in_idx[t, v] = new_var(0.0, 1.0, 0.0 if self.overlap else d_in[v], True)
                add_row([(in_idx[t, v], 1.0), (self.off_idx[v], -1.0)], -inf, 0.0)
                add_row([(in_idx[t, v], 1.0), (s_idx[t + 1, v], -1.0)], -inf, 0.0)  # only for a checkpoint
                if s_idx[t, v] >= 0:
                    add_row([(in_idx[t, v], 1.0), (s_idx[t, v], 1.0)], -inf, 1.0)
                if r_idx[t, p] >= 0:
                    add_row([(in_idx[t, v], 1.0), (r_idx[t, p], 1.0)], -inf, 1.0)
                add_to_row(self.persist_rows[(t, v)], in_idx[t, v], -1.0)
                add_to_row(self.stage_rows[t], in_idx[t, v], -m[v])
        if self.overlap:
            # transfer time beyond the stage's compute: X[t] >= D_t - C_t
            for t in range(n):
                ins = [(int(in_idx[t, v]), d_in[v]) for v in np.flatnonzero(in_idx[t] >= 0)]
                if not ins:
                    continue
                x = self.x_vars[t] = new_var(0.0, inf, 1.0, False)
                comp = []
                for i in range(t + 1):
                    if r_idx[t, i] >= 0:
                        cost = g.cost_s[i] if i == t or g.recompute_cost_s is None else g.recompute_cost_s[i]
                        comp.append((int(r_idx[t, i]), cost / ts))
                add_row([(x, 1.0)] + [(c, -d) for c, d in ins] + comp, 0.0, inf)
            self._pending_out(m, d_out, new_var, add_row, add_to_row)
        # merge: extra columns, then the extra entries (old rows and new ones)
        self.num_vars = len(lb)
        self.num_rows = num_old_rows + len(row_lb)
        A_old = self.A.tocsr()
        A_old.resize((self.num_rows, self.num_vars))
        extra = sp.csr_matrix((np.asarray(vals, dtype=np.float64), (np.asarray(rows, dtype=np.int64),
                              np.asarray(cols, dtype=np.int64))), shape=(self.num_rows, self.num_vars))
        self.A = (A_old + extra).tocsr()
        self.lb = np.asarray(lb, dtype=np.float64)
        self.ub = np.asarray(ub, dtype=np.float64)
        self.obj = np.asarray(obj, dtype=np.float64)
        self.integer = np.asarray(integer, dtype=bool)
        self.row_lb = np.concatenate([self.row_lb, np.asarray(row_lb, dtype=np.float64)])
        self.row_ub = np.concatenate([self.row_ub, np.asarray(row_ub, dtype=np.float64)])
        log.debug("hybrid model: %d swappable values, %d swap variables, %d variables, %d rows",
                  int((self.off_idx >= 0).sum()), self.num_vars - base_vars, self.num_vars, self.num_rows)

    def _pending_out(self, m, d_out, new_var, add_row, add_to_row) -> None:
        """``L``, ``Z``, ``KEEP``: an offloaded storage dropped before its
        copy surely ended is charged (module docstring)."""
        g = self.graph
        n = g.n
        s_idx = self.s_idx
        c = self.static_start_s / self.time_scale
        eps = 1e-9 * max(float(c[-1]), 1.0)
        prev = None             # (L index, its upper bound)
        for v in sorted(np.flatnonzero(self.off_idx >= 0), key=lambda v: (int(g.value_node[v]), int(v))):
            p = int(g.value_node[v])
            off = int(self.off_idx[v])
            hi = max(c[p + 1], prev[1] if prev else 0.0) + d_out[v]
            lv = new_var(0.0, hi, 0.0, False)
            self.l_vars[int(v)] = (lv, hi)
            add_row([(lv, 1.0), (off, -d_out[v])], c[p + 1], np.inf)
            if prev is not None:
                add_row([(lv, 1.0), (prev[0], -1.0), (off, -d_out[v])], 0.0, np.inf)
            prev = (lv, hi)
            for s in range(p + 1, n):
                if c[s] >= hi:
                    break
                big = hi - c[s]
                z = new_var(0.0, 1.0, 0.0, True)
                self.z_vars.append((s, int(v), z))
                add_to_row(self.stage_rows[s], z, -m[v])
                terms = [(lv, 1.0), (z, -big), (off, big)]
                if s + 1 < n and s_idx[s, v] >= 0 and s_idx[s + 1, v] >= 0:
                    k = new_var(0.0, 1.0, 0.0, False)
                    self.keep_vars.append((s, int(v), k))
                    add_row([(k, 1.0), (s_idx[s, v], -1.0)], -np.inf, 0.0)
                    add_row([(k, 1.0), (s_idx[s + 1, v], -1.0)], -np.inf, 0.0)
                    terms.append((k, -big))
                add_row(terms, -np.inf, c[s] + big - eps)

    # -------------------------------------------------------------- results
    def decode_hybrid(self, xv: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """``(R, S, IN, OFF)`` as bool arrays, shapes (n, n), (n, nv), (n, nv),
        (nv,), from an integral solution vector."""
        R, S = self.decode(xv)
        IN = np.zeros((self.graph.n, self.graph.nv), dtype=bool)
        mask = self.in_idx >= 0
        IN[mask] = xv[self.in_idx[mask]] > 0.5
        OFF = np.zeros(self.graph.nv, dtype=bool)
        mask = self.off_idx >= 0
        OFF[mask] = xv[self.off_idx[mask]] > 0.5
        return R, S, IN, OFF & IN.any(axis=0)

    def hybrid_assignment(self, R: np.ndarray, S: np.ndarray, IN: np.ndarray, OFF: np.ndarray) -> np.ndarray | None:
        """A full solution vector for an integral plan of the model (e.g. a
        warm start), or None if it is not one: a swap the model has no
        variable for, or memory over the model's budget.

        Parameters
        ----------
        R : ndarray of bool, shape (n, n)
        S, IN : ndarray of bool, shape (n, nv)
        OFF : ndarray of bool, shape (nv,)
        """
        g = self.graph
        if (IN & (self.in_idx < 0)).any() or (OFF & (self.off_idx < 0)).any():
            return None
        xv = self.assignment(R, S)
        m = g.mem_bytes.astype(np.float64) / self.mem_scale
        mask = self.in_idx >= 0
        xv[self.in_idx[mask]] = IN[mask]
        mask = self.off_idx >= 0
        xv[self.off_idx[mask]] = OFF[mask]
        shift = (IN * m[None, :]).sum(axis=1)
        ts = self.time_scale
        if self.overlap:
            c = self.static_start_s / ts
            d_out = self.d_out_s / ts
            last = 0.0
            L = {}
            for v in sorted(self.l_vars, key=lambda v: (int(g.value_node[v]), v)):
                last = max(c[int(g.value_node[v]) + 1], last) + (d_out[v] if OFF[v] else 0.0)
                L[v] = last
                xv[self.l_vars[v][0]] = last
            for s, v, z in self.z_vars:
                kept = s + 1 < g.n and S[s, v] and S[s + 1, v]
                pending = OFF[v] and L[v] > c[s] + 1e-9 * max(float(c[-1]), 1.0) and not kept
                xv[z] = 1.0 if pending else 0.0
                shift[s] += m[v] * xv[z]
            for s, v, k in self.keep_vars:
                xv[k] = 1.0 if (S[s, v] and S[s + 1, v]) else 0.0
            for t, x in self.x_vars.items():
                comp = sum((g.cost_s[i] if i == t or g.recompute_cost_s is None else g.recompute_cost_s[i])
                           for i in np.flatnonzero(R[t, :t + 1])) / ts
                xv[x] = max(0.0, float(IN[t] @ (self.d_in_s / ts)) - comp)
        for t, k, u in self.u_vars:
            xv[u] += shift[t]
            if xv[u] > self.ub[u] + 1e-7:
                return None
        return xv


def hybrid_from_schedule(graph: CheckmateGraph, schedule: Schedule) -> tuple[np.ndarray, np.ndarray, np.ndarray,
                                                                            np.ndarray]:
    """``(S, IN, OFF)`` of a plan with swaps (e.g. libra's hybrid plan), on
    the model's graph, for a starting solution (derive ``R`` with
    :func:`~libra_opt.solvers.checkmate_plan.solve_r_opt` and check it with
    :meth:`HybridModel.hybrid_assignment`).

    ``S[t, v]``: some tensor of ``v`` resident or arriving after stage
    ``t - 1`` ends (node ``t - 1``'s first run and the ``Free`` right after
    it).  A value the plan swaps in and reads in one stage is made a
    checkpoint of that stage, swapped in one stage earlier (the model waits
    for a swap-in at the end of its stage): more memory than the plan uses,
    which the check may then reject.  ``OFF[v]``: the plan swaps ``v`` out.

    Returns
    -------
    S, IN : ndarray of bool, shape (n, nv)
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
    swapped_in = np.zeros((n, nv), dtype=bool)   # a SwapIn of v issued in stage t
    read = np.zeros((n, nv), dtype=bool)          # v read in stage t
    made = np.zeros((n, nv), dtype=bool)          # v's producer ran in stage t
    resident: set[int] = set()
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
            resident.add(x)
            if x in tv:
                swapped_in[stage, tv[x]] = True
        elif ins.op == Op.COMPUTE:
            node = problem.nodes[x]
            for y in node.inputs:
                if y in tv:
                    read[stage, tv[y]] = True
            for y in node.outputs:
                resident.add(y)
                if y in tv:
                    made[stage, tv[y]] = True
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
    IN = np.zeros((n, nv), dtype=bool)
    swap_v = OFF & swappable_values(graph)
    for t in range(n):
        for v in np.flatnonzero(swap_v & ~S[t] & ~made[t]):
            if t + 1 < n and S[t + 1, v] and swapped_in[t, v]:
                IN[t, v] = True             # arrives for stage t + 1
            elif read[t, v] and t - 1 > graph.value_node[v] and not S[t - 1, v]:
                S[t, v] = True              # swapped in and read within stage t: arrive one stage earlier
                IN[t - 1, v] = True
    return S, IN, OFF
