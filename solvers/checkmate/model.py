"""Checkmate's rematerialization MILP over a :class:`~libra_opt.problem.RematProblem`.

Source: Jain et al., *Checkmate: Breaking the Memory Wall with Optimal Tensor
Rematerialization*, MLSys 2020, section 4 (the MILP: ``R``, ``S``, ``FREE``,
``U``; frontier-advancing stages; linearized ``FREE``; memory accounting) and
section 5 (its LP relaxation).  The formulation here is our own, written for
our IR; the reference implementation (``parasj/checkmate``,
``strategy_optimal_ilp.py``) was read to check the semantics.

Mapping of our IR to Checkmate (:class:`CheckmateGraph`)
--------------------------------------------------------
- **Stages and ``R``.**  Checkmate node ``i`` is our node ``i``; the eager
  order is the topological order, and stage ``t`` is the stage in which node
  ``t`` runs for the first time (frontier-advancing: ``R`` lower-triangular,
  ``R[t, t] = 1``).  ``R[t, i]``: node ``i`` runs in stage ``t``; running a
  node allocates all its outputs (a multi-output node sums them).
- **Values and ``S``.**  Checkmate keeps one value per node; our nodes may
  have several outputs with different lifetimes (an op's result and a mask
  saved for the backward), so by default (``values="tensor"``) ``S`` and
  ``FREE`` are per *value* = the outputs of a node that have the same users
  (``S[t, v]``: value ``v`` resident at the start of stage ``t``).  With one
  output per node this is Checkmate's formulation exactly; otherwise it is
  finer, never coarser.  ``values="node"`` is Checkmate's one value per node
  (all outputs kept and freed together: fewer variables, used on coarsened
  graphs).  A value's memory ``mem_bytes[v]`` is the bytes of the storages
  its tensors own (a view owns 0).  Outputs nobody reads ("dead") are
  allocated when the node runs and freed at once: charged only at the
  compute, together with the node's ``workspace_bytes``
  (``transient_bytes[i]``).
- **Views.**  A view keeps its base's storage alive.  We model this exactly:
  the value of a view is *tied* to the value of its storage's base,
  ``S[t, view] <= S[t, base]``, and every reader of a view (and the node
  making it) counts as a *user* of the base for the ``FREE`` hazards, so the
  storage's bytes, charged once through the base, are released only after
  the last use of any tensor on it: exactly as long as the simulator keeps it
  allocated under the plan of
  :func:`~libra_opt.solvers.checkmate_plan.schedule_from_rs`.
- Graph inputs (kind ``"input"``) are fixed memory: not values, not counted.
- **Step outputs.**  A storage holding a step output (the output itself or
  the base of an output view) stays allocated from its creation to the end:
  its bytes are the node's ``pinned_bytes``, charged from the node's first
  run on as a constant, and the node is never recomputed.  Step outputs are
  not values (they are always resident once computed).
- Non-recomputable nodes (RNG, mutation) have no ``R[t, i]`` for ``t != i``.
- Cost of node ``i`` is ``time_s``; the objective is the step's compute time,
  which for a recompute-only plan is the simulated step time.

Formulation (:class:`CheckmateModel`)
-------------------------------------
Variables (a variable that must be 0 is not created; one that must be 1 is
fixed by its bounds, never by a row):

- ``R[t, i]`` (``i <= t``), ``R[t, t]`` fixed to 1; created only while node
  ``i`` can still be needed (``t <= node_last_need[i]``, its largest
  descendant) and if it may be recomputed.
- ``S[t, v]`` for ``p(v) < t <= last_need[v]`` (``p(v)`` the producing node).
- ``U[t, k]``: memory (scaled) right after node ``k`` runs in stage ``t``,
  for every ``k`` with an ``R[t, k]`` variable; bounded by the budget.
- ``FREE[t, v, k]``: value ``v`` is freed right after node ``k`` in stage
  ``t`` (``k`` a user of ``v``, or for a node with several values, its
  producer: rerun for another value, this one may be dead at once).
- ``DUP[t, v]`` (nodes with several values): the node reran in stage ``t``
  while ``v`` was resident; the simulator holds the second copy only during
  the run, so it is released right after (``DUP <= S[t, v]``,
  ``DUP <= R[t, p(v)]``).

Constraints:

- ``S[t+1, v] <= S[t, v] + R[t, p(v)]`` (a checkpoint was kept or computed);
- ``R[t, j] <= R[t, p(v)] + S[t, v]`` for every value ``v`` that node ``j`` reads;
- ``S[t, view] <= S[t, base]`` for every view tie;
- memory recurrence ``U[t, k0] = sum_v M_v S[t, v] + A_k0 R[t, k0]``,
  ``U[t, k] = U[t, k'] + A_k R[t, k] - sum_v M_v FREE[t, v, k']
  - sum_v M_v DUP[t, v]`` (the latter for the values of ``k'``; ``A_k``
  the bytes of node ``k``'s values, ``k'`` the previous position),
  ``U[t, k] + X_k R[t, k] <= budget - P_t`` (transient bytes ``X``; ``P_t``
  the pinned bytes of nodes before ``t``, plus node ``t``'s own at ``k = t``);
- ``FREE`` linearized as the product
  ``R[t, k] (1 - S[t+1, v]) prod_{j users of v, k < j <= t} (1 - R[t, j])``:
  ``FREE <= R[t, k]``, ``FREE <= 1 - S[t+1, v]``, ``FREE <= 1 - R[t, j]``,
  and ``sum_k FREE[t, v, k] <= S[t, v] + R[t, p(v)]`` (freed at most once,
  only if resident).  This is the standard disaggregated linearization; it
  has the same integer solutions as the paper's aggregated one (with its
  ``kappa`` hazard counts) and a tighter LP relaxation.  The lower bound on
  ``FREE`` (forcing a free when no hazard remains) is omitted: freeing only
  helps the memory constraint, so an optimal solution frees where it must,
  and a solution that does not is still a valid (over-counted) plan.

Memory is scaled so that the budget is about 1024 units, keeping every
coefficient small; time is scaled by the mean node cost.

Restrictions (plans the simulator would accept but the model excludes):
recomputations run in node order within a stage, at most once per stage; a
node producing a step output is never rerun (the simulator would allow it,
with a transient copy of the output); a value is freed only right after a
user (or, for a multi-value node, its producer) runs, so a checkpoint that
stage ``t`` holds without using is charged through the stage (such an ``S``
is never optimal).  On small graphs the MILP optimum equals an exhaustive
search over all schedules with the same rule for step outputs
(``tests/test_checkmate.py``).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import scipy.sparse as sp

from libra_opt.errors import SolverError, SolverOptionError
from libra_opt.ir.problem import INPUT, RematProblem

log = logging.getLogger(__name__)

#: Scaled value of the memory budget (memory coefficients are bytes / (budget / MEMORY_UNITS)).
MEMORY_UNITS = 1024.0

#: Value granularities of :meth:`CheckmateGraph.from_problem`.
VALUE_GRANULARITIES = ("tensor", "node")

__all__ = ["CheckmateGraph", "CheckmateModel", "RowBuilder", "model_peak_bytes", "MEMORY_UNITS", "VALUE_GRANULARITIES"]


@dataclass(frozen=True, eq=False)
class CheckmateGraph:
    """A :class:`RematProblem` seen as Checkmate's graph of nodes and values.

    Build it with :meth:`from_problem`; the module docstring explains the
    mapping (values, views, dead storages, step outputs, non-recomputable nodes).

    Attributes
    ----------
    problem : RematProblem
    n : int
        Number of nodes (= stages).
    nv : int
        Number of values.
    value_tensors : tuple of tuple of int, length nv
        Tensor ids of each value.
    value_node : ndarray of int64, shape (nv,)
        The node producing each value (ascending).
    node_values : tuple of tuple of int, length n
        Values produced by each node.
    tensor_value : dict of int to int
        Tensor id -> value id (tensors that are values only).
    deps : tuple of tuple of int, length n
        ``deps[j]``: values node ``j`` reads (its inputs that are values).
    users : tuple of tuple of int, length nv
        ``users[v]``: nodes after which the value may be freed (its readers,
        and for a base, the makers and readers of views of its storage).
        Ascending, all after ``value_node[v]``.
    mem_bytes : ndarray of int64, shape (nv,)
        Bytes the value holds while resident (its storage if a base, 0 if a view).
    alloc_bytes : ndarray of int64, shape (n,)
        Bytes of a node's values (allocated when it runs).
    pinned_bytes : ndarray of int64, shape (n,)
        Bytes of storages the node owns that hold a step output: allocated at
        the node's first run and kept to the end.
    transient_bytes : ndarray of int64, shape (n,)
        Bytes allocated only while the node runs: workspace + dead outputs.
    cost_s : ndarray of float64, shape (n,)
        Compute time per node, seconds (a node's first computation).
    recompute_cost_s : ndarray of float64, shape (n,)
        Time of a recomputation per node under the problem's executor cost
        model (``problem.recompute_time``, :mod:`libra_opt.costs`), seconds:
        the objective's coefficient of ``R[t, i]`` for ``i < t``.
    recomputable : ndarray of bool, shape (n,)
        False for the problem's non-recomputable nodes and for nodes owning a
        storage that holds a step output.
    ties : tuple of (int, int)
        ``(view_value, base_value)``.
    node_last_need : ndarray of int64, shape (n,)
        Largest descendant of each node (itself if none): the last stage in
        which it may have to run.
    last_need : ndarray of int64, shape (nv,)
        Last stage in which the value can be needed.
    last_use : ndarray of int64, shape (nv,)
        Largest user (the producer if none): the no-remat plan frees it after that.
    needers : tuple of tuple of int, length num_tensors
        Per tensor: the nodes that read it.
    values : {"tensor", "node"}
        The value granularity it was built with.
    """

    problem: RematProblem
    n: int
    nv: int
    value_tensors: tuple
    value_node: np.ndarray
    node_values: tuple
    tensor_value: dict
    deps: tuple
    users: tuple
    mem_bytes: np.ndarray
    alloc_bytes: np.ndarray
    pinned_bytes: np.ndarray
    transient_bytes: np.ndarray
    cost_s: np.ndarray
    recomputable: np.ndarray
    ties: tuple
    node_last_need: np.ndarray
    last_need: np.ndarray
    last_use: np.ndarray
    needers: tuple
    values: str = "tensor"
    recompute_cost_s: np.ndarray | None = None

    @classmethod
    def from_problem(cls, problem: RematProblem, values: str = "tensor") -> "CheckmateGraph":
        """Map ``problem`` onto Checkmate's graph (see the module docstring).

        Parameters
        ----------
        problem : RematProblem
        values : {"tensor", "node"}
            ``"tensor"``: a node's outputs with the same users form one value
            (exact); ``"node"``: one value per node, as in Checkmate (fewer
            variables; a node's outputs are kept and freed together).

        Raises
        ------
        SolverOptionError
            Unknown ``values`` (also a ``ValueError``).
        """
        if values not in VALUE_GRANULARITIES:
            raise SolverOptionError(f"values must be one of {VALUE_GRANULARITIES}, got {values!r}")
        p = problem
        n = p.num_nodes
        tensors = p.tensors
        out = p.output_set
        needers: list[tuple[int, ...]] = [tuple(t.consumers) for t in tensors]
        pinned_storage = {st: any(x in out for x in views) for st, views in p.storage_views.items()}
        live_storage = {st: any(needers[x] or x in out for x in views) for st, views in p.storage_views.items()}
        transient = np.array([nd.workspace_bytes for nd in p.nodes], dtype=np.int64)
        pinned_b = np.zeros(n, dtype=np.int64)
        recomputable = np.array([nd.recomputable for nd in p.nodes], dtype=bool)
        groups: dict = {}
        tensor_users: dict[int, frozenset] = {}
        for node in p.nodes:
            for y in node.outputs:
                st = tensors[y].storage
                if st == y:
                    if pinned_storage[y]:
                        pinned_b[node.id] += tensors[y].nbytes
                        recomputable[node.id] = False
                    elif not live_storage[y]:
                        transient[node.id] += tensors[y].nbytes
                if y in out:
                    recomputable[node.id] = False
                    continue
                if not needers[y]:
                    continue
                u = set(needers[y])
                if st == y:  # the storage lives until the last use of any tensor on it
                    for w in p.storage_views[y]:
                        if w != y:
                            u.add(tensors[w].producer)
                            u.update(needers[w])
                u.discard(node.id)
                tensor_users[y] = frozenset(u)
                key = (node.id, tensor_users[y]) if values == "tensor" else node.id
                groups.setdefault(key, []).append(y)
        value_tensors = [tuple(ys) for ys in groups.values()]
        nv = len(value_tensors)
        tensor_value = {y: v for v, ys in enumerate(value_tensors) for y in ys}
        value_node = np.array([tensors[ys[0]].producer for ys in value_tensors], dtype=np.int64)
        mem = np.array([sum(tensors[y].nbytes for y in ys if tensors[y].storage == y and not pinned_storage[y])
                        for ys in value_tensors], dtype=np.int64)
        node_values: list[list[int]] = [[] for _ in range(n)]
        for v, i in enumerate(value_node):
            node_values[i].append(v)
        alloc = np.zeros(n, dtype=np.int64)
        np.add.at(alloc, value_node, mem)
        deps = [tuple(sorted({tensor_value[x] for x in nd.inputs if x in tensor_value})) for nd in p.nodes]
        users = [sorted(set().union(*(tensor_users[y] for y in ys))) for ys in value_tensors]
        ties: set[tuple[int, int]] = set()
        for v, ys in enumerate(value_tensors):
            for y in ys:
                st = tensors[y].storage
                if st != y and tensors[st].kind != INPUT and not pinned_storage[st]:
                    # the IR requires a view's maker to read a tensor on its storage, so the base is read
                    # (a value) and its producer is an ancestor
                    if st not in tensor_value:
                        raise SolverError(f"view {tensors[y].name!r}: its base {tensors[st].name!r} is read by "
                                          f"no node; the problem breaks the IR's view rule")
                    if tensor_value[st] != v:
                        ties.add((v, tensor_value[st]))
        node_last_need = np.arange(n, dtype=np.int64)
        readers: list[set[int]] = [set() for _ in range(n)]
        for j in range(n):
            for v in deps[j]:
                readers[value_node[v]].add(j)
        for i in range(n - 1, -1, -1):
            for j in readers[i]:
                node_last_need[i] = max(node_last_need[i], node_last_need[j])
        last_need = np.array([max([node_last_need[j] for y in ys for j in needers[y]], default=int(value_node[v]))
                              for v, ys in enumerate(value_tensors)], dtype=np.int64)
        for view, base in sorted(ties, reverse=True):
            last_need[base] = max(last_need[base], last_need[view])
        last_use = np.array([users[v][-1] if users[v] else int(value_node[v]) for v in range(nv)], dtype=np.int64)
        return cls(problem=p, n=n, nv=nv, value_tensors=tuple(value_tensors), value_node=value_node,
                   node_values=tuple(tuple(v) for v in node_values), tensor_value=tensor_value, deps=tuple(deps),
                   users=tuple(tuple(u) for u in users), mem_bytes=mem, alloc_bytes=alloc, pinned_bytes=pinned_b,
                   transient_bytes=transient, cost_s=p.node_time.copy(), recomputable=recomputable,
                   ties=tuple(sorted(ties)), node_last_need=node_last_need, last_need=last_need, last_use=last_use,
                   needers=tuple(needers), values=values, recompute_cost_s=p.recompute_time.copy())

    # ------------------------------------------------------------------ derived
    @cached_property
    def multi_value(self) -> np.ndarray:
        """Nodes with more than one value, shape (n,) bool: rerunning one of
        them can be worthwhile while some of its values are resident."""
        return np.array([len(v) > 1 for v in self.node_values], dtype=bool)

    @cached_property
    def freeable_at(self) -> tuple[tuple[int, ...], ...]:
        """``freeable_at[k]``: values holding bytes that may be freed right
        after node ``k``: those ``k`` uses, and a multi-value node's own
        values (rerun for another of its values, one may be dead at once)."""
        out: list[list[int]] = [[] for _ in range(self.n)]
        for v in range(self.nv):
            if self.mem_bytes[v] > 0:
                for k in self.users[v]:
                    out[k].append(v)
                if self.multi_value[self.value_node[v]]:
                    out[self.value_node[v]].append(v)
        return tuple(tuple(sorted(x)) for x in out)

    def duplicates(self, k: int) -> tuple[int, ...]:
        """Values of node ``k`` whose second copy, made when ``k`` reruns
        while they are resident, the model releases right after ``k``."""
        if not self.multi_value[k]:
            return ()
        return tuple(v for v in self.node_values[k] if self.mem_bytes[v] > 0)

    @cached_property
    def pinned_before(self) -> np.ndarray:
        """``pinned_before[t]``: pinned bytes of nodes ``< t`` (resident all
        through stage ``t``), shape (n + 1,)."""
        return np.concatenate([[0], np.cumsum(self.pinned_bytes)]).astype(np.int64)

    def r_exists(self, t: int, i: int) -> bool:
        """True if ``R[t, i]`` can be 1 (a variable of the model)."""
        if i == t:
            return True
        return i < t and bool(self.recomputable[i]) and t <= self.node_last_need[i]

    def s_exists(self, t: int, v: int) -> bool:
        """True if ``S[t, v]`` can be 1."""
        return self.value_node[v] < t <= self.last_need[v]

    def min_stage_bytes(self) -> int:
        """A necessary budget (bytes): at stage ``t``, node ``t``'s outputs,
        pinned and transient bytes, the values it reads and the pinned bytes
        of earlier nodes are all resident at once."""
        best = 0
        M = self.mem_bytes
        for t in range(self.n):
            need = (self.alloc_bytes[t] + self.pinned_bytes[t] + self.transient_bytes[t] + self.pinned_before[t]
                    + sum(int(M[v]) for v in self.deps[t]))
            best = max(best, int(need))
        return best

    def empty_s(self) -> np.ndarray:
        """An all-False ``S``, shape (n, nv)."""
        return np.zeros((self.n, self.nv), dtype=bool)


def _frees(graph: CheckmateGraph, R: np.ndarray, S: np.ndarray, t: int, k: int, computed: set) -> list[int]:
    """Values the model frees right after node ``k`` in stage ``t`` (FREE at
    its largest allowed value)."""
    n = graph.n
    out = []
    for v in graph.freeable_at[k]:
        if not (S[t, v] or R[t, graph.value_node[v]]):
            continue
        if t + 1 < n and S[t + 1, v]:
            continue
        if any(k < j <= t and j in computed for j in graph.users[v]):
            continue
        out.append(v)
    return out


def model_peak_bytes(graph: CheckmateGraph, R: np.ndarray, S: np.ndarray) -> int:
    """Peak memory of an integral ``(R, S)`` under the model's accounting (bytes).

    Parameters
    ----------
    graph : CheckmateGraph
    R : ndarray of bool, shape (n, n)
    S : ndarray of bool, shape (n, nv)

    Returns
    -------
    int
        The largest ``U[t, k] + transient_bytes[k]`` (plus pinned bytes) over
        computed ``(t, k)``, with ``FREE`` at its largest allowed value.  The
        simulated peak of
        :func:`~libra_opt.solvers.checkmate_plan.schedule_from_rs`'s plan is
        never above it.
    """
    M, X, A = graph.mem_bytes, graph.transient_bytes, graph.alloc_bytes
    peak = 0
    for t in range(graph.n):
        cur = int(M[S[t]].sum()) + int(graph.pinned_before[t])
        positions = [int(k) for k in np.flatnonzero(R[t, :t + 1])]
        computed = set(positions)
        for k in positions:
            cur += int(A[k]) + (int(graph.pinned_bytes[t]) if k == t else 0)
            peak = max(peak, cur + int(X[k]))
            cur -= sum(int(M[v]) for v in _frees(graph, R, S, t, k, computed))
            if k != t:
                cur -= sum(int(M[v]) for v in graph.duplicates(k) if S[t, v])
    return peak


class RowBuilder:
    """Columns and rows of a linear program as they are appended: the one
    builder of :class:`CheckmateModel` and of its extensions
    (:class:`~libra_opt.solvers.hybrid_model.HybridModel`).

    Parameters
    ----------
    lb, ub, obj, integer : list, optional
        Columns already there (bounds, objective coefficient, integrality);
        :meth:`new_var` appends to them.
    first_row : int
        Index of the first row :meth:`add_row` appends (the rows of the model
        being extended come before it).

    Attributes
    ----------
    rows, cols, vals : list
        The nonzeros appended (row index, column index, coefficient).
    row_lb, row_ub : list of float
        Bounds of the appended rows (``row_lb <= A x <= row_ub``).
    """

    def __init__(self, lb=None, ub=None, obj=None, integer=None, first_row: int = 0):
        self.lb: list[float] = [] if lb is None else list(lb)
        self.ub: list[float] = [] if ub is None else list(ub)
        self.obj: list[float] = [] if obj is None else list(obj)
        self.integer: list[bool] = [] if integer is None else list(integer)
        self.first_row = first_row
        self.rows: list[int] = []
        self.cols: list[int] = []
        self.vals: list[float] = []
        self.row_lb: list[float] = []
        self.row_ub: list[float] = []

    def new_var(self, lo: float, hi: float, c: float, is_int: bool) -> int:
        """Append a column with bounds ``[lo, hi]`` and objective coefficient
        ``c``; returns its index."""
        self.lb.append(lo)
        self.ub.append(hi)
        self.obj.append(c)
        self.integer.append(is_int)
        return len(self.lb) - 1

    def add_row(self, terms, lo: float, hi: float) -> None:
        """Append the row ``lo <= sum(coef * x[col] for col, coef in terms) <= hi``."""
        r = self.first_row + len(self.row_lb)
        rows, cols, vals = self.rows, self.cols, self.vals
        for c, v in terms:
            rows.append(r)
            cols.append(c)
            vals.append(v)
        self.row_lb.append(lo)
        self.row_ub.append(hi)

    def add_to_row(self, r: int, c: int, v: float) -> None:
        """Add the term ``v * x[c]`` to row ``r`` (an appended row or one of
        the model being extended)."""
        self.rows.append(r)
        self.cols.append(c)
        self.vals.append(v)

    def matrix(self, num_rows: int, num_vars: int) -> sp.csr_matrix:
        """The appended nonzeros as a CSR matrix of shape ``(num_rows, num_vars)``
        (duplicates summed)."""
        return sp.csr_matrix((np.asarray(self.vals, dtype=np.float64), (np.asarray(self.rows, dtype=np.int64),
                             np.asarray(self.cols, dtype=np.int64))), shape=(num_rows, num_vars))


class CheckmateModel:
    """Checkmate's MILP (or its LP relaxation) in matrix form.

    Parameters
    ----------
    graph : CheckmateGraph
    budget_bytes : int
        Memory budget for graph memory, bytes.
    integral : bool
        ``R``, ``S`` and ``FREE`` binary (MILP) or in ``[0, 1]`` (LP).

    Attributes
    ----------
    num_vars, num_rows : int
    lb, ub, obj : ndarray, shape (num_vars,)
        Bounds and (scaled) objective coefficients.
    integer : ndarray of bool, shape (num_vars,)
    A : scipy.sparse.csr_matrix, shape (num_rows, num_vars)
    row_lb, row_ub : ndarray, shape (num_rows,)
        ``row_lb <= A x <= row_ub`` (``-inf``/``inf`` for one-sided rows).
    r_idx : ndarray of int64, shape (n, n)
    s_idx : ndarray of int64, shape (n, nv)
        Variable index of ``R[t, i]`` / ``S[t, v]``, -1 where the variable is
        identically 0.
    mem_scale : float
        Bytes per memory unit.
    time_scale : float
        Seconds per objective unit.
    infeasible_reason : str or None
        Set when the budget is below what some stage needs by bounds alone
        (:meth:`CheckmateGraph.min_stage_bytes`); the model is then not built.

    Raises
    ------
    SolverError
        The graph is inconsistent (a stage cannot get a value it reads).
    """

    def __init__(self, graph: CheckmateGraph, budget_bytes: int, *, integral: bool = True):
        self.graph = graph
        self.budget_bytes = int(budget_bytes)
        self.integral = integral
        g = graph
        n, nv = g.n, g.nv
        self.mem_scale = max(float(budget_bytes), float(g.alloc_bytes.max(initial=0)), 1.0) / MEMORY_UNITS
        pos = g.cost_s[g.cost_s > 0]
        self.time_scale = float(pos.mean()) if pos.size else 1.0
        self.budget_units = float(budget_bytes) / self.mem_scale
        self.r_idx = np.full((n, n), -1, dtype=np.int64)
        self.s_idx = np.full((n, nv), -1, dtype=np.int64)
        self.u_vars: list[tuple[int, int, int]] = []
        self.free_vars: list[tuple[int, int, int, int]] = []
        self.dup_vars: list[tuple[int, int, int]] = []
        self.infeasible_reason: str | None = None
        #: row of ``S[t+1, v] <= S[t, v] + R[t, p(v)]`` per ``(t, v)``; the first memory row
        #: (``U[t, k0] = ...``) per stage ``t``; the rows ``R[t, j] <= R[t, p(v)] + S[t, v]`` and
        #: ``sum_k FREE[t, v, k] <= S[t, v] + R[t, p(v)]`` per ``(t, v)``: extensions
        #: (``hybrid_model``) add terms to them
        self.persist_rows: dict[tuple[int, int], int] = {}
        self.stage_rows: dict[int, int] = {}
        self.dep_rows: dict[tuple[int, int], list[int]] = {}
        self.free_sum_rows: dict[tuple[int, int], int] = {}
        need = g.min_stage_bytes()
        if need > budget_bytes:
            self.infeasible_reason = (f"some stage needs at least {need} bytes (a node, the values it reads, its "
                                      f"transient bytes and the step outputs produced before it)")
            self.num_vars = self.num_rows = 0
            return
        self._build()

    def _build(self) -> None:
        g = self.graph
        n, nv = g.n, g.nv
        integral = self.integral
        budget = self.budget_units
        m = g.mem_bytes.astype(np.float64) / self.mem_scale
        a = g.alloc_bytes.astype(np.float64) / self.mem_scale
        x = g.transient_bytes.astype(np.float64) / self.mem_scale
        pinned_before = g.pinned_before.astype(np.float64) / self.mem_scale
        pinned_own = g.pinned_bytes.astype(np.float64) / self.mem_scale
        vnode = g.value_node
        lp = RowBuilder()
        lb, row_lb = lp.lb, lp.row_lb
        new_var, add_row = lp.new_var, lp.add_row

        r_idx, s_idx = self.r_idx, self.s_idx
        for t in range(n):
            for i in range(t + 1):
                if g.r_exists(t, i):
                    cost = g.cost_s[i] if i == t or g.recompute_cost_s is None else g.recompute_cost_s[i]
                    r_idx[t, i] = new_var(1.0 if i == t else 0.0, 1.0, cost / self.time_scale, integral)
        for t in range(1, n):
            for v in range(nv):
                if g.s_exists(t, v):
                    s_idx[t, v] = new_var(0.0, 1.0, 0.0, integral)
        self.num_rs_vars = len(lb)
        inf = np.inf

        def terms_r_s(t: int, v: int, sign: float) -> list:
            out = []
            if r_idx[t, vnode[v]] >= 0:
                out.append((r_idx[t, vnode[v]], sign))
            if s_idx[t, v] >= 0:
                out.append((s_idx[t, v], sign))
            return out

        # S persistence: S[t+1, v] <= S[t, v] + R[t, p(v)]
        for t in range(n - 1):
            for v in range(nv):
                s_next = s_idx[t + 1, v]
                if s_next < 0 or vnode[v] == t:  # computed in its own stage: R[t, t] = 1
                    continue
                self.persist_rows[(t, v)] = len(row_lb)
                add_row([(s_next, 1.0)] + terms_r_s(t, v, -1.0), -inf, 0.0)
        # dependencies: R[t, j] <= R[t, p(v)] + S[t, v]
        for t in range(n):
            for j in range(t + 1):
                rj = r_idx[t, j]
                if rj < 0:
                    continue
                for v in g.deps[j]:
                    more = terms_r_s(t, v, -1.0)
                    if not more and j == t:
                        raise SolverError(f"Checkmate model: node {j} reads value {v} in stage {t} but it can be "
                                          f"neither kept nor recomputed there; this is a bug")
                    self.dep_rows.setdefault((t, v), []).append(len(row_lb))
                    add_row([(rj, 1.0)] + more, -inf, 0.0)
        # view ties: S[t, view] <= S[t, base]
        for view, base in g.ties:
            for t in range(n):
                sv = s_idx[t, view]
                if sv < 0:
                    continue
                if s_idx[t, base] >= 0:
                    add_row([(sv, 1.0), (s_idx[t, base], -1.0)], -inf, 0.0)
                else:
                    ub[sv] = 0.0
        # memory: U chain over the positions with an R variable, FREE between positions
        for t in range(n):
            positions = [k for k in range(t + 1) if r_idx[t, k] >= 0]
            room = budget - pinned_before[t]
            prev_u = prev_k = -1
            for k in positions:
                u_ub = room - ((x[k] + pinned_own[t]) if k == t else 0.0)
                u = new_var(0.0, max(u_ub, 0.0), 0.0, False)
                self.u_vars.append((t, k, u))
                terms = [(u, 1.0), (r_idx[t, k], -a[k])]
                if prev_u < 0:
                    terms += [(s_idx[t, v], -m[v]) for v in range(nv) if s_idx[t, v] >= 0 and m[v] > 0]
                else:
                    terms.append((prev_u, -1.0))
                    for v in g.freeable_at[prev_k]:
                        f = self._free_var(t, v, prev_k, new_var, add_row)
                        if f >= 0:
                            terms.append((f, m[v]))
                    if prev_k != t:
                        for v in g.duplicates(prev_k):
                            if s_idx[t, v] >= 0:  # DUP <= S[t, v], DUP <= R[t, p(v)]: the rerun's copy goes
                                d = new_var(0.0, 1.0, 0.0, False)
                                self.dup_vars.append((t, v, d))
                                add_row([(d, 1.0), (s_idx[t, v], -1.0)], -inf, 0.0)
                                add_row([(d, 1.0), (r_idx[t, prev_k], -1.0)], -inf, 0.0)
                                terms.append((d, m[v]))
                if prev_u < 0:
                    self.stage_rows[t] = len(row_lb)
                add_row(terms, 0.0, 0.0)
                if k != t and x[k] > 0:
                    add_row([(u, 1.0), (r_idx[t, k], x[k])], -inf, room)
                prev_u, prev_k = u, k
        # each value freed at most once per stage, and only if resident
        by_tv: dict[tuple[int, int], list[int]] = {}
        for t, v, _k, f in self.free_vars:
            by_tv.setdefault((t, v), []).append(f)
        for (t, v), fs in by_tv.items():
            self.free_sum_rows[(t, v)] = len(row_lb)
            add_row([(f, 1.0) for f in fs] + terms_r_s(t, v, -1.0), -inf, 0.0)

        self.num_vars = len(lb)
        self.num_rows = len(row_lb)
        self.lb = np.asarray(lb, dtype=np.float64)
        self.ub = np.asarray(lp.ub, dtype=np.float64)
        self.obj = np.asarray(lp.obj, dtype=np.float64)
        self.integer = np.asarray(lp.integer, dtype=bool)
        self.A = lp.matrix(self.num_rows, self.num_vars)
        self.row_lb = np.asarray(row_lb, dtype=np.float64)
        self.row_ub = np.asarray(lp.row_ub, dtype=np.float64)
        log.debug("Checkmate model: %d nodes, %d values, %d variables, %d rows, %d nonzeros", n, nv, self.num_vars,
                  self.num_rows, self.A.nnz)

    def _free_var(self, t: int, v: int, k: int, new_var, add_row) -> int:
        """Create ``FREE[t, v, k]`` with its rows; -1 if it is identically 0."""
        g = self.graph
        r_idx, s_idx = self.r_idx, self.s_idx
        if r_idx[t, g.value_node[v]] < 0 and s_idx[t, v] < 0:
            return -1
        later = [j for j in g.users[v] if k < j <= t]
        if t in later:  # node t (run in every stage t) still needs it
            return -1
        f = new_var(0.0, 1.0, 0.0, self.integral)
        add_row([(f, 1.0), (r_idx[t, k], -1.0)], -np.inf, 0.0)
        if t + 1 < g.n and s_idx[t + 1, v] >= 0:
            add_row([(f, 1.0), (s_idx[t + 1, v], 1.0)], -np.inf, 1.0)
        for j in later:
            if r_idx[t, j] >= 0:
                add_row([(f, 1.0), (r_idx[t, j], 1.0)], -np.inf, 1.0)
        self.free_vars.append((t, v, k, f))
        return f

    # -------------------------------------------------------------- results
    def objective_seconds(self, value: float) -> float:
        """Scaled objective value -> seconds of compute."""
        return float(value) * self.time_scale

    def fractional_rs(self, xv: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(R, S)`` as float arrays of shapes (n, n) and (n, nv) from a solution vector."""
        g = self.graph
        R = np.zeros((g.n, g.n))
        S = np.zeros((g.n, g.nv))
        mask = self.r_idx >= 0
        R[mask] = xv[self.r_idx[mask]]
        mask = self.s_idx >= 0
        S[mask] = xv[self.s_idx[mask]]
        return np.clip(R, 0.0, 1.0), np.clip(S, 0.0, 1.0)

    def decode(self, xv: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Integral ``(R, S)`` (bool arrays) from an integral solution vector."""
        R, S = self.fractional_rs(xv)
        return R > 0.5, S > 0.5

    def assignment(self, R: np.ndarray, S: np.ndarray) -> np.ndarray:
        """A full solution vector for integral ``(R, S)`` (``U`` and ``FREE``
        at their implied values), e.g. for a warm start.

        Parameters
        ----------
        R : ndarray of bool, shape (n, n)
        S : ndarray of bool, shape (n, nv)

        Returns
        -------
        ndarray, shape (num_vars,)
        """
        g = self.graph
        xv = np.zeros(self.num_vars)
        mask = self.r_idx >= 0
        xv[self.r_idx[mask]] = R[mask]
        mask = self.s_idx >= 0
        xv[self.s_idx[mask]] = S[mask]
        freed: set[tuple[int, int, int]] = set()
        for t in range(g.n):
            computed = set(int(k) for k in np.flatnonzero(R[t, :t + 1]))
            for k in computed:
                for v in _frees(g, R, S, t, k, computed):
                    freed.add((t, v, k))
        for t, v, k, f in self.free_vars:
            xv[f] = 1.0 if (t, v, k) in freed else 0.0
        dup: set[tuple[int, int]] = set()
        for t, v, d in self.dup_vars:
            if S[t, v] and R[t, g.value_node[v]]:
                xv[d] = 1.0
                dup.add((t, v))
        m = g.mem_bytes.astype(np.float64) / self.mem_scale
        a = g.alloc_bytes.astype(np.float64) / self.mem_scale
        cur = 0.0
        prev = (-1, -1)
        for t, k, u in self.u_vars:
            if t != prev[0]:
                cur = float(m[S[t]].sum())
            else:
                cur -= sum(m[v] for v in g.freeable_at[prev[1]] if (t, v, prev[1]) in freed)
                cur -= sum(m[v] for v in g.duplicates(prev[1]) if (t, v) in dup)
            cur += a[k] * float(R[t, k])
            xv[u] = cur
            prev = (t, k)
        return xv
