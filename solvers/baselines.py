"""Baseline solvers: what a practitioner would do without an optimizer.

Every baseline chooses, per activation storage, keep / recompute / swap over
its default eviction window (:func:`libra_opt.lowering.default_windows`: from
the last forward use to the first backward use) and hands the decisions to
:func:`libra_opt.lowering.lower`; the base class simulates the plan against the
budget.  A baseline whose plan(s) cannot meet the budget raises
:class:`~libra_opt.errors.InfeasibleBudgetError` stating the smallest peak it
can reach.

- ``none`` (:class:`NoRematSolver`): keep everything (eager PyTorch).
- ``checkpoint-all`` (:class:`CheckpointAllSolver`): recompute every
  activation that can be recomputed (``torch.utils.checkpoint`` around every
  op).
- ``chen-sqrt`` (:class:`ChenSqrtSolver`): Chen et al. 2016, sec. 4.1,
  sqrt(n) segments.
- ``chen-greedy`` (:class:`ChenGreedySolver`): Chen et al. 2016, Algorithm 3
  (memory planning with a segment budget), the threshold searched.
- ``swap-all`` (:class:`SwapAllSolver`): offload every activation, prefetch
  ahead of use (``torch.autograd.graph.save_on_cpu``, with prefetching).

Non-recomputable producers (RNG ops such as dropout, mutating ops) are never
recomputed: their storages are kept (or swapped by ``swap-all``), and so is
any storage whose recomputation chain would have to re-run one.

Source of the Chen variants as implemented for DAGs: Checkmate's baselines
(Jain et al., MLSys 2020, sec. 6.1: "Chen et al. sqrt(n)", "Chen et al.
greedy", with articulation points or on the linearized graph).
"""
from __future__ import annotations

import bisect
import itertools
import logging
import math
from dataclasses import dataclass
from typing import Iterable, Iterator

import numpy as np

from libra_opt.errors import BudgetExceededError, InfeasibleBudgetError
from libra_opt.passes.lowering import Policy, default_windows, evictions_for, lower
from libra_opt.passes.peak_bound import PeakProver
from libra_opt.ir.problem import ACTIVATION, RematProblem
from libra_opt.ir.schedule import Schedule, no_remat_schedule
from libra_opt.passes.simulator import SimulationResult, Simulator, no_remat_peak, simulate

from .base import Solver
from .certificates import floor_bound
from .registry import register_solver
from .result import OPTIMAL, RawSolution

log = logging.getLogger(__name__)

__all__ = ["BaselinePlan", "BaselineCandidate", "recompute_bound_s", "copy_bound_s", "NoRematSolver", "CheckpointAllSolver",
           "ChenSqrtSolver", "ChenGreedySolver", "SwapAllSolver", "forward_cut_points", "safe_recompute_decisions", "segment_windows", "chen_greedy_checkpoints", "chen_sqrt_checkpoints"]

_CHEN = ("Chen, Xu, Zhang, Guestrin. Training Deep Nets with Sublinear Memory Cost. arXiv:1604.06174, 2016")


# --------------------------------------------------------------------- helpers
def _forward_end(problem: RematProblem) -> int:
    """Number of forward positions (all positions for a single-phase graph)."""
    return problem.boundary


def forward_cut_points(problem: RematProblem) -> list[int]:
    """Forward positions whose outputs are the only activations crossing into
    the rest of the forward: the articulation points of the forward graph in
    eager order, where a segment of Chen et al. (2016, sec. 4.1) may end.

    Position ``v`` qualifies if every activation produced at a position
    ``<= v`` and read by a forward node ``> v`` is an output of ``v``.  Keeping
    ``v``'s outputs then suffices to recompute any later forward activation.
    For a single-phase graph every node counts as forward.

    Parameters
    ----------
    problem : RematProblem

    Returns
    -------
    list of int
        Ascending node positions (the last forward position excluded: it ends
        the forward anyway).
    """
    end = _forward_end(problem)
    # last forward reader of each activation produced in the forward
    last_fwd: dict[int, int] = {}
    for t in problem.tensors:
        if t.kind != ACTIVATION or t.producer is None or t.producer >= end:
            continue
        fwd = [c for c in t.consumers if c < end]
        if fwd:
            last_fwd[t.id] = fwd[-1]
    # crossing[v]: activations alive across the cut v|v+1 that v did not produce
    diff = np.zeros(end + 1, dtype=np.int64)
    for tid, last in last_fwd.items():
        p = problem.tensors[tid].producer
        # crosses cuts p, p+1, ..., last-1; it is "foreign" at cuts p+1 .. last-1
        if last - 1 >= p + 1:
            diff[p + 1] += 1
            diff[last] -= 1
    foreign = np.cumsum(diff)[:end]
    return [v for v in range(max(end - 1, 0)) if foreign[v] == 0]


@dataclass(frozen=True)
class _ChainFacts:
    """What :func:`safe_recompute_decisions` reads per tensor, built once per
    problem (kept in ``problem.tables``, :meth:`~libra_opt.ir.tables.ProblemTables.memo`).

    Attributes
    ----------
    storage, producer : list of int
        ``problem.tables.t_storage`` and ``t_prod``.
    alive_until : list of int
        The last position at which the tensor is resident when kept: its last
        use (``problem.tables.t_last``), or past the last node for a step
        output (never freed).
    tainted : list of bool
        An activation whose producer is not recomputable or reads a tainted
        activation: one from which a walk back through activations can reach
        a non-recomputable producer.  A recomputation chain through untainted
        tensors only re-runs recomputable nodes, so the walk follows tainted
        tensors only (the same answer, without walking the chains of graphs
        that have no non-recomputable op behind them).
    recomputable : list of bool
        Per tensor, its producer is recomputable (``False`` for a graph input).
    tainted_inputs : list of tuple of int
        Per tensor, the tainted inputs of its producer: the steps of the walk.
    """

    storage: list
    producer: list
    alive_until: list
    tainted: list
    recomputable: list
    tainted_inputs: list


def _chain_facts(problem: RematProblem) -> _ChainFacts:
    """The problem's :class:`_ChainFacts` (built once per problem)."""
    return problem.tables.memo("baselines.chain_facts", lambda: _build_chain_facts(problem))


def _build_chain_facts(problem: RematProblem) -> _ChainFacts:
    tables, tensors, nodes = problem.tables, problem.tensors, problem.nodes
    tainted = [False] * len(tensors)
    for node in nodes:   # eager order: a node's inputs are settled before its outputs
        if not node.recomputable or any(tainted[v] for v in node.inputs):
            for t in node.outputs:
                tainted[t] = tensors[t].kind == ACTIVATION
    never_freed = problem.num_nodes
    alive_until = [never_freed if out else last for out, last in zip(tables.t_out, tables.t_last)]
    producer = tables.t_prod
    recomputable = [p is not None and nodes[p].recomputable for p in producer]
    node_tainted_inputs = [tuple(v for v in n.inputs if tainted[v]) for n in nodes]
    tainted_inputs = [() if p is None else node_tainted_inputs[p] for p in producer]
    return _ChainFacts(tables.t_storage, producer, alive_until, tainted, recomputable, tainted_inputs)


def safe_recompute_decisions(problem: RematProblem, evict: Iterable[int],
                             windows: dict[int, tuple[int, int]] | None = None) -> dict[int, Policy]:
    """Recompute decisions for ``evict``, keeping what cannot be recomputed.

    A storage is switched to ``KEEP`` when regenerating it at the end of its
    window would re-run a non-recomputable node (RNG or mutating op): its own
    producer, or a producer found by walking its recomputation chain back
    through activations that are not certainly resident at that time.  The
    walk is conservative (a storage evicted by any decision counts as not
    resident); since keeping only adds residency, one pass suffices.

    The storages are decided in the order of ``evict`` (a storage switched to
    ``KEEP`` is resident for the walks of the later ones).  A walk regenerating
    for position ``before`` follows the tensors not resident there; one that
    ends without reaching a non-recomputable producer proves every tensor it
    visited safe at ``before``, for every later walk at ``before`` too (a later
    switch to ``KEEP`` only makes more tensors resident, i.e. cuts walks), so
    those tensors are not walked again.  Chen's segment windows
    (:func:`segment_windows`) give every evicted storage of a segment the same
    ``before``: their walks share their work.

    Parameters
    ----------
    problem : RematProblem
    evict : iterable of int
        Storage ids the caller wants recomputed; those without a window are
        ignored.
    windows : dict of int to (int, int), optional
        ``storage -> (after, before)``; :func:`default_windows` if omitted.

    Returns
    -------
    dict of int to Policy
        ``RECOMPUTE`` or ``KEEP`` per storage of ``evict`` that has a window.
    """
    windows = default_windows(problem) if windows is None else windows
    tensors = problem.tensors
    facts = _chain_facts(problem)
    storage, producer, alive_until = facts.storage, facts.producer, facts.alive_until
    tainted, recomputable, tainted_inputs = facts.tainted, facts.recomputable, facts.tainted_inputs
    want = [s for s in dict.fromkeys(evict) if s in windows]
    decisions = {s: Policy.RECOMPUTE for s in want}
    off = set(want)   # storages not certainly resident: evicted, not (yet) switched to KEEP
    safe_at: dict[int, set[int]] = {}   # before -> tensors whose walk at ``before`` is known to end safely

    def chain_ok(seeds: list[int], before: int) -> bool:
        # only tainted tensors can lead the walk to a non-recomputable producer: the rest are skipped
        safe = safe_at.setdefault(before, set())
        stack = [u for u in seeds if tainted[u] and u not in safe]
        seen: set[int] = set()
        while stack:
            u = stack.pop()
            if u in seen:
                continue
            seen.add(u)
            if not recomputable[u]:
                return False
            for v in tainted_inputs[u]:
                # pushed unless resident at ``before``: kept, produced before it, alive through it (a tensor
                # of the storage being decided is evicted: never resident)
                if v not in seen and v not in safe and (storage[v] in off or not producer[v] < before
                                                        or alive_until[v] < before):
                    stack.append(v)
        safe |= seen
        return True

    for s in want:
        before = windows[s][1]
        views = problem.storage_views[s]
        # the lowering regenerates on demand: at the window's end, and again at a later use of a
        # tensor of the storage that was freed after the end (where less may be resident)
        ok = chain_ok(list(views), before)
        for u in views:
            if not ok:
                break
            later = [c for c in tensors[u].consumers if c > before]
            if later:
                ok = chain_ok([u], later[0])
        if not ok:
            decisions[s] = Policy.KEEP
            off.discard(s)
            log.debug("keeping %r: its recomputation would re-run a non-recomputable op", tensors[s].name)
    return decisions


class _Over:
    """What :func:`_evaluate` keeps of a plan whose lowering it stopped: the
    plan's simulated peak is over ``limit`` bytes."""

    __slots__ = ("limit",)

    def __init__(self, limit: int):
        self.limit = limit


def _evaluate(problem: RematProblem, decisions: dict[int, Policy], windows, *, prefetch="auto",
              limit: int | None = None) -> tuple[Schedule, SimulationResult] | None:
    """The plan the lowering makes of ``decisions`` over ``windows``
    (:func:`~libra_opt.lowering.evictions_for`, :func:`~libra_opt.lowering.lower`)
    and its simulation (no budget applied); or ``None`` where ``limit``
    (bytes) is given and the plan's simulated peak is over it.

    With a ``limit``, the plan's :class:`~libra_opt.passes.peak_bound.PeakProver`
    (one per plan, :func:`_prover`) is asked first: where it proves the peak
    over ``limit`` from a few chains, nothing is lowered.  Otherwise the plan
    is simulated as it is lowered (the lowering's ``watch``;
    :func:`_lower_within`) and both stop soon after the first instruction
    that takes memory over ``limit``: a caller that only needs to know
    whether the plan fits, or its peak where that is under some other
    plan's, does not lower the rest.  On a 1,000-node random layered graph ``checkpoint-all``'s
    plan passes the no-remat peak at instruction 366,510 of 500,277.

    Lowering and simulating are nearly all of a baseline's solve time (the
    plans of the Chen baselines on graphs with few articulation points
    recompute long chains: hundreds of thousands of instructions on 1,000
    nodes), so each distinct plan is built once per problem: the result is
    kept in ``problem.tables`` (:meth:`~libra_opt.ir.tables.ProblemTables.memo`;
    a problem is immutable and the lowering deterministic), keyed by the
    eviction list and ``prefetch``.  This shares one build between
    ``chen-greedy`` thresholds whose checkpoint sets differ but evict the same
    storages over the same windows (2 of 2 on random layered graphs, 7 to 4 on
    GPT-2 medium), between ``chen-sqrt`` and ``chen-greedy`` where their
    checkpoints agree, between the budgets of a ``solve_many`` and with
    ``libra``'s portfolio on the same problem.  The schedule returned is the
    shared one: callers that hand a plan out copy it first (:func:`_handed_out`).

    Memory: the plans stay with the problem while it lives (about 45 MB for
    the 500,277-instruction plan of ``checkpoint-all`` on a 1,000-node random
    layered graph, schedule and simulation; ``libra``'s portfolio keeps the
    same objects in its own memo).

    A plan found over a limit is remembered as such (:class:`_Over`): a
    later call with a limit at most that one returns ``None`` at once, one
    with a higher limit or none lowers it again.

    Raises
    ------
    ScheduleError
        The lowering or the simulation rejects the plan.
    """
    built, key = _lowered(problem, decisions, windows, prefetch)
    evictions = key[0]
    got = built.get(key)
    if isinstance(got, _Over):
        if limit is not None and limit <= got.limit:
            return None
        got = None
    if got is None:
        if limit is None:
            sched = lower(problem, evictions, prefetch=prefetch)
            got = built[key] = (sched, simulate(problem, sched))
        elif _prover(problem, key, decisions, windows).over(limit):
            built[key] = _Over(limit)
        else:
            got = _lower_within(problem, evictions, prefetch, limit)
            built[key] = _Over(limit) if got is None else got
    return got


def _lowered(problem: RematProblem, decisions: dict[int, Policy], windows, prefetch) -> tuple[dict, tuple]:
    """The problem's memo of built baseline plans (``"baselines.lowered"``)
    and the key of the plan of ``decisions`` over ``windows`` there: its
    eviction list and ``prefetch`` (:func:`_evaluate`)."""
    return (problem.tables.memo("baselines.lowered", dict),
            (tuple(evictions_for(problem, decisions, windows)), prefetch))


def _proven_over(problem: RematProblem, decisions: dict[int, Policy], windows, *, limit: int) -> bool:
    """Whether the plan :func:`_evaluate` makes of ``decisions`` over
    ``windows`` surely peaks over ``limit`` (bytes), shown without lowering
    it: from its build where it was built (its simulated peak, or a stop
    over a limit at least ``limit``), else from its
    :class:`~libra_opt.passes.peak_bound.PeakProver` (:func:`_prover`, kept
    per plan).  ``False`` means not shown (it may be over or not).  Nothing
    is kept as a build: a later :func:`_evaluate` at a higher limit, or
    none, lowers the plan as before.  For recompute plans (the prover's:
    their :func:`_evaluate` key has the default ``prefetch``)."""
    built, key = _lowered(problem, decisions, windows, "auto")
    got = built.get(key)
    if isinstance(got, _Over):
        if limit <= got.limit:
            return True
    elif got is not None:
        return got[1].peak_bytes > limit
    return _prover(problem, key, decisions, windows).over(limit)


def _prover(problem: RematProblem, key: tuple, decisions: dict[int, Policy], windows) -> PeakProver:
    """The plan's :class:`~libra_opt.passes.peak_bound.PeakProver`, one per
    plan of the problem (``key``: :func:`_evaluate`'s), so that the chains it
    replayed for one limit count for the next and for the baselines that
    share the plan."""
    provers = problem.tables.memo("baselines.provers", dict)
    pr = provers.get(key)
    if pr is None:
        pr = provers[key] = PeakProver(problem, decisions, windows)
    return pr


#: instructions the lowering emits between two runs of the simulator in :func:`_lower_within` (a
#: run per node cost more than the stop saves on plans that pass the limit late)
_WALK_CHUNK = 2048


def _lower_within(problem: RematProblem, evictions, prefetch, limit: int) -> tuple[Schedule, SimulationResult] | None:
    """:func:`_evaluate`'s lowering under a limit: the simulator
    (:class:`~libra_opt.passes.simulator.Simulator` with ``limit`` as its
    budget) runs the instructions as the lowering emits them, about
    :data:`_WALK_CHUNK` at a time
    (:meth:`~libra_opt.passes.interpreter.ScheduleInterpreter.walk` in parts);
    ``None`` once it raises :class:`BudgetExceededError`.  A plan under the
    limit gets the result :func:`simulate` gives it."""
    sim = Simulator(problem, limit)
    sim.start()
    done = 0

    def watch(out):
        nonlocal done
        if len(out) - done >= _WALK_CHUNK:
            sim.walk(out[done:], done)
            done = len(out)

    try:
        sched = lower(problem, evictions, prefetch=prefetch, watch=watch)
        sim.walk(sched.instructions[done:], done)   # the last instructions, fewer than a chunk
    except BudgetExceededError:
        return None
    sim.index = len(sched.instructions)
    return sched, sim.finish()


def _handed_out(plan: "BaselinePlan") -> Schedule:
    """A copy of ``plan``'s schedule for a :class:`RawSolution`: the solver base
    class sets the result's ``meta`` on it, and the plan's own schedule is
    shared with later solves on the problem (:func:`_evaluate`)."""
    return plan.schedule.with_meta(plan.schedule.meta)


def segment_windows(problem: RematProblem, checkpoints: Iterable[int], windows: dict[int, tuple[int, int]],
                    evict: Iterable[int]) -> dict[int, tuple[int, int]]:
    """Chen-style windows: a segment's evicted storages all come back when the
    backward first needs any of them.

    The checkpoints split the eager order into segments (a checkpoint ends its
    segment).  Each evicted storage's window is cut to end at the earliest
    window end among the evicted storages of its producer's segment, so that
    the first regeneration in a segment recomputes the segment's forward once
    and its results stay resident for the segment's backward (Chen et al.
    2016, sec. 4.1: one extra forward pass in total), rather than being
    freed and replayed again for each use.

    Parameters
    ----------
    problem : RematProblem
    checkpoints : iterable of int
        Segment-ending positions.
    windows : dict of int to (int, int)
        Default windows, ``storage -> (after, before)``.
    evict : iterable of int
        Storages to evict.

    Returns
    -------
    dict of int to (int, int)
        ``windows`` with the evicted storages' ends moved earlier where that
        leaves a non-empty window.
    """
    ckpt = sorted(set(checkpoints))
    seg = {s: bisect.bisect_left(ckpt, problem.tensors[s].producer) for s in evict if s in windows}
    start: dict[int, int] = {}
    for s, j in seg.items():
        start[j] = min(start.get(j, windows[s][1]), windows[s][1])
    out = dict(windows)
    for s, j in seg.items():
        after, before = windows[s]
        if after < start[j] < before:
            out[s] = (after, start[j])
    return out


def _checkpoint_plan(problem: RematProblem, checkpoints: Iterable[int], windows
                     ) -> tuple[dict[int, Policy], dict[int, tuple[int, int]]]:
    """Keep the storages of the checkpoint nodes' outputs, recompute every
    other windowed storage (where safe) over Chen-style segment windows."""
    checkpoints = list(checkpoints)
    kept = {problem.tensors[t].storage for v in checkpoints for t in problem.nodes[v].outputs}
    evict = [s for s in windows if s not in kept]
    segwin = segment_windows(problem, checkpoints, windows, evict)
    dec = safe_recompute_decisions(problem, evict, segwin)
    dec.update({s: Policy.KEEP for s in kept if s in windows})
    return dec, segwin


def _checkpoint_candidate(problem: RematProblem, checkpoints, windows, message: str, extras: dict
                          ) -> "BaselineCandidate":
    """The plan of :func:`_checkpoint_plan`, before it is lowered, with its :func:`recompute_bound_s`."""
    dec, segwin = _checkpoint_plan(problem, checkpoints, windows)

    def build(limit: int | None) -> BaselinePlan | None:
        got = _evaluate(problem, dec, segwin, limit=limit)
        return None if got is None else BaselinePlan(*got, message, extras)
    return BaselineCandidate(build, recompute_bound_s(problem, dec),
                             lambda limit: _proven_over(problem, dec, segwin, limit=limit))


def _candidates(problem: RematProblem, which: str) -> list[int]:
    if which == "all":
        return list(range(max(_forward_end(problem) - 1, 0)))
    _check_candidates(which)
    c = forward_cut_points(problem)
    if not c:
        log.info("%s: no articulation point in the forward graph; using every forward node as a candidate",
                 problem.name)
        return list(range(max(_forward_end(problem) - 1, 0)))
    return c


def chen_sqrt_checkpoints(candidates: list[int]) -> list[int]:
    """Every k-th candidate, ``k = round(sqrt(len(candidates)))``: about
    sqrt(n) segments of about sqrt(n) candidates (Chen et al. 2016, sec. 4.1).

    Parameters
    ----------
    candidates : list of int
        Candidate positions in eager order.

    Returns
    -------
    list of int
    """
    if not candidates:
        return []
    k = max(1, int(round(math.sqrt(len(candidates)))))
    return [v for i, v in enumerate(candidates) if (i + 1) % k == 0]


def chen_greedy_checkpoints(problem: RematProblem, candidates: list[int], threshold_bytes: float) -> list[int]:
    """Chen et al. 2016, Algorithm 3 ("memory planning with budget"): walk the
    forward in eager order accumulating each node's output bytes; at a
    candidate whose running sum exceeds ``threshold_bytes``, checkpoint it and
    restart the sum.

    Parameters
    ----------
    problem : RematProblem
    candidates : list of int
        Positions allowed as checkpoints.
    threshold_bytes : float
        The segment budget ``B`` (bytes).

    Returns
    -------
    list of int
        Checkpoint positions, ascending.
    """
    # the running sum at candidate v is the bytes of the positions after the last checkpoint up to v:
    # a difference of prefix sums (ints, exact), so only the candidates are visited
    prefix = _forward_prefix_bytes(problem)
    out = []
    start = 0   # prefix[start]: the sum when it was last restarted
    for v in sorted({c for c in candidates if 0 <= c < _forward_end(problem)}):
        if prefix[v + 1] - prefix[start] > threshold_bytes:
            out.append(v)
            start = v + 1
    return out


def _forward_output_bytes(problem: RematProblem) -> list[int]:
    """Per forward position, the bytes its outputs own (views: 0); built once per problem
    (``problem.tables`` memo)."""
    def build():
        nbytes = problem.tables.t_nbytes
        return [sum(nbytes[t] for t in problem.nodes[v].outputs) for v in range(_forward_end(problem))]
    return problem.tables.memo("baselines.forward_output_bytes", build)


def _forward_prefix_bytes(problem: RematProblem) -> list[int]:
    """``[0, b0, b0 + b1, ...]`` over :func:`_forward_output_bytes` (``problem.tables`` memo)."""
    return problem.tables.memo("baselines.forward_prefix_bytes",
                               lambda: [0, *itertools.accumulate(_forward_output_bytes(problem))])


def _infeasible(solver: str, budget_bytes: int, peaks: Iterable[int], detail: str) -> InfeasibleBudgetError:
    return InfeasibleBudgetError(budget_bytes, int(min(peaks)), solver, detail)


def _keep_all_or_infeasible(problem: RematProblem, budget_bytes: int, peaks: Iterable[int], solver: str,
                            detail: str) -> RawSolution:
    """The plan of a checkpointing baseline whose own plan(s) (``peaks``,
    bytes) are over ``budget_bytes``: every node a checkpoint, i.e. keep every
    activation (the degenerate member of the family, Chen et al.'s segments of
    one node), when that fits.  Evicting can raise the peak above keeping
    (on a single-phase graph a storage is recomputed at its next use, with its
    chain resident at once), so a budget the no-remat plan meets is met.

    Raises
    ------
    InfeasibleBudgetError
        Keeping everything does not fit either; states the smallest peak seen.
    """
    peaks = list(peaks)
    keep_all_peak = no_remat_peak(problem)   # kept with the problem: the budget was parsed against it
    if keep_all_peak > budget_bytes:
        raise _infeasible(solver, budget_bytes, peaks + [keep_all_peak], detail)
    sched = no_remat_schedule(problem)
    sim = simulate(problem, sched)
    return RawSolution(sched, message=f"{detail}: peak {min(peaks)} bytes, over the budget and the no-remat peak; "
                                      f"every node a checkpoint (keep every activation) fits",
                       extras={"fallback": "keep-all"},
                       simulation=sim)


@dataclass
class BaselinePlan:
    """One plan a baseline considers, independent of the budget.

    Attributes
    ----------
    schedule : Schedule
    simulation : SimulationResult
        Its simulation (peak bytes, added seconds), no budget applied.
    message : str
        What the plan is, for :attr:`SolveResult.message`.
    extras : dict
        The baseline's own details (checkpoints, prefetch, counts).
    """

    schedule: Schedule
    simulation: SimulationResult
    message: str
    extras: dict


class BaselineCandidate:
    """One plan of a baseline before it is lowered and simulated, with a
    lower bound on its simulated added time, so a caller comparing plans
    (``libra``'s portfolio) builds only those that can win.

    Attributes
    ----------
    added_s_bound : float
        A lower bound on the plan's ``simulation.added_s`` (seconds), known
        from its decisions alone (:func:`recompute_bound_s` for recomputes,
        :func:`copy_bound_s` for swaps; 0 where none is known).

    Parameters
    ----------
    build : callable (int or None) -> BaselinePlan or None
        Lowers and simulates the plan; given a limit (bytes), may stop and
        return ``None`` once the plan's peak is over it (:func:`_evaluate`).
    added_s_bound : float
    prove : callable (int) -> bool, optional
        Whether the plan's simulated peak is surely over a limit (bytes),
        shown without lowering it (:func:`_proven_over`); ``None``: never
        shown.

    Methods
    -------
    plan() -> BaselinePlan
        Lowers and simulates the plan on the first call and returns the same
        :class:`BaselinePlan` after (errors of the lowering propagate).
    plan_within(limit) -> BaselinePlan or None
        The same, or ``None`` where the plan's simulated peak is over
        ``limit`` bytes and it has not been built in whole (the prover shows
        it, or the lowering stops where the peak passes the limit).
    cannot_beat(added_s, total_compute_s) -> bool
        The plan's added time is certainly above ``added_s``: it can neither
        be cheaper nor tie, so it need not be built.
    surely_over(limit) -> bool
        The plan's simulated peak is certainly over ``limit`` bytes (built,
        found over it, or shown by ``prove``): a caller that needs a plan
        within ``limit`` need not build it.
    """

    __slots__ = ("added_s_bound", "_build", "_plan", "_over", "_prove")

    #: relative slack on the bound (the simulator sums the times in another order than the bound)
    BOUND_SLACK = 1e-9

    def __init__(self, build, added_s_bound: float = 0.0, prove=None):
        self.added_s_bound = float(added_s_bound)
        self._build = build
        self._prove = prove
        self._plan: BaselinePlan | None = None
        self._over = -1   # the largest limit (bytes) the plan's peak is known to be over (-1: none)

    def cannot_beat(self, added_s: float, total_compute_s: float) -> bool:
        """Whether the plan's simulated added time is certainly above
        ``added_s`` (seconds): its lower bound exceeds it by more than
        :attr:`BOUND_SLACK` of ``total_compute_s + added_s`` (the problem's
        no-remat compute time, seconds, and ``added_s``)."""
        return self.added_s_bound - added_s > self.BOUND_SLACK * (total_compute_s + added_s)

    def surely_over(self, limit: int) -> bool:
        """Whether the plan's simulated peak is certainly over ``limit``
        (bytes): its build's peak where it is built, else a stop or a proof
        over a limit at least ``limit``, else ``prove``'s answer (kept as
        such a proof, so a later call at most ``limit`` asks nothing).
        Nothing is built (a later :meth:`plan_within` at a higher limit
        lowers the plan as before)."""
        if self._plan is not None:
            return self._plan.simulation.peak_bytes > limit
        if limit <= self._over:
            return True
        if self._prove is not None and self._prove(limit):
            self._over = limit
            return True
        return False

    def plan(self) -> BaselinePlan:
        """The plan, built once (see the class docstring)."""
        return self.plan_within(None)

    def plan_within(self, limit: int | None) -> BaselinePlan | None:
        """The plan, or ``None`` where its simulated peak is over ``limit``
        (bytes; ``None``: no limit) and it was not built before (see the class
        docstring)."""
        if self._plan is None:
            if limit is not None and limit <= self._over:
                return None
            plan = self._build(limit)
            if plan is None:
                self._over = limit
                return None
            self._plan, self._build = plan, None
        return self._plan


def recompute_bound_s(problem: RematProblem, decisions: dict[int, Policy]) -> float:
    """A lower bound on the simulated added time of the plan the lowering
    makes of ``decisions`` over default or segment windows (seconds): the
    recompute time (``problem.recompute_time``) of each distinct producer
    of a storage whose policy is ``RECOMPUTE``.

    Why it holds: such a storage is freed at its window's start and read at
    or after its end (a window ends at a use, or earlier for Chen's segment
    windows), so its producer runs again at least once, and the simulator
    adds every recompute to the serial compute time (``added_s`` is the step
    time minus the eager compute time; copies and stalls only add).  A
    multi-output producer is counted once.
    """
    tensors = problem.tensors
    producers = {tensors[s].producer for s, pol in decisions.items() if pol == Policy.RECOMPUTE}
    if not producers:
        return 0.0
    rt = problem.recompute_time
    return float(sum(float(rt[v]) for v in producers))


def copy_bound_s(problem: RematProblem, decisions: dict[int, Policy]) -> float:
    """A lower bound on the simulated added time of the plan the lowering
    makes of ``decisions`` over default windows (seconds), from its copies
    out: every storage whose policy is ``SWAP`` is copied to the host once
    (``SwapOut`` right after its producer, :func:`~libra_opt.lowering.lower`),
    the copies run one after another on the device-to-host queue at
    ``problem.device.d2h_bytes_per_s``, the first no earlier than the end
    of the first swapped storage's producer in the no-remat plan (a plan
    only adds compute and stalls before it), and the step ends no earlier
    than its last copy (the simulator's step time is the latest of the
    compute stream and both queues).  So the step takes at least that end
    time, and the added time is that less ``problem.total_compute_s``
    (0 where the copies hide behind compute, or nothing is swapped).
    Source: the simulator's copy queues (:mod:`libra_opt.passes.simulator`).
    """
    swapped = [s for s, pol in decisions.items() if pol == Policy.SWAP]
    if not swapped:
        return 0.0
    tensors = problem.tensors
    nbytes = sum(int(tensors[s].nbytes) for s in swapped)
    first_end = float(problem.tables.cum[min(tensors[s].producer for s in swapped) + 1])
    return max(first_end + nbytes / float(problem.device.d2h_bytes_per_s) - problem.total_compute_s, 0.0)


def _stop_limit(problem: RematProblem, budget_bytes: int) -> int | None:
    """The limit (bytes) past which a checkpointing baseline's plan need not
    be lowered further, or ``None`` (lower it all): where the budget is under
    the no-remat peak, a plan whose peak reaches that peak neither fits nor
    lowers the smallest budget the error states (keeping every activation
    needs no more; :func:`_keep_all_or_infeasible`).  Where the budget is at
    or over it, plans are built in whole (the message states their peak)."""
    keep_all_peak = no_remat_peak(problem)
    return keep_all_peak - 1 if budget_bytes < keep_all_peak else None


def _first_fitting(problem: RematProblem, candidates: Iterable[BaselineCandidate], budget_bytes: int, solver: str,
                   detail: str, keep_all: bool = True) -> RawSolution:
    """The first plan of ``candidates`` whose simulated peak is within
    ``budget_bytes`` (later plans are not built); failing that, keep every
    activation where ``keep_all`` and it fits (:func:`_keep_all_or_infeasible`).
    With ``keep_all``, a plan is lowered only until its peak reaches the
    no-remat peak (:func:`_stop_limit`).

    Raises
    ------
    InfeasibleBudgetError
        Nothing fits; states the smallest peak seen (or the no-remat peak).
    """
    limit = _stop_limit(problem, budget_bytes) if keep_all else None
    peaks = []
    for c in candidates:
        p = c.plan_within(limit)
        if p is None:
            continue
        if p.simulation.peak_bytes <= budget_bytes:
            return RawSolution(_handed_out(p), message=p.message, extras=dict(p.extras), simulation=p.simulation)
        peaks.append(p.simulation.peak_bytes)
    if keep_all:
        return _keep_all_or_infeasible(problem, budget_bytes, peaks, solver, detail)
    raise _infeasible(solver, budget_bytes, peaks, detail)


# --------------------------------------------------------------------- solvers
@register_solver("none")
class NoRematSolver(Solver):
    """Keep every activation: eager PyTorch's plan (free after last use).

    The reference every budget refers to; infeasible whenever the budget is
    below the no-remat peak.  Its cost (no added time) is optimal when it is
    feasible, so its status is ``"optimal"`` and it reports the compute floor
    (:func:`~libra_opt.solvers.certificates.compute_floor_s`, the no-remat
    step time when every node leads to an output) as a ``"hybrid"`` lower
    bound, valid for any plan.

    Source: ``torch.fx``'s free-after-last-use schedule, as in
    :func:`libra_opt.schedule.no_remat_schedule`.
    """

    name = "none"
    citation = "No rematerialization: eager PyTorch's free-after-last-use plan (torch.fx liveness)"

    def _solve(self, problem: RematProblem, budget_bytes: int) -> RawSolution:
        peak = no_remat_peak(problem)   # simulated once per problem (the budget was parsed against it)
        if peak > budget_bytes:
            raise InfeasibleBudgetError(budget_bytes, peak, self.name, "the no-remat peak is over the budget")
        return RawSolution(no_remat_schedule(problem), status=OPTIMAL, bounds=(floor_bound(problem, budget_bytes, self.name),),
                           message="no rematerialization")


@register_solver("checkpoint-all")
class CheckpointAllSolver(Solver):
    """Recompute every activation that can be recomputed.

    Every storage with a default window (saved for backward) is evicted after
    its last forward use and recomputed, with its whole recomputation chain
    back to the graph inputs, before its first backward use; storages of
    non-recomputable producers (and those whose chain would re-run one) are
    kept.  The most memory-frugal recompute plan without checkpoints, at a
    cost quadratic in depth.  Budget-oblivious: one plan.

    Note: Checkmate's baseline of the same name means the opposite (keep all,
    i.e. ``none``); this one is ``torch.utils.checkpoint`` around every op.

    Source: ``torch.utils.checkpoint.checkpoint`` applied op by op; the
    store-nothing end of Chen et al. 2016, sec. 4.
    """

    name = "checkpoint-all"
    citation = ("torch.utils.checkpoint around every op (store nothing, recompute from the inputs); "
                "cf. " + _CHEN + ", sec. 4")

    def plans(self, problem: RematProblem) -> Iterator[BaselinePlan]:
        """The one plan (budget-oblivious), as a one-item iterator."""
        return (c.plan() for c in self.candidates(problem))

    def candidates(self, problem: RematProblem) -> Iterator[BaselineCandidate]:
        """:meth:`plans`, each before it is lowered, with its lower bound (:class:`BaselineCandidate`)."""
        windows = default_windows(problem)
        dec = safe_recompute_decisions(problem, windows, windows)
        n = sum(p == Policy.RECOMPUTE for p in dec.values())

        def build(limit: int | None) -> BaselinePlan | None:
            got = _evaluate(problem, dec, windows, limit=limit)
            return None if got is None else BaselinePlan(
                *got, f"recompute {n} of {len(windows)} saved activation storages",
                {"recomputed_storages": n, "kept_storages": len(dec) - n})
        yield BaselineCandidate(build, recompute_bound_s(problem, dec),
                                lambda limit: _proven_over(problem, dec, windows, limit=limit))

    def _solve(self, problem: RematProblem, budget_bytes: int) -> RawSolution:
        return _first_fitting(problem, self.candidates(problem), budget_bytes, self.name,
                              "recomputing every activation")


@dataclass(frozen=True)
class ChenOptions:
    """Options of the Chen baselines.

    Attributes
    ----------
    candidates : {"articulation", "all"}
        Where a segment may end: the articulation points of the forward graph
        (Chen et al.'s choice; :func:`forward_cut_points`) or every forward
        node (Checkmate's "linearized" variant).
    """

    candidates: str = "articulation"

    def __post_init__(self):
        _check_candidates(self.candidates)


def _check_candidates(which) -> None:
    if which not in ("articulation", "all"):
        raise ValueError(f"candidates={which!r}; use 'articulation' or 'all'")


@register_solver("chen-sqrt")
class ChenSqrtSolver(Solver):
    """Chen et al.'s sqrt(n) checkpointing.

    Splits the forward into about sqrt(n) segments at candidate positions
    (``n`` candidates) and keeps the segment boundaries' outputs; every other
    saved activation is evicted after its forward use, and each segment's
    forward is replayed once from its kept input when the backward reaches the
    segment, its results kept for the segment's backward
    (:func:`segment_windows`).  Budget-oblivious: one plan; infeasible when its
    peak is over budget.

    Source: Chen, Xu, Zhang, Guestrin, "Training Deep Nets with Sublinear
    Memory Cost" (2016), sec. 4.1; on DAGs as in Checkmate's baseline (Jain et
    al., MLSys 2020, sec. 6.1).
    """

    name = "chen-sqrt"
    citation = _CHEN + ", sec. 4.1 (sqrt(n) segments)"
    Options = ChenOptions

    def plans(self, problem: RematProblem) -> Iterator[BaselinePlan]:
        """The one plan (budget-oblivious), as a one-item iterator."""
        return (c.plan() for c in self.candidates(problem))

    def candidates(self, problem: RematProblem) -> Iterator[BaselineCandidate]:
        """:meth:`plans`, each before it is lowered, with its lower bound (:class:`BaselineCandidate`)."""
        windows = default_windows(problem)
        ckpt = chen_sqrt_checkpoints(_candidates(problem, self.options.candidates))
        yield _checkpoint_candidate(problem, ckpt, windows, f"{len(ckpt)} checkpoints (segment boundaries)",
                                    {"checkpoints": ckpt})

    def _solve(self, problem: RematProblem, budget_bytes: int) -> RawSolution:
        return _first_fitting(problem, self.candidates(problem), budget_bytes, self.name, "sqrt(n) checkpoints")


@dataclass(frozen=True)
class ChenGreedyOptions:
    """Options of ``chen-greedy``.

    Attributes
    ----------
    candidates : {"articulation", "all"}
        As for ``chen-sqrt``.
    num_thresholds : int
        Segment budgets ``B`` tried (bytes, geometric between the smallest
        output and the whole forward's bytes, plus 0).
    """

    candidates: str = "articulation"
    num_thresholds: int = 48

    def __post_init__(self):
        _check_candidates(self.candidates)
        if not isinstance(self.num_thresholds, int) or self.num_thresholds < 2:
            raise ValueError(f"num_thresholds={self.num_thresholds!r}; use an int >= 2")


@register_solver("chen-greedy")
class ChenGreedySolver(Solver):
    """Chen et al.'s greedy segment planning, searched over its threshold.

    For each segment budget ``B`` (:func:`chen_greedy_checkpoints`) the plan
    keeps the checkpoints' outputs and recomputes the rest; the plan returned
    is the one with the least added time whose simulated peak is within the
    memory budget.  Infeasible when no threshold fits; the error states the
    smallest peak over all thresholds.

    Source: Chen, Xu, Zhang, Guestrin (2016), Algorithm 3 ("memory planning
    with budget") and sec. 4.2's search over ``B``; swept as in Checkmate's
    "Chen et al. greedy" baseline (Jain et al., MLSys 2020, sec. 6.1).
    """

    name = "chen-greedy"
    citation = _CHEN + ", Algorithm 3 (greedy memory planning with a segment budget)"
    Options = ChenGreedyOptions

    def thresholds(self, problem: RematProblem) -> list[float]:
        """Segment budgets tried (bytes), ascending."""
        pos = [s for s in _forward_output_bytes(problem) if s > 0]
        if not pos:
            return [0.0]
        lo, hi = min(pos), sum(pos)
        k = self.options.num_thresholds
        return [0.0] + list(np.geomspace(lo, hi, k - 1))

    def plans(self, problem: RematProblem) -> Iterator[BaselinePlan]:
        """One plan per distinct checkpoint set over :meth:`thresholds`, lazily."""
        return (c.plan() for c in self.candidates(problem))

    def candidates(self, problem: RematProblem) -> Iterator[BaselineCandidate]:
        """:meth:`plans`, each before it is lowered, with its lower bound (:class:`BaselineCandidate`)."""
        windows = default_windows(problem)
        cand = _candidates(problem, self.options.candidates)
        seen: set[tuple[int, ...]] = set()
        for b in self.thresholds(problem):
            ckpt = tuple(chen_greedy_checkpoints(problem, cand, b))
            if ckpt in seen:
                continue
            seen.add(ckpt)
            yield _checkpoint_candidate(problem, ckpt, windows, f"segment threshold {b:.0f} bytes: {len(ckpt)} "
                                        f"checkpoints", {"checkpoints": list(ckpt), "threshold_bytes": float(b)})

    def _solve(self, problem: RematProblem, budget_bytes: int) -> RawSolution:
        """The plan with the least ``(added_s, peak_bytes)`` (then the first
        threshold) among those within the budget.

        Plans are built in ascending order of their lower bound on added time
        (:attr:`BaselineCandidate.added_s_bound`), and the search stops at the
        first whose bound is above the added time of the best plan found that
        fits (:meth:`BaselineCandidate.cannot_beat`): it, and every later one,
        can neither be cheaper nor tie.  The
        answer is the one of building every plan; where none fits, every plan
        is tried (the error states the smallest peak of them all, or the
        no-remat peak).  Under the no-remat peak a plan is lowered only until
        its peak reaches it (:func:`_stop_limit`): it cannot fit, and keeping
        every activation needs no more; a plan shown over the budget without
        being lowered (:meth:`BaselineCandidate.surely_over`) is lowered only
        where no plan fits (for the error's smallest peak)."""
        cands = list(self.candidates(problem))
        limit = _stop_limit(problem, budget_bytes)
        best: tuple | None = None   # (added_s, peak_bytes, threshold index, plan)
        for i in sorted(range(len(cands)), key=lambda i: cands[i].added_s_bound):
            if best is not None and cands[i].cannot_beat(best[0], problem.total_compute_s):
                break
            if cands[i].surely_over(budget_bytes):   # cannot fit: built below only where none fits
                continue
            p = cands[i].plan_within(limit)
            if p is None:   # over the no-remat peak: cannot fit (_stop_limit)
                continue
            sim = p.simulation
            if sim.peak_bytes <= budget_bytes and (best is None or (sim.added_s, sim.peak_bytes, i) < best[:3]):
                best = (sim.added_s, sim.peak_bytes, i, p)
        if best is None:
            built = (c.plan_within(limit) for c in cands)   # every one was tried: none is lowered again
            return _keep_all_or_infeasible(problem, budget_bytes, [p.simulation.peak_bytes for p in built if p],
                                           self.name, f"{len(cands)} segment thresholds tried")
        p = best[3]
        return RawSolution(_handed_out(p), message=f"{p.message} (best of {len(cands)} thresholds)",
                           extras=dict(p.extras, thresholds_tried=len(cands)), simulation=p.simulation)


@dataclass(frozen=True)
class SwapAllOptions:
    """Options of ``swap-all``.

    Attributes
    ----------
    prefetch : {"auto", "late"} or int
        Where swap-ins are issued (:func:`libra_opt.lowering.lower`).  If the
        plan is over budget and this is not ``"late"``, the ``"late"`` plan
        (less memory in flight, more stalls) is tried too.
    """

    prefetch: object = "auto"

    def __post_init__(self):
        ok = self.prefetch in ("auto", "late") or (isinstance(self.prefetch, int)
                                                    and not isinstance(self.prefetch, bool) and self.prefetch >= 0)
        if not ok:
            raise ValueError(f"prefetch={self.prefetch!r}; use 'auto', 'late' or a number of nodes >= 0")


@register_solver("swap-all")
class SwapAllSolver(Solver):
    """Offload every saved activation to host memory and prefetch it back.

    Every storage with a default window is copied out right after it is
    produced, released when the copy has finished, and copied back ahead of
    its first backward use (prefetches placed in reverse order of use so they
    do not collide on the host-to-device queue).

    Source: ``torch.autograd.graph.save_on_cpu(pin_memory=True)``, with the
    prefetching of vDNN (Rhu et al., MICRO 2016, sec. III).
    """

    name = "swap-all"
    citation = ("torch.autograd.graph.save_on_cpu (offload every saved activation); prefetch as in "
                "vDNN, Rhu et al., MICRO 2016")
    Options = SwapAllOptions

    def plans(self, problem: RematProblem) -> Iterator[BaselinePlan]:
        """The plan with the chosen ``prefetch``, then (unless it is
        ``"late"``) the late-prefetch one, lazily."""
        return (c.plan() for c in self.candidates(problem))

    def candidates(self, problem: RematProblem) -> Iterator[BaselineCandidate]:
        """:meth:`plans`, each before it is lowered (:class:`BaselineCandidate`, with its
        :func:`copy_bound_s`: ``libra``'s portfolio builds neither where its own plan is cheaper)."""
        windows = default_windows(problem)
        dec = {s: Policy.SWAP for s in windows}
        bound = copy_bound_s(problem, dec)
        for pf in [self.options.prefetch] + (["late"] if self.options.prefetch != "late" else []):
            def build(limit: int | None, pf=pf) -> BaselinePlan | None:
                got = _evaluate(problem, dec, windows, prefetch=pf, limit=limit)
                return None if got is None else BaselinePlan(*got, f"swap {len(dec)} storages, prefetch={pf!r}",
                                                             {"swapped_storages": len(dec), "prefetch": pf})
            yield BaselineCandidate(build, bound)   # (no prover: PeakProver proves recompute plans only)

    def _solve(self, problem: RematProblem, budget_bytes: int) -> RawSolution:
        return _first_fitting(problem, self.candidates(problem), budget_bytes, self.name,
                              "swapping every saved activation", keep_all=False)
