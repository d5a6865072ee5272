"""The libra greedy on small fuzzed training steps where it stated a budget
infeasible, or planned 10x the recompute optimum, although Checkmate's MILP
plans it (issue 16): a storage freed and regenerated between two backward uses
(outside the default eviction windows), and a view of an input kept resident
for a chain (it holds no memory of its own)."""
from __future__ import annotations

import pytest

from libra_opt.apps.fuzz import random_problem
from libra_opt.passes.simulator import simulate
from libra_opt.solvers import solve

pytest.importorskip("ortools")

RATIO = 1.05


def _optimum(p, frac):
    m = solve(p, frac, "checkmate-milp", raise_on_infeasible=False, time_limit_s=20.0, threads=1)
    if m.status != "optimal":
        pytest.skip(f"checkmate-milp proved no optimum on {p.name} at {frac}")
    return m


def _assert_near(p, frac, **options):
    m = _optimum(p, frac)
    r = solve(p, frac, "libra", policy="recompute", raise_on_infeasible=False, **options)
    assert r.success, r.message
    sim = simulate(p, r.schedule, budget=r.budget_bytes)
    assert sim.peak_bytes <= r.budget_bytes
    assert sim.added_s == pytest.approx(r.added_s)
    assert r.added_s <= RATIO * m.added_s + 1e-12, (r.added_s, m.added_s)
    return r


def test_a_budget_met_only_by_a_window_inside_the_backward_phase_is_planned():
    """fuzz-1 at 0.9: the optimum frees the forward output ``t`` (and its views)
    between two backward uses and regenerates it; the default windows (last
    forward use to first backward use) hold no such gap, and libra stated the
    budget infeasible (the no-remat peak as its minimum)."""
    p = random_problem(1, max_forward=5)
    r = _assert_near(p, 0.9)
    assert any(d["after"] >= p.boundary for d in r.extras["decisions"])


def test_the_same_budget_is_met_by_hybrid_and_by_solve_many():
    """The fallback over every window serves hybrid mode and solve_many too."""
    p = random_problem(1, max_forward=5)
    _optimum(p, 0.9)
    h = solve(p, 0.9, "libra", raise_on_infeasible=False)
    assert h.success, h.message
    assert simulate(p, h.schedule).peak_bytes <= h.budget_bytes
    from libra_opt.solvers.registry import get_solver
    many = get_solver("libra", policy="recompute").solve_many(p, [0.9])
    assert many[0].success and many[0].added_s == pytest.approx(solve(p, 0.9, "libra", policy="recompute").added_s)


def test_a_view_of_an_input_is_kept_for_a_chain_at_no_memory_cost():
    """fuzz-4 at 0.9: the optimum recomputes ``mm_7`` alone, its inputs being views
    of the step's inputs (zero bytes, their storage resident all along); libra
    regenerated the views too, counting the input's bytes as held by keeping
    them (10x the optimum)."""
    p = random_problem(4, max_forward=5)
    r = _assert_near(p, 0.9)
    assert r.extras["retained"], r.extras
    assert all(x["nbytes"] == 0 or p.tensors[p.tensors[x["tensor"]].storage].kind != "activation"
               for x in r.extras["retained"])


def test_the_end_of_a_descent_fits_once_its_needless_decision_is_undone():
    """fuzz-41 (at most 5 forward ops) at 0.8: the descent ends 4% over the
    budget, with an eviction whose regeneration raised memory; the undo pass
    gives it back and the plan fits (it was stated infeasible)."""
    p = random_problem(41, max_forward=5)
    _assert_near(p, 0.8)


@pytest.mark.parametrize("seed,max_forward,frac", [(39, 5, 0.9), (51, 5, 0.9), (15, 8, 0.9), (40, 8, 0.8),
                                                   (51, 8, 0.7)])
def test_fuzzed_budgets_once_stated_infeasible_are_planned(seed, max_forward, frac):
    """More fuzzed steps libra stated infeasible at a budget the MILP plans
    (before the fixes above): planned, simulator-valid, and within 1.2x the
    optimum (fuzz-15 at 0.9 is 1.14x: not yet within the 1.05x target)."""
    p = random_problem(seed, max_forward=max_forward)
    m = _optimum(p, frac)
    r = solve(p, frac, "libra", policy="recompute", raise_on_infeasible=False)
    assert r.success, r.message
    assert simulate(p, r.schedule).peak_bytes <= r.budget_bytes
    assert r.added_s <= 1.2 * m.added_s + 1e-12, (r.added_s, m.added_s)
