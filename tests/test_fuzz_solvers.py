"""Every fast built-in solver on a few hundred seeded random problems
(:mod:`libra_opt.fuzz`): each returns a plan the simulator accepts within the
budget, or says the budget is infeasible; never an internal error.  The
10,000-case run is ``benchmarks/fuzz_solvers.py``."""
import logging

import pytest

from libra_opt.apps.fuzz import FAST_SOLVERS, INFEASIBLE, PLAN, random_budget, random_problem, check_case
from libra_opt.passes.lowering import default_windows
from libra_opt.ir.problem import RematProblem

SEEDS = range(400)


@pytest.fixture(scope="module")
def cases():
    logging.disable(logging.WARNING)
    try:
        out = []
        for seed in SEEDS:
            p = random_problem(seed)
            out.append((seed, p, random_budget(p, seed)))
        yield out
    finally:
        logging.disable(logging.NOTSET)


def test_generator_is_seeded_and_makes_the_features_it_promises(cases):
    a, b = random_problem(7), random_problem(7)
    assert [(n.name, n.inputs, n.outputs) for n in a.nodes] == [(n.name, n.inputs, n.outputs) for n in b.nodes]
    probs = [p for _, p, _ in cases]
    assert all(isinstance(p, RematProblem) for p in probs)
    targets = [n.target for p in probs for n in p.nodes]
    # two-output ops, views, two views of one base, non-recomputable ops feeding a view
    assert "aten.native_batch_norm" in targets and "aten.split" in targets
    assert any(not n.recomputable and any(p.tensors[u].is_view for u in p.tensors[n.outputs[0]].consumers
                                          for u in p.nodes[u].outputs)
               for p in probs for n in p.nodes if n.outputs and not n.recomputable)
    assert any(t.is_view and p.tensors[t.storage].kind == "input" for p in probs for t in p.tensors)
    assert any(len(v) >= 3 for p in probs for v in p.storage_views.values())
    sizes = [t.nbytes for p in probs for t in p.tensors]
    assert 0 in sizes and max(sizes) >= 1 << 36
    assert any(p.device.h2d_bytes_per_s < 55e6 for p in probs)
    assert any(not p.device.copies_overlap_compute for p in probs)
    assert any(p.num_nodes == 0 for p in probs)
    assert any(p.boundary == p.num_nodes and p.num_nodes for p in probs)
    assert sum(bool(default_windows(p)) for p in probs) > len(probs) // 2


@pytest.mark.parametrize("solver, options", FAST_SOLVERS, ids=[n + "-" + o.get("policy", "") for n, o in FAST_SOLVERS])
def test_solver_plans_or_says_infeasible_on_fuzzed_problems(cases, solver, options):
    bad = []
    plans = 0
    for seed, p, budget in cases:
        outcome, msg = check_case(p, budget, solver, **options)
        if outcome not in (PLAN, INFEASIBLE):
            bad.append(f"seed {seed}: {outcome}: {msg}")
        plans += outcome == PLAN
    assert not bad, "\n".join(bad[:5])
    assert plans >= len(cases) // 10   # the budgets are not all out of reach
