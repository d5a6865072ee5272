"""Ordered cut bounds (libra_opt.passes.order_bounds): lower bounds on the step time of the plans that
compute every node for the first time in the node order, with the inputs a chain of recomputations
needs.  They hold for every such plan any built-in solver makes, are at least the order-free cut bounds,
are raised by the chains on random layered graphs, and are applied only to plans in that order."""
from __future__ import annotations

import warnings

import pytest

from libra_opt.apps.fuzz import random_budget, random_problem
from libra_opt.frontend import generators as G
from libra_opt.ir.schedule import Op, Schedule
from libra_opt.passes import cut_bounds as C
from libra_opt.passes import order_bounds as O
from libra_opt.passes.simulator import no_remat_peak
from libra_opt.solvers import solve
from libra_opt.solvers.certificates import HYBRID, InvalidBoundWarning, best_bound, cut_bounds, plan_class
from test_cut_bounds import SOLVERS, with_copies   # every non-exact solver; a problem with copies of a speed


def problems(seed):
    """A fuzz problem and three generated graphs of the seed."""
    return [random_problem(seed), G.random_layered_graph(40 + seed % 3 * 20, seed=seed),
            G.large_beside_small_graph(30 + seed % 3 * 20, seed=seed), G.early_regeneration_graph(30, seed=seed)]


@pytest.mark.parametrize("seed", range(6))
def test_every_plan_in_order_of_every_solver_is_at_or_above_the_ordered_bounds(seed):
    """No plan within a budget that computes nodes first in their order runs faster than the ordered
    bound of its class, with copies fast and slow, overlapping compute or not; the ordered bounds are at
    least the order-free ones."""
    checked = 0
    for base in problems(seed):
        peak = no_remat_peak(base)
        for spb, overlap in ((0.05 * base.total_compute_s / peak, True), (2.0 * base.total_compute_s / peak,
                                                                          seed % 2 == 0)):
            p = with_copies(base, max(spb, 1e-12), overlap)
            for budget in sorted({random_budget(p, seed), int(0.8 * peak), int(0.6 * peak)}):
                hyb, rec = O.ordered_cut_bound(p, budget), O.ordered_cut_bound(p, budget, swaps=False)
                assert hyb.time_s <= rec.time_s
                assert hyb.time_s >= C.cut_lower_bound(p, budget).time_s * (1 - 1e-6)
                for name, opts in SOLVERS:
                    r = solve(p, budget, name, raise_on_infeasible=False, **opts)
                    if not r.success:
                        continue
                    assert O.first_computes_in_order(p, r.schedule), (name, opts)
                    checked += 1
                    bound = hyb.time_s if plan_class(r.schedule) == HYBRID else rec.time_s
                    assert r.time_s >= bound * (1 - 1e-9), (name, opts, budget, r.time_s, hyb, rec)
    assert checked


def test_chains_raise_the_bound_on_a_random_layered_graph():
    """On random layered graphs (long skip connections) a recomputed node's inputs are often dead at the
    cut: the ordered bound is above the order-free one, and libra's recompute-only plan is still above
    it; its certificate then names the ordered bound."""
    raised = 0
    for seed in range(4):
        p = G.random_layered_graph(60, seed=seed)
        budget = int(0.75 * no_remat_peak(p))
        ordered, plain = O.ordered_cut_bound(p, budget, swaps=False), C.cut_lower_bound(p, budget, swaps=False)
        assert ordered.time_s >= plain.time_s
        r = solve(p, budget, "libra", policy="recompute", raise_on_infeasible=False)
        if not r.success:
            continue
        assert r.time_s >= ordered.time_s * (1 - 1e-9)
        if ordered.time_s > plain.time_s * (1 + 1e-6):
            raised += 1
            bounds = cut_bounds(p, budget)
            with warnings.catch_warnings():
                warnings.simplefilter("error", InvalidBoundWarning)
                cert = best_bound(p, budget, r.schedule, bounds)
            assert cert.bound.source.startswith("ordered cut bound") and cert.lower_bound_s == ordered.time_s
    assert raised


def test_a_plan_out_of_order_gets_no_ordered_bound():
    """The ordered bounds' ``covers`` test: a schedule that computes two independent nodes first in the
    other order is not in order, and the certificate falls back to the order-free bounds for it."""
    p = G.random_layered_graph(60, seed=0)
    budget = int(0.75 * no_remat_peak(p))
    r = solve(p, budget, "libra", policy="recompute")
    bounds = cut_bounds(p, budget)
    ordered = [b for b in bounds if b.covers is not None]
    assert ordered and all(b.covers(r.schedule) for b in ordered)
    # swap the first computes of two nodes, the later one not reading the earlier one
    first = {}
    for k, ins in enumerate(r.schedule.instructions):
        if ins.op == Op.COMPUTE and ins.arg not in first:
            first[ins.arg] = k
    ins = list(r.schedule.instructions)
    deps = {u for t in p.nodes[2].inputs for u in [p.tensors[t].producer] if u is not None}
    assert 1 not in deps   # node 2 does not read node 1: computing it first is a valid order
    ins[first[1]], ins[first[2]] = ins[first[2]], ins[first[1]]
    swapped = Schedule.of(ins)
    assert not O.first_computes_in_order(p, swapped)
    assert not any(b.covers(swapped) for b in ordered)
    assert O.first_computes_in_order(p, r.schedule)


def test_bad_arguments_are_refused():
    p = G.random_layered_graph(20, seed=0)
    with pytest.raises(ValueError, match="non-negative"):
        O.ordered_cut_bound(p, -1)
    with pytest.raises(ValueError, match="at least one cut node"):
        O.ordered_cut_bound(p, 10, max_candidates=0)


def test_over_max_nodes_the_ordered_bound_is_the_floor(monkeypatch):
    p = G.random_layered_graph(40, seed=0)
    monkeypatch.setattr(O, "MAX_NODES", 5)
    b = O.ordered_cut_bound(p, int(0.7 * no_remat_peak(p)), swaps=False)
    assert b.time_s == b.floor_s and b.node is None
