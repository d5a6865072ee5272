"""The libra solver's policy switches (solvers/libra/switch.py): after the descent, swapped
windows move to recomputation and the most expensive recomputed ones to swaps that hide behind
compute, where the plan's estimated added time goes down within the budget; the solver keeps
the cheaper simulated plan.  Checked on small generated problems against the same solve without
the pass and against the single-policy modes, every plan simulated within its budget."""
from __future__ import annotations

from pathlib import Path

import pytest

from libra_opt.frontend import generators as G
from libra_opt.ir.problem_io import load_problem
from libra_opt.passes.lowering import lower
from libra_opt.passes.simulator import no_remat_peak, simulate
from libra_opt.solvers import solve
from libra_opt.solvers.libra import solver as libra_solver
from libra_opt.solvers.libra.estimate import REC, SWAP
from libra_opt.solvers.libra import switch as switch_mod
from libra_opt.solvers.libra.switch import REASON_POLICY_SWITCH, switch_policies

PROBLEMS = Path(__file__).resolve().parent.parent / "problems"


def _with_copies(p, copy_steps: float):
    """``p`` with copies that take ``copy_steps`` no-remat steps to move the no-remat peak."""
    bw = no_remat_peak(p) / (copy_steps * p.total_compute_s)
    return p.with_device(h2d_bytes_per_s=bw, d2h_bytes_per_s=bw)


def assert_fits(p, r):
    sim = simulate(p, r.schedule, budget=r.budget_bytes)
    assert sim.peak_bytes <= r.budget_bytes
    assert sim.added_s == pytest.approx(r.added_s)


def _eps(p) -> float:
    return 1e-9 * max(p.total_compute_s, 1.0)


@pytest.mark.parametrize("kind,n,seed,copy_steps,frac", [("large_beside_small_graph", 30, 0, 4.0, 0.8),
                                                         ("large_beside_small_graph", 30, 1, 4.0, 0.8),
                                                         ("early_regeneration_graph", 30, 0, 1.0, 0.6)])
def test_switches_lower_the_hybrid_cost(kind, n, seed, copy_steps, frac):
    """On these problems the descents' best plan recomputes storages a swap hidden behind
    compute regenerates for less: the switched plan is strictly cheaper (simulated) than the
    same solve without the pass, within the budget, and its decisions say which were switched."""
    p = _with_copies(getattr(G, kind)(n, seed=seed), copy_steps)
    off = solve(p, frac, "libra", switch=False)
    on = solve(p, frac, "libra")
    assert_fits(p, off)
    assert_fits(p, on)
    assert on.added_s < off.added_s - _eps(p), (on.added_s, off.added_s)
    assert on.extras["descent"].endswith("+switch")
    assert any(d["reason"] == REASON_POLICY_SWITCH for d in on.extras["decisions"])
    counts = on.schedule.counts()
    assert counts["swap_out"] > 0


def test_switch_pass_on_a_prepared_plan():
    """The pass itself: the recompute-only descent's prepared plan gets swaps, its estimate
    goes down, the estimated and simulated peaks stay within the budget, and its inputs are
    not changed."""
    p = _with_copies(G.large_beside_small_graph(30, seed=0), 4.0)
    budget = int(0.8 * no_remat_peak(p))
    solver = libra_solver.LibraSolver()
    refs = solver._refiners(p)
    ref = next(r for r in refs if r.opts.policy == "recompute")
    snap = ref.descend([budget])[budget]
    tl, records, _ = ref.prepare(snap, budget)
    pol, est = tl.state.pol.copy(), tl.added_s()
    before = dict(records)
    tl2, records2, taken = switch_policies(ref, tl, records, budget)
    assert taken > 0
    assert (tl.state.pol == pol).all() and tl.added_s() == est and records == before   # inputs unchanged
    assert tl2.added_s() < est
    assert int(tl2.memory().max()) <= budget
    assert (tl2.state.pol == SWAP).any() and not (tl.state.pol == SWAP).any()
    assert set(records2) == {int(j) for j in (tl2.state.pol != 0).nonzero()[0]}
    for j, d in records2.items():
        assert d.policy == ("swap" if tl2.state.pol[j] == SWAP else "recompute") and tl2.state.pol[j] in (REC, SWAP)
    sim = simulate(p, lower(p, tl2.plan()), budget=budget)
    assert sim.peak_bytes <= budget
    assert sim.added_s == pytest.approx(tl2.added_s(), rel=1e-6, abs=_eps(p))


def test_switch_pass_needs_the_budget_met():
    """A plan whose estimated peak is over the budget is returned as it is."""
    p = _with_copies(G.large_beside_small_graph(30, seed=0), 4.0)
    budget = int(0.8 * no_remat_peak(p))
    ref = libra_solver.LibraSolver()._refiners(p)[0]
    snap = ref.descend([budget])[budget]
    tl, records, _ = ref.prepare(snap, budget)
    out = switch_policies(ref, tl, records, int(tl.memory().max()) - 1)
    assert out[0] is tl and out[1] is records and out[2] == 0


@pytest.mark.parametrize("kind,n,seed,copy_steps", [("large_beside_small_graph", 30, 0, 4.0),
                                                    ("large_beside_small_graph", 30, 1, 1.0),
                                                    ("early_regeneration_graph", 30, 0, 1.0),
                                                    ("early_regeneration_graph", 30, 1, 1.0),
                                                    ("random_layered_graph", 40, 2, 0.25)])
def test_hybrid_never_above_either_single_policy(kind, n, seed, copy_steps):
    """Hybrid (with the switches) is never costlier than recompute-only or swap-only mode at a
    budget that mode meets, and its plan is simulated within the budget."""
    p = _with_copies(getattr(G, kind)(n, seed=seed), copy_steps)
    for frac in (0.8, 0.6, 0.5):
        singles = [solve(p, frac, "libra", policy=pol, raise_on_infeasible=False) for pol in ("recompute", "swap")]
        singles = [r for r in singles if r.success]
        if not singles:
            continue
        hyb = solve(p, frac, "libra", raise_on_infeasible=False)
        assert hyb.success, hyb.message
        assert_fits(p, hyb)
        for r in singles:
            assert hyb.added_s <= r.added_s + _eps(p), (frac, r.extras["policy"], hyb.added_s, r.added_s)


def test_switch_option_is_hybrid_only():
    """Single-policy modes never switch: their plans keep their one policy."""
    p = _with_copies(G.large_beside_small_graph(30, seed=0), 4.0)
    rec = solve(p, 0.8, "libra", policy="recompute")
    assert rec.schedule.counts()["swap_out"] == 0
    assert not any(d["reason"] == REASON_POLICY_SWITCH for d in rec.extras["decisions"])


def test_a_switch_over_the_budget_after_the_refresh_is_not_taken():
    """Switches are applied in place to the plan's private copy; one whose swap-layer refresh puts the
    peak over the budget is undone by rebuilding the plan from the switches taken before it. The plan
    that comes out equals the one where that switch was never proposed (its score refused), and the
    input plan is unchanged."""
    from libra_opt.solvers.libra import switch as switch_mod
    from libra_opt.solvers.libra.estimate import Timeline

    p = _with_copies(G.large_beside_small_graph(30, seed=0), 4.0)
    budget = int(0.8 * no_remat_peak(p))
    ref = next(r for r in libra_solver.LibraSolver()._refiners(p) if r.opts.policy == "recompute")
    snap = ref.descend([budget])[budget]
    tl, records, _ = ref.prepare(snap, budget)
    pol, est = tl.state.pol.copy(), tl.added_s()

    applied = []
    real_apply = Timeline.apply

    def recording_apply(self, j, policy, eff=None, refresh=True):
        applied.append((j, policy))
        return real_apply(self, j, policy, eff, refresh)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Timeline, "apply", recording_apply)
        _, _, taken = switch_policies(ref, tl, records, budget)
    swaps = [j for j, policy in applied if policy == SWAP]
    assert taken >= 2 and len(swaps) >= 2
    target = swaps[-1]   # a switch taken after others: undoing it replays them

    real_score = switch_mod._score

    def refused(t, j, policy, b):
        return None if (j, policy) == (target, SWAP) else real_score(t, j, policy, b)

    rejected = []

    def over_budget_apply(self, j, policy, eff=None, refresh=True):
        out = real_apply(self, j, policy, eff, refresh)
        if (j, policy) == (target, SWAP):
            self.state.C[0] += budget   # its refresh put the peak over the budget
            rejected.append(j)
        return out

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(switch_mod, "_score", refused)
        want_tl, want_records, want_taken = switch_policies(ref, tl, records, budget)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Timeline, "apply", over_budget_apply)
        got_tl, got_records, got_taken = switch_policies(ref, tl, records, budget)
    assert rejected   # the undo path ran
    assert got_taken == want_taken
    assert (got_tl.state.pol == want_tl.state.pol).all() and got_tl.state.pol[target] != SWAP
    assert (got_tl.state.C == want_tl.state.C).all()
    assert got_tl.added_s() == want_tl.added_s()
    assert {j: d.policy for j, d in got_records.items()} == {j: d.policy for j, d in want_records.items()}
    assert int(got_tl.memory().max()) <= budget
    assert (tl.state.pol == pol).all() and tl.added_s() == est   # the input plan is unchanged


def test_evaluate_stops_above_a_limit_only_where_the_full_effect_is_above_it():
    """``Timeline.evaluate(..., stop_above=L)`` (the switch pass's refusal before the chains are replayed)
    returns early only where the full evaluation raises a point above ``L``, with a raised point no higher
    than the full one's; elsewhere it returns the full effect. Every switch candidate of a prepared plan,
    both directions, at limits below, at and above the plan's peak."""
    p = _with_copies(G.large_beside_small_graph(30, seed=0), 4.0)
    budget = int(0.8 * no_remat_peak(p))
    ref = next(r for r in libra_solver.LibraSolver()._refiners(p) if r.opts.policy == "recompute")
    snap = ref.descend([budget])[budget]
    tl, records, _ = ref.prepare(snap, budget)
    tl2, _, taken = switch_policies(ref, tl, records, budget)   # a plan with swaps and recomputations
    assert taken > 0
    peak = int(tl2.memory().max())
    stopped = full_above = 0
    for j in records:
        policy = REC if tl2.state.pol[j] == SWAP else SWAP
        full = tl2.evaluate(j, policy, floor=0)
        for limit in (peak // 2, peak, budget, 2 * peak):
            eff = tl2.evaluate(j, policy, floor=0, stop_above=limit)
            full_above += full.raised_max > limit
            if eff.cost_s == float("inf"):   # stopped early
                stopped += 1
                assert limit < eff.raised_max <= full.raised_max and eff.chains == {}
            else:
                assert eff.cost_s == full.cost_s and eff.raised_max == full.raised_max
                assert eff.raised_at == full.raised_at and eff.chains == full.chains
    assert stopped > 0 and full_above >= stopped


def test_evaluate_stops_at_a_cost_only_where_the_full_effect_costs_at_least_it():
    """``Timeline.evaluate(..., stop_cost=c)`` (the switch pass's refusal of a change that surely saves too
    little, before the chains are replayed) returns early only where the full evaluation adds at least
    ``c`` seconds; elsewhere it returns the full effect. Every switch candidate of a prepared plan with
    swaps and recomputations, both directions, at costs below, at and above each full one."""
    p = _with_copies(G.large_beside_small_graph(30, seed=0), 4.0)
    budget = int(0.8 * no_remat_peak(p))
    ref = next(r for r in libra_solver.LibraSolver()._refiners(p) if r.opts.policy == "recompute")
    snap = ref.descend([budget])[budget]
    tl, records, _ = ref.prepare(snap, budget)
    tl2, _, taken = switch_policies(ref, tl, records, budget)
    assert taken > 0
    stopped = replayed = 0
    for j in records:
        policy = REC if tl2.state.pol[j] == SWAP else SWAP
        full = tl2.evaluate(j, policy, floor=0)
        span = max(abs(full.cost_s), 1e-9)
        for limit in (full.cost_s - span, full.cost_s, full.cost_s + span, -span, 0.0):
            eff = tl2.evaluate(j, policy, floor=0, stop_cost=limit)
            if eff.cost_s == float("inf"):   # stopped early
                stopped += 1
                assert full.cost_s >= limit and eff.chains == {}
            else:
                replayed += 1
                assert eff.cost_s == full.cost_s and eff.raised_max == full.raised_max
                assert eff.raised_at == full.raised_at and eff.chains == full.chains
    assert stopped > 0 and replayed > 0


def test_the_pass_scores_a_move_once_per_plan(monkeypatch):
    """A window refused a move on a plan is not scored for it again while the plan is the same (a
    second round after a first that took nothing): on the GPT-2 medium profile at 0.5, where the
    hybrid plan's pass runs two rounds, no (window, policy, plan) is scored twice in one pass, and
    the plan fits its budget (that it is the plan of scoring afresh: ``benchmarks/plan_hashes.py``)."""
    p = load_problem(PROBLEMS / "h100_gpt2-medium_b8.json.gz")
    scored, calls = [], []
    score, switch = switch_mod._score, libra_solver.switch_policies

    def counting_score(tl, j, policy, budget):
        st = tl.state
        scored[-1].append((j, policy, st.pol.tobytes(), st.w_b.tobytes(), st.floor.tobytes(), st.wait.tobytes()))
        return score(tl, j, policy, budget)

    def counting_switch(ref, tl, records, budget):
        scored.append([])
        out = switch(ref, tl, records, budget)
        calls.append(out[2])
        return out

    monkeypatch.setattr(switch_mod, "_score", counting_score)
    monkeypatch.setattr(libra_solver, "switch_policies", counting_switch)
    r = solve(p, 0.5, "libra")
    assert len(scored) >= 2 and 0 in calls   # a pass that took nothing: it ran its second round
    for keys in scored:
        assert len(keys) == len(set(keys))
    assert_fits(p, r)


def test_a_swap_refused_for_holding_its_storage_until_its_copy_out_ends_is_over_the_budget():
    """``switch._held_over`` (a recomputed window, swapped, would hold its storage over the budget before its
    copy out can end) refuses a move to a swap before it is evaluated: wherever it does, on the recompute-only
    plans and on those plans switched, the full evaluation raises a point over the budget too, or its swap
    layer stalls (where the release bound does not hold); and it refuses some."""
    refused = 0
    for kind, n, seed, copy_steps, frac in (("large_beside_small_graph", 30, 0, 4.0, 0.8),
                                            ("large_beside_small_graph", 30, 1, 1.0, 0.7),
                                            ("early_regeneration_graph", 30, 0, 1.0, 0.6),
                                            ("large_beside_small_graph", 60, 2, 0.25, 0.75),
                                            ("h100_gpt2-medium_b8", None, None, None, 0.5)):
        p = (load_problem(PROBLEMS / f"{kind}.json.gz") if n is None
             else _with_copies(getattr(G, kind)(n, seed=seed), copy_steps))
        budget = int(frac * no_remat_peak(p))
        ref = next(r for r in libra_solver.LibraSolver()._refiners(p) if r.opts.policy == "recompute")
        snap = ref.descend([budget]).get(budget)
        if snap is None:   # not reached by this descent
            continue
        tl, records, _ = ref.prepare(snap, budget)
        tl2, records2, _ = switch_policies(ref, tl, records, budget)
        for t, recs in ((tl, records), (tl2, records2)):
            for j in recs:
                if t.state.pol[j] != REC or not switch_mod._switchable(t, j, SWAP):
                    continue
                if switch_mod._held_over(t, j, budget):
                    refused += 1
                    full = t.evaluate(j, SWAP, floor=0)
                    assert full.raised_max > budget or not full.feasible or full.swap.total_stall_s > 0, (kind, j)
    assert refused > 0


def test_a_switch_to_a_swap_trims_the_retentions_its_chain_no_longer_reads(monkeypatch):
    """``random_layered_graph(30, seed=1)``, copies as fast as compute, 0.8 of the peak: the
    recompute-only plan recomputes node 12's output for node 26 with node 8's output retained for
    that chain; swapping it instead raises position 26 over the budget while the retention stays,
    and fits once it is trimmed (``switch._score_trimmed``).  The plan is cheaper than without that
    retry, within the budget, and a switch was taken."""
    p = _with_copies(G.random_layered_graph(30, seed=1), 1.0)
    budget = int(0.8 * no_remat_peak(p))
    r = solve(p, budget, "libra")
    assert_fits(p, r)
    assert "+switch" in r.extras["descent"]
    monkeypatch.setattr(switch_mod, "_score_trimmed", lambda tl, j, budget: None)
    without = solve(p, budget, "libra")
    assert_fits(p, without)
    assert r.time_s < without.time_s, (r.time_s, without.time_s)
