"""A check shared by the libra tests: a sweep (``solve_many``) returns the plans single solves
return, budget by budget."""
from __future__ import annotations

from libra_opt.passes.simulator import simulate


def assert_sweep_equals_single_solves(problem, solver, fractions) -> list:
    """``solver.solve_many(problem, fractions)`` against ``solver.solve`` at each budget: the same
    status, schedule and decisions (or stated minimum), every plan accepted by the simulator within
    its budget at its reported peak.  Returns the sweep's results."""
    many = solver.solve_many(problem, fractions)
    for frac, r in zip(fractions, many):
        one = solver.solve(problem, frac, raise_on_infeasible=False)
        assert one.status == r.status
        if one.success:
            assert one.schedule == r.schedule
            assert one.extras["decisions"] == r.extras["decisions"]
            sim = simulate(problem, r.schedule, budget=r.budget_bytes)
            assert sim.peak_bytes == r.peak_bytes <= r.budget_bytes
        else:
            assert one.min_feasible_bytes == r.min_feasible_bytes
    return many
