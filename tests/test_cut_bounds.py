"""Cut bounds (libra_opt.passes.cut_bounds): lower bounds on the step time of every plan within a
budget, from the simulator's rules alone.  They hold for every plan any solver makes (generated
problems, every bandwidth, copies overlapping compute or not), rise as the budget falls, equal the
values worked out by hand on a chain, and let hybrid-milp stop before its MILP."""
from __future__ import annotations

import warnings

import pytest

from test_cli_compare import layered_chain  # 9 layers of 10 B, 19 nodes of 1 s: no-remat peak 91 B

from libra_opt.apps.fuzz import random_budget, random_problem
from libra_opt.passes import cut_bounds as C
from libra_opt.passes.bounds import memory_lower_bound
from libra_opt.passes.simulator import no_remat_peak
from libra_opt.solvers import solve
from libra_opt.solvers.certificates import (HYBRID, RECOMPUTE, InvalidBoundWarning, best_bound, compute_floor_s,
                                            cut_bounds, plan_class, with_cut_bounds)

SOLVERS = [("libra", {}), ("libra", dict(policy="recompute")), ("libra", dict(policy="swap")),
           ("checkpoint-all", {}), ("chen-sqrt", {}), ("chen-greedy", {}), ("swap-all", {})]


def with_copies(problem, seconds_per_byte: float, overlap: bool = True):
    """``problem`` with both copy directions taking ``seconds_per_byte`` per byte."""
    rate = 1.0 / seconds_per_byte
    return problem.with_device(h2d_bytes_per_s=rate, d2h_bytes_per_s=rate, copies_overlap_compute=overlap)


def test_the_chain_bounds_are_the_ones_worked_out_by_hand():
    """At 60 B the cut at the loss holds a1..a9 (90 B) and the loss (1 B): 31 B are off the device, and
    of a1..a8 (10 B, 1 s each) recomputing them costs 0.1 s a byte: 19 + 3.1 s for a plan without swaps.
    With copies of 1 s a byte each way, overlapping compute, swapping S bytes delays the backward
    by S - 9 s (the 9 s of forward before the loss): the least over S of max(22.1 - 0.1 S, 13.1 + 0.9 S,
    9 + S, 2 S) is 21.2 s (S = 9 B); with fast copies the cut costs nothing: the floor, 19 s."""
    p = layered_chain()
    assert compute_floor_s(p) == 19.0
    rec = C.cut_lower_bound(with_copies(p, 1.0), 60, swaps=False)
    assert rec.time_s == pytest.approx(22.1) and rec.excess_bytes == 31 and rec.floor_s == 19.0
    assert C.cut_lower_bound(with_copies(p, 1.0), 60).time_s == pytest.approx(21.2)
    assert C.cut_lower_bound(with_copies(p, 1e-6), 60).time_s == pytest.approx(19.0, abs=1e-3)
    # copies on the compute stream (a CPU): a swapped byte costs 2 s, recomputing it 0.1 s
    assert C.cut_lower_bound(with_copies(p, 1.0, overlap=False), 60).time_s == pytest.approx(22.1)
    # no cut is over the budget at the no-remat peak: the floor, at no node
    top = C.cut_lower_bound(p, no_remat_peak(p))
    assert top.time_s == 19.0 and top.node is None and top.excess_bytes == 0


@pytest.mark.parametrize("seed", range(12))
def test_every_plan_of_every_solver_is_at_or_above_the_bounds(seed):
    """No plan within a budget runs faster than the hybrid bound there, and no plan without swaps
    faster than the recompute-only bound, on generated problems with copies fast and slow, overlapping
    compute or not, at budgets from under the memory floor to the peak."""
    base = random_problem(seed, max_forward=6)
    peak = no_remat_peak(base)
    checked = 0
    for spb, overlap in ((peak and 0.05 * base.total_compute_s / peak, True),
                         (peak and 2.0 * base.total_compute_s / peak, seed % 2 == 0)):
        p = with_copies(base, max(spb, 1e-12), overlap)
        budgets = {random_budget(p, seed), random_budget(p, seed + 100), int(0.8 * peak)}
        # and the smallest budget libra plans where it plans none of those (tight budgets: where the bounds rise)
        budgets |= {r.min_feasible_bytes for r in (solve(p, b, "libra", raise_on_infeasible=False) for b in budgets)
                    if not r.success and r.min_feasible_bytes is not None}
        for budget in sorted(budgets):
            hyb, rec = C.cut_lower_bound(p, budget), C.cut_lower_bound(p, budget, swaps=False)
            assert hyb.floor_s <= hyb.time_s <= rec.time_s
            for name, opts in SOLVERS:
                r = solve(p, budget, name, raise_on_infeasible=False, **opts)
                if not r.success:
                    continue
                checked += 1
                bound = hyb.time_s if plan_class(r.schedule) == HYBRID else rec.time_s
                assert r.time_s >= bound * (1 - 1e-9), (name, opts, budget, r.time_s, hyb, rec)
    assert checked


def test_the_bounds_rise_as_the_budget_falls():
    p = with_copies(random_problem(3, max_forward=8), 1e-3)
    peak, floor = no_remat_peak(p), memory_lower_bound(p)
    budgets = [b for b in (peak, int(0.9 * peak), int(0.8 * peak), int(0.7 * peak), int(0.6 * peak)) if b >= floor]
    for swaps in (True, False):
        values = [C.cut_lower_bound(p, b, swaps).time_s for b in budgets]
        assert values == sorted(values)


def test_certificates_give_every_plan_a_gap_and_the_cli_prints_it(capsys, tmp_path):
    """``cut_bounds`` gives a hybrid bound at every budget (and a recompute one where higher):
    ``with_cut_bounds`` turns a libra plan without a bound into one with a gap; ``libra-opt solve``
    prints it."""
    from libra_opt.cli import main
    from libra_opt.ir.problem_io import save_problem

    p = with_copies(layered_chain(), 1.0)
    kinds = {b.kind: b for b in cut_bounds(p, 60)}
    assert set(kinds) == {HYBRID, RECOMPUTE} and kinds[RECOMPUTE].value_s > kinds[HYBRID].value_s
    assert "cut bound at" in kinds[HYBRID].source
    r = solve(p, 60, "libra")
    assert r.lower_bound_s is None
    c = with_cut_bounds(p, r)
    assert c.gap is not None and c.gap >= 0 and c.lower_bound_s <= c.time_s and c.bound_source.startswith("cut bound")
    with warnings.catch_warnings():
        warnings.simplefilter("error", InvalidBoundWarning)
        cert = best_bound(p, 60, r.schedule, c.bounds)
    assert cert.lower_bound_s == c.lower_bound_s
    path = tmp_path / "chain.json"
    save_problem(p, path)
    assert main(["solve", str(path), "--budget", "60B"]) == 0
    out = capsys.readouterr().out
    assert "bound:    step time >=" in out and "cut bound at" in out


def test_hybrid_milp_stops_before_the_milp_where_a_plan_meets_the_cut_bound():
    """Where a starting plan (libra's) is within mip_gap of the bounds of every plan, hybrid-milp
    returns it as optimal without building the MILP: the chain at 60 B with copies that cost nothing
    (swapping hides every byte, so the plan runs at the bound)."""
    p = with_copies(layered_chain(), 1e-6)
    r = solve(p, 60, "hybrid-milp", time_limit_s=30)
    assert r.status == "optimal" and "without the MILP" in r.message and "num_vars" not in r.extras
    assert r.time_s <= r.extras["cut_bound_s"] * (1 + 1e-4)


def test_a_negative_budget_is_refused():
    p = layered_chain()
    with pytest.raises(ValueError, match="non-negative"):
        C.cut_lower_bound(p, -1)


def test_over_max_nodes_the_bound_is_the_floor(monkeypatch):
    p = with_copies(layered_chain(), 1.0)
    monkeypatch.setattr(C, "MAX_NODES", 5)
    b = C.cut_lower_bound(p, 60, swaps=False)
    assert b.time_s == b.floor_s == 19.0 and b.node is None


def test_free_recomputes_are_taken_first_without_a_numeric_warning():
    """A producer that costs nothing to recompute frees its bytes first (the knapsack's ratio is
    infinite, not a division overflow), and the bound still holds for every solver's plan."""
    from libra_opt.ir.problem import BACKWARD, ProblemBuilder

    b = ProblemBuilder()
    acts = [b.input("x", 4)]
    for i in range(1, 7):
        acts += b.op(f"f{i}", [acts[-1]], [(f"a{i}", 10)], time_s=0.0 if i == 2 else 1.0)
    (grad,) = b.op("loss", [acts[-1]], [("L", 1)], time_s=1.0)
    for i in range(6, 0, -1):
        (grad,) = b.op(f"g{i}", [grad, acts[i - 1]], [(f"e{i}", 10 if i > 1 else 1)], time_s=1.0, phase=BACKWARD)
    p = with_copies(b.build(outputs=[grad], name="free-recompute"), 1.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        bounds = [C.cut_lower_bound(p, budget, swaps) for budget in (40, 50) for swaps in (True, False)]
    assert all(x.time_s >= x.floor_s for x in bounds)
    for budget in (40, 50):
        for name, opts in SOLVERS:
            r = solve(p, budget, name, raise_on_infeasible=False, **opts)
            if r.success:
                assert r.time_s >= C.cut_lower_bound(p, budget, plan_class(r.schedule) == HYBRID).time_s * (1 - 1e-9)


@pytest.mark.parametrize("seed", range(6))
def test_fewer_cut_nodes_give_a_weaker_valid_bound(seed):
    """``max_candidates``: the bound from the cut nodes of the largest no-remat memory only is at least
    the compute floor, at most the full bound, grows with the nodes tried, and is kept apart from it."""
    p = with_copies(random_problem(seed), 1e-3)
    peak, floor = no_remat_peak(p), memory_lower_bound(p)
    budget = max(floor, int(0.6 * peak))
    for swaps in (True, False):
        full = C.cut_lower_bound(p, budget, swaps)
        values = [C.cut_lower_bound(p, budget, swaps, max_candidates=k).time_s for k in (1, 4, 16)]
        assert full.floor_s <= values[0] <= values[1] <= values[2] <= full.time_s
        assert C.cut_lower_bound(p, budget, swaps) is full


def test_no_cut_node_tried_is_refused():
    with pytest.raises(ValueError, match="at least one cut node"):
        C.cut_lower_bound(layered_chain(), 60, max_candidates=0)
