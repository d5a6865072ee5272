"""From Checkmate's ``R``/``S`` matrices to our :class:`~libra_opt.schedule.Schedule`.

Source: Jain et al., *Checkmate*, MLSys 2020, section 4.1 (a schedule is
read off ``R`` and ``S`` stage by stage, values freed per ``FREE``) and
section 5.2 (two-phase rounding: round ``S``, then derive the cheapest ``R``,
``solve_r_opt``).  Written after reading ``parasj/checkmate``
``checkmate/core/utils/scheduler.py`` and ``solver_common.py``; our own code.

- :func:`solve_r_opt`: the cheapest ``R`` for a given ``S`` (Checkmate's
  closed form: compute what the next stage's checkpoints and this stage's
  node need, backwards through the dependencies).
- :func:`rs_from_s`: ``S`` completed so that it is valid for our IR (step
  outputs kept, non-recomputable values kept instead of recomputed, view ties
  respected), then ``R`` derived.
- :func:`schedule_from_rs`: stage ``t`` runs the recomputations ``R[t, i]``
  in node order and then node ``t``; each tensor is freed right after its
  last use in the stage unless its node is a checkpoint of the next stage
  (``S[t+1, i]``) or it is a step output; values resident at the start of a
  stage that the stage does not use and the next does not keep are freed
  first, as Checkmate's scheduler does.  The simulated peak of this plan is
  never above :func:`~libra_opt.solvers.checkmate_model.model_peak_bytes`.
- :func:`keep_all_s` / :func:`recompute_forward_s`: two heuristic plans (no
  rematerialization; recompute every forward value where it is used), used to warm-start
  the MILP and to report the smallest feasible budget found.
- :func:`s_from_schedule`: the checkpoints ``S`` of any recompute-only plan
  (e.g. libra's), on the model's graph, coarsened or not: with
  :func:`rs_from_s` it turns libra's plan into a MILP starting solution
  (:meth:`CheckmateSetup.libra_plans`).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from libra_opt.errors import InfeasibleBudgetError, LibraOptError, SolverError, SolverOptionError
from libra_opt.ir.problem import INPUT, RematProblem
from libra_opt.ir.schedule import Compute, Free, Schedule, SwapIn, SwapOut, Wait
from libra_opt.passes.simulator import simulate

from .model import VALUE_GRANULARITIES, CheckmateGraph

log = logging.getLogger(__name__)

__all__ = ["solve_r_opt", "rs_from_s", "s_mask", "schedule_from_rs", "keep_all_s", "recompute_forward_s", "Candidate",
           "CheckmateSetup", "no_remat_if_fits", "no_remat_solution", "s_from_schedule"]


def solve_r_opt(graph: CheckmateGraph, S: np.ndarray, arrived: np.ndarray | None = None,
                present: np.ndarray | None = None) -> np.ndarray:
    """The cheapest recomputation matrix for the checkpoints ``S``.

    ``R[t, t] = 1``; node ``p(v)`` runs in stage ``t`` where value ``v`` is a
    checkpoint of stage ``t + 1`` but not of stage ``t``; then, backwards from
    node ``t``, the producer of every value a running node reads that is not
    a checkpoint of stage ``t`` runs too.  This is the least ``R`` satisfying
    the MILP's ``R``/``S`` constraints for this ``S`` (Checkmate section 5.2,
    ``solve_r_opt``).

    Parameters
    ----------
    graph : CheckmateGraph
    S : ndarray of bool, shape (n, nv)
    arrived : ndarray of bool, shape (n, nv), optional
        ``arrived[t, v]``: value ``v`` is swapped in during stage ``t``
        (:mod:`~libra_opt.solvers.hybrid_model`), so it is a checkpoint of
        stage ``t + 1`` without running its producer.
    present : ndarray of bool, shape (n, nv), optional
        ``present[t, v]``: value ``v`` is swapped in at the start of stage
        ``t`` and usable there like a checkpoint of stage ``t``.

    Returns
    -------
    ndarray of bool, shape (n, n)
        Lower-triangular with a unit diagonal.
    """
    n = graph.n
    R = np.eye(n, dtype=bool)
    vnode = graph.value_node
    if n > 1 and graph.nv:
        new = S[1:] & ~S[:-1]
        for extra in (arrived, present):
            if extra is not None:
                new &= ~extra[:-1]
        t_idx, v_idx = np.nonzero(new)
        R[t_idx, vnode[v_idx]] = True
    deps = graph.deps
    for t in range(n):
        row_r, row_s = R[t], (S[t] if present is None else S[t] | present[t])
        for j in range(t, -1, -1):
            if row_r[j]:
                for v in deps[j]:
                    if not row_s[v]:
                        row_r[vnode[v]] = True
    return R


def rs_from_s(graph: CheckmateGraph, S: np.ndarray, *, max_rounds: int = 1000) -> tuple[np.ndarray, np.ndarray]:
    """Complete ``S`` for our IR and derive ``R`` with :func:`solve_r_opt`.

    Completion: ``S`` restricted to where the model has variables (a value
    after its producer's stage, up to its last possible use); view ties
    ``S[t, base] >= S[t, view]``; and wherever ``R`` would rerun a node that
    must not be recomputed (``graph.recomputable``), its values are kept
    instead from its first run to that stage.  Repeated until stable.

    Parameters
    ----------
    graph : CheckmateGraph
    S : ndarray of bool or float, shape (n, nv)
        For floats, values > 0.5 are checkpoints.

    Returns
    -------
    R : ndarray of bool, shape (n, n)
    S : ndarray of bool, shape (n, nv)
    """
    n = graph.n
    S = np.asarray(S)
    S = (S > 0.5 if S.dtype != bool else S.copy()) & s_mask(graph)
    ties = sorted(graph.ties, reverse=True)
    nonrec = ~graph.recomputable
    off_diag = ~np.eye(n, dtype=bool)
    for _ in range(max_rounds):
        for view, base in ties:
            S[:, base] |= S[:, view]
        R = solve_r_opt(graph, S)
        bad = np.argwhere(R & nonrec[None, :] & off_diag)
        if bad.size == 0:
            return R, S
        for t, i in bad:
            for v in graph.node_values[i]:
                S[i + 1:t + 1, v] = True
    raise SolverError("could not complete the checkpoint matrix S (non-recomputable nodes); this is a bug")


def s_mask(graph: CheckmateGraph) -> np.ndarray:
    """Where ``S`` may be 1: ``value_node[v] < t <= last_need[v]``, shape (n, nv)."""
    t = np.arange(graph.n)[:, None]
    return (t > graph.value_node[None, :]) & (t <= graph.last_need[None, :])


def keep_all_s(graph: CheckmateGraph) -> np.ndarray:
    """``S`` of the no-rematerialization plan: every value kept from its
    computation to its last use.

    Returns
    -------
    ndarray of bool, shape (n, nv)
    """
    t = np.arange(graph.n)[:, None]
    return (t > graph.value_node[None, :]) & (t <= graph.last_use[None, :])


def recompute_forward_s(graph: CheckmateGraph) -> np.ndarray:
    """``S`` of the recompute-forward plan: backward values are kept from
    their computation to their last use, as without rematerialization, and
    every forward value is recomputed wherever it is used (from the graph
    inputs, freed after its last use in the stage).  What cannot be
    recomputed is kept by :func:`rs_from_s`.  On a graph without a backward
    phase this is the recompute-everything plan.

    Returns
    -------
    ndarray of bool, shape (n, nv)
    """
    from libra_opt.ir.problem import BACKWARD

    backward = np.array([graph.problem.nodes[i].phase == BACKWARD for i in graph.value_node], dtype=bool)
    return keep_all_s(graph) & backward[None, :]


def s_from_schedule(graph: CheckmateGraph, schedule: Schedule, coarse=None) -> np.ndarray:
    """The checkpoint matrix ``S`` of a recompute-only plan.

    Stage ``t`` of the model ends when node ``t`` (on a coarsened graph: the
    last member of coarse node ``t``) runs for the first time; ``S[t, v]``
    is 1 where value ``v`` (any tensor it stands for) is resident right after
    the end of stage ``t - 1``, after the ``Free`` instructions that follow
    it.  Complete it with :func:`rs_from_s` for a plan of the model; that
    plan recomputes no more than ``schedule`` does for the same checkpoints
    (``R`` is the least one for ``S``).

    Parameters
    ----------
    graph : CheckmateGraph
        The model's graph (on ``coarse.problem`` if ``coarse`` is given).
    schedule : Schedule
        A plan on the original problem with ``Compute`` / ``Free``
        instructions only, first computations in node order.
    coarse : CoarseProblem, optional
        The coarsening ``graph`` was built on.

    Returns
    -------
    ndarray of bool, shape (n, nv)

    Raises
    ------
    SolverError
        The plan swaps, or its first computations are not in node order.
    """
    from libra_opt.ir.schedule import Op

    n, nv = graph.n, graph.nv
    if coarse is not None:
        group_of = coarse.group_of()
        last_member = [members[-1] for members in coarse.groups]
        tensors_of = [tuple(x for c in graph.value_tensors[v] for x in coarse.tensor_map[c]) for v in range(nv)]
    else:
        group_of = list(range(n))
        last_member = list(range(n))
        tensors_of = [tuple(graph.value_tensors[v]) for v in range(nv)]
    problem = coarse.original if coarse is not None else graph.problem
    values_of: list[list[int]] = [[] for _ in range(len(problem.tensors))]
    for v, xs in enumerate(tensors_of):
        for x in xs:
            values_of[x].append(v)
    count = np.zeros(nv, dtype=np.int64)  # resident tensors of each value
    resident: set[int] = set()

    def drop(x: int) -> None:
        if x in resident:
            resident.discard(x)
            for v in values_of[x]:
                count[v] -= 1

    S = np.zeros((n, nv), dtype=bool)
    seen: set[int] = set()
    instrs = list(schedule)
    stage = 0  # the stage whose end is next
    i = 0
    while i < len(instrs) and stage < n:
        ins = instrs[i]
        i += 1
        if ins.op == Op.FREE:
            drop(ins.arg)
            continue
        if ins.op != Op.COMPUTE:
            raise SolverError(f"s_from_schedule: the plan has a {ins.op.name} instruction; only recompute-only "
                              f"plans map to Checkmate's R/S matrices")
        k = ins.arg
        for x in problem.nodes[k].outputs:
            if x not in resident:
                resident.add(x)
                for v in values_of[x]:
                    count[v] += 1
        if k in seen:
            continue
        seen.add(k)
        if group_of[k] > stage:
            raise SolverError(f"s_from_schedule: node {k} first runs before the stage of node "
                              f"{last_member[stage]} ends; its first computations are not in node order")
        if k == last_member[stage]:
            while i < len(instrs) and instrs[i].op == Op.FREE:
                drop(instrs[i].arg)
                i += 1
            stage += 1
            if stage < n:
                S[stage] = count > 0
    return S


def schedule_from_rs(graph: CheckmateGraph, R: np.ndarray, S: np.ndarray, *, meta: dict | None = None,
                     swap_in: np.ndarray | None = None, arrive: np.ndarray | None = None,
                     swap_out: np.ndarray | None = None, swap_now: np.ndarray | None = None) -> Schedule:
    """Turn integral ``(R, S)`` into a schedule on ``graph.problem``.

    Parameters
    ----------
    graph : CheckmateGraph
    R : ndarray of bool, shape (n, n)
    S : ndarray of bool, shape (n, nv)
        A solution satisfying the model's ``R``/``S`` constraints (e.g. from
        :func:`rs_from_s`).
    meta : dict, optional
        Stored in the schedule's ``meta``.
    swap_in : ndarray of bool, shape (n, nv), optional
        ``swap_in[t, v]``: the storages of value ``v`` are swapped in at the
        start of stage ``t`` (``SwapIn``, after the stage's first frees), in
        order of arrival (hybrid plans, :mod:`~libra_opt.solvers.hybrid_model`).
    swap_now : ndarray of bool, shape (n, nv), optional
        ``swap_now[t, v]``: the storages of ``v`` are swapped in and waited
        for at the start of stage ``t`` (before the other swap-ins), usable
        in stage ``t``; freed after the last computation of stage ``t``
        that reads them (right after the ``Wait`` if none does) unless
        ``S[t + 1, v]``.
    arrive : ndarray of bool, shape (n, nv), optional
        ``arrive[t, v]``: the swap-in of ``v`` in flight is waited for at the
        end of stage ``t`` (``Wait``, after node ``t`` and its frees); ``v``
        is then resident for stage ``t + 1``.  Default: ``swap_in`` (each
        copy waited for in the stage that issues it).
    swap_out : ndarray of bool, shape (nv,), optional
        ``swap_out[v]``: the storages of value ``v`` are copied to the host
        (``SwapOut``) right after node ``value_node[v]`` first runs.

    Returns
    -------
    Schedule
        ``Compute``/``Free`` (and ``SwapOut``/``SwapIn``/``Wait``)
        instructions, stage by stage.

    Raises
    ------
    SolverError
        ``(R, S)`` computes a node whose input is not resident (the matrices
        violate the dependency or persistence constraints).
    """
    p = graph.problem
    n = graph.n
    tensors = p.tensors
    out = p.output_set
    needers = graph.needers
    R = np.asarray(R, dtype=bool)
    S = np.asarray(S, dtype=bool)
    resident: set[int] = set()
    instrs = []

    tv = graph.tensor_value

    def keep_across(x: int, t1: int) -> bool:
        if x in out:
            return True
        if t1 >= n or x not in tv:
            return False
        return bool(S[t1, tv[x]])

    def needed(x: int, t: int, after: int) -> bool:
        row = R[t]
        return any(after < j <= t and row[j] for j in needers[x])

    def free(x: int) -> None:
        resident.discard(x)
        instrs.append(Free(x))

    arrive = swap_in if arrive is None else arrive
    landing = np.zeros(0, dtype=np.int64)
    if swap_in is not None:  # the stage each copy issued in stage t lands in
        landing = np.full((n, graph.nv), n, dtype=np.int64)
        for t in range(n - 1, -1, -1):
            landing[t] = np.where(arrive[t], t, landing[t + 1] if t + 1 < n else n)
    arriving: list[int] = []
    for t in range(n):
        for x in sorted(resident):
            if not keep_across(x, t + 1) and not needed(x, t, -1):
                free(x)
        now: list[int] = []
        if swap_now is not None:
            now = [x for v in np.flatnonzero(swap_now[t]) for x in graph.value_tensors[v]]
            instrs.extend(SwapIn(x) for x in now)
            instrs.extend(Wait(x) for x in now)
            resident.update(now)
            for x in now:  # a stall only (the model may wait for a copy it never reads): not kept past it
                if not keep_across(x, t + 1) and not needed(x, t, -1):
                    free(x)
        if swap_in is not None:
            for v in sorted(np.flatnonzero(swap_in[t]), key=lambda v: (landing[t, v], v)):
                instrs.extend(SwapIn(x) for x in graph.value_tensors[v])
            arriving = [x for v in np.flatnonzero(arrive[t]) for x in graph.value_tensors[v]]
        for k in np.flatnonzero(R[t, :t + 1]):
            k = int(k)
            node = p.nodes[k]
            vals = graph.node_values[k]
            if k != t and vals and all(S[t, v] for v in vals):
                log.debug("stage %d: node %d's values are checkpoints; skipping its recompute", t, k)
                continue
            for x in node.inputs:
                if tensors[x].kind != INPUT and x not in resident:
                    raise SolverError(f"Checkmate plan: stage {t} computes node {node.name!r} but its input "
                                      f"{tensors[x].name!r} is not resident; the R/S matrices are inconsistent")
            instrs.append(Compute(k))
            resident.update(node.outputs)
            if swap_out is not None and k == t:
                instrs.extend(SwapOut(x) for v in vals if swap_out[v] for x in graph.value_tensors[v])
            cands = set(x for x in node.inputs if tensors[x].kind != INPUT)
            cands.update(node.outputs)
            for x in sorted(cands):
                if x in resident and not keep_across(x, t + 1) and not needed(x, t, k):
                    free(x)
        for x in now:  # read by no computation that ran (a skipped recompute) and no checkpoint of t + 1
            if x in resident and not keep_across(x, t + 1):
                free(x)
        instrs.extend(Wait(x) for x in arriving)
        resident.update(arriving)
        for x in arriving:
            if not keep_across(x, t + 1):
                free(x)
    m = {"solver": "checkmate", "stages": n, "recomputations": int(R.sum() - n)}
    m.update(meta or {})
    return Schedule(instrs, m)


# ---------------------------------------------------------------------------
# plumbing shared by checkmate-milp and checkmate-lp
# ---------------------------------------------------------------------------
@dataclass
class Candidate:
    """A plan made from ``(R, S)``, simulated on the original problem.

    Attributes
    ----------
    name : str
    R, S : ndarray of bool, shapes (n, n) and (n, nv), or None
        On the (possibly coarsened) problem the model was built on; None for
        a plan made outside the model (libra's, :meth:`CheckmateSetup.libra_plans`).
    schedule : Schedule
        On the original problem.
    peak_bytes : int
        Simulated peak graph memory, bytes.
    time_s : float
        Simulated step time, seconds.
    """

    name: str
    R: np.ndarray | None
    S: np.ndarray | None
    schedule: Schedule
    peak_bytes: int
    time_s: float


class CheckmateSetup:
    """The problem a Checkmate solver works on: the original, or a coarsened
    version of it (:mod:`libra_opt.solvers.coarsen`) when it is too large for
    the O(n^2)-variable model.

    Parameters
    ----------
    problem : RematProblem
    coarsen : "auto", "none" or int
        ``"auto"``: coarsen to ``max_nodes`` nodes when the problem has more;
        an int: coarsen to that many nodes; ``"none"``: never.
    max_nodes : int
        The size ``"auto"`` coarsens to.
    solver : str
        Name used in messages.
    values : {"auto", "tensor", "node"}
        Value granularity of :meth:`CheckmateGraph.from_problem`; ``"auto"``:
        ``"tensor"`` (exact) on the problem itself, ``"node"`` (fewer
        variables) on a coarsened problem.
    budget_bytes : int, optional
        The budget to plan for.  Coarse nodes hold more at once than their
        members, so a coarse model can need more than the budget in some
        stage (:meth:`CheckmateGraph.min_stage_bytes`) where the original
        does not; the coarsening is then refined (the target raised by a
        quarter at a time, up to no coarsening) until the coarse model meets that necessary bound,
        so coarsening alone never makes a budget infeasible.

    Raises
    ------
    ValueError
        ``coarsen`` or ``values`` is not one of the accepted values.
    """

    def __init__(self, problem: RematProblem, coarsen, max_nodes: int, solver: str, values: str = "auto",
                 budget_bytes: int | None = None):
        from .coarsen import coarsen as do_coarsen

        if values not in ("auto",) + VALUE_GRANULARITIES:
            raise SolverOptionError(f"values must be 'auto' or one of {VALUE_GRANULARITIES}, got {values!r}")

        self.original = problem
        self.solver = solver
        self.coarse = None
        if isinstance(coarsen, bool) or not (coarsen in ("auto", "none") or isinstance(coarsen, int)):
            raise SolverOptionError(f"coarsen must be 'auto', 'none' or a target number of nodes, got {coarsen!r}")
        target = None
        if coarsen == "auto" and problem.num_nodes > max_nodes:
            target = max_nodes
        elif isinstance(coarsen, int):
            if coarsen < 1:
                raise SolverOptionError(f"coarsen must be a positive number of nodes, got {coarsen}")
            if coarsen < problem.num_nodes:
                target = coarsen
        granularity = values
        self.refined_from = None
        self.libra_min_feasible_bytes: int | None = None
        while True:
            self.coarse = do_coarsen(problem, target) if target is not None else None
            self.work = self.coarse.problem if self.coarse is not None else problem
            values = granularity if granularity != "auto" else ("node" if self.coarse is not None else "tensor")
            self.graph = CheckmateGraph.from_problem(self.work, values)
            if self.coarse is None:
                break
            log.info("%s: coarsened %d nodes to %d for the Checkmate model", solver, problem.num_nodes,
                     self.coarse.problem.num_nodes)
            if budget_bytes is None or self.graph.min_stage_bytes() <= budget_bytes:
                break
            # the coarse model needs more than the budget in some stage: refine (up to no coarsening)
            log.info("%s: a stage of the %d-node coarse model needs %d bytes > the budget %d; refining", solver,
                     self.work.num_nodes, self.graph.min_stage_bytes(), budget_bytes)
            self.refined_from = self.refined_from or target
            target = target + max(target // 4, 1)
            target = target if target < problem.num_nodes else None

    @property
    def coarsened(self) -> bool:
        """True if the model is built on a coarsened problem."""
        return self.coarse is not None

    def describe(self) -> dict:
        """Extras for the result: whether and how much the problem was coarsened."""
        out = {"coarsened": self.coarsened, "model_nodes": self.work.num_nodes,
               "original_nodes": self.original.num_nodes, "values": self.graph.values,
               "model_values": self.graph.nv}
        if self.refined_from is not None:
            out["coarsen_refined_from"] = self.refined_from
        return out

    def note(self) -> str:
        """A sentence for the result message ('' if not coarsened)."""
        if not self.coarsened:
            return ""
        return (f"; solved on a coarsened graph of {self.work.num_nodes} nodes (from {self.original.num_nodes}), "
                f"plan expanded back")

    def candidate(self, name: str, R: np.ndarray, S: np.ndarray, meta: dict | None = None) -> Candidate:
        """Build the plan of ``(R, S)``, expand it if coarsened, simulate it."""
        sched = schedule_from_rs(self.graph, R, S, meta=meta)
        if self.coarse is not None:
            sched = self.coarse.expand(sched)
        sim = simulate(self.original, sched)
        return Candidate(name, R, S, sched, sim.peak_bytes, sim.time_s)

    def heuristics(self) -> list[Candidate]:
        """The no-remat and the recompute-forward plans (on the model's graph)."""
        out = []
        for name, s in (("keep-all", keep_all_s(self.graph)), ("recompute-forward", recompute_forward_s(self.graph))):
            R, S = rs_from_s(self.graph, s)
            out.append(self.candidate(name, R, S, {"heuristic": name}))
        return out

    def libra_plans(self, budget_bytes: int) -> list[Candidate]:
        """libra's recompute-only plan at ``budget_bytes`` (Checkmate plans
        recompute only), as two candidates: ``"libra"``, libra's schedule
        itself (``R``/``S`` None: it may lie outside the model, e.g. when the
        graph is coarsened), and ``"libra (R/S)"``, its checkpoints on the
        model's graph (:func:`s_from_schedule`) completed with
        :func:`rs_from_s` (the least recomputation for them): a starting
        solution for the MILP.  The second is left out when it cannot be made.

        When libra finds no plan, nothing is returned and the smallest budget
        it found feasible is kept in :attr:`libra_min_feasible_bytes` for
        :meth:`infeasible`.

        Source: the libra solver (:mod:`libra_opt.solvers`, ``policy="recompute"``).

        Returns
        -------
        list of Candidate
        """
        from ..registry import get_solver

        self.libra_min_feasible_bytes = None
        try:
            res = get_solver("libra", policy="recompute").solve(self.original, int(budget_bytes))
        except InfeasibleBudgetError as e:
            self.libra_min_feasible_bytes = e.min_feasible_bytes
            return []
        except SolverError as e:  # a reference plan only: the Checkmate solver goes on without it
            internal = e.__cause__ is not None and not isinstance(e.__cause__, LibraOptError)
            (log.warning if internal else log.info)("%s: no libra plan to start from: %s", self.solver, e)
            return []
        sched = res.schedule          # simulated by the solver framework already: res.peak_bytes, res.time_s
        out = [Candidate("libra", None, None, sched, int(res.peak_bytes), float(res.time_s))]
        try:
            R, S = rs_from_s(self.graph, s_from_schedule(self.graph, sched, self.coarse))
            out.append(self.candidate("libra (R/S)", R, S, {"heuristic": "libra (R/S)"}))
        except SolverError as e:
            log.info("%s: libra's plan does not map to R/S: %s", self.solver, e)
        return out

    def infeasible(self, budget_bytes: int, plans: list[Candidate], detail: str) -> InfeasibleBudgetError:
        """The error for a budget no plan was found for; ``min_feasible_bytes``
        is the smallest simulated peak among ``plans`` (the heuristic plans,
        and the LP rounding if one was made), libra's smallest feasible budget
        (if :meth:`libra_plans` ran) and the no-remat peak: a budget shown
        feasible, never above the no-remat peak."""
        from libra_opt.passes.simulator import no_remat_peak

        peaks = [c.peak_bytes for c in plans] + [no_remat_peak(self.original)]
        if self.libra_min_feasible_bytes is not None:
            peaks.append(int(self.libra_min_feasible_bytes))
        best = min(peaks) if peaks else None
        if best is not None and best <= budget_bytes:  # should have been returned instead
            best = None
        return InfeasibleBudgetError(budget_bytes, best, self.solver, detail)


def no_remat_if_fits(problem: RematProblem, budget_bytes: int) -> Schedule | None:
    """The no-remat shortcut shared by both Checkmate solvers.

    Returns
    -------
    Schedule or None
        The no-remat plan if its simulated peak fits ``budget_bytes`` (it is
        then optimal: no plan computes less), else None.
    """
    from libra_opt.ir.schedule import no_remat_schedule

    sched = no_remat_schedule(problem)
    if simulate(problem, sched).peak_bytes <= budget_bytes:
        return sched
    return None


def no_remat_solution(problem: RematProblem, budget_bytes: int, solver: str,
                      message: str = "the no-remat plan fits the budget (no recomputation needed)",
                      extras: dict | None = None):
    """The shortcut every Checkmate-family solver takes first: the
    :class:`~libra_opt.solvers.result.RawSolution` of the no-remat plan,
    ``"optimal"`` with the compute-floor bound
    (:func:`~libra_opt.solvers.certificates.floor_bound`), when its simulated
    peak fits ``budget_bytes`` (bytes), else None.  ``solver`` is recorded in
    the schedule's ``meta``; ``message`` and ``extras`` are the solution's."""
    from ..certificates import floor_bound
    from ..result import OPTIMAL, RawSolution

    trivial = no_remat_if_fits(problem, budget_bytes)
    if trivial is None:
        return None
    trivial.meta.update({"solver": solver})
    return RawSolution(trivial, OPTIMAL, bounds=(floor_bound(problem, budget_bytes, solver),), message=message,
                       extras=dict(extras or {}))
