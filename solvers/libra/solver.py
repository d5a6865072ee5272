"""The default solver ``libra``: greedy refinement of a hybrid recompute + swap plan.

Libra (Wang, NTHU 2024, "Libra: Python-level tensor re-materialization for GPU
memory optimization in deep learning") plans rematerialization by refining
the eager (keep-everything) plan greedily from its profiled peak:

1. **Peak memory profiling.**  From the memory timeline, find the peak and
   the activations live across it that are not in use at that moment (the
   candidates: storage windows from :func:`~libra_opt.passes.lowering.default_windows`,
   or every gap between uses, :func:`~libra_opt.passes.lowering.all_windows`, on a
   single-phase graph).
2. **Memory-reduction estimation.**  For each candidate and policy, the bytes
   it removes at the peak and the time it adds: recomputation costs its
   producer plus every evicted input it needs again (the *recomputation
   chain*, with the memory that chain occupies when it runs); swapping costs
   the part of the transfer that does not hide behind the compute between
   swap-out and use, at the device's measured bandwidth, with the copy
   queues' contention (:mod:`libra_opt.solvers.libra.estimate`).
3. **Greedy refinement.**  Take the candidate with the most bytes removed at
   the peak per added second.  Recomputation is the first choice; a swap is
   taken where recomputing (or its chain) would push another point of the
   timeline up to the peak, or where the transfer costs less (it hides behind
   compute).  A move is admissible only if every point it raises stays below
   the current peak, so the peak never rises and one descent passes every
   budget on the way down.  The timeline is updated incrementally.
4. **Finish.**  A final pass undoes decisions the budget no longer needs
   (most expensive first); the plan is lowered (:func:`~libra_opt.passes.lowering.lower`)
   and simulated; if the simulated peak is still over budget, refinement
   continues against the simulated timeline.

:meth:`LibraSolver.solve_many` plans many budgets from one descent: the
decision set is recorded when the peak first drops under each budget, and
each is finished as a single solve would, so results equal single-budget
solves, but for one thing: a plan for a lower budget fits every higher one,
so the sweep returns, for each budget, the cheapest plan found for it or any
lower budget (monotone in cost).

Modules: :mod:`~libra_opt.solvers.libra.refine` (the descent and its
snapshots), :mod:`~libra_opt.solvers.libra.finish` (undo pass, segment-wise
regeneration, retention, lowering, simulation, repair),
:mod:`~libra_opt.solvers.libra.estimate` (the incremental timeline; with
:mod:`~libra_opt.solvers.libra.chains`, :mod:`~libra_opt.solvers.libra.swaps`
and :mod:`~libra_opt.solvers.libra.reshape`),
:mod:`~libra_opt.solvers.libra.explain` (decision records),
:mod:`~libra_opt.solvers.libra.records` (the records the parts share: moves,
snapshots, prepared and finished plans, the descent's interface),
:mod:`~libra_opt.solvers.libra.tidy` (the estimate-only passes over a
prepared plan), :mod:`~libra_opt.solvers.libra.exchange` (exchange moves),
:mod:`~libra_opt.solvers.libra.switch` (policy switches),
:mod:`~libra_opt.solvers.libra.reverse` (the reverse greedy) and
:mod:`~libra_opt.solvers.libra.continued` (the hybrid descent continued from
a recompute-only one's end).  The finish step is
composed around a descent (``Finisher(refiner)``), not inherited.

Beyond the thesis: a swap-in may be delayed past the peak it must cover
(paying a stall); where a chain regenerates an evicted storage before its own
use, the storage may be kept from there (Chen et al.'s segment-wise
regeneration); where recomputing at the use would raise a new peak, the
storage may be regenerated earlier, where memory is low, and kept until the use
(*early regeneration*, Checkmate's R recomputing a value at an earlier stage),
with a fallback descent without them for budgets they keep the descent from
reaching; after the descent, a tensor a chain would regenerate from scratch may
instead be kept resident past its last use until that chain (*retention*,
Checkmate's S); in hybrid mode a *portfolio* also runs the recompute-only and
swap-only descents and returns the cheapest simulated plan, and holds the
built-in baselines' plans (:class:`~libra_opt.solvers.baselines.BaselinePlan`,
built once per problem): ``swap-all``'s at every budget (two
lowerings), and where no descent meets a budget ``checkpoint-all``'s and,
where one of those meets it, ``chen-sqrt``'s and ``chen-greedy``'s, so hybrid
reaches as low as every single policy and baseline and costs no more than the
baselines it compares with, and where only waiting for copies out meets a budget,
or the plan found stalls for over a quarter of what it adds, a hybrid descent
that waits runs too, its plan finished apart and returned where cheaper
(:meth:`LibraSolver._waiting_hybrid`, :meth:`LibraSolver._less_stalling`),
and under the least memory every recompute-only descent reaches, a hybrid
descent continued from the lowest of their ends (the recompute-only plan
with swaps on top: :mod:`~libra_opt.solvers.libra.continued`), and where a
descent meets the budget one from each other end, their plans finished
apart and returned where cheaper; in swap-only mode, where the descents stop above a
budget, a *bulk move* (every window swapped at once, waiting for its copy out
and swapped in right before its use, then what the budget does not need given
back: :class:`_BulkSwapRefiner`) plans down to the memory floor, and the portfolio holds ``swap-all``'s plans
at every budget; in recompute-only mode the portfolio holds
``checkpoint-all``'s, ``chen-sqrt``'s and ``chen-greedy``'s plans at every
budget (on problems of up to 1,000 nodes; on larger ones where no descent
meets the budget); in both modes, where no descent meets a budget, the
*reverse greedy* (:mod:`~libra_opt.solvers.libra.reverse`: ``checkpoint-all``'s
store-nothing plan, then what the budget affords given back by the finish
step; problems of up to 200 nodes), and a budget under the memory floor
(no plan fits) skips the descents and goes to the tightening of the stated
minimum.  After the undo pass, *exchange moves*
(:mod:`~libra_opt.solvers.libra.exchange`) give back one of the most
expensive decisions and cover the budget again with cheaper ones (several
small recomputes instead of one large one), and a recomputation whose chain
regenerates another evicted storage may end that storage's window there
(both pay for one regeneration: ``Refiner._try_merge``).
In hybrid mode, *policy switches* (:mod:`~libra_opt.solvers.libra.switch`)
then move swaps that stall or crowd the copy queues to recomputation and the
most expensive recomputations to swaps that hide behind compute, on the
cheapest plan of each descent (those of the recompute-only descents first:
their copy queues are idle); the switched plans are candidates beside the
others.

Limits: greedy, so not optimal (compare ``checkmate-milp``); the estimate
mirrors the lowering and the simulator but can drift where swap-ins collide
with unfinished swap-outs (slow links), which the finish step repairs.
"""
from __future__ import annotations

import contextlib
import dataclasses
import gc
import logging
import math
import time
from dataclasses import dataclass
from typing import NamedTuple, Sequence

import numpy as np

from libra_opt.passes.bounds import memory_lower_bound
from libra_opt.errors import InfeasibleBudgetError, SolverError
from libra_opt.ir.problem import RematProblem
from libra_opt.ir.schedule import no_remat_schedule
from libra_opt.passes.simulator import no_remat_peak, simulate
from libra_opt.ir.units import parse_budget

from ..base import Solver
from ..baselines import BaselineCandidate, BaselinePlan
from .bounds import swap_only_lower_bounds
from .continued import ContinuedRefiner
from .exchange import MAX_NODES as EXCHANGE_MAX_NODES
from .explain import REASON_ONLY_POLICY, explain
from .estimate import SWAP
from .records import FinishedPlan, Prepared, Snapshot
from .refine import OneMoveRefiner, Refiner
from .reverse import ReverseRefiner
from .swap_inputs import swap_chain_inputs
from .switch import switch_policies
from ..registry import register_solver, solver_class
from ..result import FEASIBLE, TIME_LIMIT, RawSolution, SolveResult

log = logging.getLogger(__name__)

POLICY_MODES = ("hybrid", "recompute", "swap")
WINDOW_MODES = ("auto", "default", "all")
#: ``LibraOptions.exchange_effort``
EXCHANGE_EFFORTS = ("default", "thorough")


@contextlib.contextmanager
def _gc_paused():
    """Pause Python's cyclic garbage collector (``gc.disable``) for the
    duration: the descent allocates millions of short-lived, acyclic objects
    (reference counting frees them), and a full collection would otherwise
    walk every object of the caller's process, the problem included, several
    times per solve.  The previous state is restored on exit."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _no_cycle(err: BaseException) -> BaseException:
    """``err`` without its traceback, for a caller that keeps it past its
    ``except`` block: the traceback holds the frames it passed, the caller's
    among them, whose locals then hold ``err``, a reference cycle that only
    the cyclic collector frees, with every descent those frames hold
    (:func:`_gc_paused` holds it off until the solve ends: 30 ms of
    collection then on ``random_layered_gen_n1000`` recompute-only at 0.5 of
    its peak, where the tightening's failed budgets kept 29,000 objects).
    Source: the ``except ... as`` rule of the Python reference (the name is
    deleted at the end of the clause for this reason)."""
    if err.__suppress_context__:   # (``raise ... from None``: the exception it replaced is not shown, and
        err.__context__ = None     # its traceback holds frames too)
    return err.with_traceback(None)


def _paused(fn, *args):
    """``fn(*args)`` with the cyclic collector paused (:func:`_gc_paused`);
    an :class:`~libra_opt.errors.InfeasibleBudgetError` it raises is raised
    again without its traceback (:func:`_no_cycle`) once the collector is
    back: its frames would otherwise hold every descent alive when the
    collector resumes, and the collection the allocations made meanwhile
    start then walks them all (``resnet50-b4-cpu`` hybrid at 0.3 of its
    peak: 16 ms -> under 1 ms)."""
    with _gc_paused():
        try:
            return fn(*args)
        except InfeasibleBudgetError as e:
            err = _no_cycle(e)
    try:
        raise err
    finally:
        err = None   # (its traceback holds this frame)


@dataclass(frozen=True)
class LibraOptions:
    """Options of the ``libra`` solver.

    Attributes
    ----------
    policy : {"hybrid", "recompute", "swap"}
        ``"hybrid"`` (default): recompute first, swap where recomputing would
        create a new peak or costs more; ``"recompute"`` or ``"swap"``: one
        policy only.
    time_limit_s : float or None
        Limit on the refinement, seconds of compute (``None``: none), over
        all the descents of one solve together: in hybrid mode with the
        portfolio, each descent in turn may use an equal share of what is
        left (time a descent does not use goes to the next).  A plan cut
        short reports status ``"time_limit"``.
    max_steps : int or None
        Most refinement decisions (``None``: no limit).
    swap_overlap_margin : float
        Safety margin on transfers, dimensionless: a transfer is planned as if
        it took ``1 + swap_overlap_margin`` times ``bytes / bandwidth``, so
        swaps are only taken where they hide with that much slack.
    swap_waits : bool or None
        Where a swap's copy out cannot end before the peak (a forward pass
        that produces activations faster than the link moves them), let the
        swap wait for its copy out right before the peak (a stall, added
        time; ``Eviction.out_wait``), so that swapping reaches budgets down
        to the memory floor.  Only on devices whose copies overlap compute.
        ``None`` (the default): in swap-only mode; in hybrid mode, a
        swap-only descent with waits runs where no descent without them
        meets the budget (the stalls rarely pay where a budget is met
        otherwise, and such a descent takes many more steps: seconds on
        thousands of nodes), so that hybrid reaches as low as swap-only
        mode (on problems of more than ``LibraSolver.POOL_MAX_NODES`` nodes
        within ``LibraSolver.SWAP_WAIT_SHARE`` of the other descents' time),
        and where it meets the budget a hybrid descent with waits too, whose
        plan (``extras["descent"]`` ``"hybrid-waits"``) is returned where it
        is cheaper (``LibraSolver._waiting_hybrid``: it recomputes what is
        cheap to regenerate and waits only for the rest); so does one where
        the plan found stalls for over ``LibraSolver.STALL_SHARE`` of the
        time it adds (``LibraSolver._less_stalling``).  ``True`` /
        ``False``: every descent does / none does.
    windows : {"auto", "default", "all"}
        Candidate eviction windows: ``"default"`` one per storage
        (:func:`~libra_opt.passes.lowering.default_windows`), ``"all"`` every gap
        between uses (:func:`~libra_opt.passes.lowering.all_windows`); ``"auto"``
        picks ``"all"`` for single-phase graphs and ``"default"`` otherwise.
    undo : bool
        Run the final pass that undoes decisions the budget does not need.
    max_repair_steps : int
        Most decisions added against the simulated timeline when the lowered
        plan's simulated peak is over budget.
    early : bool
        Where recomputing a storage at its use would raise a new peak, try
        regenerating it earlier, where memory is lowest between the peak and
        the use (``Eviction.regenerate``).  Early regenerations hold memory
        until the use, which can stop the greedy descent sooner; a budget the
        descent then cannot reach is planned again without them.
    retain : bool
        Run the pass that keeps a tensor resident after its last use until a
        recomputation chain that would otherwise regenerate it
        (:class:`~libra_opt.passes.lowering.Retain`), where the budget allows and
        it saves time.  Matters most on single-phase graphs.
    exchange : bool
        After the undo pass, try exchange moves
        (:mod:`~libra_opt.solvers.libra.exchange`): give back one of the
        most expensive decisions, forbid it, and cover the budget again with
        the descent's moves; kept where the estimated added time goes down
        (several cheaper evictions instead of one costly one).
    exchange_effort : {"default", "thorough"}
        How hard the exchange moves search.  ``"default"``: the
        :data:`~libra_opt.solvers.libra.exchange.MAX_TRIES` (3) most expensive
        decisions per round, at most twice the descent's candidate
        evaluations (once on problems of more than 500 nodes), at least 48.
        ``"thorough"``: the 10 most expensive, up to 20 times the descent's
        evaluations, at least 500 (``exchange.THOROUGH_*``): for a reference
        plan, or where a solve may take longer (``hybrid-milp`` starts from
        one).  Measured on the 2-core CPU against the default: over
        ``benchmarks/solve_rate.py``'s 390 libra rows, 12 plans cheaper (the
        added time by up to 11.9 %: ``random_layered_gen_n500``
        recompute-only at 0.7), none costlier, 1.3-1.4x the CPU s in all;
        over 2,400 fuzz and pattern solves (``apps.fuzz.random_problem`` and
        the generators, seeds 0-49, three policies at 0.8-0.3), 81 cheaper
        (median 0.7 %, up to 20.4 %), none costlier, 50 -> 102 CPU s; over
        the 180 cells of ``benchmarks/hybrid_optimality.py --libra-only``
        (copies that bound the step), 12 cheaper, none costlier, 10 -> 14 CPU
        s (the shared graph ``random_layered_n100`` with copies as slow as
        compute, hybrid at 0.5 of its peak: a step of 76,484 -> 70,660 in 0.9
        -> 2.0 CPU s).  Not a guarantee: a thorough search may keep other
        exchanges, which can end costlier (the pattern generators at 30-60
        nodes, seeds 0-2, copy ratios 1 and 4, hybrid at 0.8 / 0.5 / 0.3 of
        the peak: 6 plans cheaper, 2 costlier, by up to 1.1 %, of 162).
    added_gap_tol : float
        Exchange moves (and the covering program among them) are left out
        where the cheapest plan of the descents, lowered and simulated,
        already adds at most ``1 + added_gap_tol`` times the least added time
        that the cut bound leaves any plan within the budget
        (:func:`~libra_opt.passes.cut_bounds.cut_lower_bound` over the
        ``LibraSolver.NEAR_CANDIDATES`` cut nodes of the largest no-remat
        memory; recompute-only in recompute-only mode; minus the no-remat
        compute time): no exchange can save more than that share of the
        added time.  The result's ``extras["near_cut_bound"]`` then gives
        that least added time (``bound_added_s``) and the tolerance, and its
        message says so.  ``0``: they always run (``hybrid-milp``'s thorough
        starting plan).  The default 0.025 takes two of
        ``benchmarks/solve_rate.py``'s 390 libra rows under the solve-time
        target, rows whose exchanges kept nothing
        (``large_beside_small_n100`` recompute-only at 0.5 of its peak: 1.48
        -> 0.28 CPU s per 1,000 ops; ``large_beside_small_n201`` at 0.3: 1.21
        -> 0.47-0.50), with the same plans over the 390 rows and the 180
        copy-bound cells of ``benchmarks/hybrid_optimality.py --libra-only``;
        over 2,400 fuzz and pattern solves, 30 plans costlier (all
        ``large_beside_small_graph`` recompute-only, by up to 1.9 % of the
        added time), 47 -> 43 CPU s (2-core CPU).  The hybrid cut bound is
        rarely that close to a plan with swaps (none of the 81 hybrid and
        swap-only checks over those solves).  Where a plan is not near, the
        check costs the bound over 16 cut nodes and the cut bound's tables,
        built once per problem: a few percent of a solve at most
        (``mobilenet_b512_train`` recompute-only at 0.3 of its peak: 0.515 ->
        0.533 CPU s per 1,000 ops, best of 5, alternating; ``h100_resnet50_b128``
        hybrid at 0.3: 0.899 -> 0.900).  Raises ``SolverError`` if negative or
        not finite.  Source: the relative-gap stop of branch and bound
        (HiGHS's ``mip_rel_gap``), on the added time against the cut bound
        (:mod:`libra_opt.passes.cut_bounds`).
    merge : bool
        Score recomputations whose chain regenerates another evicted storage
        with that storage's window ended at the chain (one regeneration for
        both; ``Refiner._try_merge``).  In recompute-only mode with the
        portfolio, a second descent with the other setting runs too (on
        problems of up to 1,000 nodes: the variant costs seconds on larger
        ones) and the cheaper plan is returned (neither setting is better on
        every graph); on two-phase problems of up to
        ``LibraSolver.ALL_WINDOWS_MAX_NODES`` nodes (300) with ``windows="auto"``,
        a descent over every window (``windows="all"``) too.
    retain_inputs : bool or None
        During the descent, score a recomputation whose chain would
        regenerate inputs of the producer freed after their last use also
        with those inputs kept resident until the chain (a
        :class:`~libra_opt.passes.lowering.Retain`), taken where that is cheaper
        and fits under the peak (the ``retain`` pass does this only after
        the descent, so the descent would not see the cheaper option).
        Only with ``retain``: ``retain=False`` plans no retention at all.
        ``None`` (the default): on problems of at most
        ``LibraSolver.RETAIN_INPUTS_MAX_NODES`` nodes (1,000), where the
        portfolio also runs a descent with the other setting.  On larger
        ones it is off for the single policies' descents (it holds inputs
        at memory just under the current peak over long spans, and a
        descent can stop above budgets it otherwise meets:
        ``h100_gpt2-medium_b8`` at 0.3 of its peak, 0.34 of the peak), and
        on for hybrid's descent with the portfolio (GPT-2 medium b8 at 0.5:
        0.0182 s added against 0.0262 without), which adds the hybrid descent
        without it only for the budgets the first one does not reach.
    portfolio : bool
        Hybrid mode only: also refine with recomputation only and with
        swapping only, and return the cheapest of the three plans (estimated
        added time), so hybrid is never worse than either policy alone; and
        compare with the built-in baselines' plans (``swap-all`` at every
        budget; ``checkpoint-all``, ``chen-sqrt``, ``chen-greedy`` where no
        descent meets the budget: see the module docstring).  In
        recompute-only mode: compare with the recompute-only baselines'
        plans (``checkpoint-all``, ``chen-sqrt``, ``chen-greedy``) at every
        budget the descent's plan adds time at, and return the cheapest, so
        it is never above them; on problems of more than
        ``LibraSolver.POOL_MAX_NODES`` nodes (1,000) only where no descent
        meets the budget (their plans cost seconds to build there).  In
        swap-only mode: compare with ``swap-all``'s plans at every budget
        (so it is never above them, and meets every budget they meet).  In
        swap-only and hybrid mode: where the descents stop above a budget, the
        bulk move too (``_BulkSwapRefiner``; with ``swap_waits`` not ``False``).  The result's ``extras["descent"]`` says
        which descent (or baseline) the plan came from.  ``max_steps`` and
        ``time_limit_s`` bound the descents only.  The baselines' plans are
        built once per problem and reused by later solves of it, and where a
        descent's plan meets the budget, only those whose lower bound on
        added time (the recompute time of the producers they recompute) is
        under that plan's: the same plan is returned, without lowering and
        simulating the baselines that cannot win.
    switch : bool
        Hybrid mode only: after the undo pass, *policy switches*
        (:mod:`~libra_opt.solvers.libra.switch`) on the cheapest plan of
        each descent policy: swapped storages whose swaps stall or crowd the
        copy queues move to recomputation, and the most expensive recomputed
        ones to swaps that hide behind compute, where the estimated added
        time goes down within the budget.  Where a plan of the descents
        meets the budget, a switched plan estimated cheaper than it is
        lowered and simulated, and returned where it is cheaper simulated
        too (``extras["descent"]`` then reads e.g. ``"recompute+switch"``);
        the switches change what a plan costs, never which budgets are met.
    continue_recompute : bool
        Hybrid mode with the portfolio only: at budgets under the least
        memory every recompute-only descent reaches, a hybrid descent
        continued from the lowest of their ends too (the recompute-only plan
        with swaps on top: :mod:`~libra_opt.solvers.libra.continued`,
        ``LibraSolver._continued``), its plan finished apart from the
        others' and returned where it is cheaper (``extras["descent"]``
        ``"hybrid-continued"``); where some descent meets the budget, one
        continued from each other recompute-only end too.  Just under that
        reach, with copies slower than compute, the descents from the
        keep-everything plan swap most of what they evict or wait for
        their copies out (``random_layered_graph(100, seed=0)`` with copies
        4x slower than compute at 0.995 of the recompute-only reach: a step
        of 81,762 without it, 59,250 with it, the compute time being
        54,394).
    swap_inputs : bool
        Hybrid mode only: a last pass on the plan returned
        (:mod:`~libra_opt.solvers.libra.swap_inputs`): a recomputation chain
        that regenerates inputs freed after their last use is cut where the
        simulated step falls within the budget: the inputs at the cut are
        copied out when produced and swapped back in for the chain (a
        :class:`~libra_opt.passes.lowering.Retain` with ``swap=True``;
        ``extras["swap_retained"]``, and ``extras["descent"]`` ends in
        ``"+swapped inputs"``).  Lowers and simulates at most
        ``swap_inputs.MAX_LOWERINGS`` plans per budget.
    uphill : bool
        Recompute-only mode only (ignored in the others): at a dead end of a
        descent (every candidate at the peak raises another point over it),
        a step that raises points up to ``refine.UPHILL_REL`` (3 %) over the
        peak, while the dead ends get lower, at most ``refine.UPHILL_STEPS``
        times (``Refiner._uphill``; the descent returns to its lowest dead
        end where it ends above it).  Lower reach, slower solves under the
        default's reach (2-core CPU): ``random_layered_graph(1000, seed=0)``,
        least plannable budget 0.7062 -> 0.6782 of the peak, a solve at 0.5
        of it (infeasible either way) 2.4 -> 3.8 CPU s, at 0.7 a plan (236,388
        added) in 10.2 s where the default states 0.7062 in 2.8 s;
        ``random_layered_graph(250, seed=0)`` 0.5655 -> 0.5341 (0.27 -> 0.43
        s); the shared ``random_layered_n250`` 0.8251 -> 0.8101 (0.44 -> 0.73
        s).  Off by default for that time.  In
        hybrid and swap-only mode a descent past a dead end this way would
        keep the fallback descents that swap and wait for copies out from
        running at that budget, which find far cheaper plans there
        (``apps.fuzz.random_problem(264)``: 1.3e-3 s added against 1.2e-8).
    """

    policy: str = "hybrid"
    time_limit_s: float | None = None
    max_steps: int | None = None
    swap_overlap_margin: float = 0.0
    swap_waits: bool | None = None
    windows: str = "auto"
    undo: bool = True
    max_repair_steps: int = 32
    early: bool = True
    retain: bool = True
    exchange: bool = True
    exchange_effort: str = "default"
    added_gap_tol: float = 0.025
    merge: bool = False
    retain_inputs: bool | None = None
    portfolio: bool = True
    switch: bool = True
    continue_recompute: bool = True
    swap_inputs: bool = True
    uphill: bool = False

    def __post_init__(self):
        if self.policy not in POLICY_MODES:
            raise SolverError(f"libra: policy must be one of {POLICY_MODES}, got {self.policy!r}")
        if self.windows not in WINDOW_MODES:
            raise SolverError(f"libra: windows must be one of {WINDOW_MODES}, got {self.windows!r}")
        if self.exchange_effort not in EXCHANGE_EFFORTS:
            raise SolverError(f"libra: exchange_effort must be one of {EXCHANGE_EFFORTS}, got {self.exchange_effort!r}")
        if self.time_limit_s is not None and not self.time_limit_s > 0:
            raise SolverError(f"libra: time_limit_s must be a positive number of seconds, got {self.time_limit_s!r}")
        if self.max_steps is not None and (not isinstance(self.max_steps, int) or self.max_steps < 0):
            raise SolverError(f"libra: max_steps must be a non-negative int, got {self.max_steps!r}")
        if not (isinstance(self.swap_overlap_margin, (int, float)) and self.swap_overlap_margin >= 0):
            raise SolverError(f"libra: swap_overlap_margin must be >= 0, got {self.swap_overlap_margin!r}")
        if not (isinstance(self.added_gap_tol, (int, float)) and 0 <= self.added_gap_tol < math.inf):
            raise SolverError(f"libra: added_gap_tol must be a finite number >= 0 (0: exchange moves always run), "
                              f"got {self.added_gap_tol!r}")
        if not isinstance(self.max_repair_steps, int) or self.max_repair_steps < 0:
            raise SolverError(f"libra: max_repair_steps must be a non-negative int, got {self.max_repair_steps!r}")


#: the built-in baselines hybrid's portfolio holds
PORTFOLIO_BASELINES = ("swap-all", "checkpoint-all", "chen-sqrt", "chen-greedy")
#: compared at every budget (cheap: two lowerings)
ALWAYS_COMPARED = ("swap-all",)
#: built where no descent meets a budget: the least memory of each policy
REACH_BASELINES = ("swap-all", "checkpoint-all")
#: recompute-only mode's portfolio, compared at every budget (each a recompute-only plan)
RECOMPUTE_BASELINES = ("checkpoint-all", "chen-sqrt", "chen-greedy")
#: swap-only mode's portfolio, compared at every budget (a swap-only plan)
SWAP_BASELINES = ("swap-all",)

class _BaselinePool:
    """The built-in baselines' plans (:meth:`~libra_opt.solvers.baselines.SwapAllSolver.candidates`
    and its siblings: each a fixed set of budget-independent plans), built
    lazily, once per problem, and shared by its budgets and later solves.  A
    plan is lowered and simulated only when asked for and, when compared with
    a plan of the descents, only where its lower bound on added time
    (:class:`~libra_opt.solvers.baselines.BaselineCandidate`) is below that
    plan's: one that cannot be cheaper is never built.  A plan is lowered
    only until its peak reaches the no-remat peak (or the budget, where that
    is higher: :meth:`BaselineCandidate.plan_within`): past it, it neither
    meets a budget under that peak nor lowers a stated minimum (the descents
    always meet the no-remat peak); where no descent meets the budget, only
    until it reaches the least peak they meet (:meth:`best`'s ``least``,
    :meth:`min_peak`).  The checkpointing baselines' plans on single-phase
    graphs peak over the no-remat peak (``random_layered_gen_n1000``: 1.08x).
    A plan its prover shows over the budget (:meth:`BaselineCandidate.surely_over`)
    is not built by :meth:`best` at all (``large_beside_small_n100``
    recompute-only at 0.3 of its peak: 15 of the 20 plans it lowered, about
    12 % of the solve)."""

    def __init__(self, problem: RematProblem):
        self.problem = problem
        self.floor = memory_lower_bound(problem)   # below it nothing fits: no baseline is built
        self.limit = no_remat_peak(problem) - 1   # a plan over it is of no use under that peak
        self._cands: dict[str, list[BaselineCandidate]] = problem.tables.memo(
            "libra.baseline_plans", dict)   # budget-independent: built once per problem, shared by later solves

    def _failed(self, name: str, e: Exception) -> None:
        log.warning("libra: baseline %r failed on %r (%s: %s); left out of the portfolio", name,
                    self.problem.name, type(e).__name__, e)
        self._cands[name] = []

    def candidates(self, name: str) -> list[BaselineCandidate]:
        """Every plan of baseline ``name``, unbuilt; none (logged) where listing them fails."""
        if name not in self._cands:
            try:
                self._cands[name] = list(solver_class(name)().candidates(self.problem))
            except Exception as e:   # a baseline's bug must not take libra's own plan down with it
                self._failed(name, e)
        return self._cands[name]

    def plans(self, name: str, below: float | None = None, limit: int | None = None,
              fits: int | None = None) -> list[BaselinePlan]:
        """The plans of baseline ``name`` (built on first use); with ``below``
        (seconds), only those whose lower bound on added time is under it;
        with ``limit`` (bytes), those whose simulated peak is over it may be
        left out (:meth:`BaselineCandidate.plan_within`); with ``fits``
        (bytes, at most ``limit``), those shown to peak over it without
        being lowered (:meth:`BaselineCandidate.surely_over`) are left out
        and not built.  None (logged) where building one fails."""
        out = []
        for c in self.candidates(name):
            if below is not None and c.cannot_beat(below, self.problem.total_compute_s):
                continue   # its added time is at least the bound: never cheaper than ``below``
            try:
                if fits is not None and c.surely_over(fits):
                    continue   # cannot fit: left unbuilt for a caller that needs its peak (min_peak)
                p = c.plan_within(limit)
            except Exception as e:   # as in candidates()
                self._failed(name, e)
                return []
            if p is not None:
                out.append(p)
        return out

    def best(self, names: Sequence[str], budget: int, below: float | None = None,
             least: int | None = None) -> tuple[str, BaselinePlan] | None:
        """The cheapest plan (simulated added seconds) of ``names`` within
        ``budget`` bytes; with ``below`` (seconds), the plans whose lower bound
        is not under it are left out (so the answer is the same wherever the
        cheapest plan is cheaper than ``below``).  ``least`` (bytes, over
        ``budget``): the least peak the caller has found, where the budget is
        not met: plans are then lowered only until their peak reaches it (a
        plan at or over it neither meets the budget nor lowers the stated
        minimum, :meth:`min_peak`); else until it reaches the no-remat peak."""
        limit = max(budget, self.limit if least is None else min(self.limit, least - 1))
        fit = [(p.simulation.added_s, k, name, p) for k, name in enumerate(names)
               for p in self.plans(name, below, limit, fits=budget) if p.simulation.peak_bytes <= budget]
        return min(fit, key=lambda c: c[:2])[2:] if fit else None

    def min_peak(self, names: Sequence[str], under: int) -> int:
        """The least of ``under`` (bytes: the least peak a caller has found)
        and the simulated peaks of the plans of ``names`` (bytes; plans are
        lowered only until their peak reaches ``under``: a plan at or over it
        does not change the answer).  Random layered graph of 1,000 nodes,
        recompute-only at 0.5 of its peak (the descents' least is 0.706 of
        it): ``checkpoint-all``'s plan is proven over it from one of its chains
        (:class:`~libra_opt.passes.peak_bound.PeakProver`, 0.01 CPU s) and not
        lowered; without the proof it was lowered for 127,518 of its 500,277
        instructions (0.23-0.29 CPU s).  Each baseline's plans are
        lowered only until their peak reaches the least found by the
        baselines before it in ``names`` (a plan at or over it does not
        change the answer either)."""
        least = under
        for name in names:
            for p in self.plans(name, limit=least - 1):
                least = min(least, p.simulation.peak_bytes)
        return least


class _BulkSwapRefiner(OneMoveRefiner):
    """The bulk move of swap-only mode (a portfolio member on problems of at
    most ``LibraSolver.POOL_MAX_NODES`` nodes, elsewhere a fallback where
    the descents stop above a budget) and of hybrid mode (a fallback): not a
    descent but one move (:meth:`~libra_opt.solvers.libra.estimate.Timeline.swap_bulk`):
    every window swapped at once, each waiting for its copy out right after
    its window opens and swapped in right before its use, the least memory
    swapping can hold (down to the memory floor where every storage is
    swappable); then, per budget, what the budget does not need is given
    back (:meth:`~libra_opt.solvers.libra.estimate.Timeline.relax_swaps`)
    before the usual finish step.

    Why: where the device-to-host link is slower than the forward pass and
    the host-to-device link slower than the backward, the greedy descent
    stops above the floor: every further swap's prefetch, planned back from
    its use behind the queued ones, moves the earlier ones' prefetches
    before the backward starts, raising the peak there (``h100_gpt2-medium_b8``:
    0.273 of the no-remat peak after 5,006 steps, floor 0.215; ``h100_llama_b8``:
    0.563, floor 0.427).  Source: see ``swap_bulk``."""

    def __init__(self, problem: RematProblem, opts):
        super().__init__(problem, opts)
        self._relaxed: dict[int, Snapshot] = {}   # budget -> the bulk plan relaxed for it

    def _build(self) -> None:
        """Every enabled window swapped at once (``Timeline.swap_bulk``), one
        decision record per swap."""
        tl, problem = self.tl, self.problem
        tl.swap_bulk(np.flatnonzero(self.enabled))
        peak, pos = tl.peak()
        stall = dict(zip(tl.state.swap.ids.tolist(), tl.state.swap.stall_s.tolist()))
        for k, j in enumerate(tl.state.swap.ids.tolist()):
            self.records[j] = explain(problem, step=k, storage=int(tl.windows.w_s[j]), after=int(tl.windows.w_a[j]),
                                      before=int(tl.state.w_b[j]), policy="swap", nbytes=int(tl.windows.w_bytes[j]),
                                      peak_bytes=peak, peak_pos=pos, removed_bytes=int(tl.windows.w_bytes[j]),
                                      added_s=stall[j], recompute_s=None, swap_s=stall[j],
                                      reason=REASON_ONLY_POLICY)
        self.step = len(self.records)

    def prepare(self, snap: Snapshot, budget: int, undo: bool = True, exchange: bool | None = None,
                polish: bool = True) -> Prepared:
        """The bulk plan with what ``budget`` does not need given back (once
        per budget), then the usual finish step (:meth:`Refiner.prepare`,
        without exchange moves: the bulk plan has no descent to draw them
        from).  With ``polish=False`` (only whether the budget is met) too:
        the simulation can differ from the estimate where swap-ins are issued
        before their copies out end, and the plan given back is the one a
        solve lowers."""
        if undo and self.opts.undo and snap.records:
            if budget not in self._relaxed:
                tl, records = snap.timeline.copy(), dict(snap.records)
                for j in tl.relax_swaps(budget):
                    records.pop(j, None)
                self._relaxed[budget] = dataclasses.replace(snap, timeline=tl, records=records)
            snap = self._relaxed[budget]
        return super().prepare(snap, budget, undo, exchange=False, polish=polish)


class _Candidate(NamedTuple):
    """A prepared plan the solver may lower: its estimated added time (s),
    the index of its descent in the solve's list, the plan, and a tag added
    to the descent's name in ``extras["descent"]`` (``"+switch"``)."""
    estimate: float
    descent: int
    prepared: Prepared
    tag: str = ""


class _Found(NamedTuple):
    """A candidate lowered and simulated within the budget; ``near``: the
    cut bound's added time (s) where exchange moves were left out for it
    (``LibraOptions.added_gap_tol``), else ``None``."""
    plan: FinishedPlan
    descent: int
    tag: str
    near: float | None = None


@register_solver("libra")
class LibraSolver(Solver):
    """Libra's greedy refinement with a hybrid swap + recompute policy.

    See :mod:`libra_opt.solvers.libra` for the algorithm and
    :class:`LibraOptions` for the options.  ``SolveResult.extras`` holds
    ``decisions`` (one dict per eviction, with why:
    :class:`~libra_opt.solvers.libra.explain.Decision`), ``estimated_peak_bytes``,
    ``retained`` (one dict per :class:`~libra_opt.passes.lowering.Retain`: tensor,
    name, until, nbytes), ``estimated_added_s``, ``steps``, ``undone``,
    ``repairs`` and ``policy``.

    Raises
    ------
    InfeasibleBudgetError
        No descent (nor, in hybrid mode, baseline) gets under the budget;
        ``min_feasible_bytes`` is a budget a solve then meets, within 1% of
        the smallest one found plannable (:meth:`_tightened`; as the
        descents stated it where ``max_steps`` or ``time_limit_s`` is set).
    """

    name = "libra"
    citation = ("Wang, Libra: Python-level tensor re-materialization for GPU memory optimization in deep "
                "learning, NTHU 2024 (greedy refinement, hybrid recompute/swap)")
    Options = LibraOptions

    def _refiners(self, problem: RematProblem) -> list[Refiner]:
        """The descents to run: the chosen policy's, plus, with ``portfolio``,
        in hybrid mode one per single policy and recompute-only mode's extra
        descents (a recompute-only plan is a hybrid plan); in recompute-only
        mode (and for hybrid's recompute-only extras) one with
        the other ``retain_inputs`` setting (in hybrid mode on problems of
        more than :attr:`POOL_MAX_NODES` nodes: the hybrid descent with
        retained chain inputs, and one without them only for the budgets it
        misses, ``Refiner.missed_by``) and, on problems of at most
        :attr:`POOL_MAX_NODES` nodes, one with the other ``merge`` setting
        (greedy descents are not monotone in their moves: each of these wins
        on some graphs); in
        swap-only mode on problems of at most :attr:`POOL_MAX_NODES` nodes,
        the bulk move (:class:`_BulkSwapRefiner`; on larger ones it is a
        fallback, :meth:`_fallbacks`)."""
        o = self._resolved(problem)
        large = problem.num_nodes > self.POOL_MAX_NODES
        main = o
        if o.policy == "hybrid" and o.portfolio and large and self.options.retain_inputs is None:
            # large problems: hybrid's descent scores retained chain inputs (the single policies' do not);
            # over the four H100 profiles and GPT-2 b8 s256 at 0.9..0.3 of the peak it is never costlier
            # than the portfolio that also ran the descent without them, and cheaper once (GPT-2 medium b8
            # at 0.4: 0.0309 s added against 0.0339)
            main = dataclasses.replace(o, retain_inputs=True)
        refs = [Refiner(problem, main)]
        if not o.portfolio:
            return refs
        if o.policy == "swap":
            if problem.num_nodes <= self.POOL_MAX_NODES and self._bulk_ok(problem):
                # the bulk move at every budget on small problems (cheap there): the budgets a solve meets
                # through it are the ones the tightening finds met
                refs.append(self._bulk(problem, refs[0]))
            return refs
        if o.policy == "hybrid":   # (waits for copies out: only as set, or as a fallback, see _fallbacks)
            waits = bool(o.swap_waits)
            refs += [Refiner(problem, dataclasses.replace(o, policy=pol, swap_waits=waits))
                     for pol in ("recompute", "swap")]
            if large:
                # ... and the hybrid descent with the other setting only for the budgets it misses (with
                # retained inputs it can hold memory just under the peak over long spans and stop above a
                # budget: GPT-2 medium b8, 0.34 of the peak)
                variant = Refiner(problem, dataclasses.replace(main, retain_inputs=not main.retain_inputs))
                variant.missed_by = refs[0]
                refs.append(variant)
                return refs
            # recompute-only mode's extra descents too: a recompute-only plan is a hybrid plan, so hybrid
            # returns none costlier than recompute-only mode finds
            o = dataclasses.replace(o, policy="recompute")
        base = refs[1] if self.options.policy == "hybrid" else refs[0]     # the recompute-only descent
        if problem.num_nodes <= self.POOL_MAX_NODES:   # merged regenerations: costly on large problems
            refs.append(Refiner(problem, dataclasses.replace(o, merge=not o.merge)))
        refs.append(Refiner(problem, dataclasses.replace(o, retain_inputs=not o.retain_inputs)))
        if o.windows == "auto" and base.mode == "default" and problem.num_nodes <= self.ALL_WINDOWS_MAX_NODES:
            refs.append(Refiner(problem, dataclasses.replace(o, windows="all")))
        # the chosen policy's descent orders candidates by the plain recomputation's cost, the others by
        # their cheapest recompute variant (Refiner.variant_bounds): over random layered graphs of 100 and
        # 250 nodes at 0.95..0.7 of the peak the mix is cheaper than the plain ordering alone in 14 of 42
        # cells and costlier in none (random_layered_n100 at 0.8: 4548 -> 2223; at 0.9 the plain ordering
        # finds 377, the optimum, and the other 643).  Not on problems of more than VARIANT_BOUNDS_MAX_NODES
        # nodes, where the descents are fewer (the H100 profiles: as many plans cheaper as costlier)
        for ref in refs[1:]:
            ref.variant_bounds = problem.num_nodes <= self.VARIANT_BOUNDS_MAX_NODES
        return refs

    @staticmethod
    def _bulk(problem: RematProblem, main: Refiner) -> "_BulkSwapRefiner":
        """The bulk move (:class:`_BulkSwapRefiner`) with the options every
        caller gives it: those of the solve's main descent ``main``,
        swap-only, waiting for copies out; as a portfolio member in swap-only
        mode (:meth:`_refiners`), as a fallback (:meth:`_missed`) and as
        the floor probe (:meth:`_floor_met`), so that the probe's plan is
        the one a solve at the floor finds."""
        return _BulkSwapRefiner(problem, dataclasses.replace(main.opts, policy="swap", swap_waits=True))

    def _bulk_ok(self, problem: RematProblem) -> bool:
        """Whether this solve may use the bulk move (:class:`_BulkSwapRefiner`):
        swapping allowed, with the portfolio, ``swap_waits`` not ``False``, on a
        device whose copies overlap compute."""
        o = self.options
        return (o.policy != "recompute" and o.portfolio and o.swap_waits is not False
                and problem.device.copies_overlap_compute)

    def _resolved(self, problem: RematProblem) -> LibraOptions:
        """The options with ``retain_inputs=None`` resolved for ``problem``'s
        size (:attr:`RETAIN_INPUTS_MAX_NODES`), and ``uphill`` off outside
        recompute-only mode."""
        o = self.options
        if o.retain_inputs is None:
            o = dataclasses.replace(o, retain_inputs=problem.num_nodes <= self.RETAIN_INPUTS_MAX_NODES)
        if o.uphill and o.policy != "recompute":
            o = dataclasses.replace(o, uphill=False)
        return o

    def _fallbacks(self, problem: RematProblem, refs: list[Refiner], budgets: list[int],
                   snaps: list[dict], force: bool = False, reuse: list[Refiner] | None = None,
                   cheaper: bool = True) -> tuple[list[Refiner], list[dict]]:
        """For the budgets no descent reached: descents without early
        regeneration, when some descent took an early regeneration (which
        holds memory and can end a greedy descent sooner; one per descent not
        ordered by its recompute variants, ``Refiner.variant_bounds``), and, with
        ``windows="auto"``, when every descent used the default eviction windows (one per storage, from its
        last forward use to its first backward use), one over every window
        (a storage freed and regenerated between two backward uses: without
        it, budgets a plan meets were stated infeasible); in hybrid mode with
        ``swap_waits=None``, a swap-only descent that waits for copies out
        (it reaches down to the memory floor, paying stalls; over every
        window with ``windows="auto"``; on large problems for at most
        :attr:`SWAP_WAIT_SHARE` of the others' time); in swap-only mode with
        the portfolio (and waits allowed, on devices whose copies overlap
        compute), the bulk move (:class:`_BulkSwapRefiner`: every window
        swapped with its waits, down to the memory floor where every storage
        is swappable), first (in hybrid mode too, with ``swap_waits`` not
        ``False``: hybrid reaches as low as swap-only mode), and in swap-only
        mode on problems of more than
        :attr:`POOL_MAX_NODES` nodes the descents above only for the budgets
        it misses; in recompute-only and hybrid mode with the portfolio, on
        problems of at most :attr:`REVERSE_MAX_NODES` nodes, the reverse
        greedy (:class:`~libra_opt.solvers.libra.reverse.ReverseRefiner`).  ``force``: for
        every budget of ``budgets`` (their snapshots did not lower within
        them), as a solve of several budgets runs them for one it misses.
        ``reuse``: the plain fallback descents an earlier call of the same
        solve built (the tightening's rounds): one of the same options is
        taken from there, rewound (:meth:`_plain`), instead of a new one.
        ``cheaper``: in hybrid mode with ``swap_waits=None``, where a swap-only
        fallback that waits ran, the budgets the fallbacks met get a hybrid
        descent that waits too
        (:meth:`_waiting_hybrid`: cheaper plans, no lower reach); ``False``
        for a caller that only asks which budgets are met (the tightening).
        Last, in hybrid mode, for the budgets under every recompute-only
        descent's reach, whether or not another descent met them, a hybrid
        descent continued from the lowest of their ends, and with ``cheaper``
        where a descent meets the budget, one from each other end
        (:meth:`_continued`)."""
        base, base_snaps = self._without_continued(refs, snaps)   # (as without them)
        more, more_snaps = self._missed(problem, base, budgets, base_snaps, force, reuse, cheaper)
        cont, cont_snaps = self._continued(problem, base, budgets, base_snaps, refs + more, snaps + more_snaps, cheaper)
        return more + cont, more_snaps + cont_snaps

    def _missed(self, problem: RematProblem, refs: list[Refiner], budgets: list[int], snaps: list[dict],
                force: bool, reuse: list[Refiner] | None, cheaper: bool) -> tuple[list[Refiner], list[dict]]:
        """:meth:`_fallbacks` for the budgets no descent reached (all of its
        descents but the continued one; ``refs``, ``snaps``: the solve's
        descents but a continued one, which changes none of these)."""
        missing = list(budgets) if force else [b for b in budgets if all(s.get(b) is None for s in snaps)]
        if not missing:
            return [], []
        o = self.options
        bulk, bulk_snaps = [], []
        if self._bulk_ok(problem) and not any(isinstance(r, _BulkSwapRefiner) for r in refs):
            # the bulk move: every window swapped with its waits, down to the memory floor (_BulkSwapRefiner)
            ref = self._bulk(problem, refs[0])
            ref.asked = set(missing)
            bulk, bulk_snaps = [ref], self._descend_all([ref], missing, spent_s=sum(r.clock_s() for r in refs))
            if o.policy == "swap" and problem.num_nodes > self.POOL_MAX_NODES:
                # on large problems the descents below (seconds each) only for the budgets it misses
                missing = [b for b in missing if bulk_snaps[0].get(b) is None]
                if not missing:
                    return bulk, bulk_snaps
        more = []
        if any(ref.used_early for ref in refs):
            # (not for a plain descent that ran to its end without an early regeneration changing any of its
            # steps, Refiner.early_step: one without them takes the same steps, and its snapshots are in; nor
            # for a descent ordered by its recompute variants, Refiner.variant_bounds, whose fallback would
            # not be ordered so: over solve_rate.py's 390 libra rows and 2,396 solves of fuzz problems and
            # generated graphs, the same plans and stated minima without those, and the rows' CPU seconds
            # 71.5 -> 58.5)
            more = [self._plain(problem, dataclasses.replace(ref.opts, early=False), missing, reuse) for ref in refs
                    if not ref.variant_bounds and not self._own_plain_twin(ref)]
        main = [ref for ref in refs if ref.opts.policy == refs[0].opts.policy]   # the chosen policy's descents
        if self.options.windows == "auto" and all(ref.mode == "default" for ref in main):   # windows inside a phase
            more.append(self._plain(problem, dataclasses.replace(refs[0].opts, windows="all"), missing, reuse))
        if (o.policy == "hybrid" and o.portfolio and o.swap_waits is None and problem.device.copies_overlap_compute
                and not any(ref.allow_wait for ref in refs)):
            # swapping that waits for its copies out: reaches down to the memory floor, paying stalls (over
            # every window with windows="auto": swap-only mode's own fallback, which reaches lowest)
            win = "all" if o.windows == "auto" else o.windows
            ref = self._plain(problem, dataclasses.replace(refs[0].opts, policy="swap", swap_waits=True, windows=win),
                              missing, reuse)
            if o.time_limit_s is None and problem.num_nodes > self.POOL_MAX_NODES:
                # it takes many more steps than the others: on large problems, at most as long as they took
                ref.time_limit_s = self.SWAP_WAIT_SHARE * max(sum(r.clock_s() for r in refs), 1.0)
            more.append(ref)
        if (o.policy != "swap" and o.portfolio and problem.num_nodes <= self.REVERSE_MAX_NODES
                and not any(isinstance(r, ReverseRefiner) for r in refs)):
            # the reverse greedy: the store-nothing plan, then what the budget affords given back
            more.append(ReverseRefiner(problem, dataclasses.replace(refs[0].opts, policy="recompute", windows="default")))
        if not more:
            return bulk, bulk_snaps
        for ref in more:
            ref.asked = set(missing)
        more_snaps = self._descend_all(more, missing, spent_s=sum(ref.clock_s() for ref in refs)) + bulk_snaps
        more += bulk
        if (cheaper and o.policy == "hybrid" and o.swap_waits is None
                and any(ref.allow_wait and ref.opts.policy == "swap" for ref in more)):
            wait, wait_snaps = self._waiting_hybrid(problem, refs, missing, more_snaps, refs + more)
            more, more_snaps = more + wait, more_snaps + wait_snaps
        return more, more_snaps

    @staticmethod
    def _own_plain_twin(ref: Refiner) -> bool:
        """Whether descent ``ref`` is its own fallback without early
        regeneration (:meth:`_missed`): a plain :class:`Refiner` that ran to
        its end (not cut short) with no step an early regeneration option
        changed (``Refiner.early_step``; early options only add admissible
        options to a selection) and whose selections do not order
        candidates by their recompute variants (``Refiner.variant_bounds``,
        which the fallback does not set; a swap-only descent has none): a
        descent of its options with ``early=False`` takes its steps and its
        snapshots.  The external ``random_layered_n250`` recompute-only at
        0.5 of its peak: the main descent's fallback (1,117 -> 915 chain
        replays in the solve)."""
        return (type(ref) is Refiner and ref.early_step is None and ref.done and not ref.cut_short
                and (not ref.variant_bounds or not ref.allow_rec))

    def _continued(self, problem: RematProblem, refs: list[Refiner], budgets: list[int], snaps: list[dict],
                   ran: list[Refiner], ran_snaps: list[dict], cheaper: bool = True
                   ) -> tuple[list[Refiner], list[dict]]:
        """In hybrid mode with the portfolio and ``continue_recompute``, for
        the budgets of ``budgets`` that no recompute-only descent of ``refs``
        (the solve's own descents, :meth:`_refiners`; ``snaps``: their
        snapshots) reaches, each having run to its end, a hybrid descent
        continued from the lowest of those ends
        (:class:`~libra_opt.solvers.libra.continued.ContinuedRefiner`; the
        first descent's on a tie): the recompute-only plan with swaps on top,
        which the descents from the keep-everything plan miss just under
        recomputation's reach (``random_layered_graph(100, seed=0)`` with
        copies 4x slower than compute, at 0.995 of that reach: 81,762 ->
        59,250, the compute time being 54,394).  With ``cheaper`` (not for the tightening, which only
        asks which budgets are met), for the budgets some descent of the
        solve meets (``ran``, ``ran_snaps``: every descent so far and their
        snapshots, and the first continued one), one continued from each
        other recompute-only end too: they change which plan is cheapest,
        never which budgets are met (``random_layered_graph(100, seed=2)``
        with copies as slow as compute, at 0.9 of its recompute-only reach:
        125,992 -> 67,708).  Each is finished apart from the other descents
        (``Refiner.apart``).  The descents they start from are the same in a
        single solve and in ``solve_many`` (every recompute-only descent of
        the solve missed the budget), so both take the same snapshots.  None
        where ``ran`` has one already, or where a descent was cut short
        (``max_steps``, ``time_limit_s``).  ``([descents], [their
        snapshots])`` or ``([], [])``."""
        o = self.options
        if (o.policy != "hybrid" or not o.portfolio or not o.continue_recompute
                or any(isinstance(r, ContinuedRefiner) for r in ran)):
            return [], []
        rec = [(ref, sn) for ref, sn in zip(refs, snaps) if type(ref) is Refiner and ref.opts.policy == "recompute"]
        if not rec or any(ref.cut_short for ref in ran):
            return [], []
        todo = [b for b in budgets if all(sn.get(b) is None for _, sn in rec)]
        if not todo or not all(ref.done for ref, _ in rec):
            return [], []
        sources = sorted(range(len(rec)), key=lambda k: (rec[k][0].final().peak_bytes, k))
        out, out_snaps = [], []
        for n, k in enumerate(sources):
            source = rec[k][0]
            if n == 1:   # the others: only where a descent meets the budget (cheaper plans, the same budgets met)
                if not cheaper:
                    break
                todo = [b for b in todo if any(sn.get(b) is not None for sn in (*ran_snaps, *out_snaps))]
            these = [b for b in todo if b < source.final().peak_bytes]
            if not these:
                continue
            ref = ContinuedRefiner(problem, source)
            ref.asked = set(these)
            ref.apart = True   # finished apart from the others (_libra_plan): never a costlier plan than without it
            out.append(ref)
            out_snaps += self._descend_all([ref], these, spent_s=sum(r.clock_s() for r in (*ran, *out)))
        return out, out_snaps

    def _apart_waiting(self, problem: RematProblem, main: Refiner, spent_s: float) -> Refiner:
        """A hybrid descent that waits for copies out, run apart (``Refiner.apart``):
        ``main``'s options with ``swap_waits=True``; on problems of more than
        :attr:`POOL_MAX_NODES` nodes (without ``time_limit_s``) it refines for
        at most :attr:`SWAP_WAIT_SHARE` of ``spent_s`` (at least 1 s), the
        seconds the solve's other descents took."""
        ref = Refiner(problem, dataclasses.replace(main.opts, swap_waits=True))
        ref.apart = True
        if self.options.time_limit_s is None and problem.num_nodes > self.POOL_MAX_NODES:
            ref.time_limit_s = self.SWAP_WAIT_SHARE * max(spent_s, 1.0)
        return ref

    def _waiting_hybrid(self, problem: RematProblem, refs: list[Refiner], budgets: list[int], snaps: list[dict],
                        ran: list[Refiner]) -> tuple[list[Refiner], list[dict]]:
        """For the budgets of ``budgets`` a fallback met (``snaps``: theirs),
        a hybrid descent that may wait for copies out (``swap_waits=True``, the
        main descent's other options), where the fallbacks included the
        swap-only one that waits (:meth:`_fallbacks`): at a budget only waiting
        reaches, that one swaps every storage it evicts and pays every stall,
        where a hybrid descent recomputes what is cheap to regenerate and waits
        only for the rest.  ``random_layered_n100`` with copies as slow as
        compute (copying the no-remat peak once takes one step) at 0.5 of its
        peak: 1.52 -> 0.64 of the compute time added; with copies 4x slower,
        6.41 -> 2.97 at 0.5 and 1.17 -> 0.81 at 0.7.  On problems of more
        than :attr:`POOL_MAX_NODES` nodes for at most :attr:`SWAP_WAIT_SHARE`
        of the time the others took.  ``ran``: every descent the solve ran
        (their clocks share ``time_limit_s``).  ``([descent], [its snapshots])``,
        or ``([], [])`` where no fallback met a budget."""
        met = [b for b in budgets if any(s.get(b) is not None for s in snaps)]
        if not met:
            return [], []
        spent = sum(r.clock_s() for r in ran)
        ref = self._apart_waiting(problem, refs[0], spent)
        ref.asked = set(met)
        return [ref], self._descend_all([ref], met, spent_s=spent)

    def _plain(self, problem: RematProblem, opts: LibraOptions, budgets: list[int],
               reuse: list[Refiner] | None) -> Refiner:
        """A plain descent of ``opts`` for ``budgets``: the first of ``reuse``
        with these options that :meth:`Refiner.rewind` puts back before the
        largest budget (taken out of ``reuse``: the same snapshots as a new
        one), or a new one (keeping checkpoints where :meth:`_rewindable`
        says)."""
        for k, ref in enumerate(reuse or ()):
            if type(ref) is Refiner and ref.opts == opts and ref.rewind(max(budgets)):
                return reuse.pop(k)
        return self._rewindable(problem, [Refiner(problem, opts)])[0]

    def _descend_all(self, refs: list[Refiner], budgets: list[int], spent_s: float = 0.0,
                     free: dict | None = None) -> list[dict]:
        """Run the descents one after another towards ``budgets``.  With
        ``time_limit_s``, the limit is shared fairly: each descent may refine
        for an equal share of what is left of it (less ``spent_s``, seconds
        already spent by earlier descents of this solve), so a descent that
        stops early leaves its time to the next ones and none starts with
        nothing left while the limit is not spent.  With ``free`` (a dict),
        the first descent's free plans (:meth:`_free_plans`) are put there and
        the other descents run only for the budgets without one."""
        limit = self.options.time_limit_s
        out = []
        for k, ref in enumerate(refs):
            todo = budgets
            if ref.missed_by is not None:   # only for the budgets that descent did not reach
                reached = out[refs.index(ref.missed_by)]
                todo = [b for b in budgets if reached.get(b) is None]
                ref.asked = set(todo)
            if free:   # nothing plans any cheaper where the first descent's plan adds no time
                todo = [b for b in todo if b not in free]
                ref.asked = set(todo)
            if k and todo and self._bounded(ref):   # where its bound rules it out against the first's plan
                skip = self._skipped(ref, out[0], todo)
                if skip:
                    ref.skipped.update(skip)
                    todo = [b for b in todo if b not in skip]
                    ref.asked = set(todo)
            if not todo:
                out.append({})
                continue
            if limit is not None:
                used = spent_s + sum(r.clock_s() for r in refs[:k])
                ref.time_limit_s = ref.clock_s() + max(limit - used, 0.0) / (len(refs) - k)
            out.append(ref.descend(todo))
            if free is not None and k == 0 and len(refs) > 1:
                free.update(self._free_plans(ref, out[0], todo))
        return out

    #: the hybrid portfolio's swap-only descent is skipped at a budget where its lower bound
    #: (``bounds.swap_only_lower_bounds``) is over this many times the hybrid descent's estimate there
    SKIP_RATIO = 2.0

    def _bounded(self, ref: Refiner) -> bool:
        """Whether descent ``ref`` has a lower bound that may skip it
        (:meth:`_skipped`): the hybrid portfolio's plain swap-only descent."""
        return self.options.policy == "hybrid" and type(ref) is Refiner and ref.opts.policy == "swap"

    def _skipped(self, ref: Refiner, first: dict, budgets: list[int]) -> dict[int, float]:
        """The budgets of ``budgets`` where swap-only descent ``ref`` cannot
        give the plan a solve returns, each with its bound (s): its plan adds
        at least :func:`~libra_opt.solvers.libra.bounds.swap_only_lower_bounds`
        (copies out cannot free the bytes sooner), over :attr:`SKIP_RATIO`
        times what the first descent's snapshot there (``first``: budget ->
        snapshot) is estimated to add.  An estimate is not a simulation:
        :meth:`_planned` runs a skipped descent after all where the plan it
        finds does not cost less than the bound.  GPT-2 medium b8 at 0.5 of
        the peak: the bound is 0.147 s, hybrid's plan 0.018 s (swap-only
        descent: 0.11 CPU s, and it reaches no budget under 0.9 there)."""
        have = {b: first[b].timeline.added_s() for b in budgets if first.get(b) is not None}
        if not have:
            return {}
        bounds = swap_only_lower_bounds(ref.tl, sorted(have))
        return {b: bounds[b] for b, est in have.items() if bounds[b] > self.SKIP_RATIO * max(est, 0.0)}

    def _planned(self, problem: RematProblem, refs: list[Refiner], snaps: list[dict], budget: int,
                 pool: "_BaselinePool | None", met_only: bool = False, done: dict | None = None) -> RawSolution:
        """:meth:`_plan` for ``budget`` over the descents' snapshots ``snaps``
        (one dict per descent); where a descent was skipped there
        (:meth:`_skipped`) and the plan found adds no less than its bound
        (or none is found; with ``met_only``: none is found), that descent
        runs for ``budget`` (resumed, or anew where it went past it: a new
        descent of its options takes the same steps), its snapshot goes into
        ``snaps`` and :meth:`_plan` runs again with it, so that a skip never
        changes the result.  ``done``: the groups' finished plans, shared
        with a later call for the same budget (:meth:`_libra_plan`).  Raises
        :class:`~libra_opt.errors.InfeasibleBudgetError` as :meth:`_plan`
        does."""
        these = [s.get(budget) for s in snaps]
        try:
            raw, err = self._plan(refs, these, budget, pool, met_only=met_only, done=done), None
        except InfeasibleBudgetError as e:
            raw, err = None, e
        cost = math.inf if raw is None else (0.0 if met_only else self._added_s(problem, raw))
        redo = [k for k, ref in enumerate(refs) if budget in ref.skipped and cost >= ref.skipped[budget]]
        if not redo:
            if err is None:
                return raw
            try:
                raise err
            finally:
                err = None   # (_no_cycle: its traceback holds this frame)
        err = None
        for k in redo:
            ref = refs[k]
            del ref.skipped[budget]
            if ref.done or ref.tl.peak()[0] <= budget:   # it went past the budget: a new one, the same way
                ref = Refiner(problem, ref.opts)
                ref.variant_bounds = refs[k].variant_bounds
            snap = ref.descend([budget]).get(budget)
            if snap is not None:   # (a snapshot's plan is finished by any descent of its options)
                snaps[k][budget] = these[k] = snap
        return self._plan(refs, these, budget, pool, met_only=met_only, done=done)

    @staticmethod
    def _added_s(problem: RematProblem, raw: RawSolution) -> float:
        """Simulated added time of ``raw``'s plan (s): every plan :meth:`_plan`
        returns carries its simulation (a descent's or a baseline's)."""
        return raw.simulation.added_s

    #: a plan whose simulated added time is at most this share of the problem's compute time (the
    #: simulator's rounding: it sums the same times in another order) adds none: no plan is cheaper
    FREE_REL = 1e-9

    def _free_plans(self, ref: Refiner, snaps: dict, budgets: list[int]) -> dict:
        """The budgets of ``budgets`` where descent ``ref``'s plan (its snapshot
        finished without exchange moves, lowered and simulated) adds no time
        (:attr:`FREE_REL`), each with that plan as this solver's result and
        the seconds it took: ``{budget: (RawSolution, seconds)}``.  Every
        plan's step takes at least the eager compute time, so no descent,
        fallback or baseline of the portfolio can be cheaper there, and a
        solve returns that plan without running them (random layered graphs
        of 1,000 nodes, hybrid at 0.3 of the peak, where swaps hide behind
        compute: 5.7 -> 0.56 CPU s, the recompute-only descents and their
        lowering skipped).  Only snapshots whose estimate adds no time are
        lowered."""
        tol = self.FREE_REL * ref.problem.total_compute_s
        out = {}
        for b in budgets:
            snap = snaps.get(b)
            if snap is None or snap.timeline.added_s() > tol:
                continue
            t0 = time.perf_counter()
            plan = ref.realize(ref.prepare(snap, b, exchange=False), snap, b)
            if plan is not None and plan.simulation.added_s <= tol:
                out[b] = (self._raw(plan, ref.label), time.perf_counter() - t0)
        return out

    def _solve(self, problem: RematProblem, budget_bytes: int) -> RawSolution:
        if not problem.num_nodes:
            return self._empty_plan(problem)
        return _paused(self._solve_one, problem, budget_bytes)

    def _empty_plan(self, problem: RematProblem) -> RawSolution:
        """A step without ops: the empty plan (peak 0, within every budget)."""
        sched = no_remat_schedule(problem)
        sched.meta["solver"] = self.name
        return RawSolution(schedule=sched, message="the problem has no nodes: nothing to plan",
                           extras=dict(decisions=[], retained=[], estimated_peak_bytes=0, estimated_added_s=0.0,
                                       steps=0, undone=0, repairs=0, policy=self.options.policy,
                                       descent=self.options.policy))

    def _solve_one(self, problem: RematProblem, budget_bytes: int) -> RawSolution:
        pool = self._pool(problem)
        below = self._below_floor(problem, budget_bytes, pool)
        refs, more = self._rewindable(problem, self._refiners(problem)), []
        if below is not None:   # no descent run: the tightening's rounds run these, rewound after the first
            raise self._tightened(problem, below, pool, refs, more)
        try:
            return self._solve_at(problem, budget_bytes, pool, refs, more)
        except InfeasibleBudgetError as e:
            raise self._tightened(problem, e, pool, refs, more) from None

    def _rewindable(self, problem: RematProblem, refs: list[Refiner]) -> list[Refiner]:
        """``refs`` with checkpoints kept (``Refiner.checkpoint_every``: every
        :attr:`CHECKPOINT_EVERY` steps at first), so that the tightening of an
        infeasible budget's stated minimum rewinds them
        (``Refiner.rewind``) rather than running new descents: the plain
        descents, on problems of at most :attr:`CHECKPOINT_MAX_NODES` nodes
        (a checkpoint is a copy of the timeline), where the tightening runs
        (no ``max_steps`` or ``time_limit_s``)."""
        o = self.options
        if o.max_steps is None and o.time_limit_s is None and problem.num_nodes <= self.CHECKPOINT_MAX_NODES:
            for ref in refs:
                if type(ref) is Refiner:
                    ref.checkpoint_every = self.CHECKPOINT_EVERY
        return refs

    def _under_floor(self, problem: RematProblem, budget: int) -> bool:
        """``budget`` (bytes) is under the memory floor and the descents are
        not bounded by ``max_steps`` or ``time_limit_s`` (:meth:`_below_floor`)."""
        o = self.options
        return o.max_steps is None and o.time_limit_s is None and budget < memory_lower_bound(problem)

    def _below_floor(self, problem: RematProblem, budget: int,
                     pool: _BaselinePool | None) -> InfeasibleBudgetError | None:
        """Where ``budget`` (bytes) is under the memory floor
        (:func:`~libra_opt.bounds.memory_lower_bound`: no plan of any kind
        fits there), the error to tighten, stated at the least memory of the
        baselines of the ``pool`` a solve falls back on (:meth:`_plan`), or
        at the no-remat peak (which the descents always meet), and ``None``
        elsewhere: the descents,
        fallbacks and finish steps at that budget are skipped (seconds on
        small graphs, where the bulk move's finish undoes every swap), and
        the tightening (:meth:`_tightened`) searches from the floor up.  Not
        where ``max_steps`` or ``time_limit_s`` bound the descents (their
        stated minimum is then the descents' own, which needs them run)."""
        if not self._under_floor(problem, budget):
            return None
        least = no_remat_peak(problem)
        if pool is not None:
            least = pool.min_peak(self._reach_baselines(), least)
        return InfeasibleBudgetError(budget, least, self.name, "the budget is under the memory floor, where no plan fits")

    def _solve_at(self, problem: RematProblem, budget_bytes: int, pool: _BaselinePool | None,
                  refs: list[Refiner] | None = None, built: list[Refiner] | None = None) -> RawSolution:
        """One solve (descents, fallbacks, finish) sharing the baselines'
        ``pool``; ``refs``: the descents to run (new ones of
        :meth:`_refiners` where ``None``); ``built``: where given, the
        fallback descents run are added to it."""
        refs = self._refiners(problem) if refs is None else refs
        built = [] if built is None else built
        free: dict = {}
        snaps = self._descend_all(refs, [budget_bytes], free=free)
        if budget_bytes in free:
            return free[budget_bytes][0]
        more, more_snaps = self._fallbacks(problem, refs, [budget_bytes], snaps)
        built.extend(more)
        refs, snaps = refs + more, snaps + more_snaps
        done: dict = {}   # the groups' finished plans, shared with _stall_basis
        try:
            raw = self._planned(problem, refs, snaps, budget_bytes, pool, done=done)
        except InfeasibleBudgetError:
            if any(not isinstance(r, ContinuedRefiner) for r in more) or problem.num_nodes > self.POOL_MAX_NODES:
                raise
            # the descents reached the budget in their estimate but no plan lowers within it: the fallbacks
            # too (as the tightening's several budgets run them), so that a stated minimum is met
            more, more_snaps = self._fallbacks(problem, refs, [budget_bytes], snaps, force=True)
            if not more:
                raise
            built.extend(more)
            refs, snaps = refs + more, snaps + more_snaps
            return self._planned(problem, refs, snaps, budget_bytes, pool)
        main, main_snaps = self._without_continued(refs, snaps)
        basis = self._stall_basis(problem, main, main_snaps, budget_bytes, raw, pool, done)
        if basis is not None and self._stalling(problem, main, [s.get(budget_bytes) for s in main_snaps], basis):
            better = self._less_stalling(problem, main, {budget_bytes: basis}).get(budget_bytes)
            if better is not None and better[0].simulation.added_s < raw.simulation.added_s:
                raw = better[0]
        return raw

    @staticmethod
    def _without_continued(refs: list[Refiner], snaps: list[dict]) -> tuple[list[Refiner], list[dict]]:
        """``refs`` and their ``snaps`` without the continued descents (:meth:`_continued`)."""
        keep = [k for k, ref in enumerate(refs) if not isinstance(ref, ContinuedRefiner)]
        return [refs[k] for k in keep], [snaps[k] for k in keep]

    def _stall_basis(self, problem: RematProblem, main: list[Refiner], main_snaps: list[dict], budget: int,
                     raw: RawSolution, pool: "_BaselinePool | None", done: dict | None = None) -> RawSolution | None:
        """The plan whose stalls decide whether a hybrid descent that waits
        runs for ``budget`` (:meth:`_stalling`, :meth:`_less_stalling`): ``raw``,
        the solve's plan, or, where that is a continued descent's
        (:meth:`_continued`), the plan the solve finds with ``main`` alone
        (its descents but the continued ones, ``main_snaps`` their
        snapshots; ``None``: none), so that the continued descent never keeps the solve from the
        cheaper plan of a descent that waits.  ``done``: the finished plans
        of the call that found ``raw`` (:meth:`_libra_plan`), so that no
        group is finished twice."""
        if not str(raw.extras.get("descent", "")).startswith(ContinuedRefiner.LABEL):
            return raw
        try:
            return self._planned(problem, main, main_snaps, budget, pool, done=done)
        except InfeasibleBudgetError:
            return None

    #: hybrid mode runs a hybrid descent that waits for copies out (:meth:`_less_stalling`) for a budget
    #: whose plan stalls for more than this share of the time it adds
    STALL_SHARE = 0.25

    def _stalling(self, problem: RematProblem, refs: list[Refiner], these: list[Snapshot | None],
                  raw: RawSolution) -> bool:
        """Whether ``raw``, the plan for a budget from the descents ``refs``
        (``these``: their snapshots there), stalls for more than
        :attr:`STALL_SHARE` of the time it adds, in hybrid mode with the
        portfolio and ``swap_waits=None`` on a device whose copies overlap
        compute, where no descent that waits for copies out has a snapshot
        (a plan) there already.  Not asked where the fallbacks were forced
        (``_solve_at``, ``_forced``)."""
        o, sim = self.options, raw.simulation
        return (o.policy == "hybrid" and o.portfolio and o.swap_waits is None
                and problem.device.copies_overlap_compute and sim is not None and sim.added_s > 0
                and sim.stall_s > self.STALL_SHARE * sim.added_s
                and not any(r.allow_wait and s is not None for r, s in zip(refs, these)))

    def _less_stalling(self, problem: RematProblem, refs: list[Refiner], raws: dict[int, RawSolution]
                       ) -> dict[int, tuple[RawSolution, float]]:
        """For budgets whose plan ``raws[budget]`` stalls (:meth:`_stalling`): one
        hybrid descent that waits for copies out (the options of ``refs[0]``,
        the main descent, with ``swap_waits=True``), run apart
        (``Refiner.apart``) to every budget of ``raws``, largest first, its
        plan finished (:meth:`_finished`) and kept where it simulates cheaper.
        Where the descent without waits swaps what it cannot hide and stalls,
        this one recomputes the storages that are cheap to regenerate and
        waits for the others' copies out (``random_layered_graph(250, seed=0)``
        with copies as slow as compute, at 0.5 of its peak: 0.079 -> 0.048
        of the compute time added).  On problems of more than
        :attr:`POOL_MAX_NODES` nodes for at most :attr:`SWAP_WAIT_SHARE` of the
        time the other descents took.  ``{budget: (plan, seconds it took)}``
        where the plan is cheaper."""
        t0 = time.perf_counter()
        spent = sum(r.clock_s() for r in refs)
        ref = self._apart_waiting(problem, refs[0], spent)
        snaps = self._descend_all([ref], sorted(raws, reverse=True), spent_s=spent)[0]
        out = {}
        for b, raw in raws.items():
            t1 = time.perf_counter()
            snap = snaps.get(b)
            found = self._finished([ref], [snap], b, False) if snap is not None else None
            if found is not None and found.plan.simulation.added_s < raw.simulation.added_s:
                own = snap.elapsed_s + time.perf_counter() - t1
                out[b] = (self._raw(found.plan, ref.label + found.tag, found.near), own)
        log.debug("libra: a hybrid descent that waits for %d stalling plans took %.3f s, %d cheaper",
                  len(raws), time.perf_counter() - t0, len(out))
        return out

    #: recompute-only mode compares with its baselines at every budget on problems of at most this many
    #: nodes (building their plans costs seconds on thousands of nodes); on larger ones only where no
    #: descent meets the budget
    POOL_MAX_NODES = 1000
    #: ``retain_inputs=None`` scores retained chain inputs during the descents on problems of at most
    #: this many nodes (see ``LibraOptions.retain_inputs``)
    RETAIN_INPUTS_MAX_NODES = 1000
    #: recompute-only mode's portfolio adds a descent over every eviction window (``windows="all"``) on
    #: two-phase problems of at most this many nodes (the default windows miss gaps inside a phase)
    ALL_WINDOWS_MAX_NODES = 300
    #: the portfolio's descents other than the chosen policy's order candidates by their cheapest
    #: recompute variant (``Refiner.variant_bounds``) on problems of at most this many nodes (random
    #: layered graphs of 1,000 nodes, recompute-only at 0.8: 43,919 -> 12,069 added; its solves take up
    #: to 2.5x the CPU seconds at infeasible budgets, where the tightening runs the descents again)
    VARIANT_BOUNDS_MAX_NODES = 1000
    #: exchange moves are tried from the descents whose plan (undo pass done) is estimated within this
    #: share of the cheapest one's (they can cut a plan's added time 4x: ``random_layered_graph(250,
    #: seed=1)`` at 0.7, recompute-only, 36,739 -> 7,849, where another descent's plan, 7% cheaper before
    #: them, stays at 34,299; 0.05 left that one out)
    EXCHANGE_SPAN = 0.10
    #: the cut bound that ``added_gap_tol`` compares with tries this many cut nodes, those of the largest
    #: no-remat memory first (a valid bound, at most the full one): with 16, the same plans as with every
    #: cut node over ``solve_rate.py``'s 390 libra rows and 2,400 fuzz and pattern solves, and on
    #: ``h100_resnet50_b128`` at 0.3 of its peak (415 cut nodes) it takes 0.002 CPU s instead of 0.052
    #: (hybrid; recompute-only 0.001 instead of 0.029), besides the tables built once per problem (about
    #: 0.005 s)
    NEAR_CANDIDATES = 16
    #: policy switches (``LibraOptions.switch``) run on at most this many plans (one per descent) per budget
    SWITCH_PLANS = 4
    #: ... and on a plan with swaps only where its estimate is within this share of the cheapest plan so far
    SWITCH_SPAN = 0.05
    #: on problems of more than ``POOL_MAX_NODES`` nodes, hybrid's fallback swap-only descent that waits
    #: for copies out (``LibraOptions.swap_waits``) refines for at most this share of the seconds the
    #: other descents took (at least 1 s): it takes many more steps (minutes on thousands of nodes)
    SWAP_WAIT_SHARE = 1.0
    #: the reverse greedy (:class:`~libra_opt.solvers.libra.reverse.ReverseRefiner`, a fallback where no
    #: descent meets a budget) on problems of at most this many nodes (its undo pass replays chains back to
    #: the inputs: quadratic in depth)
    REVERSE_MAX_NODES = 200
    #: rounds of the tightening of a stated minimum budget (each one set of descents)
    TIGHTEN_ROUNDS = 3
    #: budgets planned per round: at least this many, and more, up to ``TIGHTEN_GRID_MAX``, where a
    #: round needs them to step by half of ``TIGHTEN_REL`` (a round is one set of descents, seconds on a
    #: 1,000-node graph; each budget one snapshot per descent, under 1 MB there)
    TIGHTEN_GRID = 24
    TIGHTEN_GRID_MAX = 48
    #: a stated minimum ``m`` is tight when 0.99 ``m`` is at or under a budget found infeasible
    TIGHTEN_REL = 0.01
    #: a solve's plain descents keep a checkpoint every this many steps at first (``Refiner.rewind``: the
    #: tightening of an infeasible budget rewinds them rather than running new ones), on problems of at
    #: most ``CHECKPOINT_MAX_NODES`` nodes
    CHECKPOINT_EVERY = 8
    CHECKPOINT_MAX_NODES = 1000
    _tight_detail = "the smallest budget it plans, verified"
    _floor_detail = "the memory floor: no plan fits under it, and a solve meets it"

    def _first_planned(self, problem: RematProblem, budgets: list[int], pool: _BaselinePool | None,
                       ran: list[Refiner] | None = None, ran_more: list[Refiner] | None = None
                       ) -> tuple[int | None, int | None]:
        """The smallest of ``budgets`` found met, by bisection, from one set
        of descents recording all of them (as :meth:`solve_many`; equal to
        single solves), and the highest budget tried and found not met below
        it (``None``: none was tried there).  ``(None, highest tried)`` where
        none is met.  Bisection lowers at most ``log2(len(budgets)) + 1``
        budgets (each one the finish step of every descent: seconds on
        thousands of nodes) where a scan from the smallest lowered all the
        infeasible ones; where being met is not monotone in the budget, the
        budget it returns is still one a solve meets.  Where the end of a
        descent measured on the way (``Refiner.measured_min_feasible_bytes``;
        a budget not met measures them all) lies between the budget found and
        the one below it found not met, that end's simulated peak is returned
        instead: met too, and lower.  The descents are a solve's (the
        ``merge`` one included: left out, budgets a solve meets were found
        not met, and on random layered graphs the stated minimum was up to
        11% above one a solve meets).  ``ran``: the descents the solve ran
        (:meth:`_refiners`' own), rewound to where they first got under the
        largest budget (``Refiner.rewind``: the same snapshots as new
        descents, without the steps above it); new ones where any cannot
        be.  ``ran_more``: the fallback descents the solve ran, rewound
        likewise where a round needs one of the same options; the ones
        this round builds are added to it, for the next round."""
        refs = ran if ran is not None and all(ref.rewind(max(budgets)) for ref in ran) else self._refiners(problem)
        snaps = self._descend_all(refs, budgets)
        more, more_snaps = self._fallbacks(problem, refs, budgets, snaps, reuse=list(ran_more or ()), cheaper=False)
        if ran_more is not None:   # the fallbacks this round built: a later round rewinds them (_plain)
            built = [ref for ref in more if all(ref is not r for r in ran_more)]
            ran_more.extend(built)
        refs, snaps = refs + more, snaps + more_snaps
        grid = sorted(budgets)
        lo, hi, failed = -1, len(grid), None      # grid[hi] met (hi == len: none found yet); grid[lo] not met
        while hi - lo > 1:
            mid = (lo + hi) // 2
            try:
                self._planned(problem, refs, snaps, grid[mid], pool, met_only=True)
                hi = mid
            except InfeasibleBudgetError:
                lo, failed = mid, grid[mid]
        if hi == len(grid):
            return None, failed
        # a descent's end measured between the budgets found (a budget not met plans every end, see
        # _libra_plan): met at its own simulated peak, which the grid can step over
        ends = [e for e in (ref.measured_min_feasible_bytes() for ref in refs)
                if e is not None and (failed is None or e > failed) and e < grid[hi]]
        return min(ends, default=grid[hi]), failed

    def _tightened(self, problem: RematProblem, err: InfeasibleBudgetError, pool: _BaselinePool | None,
                   ran: list[Refiner] | None = None, ran_more: list[Refiner] | None = None) -> InfeasibleBudgetError:
        """``err`` with a ``min_feasible_bytes`` that is a budget this solver
        then meets, within :attr:`TIGHTEN_REL` of the smallest it can plan.

        The descents' stated minimum (the simulated peak of their lowest plan)
        may not be met by a solve at it, and is often above budgets a solve
        meets.  Each round plans a geometric grid of :attr:`TIGHTEN_GRID` (up to :attr:`TIGHTEN_GRID_MAX`)
        budgets from the highest budget known infeasible (at least the memory
        floor, :func:`~libra_opt.bounds.memory_lower_bound`) up to the lowest
        known plannable, and the floor itself where it lies in that range
        (the grid steps over it; plans that swap often reach it), from one set of descents, and finds the smallest one
        met by bisection (:meth:`_first_planned`); at most :attr:`TIGHTEN_ROUNDS` rounds, until the gap is under 1%.
        Where the stated minimum itself is not met, the next round looks
        above it, up to the no-remat peak, which the descents always meet.  Skipped (the stated
        minimum as it was) when ``max_steps`` or ``time_limit_s`` bound the
        descents.  ``ran``, ``ran_more``: the descents and the fallback
        descents the solve ran, rewound for each round where they kept
        checkpoints (:meth:`_first_planned`).  Under the memory floor the
        stated minimum is :meth:`_below_floor`'s, which a solve meets (a
        baseline's plan peaks there, which :meth:`_plan` falls back on, or it
        is the no-remat peak): where it is the floor itself, the only budget
        a round would plan, no round runs (a U-Net of 56 nodes at 0.3 of its
        peak, hybrid: one round of descents, 0.05 CPU s, to verify what
        ``swap-all``'s plan shows); nor where the floor lies in the range the
        rounds would search and the bulk move meets it (:meth:`_floor_met`):
        no budget under the floor can be met (the rounds plan the floor
        among their budgets, but their bisection can step over it where
        being met is not monotone in the budget)."""
        if err.min_feasible_bytes is None or self.options.max_steps is not None or self.options.time_limit_s is not None:
            return err
        floor = memory_lower_bound(problem)
        lo, hi = max(int(err.budget_bytes), floor - 1), int(err.min_feasible_bytes)
        verified, rounds, peak = False, 0, no_remat_peak(problem)
        if hi <= lo + 1 and self._under_floor(problem, int(err.budget_bytes)):   # _below_floor's: a solve meets it
            verified = True
        elif lo < floor <= hi and self._floor_met(problem, floor, pool, ran):   # nothing lower can be met
            return InfeasibleBudgetError(err.budget_bytes, floor, self.name, self._floor_detail)
        while rounds < self.TIGHTEN_ROUNDS and (not verified or hi * (1 - self.TIGHTEN_REL) > lo):
            rounds += 1
            log_lo = math.log(max(lo, 1))
            span = math.log(hi) - log_lo   # the grid's range, a log ratio
            # as many budgets as one round needs to step by half of TIGHTEN_REL, within
            # TIGHTEN_GRID..TIGHTEN_GRID_MAX
            need = math.ceil(span / -math.log1p(-self.TIGHTEN_REL / 2)) + 1 if span > 0 else 0
            k = min(max(self.TIGHTEN_GRID, need), self.TIGHTEN_GRID_MAX)
            grid = {min(max(int(round(math.exp(log_lo + span * i / k))), lo + 1), hi) for i in range(1, k + 1)}
            if lo < floor <= hi:   # the floor too: where every storage can be swapped, plans often reach it
                grid.add(floor)
            grid = sorted(grid)
            found, failed = self._first_planned(problem, grid, pool, ran, ran_more)
            if found is None:   # not even the stated minimum: look above it, up to the no-remat peak
                if hi >= peak:
                    break
                lo, hi = hi, peak
                continue
            lo, hi, verified = max(lo, failed if failed is not None else lo), found, True
        if not verified:
            return err
        if not rounds:
            return InfeasibleBudgetError(err.budget_bytes, hi, self.name, self._floor_detail)
        return InfeasibleBudgetError(err.budget_bytes, hi, self.name,
                                     f"{self._tight_detail} ({rounds} rounds; the highest budget found infeasible "
                                     f"is {lo} bytes)")

    def _floor_met(self, problem: RematProblem, floor: int, pool: _BaselinePool | None,
                   ran: list[Refiner] | None) -> bool:
        """Whether a solve at the memory floor ``floor`` (bytes,
        :func:`~libra_opt.bounds.memory_lower_bound`) meets it through the
        bulk move (:class:`_BulkSwapRefiner`, which a solve runs there as a
        portfolio member or a fallback, with the options it gets there:
        the main descent's, ``ran[0]``, swap-only with waits): its plan, or
        one of the ``pool``'s baselines, lowered within the floor
        (:meth:`_planned`, ``met_only``).  Then the floor is the stated
        minimum, and no budget under it can be met: :meth:`_tightened`
        returns it without its rounds of descents (the cost of a solve's
        descents), which plan the floor among their budgets and state it
        too, unless their bisection steps over it (2 of 5,932 fuzz solves,
        hybrid and swap-only: a higher minimum).  ``h100_llama_b8``
        hybrid at 0.3 of its peak: 1.96 -> 0.19 CPU s; the external
        ``random_layered_n100`` hybrid at 0.3: 0.15 -> 0.03 s.  ``False``
        where the bulk move is not allowed (:meth:`_bulk_ok`) or does not
        plan within the floor (the rounds run as before)."""
        if not ran or not self._bulk_ok(problem):
            return False
        ref = next((r for r in ran if isinstance(r, _BulkSwapRefiner)), None)
        if ref is None:
            ref = self._bulk(problem, ran[0])
        snap = ref.descend([floor]).get(floor)
        if snap is None:
            return False
        try:
            self._planned(problem, [ref], [{floor: snap}], floor, pool, met_only=True)
        except InfeasibleBudgetError:
            return False
        return True

    def _pool(self, problem: RematProblem) -> _BaselinePool | None:
        """The baselines' plans the portfolio compares with: hybrid's, or in
        recompute-only mode :data:`RECOMPUTE_BASELINES`, in swap-only mode
        :data:`SWAP_BASELINES` (``None`` without the portfolio)."""
        return _BaselinePool(problem) if self.options.portfolio else None

    def _reach_baselines(self) -> tuple[str, ...]:
        """The baselines whose plans bound how low a solve reaches (a solve
        falls back on them where no descent meets a budget, :meth:`_plan`):
        :data:`RECOMPUTE_BASELINES` in recompute-only mode,
        :data:`SWAP_BASELINES` in swap-only mode, :data:`REACH_BASELINES` in
        hybrid mode."""
        return {"recompute": RECOMPUTE_BASELINES, "swap": SWAP_BASELINES}.get(self.options.policy, REACH_BASELINES)

    def _plan(self, refs: list[Refiner], snaps: list[Snapshot | None], budget: int,
              pool: _BaselinePool | None = None, met_only: bool = False, done: dict | None = None) -> RawSolution:
        """The cheapest simulated plan among the descents' snapshots for
        ``budget`` (after the undo pass) that lowers within it; failing that,
        the end of a descent (with, then without the undo pass).  With a
        baseline ``pool`` (hybrid's portfolio), a baseline's plan where it is
        cheaper: ``swap-all``'s at every budget; where no descent meets the
        budget, ``swap-all``'s or ``checkpoint-all``'s (the least memory of
        each policy) and, where one of them meets it, the cheapest of every
        baseline's that does (recompute-only and swap-only mode: their own
        baselines, see ``LibraOptions.portfolio``).
        ``met_only``: only whether the budget is met (the tightening): the
        first plan found within it, without exchange moves or the passes
        that only save time (``polish=False`` of ``Refiner.prepare``), and
        the baselines only where no descent meets it.  ``done``: see
        :meth:`_libra_plan`."""
        found = self._libra_plan(refs, snaps, budget, met_only, done)
        if met_only and found is not None:
            return found
        recompute, single = self.options.policy == "recompute", self.options.policy != "hybrid"
        # where no descent meets the budget, the least they meet (over it): the baselines' plans are lowered
        # only until their peak reaches it (:meth:`_BaselinePool.best`)
        least = None if found is not None else min(ref.min_feasible_bytes() for ref in refs)
        if pool is not None and budget >= pool.floor:
            small = pool.problem.num_nodes <= self.POOL_MAX_NODES
            # where a descent's plan is found, only baselines' plans that can be cheaper are built
            below = found.simulation.added_s if found is not None else None
            if single and (found is None or small or not recompute):   # the single policy's own baselines
                hit = pool.best(self._reach_baselines(), budget, below, least) if found is None or below > 0 else None
            elif single:   # recompute-only on a large problem: only where no descent meets the budget
                hit = None
            elif found is not None and small:   # hybrid: every baseline, as recompute-only mode compares its own
                hit = pool.best(PORTFOLIO_BASELINES, budget, below) if below > 0 else None
            else:
                hit = pool.best(ALWAYS_COMPARED if found is not None else REACH_BASELINES, budget, below, least)
            if found is None and hit is not None and not single:
                # one meets it: the checkpointing ones may be cheaper
                hit = pool.best(PORTFOLIO_BASELINES, budget, least=least)
            if hit is not None and (found is None or hit[1].simulation.added_s < found.simulation.added_s):
                return self._baseline_raw(*hit)
        if found is not None:
            return found
        if pool is not None:
            least = pool.min_peak(self._reach_baselines(), least)
        raise InfeasibleBudgetError(budget, least, self.name,
                                    f"{refs[0].step} refinement steps, policy {self.options.policy!r}"
                                    + (", and the baselines of the portfolio" if pool is not None else ""))

    def _libra_plan(self, refs: list[Refiner], snaps: list[Snapshot | None], budget: int, met_only: bool = False,
                    done: dict | None = None) -> RawSolution | None:
        """The descents' own plan for ``budget`` (see :meth:`_plan`), or ``None``.
        The plans of descents run only for cheaper plans (``Refiner.apart``:
        :meth:`_waiting_hybrid`, :meth:`_continued`) are finished apart from
        the others' and from each other (exchange moves and policy switches
        pick among the plans they are given), and the cheapest simulated plan
        of these groups is returned: never costlier than without those
        descents.  ``done`` (a dict, or ``None``): each group's finished plan
        is kept there and taken from there where the same descents ask with
        the same snapshots for the same budget (the plan without the
        continued descents, :meth:`_stall_basis`, finishes no group twice)."""
        groups = [[k for k, ref in enumerate(refs) if not ref.apart]] + [[k] for k, ref in enumerate(refs) if ref.apart]
        best = None
        for ks in groups:
            if not ks:
                continue
            group, these = [refs[k] for k in ks], [snaps[k] for k in ks]
            key = (tuple(map(id, group)), budget, met_only)
            hit = done.get(key) if done is not None else None
            if hit is not None and all(a is b for a, b in zip(hit[0], these)):
                found = hit[1]
            else:
                found = self._finished(group, these, budget, met_only)
                if done is not None:
                    done[key] = (these, found)   # (the snapshots kept: their ids stay theirs while it lives)
            if found is not None and (best is None or found.plan.simulation.added_s < best[0].plan.simulation.added_s):
                best = (found, refs[ks[found.descent]])
            if best is not None and met_only:
                break
        if best is not None:
            found, ref = best
            return self._raw(found.plan, ref.label + found.tag, found.near)
        polish = not met_only
        for ref in refs:
            final = ref.final()
            if ref.min_feasible_bytes() <= budget:
                if met_only:   # met: the plan min_feasible_bytes measured (the undo pass of an end takes seconds)
                    return self._raw(ref.as_lowered(final), ref.label)
                plan = (ref.finish(final, budget, polish=polish) or ref.finish(final, budget, undo=False, repair=False)
                        or ref.as_lowered(final))   # the plan min_feasible_bytes measured
                return self._raw(plan, ref.label)
        # the end of a descent over the budget as it is can fit once the undo pass gives back the
        # decisions that raise memory elsewhere (an eviction whose regeneration lands on a new peak)
        last = None
        for ref in refs:
            final = ref.final()
            prepared = ref.prepare(final, budget, exchange=False, polish=False)
            if prepared.timeline.peak()[0] <= budget:   # the passes that save time keep it within the budget
                if polish:
                    prepared = ref.prepare(final, budget, exchange=False)
                plan = ref.realize(prepared, final, budget)
                if plan is not None and (last is None or plan.simulation.added_s < last[0].simulation.added_s):
                    last = (plan, ref)
                    if met_only:
                        break
        if last is not None:
            return self._raw(last[0], last[1].label)
        return None

    def _finished(self, refs: list[Refiner], snaps: list[Snapshot | None], budget: int, met_only: bool
                  ) -> _Found | None:
        """The cheapest simulated plan within ``budget`` from the snapshots
        ``snaps`` of the descents ``refs``: each prepared (descents that stopped
        in the same state share one), exchange moves from those near the
        cheapest estimate (none where the cheapest plan, lowered and
        simulated, is within ``added_gap_tol`` of the cut bound:
        :meth:`_near_bound`), then, in hybrid mode, policy switches on the plans
        (:meth:`_switched`), each switched plan kept where it simulates
        cheaper; ``None`` where none lowers within it.  ``_Found.descent``
        indexes ``refs``.  ``met_only``: only whether the budget is met
        (:meth:`_first_met`)."""
        if met_only:
            return self._first_met(refs, snaps, budget)
        cands = []
        seen: dict[tuple, tuple] = {}   # descents that stopped in the same state share one prepared plan
        for k, (ref, snap) in enumerate(zip(refs, snaps)):
            if snap is not None:
                key = self._state_key(ref, snap)
                prepared = seen.get(key)
                if prepared is None:
                    prepared = seen[key] = ref.prepare(snap, budget, exchange=False)
                cands.append(_Candidate(prepared.timeline.added_s(), k, prepared))
        realized: dict[int, FinishedPlan | None] = {}   # id(prepared) -> its realized plan (_cheapest)
        exchanging = bool(self.options.exchange and cands and refs[0].problem.num_nodes <= EXCHANGE_MAX_NODES)
        near = self._near_bound(refs, snaps, cands, budget, realized) if exchanging else None
        if exchanging and near is None:
            # exchange moves (costly) only from the descents whose plan is near the cheapest estimate
            # (the plans without them stay candidates: the estimate can drift from the simulation); on
            # larger problems there are none (exchange.MAX_NODES), and preparing again finds the same plan.
            # Once per prepared plan: of the descents that share one (_state_key: they differ only in
            # retain_inputs, which scores the exchanges' own steps), the first exchanges.  Over
            # solve_rate.py's 390 rows, 2,400 fuzz and pattern solves and hybrid_optimality's 180 copy-bound
            # cells, the same plans and stated minima as when each exchanged (h100_resnet50_b128 hybrid at
            # 0.3 of its peak: 3 exchange calls -> 2, none kept either way, 0.87 -> 0.69 CPU s)
            top = min(c.estimate for c in cands)
            tried: set[int] = set()
            for est, k, prep, _ in list(cands):
                if est <= top * (1 + self.EXCHANGE_SPAN) and id(prep) not in tried:
                    tried.add(id(prep))
                    prepared = refs[k].prepare(snaps[k], budget, exchange=True)
                    if prepared.timeline.added_s() < est:
                        cands.append(_Candidate(prepared.timeline.added_s(), k, prepared))
        best = self._cheapest(refs, snaps, cands, budget, realized=realized)
        if best is not None and self.options.switch and self.options.policy == "hybrid":
            # policy switches: only where a plan of the descents meets the budget (they change what a
            # plan costs, not which budgets are met: the tightening's stated minimum holds), and only a
            # switched plan cheaper than that plan once simulated replaces it
            found = self._cheapest(refs, snaps, self._switched(refs, cands, budget), budget,
                                   below=best.plan.simulation.added_s)
            if found is not None and found.plan.simulation.added_s < best.plan.simulation.added_s:
                best = found
        if best is not None and self.options.policy == "hybrid" and self.options.swap_inputs:
            best = self._inputs_swapped(best, budget)
        if best is not None and near is not None:
            best = best._replace(near=near)
        return best

    @staticmethod
    def _inputs_swapped(found: _Found, budget: int) -> _Found:
        """``found`` with its recomputation chains cut by swapped retentions
        (:func:`~libra_opt.solvers.libra.swap_inputs.swap_chain_inputs`)
        where that simulates cheaper within ``budget`` (bytes): tagged
        ``"+swapped inputs"``; ``found`` itself otherwise."""
        plan = found.plan
        tl = plan.timeline
        got = swap_chain_inputs(tl.problem, tl.plan(), plan.schedule, plan.simulation, budget)
        if not got.taken:
            return found
        plan = dataclasses.replace(plan, schedule=got.schedule, simulation=got.simulation, swap_retained=got.taken)
        return found._replace(plan=plan, tag=found.tag + "+swapped inputs")

    def _first_met(self, refs: list[Refiner], snaps: list[Snapshot | None], budget: int) -> _Found | None:
        """:meth:`_finished` for a caller that asks only whether ``budget``
        (bytes) is met (the tightening): the snapshots, lowest estimate first,
        each prepared without the passes that only save time (descents that
        stopped in the same state share one prepared plan) and lowered (with
        repairs, each by its own descent) one after another, until one lowers
        within the budget.  The same answer as preparing them all first and
        lowering until one fits, with fewer undo passes: each is deterministic,
        and the answer is whether any of them fits.  ``None`` where none does."""
        seen: dict[tuple, Prepared] = {}
        order = sorted((snap.timeline.added_s(), k) for k, snap in enumerate(snaps) if snap is not None)
        for _, k in order:
            ref, snap = refs[k], snaps[k]
            key = self._state_key(ref, snap)
            prepared = seen.get(key)
            if prepared is None:
                prepared = seen[key] = ref.prepare(snap, budget, exchange=False, polish=False)
            plan = ref.realize(prepared, snap, budget)
            if plan is not None:
                return _Found(plan, k, "")
        return None

    @staticmethod
    def _state_key(ref: Refiner, snap: Snapshot) -> tuple:
        """What :meth:`Refiner.prepare` (without exchange moves) reads of a
        descent and its snapshot: its class (the bulk move prepares its own
        way), the options but ``retain_inputs`` (a
        descent's own scoring) and, for a descent that does not swap,
        ``swap_waits`` (an option of swaps, ``Refiner.allow_wait``: there
        ``False`` and ``None`` give the same descent), the window mode and
        the timeline's decisions
        (policies, window ends, swap-in floors and waits, retentions).  Two
        descents with one key prepare the same plan: the retained-inputs
        variant often ends where the plain descent does."""
        tl = snap.timeline
        opts = dataclasses.replace(ref.opts, retain_inputs=None)
        if not ref.allow_swap:
            opts = dataclasses.replace(opts, swap_waits=None)
        return (type(ref).__name__, repr(opts), ref.mode,
                tl.state.pol.tobytes(), tl.state.w_b.tobytes(), tl.state.floor.tobytes(), tl.state.wait.tobytes(),
                tuple(sorted(tl.state.t_until.items())), tuple(sorted(tl.state.w_early.items())))

    def _near_bound(self, refs: list[Refiner], snaps: list[Snapshot | None], cands: list[_Candidate], budget: int,
                    realized: dict) -> float | None:
        """The cheapest simulated plan of ``cands`` (:meth:`_cheapest`, its
        plans kept in ``realized``) adds at most ``1 + added_gap_tol`` times
        the least added time the cut bound at ``budget`` leaves
        (:func:`~libra_opt.passes.cut_bounds.cut_lower_bound`: of plans
        without swaps in recompute-only mode, of every plan otherwise, minus
        the no-remat compute time): no exchange move can save more than that
        share of it.  Returns that least added time (s) where it is so;
        ``None`` where it is not, with ``added_gap_tol`` 0 or no such plan."""
        from libra_opt.passes.cut_bounds import cut_lower_bound

        tol = self.options.added_gap_tol
        if tol <= 0:
            return None
        best = self._cheapest(refs, snaps, cands, budget, realized=realized)
        if best is None:
            return None
        problem, sim = refs[0].problem, best.plan.simulation
        no_remat_s = sim.time_s - sim.added_s
        bound_added = cut_lower_bound(problem, budget, swaps=self.options.policy != "recompute",
                                      max_candidates=self.NEAR_CANDIDATES).time_s - no_remat_s
        if not math.isfinite(bound_added) or sim.added_s > bound_added * (1 + tol):
            return None   # (an infinite bound under a plan that fits would be the bound's error, not a reason)
        log.debug("libra: a plan adds %.6g s, within %g of the cut bound's %.6g s: no exchange moves",
                  sim.added_s, tol, bound_added)
        return float(bound_added)

    @staticmethod
    def _cheapest(refs: list[Refiner], snaps: list[Snapshot | None], cands: list[_Candidate], budget: int,
                  below: float = math.inf, realized: dict | None = None) -> _Found | None:
        """Lower and simulate ``cands``,
        cheapest estimate first, until one's estimate is no better than the
        cheapest simulated plan within ``budget`` or than ``below`` (seconds)
        (and is not pessimistic).  The cheapest simulated plan, or ``None``.
        ``realized``: id of a prepared plan -> its realized plan (``None``
        where it does not lower within the budget), filled and read so that
        a plan is lowered once per call of :meth:`_finished`."""
        best = None
        for est, k, prepared, tag in sorted(cands, key=lambda c: (c.estimate, c.descent)):
            top = min(below, best.plan.simulation.added_s) if best is not None else below
            if est >= top and not prepared.timeline.state.swap.pessimistic:
                break   # its estimate is not pessimistic and already no better than a simulated plan
            if realized is not None and id(prepared) in realized:
                plan = realized[id(prepared)]
            else:
                plan = refs[k].realize(prepared, snaps[k], budget)
                if realized is not None:
                    realized[id(prepared)] = plan
            if plan is None:
                continue
            if best is None or plan.simulation.added_s < best.plan.simulation.added_s:
                best = _Found(plan, k, tag)
        return best

    def _switched(self, refs: list[Refiner], cands: list[_Candidate], budget: int) -> list[_Candidate]:
        """Policy switches (:func:`~libra_opt.solvers.libra.switch.switch_policies`)
        on the cheapest estimated plan of each descent among ``cands``, at most
        :attr:`SWITCH_PLANS` of them, those with the fewest swaps first (the
        switches gain most where the copy queues are idle, and cost least:
        a swap moved re-replays the chains that read other swaps); a plan
        with swaps only where its estimate is within :attr:`SWITCH_SPAN` of
        the cheapest plan so far.  Returns the switched plans, as candidates
        tagged ``"+switch"`` (:meth:`_libra_plan` lowers and simulates those
        estimated cheaper than the descents' simulated plan)."""
        first: dict[int, tuple] = {}
        shared: set[int] = set()   # prepared plans two descents share (_state_key): switched once
        for c in sorted(cands, key=lambda c: (c.estimate, c.descent)):
            if c.descent not in first and id(c.prepared) not in shared:
                first[c.descent] = c
                shared.add(id(c.prepared))
        plans = [(int((c.prepared.timeline.state.pol == SWAP).sum()), c) for c in first.values()]
        plans.sort(key=lambda x: (x[0], x[1].estimate, x[1].descent))
        out, cheapest = [], math.inf
        for swaps, (est, k, prepared, _) in plans[:self.SWITCH_PLANS]:
            if swaps and est > cheapest * (1 + self.SWITCH_SPAN):
                continue
            tl, records, taken = switch_policies(refs[k], prepared.timeline, prepared.records, budget)
            cheapest = min(cheapest, est)
            if taken:
                out.append(_Candidate(tl.added_s(), k, Prepared(tl, records, prepared.undone), "+switch"))
                cheapest = min(cheapest, tl.added_s())
        return out

    def _baseline_raw(self, name: str, plan: BaselinePlan) -> RawSolution:
        """A baseline's plan as this solver's result (``extras["descent"]`` is the baseline's name)."""
        sim = plan.simulation
        extras = dict(decisions=[], retained=[], estimated_peak_bytes=int(sim.peak_bytes),
                      estimated_added_s=float(sim.added_s), steps=0, undone=0, repairs=0,
                      policy=self.options.policy, descent=name, baseline=dict(plan.extras))
        sched = plan.schedule.with_meta(dict(plan.schedule.meta, solver=self.name))
        sched.meta["libra"] = dict(policy=self.options.policy, descent=name, decisions=[])
        return RawSolution(schedule=sched, status=FEASIBLE, message=f"the {name} baseline's plan: {plan.message}",
                           extras=extras, simulation=sim)

    def _raw(self, plan: FinishedPlan, descent: str, near: float | None = None) -> RawSolution:
        """The finished plan as this solver's result; ``near``: see
        :class:`_Found` (``extras["near_cut_bound"]``)."""
        decisions = [d.to_dict() for d in sorted(plan.records.values(), key=lambda d: (d.step < 0, d.step))]
        est_peak = plan.timeline.peak()[0]
        tensors = plan.timeline.problem.tensors
        retained = [dict(tensor=r.tensor, name=tensors[r.tensor].name, until=r.until,
                         nbytes=int(tensors[tensors[r.tensor].storage].nbytes)) for r in plan.timeline.retentions()]
        swapped = [dict(tensor=r.tensor, name=tensors[r.tensor].name, until=r.until,
                        nbytes=int(tensors[r.tensor].nbytes), prefetch_after=r.prefetch_after)
                   for r in plan.swap_retained]
        extras = dict(decisions=decisions, retained=retained, swap_retained=swapped, estimated_peak_bytes=int(est_peak),
                      estimated_added_s=float(plan.timeline.added_s()), steps=plan.snapshot.step,
                      undone=plan.undone, repairs=plan.repairs, policy=self.options.policy, descent=descent)
        if near is not None:   # exchange moves left out: the plan is within added_gap_tol of this
            extras["near_cut_bound"] = dict(bound_added_s=near, added_gap_tol=float(self.options.added_gap_tol))
        sched = plan.schedule
        sched.meta["solver"] = self.name
        sched.meta["libra"] = dict(policy=self.options.policy, descent=descent, decisions=decisions)
        status = TIME_LIMIT if plan.snapshot.cut_short and self.options.time_limit_s is not None else FEASIBLE
        msg = (f"{len(decisions)} evictions after {plan.snapshot.step} refinement steps "
               f"({plan.undone} undone, {plan.repairs} repairs)")
        if near is not None:
            msg += (f"; no exchange moves: it adds at most {1 + self.options.added_gap_tol:g}x the least added time "
                    f"the cut bound allows, {near:.6g} s (added_gap_tol)")
        return RawSolution(schedule=sched, status=status, message=msg, extras=extras, simulation=plan.simulation)

    def solve_many(self, problem: RematProblem, budgets: Sequence, *, raise_on_infeasible: bool = False
                   ) -> list[SolveResult]:
        """One result per budget, in the order given, from **one** descent: the
        decision set is recorded when the peak first drops under each budget,
        and finished exactly as :meth:`solve` would (equal results), except
        that the sweep is monotone in cost: where a lower budget's plan is
        cheaper, it is returned for the higher budget too (it fits;
        ``extras["from_budget_bytes"]`` says where it was planned).

        Parameters
        ----------
        problem : RematProblem
        budgets : sequence of int or float or str
            As for :meth:`solve` (bytes, ``"12GiB"``, ``"60%"``, fractions).
        raise_on_infeasible : bool
            Raise :class:`~libra_opt.errors.InfeasibleBudgetError` on the first
            infeasible budget instead of returning an ``"infeasible"`` result.

        Returns
        -------
        list of SolveResult
        """
        self._check_available()
        ref_peak = no_remat_peak(problem)
        bb = [parse_budget(b, ref_peak) for b in budgets]
        with self.internal_errors(problem):
            return _paused(self._solve_many, problem, bb, raise_on_infeasible)

    def _solve_many(self, problem: RematProblem, bb: list[int], raise_on_infeasible: bool) -> list[SolveResult]:
        if not problem.num_nodes:
            return [self._finish(problem, b, self._empty_plan(problem), 0.0) for b in bb]
        refs = self._rewindable(problem, self._refiners(problem))
        aim = [b for b in bb if not self._under_floor(problem, b)]   # (the others: no plan fits, _below_floor)
        free: dict = {}
        snaps = self._descend_all(refs, aim, free=free)
        base = (list(refs), list(snaps))
        more, more_snaps = self._fallbacks(problem, refs, aim, snaps)   # (a free budget has a snapshot: not missed)
        ran = (base[0], list(more))   # rewound by the tightening (_first_planned)
        refs, snaps = refs + more, snaps + more_snaps
        main, main_snaps = self._without_continued(refs, snaps)
        spent = [ref.clock_s() for ref in refs]
        pool = self._pool(problem)
        out, missed, stalling = [], [], []
        for b in bb:
            t1 = time.perf_counter()
            these = [s.get(b) for s in snaps]
            below = self._below_floor(problem, b, pool)
            if below is not None:   # no plan fits: the tightening below states the smallest budget met
                if raise_on_infeasible:
                    raise self._tightened(problem, below, pool, *ran) from None
                missed.append((len(out), below, time.perf_counter() - t1))
                out.append(None)
                continue
            # this budget's own time: each descent's clock when it first got under b (all of it
            # where it was asked for b and never got there), then b's own finishing below
            base_s = sum(snap.elapsed_s if snap is not None else (spent[k] if ref.asked is None or b in ref.asked else 0.0)
                         for k, (ref, snap) in enumerate(zip(refs, these)))
            if b in free:   # the first descent's plan adds no time (_free_plans)
                raw, free_s = free[b]
                out.append(self._finish(problem, b, raw, base_s + free_s))
                continue
            done: dict = {}   # this budget's finished plans, shared with _stall_basis
            try:
                raw = self._planned(problem, refs, snaps, b, pool, done=done)
            except InfeasibleBudgetError as e:
                if raise_on_infeasible:
                    raise self._tightened(problem, e, pool, *ran) from None
                missed.append((len(out), _no_cycle(e), base_s + time.perf_counter() - t1))
                out.append(None)
                continue
            own = base_s + time.perf_counter() - t1
            basis = self._stall_basis(problem, main, main_snaps, b, raw, pool, done)
            if basis is not None and self._stalling(problem, main, [s.get(b) for s in main_snaps], basis):
                stalling.append((len(out), b, raw, basis, own))   # finished below, with the plan that wins there
                out.append(None)
                continue
            out.append(self._finish(problem, b, raw, own))
        if stalling:   # one hybrid descent that waits, for every budget whose plan stalls (as single solves)
            better = self._less_stalling(problem, main, {b: basis for _, b, _, basis, _ in stalling})
            for i, b, raw, _, own in stalling:
                alt, extra_s = better.get(b, (None, 0.0))
                if alt is not None and alt.simulation.added_s < raw.simulation.added_s:
                    raw = alt
                out[i] = self._finish(problem, b, raw, own + extra_s)
        if missed and problem.num_nodes <= self.POOL_MAX_NODES:
            missed = self._forced(problem, base, bb, missed, out, pool)
        if missed:   # one tightening for the sweep, from its highest infeasible budget
            t1 = time.perf_counter()
            top = max(missed, key=lambda m: m[1].budget_bytes)
            tight = self._tightened(problem, top[1], pool, *ran)
            extra_s = time.perf_counter() - t1
            for i, e, s in missed:
                if tight is not top[1]:
                    e = InfeasibleBudgetError(e.budget_bytes, tight.min_feasible_bytes, self.name, self._tight_detail)
                out[i] = self._infeasible(e.budget_bytes, e, s + (extra_s if e.budget_bytes == top[1].budget_bytes else 0.0))
        return self._monotone(problem, out)

    def _forced(self, problem: RematProblem, base: tuple, bb: list[int], missed: list, out: list,
                pool: _BaselinePool | None) -> list:
        """As a single solve does (:meth:`_solve_at`): for the budgets of a
        sweep the descents reached in their estimate but no plan lowered
        within, the fallback descents too (forced), from the first descents
        alone; fills ``out`` where a plan is found and returns the budgets
        still missed."""
        refs, snaps = base
        todo = [(i, e, s) for i, e, s in missed
                if any(sn.get(bb[i]) is not None for sn in snaps) and not self._under_floor(problem, bb[i])]
        if not todo:
            return missed
        t0 = time.perf_counter()
        more, more_snaps = self._fallbacks(problem, refs, [bb[i] for i, _, _ in todo], snaps, force=True)
        if not more:
            return missed
        refs, snaps = refs + more, snaps + more_snaps
        extra = (time.perf_counter() - t0) / len(todo)
        still = [m for m in missed if m not in todo]
        for i, e, s in todo:
            b, t1 = bb[i], time.perf_counter()
            try:
                raw = self._planned(problem, refs, snaps, b, pool)
            except InfeasibleBudgetError as e2:
                still.append((i, _no_cycle(e2), s + extra + time.perf_counter() - t1))
                continue
            out[i] = self._finish(problem, b, raw, s + extra + time.perf_counter() - t1)
        return sorted(still, key=lambda m: m[0])

    def _monotone(self, problem: RematProblem, results: list[SolveResult]) -> list[SolveResult]:
        """Make the sweep monotone in cost: a plan for a lower budget fits every
        higher one, so where the plan found for a budget costs more (simulated
        added time) than one found for a lower budget, the cheaper plan is
        returned for it too, re-simulated against the higher budget
        (``extras["from_budget_bytes"]`` names the budget it was planned for).
        A budget left without a plan of its own gets a lower budget's plan the
        same way.  A cumulative minimum over the budgets from low to high."""
        best = None
        out = list(results)
        for i in sorted(range(len(out)), key=lambda k: out[k].budget_bytes):
            r = out[i]
            if best is None or (r.schedule is not None and r.added_s <= best.added_s):
                if r.schedule is not None:
                    best = r
                continue
            sched = best.schedule.with_meta(dict(best.schedule.meta, budget_bytes=int(r.budget_bytes)))
            sim = simulate(problem, sched, budget=r.budget_bytes)
            extras = dict(best.extras, from_budget_bytes=int(best.budget_bytes))
            out[i] = dataclasses.replace(best, schedule=sched, budget_bytes=r.budget_bytes, simulation=sim,
                                         peak_bytes=sim.peak_bytes, time_s=sim.time_s, added_s=sim.added_s,
                                         solve_s=r.solve_s, extras=extras,
                                         message=f"{best.message}; the plan found for the lower budget of "
                                                 f"{best.budget_bytes} bytes ("
                                                 + ("cheaper than this budget's own)" if r.schedule is not None
                                                    else "this budget's own descent found none)"))
        return out


__all__ = ["LibraSolver", "LibraOptions"]
