"""Tests of the windows searched around a MILP incumbent (``solvers/checkmate/neighbourhoods.py``)
and of ``hybrid-milp``'s use of them (``lns_share``).

A small random layered graph with copies as slow as compute, its hybrid
model built at a budget under its peak, started from libra's hybrid plan
mapped onto the model: every solution the windows return satisfies the
model, is no worse than the start, and lowers to a plan the simulator
accepts within the budget.
"""
from __future__ import annotations

import numpy as np
import pytest

from libra_opt.errors import SolverOptionError
from libra_opt.frontend.generators import random_layered_graph
from libra_opt.passes.simulator import no_remat_peak, simulate
from libra_opt.solvers import solve
from libra_opt.solvers.checkmate import neighbourhoods as nb
from libra_opt.solvers.checkmate.backends import MIPOptions
from libra_opt.solvers.checkmate.hybrid_model import HybridModel, hybrid_from_schedule
from libra_opt.solvers.checkmate.model import CheckmateGraph
from libra_opt.solvers.checkmate.plan import schedule_from_rs, solve_r_opt
from _devices import with_bandwidth
from test_hybrid_milp import check_plan


def test_window_starts_cover_every_position_half_a_width_apart():
    for n, width in ((10, 4), (11, 4), (30, 8), (5, 8), (8, 8)):
        starts = nb.window_starts(n, width)
        assert starts[0] == 0 and starts == sorted(set(starts))
        covered = set()
        for lo in starts:
            assert 0 <= lo and lo + min(width, n) <= n
            covered.update(range(lo, lo + width))
        assert covered >= set(range(n))
        assert all(b - a <= max(width // 2, 1) for a, b in zip(starts, starts[1:]))
    assert nb.window_starts(5, 8) == [0]


@pytest.fixture(scope="module")
def model_and_start():
    """A 20-node random layered graph, copies as slow as compute, at 0.9 of its peak: its hybrid
    model and libra's hybrid plan as a solution of it (a window finds a cheaper one)."""
    p = with_bandwidth(random_layered_graph(20, seed=2), 1.0)
    budget = int(0.9 * no_remat_peak(p))
    g = CheckmateGraph.from_problem(p)
    m = HybridModel(g, budget)
    lib = solve(p, budget, "libra", policy="hybrid")
    S, IN, A, B, OFF = hybrid_from_schedule(g, lib.schedule)
    R = solve_r_opt(g, S, arrived=A, present=B)
    fitted = m.fitted_assignment(R, S, IN, A, B, OFF)
    assert fitted is not None and m.satisfies(fitted[0])
    return p, g, m, budget, fitted[0]


def test_window_keys_name_the_stage_and_node_of_every_decision(model_and_start):
    _, g, m, _, _ = model_and_start
    keys = nb.window_keys(m)
    stages, nodes = keys["stages"], keys["nodes"]
    assert stages.shape == nodes.shape == (m.num_vars,)
    for t, i in zip(*np.nonzero(m.r_idx >= 0)):
        assert stages[m.r_idx[t, i]] == t and nodes[m.r_idx[t, i]] == i
    for idx in (m.s_idx, m.in_idx, m.a_idx, m.b_idx):
        for t, v in zip(*np.nonzero(idx >= 0)):
            assert stages[idx[t, v]] == t and nodes[idx[t, v]] == g.value_node[v]
    for v in np.flatnonzero(m.off_idx >= 0):
        assert stages[m.off_idx[v]] == -1 and nodes[m.off_idx[v]] == g.value_node[v]
    # continuous variables are never fixed
    assert (stages[~m.integer] == -1).all() and (nodes[~m.integer] == -1).all()


def test_windows_never_worsen_the_start_and_every_solution_is_a_plan(model_and_start):
    p, g, m, budget, x0 = model_and_start
    seen = []
    found = nb.search_windows(m, x0, MIPOptions(), seconds=30.0, on_improved=lambda x: seen.append(x.copy()),
                              width=8)
    start = float(m.obj @ x0)
    assert found.start_objective == pytest.approx(start)
    assert found.objective <= start
    assert found.objective == pytest.approx(float(m.obj @ found.x))
    assert found.windows >= 1 and found.improved == len(seen) == len(found.log)
    assert found.improved >= 1 and found.objective < start   # (8,227 -> 7,881 on this graph)
    objs = [after for *_, after in found.log]
    assert objs == sorted(objs, reverse=True)   # each taken window lowers the objective
    for x in [found.x, *seen]:
        assert m.satisfies(x, tol=1e-5)
        _, S, IN, A, B, OFF = m.decode_hybrid(x)
        R = solve_r_opt(g, S, arrived=A, present=B)
        sched = schedule_from_rs(g, R, S, swap_in=IN, arrive=A, swap_out=OFF, swap_now=B)
        sim = simulate(p, sched, budget)
        assert sim.peak_bytes <= budget
    summary = found.summary(m.time_scale)
    assert summary["windows"] == found.windows and summary["end_s"] <= summary["start_s"] * (1 + 1e-9)


def test_a_spent_budget_returns_the_start(model_and_start):
    """No second left: no window is solved and the start comes back unchanged."""
    _, _, m, _, x0 = model_and_start
    found = nb.search_windows(m, x0, MIPOptions(), seconds=0.0)
    assert found.windows == 0 and found.improved == 0 and np.array_equal(found.x, x0)


def test_hybrid_milp_with_windows_returns_a_plan_no_slower_than_without():
    """A 40-node graph with a short limit: the first full solve proves nothing, the windows run
    (``extras["lns"]``); the plan fits, its bound is below it, and it is no slower than libra's."""
    p = with_bandwidth(random_layered_graph(40, seed=1), 1.0)
    budget = int(0.7 * no_remat_peak(p))
    libra = solve(p, budget, "libra", policy="hybrid")
    r = solve(p, budget, "hybrid-milp", time_limit_s=8.0)
    check_plan(p, r)
    assert r.time_s <= libra.time_s * (1 + 1e-9)
    if r.extras.get("lns") is not None:   # (the first solve may prove the optimum on a fast machine)
        lns = r.extras["lns"]
        assert lns["end_s"] <= lns["start_s"] * (1 + 1e-9) and lns["windows"] >= 1
    off = solve(p, budget, "hybrid-milp", time_limit_s=8.0, lns_share=0.0)
    check_plan(p, off)
    assert "lns" not in off.extras


@pytest.mark.parametrize("share", [-0.1, 1.0, 2.0])
def test_lns_share_out_of_range_is_rejected(share):
    with pytest.raises(SolverOptionError, match="lns_share"):
        solve(random_layered_graph(6, seed=0), 0.7, "hybrid-milp", lns_share=share)
