"""Lower bounds on the memory any plan of a problem needs.

:func:`memory_lower_bound` is the smallest graph-memory budget that could
possibly be met: below it every solver must answer "infeasible", and a solver
that reports a smaller ``min_feasible_bytes`` is wrong.

Source: the standard argument of the rematerialization literature that an op
needs its operands and results resident while it runs (Checkmate, Jain et
al., MLSys 2020, sec. 4: the memory of stage t at op t includes its
dependencies and its output), applied to the accounting of
:mod:`libra_opt.simulator` (per storage, workspace transient, step outputs
never freed).
"""
from __future__ import annotations

import numpy as np

from ..ir.problem import INPUT, RematProblem

__all__ = ["memory_lower_bound", "node_memory_lower_bounds"]


def node_memory_lower_bounds(problem: RematProblem) -> np.ndarray:
    """Per node, graph memory that must be allocated whenever it runs (bytes).

    For node ``v`` the bound is the bytes of the union of the storages of

    - its activation inputs (they must be resident or swapped in),
    - its outputs (allocated when it starts; a view's base storage too),
    - every step output produced by a strict ancestor of ``v`` (an ancestor
      ran before ``v``; a step output, once produced, can never be freed),

    counting each storage once, plus ``v``'s transient workspace.  Graph
    inputs (parameters, user inputs, tangents) are fixed memory and excluded.

    Parameters
    ----------
    problem : RematProblem

    Returns
    -------
    ndarray of int64, shape (num_nodes,)
        Bytes; a fresh copy of the bounds computed once per problem (kept
        with ``problem.tables``, :meth:`~libra_opt.ir.tables.ProblemTables.memo`).
    """
    return problem.tables.memo("bounds.node_memory_lower_bounds", lambda: _node_bounds(problem)).copy()


def _node_bounds(problem: RematProblem) -> np.ndarray:
    """:func:`node_memory_lower_bounds`, computed (read-only array)."""
    tensors = problem.tensors
    tab = problem.tables
    storage, nbytes, t_input = tab.t_storage, tab.t_nbytes, tab.t_input
    # A storage is graph memory unless its BASE is an input: an activation
    # that is a view of an input costs nothing (as in the simulator).
    is_graph = [not t_input[s] for s in storage]
    # Columns: storages holding a step output (activation kind).
    out_storages = sorted({storage[o] for o in problem.outputs if is_graph[o]})
    col = {s: k for k, s in enumerate(out_storages)}
    col_bytes = np.array([nbytes[s] for s in out_storages], dtype=np.int64)
    n = len(problem.nodes)
    # own[v]: output storages node v produces; anc[v]: those produced by strict ancestors of v.
    anc = np.zeros((n, len(out_storages)), dtype=bool)
    own = np.zeros_like(anc)
    for o in problem.outputs:
        if is_graph[o]:
            own[tensors[o].producer, col[storage[o]]] = True
    bounds = np.zeros(n, dtype=np.int64)
    for node in problem.nodes:
        v = node.id
        for t in node.inputs:
            p = tensors[t].producer
            if p is not None:
                anc[v] |= anc[p] | own[p]
        touched = {storage[t] for t in (*node.inputs, *node.outputs) if is_graph[t]}
        extra = sum(nbytes[s] for s in touched if not (s in col and anc[v, col[s]]))
        bounds[v] = int(col_bytes[anc[v]].sum()) + extra + node.workspace_bytes
    bounds.setflags(write=False)
    return bounds


def memory_lower_bound(problem: RematProblem) -> int:
    """A graph-memory budget no plan of ``problem`` can go under (bytes).

    The maximum of

    - over every node, :func:`node_memory_lower_bounds`: the storages of its
      activation inputs and outputs, plus the step outputs its ancestors have
      produced (never freeable), each storage counted once, plus its
      workspace;
    - the storages of all step outputs together (all resident at the end).

    It holds for any plan the simulator accepts (any order, recomputation or
    swapping), so it is a valid bound for every solver; it is usually well
    under the true minimum (it ignores what must be kept between ops).

    Parameters
    ----------
    problem : RematProblem

    Returns
    -------
    int
        Bytes, comparable with :attr:`SimulationResult.peak_bytes` and with
        budgets; 0 for an empty problem.  Computed once per problem (kept
        with ``problem.tables``).
    """
    return problem.tables.memo("bounds.memory_lower_bound", lambda: _bound(problem))


def _bound(problem: RematProblem) -> int:
    """:func:`memory_lower_bound`, computed."""
    tensors = problem.tensors
    at_end = sum(tensors[s].nbytes for s in {tensors[o].storage for o in problem.outputs}
                 if tensors[s].kind != INPUT)
    per_node = problem.tables.memo("bounds.node_memory_lower_bounds", lambda: _node_bounds(problem))
    return int(max(at_end, int(per_node.max()) if len(per_node) else 0))
