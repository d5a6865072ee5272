"""The hybrid descent continued from the end of a recompute-only descent
(solvers/libra/continued.py, ``LibraSolver._continued``): just under the least memory
recomputation alone reaches, with copies slower than compute, the hybrid portfolio's descents
from the keep-everything plan swap most of what they evict; the continued descent keeps the
recompute-only plan and swaps on top of it.  Checked against the same solves without it
(``continue_recompute=False``), the simulator, and ``solve_many``."""
from __future__ import annotations

import pytest

from libra_opt.frontend import generators as G
from libra_opt.passes.simulator import no_remat_peak, simulate
from libra_opt.solvers import get_solver, solve
from libra_opt.solvers.libra.continued import ContinuedRefiner
from libra_opt.solvers.libra.refine import Refiner

from _devices import with_bandwidth
from _sweeps import assert_sweep_equals_single_solves


def _reach(p) -> int:
    """The least budget recompute-only mode plans (bytes): its stated minimum."""
    r = solve(p, 0.05, "libra", policy="recompute", raise_on_infeasible=False)
    assert not r.success
    return r.min_feasible_bytes


def _fits(p, r) -> None:
    sim = simulate(p, r.schedule, budget=r.budget_bytes)
    assert sim.peak_bytes <= r.budget_bytes
    assert sim.time_s == pytest.approx(r.time_s)


def test_a_continued_descent_starts_at_the_recompute_only_end():
    p = with_bandwidth(G.random_layered_graph(60, seed=0), 4.0)
    opts = get_solver("libra", policy="recompute").options
    src = Refiner(p, opts)
    assert src.descend([0]) == {}   # no plan fits 0 bytes: the descent runs to its end
    assert src.done and not src.cut_short
    end = src.final()
    ref = ContinuedRefiner(p, src)
    assert ref.opts.policy == "hybrid" and ref.allow_swap and ref.allow_rec
    assert ref.label == "hybrid-continued"
    assert (ref.tl.state.pol == end.timeline.state.pol).all()
    assert ref.records == end.records and ref.step == end.step and ref.evals == end.evals
    assert ref.tl.peak()[0] == end.peak_bytes
    ref.descend([0])
    # every move lowers the estimated peak: it ends at or under the recompute-only end, and its own
    # steps follow the source's
    assert ref.tl.peak()[0] <= end.peak_bytes
    assert ref.step >= end.step
    assert (src.tl.state.pol == end.timeline.state.pol).all()   # the source is not changed


def test_a_continued_descent_needs_a_finished_recompute_only_source():
    p = with_bandwidth(G.random_layered_graph(30, seed=1), 1.0)
    hybrid = Refiner(p, get_solver("libra").options)
    hybrid.descend([0])
    with pytest.raises(ValueError, match="recompute-only descent"):
        ContinuedRefiner(p, hybrid)
    fresh = Refiner(p, get_solver("libra", policy="recompute").options)
    with pytest.raises(ValueError, match="ran to its end"):
        ContinuedRefiner(p, fresh)


def test_just_under_the_recompute_reach_the_plan_keeps_recomputing():
    """``random_layered_graph(100, seed=0)`` with copies 4x slower than compute, 0.5% under the
    recompute-only reach: without the continued descent the solve's plan waits for copies out
    (1.5x the compute time; it swapped most of what it evicted, 3.8x, before the descents' estimate
    counted the bytes retained for a chain where a move is evaluated); with it the plan recomputes
    and swaps a little, at under 0.8 of that, within the budget."""
    p = with_bandwidth(G.random_layered_graph(100, seed=0), 4.0)
    budget = int(0.995 * _reach(p))
    on = solve(p, budget, "libra")
    _fits(p, on)
    assert on.extras["descent"].startswith("hybrid-continued")
    counts = on.schedule.counts()
    assert counts["swap_out"] > 0 and counts["compute"] > p.num_nodes
    off = solve(p, budget, "libra", continue_recompute=False)
    _fits(p, off)
    assert not off.extras["descent"].startswith("hybrid-continued")
    assert on.time_s < 0.8 * off.time_s, (on.time_s, off.time_s)


def test_where_a_descent_meets_the_budget_every_recompute_only_end_is_continued():
    """``random_layered_graph(100, seed=2)`` with copies as slow as compute, at 0.9 of its
    recompute-only reach: the hybrid descent continued from the lowest recompute-only end stops above
    the budget, the one from another end meets it cheaply (over 40% under the plan without them)."""
    p = with_bandwidth(G.random_layered_graph(100, seed=2), 1.0)
    budget = int(0.9 * _reach(p))
    on = solve(p, budget, "libra")
    off = solve(p, budget, "libra", continue_recompute=False)
    _fits(p, on)
    _fits(p, off)
    assert on.extras["descent"].startswith("hybrid-continued")
    assert on.time_s < 0.6 * off.time_s, (on.time_s, off.time_s)


@pytest.mark.parametrize("seed,copy_steps", [(0, 1.0), (1, 4.0), (2, 4.0), (3, 4.0)])
def test_never_costlier_than_without_it(seed, copy_steps):
    """Its plans are finished apart from the other descents' (``Refiner.apart``), so a hybrid solve
    is never costlier with it than without it, at budgets under the recompute-only reach."""
    p = with_bandwidth(G.random_layered_graph(100, seed=seed), copy_steps)
    reach = _reach(p)
    budgets = [int(f * reach) for f in (0.995, 0.97, 0.9)]
    on = [solve(p, b, "libra", raise_on_infeasible=False) for b in budgets]
    off = [solve(p, b, "libra", raise_on_infeasible=False, continue_recompute=False) for b in budgets]
    eps = 1e-9 * p.total_compute_s
    for a, b in zip(on, off):
        if b.success:
            assert a.success
            _fits(p, a)
            assert a.time_s <= b.time_s + eps, (a.budget_bytes, a.time_s, b.time_s)
        elif a.success:
            _fits(p, a)


def test_a_sweep_under_the_recompute_reach_equals_single_solves():
    """The continued descent starts where every recompute-only descent of the solve ended, in a
    sweep as in a single solve: the sweep's plans are the single solves'."""
    p = with_bandwidth(G.random_layered_graph(100, seed=0), 4.0)
    peak, reach = no_remat_peak(p), _reach(p)
    fractions = [min(1.02 * reach / peak, 0.99), 0.995 * reach / peak, 0.97 * reach / peak, 0.93 * reach / peak]
    many = assert_sweep_equals_single_solves(p, get_solver("libra"), fractions)
    assert any(r.success and r.extras["descent"].startswith("hybrid-continued") for r in many)
