"""The ``libra`` solver's swapped chain inputs (``solvers/libra/swap_inputs.py``):
recomputation chains cut by swapped retentions, judged by the simulator."""
from __future__ import annotations

import pytest

from libra_opt.generators import random_layered_graph
from libra_opt.passes.lowering import Eviction, Policy, lower
from libra_opt.passes.simulator import no_remat_peak, simulate
from libra_opt.solvers import solve
from libra_opt.solvers.libra.swap_inputs import chains, cuts, swap_chain_inputs

from _chain_problems import input_of_a_recomputation
from _devices import with_bandwidth


def test_chains_and_cuts_read_off_a_schedule():
    p, a, m = input_of_a_recomputation()
    sched = lower(p, [Eviction(m, 2, 4, Policy.RECOMPUTE)])
    (ch,) = chains(p, sched)
    assert ch.before == 4 and ch.nodes == (0, 1)
    assert ch.time_s == pytest.approx(sum(p.tables.n_rtime[x] for x in (0, 1)))
    assert cuts(p, ch, retained=set()) == [(a,)]     # fm reads a, which fa (below it) made
    assert cuts(p, ch, retained={a}) == []           # a tensor the plan retains already is not cut


def test_the_pass_cuts_a_chain_within_the_budget():
    p, a, m = input_of_a_recomputation()
    items = [Eviction(m, 2, 4, Policy.RECOMPUTE)]
    sched = lower(p, items)
    sim = simulate(p, sched)
    got = swap_chain_inputs(p, items, sched, sim, budget=int(sim.peak_bytes))
    assert [(r.tensor, r.until, r.swap) for r in got.taken] == [(a, 4, True)]
    assert got.simulation.recompute_s == 1.0 < sim.recompute_s == 2.0
    assert got.simulation.peak_bytes <= sim.peak_bytes
    assert simulate(p, lower(p, got.items)).added_s == got.simulation.added_s
    # a device without copies: nothing is tried
    none = swap_chain_inputs(p.with_device(h2d_bytes_per_s=0.0, d2h_bytes_per_s=0.0), items, sched, sim,
                             budget=int(sim.peak_bytes))
    assert none.taken == () and none.schedule is sched


def _cell(seed, copy_steps, fraction):
    p = with_bandwidth(random_layered_graph(30, seed=seed), copy_steps)
    return p, int(fraction * no_remat_peak(p))


def test_libra_hybrid_swaps_the_inputs_of_a_costly_chain():
    """random_layered_graph(30, seed=1), copies as fast as compute, 0.8 of the peak: the descents
    regenerate nodes 8 and 20 by chains from the graph's start; the optimum of the hybrid MILP reads
    their inputs back from the host instead (benchmarks/hybrid_optimality.py --generate 30 --seeds 1)."""
    p, budget = _cell(1, 1.0, 0.8)
    on = solve(p, budget, "libra", policy="hybrid")
    off = solve(p, budget, "libra", policy="hybrid", swap_inputs=False)
    sim = simulate(p, on.schedule)
    assert sim.peak_bytes <= budget and sim.time_s == pytest.approx(on.time_s)
    assert on.time_s < off.time_s
    swapped = on.extras["swap_retained"]
    assert swapped and on.extras["descent"].endswith("+swapped inputs")
    assert on.schedule.meta["swap_retained"] == [[r["tensor"], r["until"]] for r in swapped]
    assert not off.extras["swap_retained"] and "swap_retained" not in off.schedule.meta
    for r in swapped:   # each swapped tensor is copied out once and back in for the chain before "until"
        ops = [i.op.name for i in on.schedule if i.arg == r["tensor"] and i.op.name in ("SWAP_OUT", "SWAP_IN")]
        assert ops.count("SWAP_OUT") == 1 and "SWAP_IN" in ops
    # the recompute-only descents plan no swap, so no swapped input either
    rec = solve(p, budget, "libra", policy="recompute")
    assert "swap_retained" not in rec.schedule.meta


@pytest.mark.parametrize("seed", [0, 2, 3])
@pytest.mark.parametrize("copy_steps", [1.0, 4.0])
def test_swapped_inputs_never_cost_time_or_break_the_budget(seed, copy_steps):
    for fraction in (0.9, 0.7):
        p, budget = _cell(seed, copy_steps, fraction)
        try:
            off = solve(p, budget, "libra", policy="hybrid", swap_inputs=False)
        except Exception as e:   # an infeasible budget is infeasible either way
            with pytest.raises(type(e)):
                solve(p, budget, "libra", policy="hybrid")
            continue
        on = solve(p, budget, "libra", policy="hybrid")
        assert simulate(p, on.schedule).peak_bytes <= budget
        assert on.time_s <= off.time_s
        assert solve(p, budget, "libra", policy="hybrid").schedule.instructions == on.schedule.instructions
