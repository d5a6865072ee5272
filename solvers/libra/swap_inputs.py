"""Swapped chain inputs: the last pass of the ``libra`` solver in hybrid mode.

A recomputation chain regenerates an evicted storage by replaying its producer
and, recursively, every input that is no longer resident.  Where those inputs
were freed after their last use, the chain can be cut: the inputs at the cut
are copied to the host right after they are produced, and swapped back in for
the chain (a *swapped retention*,
:class:`~libra_opt.passes.lowering.Retain` with ``swap=True``), so that the
chain replays only the nodes above the cut.  The hybrid MILP's optima do
this (``benchmarks/hybrid_optimality.py --generate 30 --seeds 1``, copies as
fast as compute, 0.8 of the peak: the chains that regenerate nodes 8 and 20
read their inputs 6, 7 and 18, 19 from the host); the descents cannot, as
their estimate keeps a tensor resident or regenerates it.

The pass works on a lowered plan (its :class:`~libra_opt.passes.lowering.Eviction`
and ``Retain`` decisions), judged by the simulator:

1. the plan's chains are read off its schedule (the recomputations before
   each first computation), longest recompute time first;
2. for each chain, the cuts below its last ``d`` nodes (``d = 1 ..``
   :data:`MAX_DEPTH`) are tried: the tensors those nodes read from the rest
   of the chain, each a storage base freed after its last use;
3. each cut is lowered and simulated with the swap-ins at the lowering's
   prefetch rule; where that goes over the budget, the earliest swap-in
   position that fits is searched for between the cut's last use and the
   chain (later swap-ins hold less memory there and stall longer);
4. the cheapest cut within the budget is taken where it lowers the simulated
   step time; the chains are read again from the new plan.

At most :data:`MAX_LOWERINGS` plans are lowered per call, so the pass is
deterministic (the same plan for ``solve`` and ``solve_many``) and bounded.

Sources: Beaumont et al., "Efficient Combination of Rematerialization and
Offloading for Training DNNs" (NeurIPS 2021), sec. 4 (a value offloaded and
prefetched for the recomputation that reads it); Checkmate's S (Jain et al.,
MLSys 2020) for a value kept across stages, which a swapped retention
replaces by two copies.
"""
from __future__ import annotations

from typing import NamedTuple, Sequence

from libra_opt.ir.problem import RematProblem
from libra_opt.ir.schedule import Op, Schedule
from libra_opt.passes.lowering import Retain, lower
from libra_opt.passes.simulator import SimulationResult, simulate

#: cuts tried per chain: below its last 1 .. MAX_DEPTH nodes
MAX_DEPTH = 4
#: most plans the pass lowers and simulates per call
MAX_LOWERINGS = 40


class Chain(NamedTuple):
    """The recomputations that run before node ``before``'s first
    computation, in order: ``nodes`` (node ids), ``time_s`` their recompute
    time (s, the problem's executor cost model)."""

    before: int
    nodes: tuple
    time_s: float


class SwappedInputs(NamedTuple):
    """The result of :func:`swap_chain_inputs`: the plan's decisions with the
    swapped retentions added (``items``), its schedule and simulation, and
    the swapped retentions taken (``taken``, empty where none was)."""

    items: tuple
    schedule: Schedule
    simulation: SimulationResult
    taken: tuple


def chains(problem: RematProblem, schedule: Schedule) -> list[Chain]:
    """The recomputation chains of ``schedule``: per first computation of a
    node, the nodes computed again right before it (since the previous first
    computation), in schedule order.  Only non-empty chains."""
    seen: set[int] = set()
    pending: list[int] = []
    rtime = problem.tables.n_rtime
    out = []
    for ins in schedule.instructions:
        if ins.op != Op.COMPUTE:
            continue
        if ins.arg in seen:
            pending.append(ins.arg)
            continue
        seen.add(ins.arg)
        if pending:
            out.append(Chain(ins.arg, tuple(pending), float(sum(rtime[x] for x in pending))))
            pending = []
    return out


def cuts(problem: RematProblem, chain: Chain, retained: set[int]) -> list[tuple[int, ...]]:
    """The cuts of ``chain`` that may be swapped in instead of recomputed:
    for ``d = 1 ..`` :data:`MAX_DEPTH`, the tensors its last ``d`` nodes read
    that earlier nodes of the chain made, where each is an activation's
    storage base, not a step output, not in ``retained`` (tensors the plan
    retains already), and its storage's last use (a view's too) is the
    tensor's own and comes before the chain.
    Distinct cuts only, in order of ``d``."""
    tab = problem.tables
    uses, storage, freeable, last = tab.uses, tab.t_storage, tab.t_freeable, tab.t_last_read
    nodes = chain.nodes
    out: list[tuple[int, ...]] = []
    for d in range(1, min(MAX_DEPTH, len(nodes) - 1) + 1):
        above, below = set(nodes[-d:]), set(nodes[:-d])
        cut = sorted({t for x in above for t in problem.nodes[x].inputs
                      if problem.tensors[t].producer in below})
        if not cut or tuple(cut) in out:
            continue
        if all(freeable[t] and storage[t] == t and t not in retained and t in uses
               and uses[t][-1] == last[t] < chain.before for t in cut):
            out.append(tuple(cut))
    return out


class _Lowerings:
    """Lower and simulate plans, counting them against :data:`MAX_LOWERINGS`."""

    def __init__(self, problem: RematProblem, budget: int):
        self.problem, self.budget, self.left = problem, budget, MAX_LOWERINGS

    def __call__(self, items: Sequence) -> tuple[Schedule, SimulationResult] | None:
        """The plan lowered and simulated; ``None`` where no lowering is left."""
        if self.left <= 0:
            return None
        self.left -= 1
        sched = lower(self.problem, items)
        return sched, simulate(self.problem, sched)


def _try_cut(run: _Lowerings, items: list, cut: tuple, before: int, last: list[int]):
    """The plan ``items`` with ``cut`` swapped in for the chain before node
    ``before``: ``(schedule, simulation, retentions)`` within the budget,
    cheapest of the prefetch positions tried, or ``None``."""
    def attempt(pos):
        rets = tuple(Retain(t, before, swap=True, prefetch_after=pos) for t in cut)
        got = run(items + list(rets))
        return None if got is None else (*got, rets)

    first = attempt(None)
    if first is None or first[1].peak_bytes <= run.budget:
        return first
    lo, hi = max(last[t] for t in cut) + 1, before - 1
    if lo > hi:
        return None
    late = attempt(hi)
    if late is None or late[1].peak_bytes > run.budget:
        return None
    best = late
    while lo < hi:   # the earliest swap-in that fits (memory falls as the swap-ins move later)
        mid = (lo + hi) // 2
        got = attempt(mid)
        if got is None:
            break
        if got[1].peak_bytes <= run.budget:
            hi = mid
            if got[1].added_s < best[1].added_s:
                best = got
        else:
            lo = mid + 1
    return best


def swap_chain_inputs(problem: RematProblem, items: Sequence, schedule: Schedule, simulation: SimulationResult,
                      budget: int) -> SwappedInputs:
    """Cut the recomputation chains of a plan by swapped retentions (module
    docstring), each taken where the simulated plan stays within ``budget``
    (bytes) and its step time falls.

    Parameters
    ----------
    problem : RematProblem
        With copy bandwidths (``problem.device``); without them nothing is tried.
    items : sequence of Eviction or Retain
        The plan's decisions, as given to :func:`~libra_opt.passes.lowering.lower`.
    schedule, simulation
        The plan lowered and simulated (within ``budget``).
    budget : int
        Bytes; the simulated peak of a plan taken is at most this.

    Returns
    -------
    SwappedInputs
        The input plan (``taken`` empty) where no cut lowers its step time.
    """
    items = list(items)
    taken: list[Retain] = []
    dev = problem.device
    if not (dev.h2d_bytes_per_s > 0 and dev.d2h_bytes_per_s > 0):
        return SwappedInputs(tuple(items), schedule, simulation, ())
    run = _Lowerings(problem, budget)
    last = problem.tables.t_last_read
    tried: set[tuple[int, tuple]] = set()
    improved = True
    while improved and run.left > 0:
        improved = False
        retained = {r.tensor for r in items if isinstance(r, Retain)}
        for ch in sorted(chains(problem, schedule), key=lambda c: (-c.time_s, c.before)):
            best = None
            for cut in cuts(problem, ch, retained):
                if (ch.before, cut) in tried:
                    continue
                tried.add((ch.before, cut))
                got = _try_cut(run, items, cut, ch.before, last)
                if got is not None and got[1].added_s < (best or (None, simulation))[1].added_s * (1 - 1e-9):
                    best = got
            if best is not None:
                schedule, simulation, rets = best
                items += rets
                taken += rets
                improved = True
                break   # the chains of the new plan
            if run.left <= 0:
                break
    return SwappedInputs(tuple(items), schedule, simulation, tuple(taken))


__all__ = ["Chain", "SwappedInputs", "chains", "cuts", "swap_chain_inputs", "MAX_DEPTH", "MAX_LOWERINGS"]
