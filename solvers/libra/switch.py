"""Policy switches of the ``libra`` solver (hybrid mode): after the descent and
the undo pass, move swapped windows to recomputation and recomputed windows to
swaps where the plan's estimated added time goes down within the budget.

Why the descent leaves this on the table: it prices a swap whose copies hide
behind compute at 0 added seconds, so early in the descent it swaps storages
that are cheap to recompute; their copies then occupy the two copy queues (one
per direction, at the device's measured bandwidths), and later swaps either
stall or cannot hide, so the descent recomputes expensive storages (long
chains) instead.  A recompute-only descent leaves every copy queue idle, so
its plan is often the best start: swapping its most expensive recomputations
beats the hybrid descent's own plan (``h100_gpt2-medium_b8`` at 0.3 of its
peak: 0.0396 s added against 0.0500 s; ``benchmarks/hybrid_gain.py``).  This
pass, on a prepared plan (:meth:`~libra_opt.solvers.libra.finish.Finisher.prepare`):

1. **swap -> recompute**: each swapped window whose producer is recomputable,
   the ones whose swap stalls most first (then the cheapest to recompute), is
   switched to recomputation where that lowers the estimated added time (its
   stall, and the stalls its copies cause to the others, go away) and every
   point it raises stays within the budget: queue time is freed for others;
2. **recompute -> swap**: the most expensive recomputed windows (their
   recorded added time: chains included), in that order, are each scored as
   a swap whose swap-in hides behind compute (``floor=0``) on the plan as
   it is by then and taken where that saves time within the budget (first
   improvement: the freed queue time carries the storages that cost most to
   regenerate.  Scoring a batch first and taking the largest savings,
   each scored again, took 1.6x the evaluations on the recompute-only
   plans of a ``h100_gpt2-medium_b8`` sweep, for plans that differ by at
   most 5%: over 20-budget sweeps of the four H100 profiles, 7 budgets
   cheaper on ``h100_llama_b8``, 2 costlier on ``h100_resnet50_b128`` (up
   to 0.3%) and 1 on ``h100_gpt2-medium_b8`` (0.02%); ``h100_resnet50_b128``
   at 0.4, 3.8 -> 4.0 ms).  A window whose storage, held until its copy out
   can end (:func:`~libra_opt.solvers.libra.swaps.release_bound`), would
   go over the budget there is refused unscored (on a
   ``h100_gpt2-medium_b8`` sweep: 722 of the pass's 2,267 refusals, none of
   its 491 switches);
3. both again while a round changes something or recomputed windows are
   left untried (at most :data:`MAX_ROUNDS`),
   then the undo pass (:func:`~libra_opt.solvers.libra.tidy.undo_pass`).

Each switch is scored with :meth:`Timeline.evaluate
<libra_opt.solvers.libra.estimate.Timeline.evaluate>` (chains and the whole
swap layer recomputed: queue contention and stalls included) and taken with
:meth:`~libra_opt.solvers.libra.estimate.Timeline.apply`; the number of
evaluations is bounded (:data:`MAX_SWAP_TRIES`, :data:`MAX_REC_TRIES` per
round), so the pass costs a few hundredths of a second on 3,000-node
problems.  The pass only proposes a plan: where a plan of the descents
meets the budget, the solver lowers and simulates the switched plans
estimated cheaper than it and returns one only where it is cheaper simulated
too (``LibraSolver._libra_plan``), so the returned plan is never costlier
and the budgets met are the same as without the pass.

Source: Libra (Wang, NTHU 2024), hybrid policy (recompute what is cheap to
regenerate, swap where a transfer hides behind compute), as a 1-opt local
search over the policy of each decision (a neighbourhood move of the greedy's
decision set); the copy-queue model is :mod:`libra_opt.solvers.libra.swaps`.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np

from libra_opt.ir.units import format_seconds
from libra_opt.passes.lowering import Policy

from .estimate import REC, SWAP, Timeline
from .swaps import release_bound
from .records import HasProblem
from .tidy import trim_retentions, undo_pass

#: ``Decision.reason`` of a decision whose policy this pass switched
REASON_POLICY_SWITCH = "policy-switch"
#: rounds of (swap -> recompute, recompute -> swap)
MAX_ROUNDS = 2
#: swapped windows evaluated for a switch to recomputation per round
MAX_SWAP_TRIES = 16
#: recomputed windows evaluated for a switch to a swap per round
MAX_REC_TRIES = 48
#: relative saving a switch must bring to be taken
MIN_GAIN = 1e-9



@dataclass(slots=True)
class _Switched:
    """The plan as the switches taken so far left it."""
    tl: Timeline       # the switched timeline: the prepared one until a switch is taken, then a private copy
    records: dict      # window id -> Decision
    moves: list = field(default_factory=list)   # (window, policy, effect, trimmed) of each switch taken, in order

    @property
    def taken(self) -> int:
        """Switches taken (a plan with as many is the same plan: scores keyed by it stay valid)."""
        return len(self.moves)


def _replayed(tl: Timeline, moves: list) -> Timeline:
    """``tl`` with ``moves`` (``(window, policy, effect, trimmed)``) applied
    in order, each followed by :func:`~libra_opt.solvers.libra.tidy.trim_retentions`
    where ``trimmed``, on a copy (``tl`` itself where there are none): the
    plan as those switches left it (``Timeline.apply`` is deterministic)."""
    if not moves:
        return tl
    new = tl.copy()
    for j, policy, eff, trimmed in moves:
        new.apply(j, policy, eff)
        if trimmed:
            trim_retentions(new)
    return new


def _switchable(tl: Timeline, j: int, policy: int) -> bool:
    """Whether window ``j``, now under the other eviction policy, may move to
    ``policy``: its storage not retained and no other window of the storage
    under the other eviction policy (the descent's rule,
    ``refine.Refiner._evaluate``).  A window ended at a chain that regenerates its
    storage (segment-wise regeneration) may become a swap that brings the
    storage back by then."""
    other = SWAP if policy == REC else REC
    s = int(tl.windows.w_s[j])
    if int(tl.state.pol[j]) != other or s in tl.state.s_retained or int(tl.windows.w_bytes[j]) <= 0:
        return False
    if policy == REC and not tl.windows.w_rec_ok[j]:
        return False
    return not any(int(tl.state.pol[k]) == other for k in tl.state.s_win.get(s, ()) if k != j)


def _swap_order(ref: HasProblem, tl: Timeline, records: dict) -> list[int]:
    """Swapped windows to try moving to recomputation: most stall first, then
    the cheapest producer to recompute (at most :data:`MAX_SWAP_TRIES`)."""
    sw = tl.state.swap
    stall = dict(zip(sw.ids.tolist(), sw.stall_s.tolist()))
    rt = ref.problem.recompute_time
    cand = [j for j in records if _switchable(tl, j, REC)]
    cand.sort(key=lambda j: (-stall.get(j, 0.0), float(rt[tl.windows.w_prod[j]]), j))
    return cand[:MAX_SWAP_TRIES]


def _rec_order(tl: Timeline, records: dict, skip: set) -> list[int]:
    """Recomputed windows (not in ``skip``) to try moving to a swap: the most
    expensive decisions first (recorded added time, chains included), at
    most :data:`MAX_REC_TRIES`."""
    out = []
    for j in sorted(records, key=lambda j: (-records[j].added_s, j)):   # (sorted first: few are asked)
        if j not in skip and _switchable(tl, j, SWAP):
            out.append(j)
            if len(out) == MAX_REC_TRIES:
                break
    return out


def _score(tl: Timeline, j: int, policy: int, budget: int):
    """The effect of moving window ``j`` to ``policy`` (a swap's swap-in where
    it hides behind compute) where it lowers the estimated added time and
    keeps every raised point within ``budget``; else ``None``.  A recomputed
    window whose storage, held until its copy out can end
    (:func:`~libra_opt.solvers.libra.swaps.release_bound`), would go over
    the budget there is refused without an evaluation (the descent's rule
    for a swap that cannot release its storage in time)."""
    if policy == SWAP and tl.tables.overlap and _held_over(tl, j, budget):
        return None
    # stop_above / stop_cost: a change that raises a point over the budget, or surely saves too little,
    # is refused before its chains are replayed
    # (floor=0: a swap-in that hides behind compute; evaluate reads floor for a swap only)
    least = -MIN_GAIN * max(tl.added_s(), 1e-30)
    eff = tl.evaluate(j, policy, floor=0, stop_above=budget, stop_cost=least)
    if not eff.feasible or eff.raised_max > budget or not eff.cost_s < least:
        return None
    return eff


def _score_trimmed(tl: Timeline, j: int, budget: int):
    """Where :func:`_score` refuses moving recomputed window ``j`` to a swap
    and the plan retains tensors for recomputation chains: the effect of
    that move followed by :func:`~libra_opt.solvers.libra.tidy.trim_retentions`
    (a tensor retained for the chain that regenerated ``j``'s storage holds
    its bytes for nothing once the storage is swapped instead), where the
    two lower the estimated added time and keep the estimated peak within
    ``budget``; else ``None``.  ``random_layered_graph(30, seed=1)`` with
    copies as fast as compute at 0.8 of its peak: swapping node 12's output,
    recomputed for node 26 with node 8's output retained for that chain,
    raised position 26 140 bytes over the budget."""
    if not tl.state.t_until or (tl.tables.overlap and _held_over(tl, j, budget)):
        return None
    t2 = tl.copy()
    eff = t2.evaluate(j, SWAP, floor=0)
    if not eff.feasible:
        return None
    before = t2.added_s()
    t2.apply(j, SWAP, eff)
    if not trim_retentions(t2):
        return None
    if int(t2.memory().max()) > budget or not t2.added_s() < before - MIN_GAIN * max(before, 1e-30):
        return None
    return eff


def _held_over(tl: Timeline, j: int, budget: int) -> bool:
    """Whether recomputed window ``j``, swapped, holds its storage over the
    budget (bytes) before its copy out can end: the graph memory at some
    position from the window's start to its release bound (``st.C``, which
    a swap's copies only raise while nothing stalls) plus its bytes."""
    a = int(tl.windows.w_a[j])
    lo = int(release_bound(tl, np.array([j]))[0])
    return lo > a + 1 and int(tl.state.C[a + 1:lo].max()) + int(tl.windows.w_bytes[j]) > budget


def _record(records: dict, j: int, policy: int, eff, saved_s: float) -> None:
    """``records[j]`` after window ``j`` moved to ``policy`` (reason :data:`REASON_POLICY_SWITCH`)."""
    d = records[j]
    name, was = Policy.of_code(policy).value, d.policy
    why = ("its stalls and the copy-queue time it held are freed" if policy == REC
           else "the copy queues have room for it")
    detail = (d.detail.split(": ", 1)[0].replace(was, name, 1)
              + f": switched from {was} to {name} after the descent, {format_seconds(saved_s)} "
                f"less added time for the whole plan ({why})")
    records[j] = dataclasses.replace(d, policy=name, added_s=float(max(d.added_s + eff.cost_s, 0.0)),
                                     reason=REASON_POLICY_SWITCH, detail=detail)


def switch_policies(ref: HasProblem, tl: Timeline, records: dict, budget: int) -> tuple[Timeline, dict, int]:
    """The policy switches (module docstring) on a prepared plan for ``budget``.

    Parameters
    ----------
    ref : HasProblem
        The descent the plan comes from (``refine.Refiner``); only its
        ``problem`` is read.
    tl : Timeline
        The prepared timeline; not changed.
    records : dict
        Window id -> :class:`~libra_opt.solvers.libra.explain.Decision`; not changed.
    budget : int
        Graph-memory budget (bytes); the estimated peak of ``tl`` must be
        within it (otherwise nothing is tried).

    Returns
    -------
    (Timeline, dict, int)
        The switched timeline (a copy), its records and how many switches were
        taken; ``tl`` and ``records`` themselves where none was.
    """
    if not records or not tl.tables.overlap or int(tl.memory().max()) > budget:
        return tl, records, 0
    state = _Switched(tl, dict(records))
    switched: set[int] = set()   # windows this pass moved: never moved back
    tried: set[int] = set()      # recomputed windows already scored for a swap
    refused: dict[int, int] = {}  # swapped window -> switches taken when its move to recomputation was refused

    def take(j: int, policy: int, eff, trimmed: bool = False) -> None:
        """Move window ``j`` to ``policy``, kept where the estimated peak stays
        within the budget.  Applied in place to the plan's private copy (made
        at the first switch): where it is not kept (rare: none in the sweeps
        of ``h100_gpt2-medium_b8`` and the 5k-op synthetic transformer), the
        plan before it is rebuilt from the switches taken, where a copy per
        switch was 5% of a 20k-op sweep.  ``trimmed``: the retentions no
        chain reads any more are trimmed after it (:func:`_score_trimmed`)."""
        if state.tl is tl:
            state.tl = tl.copy()
        new = state.tl
        before = new.added_s()
        new.apply(j, policy, eff)
        if trimmed:
            trim_retentions(new)
        if int(new.memory().max()) > budget:   # after the swap layer's refresh: not taken
            state.tl = _replayed(tl, state.moves)
            return
        _record(state.records, j, policy, eff, before - new.added_s())
        state.moves.append((j, policy, eff, trimmed))
        switched.add(j)

    for _ in range(MAX_ROUNDS):
        taken = state.taken
        # swap -> recompute: first improvement, most stall first
        for j in _swap_order(ref, state.tl, state.records):
            # refused on this very plan (as many switches taken: the same plan) in an earlier round: again
            if j not in switched and refused.get(j) != state.taken:
                eff = _score(state.tl, j, REC, budget)
                if eff is not None:
                    take(j, REC, eff)
                else:
                    refused[j] = state.taken
        # recompute -> swap: first improvement, most expensive recomputation first (each scored on the
        # timeline as it is by then: every swap taken uses copy-queue time the next may need)
        order = _rec_order(state.tl, state.records, tried | switched)
        batch_left = len(order) == MAX_REC_TRIES   # more recomputed windows than one batch: the next round tries them
        for j in order:
            tried.add(j)
            if not _switchable(state.tl, j, SWAP):
                continue
            eff = _score(state.tl, j, SWAP, budget)
            if eff is not None:
                take(j, SWAP, eff)
            else:
                eff = _score_trimmed(state.tl, j, budget)
                if eff is not None:
                    take(j, SWAP, eff, trimmed=True)
        if state.taken == taken and not batch_left:
            break
    t2, r2 = state.tl, state.records
    if not state.taken:
        return tl, records, 0
    undo_pass(t2, r2, budget)
    if not t2.added_s() < tl.added_s() or int(t2.memory().max()) > budget:
        return tl, records, 0
    return t2, r2, state.taken


__all__ = ["switch_policies", "REASON_POLICY_SWITCH", "MAX_ROUNDS", "MAX_SWAP_TRIES", "MAX_REC_TRIES"]
