"""Gap certificates (libra_opt.solvers.certificates): bounds are applied only to the plans they bound,
no gap is negative, a coarsened model's bound is no bound, and compare says "bound unknown"."""
from __future__ import annotations

import warnings

import pytest

from test_cli_compare import isolated_registry, layered_chain  # noqa: F401 (a fixture); chain: peak 91 B, 19 s

from libra_opt.apps.compare import UNBOUNDED_NOTE, compare, format_table
from libra_opt.apps.fuzz import random_budget, random_problem
from libra_opt.ir.problem import ProblemBuilder
from libra_opt.ir.schedule import Compute, Free, Schedule, no_remat_schedule
from libra_opt.passes.simulator import no_remat_peak, simulate
from libra_opt.solvers import RawSolution, Solver, get_solver, register_solver, registry, solve
from libra_opt.solvers.checkmate.bounds import checkmate_covers
from libra_opt.solvers.certificates import (HYBRID, RECOMPUTE, Bound, InvalidBoundWarning, best_bound,
                                            compute_floor_s, gap, plan_class)

FAST_MILP = dict(time_limit_s=10.0)
chain = layered_chain


def test_gap_definition():
    assert gap(12.0, 10.0) == pytest.approx(0.2)
    assert gap(10.0, 10.0 * (1 + 1e-9)) == 0.0          # within the tolerance: equal
    assert gap(10.0, None) is None and gap(10.0, 0.0) is None
    with pytest.raises(ValueError, match="above the plan's time"):
        gap(10.0, 11.0)


def test_bound_rejects_an_unknown_kind_and_a_non_finite_value():
    with pytest.raises(ValueError, match="kind"):
        Bound(1.0, "swap", "x", 10)
    with pytest.raises(ValueError, match="finite"):
        Bound(float("inf"), RECOMPUTE, "x", 10)


@pytest.mark.parametrize("seed", [1, 4, 5])
def test_gaps_are_never_negative_over_generated_problems_and_solvers(seed):
    p = random_problem(seed, max_forward=5)
    budgets = [random_budget(p, seed), 0.9]
    solvers = ["libra", "chen-greedy", "checkpoint-all", "swap-all", "none", "checkmate-lp", "checkmate-milp"]
    opts = {"checkmate-milp": FAST_MILP, "checkmate-lp": {"time_limit_s": 10.0}}
    with warnings.catch_warnings():
        warnings.simplefilter("error", InvalidBoundWarning)   # a bound above a plan it claims is a bug
        rows = compare(p, budgets, solvers, solver_options=opts, progress=False)
    assert any(r.gap is not None for r in rows)
    for r in rows:
        if r.gap is not None:
            assert r.gap >= 0 and r.time_s >= r.best_lower_bound_s * (1 - 1e-6)
            assert r.bound_kind in (RECOMPUTE, HYBRID) and r.bound_source
    # libra recompute-only too: its plans get recompute bounds when the model dominates them
    rec = get_solver("libra", policy="recompute")
    for b in budgets:
        res = rec.solve(p, b, raise_on_infeasible=False)
        if res.success:
            milp = solve(p, res.budget_bytes, solver="checkmate-milp", raise_on_infeasible=False, **FAST_MILP)
            cert = best_bound(p, res.budget_bytes, res.schedule, milp.bounds)
            assert cert.gap is None or cert.gap >= 0


def test_a_recompute_bound_is_not_applied_to_a_plan_with_swaps():
    p = chain()
    swap = solve(p, 60, solver="swap-all")
    assert plan_class(swap.schedule) == HYBRID
    milp = solve(p, 60, solver="checkmate-milp", **FAST_MILP)
    (mb,) = [b for b in milp.bounds if "MILP bound" in b.source]
    assert mb.kind == RECOMPUTE and mb.value_s > swap.time_s   # applied to the swap plan it would be negative
    rec = [b for b in milp.bounds if b.kind == RECOMPUTE]
    cert = best_bound(p, 60, swap.schedule, rec)
    assert cert.bound is None and cert.gap is None
    # with all of checkmate-milp's bounds it gets a hybrid one (a cut bound: every plan), never a recompute one
    cert = best_bound(p, 60, swap.schedule, milp.bounds)
    assert cert.kind == HYBRID and 0 <= cert.gap and cert.lower_bound_s <= swap.time_s
    # a hybrid bound of the same value is applied to it, and then it is a bug: warned about, not used
    hybrid = Bound(mb.value_s, HYBRID, "test", 60)
    with pytest.warns(InvalidBoundWarning, match="above the simulated time"):
        cert = best_bound(p, 60, swap.schedule, [hybrid])
    assert cert.bound is None and cert.invalid and cert.invalid[0][0] is hybrid
    # a valid hybrid bound (the compute floor) is applied to the swap plan
    cert = best_bound(p, 60, swap.schedule, [Bound(compute_floor_s(p), HYBRID, "floor", 60)])
    assert cert.kind == HYBRID and cert.gap == pytest.approx(0.0, abs=1e-9)


def test_a_bound_holds_only_within_its_budget():
    p = chain()
    plan = no_remat_schedule(p)                                  # peak 91 B
    b = Bound(compute_floor_s(p), HYBRID, "floor", 60)           # proven at 60 B: says nothing about 91 B plans
    assert best_bound(p, 91, plan, [b]).bound is None
    assert best_bound(p, 91, plan, [Bound(compute_floor_s(p), HYBRID, "floor", 91)]).gap == 0.0


def test_checkmate_bound_holds_only_for_plans_its_model_dominates():
    p = chain()
    milp = solve(p, 60, solver="checkmate-milp", **FAST_MILP)
    covers = milp.bounds[0].covers
    assert covers is not None and covers(milp.schedule)
    assert not covers(solve(p, 60, solver="swap-all").schedule)
    # first computations out of node order lie outside Checkmate's model: its bound says nothing there
    b = ProblemBuilder()
    x = b.input("x", 4)
    (u,) = b.op("u", [x], [("u", 8)], time_s=1.0)
    (v,) = b.op("v", [x], [("v", 8)], time_s=1.0)
    (w,) = b.op("w", [u, v], [("w", 8)], time_s=1.0)
    q = b.build(outputs=[w], name="fork")
    in_order = no_remat_schedule(q)
    swapped = Schedule([Compute(1), Compute(0), Compute(2), Free(u), Free(v)])
    assert simulate(q, swapped).time_s == simulate(q, in_order).time_s == 3.0
    test = checkmate_covers(_graph(q), no_remat_peak(q))
    assert test(in_order) and not test(swapped)
    assert best_bound(q, no_remat_peak(q), swapped, [Bound(3.0, RECOMPUTE, "checkmate", no_remat_peak(q),
                                                           test)]).bound is None


def _graph(p):
    from libra_opt.solvers.checkmate.model import CheckmateGraph

    return CheckmateGraph.from_problem(p, "tensor")


def test_a_coarsened_models_bound_is_not_a_bound_on_the_fine_problem():
    p = chain(n=30)
    budget = int(0.5 * no_remat_peak(p))
    for name in ("checkmate-milp", "checkmate-lp"):
        r = solve(p, budget, solver=name, max_nodes=12, time_limit_s=10.0)
        assert r.extras["coarsened"]
        # no bound of the coarse model; the cut bounds of the problem itself (no model) only
        assert r.bounds and all(b.source.startswith(("cut bound", "compute floor")) for b in r.bounds)
        assert r.bound_source.startswith(("cut bound", "compute floor")) and r.gap >= 0
        assert r.extras["coarse_bounds_s"] and "coarsened model" in r.extras["bound_note"]
        assert all(b.value_s <= v * (1 + 1e-9) for b in r.bounds for v in r.extras["coarse_bounds_s"].values())
    rows = compare(p, [budget], ["libra", "checkmate-milp"], solver_options={"checkmate-milp": dict(
        max_nodes=12, time_limit_s=10.0)}, progress=False, cut_bounds=False)
    solver_bounded = [r for r in rows if r.best_lower_bound_s is not None]
    assert all(r.bound_source.startswith(("cut bound", "compute floor")) for r in solver_bounded)


def test_compare_shows_bound_unknown_with_its_footnote():
    p = chain()
    rows = compare(p, [60], ["swap-all", "chen-sqrt", "checkmate-milp"], solver_options={
        "checkmate-milp": FAST_MILP}, progress=False)
    by = {r.solver: r for r in rows}
    assert by["swap-all"].bound_kind == HYBRID and by["swap-all"].gap >= 0       # a cut bound: every plan
    assert by["chen-sqrt"].bound_kind == RECOMPUTE and by["chen-sqrt"].gap > 0   # a recompute plan: bounded
    assert by["checkmate-milp"].gap == pytest.approx(0.0, abs=1e-6)
    # without the cut bounds, solvers that prove none leave their plans unbounded, with the footnote
    rows = compare(p, [60], ["swap-all", "chen-sqrt"], progress=False, cut_bounds=False)
    assert all(r.gap is None and r.bound_kind is None for r in rows)
    table = format_table(rows)
    lines = {line.split(" | ")[1]: line for line in table.splitlines() if line.startswith("| 66%")}
    assert "bound unknown *" in lines["swap-all"] and "bound unknown *" in lines["chen-sqrt"]
    assert UNBOUNDED_NOTE in table


def test_an_untagged_bound_is_used_only_with_the_solver_class_kind(isolated_registry, caplog):
    p = chain()

    class Untagged(Solver):
        name = "test-untagged"

        def _solve(self, problem, budget_bytes):
            return RawSolution(no_remat_schedule(problem), lower_bound_s=problem.total_compute_s)

    r = Untagged().solve(p, 1.0)
    assert r.lower_bound_s is None and r.gap is None and "without a plan class" in caplog.text

    class Tagged(Untagged):
        bound_kind = HYBRID

    r = Tagged().solve(p, 1.0)
    assert r.lower_bound_s == p.total_compute_s and r.bound_kind == HYBRID and r.gap == 0.0


def test_a_solver_bound_above_its_own_plan_is_warned_about_and_not_used(isolated_registry):
    p = chain()

    @register_solver("test-bad-bound")
    class BadBound(Solver):
        def _solve(self, problem, budget_bytes):
            return RawSolution(no_remat_schedule(problem),
                               bounds=(Bound(2 * problem.total_compute_s, RECOMPUTE, "bad", budget_bytes),))

    with pytest.warns(InvalidBoundWarning):
        r = solve(p, 1.0, solver="test-bad-bound")
    assert r.lower_bound_s is None and r.gap is None and r.extras["invalid_bounds"]


def test_compute_floor_skips_nodes_no_output_needs():
    b = ProblemBuilder()
    x = b.input("x", 4)
    (a,) = b.op("a", [x], [("a", 8)], time_s=2.0)
    b.op("dead", [x], [("d", 8)], time_s=5.0)
    (y,) = b.op("y", [a], [("y", 8)], time_s=1.0)
    p = b.build(outputs=[y], name="dead")
    assert compute_floor_s(p) == 3.0 < p.total_compute_s
    skip = Schedule([Compute(0), Compute(2), Free(p.nodes[0].outputs[0])])
    assert simulate(p, skip).time_s == 3.0   # the simulator accepts the plan without the dead node


def test_checkmate_model_is_no_relaxation_so_its_bound_skips_a_reordered_plan_that_beats_it():
    """Checkmate's model fixes the order of first computations.  Here computing b, c before a avoids
    holding a (10 B) next to b (10 B): no recompute at all, 8 s, where the model's optimum at 15 B
    recomputes a (13 s).  The MILP bound 13 s is no bound on that plan: it is not applied to it."""
    b = ProblemBuilder()
    x = b.input("x", 1)
    (a,) = b.op("a", [x], [("a", 10)], time_s=5.0)
    (y,) = b.op("b", [x], [("b", 10)], time_s=1.0)
    (c,) = b.op("c", [y], [("c", 1)], time_s=1.0)
    (d,) = b.op("d", [a, c], [("d", 1)], time_s=1.0)
    p = b.build(outputs=[d], name="reorder")
    milp = solve(p, 15, solver="checkmate-milp", **FAST_MILP)
    assert milp.status == "optimal" and milp.time_s == 13.0 and milp.gap == pytest.approx(0.0, abs=1e-6)
    reordered = Schedule([Compute(1), Compute(2), Free(y), Compute(0), Compute(3), Free(a), Free(c)])
    sim = simulate(p, reordered, budget=15)
    assert plan_class(reordered) == RECOMPUTE and sim.time_s == 8.0 < max(bd.value_s for bd in milp.bounds)
    with warnings.catch_warnings():
        warnings.simplefilter("error", InvalidBoundWarning)
        cert = best_bound(p, 15, reordered, milp.bounds, simulation=sim)
    # only a bound of every plan (the floor, a cut bound) applies to it, never the model's 13 s
    assert cert.bound is not None and cert.bound.source.startswith(("cut bound", "compute floor"))
    assert cert.lower_bound_s <= 8.0 and cert.gap >= 0


def test_model_covers_needs_a_point_within_budget_that_costs_no_more():
    from libra_opt.errors import SolverError
    from libra_opt.solvers.certificates import model_covers

    p = chain()
    plan = no_remat_schedule(p)                      # 19 s, peak 91 B
    calls = []

    def image(points):
        def f(schedule):
            calls.append(schedule)
            if points is None:
                raise SolverError("not in the model")
            return points
        return f

    assert model_covers(p, 91, image((19.0, 91)))(plan)
    assert not model_covers(p, 90, image((19.0, 91)))(plan)      # the model's point is over its budget
    assert not model_covers(p, 91, image((20.0, 80)))(plan)      # the model's point costs more
    assert not model_covers(p, 91, image(None))(plan)            # no point: not covered
    calls.clear()
    test = model_covers(p, 91, image((19.0, 91)))
    assert test(plan) and test(plan) and len(calls) == 1         # memoized per schedule
